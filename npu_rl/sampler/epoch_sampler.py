"""The length-aware sampler itself (torch); :mod:`npu_rl.sampler` exports it lazily."""

from __future__ import annotations

import logging
import sys
import weakref
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch.utils.data

from npu_rl.sampler.core import LengthTable, OrderParams, epoch_order, step_metrics
from npu_rl.sampler.keys import CLASS_NAME, CLASS_PATH, DATASET_INDEX, REFERENCE_CLASS_PATH, SAMPLER_KEYS

__all__ = [
    "DATASET_INDEX",
    "LengthAwareEpochSampler",
    "SAMPLER_KEYS",
    "active_sampler",
    "build_custom_sampler",
    "restore_at_epoch_boundary",
    "update_from_dataproto",
    "update_from_v1_batch",
]

logger = logging.getLogger("npu_rl.sampler")  # the name users filter on, as before the split

_ACTIVE: weakref.ReferenceType | None = None


def active_sampler() -> LengthAwareEpochSampler | None:
    """The LengthAwareEpochSampler most recently built in this process, or None."""
    return _ACTIVE() if _ACTIVE is not None else None


def _get(cfg: Any, key: str, default: Any = None) -> Any:
    if cfg is None:
        return default
    if isinstance(cfg, Mapping):
        return cfg.get(key, default)
    return getattr(cfg, "get", lambda k, d=None: getattr(cfg, k, d))(key, default)


def _as_bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"data.sampler.{key}={value!r} is not a boolean: use True or False")


