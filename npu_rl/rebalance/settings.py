"""Rollout rebalance's settings, resolved: the ``ROLLOUT_REBALANCE_*`` variables (declared, with their
defaults and ranges, in :mod:`npu_rl.settings`; ``python -m npu_rl.settings`` lists them) plus the
rollout facts the load balancer needs."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from npu_rl import settings as _settings

SWITCH = "ROLLOUT_REBALANCE_ENABLE"
PARAMS = _settings.feature("rollout rebalance").params


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


def enabled(env: Mapping[str, str] | None = None) -> bool:
    """True when ``ROLLOUT_REBALANCE_ENABLE`` is on.

    Raises:
        SettingsError: the value is not a boolean word.
    """
    return _settings.get(SWITCH, env)


def settings_from(
    env: Mapping[str, str] | None = None,
    *,
    max_num_seqs: int = 1024,
    data_parallel_size: int = 1,
    response_length: int = 0,
) -> RebalanceSettings:
    """Read every ``ROLLOUT_REBALANCE_*`` parameter; a prior length of 0 becomes ``response_length / 4``.

    Raises:
        SettingsError: a value of the wrong type or range, naming the variable and the allowed values.
    """
    v = _settings.values("rollout rebalance", os.environ if env is None else env)
    prior = v["ROLLOUT_REBALANCE_PRIOR_LEN"]
    if prior == 0.0:
        prior = response_length / 4 if response_length > 0 else 4096.0
    dp_ranks = v["ROLLOUT_REBALANCE_DP_RANKS"]
    return RebalanceSettings(
        order=v["ROLLOUT_REBALANCE_ORDER"],
        predict=v["ROLLOUT_REBALANCE_PREDICT"],
        keep_groups=v["ROLLOUT_REBALANCE_KEEP_GROUPS"],
        route_dp_ranks=True if dp_ranks == "auto" else dp_ranks,
        max_inflight=v["ROLLOUT_REBALANCE_MAX_INFLIGHT"],
        gather_s=v["ROLLOUT_REBALANCE_GATHER_S"],
        ema_decay=v["ROLLOUT_REBALANCE_EMA_DECAY"],
        prior_len=float(prior),
        max_attempts=v["ROLLOUT_REBALANCE_MAX_ATTEMPTS"],
        metrics_file=v["ROLLOUT_REBALANCE_METRICS_FILE"],
        max_num_seqs=int(max_num_seqs),
        data_parallel_size=int(data_parallel_size),
    )
