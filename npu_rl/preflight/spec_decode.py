"""Preflight checks of SAM speculative decoding (issue 6): the ``speculative_config`` keys a recipe sets.

Value checks of single keys happen while overrides are parsed (:mod:`npu_rl.preflight.freeform`);
this module checks the composed config: the draft length, the key/env-alias agreement, the rollout
engine and the settings SAM cannot run with.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from npu_rl.preflight.checks import R, sel
from npu_rl.preflight.report import Report
from npu_rl.settings import SettingsError
from npu_rl.spec_decode.config import ENV_ALIAS, KEYS, PREFIX, resolve


def check_spec_decode(cfg, env: Mapping[str, str], report: Report, no_rewards: str = "") -> str | None:
    """Check the SAM keys of a composed config; return a plan line ("k=3, gate <= 32, ...") when SAM is on.

    ``no_rewards``: why the job's trainer sends the history no rewards ("": it does, verl's V1 trainer
    through patch 0012); with ``sam_history_rewards`` on, that is a warning naming the key."""
    spec = sel(cfg, PREFIX, None)
    method = str(sel(cfg, f"{PREFIX}.method", "") or "")
    if method.lower() != "sam":
        # ENV_ALIAS set while SAM is off: warned by npu_rl.settings.check (every feature's tuning variables)
        for key in KEYS:
            if sel(cfg, f"{PREFIX}.{key}", None) is not None:
                report.warn(f"{PREFIX}.{key}", f"only the SAM drafter reads it, but method is {method or 'unset'}")
        return None
    if method != "sam":
        report.error(
            f"{PREFIX}.method", f"'{method}': vLLM's method names are lower case", f"write {PREFIX}.method=sam"
        )
    try:
        settings = resolve(
            sel(cfg, f"{PREFIX}.num_speculative_tokens", None),
            *(sel(cfg, f"{PREFIX}.{key}", None) for key in KEYS),
            env=env,
        )
    except SettingsError as e:  # the env alias's value (also named by npu_rl.settings.check: reported once)
        report.error(e.name, str(e), e.fix)
        return None
    except ValueError as e:
        text = str(e)
        key = next((k for k in ("num_speculative_tokens", *KEYS) if text.startswith(k)), None)
        report.error(f"{PREFIX}.{key}" if key else ENV_ALIAS if text.startswith(ENV_ALIAS) else PREFIX, text)
        return None
    if str(sel(cfg, f"{R}.name", "vllm")) != "vllm":
        report.error(
            f"{R}.name", f"is '{sel(cfg, f'{R}.name')}': the SAM drafter is a vLLM proposer", f"set {R}.name=vllm"
        )
    if sel(cfg, f"{R}.mtp.enable", False) and sel(cfg, f"{R}.mtp.enable_rollout", False):
        # verl's build_mtp_speculative_config lays engine_kwargs.vllm.speculative_config over MTP's
        # (vllm_rollout/utils.py:522-537): method=sam wins and MTP drafting silently does not run.
        report.warn(
            f"{R}.mtp.enable_rollout",
            "is ignored: verl lays engine_kwargs.vllm.speculative_config (method=sam) over MTP's drafter config",
            "use one drafter: SAM (method=sam) or MTP (actor_rollout_ref.model.mtp.enable_rollout)",
        )
    # async_scheduling=True with SAM: vLLM's VllmConfig refuses it (npu_rl.preflight.libraries).
    if isinstance(spec, Mapping) and spec.get("prompt_lookup_max") is not None:
        report.warn(f"{PREFIX}.prompt_lookup_max", "is an n-gram setting: the SAM drafter ignores it")
    if settings.history_bytes and settings.history_rewards and no_rewards:
        report.warn(
            f"{PREFIX}.sam_history_rewards",
            f"is on (the default with sam_history_mb), but {no_rewards}: the history waits for rewards that never "
            "come and is ranked by age",
            f"set {PREFIX}.sam_history_rewards=false",
        )
        settings = replace(settings, history_rewards=False)
    gate = {0: "never (gate 'never')"}.get(
        settings.max_batch,
        "at every batch size" if settings.max_batch >= 1 << 62 else f"while running batch <= {settings.max_batch}",
    )
    return (
        f"SAM k={settings.k}, drafts {gate}, group corpus "
        f"{settings.group_corpus_bytes >> 20} MiB, min match {settings.min_match}, "
        f"adaptive k {'on' if settings.adaptive_k else 'off'}, history "
        + (f"{settings.history_bytes >> 20} MiB" if settings.history_bytes else "off")
        + (f" (scope {settings.history_scope})" if settings.history_bytes and settings.history_scope else "")
        + (_ranking(settings.history_rewards) if settings.history_bytes else "")
    )


def _ranking(rewards: bool) -> str:
    return ", ranked by the trainer's rewards" if rewards else ", ranked by age (sam_history_rewards=false)"
