"""SAM's acceptance per training step, in the experiment tracker (issue 34, item 5).

verl runs vLLM with ``disable_log_stats=True``, so vLLM's own speculative-decoding counters never
reach an RL run. The path instead:

1. vllm patch ``0005-vllm-feature-spec-decode-request-counts``: the scheduler counts, per request,
   the draft tokens it verified, the draft tokens accepted and the forwards that sampled tokens, and
   the output processor puts them into ``CompletionOutput.npu_rl_spec_counts``;
2. verl patch ``0012-verl-feature-sam-acceptance-metrics``: verl's vLLM server writes them into the
   response's ``extra_fields`` under verl's own per-request names (:func:`extra_fields`: the ones
   verl's MTP rollout fills from later vLLMs), which verl carries through its client, the agent loop
   and TransferQueue; the V1 trainer's ``_compute_metrics`` calls :func:`step_metrics`.

Per step, for the training batch's responses (padding dropped):

- ``rollout/spec_accept_rate`` and ``rollout/spec_accept_length``: verl's own
  ``compute_spec_decode_metrics`` (per-response ratios, then the mean; a response without drafts
  counts as 0 there);
- ``npu_rl/sam/active``: 1.0 when responses carry counts, 0.0 when SAM is on and none does (the
  counts were lost on the way: a loud 0, not a missing metric);
- ``npu_rl/sam/drafted``, ``accepted``, ``forwards``, ``responses``: the step's totals;
- ``npu_rl/sam/acceptance``: accepted / drafted over the step's tokens (0 with no drafts);
- ``npu_rl/sam/tokens_per_forward``: (forwards + accepted) / forwards, the step's sampled tokens
  per forward of the target model (1.0 without speculation).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["KEYS", "PREFIX", "extra_fields", "sam_on", "step_metrics", "summarize"]

#: verl's per-request names (vllm_async_server.py, trainer_base.py), in the order of the counts.
KEYS = ("spec_num_draft_tokens", "spec_num_accepted_tokens", "spec_num_verify_steps")
PREFIX = "npu_rl/sam/"


def extra_fields(counts: Sequence[int]) -> dict[str, int]:
    """verl's per-response ``extra_fields`` from vLLM's ``(drafted, accepted, forwards)``.

    ``spec_num_verify_steps`` gets the forwards that sampled tokens (the first, the prefill's,
    included), so verl's ``1 + accepted / verify_steps`` is the response's tokens per forward
    (a response of L tokens has L <= forwards + accepted <= L + k: its last forward may sample past
    the stop, and vLLM counts those acceptances too).

    Raises:
        ValueError: ``counts`` is not three non-negative integers with accepted <= drafted.
    """
    drafted, accepted, forwards = (int(c) for c in counts)
    if min(drafted, accepted, forwards) < 0 or accepted > drafted:
        raise ValueError(
            f"speculative-decoding counts (drafted, accepted, forwards) = {tuple(counts)} are inconsistent"
        )
    return dict(zip(KEYS, (drafted, accepted, forwards), strict=True))


def sam_on(select: Callable[[str], Any]) -> bool:
    """Whether the run's config switches SAM on (the config key :mod:`npu_rl.settings` declares)."""
    from npu_rl import settings

    feature = next(f for f in settings.FEATURES if f.name == "SAM speculative decoding")
    key, value = feature.config
    return select(key) == value


def summarize(fields: Sequence[Any]) -> dict[str, float]:
    """The step's metrics from its responses' ``extra_fields`` (padding rows already dropped).

    A response without the counts (an aborted one, or a server without vllm patch 0005) is left
    out of every figure; ``npu_rl/sam/responses`` says how many had them.
    """
    from verl.trainer.ppo.ray_trainer import compute_spec_decode_metrics

    rows = [[int(e[k]) for k in KEYS] for e in fields if isinstance(e, Mapping) and all(k in e for k in KEYS)]
    out: dict[str, float] = {PREFIX + "active": 1.0 if rows else 0.0, PREFIX + "responses": float(len(rows))}
    if not rows:
        return out
    drafted, accepted, forwards = (sum(col) for col in zip(*rows, strict=True))
    out.update(compute_spec_decode_metrics(*([r[i] for r in rows] for i in range(3))))
    out.update(
        {
            PREFIX + "drafted": float(drafted),
            PREFIX + "accepted": float(accepted),
            PREFIX + "forwards": float(forwards),
            PREFIX + "acceptance": accepted / drafted if drafted else 0.0,
            PREFIX + "tokens_per_forward": (forwards + accepted) / forwards if forwards else 1.0,
        }
    )
    return out


def step_metrics(batch: Any, kv_batch_get: Callable[..., Any], config: Any) -> dict[str, float]:
    """SAM's metrics of a V1 trainer step; ``{}`` (and nothing read) when SAM is off.

    ``batch``: verl's ``KVBatchMeta`` of the step (``keys``, ``partition_id``, ``tags`` with
    ``is_padding``); ``kv_batch_get``: TransferQueue's ``kv_batch_get``; ``config``: the trainer's
    OmegaConf config.
    """
    from omegaconf import OmegaConf

    from npu_rl.feature_metrics import step_extra_fields

    if not sam_on(lambda key: OmegaConf.select(config, key)):
        return {}
    return summarize(step_extra_fields(batch, kv_batch_get))
