"""Every switched-on feature says in the experiment tracker that it is active (issue 18, item 2).

One metric per feature and step, ``npu_rl/<slug>/active`` (1.0 active, 0.0 switched on but found
inactive), added to the trainer's step metrics by verl patch ``0010-verl-feature-active-metrics``
(V1 and legacy trainers, one-step-off-policy at each step, fully async once per weight-sync cycle).
What "active" rests on differs by where the feature runs:

- **seen by the driver at this step**: the length-aware resampler (the dataloader's sampler is ours),
  rollout rebalance (the dispatcher reported this step's ``rollout_rebalance/*`` metrics); 0.0 when
  the switch is on and that evidence is missing;
- **reported by the feature itself** through verl's own metric paths, not duplicated here: the
  all-to-all-v reshard (``npu_rl/reshard/active`` from the weight sync), the long-tail guard
  (``npu_rl/long_tail_guard/*`` from the rollout servers) and, on the V1 trainer, SAM
  (``npu_rl/sam/*`` from each response's draft counts, :mod:`npu_rl.spec_decode.metrics`);
- **switched on and accepted**: features that run where the driver cannot look (vLLM engine cores:
  the engine GC guard, and SAM on trainers without the V1 step path; Megatron workers: random init;
  the trainer's own branch: skip old-log-prob). Every such switch is refused loudly when it cannot
  take effect (the preflight, the patched ``validate_config``, vLLM's ``SpeculativeConfig``), so
  reaching a step means it runs; the engine's own evidence is in the log (``engine GC guard on``,
  SAM's proposer).

Features are read with :func:`npu_rl.settings.check`, the same judgement the preflight makes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

#: The metric namespace of each feature (``npu_rl/<slug>/active``), by the feature's name in npu_rl.settings.
SLUGS: dict[str, str] = {
    "random init": "random_init",
    "length-aware resampler": "resampler",
    "long-tail guard": "long_tail_guard",
    "SAM speculative decoding": "sam",
    "all-to-all-v MoE reshard": "reshard",
    "rollout rebalance": "rollout_rebalance",
    "skip old-log-prob recompute": "skip_old_log_prob",
    "no GC pauses in decode steps": "engine_gc",
    "rollout progress": "rollout_progress",
}
#: Features whose own runtime path puts their ``active`` metric into the step's metrics.
SELF_REPORTED = frozenset({"all-to-all-v MoE reshard", "long-tail guard"})


def metric(feature_name: str) -> str:
    """``npu_rl/<slug>/active`` for a feature of :data:`npu_rl.settings.FEATURES`.

    Raises:
        KeyError: a feature without a slug (a new feature must be added to :data:`SLUGS`).
    """
    return f"npu_rl/{SLUGS[feature_name]}/active"


def switched_on(select: Callable[[str], Any], env: Mapping[str, str] | None = None) -> list[str]:
    """Names of the features the run switches on: its environment and its config (``select(key)``)."""
    from npu_rl import settings

    return [f.name for f in settings.check(os.environ if env is None else env, select).on]


def active_metrics(
    select: Callable[[str], Any],
    metrics: Mapping[str, Any],
    env: Mapping[str, str] | None = None,
    sampler: Any = None,
) -> dict[str, float]:
    """The ``active`` metrics of one step.

    ``select`` reads the run's config by dotted key, ``metrics`` are the step's metrics so far (the
    rebalance dispatcher's among them), ``sampler`` the train dataloader's sampler (None if unknown:
    then the one this process built, :func:`npu_rl.sampler.active_sampler`).
    Returns ``{metric name: 1.0 or 0.0}`` for every switched-on feature not in :data:`SELF_REPORTED`
    whose ``active`` metric is not in ``metrics`` already.
    """
    out: dict[str, float] = {}
    for name in switched_on(select, env):
        if name in SELF_REPORTED or metric(name) in metrics:  # the feature's own path reported it
            continue
        if name == "length-aware resampler":
            active = _resampler_active(sampler)
        elif name == "rollout rebalance":
            active = any(str(k).startswith("rollout_rebalance/") for k in metrics)
        else:
            active = True
        out[metric(name)] = 1.0 if active else 0.0
    return out


def _resampler_active(sampler: Any) -> bool:
    from npu_rl.sampler import LengthAwareEpochSampler, active_sampler

    return isinstance(active_sampler() if sampler is None else sampler, LengthAwareEpochSampler)


def trainer_metrics(trainer: Any, metrics: Mapping[str, Any]) -> dict[str, float]:
    """:func:`active_metrics` for a verl trainer (``trainer.config``, its train dataloader's sampler):
    the call verl patch 0010 makes at the end of each training step."""
    from omegaconf import OmegaConf

    config = trainer.config
    loader = getattr(trainer, "train_dataloader", None)
    sampler = getattr(loader, "sampler", None) if loader is not None else None
    return active_metrics(lambda key: OmegaConf.select(config, key), metrics, sampler=sampler)


def step_extra_fields(batch: Any, kv_batch_get: Callable[..., Any]) -> list[Any]:
    """The ``extra_fields`` of a V1 trainer step's real responses (padding rows dropped), in batch order.

    ``batch``: verl's ``KVBatchMeta`` of the step (``keys``, ``partition_id``, ``tags`` with
    ``is_padding``); ``kv_batch_get``: TransferQueue's ``kv_batch_get`` (verl's trainer reads its own
    speculative-decoding counts the same way). The features whose verdicts ride in a response's
    ``extra_fields`` (the long-tail guard, SAM's counts) read them here.
    """
    data = kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["extra_fields"])
    fields = data["extra_fields"]
    fields = fields.tolist() if hasattr(fields, "tolist") else list(fields)
    real = [not tag.get("is_padding", False) for tag in batch.tags]
    return [e for e, keep in zip(fields, real, strict=True) if keep]
