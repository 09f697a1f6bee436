"""Pure core of the length-aware resampler: the per-prompt length table and the epoch order.

No torch, no verl: numpy only, so every rule here is tested directly. The torch ``Sampler`` in
:mod:`npu_rl.sampler` wraps it.

Idea ported from the reference recipe's ``LengthAwareEpochSampler`` (cann-recipes-train
``llm_rl/qwen3``, "Length-Aware Resampler"): in synchronous GRPO/DAPO a step waits for its longest
response, so prompts whose past responses were of similar length are put into the same generation
batch. The reference's source is not public; the ordering rule below is our own design.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["LengthTable", "OrderParams", "epoch_order", "step_metrics"]


@dataclass(frozen=True)
class OrderParams:
    """How an epoch is ordered.

    ``batch_size``: prompts per generation batch (verl's ``data.train_batch_size``: one step's prompts).
    ``bucket_size``: width in tokens of a length bucket; prompts whose predicted response lengths fall
    in the same bucket are interchangeable (their order is random). ``shuffle_batch_blocks``: shuffle
    the whole generation batches after bucketing (default), so training sees no length curriculum;
    ``False`` keeps them shortest-first. ``drop_last``: verl's train dataloader drops the tail batch.
    """

    batch_size: int
    bucket_size: int = 1024
    shuffle_batch_blocks: bool = True
    drop_last: bool = True

    def __post_init__(self) -> None:
        if int(self.batch_size) < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size!r} (data.train_batch_size)")
        if int(self.bucket_size) < 1:
            raise ValueError(
                f"bucket_size must be >= 1 token, got {self.bucket_size!r}: set +data.sampler.bucket_size=1024"
            )


class LengthTable:
    """Per-prompt exponential moving average of the group-mean response length (tokens).

    ``size``: number of prompts (dataset positions 0..size-1). ``decay`` in [0, 1): the weight of the
    old value, ``ema <- decay * ema + (1 - decay) * observed``; a prompt's first observation is taken
    as is. Prompts never seen are predicted by the prior: the mean of the seen prompts' EMAs (NaN
    while nothing was seen).
    """

    def __init__(self, size: int, decay: float = 0.7) -> None:
        if size < 0:
            raise ValueError(f"size must be >= 0, got {size}")
        if not 0.0 <= float(decay) < 1.0:
            raise ValueError(f"ema_decay must be in [0, 1), got {decay!r}: set +data.sampler.ema_decay=0.7")
        self.decay = float(decay)
        self.ema = np.full(size, np.nan, dtype=np.float64)
        self.count = np.zeros(size, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.ema)

    def prior(self) -> float:
        """Prediction for a prompt never seen: mean EMA of the seen prompts (NaN when none)."""
        seen = self.count > 0
        return float(self.ema[seen].mean()) if seen.any() else float("nan")

    def predictions(self) -> np.ndarray:
        """Predicted response length of every prompt, shape (size,), float64 tokens (prior filled in)."""
        out = self.ema.copy()
        out[self.count == 0] = self.prior()
        return out

    def predict(self, index: int) -> float:
        """Predicted response length (tokens) of dataset position ``index`` (the prior when unseen)."""
        self._check(np.asarray([index]))
        return float(self.ema[index]) if self.count[index] > 0 else self.prior()

    def update(self, indices: np.ndarray, lengths: np.ndarray) -> None:
        """Fold one observation per prompt into the table.

        ``indices``: (k,) distinct dataset positions; ``lengths``: (k,) observed group-mean response
        lengths. Raises ValueError for positions outside the table or repeated positions.
        """
        indices = np.asarray(indices, dtype=np.int64)
        lengths = np.asarray(lengths, dtype=np.float64)
        if indices.shape != lengths.shape:
            raise ValueError(f"indices {indices.shape} and lengths {lengths.shape} differ in shape")
        self._check(indices)
        if len(np.unique(indices)) != len(indices):
            raise ValueError("indices must be distinct: average a prompt's group before updating")
        old = self.ema[indices]
        first = self.count[indices] == 0
        self.ema[indices] = np.where(first, lengths, self.decay * old + (1.0 - self.decay) * lengths)
        self.count[indices] += 1

    def _check(self, indices: np.ndarray) -> None:
        bad = indices[(indices < 0) | (indices >= len(self.ema))]
        if len(bad):
            raise ValueError(
                f"dataset index {int(bad[0])} is outside the length table (size {len(self.ema)}): the "
                "dataset changed since the table was built"
            )

    def state_dict(self) -> dict:
        return {"decay": self.decay, "ema": self.ema.tolist(), "count": self.count.tolist()}

    def load_state_dict(self, state: dict) -> None:
        ema = np.asarray(state["ema"], dtype=np.float64)
        if len(ema) != len(self.ema):
            raise ValueError(
                f"saved length table has {len(ema)} prompts but the dataset has {len(self.ema)}: resume "
                "with the same data.train_files (or start a new run)"
            )
        self.ema = ema
        self.count = np.asarray(state["count"], dtype=np.int64)


def epoch_order(predicted: np.ndarray, params: OrderParams, seed: int, epoch: int) -> tuple[np.ndarray, int]:
    """The sampling order of one epoch: a permutation of ``range(len(predicted))``.

    ``predicted``: (N,) predicted response lengths in tokens (NaN = no information). Returns
    ``(order, tail)``: ``order`` (N,) int64 and ``tail``, the number of prompts at its end that do not
    fill a whole generation batch (``N % batch_size``; verl drops them when ``drop_last``).

    Rule, deterministic in (seed, epoch, predicted): draw a random permutation; its first ``tail``
    prompts form the tail (a fresh random choice every epoch, so no prompt is skipped systematically,
    and never "the longest"); sort the rest stably by length bucket ``floor(predicted / bucket_size)``
    (random order inside a bucket; no information = one bucket = a plain random order); cut into
    generation batches of ``batch_size``; shuffle the batches (``shuffle_batch_blocks``) or keep them
    shortest-first; append the tail.
    """
    predicted = np.asarray(predicted, dtype=np.float64)
    n = len(predicted)
    rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, int(epoch)])
    perm = rng.permutation(n)
    tail = n % params.batch_size
    tail_idx, body = perm[:tail], perm[tail:]
    pred = predicted[body]
    if np.isnan(pred).all():
        key = np.zeros(len(body))
    else:
        pred = np.where(np.isnan(pred), np.nanmean(pred), pred)
        key = np.floor(pred / params.bucket_size)
    body = body[np.argsort(key, kind="stable")]
    blocks = body.reshape(-1, params.batch_size)
    if params.shuffle_batch_blocks:
        blocks = blocks[rng.permutation(len(blocks))]
    return np.concatenate([blocks.reshape(-1), tail_idx]).astype(np.int64), tail


def step_metrics(indices: np.ndarray, lengths: np.ndarray, predicted: np.ndarray, seen: np.ndarray) -> dict[str, float]:
    """Metrics of one step's generation batch, before the table learns from it.

    ``indices``: (T,) dataset position of every trajectory; ``lengths``: (T,) response lengths
    (tokens); ``predicted``: (k,) prediction of each distinct prompt in ``np.unique(indices)`` order;
    ``seen``: (k,) bool, whether that prompt had been observed before. Returns
    ``sampler/pred_abs_err`` (mean |predicted - actual group mean| over seen prompts, tokens),
    ``sampler/pred_rel_err`` (the same divided by the actual mean), ``sampler/seen_frac``,
    ``sampler/batch_len_cv`` (std/mean of the group means: within-batch spread) and
    ``sampler/batch_len_max_over_mean`` (longest trajectory / mean trajectory: what the step waits for).
    """
    uniq, inv = np.unique(indices, return_inverse=True)
    sums = np.bincount(inv, weights=lengths)
    means = sums / np.bincount(inv)
    out = {"sampler/seen_frac": float(seen.mean()) if len(seen) else 0.0}
    if seen.any():
        err = np.abs(predicted[seen] - means[seen])
        out["sampler/pred_abs_err"] = float(err.mean())
        out["sampler/pred_rel_err"] = float((err / np.maximum(means[seen], 1.0)).mean())
    mean_len = float(np.mean(lengths)) if len(lengths) else 0.0
    if mean_len > 0:
        out["sampler/batch_len_cv"] = float(np.std(means) / np.mean(means))
        out["sampler/batch_len_max_over_mean"] = float(np.max(lengths) / mean_len)
    return out
