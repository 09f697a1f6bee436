"""A CPU platform for verl, for development and the CPU main job (``recipes/qwen3-tiny``).

verl 0.9 selects its device backend through ``verl.plugin.platform`` (a registry of
``PlatformBase`` subclasses; ``VERL_PLATFORM=<name>`` forces one, external modules register more
through ``VERL_USE_EXTERNAL_MODULES``). :mod:`npu_rl.cpu.platform` registers ``cpu``: gloo
collectives, the FSDP engines, a device module with the memory queries verl makes, shared-memory
weight transfer (no IPC). It is never auto-detected, and refuses to start on a machine that has
NPUs (the launcher's rule: ``/dev/davinci<N>``, else the dies ``npu-smi`` lists): there the NPU
platform is the only right answer.

The recipe's env script (``recipes/qwen3-tiny/env_cpu.sh``) turns it on with
``VERL_USE_EXTERNAL_MODULES=npu_rl.cpu.platform`` and ``VERL_PLATFORM=cpu``.

:mod:`npu_rl.cpu.checkpoint_engine` adds verl checkpoint engine ``gloo`` for weight syncs between
separate trainer and rollout pools (the fully-async CPU recipe), which verl has none of on CPU.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

PLATFORM_NAME = "cpu"


def cpu_platform_selected(env: Mapping[str, str] | None = None) -> bool:
    """Whether ``VERL_PLATFORM`` (in ``env``, default the process environment) selects this platform."""
    env = os.environ if env is None else env
    return env.get("VERL_PLATFORM", "").strip().lower() == PLATFORM_NAME


def keep_cpu_linear_weights() -> bool:
    """Whether vLLM's CPU backend must keep each linear layer's weight after packing it for oneDNN.

    vLLM 0.23 on CPU (``UnquantizedLinearMethod.process_weights_after_loading``) packs the weight
    into a oneDNN handle and replaces the parameter with an empty one, so a second
    ``load_weights`` (verl's weight sync after every step) fails with "Attempted to load weight
    ... into parameter (torch.Size([0]))". Under verl's CPU platform (``VERL_PLATFORM=cpu``, set by
    the CPU env script and inherited by the vLLM server and its workers) the weight is kept; verl
    runs ``process_weights_after_loading`` after each sync, which packs the new weights again.
    Costs one extra copy of the linear weights in host memory. Called by vllm patch 0003.
    """
    return cpu_platform_selected()