class LengthAwareEpochSampler(torch.utils.data.Sampler[int]):
    """A torch Sampler over dataset positions that groups prompts of similar predicted response length.

    Built by the patched ``create_rl_sampler`` as ``LengthAwareEpochSampler(data_source=dataset,
    data_config=config.data)`` (verl <= 0.7's plug-in signature). Reads ``data.sampler.bucket_size``
    (tokens, default 1024), ``ema_decay`` (default 0.7), ``shuffle_batch_blocks`` (default True),
    ``data.train_batch_size`` (the generation batch one step consumes), ``data.gen_batch_size`` (the
    dataloader's batch, for the tail verl drops) and ``data.seed`` (null = 0). The first epoch is a
    plain random permutation (nothing is known yet); later epochs use the EMA table.

    Order of epoch e = ``epoch_order(predictions at its start, params, seed, e)``. ``state_dict()``
    holds the seed, the epoch counter, the current order, how many indices of it were yielded and the
    EMA table, so a run resumed from verl's ``data.pt`` continues the same sequence (torchdata's
    ``StatefulDataLoader`` restores a stateful sampler and then calls ``iter`` on it: the next iterator
    continues after the yielded ones, like torchdata's ``StatefulDistributedSampler``).

    Raises ValueError for ``data.dataloader_num_workers > 0`` (workers would prefetch with a stale
    table), unknown ``data.sampler`` keys and bad values.
    """

    def __init__(self, data_source, data_config=None, *, batch_size: int | None = None, **overrides: Any) -> None:
        global _ACTIVE
        workers = int(_get(data_config, "dataloader_num_workers", 0) or 0)
        if workers > 0:
            raise ValueError(
                f"data.dataloader_num_workers={workers}: the length-aware sampler needs 0 (worker processes "
                "prefetch batches ordered with a stale length table); set data.dataloader_num_workers=0"
            )
        scfg = _get(data_config, "sampler", None)
        known = {"class_path", "class_name", *SAMPLER_KEYS}
        unknown = sorted(k for k in (list(scfg.keys()) if scfg is not None else []) if k not in known)
        if unknown:
            raise ValueError(
                f"data.sampler.{unknown[0]} is not a key of LengthAwareEpochSampler; it reads "
                + ", ".join(f"data.sampler.{k}" for k in SAMPLER_KEYS)
            )
        opts = {k: overrides.get(k, _get(scfg, k, d)) for k, d in SAMPLER_KEYS.items()}
        train_bs = int(batch_size or _get(data_config, "train_batch_size", 0) or 0)
        if train_bs < 1:
            raise ValueError("data.train_batch_size must be set (the generation batch the sampler fills)")
        self.loader_batch_size = int(_get(data_config, "gen_batch_size", None) or train_bs)
        self.params = OrderParams(
            batch_size=train_bs,
            bucket_size=int(opts["bucket_size"]),
            shuffle_batch_blocks=_as_bool("shuffle_batch_blocks", opts["shuffle_batch_blocks"]),
        )
        self.seed = int(_get(data_config, "seed", None) or 0)
        self.num_prompts = len(data_source)
        self.table = LengthTable(self.num_prompts, float(opts["ema_decay"]))
        self.epoch = 0  # epochs started so far
        self._order: np.ndarray | None = None
        self._yielded = 0
        self._in_progress = False
        self._resume = False
        self._steps_seen = 0
        _ACTIVE = weakref.ref(self)

    # ---- torch Sampler ------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.num_prompts

    def __iter__(self) -> Iterator[int]:
        return self._generate()

    def _generate(self) -> Iterator[int]:
        # Lazy: the body runs at the first next(), so iterators the dataloader creates and drops
        # (it builds some while restoring state) neither start an epoch nor consume a resume.
        if self._resume and self._order is not None:
            self._resume = False
        else:
            predicted = self.table.predictions()
            self._order, tail = epoch_order(predicted, self.params, self.seed, self.epoch)
            self.epoch += 1
            self._yielded = 0
            self._in_progress = True
            # No silent no-op: the trainer's log shows each epoch's order and the predictions behind it.
            print(epoch_line(self.epoch - 1, self._order, predicted, tail, self.params), file=sys.stderr, flush=True)
        order = self._order
        while self._yielded < len(order):
            index = int(order[self._yielded])
            self._yielded += 1
            yield index
        self._in_progress = False

    # ---- checkpoint ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs to continue the identical sequence (plain Python types)."""
        return {
            "version": 1,
            "seed": self.seed,
            "epoch": self.epoch,
            "order": None if self._order is None else self._order.tolist(),
            "yielded": self._yielded,
            "in_progress": self._in_progress,
            "table": self.table.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any], *, epoch_done: bool = False) -> None:
        """Restore :meth:`state_dict`; the next iterator continues after the yielded indices.

        ``epoch_done``: the saved epoch is over (verl's legacy trainer resumes at an epoch boundary
        without restoring the dataloader, :func:`restore_at_epoch_boundary`): the next iterator starts
        the next epoch instead, ordered from the restored table.

        Raises ValueError when the saved table does not match the dataset size.
        """
        if state.get("version") != 1:
            raise ValueError(f"unknown LengthAwareEpochSampler state version {state.get('version')!r}")
        self.table.load_state_dict(state["table"])
        self.seed = int(state["seed"])
        self.epoch = int(state["epoch"])
        self._order = None if state["order"] is None else np.asarray(state["order"], dtype=np.int64)
        self._yielded = int(state["yielded"])
        self._in_progress = bool(state["in_progress"]) and not epoch_done
        self._resume = self._in_progress and self._order is not None

    # ---- learning -----------------------------------------------------------------------------
    def predict(self, dataset_index: int) -> float:
        """Predicted response length (tokens) of the prompt at ``dataset_index`` (NaN before any data)."""
        return self.table.predict(int(dataset_index))

    def predictions(self) -> np.ndarray:
        """Predicted response length of every dataset position, shape (N,), tokens (NaN before data)."""
        return self.table.predictions()

    def update(self, dataset_indices, response_lengths) -> dict[str, float]:
        """Learn from one step: one entry per trajectory (n per prompt).

        ``dataset_indices``: (T,) dataset positions; ``response_lengths``: (T,) response lengths in
        tokens. Returns the step's metrics (``sampler/*``, see :func:`npu_rl.sampler.core.step_metrics`,
        plus ``sampler/epoch``, ``sampler/table_coverage`` and ``sampler/tail_dropped_per_epoch``: the
        prompts verl's dataloader drops each epoch, ``N % batch``).
        """
        idx = np.asarray(dataset_indices, dtype=np.int64).reshape(-1)
        lengths = np.asarray(response_lengths, dtype=np.float64).reshape(-1)
        if idx.shape != lengths.shape:
            raise ValueError(f"{len(idx)} dataset indices but {len(lengths)} response lengths")
        metrics: dict[str, float] = {
            "sampler/epoch": float(max(self.epoch - 1, 0)),
            "sampler/tail_dropped_per_epoch": float(self.num_prompts % self.loader_batch_size),
        }
        if len(idx):
            uniq, inv = np.unique(idx, return_inverse=True)
            self.table._check(uniq)
            seen = self.table.count[uniq] > 0
            predicted = self.table.predictions()[uniq]
            metrics.update(step_metrics(idx, lengths, predicted, seen))
            means = np.bincount(inv, weights=lengths) / np.bincount(inv)
            self.table.update(uniq, means)
        metrics["sampler/table_coverage"] = float((self.table.count > 0).mean()) if self.num_prompts else 0.0
        self._steps_seen += 1
        return metrics


