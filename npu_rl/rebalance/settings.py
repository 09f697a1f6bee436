"""The switches of rollout rebalance (environment variables, set in the recipe's ENV script).

=================================  ==========  =====================================================
variable                           default     meaning
=================================  ==========  =====================================================
ROLLOUT_REBALANCE_ENABLE           0           1: our dispatcher replaces verl's request load balancer
ROLLOUT_REBALANCE_ORDER            longest     longest: longest predicted work first; fifo: arrival
ROLLOUT_REBALANCE_PREDICT          1           0: ignore learned lengths (prompt length only)
ROLLOUT_REBALANCE_KEEP_GROUPS      0           1: the n samples of a prompt go to one target
ROLLOUT_REBALANCE_DP_RANKS         auto        auto/1: route to each DP rank of a multi-rank replica
                                               (vLLM ``data_parallel_rank``); 0: one target per replica
ROLLOUT_REBALANCE_MAX_INFLIGHT     0           slots per target; 0 = rollout.max_num_seqs
ROLLOUT_REBALANCE_GATHER_S         0.5         hold the first releases of a batch this long (s)
ROLLOUT_REBALANCE_EMA_DECAY        0.5         per-prompt EMA decay of observed response lengths
ROLLOUT_REBALANCE_PRIOR_LEN        0           length of unseen prompts before any observation;
                                               0 = rollout.response_length / 4
ROLLOUT_REBALANCE_MAX_ATTEMPTS     3           tries of one request when its replica dies
ROLLOUT_REBALANCE_METRICS_FILE     (none)      append per-step metrics as JSON lines to this file
=================================  ==========  =====================================================
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from npu_rl.errors import NpuRlError

SWITCH = "ROLLOUT_REBALANCE_ENABLE"
PARAMS = (
    "ROLLOUT_REBALANCE_ORDER",
    "ROLLOUT_REBALANCE_PREDICT",
    "ROLLOUT_REBALANCE_KEEP_GROUPS",
    "ROLLOUT_REBALANCE_DP_RANKS",
    "ROLLOUT_REBALANCE_MAX_INFLIGHT",
    "ROLLOUT_REBALANCE_GATHER_S",
    "ROLLOUT_REBALANCE_EMA_DECAY",
    "ROLLOUT_REBALANCE_PRIOR_LEN",
    "ROLLOUT_REBALANCE_MAX_ATTEMPTS",
    "ROLLOUT_REBALANCE_METRICS_FILE",
)


@dataclass(frozen=True)
class RebalanceSettings:
    """Resolved switches plus the rollout facts the load balancer needs (picklable: it travels to the
    load-balancer actor as a class attribute)."""

    order: str = "longest"
    predict: bool = True
    keep_groups: bool = False
    route_dp_ranks: bool = True
    max_inflight: int = 0
    gather_s: float = 0.5
    ema_decay: float = 0.5
    prior_len: float = 4096.0
    max_attempts: int = 3
    metrics_file: str = ""
    # from the rollout config
    max_num_seqs: int = 1024
    data_parallel_size: int = 1

    def slots(self) -> int:
        """Slots of one target: the dispatcher cap, never above vLLM's ``max_num_seqs``."""
        return min(self.max_inflight, self.max_num_seqs) if self.max_inflight > 0 else self.max_num_seqs

    def dp_targets(self) -> int:
        """Targets per replica: its DP ranks when routing to ranks, else 1."""
        return self.data_parallel_size if self.route_dp_ranks and self.data_parallel_size > 1 else 1


def _flag(env: Mapping[str, str], key: str, default: bool) -> bool:
    from npu_rl.features import require_flag

    return require_flag(env, key, default)


def _number(env: Mapping[str, str], key: str, default: float, kind: type, low: float) -> float:
    raw = env.get(key, "").strip()
    if not raw:
        return default
    try:
        v = kind(raw)
    except ValueError:
        raise NpuRlError(f"{key}={raw!r} is not a {kind.__name__}: e.g. {key}={default}") from None
    if v < low:
        raise NpuRlError(f"{key}={raw!r} must be >= {low}")
    return v


def enabled(env: Mapping[str, str] | None = None) -> bool:
    """True when ``ROLLOUT_REBALANCE_ENABLE`` is on.

    Raises:
        NpuRlError: the value is not a boolean word.
    """
    return _flag(os.environ if env is None else env, SWITCH, False)


def settings_from(
    env: Mapping[str, str] | None = None,
    *,
    max_num_seqs: int = 1024,
    data_parallel_size: int = 1,
    response_length: int = 0,
) -> RebalanceSettings:
    """Read every ``ROLLOUT_REBALANCE_*`` parameter (defaults in the module docstring).

    Raises:
        NpuRlError: a value of the wrong type or range, naming the variable and an example.
    """
    env = os.environ if env is None else env
    order = env.get("ROLLOUT_REBALANCE_ORDER", "longest").strip() or "longest"
    if order not in ("longest", "fifo"):
        raise NpuRlError(f"ROLLOUT_REBALANCE_ORDER={order!r}: use 'longest' (default) or 'fifo'")
    dp_raw = env.get("ROLLOUT_REBALANCE_DP_RANKS", "auto").strip().lower() or "auto"
    route_dp = True if dp_raw == "auto" else _flag(env, "ROLLOUT_REBALANCE_DP_RANKS", True)
    decay = _number(env, "ROLLOUT_REBALANCE_EMA_DECAY", 0.5, float, 0.0)
    if decay >= 1.0:
        raise NpuRlError(f"ROLLOUT_REBALANCE_EMA_DECAY={decay} must be < 1 (e.g. 0.5)")
    prior = _number(env, "ROLLOUT_REBALANCE_PRIOR_LEN", 0.0, float, 0.0)
    if prior == 0.0:
        prior = response_length / 4 if response_length > 0 else 4096.0
    return RebalanceSettings(
        order=order,
        predict=_flag(env, "ROLLOUT_REBALANCE_PREDICT", True),
        keep_groups=_flag(env, "ROLLOUT_REBALANCE_KEEP_GROUPS", False),
        route_dp_ranks=route_dp,
        max_inflight=int(_number(env, "ROLLOUT_REBALANCE_MAX_INFLIGHT", 0, int, 0)),
        gather_s=_number(env, "ROLLOUT_REBALANCE_GATHER_S", 0.5, float, 0.0),
        ema_decay=decay,
        prior_len=prior,
        max_attempts=int(_number(env, "ROLLOUT_REBALANCE_MAX_ATTEMPTS", 3, int, 1)),
        metrics_file=env.get("ROLLOUT_REBALANCE_METRICS_FILE", "").strip(),
        max_num_seqs=int(max_num_seqs),
        data_parallel_size=int(data_parallel_size),
    )
