"""The calls the verl patch ``rollout-rebalance`` makes (``verl/workers/rollout/llm_server.py`` and, for
the per-step metrics, ``verl/trainer/ppo/v1/trainer_base.py``).

Each returns verl's own value unchanged when ``ROLLOUT_REBALANCE_ENABLE`` is off, so the patched
``LLMServerManager`` behaves exactly as upstream. Nothing here imports verl until the switch is on.
"""

from __future__ import annotations

import logging
from typing import Any

from npu_rl.errors import NpuRlError
from npu_rl.rebalance.settings import enabled, settings_from

logger = logging.getLogger(__name__)

# Ray runs an async actor's calls concurrently up to max_concurrency (default 1000). Every waiting
# request is one pending acquire_server call, and release_server calls must never queue behind them.
MAX_CONCURRENCY = 100_000


def refuse_inactive(rollout: Any) -> None:
    """No silent no-op: the switch is on, but the rollout config keeps verl's own routing.

    ``full_determinism=True`` makes verl route by request hash (``LLMServerManager``) and our balancer
    would never be asked; before, the switch was dropped with a log line while the servers' concurrency
    was still raised to DP x max_num_seqs.

    Raises:
        NpuRlError: ``full_determinism`` is on (names both keys and the fix).
    """
    if getattr(rollout, "full_determinism", False):  # OmegaConf node or verl's RolloutConfig
        raise NpuRlError(
            "ROLLOUT_REBALANCE_ENABLE=1 with actor_rollout_ref.rollout.full_determinism=True: deterministic "
            "runs keep verl's hash routing, so rollout rebalance would do nothing. Set ROLLOUT_REBALANCE_ENABLE=0 "
            "or actor_rollout_ref.rollout.full_determinism=False"
        )


def load_balancer_cls(config: Any) -> type | None:
    """Our load-balancer class bound to the rollout config, or None when the switch is off.

    Raises:
        NpuRlError: a ``ROLLOUT_REBALANCE_*`` value is invalid, or the rollout config would keep the
            switched-on balancer from running (:func:`refuse_inactive`).
    """
    if not enabled():
        return None
    rollout = config.actor_rollout_ref.rollout
    refuse_inactive(rollout)
    settings = settings_from(
        max_num_seqs=int(rollout.max_num_seqs),
        data_parallel_size=int(rollout.get("data_parallel_size", 1) or 1),
        response_length=int(rollout.get("response_length", 0) or 0),
    )
    from npu_rl.rebalance.verl_lb import RebalanceLoadBalancer

    # A class created here is pickled by value when Ray ships it to the actor: the settings travel.
    return type("BoundRebalanceLoadBalancer", (RebalanceLoadBalancer,), {"rebalance_settings": settings})


def is_rebalance(lb_cls: type | None) -> bool:
    """True for a class returned by :func:`load_balancer_cls` (without importing verl)."""
    return lb_cls is not None and getattr(lb_cls, "rebalance_settings", None) is not None


def actor_options(lb_cls: type) -> dict[str, Any]:
    """Ray actor options for the balancer: ``{}`` for verl's classes (upstream behaviour)."""
    return {"max_concurrency": MAX_CONCURRENCY} if is_rebalance(lb_cls) else {}


def start_balancer(lb_cls: type | None, servers: dict[str, Any]) -> Any | None:
    """Start our balancer as a Ray actor (with :func:`actor_options`) over ``servers``
    (``{address: server actor handle}``); None when ``lb_cls`` is not ours, and verl's router
    (``verl.workers.rollout.router.get_router_handle``) starts its own as upstream does."""
    if not is_rebalance(lb_cls):
        return None
    import ray
    from verl.workers.rollout.router import DEFAULT_ROUTING_CACHE_SIZE

    remote_cls = ray.remote(lb_cls).options(**actor_options(lb_cls))
    return remote_cls.remote(servers=servers, max_cache_size=DEFAULT_ROUTING_CACHE_SIZE)


def client_cls(base: type, lb_cls: type | None) -> type:
    """verl's client class, with :class:`~npu_rl.rebalance.verl_lb.RebalanceClientMixin` in front when
    the balancer is ours; ``base`` itself otherwise."""
    if not is_rebalance(lb_cls):
        return base
    from npu_rl.rebalance.verl_lb import RebalanceClientMixin

    attrs = {"rebalance_max_attempts": lb_cls.rebalance_settings.max_attempts}
    return type(f"Rebalance{base.__name__}", (RebalanceClientMixin, base), attrs)


def step_metrics(manager: Any, wait_idle_s: float = 2.0) -> dict[str, float]:
    """The dispatcher's metrics of the generation step that just ended, for the trainer's logger
    (``rollout_rebalance/...``: step time, per-target busy time, idle fraction, requests, predicted vs
    actual work); ``{}`` when the balancer is verl's. Several steps since the last call (validation,
    DAPO refills): the last one, and ``rollout_rebalance/steps`` counts them."""
    if manager is None or not is_rebalance(getattr(manager, "_load_balancer_cls", None)):
        return {}
    import ray

    steps = ray.get(manager.global_load_balancer.get_rebalance_metrics.remote(wait_idle_s=wait_idle_s))
    if not steps:
        return {}
    return {**steps[-1], "rollout_rebalance/steps": float(len(steps))}


def server_max_concurrency(config: Any, default: int) -> int:
    """Concurrent calls a rollout server actor accepts (verl: ``max(1000, max_num_seqs + 16)``).

    verl 0.9.1 sends every request of a replica to its node-0 server, whose Ray actor runs at most
    ``max(1000, max_num_seqs + 16)`` calls at once; with ``data_parallel_size`` DP ranks behind it
    (TP4 x DP32: 32 x 256 = 8192 slots) only ~1000 requests reach vLLM and the rest wait in Ray's
    queue, ~30 per DP rank. With the switch on, the dispatcher chooses every request's DP rank and
    keeps each rank at ``max_num_seqs``, so the server must accept ``DP x max_num_seqs`` (+16 control
    calls). Switch off: ``default`` (upstream behaviour).

    Raises:
        NpuRlError: the switch is on but the rollout config keeps verl's routing (:func:`refuse_inactive`).
    """
    if not enabled():
        return default
    refuse_inactive(config)
    dp = int(getattr(config, "data_parallel_size", 1) or 1)
    return max(default, dp * int(config.max_num_seqs) + 16)
