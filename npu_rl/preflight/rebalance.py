"""Preflight checks of rollout rebalance (``ROLLOUT_REBALANCE_*``, issue 8, docs/rebalance.md)."""

from __future__ import annotations

from collections.abc import Mapping

from npu_rl import settings as feature_settings
from npu_rl.preflight.checks import R, sel
from npu_rl.preflight.report import Report
from npu_rl.rebalance.settings import SWITCH, settings_from
from npu_rl.settings import SettingsError


def check_rollout_rebalance(cfg, env: Mapping[str, str], report: Report) -> None:
    """With ``ROLLOUT_REBALANCE_ENABLE=1``: every parameter parses (the first bad one is named, as
    :func:`npu_rl.settings.check` names it), the rollout is vLLM without prefill/decode disaggregation
    (the dispatcher picks vLLM DP ranks), and settings that make the switch a no-op or cap it are named."""
    if not feature_settings.is_on(SWITCH, env):
        return
    max_num_seqs = int(sel(cfg, f"{R}.max_num_seqs", 1024))
    dp = int(sel(cfg, f"{R}.data_parallel_size", 1))
    try:
        s = settings_from(
            env,
            max_num_seqs=max_num_seqs,
            data_parallel_size=dp,
            response_length=int(sel(cfg, f"{R}.response_length", 0)),
        )
    except SettingsError as e:
        report.error(e.name, str(e), e.fix)
        return
    name = str(sel(cfg, f"{R}.name", "vllm"))
    if name != "vllm":
        report.error(
            SWITCH, f"rollout rebalance drives vLLM servers, but {R}.name={name}", f"set {R}.name=vllm or {SWITCH}=0"
        )
    if bool(sel(cfg, f"{R}.disaggregation.enabled", False)):
        report.error(
            SWITCH,
            "rollout rebalance does not route prefill/decode-disaggregated replicas",
            f"set {R}.disaggregation.enabled=False or {SWITCH}=0",
        )
    if bool(sel(cfg, f"{R}.full_determinism", False)):
        report.error(
            SWITCH,
            f"{R}.full_determinism=True keeps verl's hash routing: rollout rebalance would do nothing (the run "
            "stops with this error when the rollout servers start)",
            f"set {SWITCH}=0, or {R}.full_determinism=False",
        )
    if s.max_inflight > max_num_seqs:
        report.warn(
            "ROLLOUT_REBALANCE_MAX_INFLIGHT",
            f"{s.max_inflight} is above {R}.max_num_seqs={max_num_seqs}: capped to {max_num_seqs}",
            "leave it unset (0) to use max_num_seqs",
        )
    if dp > 1 and not s.route_dp_ranks:
        report.warn(
            "ROLLOUT_REBALANCE_DP_RANKS",
            f"off with {R}.data_parallel_size={dp}: each replica is one target and vLLM spreads its requests "
            "over its DP ranks by count, blind to length",
            "unset it (auto) to let the dispatcher choose the DP rank",
        )
