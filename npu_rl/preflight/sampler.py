"""Preflight rules of the length-aware resampler and the long-tail guard (issue 5).

``data.sampler.class_name=LengthAwareEpochSampler`` needs ``data.dataloader_num_workers=0`` (verl's
default is 8: workers would prefetch batches ordered with a stale length table) and valid
``data.sampler.*`` keys; the guard's ``VLLM_ROLLOUT_EARLY_STOP_*`` values must parse and be in range.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping

from npu_rl.preflight.checks import sel
from npu_rl.preflight.report import Report

SAMPLER = "data.sampler"


def check_sampler(cfg, env: Mapping[str, str], report: Report) -> None:
    """Add the resampler's and the guard's findings to ``report``."""
    from npu_rl.sampler.guard import GuardParams
    from npu_rl.sampler.keys import CLASS_NAME, CLASS_PATH, REFERENCE_CLASS_PATH, SAMPLER_KEYS
    from npu_rl.settings import SettingsError

    try:
        guard = GuardParams.from_env(env)
    except SettingsError as e:  # also named by npu_rl.settings.check: the report keeps one
        guard = None
        report.error(e.name, str(e), e.fix)
    rollout = str(sel(cfg, "actor_rollout_ref.rollout.name", "vllm"))
    response = int(sel(cfg, "data.max_response_length", 0) or 0)
    if guard is not None and response and guard.min_tokens >= response:
        report.warn(
            "VLLM_ROLLOUT_EARLY_STOP_MIN_TOKENS",
            f"is {guard.min_tokens}, not below data.max_response_length ({response}): the guard can never cut",
            f"set it below {response}, or unset VLLM_ROLLOUT_EARLY_STOP_ENABLE",
        )
    if guard is not None and rollout != "vllm":
        report.error(
            "VLLM_ROLLOUT_EARLY_STOP_ENABLE",
            f"the long-tail guard hooks verl's vLLM server, but actor_rollout_ref.rollout.name={rollout}",
            "use actor_rollout_ref.rollout.name=vllm, or unset VLLM_ROLLOUT_EARLY_STOP_ENABLE",
        )

    block = sel(cfg, SAMPLER, None)
    if block is None:
        return
    name, path = block.get("class_name"), block.get("class_path")
    extra = [k for k in block.keys() if k not in ("class_path", "class_name")]
    if not name:
        if extra:
            report.warn(
                f"{SAMPLER}.{extra[0]}",
                f"is set but no sampler is: data.sampler.class_name is null, so {', '.join(extra)} do nothing",
                f"add data.sampler.class_name={CLASS_NAME}",
            )
        return
    workers = sel(cfg, "data.dataloader_num_workers", 0)
    if int(workers or 0) > 0:
        report.error(
            "data.dataloader_num_workers",
            f"is {workers} but data.sampler.class_name={name} needs 0: worker processes prefetch batches "
            "ordered before the sampler learnt from the last step (verl's default is 8)",
            "add data.dataloader_num_workers=0",
        )
    if name != CLASS_NAME or path not in (None, "", CLASS_PATH, REFERENCE_CLASS_PATH):
        if not path:
            report.error(
                f"{SAMPLER}.class_name",
                f"{name} is not a sampler this project ships and data.sampler.class_path is not set",
                f"use data.sampler.class_name={CLASS_NAME}, or set data.sampler.class_path=pkg://<module>",
            )
        return  # someone else's sampler: its keys are its own
    if path == REFERENCE_CLASS_PATH:
        report.warn(
            f"{SAMPLER}.class_path",
            f"{path} is the reference recipe's module; this release builds {CLASS_PATH}",
            "drop data.sampler.class_path (or set it to pkg://npu_rl.sampler)",
        )
    for key in extra:
        if key not in SAMPLER_KEYS:
            close = difflib.get_close_matches(key, list(SAMPLER_KEYS), n=1, cutoff=0.5)
            report.error(
                f"{SAMPLER}.{key}",
                f"is not a key of {CLASS_NAME} (it reads {', '.join(SAMPLER_KEYS)}); the run would stop",
                f"did you mean +{SAMPLER}.{close[0]}?" if close else "remove it",
            )
    bucket, decay, shuffle = (block.get(k, d) for k, d in SAMPLER_KEYS.items())
    try:
        ok = int(bucket) >= 1 and float(bucket) == int(bucket)
    except (TypeError, ValueError):
        ok = False
    if not ok:
        report.error(f"{SAMPLER}.bucket_size", f"{bucket!r} is not a whole number of tokens >= 1", "e.g. 1024")
    try:
        ok = 0.0 <= float(decay) < 1.0
    except (TypeError, ValueError):
        ok = False
    if not ok:
        report.error(f"{SAMPLER}.ema_decay", f"{decay!r} is not in [0, 1) (the weight of the old EMA)", "e.g. 0.7")
    if str(shuffle).strip().lower() not in ("true", "false", "1", "0", "yes", "no", "on", "off"):
        report.error(f"{SAMPLER}.shuffle_batch_blocks", f"{shuffle!r} is not a boolean", "True or False")
