"""The long-tail guard's per-step metrics in the experiment tracker (``npu_rl/long_tail_guard/*``).

The guard decides in the vLLM server actors (:mod:`npu_rl.sampler.guard`); verl patch
``*-verl-feature-long-tail-guard`` writes its verdict on every response into the response's
``TokenOutput.extra_fields`` (:data:`CUT_KEY`: True when the guard cut it, False when it ran to its
end). verl carries ``extra_fields`` unchanged through its ``LLMServerClient``, the agent loop's
``AgentLoopOutput`` and the TransferQueue, as it does for its own per-request speculative-decoding
counts; the same patch makes the V1 trainer's ``_compute_metrics`` call :func:`step_metrics` on the
step's batch, so the counts are logged with the step's other metrics:

- ``npu_rl/long_tail_guard/active``: 1.0 (the guard is on; the metrics are absent when it is off);
- ``npu_rl/long_tail_guard/cuts``: responses of the step's training batch that the guard cut;
- ``npu_rl/long_tail_guard/cut_fraction``: cuts / responses;
- ``npu_rl/long_tail_guard/responses``: responses of the batch carrying a verdict (all of them when
  the wiring works; 0 with the guard on means the verdicts were lost on the way).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["CUT_KEY", "PREFIX", "step_metrics", "summarize"]

CUT_KEY = "npu_rl_long_tail_cut"
PREFIX = "npu_rl/long_tail_guard/"


def summarize(extra_fields: list[Any]) -> dict[str, float]:
    """The metrics of one step's responses, given each response's ``extra_fields`` (padding rows
    already dropped; a response without :data:`CUT_KEY` is not counted)."""
    verdicts = [bool(e[CUT_KEY]) for e in extra_fields if isinstance(e, Mapping) and e.get(CUT_KEY) is not None]
    cuts = sum(verdicts)
    return {
        PREFIX + "active": 1.0,
        PREFIX + "cuts": float(cuts),
        PREFIX + "cut_fraction": cuts / len(verdicts) if verdicts else 0.0,
        PREFIX + "responses": float(len(verdicts)),
    }


def step_metrics(
    batch: Any, kv_batch_get: Callable[..., Any], env: Mapping[str, str] | None = None
) -> dict[str, float]:
    """The guard's metrics of a V1 trainer step; ``{}`` (and nothing read) when the guard is off.

    ``batch``: verl's ``KVBatchMeta`` of the step (``keys``, ``partition_id``, ``tags`` with
    ``is_padding``); ``kv_batch_get``: TransferQueue's ``kv_batch_get``, from which the responses'
    ``extra_fields`` are read (verl's trainer reads its speculative-decoding counts the same way).
    The switch is read by the guard's own reader, so trainer and servers agree on it.
    """
    from npu_rl.feature_metrics import step_extra_fields
    from npu_rl.sampler.guard import GuardParams

    if GuardParams.from_env(env) is None:
        return {}
    return summarize(step_extra_fields(batch, kv_batch_get))
