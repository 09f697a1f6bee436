"""The features this project adds, how each is switched, and whether this release carries it.

One table, read by the preflight (recognise switches, reject unavailable or unsupported
combinations) and by the docs. A feature is *available* when every patch it needs is in the series
under ``patches/``; until then switching it on is an error that says so, never a silent no-op.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from npu_rl import REPO_ROOT
from npu_rl.rebalance import settings as _rebalance

TRUE = {"1", "true", "yes", "on"}
FALSE = {"0", "false", "no", "off", ""}


@dataclass(frozen=True)
class Feature:
    """One switchable feature.

    ``env`` is its on/off variable (or None when a config key switches it), ``config`` the config key
    and the value that turns it on, ``params`` the other variables that tune it, ``patches`` the
    series entries (``<upstream>/<file name>``) it needs, ``issue`` where it is specified.
    """

    name: str
    summary: str
    issue: int
    env: str | None = None
    config: tuple[str, str] | None = None
    params: tuple[str, ...] = ()
    patches: tuple[str, ...] = ()
    default_on: bool = False

    def available(self) -> bool:
        if not self.patches:
            return False
        for entry in self.patches:
            upstream, name = entry.split("/", 1)
            series = REPO_ROOT / "patches" / upstream / "series"
            if not series.is_file() or name not in series.read_text().split():
                return False
        return True


FEATURES: tuple[Feature, ...] = (
    Feature(
        "random init",
        "trains from Megatron's random initialisation instead of loading the checkpoint (throughput runs)",
        4,
        env="NPU_RL_RANDOM_INIT",
        patches=("verl/0002-verl-feature-random-init.patch",),
    ),
    Feature(
        "length-aware resampler",
        "groups prompts of similar predicted response length into the same generation batch",
        5,
        config=("data.sampler.class_name", "LengthAwareEpochSampler"),
        patches=("verl/0006-verl-feature-length-aware-sampler.patch",),
    ),
    Feature(
        "long-tail guard",
        "aborts straggling responses once most of a step has finished (truncates; opt-in)",
        5,
        env="VLLM_ROLLOUT_EARLY_STOP_ENABLE",
        params=(
            "VLLM_ROLLOUT_EARLY_STOP_FACTOR",
            "VLLM_ROLLOUT_EARLY_STOP_MIN_TOKENS",
            "VLLM_ROLLOUT_EARLY_STOP_FINISHED_FRACTION",
        ),
        patches=("verl/0007-verl-feature-long-tail-guard.patch",),
    ),
    Feature(
        "SAM speculative decoding",
        "suffix-automaton drafter verified by vLLM's rejection sampler",
        6,
        config=("actor_rollout_ref.rollout.engine_kwargs.vllm.speculative_config.method", "sam"),
        params=("VLLM_SPECULATIVE_BATCH_SIZE_THRE",),  # alias of speculative_config.sam_batch_size_threshold
        patches=(
            "vllm/0002-vllm-feature-sam-speculative-method.patch",
            "vllm-ascend/0001-vllm-ascend-feature-sam-speculative-method.patch",
        ),
    ),
    Feature(
        "all-to-all-v MoE reshard",
        "sends each rollout rank only its experts after every training step",
        7,
        env="ALL_TO_ALL_RESHARD",
        config=("actor_rollout_ref.rollout.checkpoint_engine.expert_reshard", "true"),
        params=("USE_ALLTOALL_OVERLAP", "ALL_TO_ALL_RESHARD_BUCKET_MB"),
        patches=("verl/0005-verl-feature-expert-reshard.patch", "mbridge/0001-mbridge-feature-export-skip.patch"),
    ),
    Feature(
        "rollout rebalance",
        "pull-based, longest-predicted-first dispatch of rollout requests across replicas",
        8,
        env=_rebalance.SWITCH,
        params=_rebalance.PARAMS,
        patches=("verl/0008-verl-feature-rollout-rebalance.patch",),
    ),
    Feature(
        "skip old-log-prob recompute",
        "on-policy updates use log_prob.detach() instead of a second forward pass",
        9,
        config=("actor_rollout_ref.actor.recompute_old_log_prob", "false"),
        patches=("verl/0003-verl-feature-skip-old-log-prob.patch",),
    ),
    Feature(
        "no GC pauses in decode steps",
        "vLLM's engine core steps with automatic GC off and collects between steps at a bounded cadence",
        9,
        env="NPU_RL_ENGINE_GC",
        params=("NPU_RL_ENGINE_GC_EVERY", "NPU_RL_ENGINE_GC_MAX_GEN0", "NPU_RL_ENGINE_GC_FULL_GROWTH"),
        patches=("vllm/0001-vllm-feature-engine-gc.patch",),
    ),
    Feature(
        "rollout progress",
        "progress bar (TTY) or periodic line during generation: requests done/total, tokens/s, longest response",
        9,
        env="NPU_RL_ROLLOUT_PROGRESS",
        params=("NPU_RL_ROLLOUT_PROGRESS_INTERVAL",),
        patches=("verl/0004-verl-feature-rollout-progress.patch",),
    ),
)

# Names the reference recipe used that this project replaces: old name -> what to write instead.
RENAMED = {
    "VLLM_ENABLE_EXPERT_PARALLEL": "actor_rollout_ref.rollout.expert_parallel_size=<TP x DP> (verl 0.9 config)",
    "VLLM_DP_SIZE": "actor_rollout_ref.rollout.data_parallel_size=<N> (verl 0.9 config)",
}

# Prefixes of variables that only this project (or the reference recipe) reads: typos are caught here.
OWN_PREFIXES = (
    "VLLM_ROLLOUT_", "VLLM_SPECULATIVE_", "ALL_TO_ALL", "USE_ALLTOALL", "ROLLOUT_REBALANCE", "NPU_RL_ENGINE_GC",
    "NPU_RL_ROLLOUT_PROGRESS",
)  # fmt: skip


def known_env() -> set[str]:
    """Every variable the feature table knows (switches and parameters)."""
    names = {f.env for f in FEATURES if f.env} | {p for f in FEATURES for p in f.params}
    return names | set(RENAMED)


def env_flag(env: Mapping[str, str], key: str) -> bool | None:
    """The boolean value of ``env[key]``: True/False, or None when the value is not a boolean word."""
    raw = env.get(key, "").strip().lower()
    if raw in TRUE:
        return True
    if raw in FALSE:
        return False
    return None


def require_flag(env: Mapping[str, str], key: str, default: bool = False) -> bool:
    """``env[key]`` as a boolean (``default`` when unset), for the code a switch turns on.

    Raises:
        NpuRlError: the value is not a boolean word (1/0, true/false, yes/no, on/off); names the variable.
    """
    from npu_rl.errors import NpuRlError

    if key not in env:
        return default
    flag = env_flag(env, key)
    if flag is None:
        raise NpuRlError(f"{key}={env[key]!r} is not a boolean: set {key}=1 or {key}=0")
    return flag


@dataclass
class FeatureState:
    """Which features a recipe switches on, and the problems with its switches."""

    on: list[Feature] = field(default_factory=list)
    errors: list[tuple[str, str, str]] = field(default_factory=list)  # (key, message, fix)
    warnings: list[tuple[str, str, str]] = field(default_factory=list)


def feature_state(
    env: Mapping[str, str], select: Callable[[str], object], node_env: Mapping[str, str] | None = None
) -> FeatureState:
    """Read the switches of every feature from ``env`` and the composed config (``select(key)``).

    ``node_env`` is what the launcher saw before running the train script (the node environment that
    Ray's workers on every node inherit); a feature variable that differs there was set in the train
    script, where only the driver sees it.
    """
    st = FeatureState()
    for key in sorted(known_env() - set(RENAMED)):
        if node_env is not None and env.get(key, "") != node_env.get(key, ""):
            st.errors.append(
                (
                    key,
                    f"is {env.get(key, '')!r} in the train script but {node_env.get(key, '')!r} in the node "
                    "environment: Ray workers on the other nodes would not see it",
                    "set feature variables in the ENV_SCRIPT (sourced on every node before Ray starts)",
                )
            )
    for f in FEATURES:
        on = False
        if f.env:
            flag = env_flag(env, f.env)
            if flag is None:
                st.errors.append((f.env, f"{env[f.env]!r} is not a boolean", f"set {f.env}=1 or {f.env}=0"))
            on = bool(flag)
        if f.config:
            key, value = f.config
            on = on or str(select(key)).lower() == value.lower()
        switch = f.env + "=1" if f.env else f"{f.config[0]}={f.config[1]}"  # type: ignore[index]
        if not on:
            for p in f.params:
                if env.get(p, "").strip():
                    st.warnings.append(
                        (p, f"is set but has no effect: the {f.name} is off", f"switch it on with {switch}, or drop it")
                    )
            continue
        st.on.append(f)
        if not f.available():
            st.errors.append(
                (
                    f.env or f.config[0],  # type: ignore[index]
                    f"the {f.name} is switched on ({switch}) but is not in this release yet (issue {f.issue})",
                    "remove the switch; `bash apply_all_patches.sh --status` lists what this release carries",
                )
            )
    for key in sorted(env):
        if key in RENAMED:
            st.errors.append((key, "is a reference-recipe name this project does not read", f"use {RENAMED[key]}"))
        elif key.startswith(OWN_PREFIXES) and key not in known_env():
            close = difflib.get_close_matches(key, sorted(known_env()), n=1)
            st.warnings.append(
                (key, "is not a variable any npu-rl feature reads", f"did you mean {close[0]}?" if close else "")
            )
    return st


def features_table() -> str:
    """The README's feature table (markdown), generated from :data:`FEATURES`."""
    rows = ["| feature | switch | tuning | in this release |", "|---|---|---|---|"]
    for f in FEATURES:
        switch = f"`{f.env}=1`" if f.env else f"`{f.config[0]}={f.config[1]}`"  # type: ignore[index]
        tuning = ", ".join(f"`{p}`" for p in f.params) or "–"
        status = "yes" if f.available() else f"not yet (issue {f.issue}); switching it on is rejected"
        rows.append(f"| {f.name}: {f.summary} | {switch} | {tuning} | {status} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(features_table())