def epoch_line(epoch: int, order: np.ndarray, predicted: np.ndarray, tail: int, params: OrderParams) -> str:
    """The log line of one epoch's order: dataset positions in sampling order and each one's
    predicted response length (tokens, ``-`` when unknown), e.g.
    ``[npu-rl] length-aware sampler: epoch 1 (20 prompts, batch 10, bucket 8 tok, tail 0, shuffled no): order 3,7,...
    predicted 12,15,...``. :func:`parse_epoch_lines` reads it back. Predictions are printed rounded
    *down* to whole tokens: ``floor(floor(p) / b) == floor(p / b)`` for a whole-token bucket ``b``, so a
    reader recomputes exactly the buckets :func:`~npu_rl.sampler.core.epoch_order` sorted by (rounding
    to nearest would move 7.6 into the next 8-token bucket)."""
    preds = ",".join("-" if not np.isfinite(predicted[i]) else str(int(np.floor(predicted[i]))) for i in order)
    return (
        f"[npu-rl] length-aware sampler: epoch {epoch} ({len(order)} prompts, batch {params.batch_size}, "
        f"bucket {params.bucket_size} tok, tail {tail}, shuffled {'yes' if params.shuffle_batch_blocks else 'no'}): "
        f"order {','.join(str(int(i)) for i in order)} predicted {preds}"
    )


def parse_epoch_lines(text: str) -> dict[int, tuple[list[int], list[float], int, int, bool]]:
    """{epoch: (order, predicted, batch, bucket, shuffled)} from the :func:`epoch_line` lines in a
    log (NaN where the prediction was unknown; a later line for the same epoch wins)."""
    import re

    out = {}
    pattern = (
        r"length-aware sampler: epoch (\d+) \(\d+ prompts, batch (\d+), bucket (\d+) tok, tail \d+, "
        r"shuffled (yes|no)\): order ([\d,]+) predicted ([\d,\-]+)"
    )
    for m in re.finditer(pattern, text):
        order = [int(x) for x in m.group(5).split(",")]
        pred = [float("nan") if x == "-" else float(x) for x in m.group(6).split(",")]
        out[int(m.group(1))] = (order, pred, int(m.group(2)), int(m.group(3)), m.group(4) == "yes")
    return out


# ---- verl glue (called from the patched verl; kept here so the patch is a hook only) --------------
def build_custom_sampler(data_config, dataset):
    """Build the sampler named by ``data.sampler.class_path/class_name`` (the patched create_rl_sampler).

    ``class_path`` null, or the reference recipe's ``pkg://verl.experimental.dataset.length_bucket_sampler``,
    with ``class_name=LengthAwareEpochSampler`` means ours (``pkg://npu_rl.sampler``). Any other class is
    loaded with verl's ``load_extern_object`` and built as ``cls(data_source=dataset, data_config=data_config)``,
    verl <= 0.7's contract. Raises ValueError when ``data.dataloader_num_workers > 0`` (as verl <= 0.7 did).
    """
    scfg = data_config.sampler
    class_path, class_name = scfg.get("class_path"), scfg.get("class_name")
    workers = int(data_config.get("dataloader_num_workers", 0) or 0)
    if workers > 0:
        raise ValueError(
            f"data.sampler.class_name={class_name} needs data.dataloader_num_workers=0 (got {workers}): worker "
            "processes would prefetch batches ordered before the sampler learnt from the last step"
        )
    if class_name == CLASS_NAME and class_path in (None, "", CLASS_PATH, REFERENCE_CLASS_PATH):
        if class_path == REFERENCE_CLASS_PATH:
            logger.warning("data.sampler.class_path=%s is the reference's name: using %s", class_path, CLASS_PATH)
        return LengthAwareEpochSampler(data_source=dataset, data_config=data_config)
    if not class_path:
        raise ValueError(f"data.sampler.class_name={class_name} needs data.sampler.class_path (pkg://module or a file)")
    from verl.utils.import_utils import load_extern_object

    cls = load_extern_object(class_path, class_name)
    return cls(data_source=dataset, data_config=data_config)


def restore_at_epoch_boundary(sampler, dataloader_state_path) -> bool:
    """Legacy trainer hook (``RayPPOTrainer._load_checkpoint``, resuming at an epoch boundary).

    There verl does not restore ``data.pt``: the saved iterator has yielded the whole epoch, and
    restoring it would make the resumed epoch empty. The dataloader then starts afresh, and so would
    the sampler: epoch 0's random order from an empty table. This loads ``data.pt`` (what
    ``StatefulDataLoader.state_dict()`` saved) and restores our sampler's own state from it, with the
    saved epoch closed, so the next epoch is ordered from the learned table with the right epoch
    number, as in the uninterrupted run. Samplers other than ours are left alone (verl's behaviour);
    a ``data.pt`` without our state (the sampler was off in the saved run) logs a warning and
    starts afresh. Returns True when the state was restored.
    """
    if not isinstance(sampler, LengthAwareEpochSampler):
        return False
    state = torch.load(dataloader_state_path, weights_only=False)
    # StatefulDataLoader (num_workers=0) -> its batch-sampler iterator -> our sampler's state_dict()
    iter_state = state.get("_sampler_iter_state") if isinstance(state, Mapping) else None
    ours = iter_state.get("sampler_state") if isinstance(iter_state, Mapping) else None
    if not isinstance(ours, Mapping) or "table" not in ours:
        logger.warning(
            "length-aware sampler: %s holds no sampler state (the saved run had no length-aware sampler?): "
            "the next epoch starts from an empty length table",
            dataloader_state_path,
        )
        return False
    sampler.load_state_dict(dict(ours), epoch_done=True)
    return True


def _warn_missing_index() -> None:
    if not getattr(_warn_missing_index, "done", False):
        logger.warning(
            "length-aware sampler: the batch has no '%s' field (a custom dataset class?): the sampler "
            "cannot learn and keeps a random order",
            DATASET_INDEX,
        )
        _warn_missing_index.done = True  # type: ignore[attr-defined]


def update_from_v1_batch(sampler, batch, tq=None) -> dict[str, float]:
    """V1 trainer hook (``PPOTrainer.fit``, right after ``step()``, before the step's checkpoint): feed
    the step to ``sampler.update``.

    ``batch``: verl's ``KVBatchMeta`` of the step (keys, partition_id, tags with ``response_len``);
    padding trajectories are skipped; the dataset positions are read from TransferQueue
    (``tq.kv_batch_get(select_fields=['dataset_index'])``). Returns the sampler's metrics, ``{}`` for
    a sampler without ``update``.
    """
    if not hasattr(sampler, "update"):
        return {}
    if tq is None:
        import transfer_queue as tq
    keep = [i for i, tag in enumerate(batch.tags) if not tag.get("is_padding", False)]
    if not keep:
        return {}
    keys = [batch.keys[i] for i in keep]
    lengths = [int(batch.tags[i]["response_len"]) for i in keep]
    try:
        data = tq.kv_batch_get(keys=keys, partition_id=batch.partition_id, select_fields=[DATASET_INDEX])
        indices = _as_int_list(data[DATASET_INDEX])
    except (KeyError, ValueError):  # rows without the field (a custom dataset class)
        _warn_missing_index()
        return {}
    return sampler.update(indices, lengths)


def update_from_dataproto(sampler, batch) -> dict[str, float]:
    """Legacy trainer hook (``RayPPOTrainer.fit``, once ``response_mask`` is set, before the step's
    checkpoint): feed a DataProto step to ``sampler.update``.

    Reads ``non_tensor_batch['dataset_index']`` and the response lengths from
    ``batch.batch['response_mask']`` (shape (T, response_length)).
    """
    if not hasattr(sampler, "update"):
        return {}
    if DATASET_INDEX not in batch.non_tensor_batch:
        _warn_missing_index()
        return {}
    lengths = batch.batch["response_mask"].sum(dim=-1).tolist()
    return sampler.update(_as_int_list(batch.non_tensor_batch[DATASET_INDEX]), lengths)


def _as_int_list(values) -> list[int]:
    if hasattr(values, "tolist"):
        values = values.tolist()
    out = []
    for v in values:
        v = getattr(v, "data", v)
        out.append(int(v.item() if hasattr(v, "item") else v))
    return out
