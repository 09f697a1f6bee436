"""verl's ``cpu`` platform (see :mod:`npu_rl.cpu`). Imported by verl itself at ``import verl``
when ``VERL_USE_EXTERNAL_MODULES`` names this module, in the driver and in every Ray worker."""

from __future__ import annotations

import resource
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import torch
from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry

from npu_rl.cpu import PLATFORM_NAME, cpu_platform_selected
from npu_rl.errors import NpuRlError

# The Ray resource the launcher declares on every node ({"NPU": N}); verl's resource check
# (single_controller/ray/base.py) counts only GPU or NPU resources. On CPU they are logical slots.
RAY_RESOURCE = "NPU"
VISIBLE_DEVICES_ENV = "NPU_RL_CPU_VISIBLE_DEVICES"


class CpuPlatformRefused(NpuRlError):
    """The CPU platform was selected on a machine that has NPUs."""

    exit_code = 78


def npus_present() -> list[str]:
    """What shows this machine has Ascend NPUs, by the launcher's own rule
    (:meth:`npu_rl.launch.topology.Probe.count_npus`: ``/dev/davinci<N>`` device files, else the
    dies ``npu-smi info -m`` lists). Empty on a CPU machine."""
    from npu_rl.launch.topology import Probe

    found = Probe().count_npus()
    return [f"{found[0]} die(s) by {found[1]}"] if found else []


def refuse_on_npu_machine() -> None:
    """Raise CpuPlatformRefused when this machine has NPUs (the CPU platform is for CPU machines)."""
    found = npus_present()
    if found:
        raise CpuPlatformRefused(
            f"VERL_PLATFORM={PLATFORM_NAME} on a machine with NPUs ({', '.join(found)}): the CPU platform is for "
            "machines without NPUs (development, CI). Here run an NPU recipe with its env script, e.g. "
            "recipes/qwen3-0.6b/grpo_gsm8k_smoke.sh recipes/qwen3-0.6b/env_1node.sh"
        )


def _rss_bytes() -> int:
    """This process's peak resident set size in bytes (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class CpuDeviceModule:
    """What verl calls on ``get_torch_device()`` (``torch.cuda``-like), answered for the CPU.

    ``torch.cpu`` has ``synchronize``, ``current_stream``, ``Stream``, ``Event``, ``device_count``
    and ``is_available``; memory queries that only make sense for an accelerator's allocator
    (``memory_reserved`` and friends, used by verl's memory logging) report host memory: the peak
    RSS for allocated/reserved and ``/proc/meminfo`` for ``mem_get_info``. Everything else is
    looked up on ``torch.cpu`` so a missing name raises AttributeError, as it would on torch.cpu.
    """

    __name__ = "npu_rl.cpu.device"

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cpu, name)

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def device_count() -> int:
        return 1

    @staticmethod
    def current_device() -> int:
        return 0

    @staticmethod
    def set_device(_device: Any) -> None:
        return None

    @staticmethod
    def get_device_name(_device: Any = None) -> str:
        return "cpu"

    @staticmethod
    def empty_cache() -> None:
        return None

    @staticmethod
    def ipc_collect() -> None:
        return None

    @staticmethod
    def synchronize(_device: Any = None) -> None:
        return None

    @staticmethod
    def set_per_process_memory_fraction(_fraction: float, _device: Any = None) -> None:
        return None

    @staticmethod
    def memory_allocated(_device: Any = None) -> int:
        return _rss_bytes()

    memory_reserved = memory_allocated
    max_memory_allocated = memory_allocated
    max_memory_reserved = memory_allocated

    @staticmethod
    def reset_peak_memory_stats(_device: Any = None) -> None:
        return None

    @staticmethod
    def mem_get_info(_device: Any = None) -> tuple[int, int]:
        """(free, total) host memory in bytes, from /proc/meminfo (MemAvailable, MemTotal)."""
        info = {}
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                key, _, rest = line.partition(":")
                info[key] = int(rest.split()[0]) * 1024
        return info.get("MemAvailable", 0), info.get("MemTotal", 0)

    @staticmethod
    def get_rng_state(_device: Any = None) -> torch.Tensor:
        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state: torch.Tensor, _device: Any = None) -> None:
        torch.set_rng_state(state)

    @staticmethod
    def manual_seed(seed: int) -> None:
        torch.manual_seed(seed)

    manual_seed_all = manual_seed

    @staticmethod
    def stream(_stream: Any = None):
        return torch.cpu.stream(_stream)


DEVICE_MODULE = CpuDeviceModule()


@PlatformRegistry.register(platform=PLATFORM_NAME)
class PlatformCPU(PlatformBase):
    """verl platform ``cpu``: gloo, host memory, shared-memory weight transfer."""

    def __init__(self) -> None:
        refuse_on_npu_machine()

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> ModuleType:
        return DEVICE_MODULE  # type: ignore[return-value]

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        # Never auto-detected: only VERL_PLATFORM=cpu selects it.
        return False

    def current_device(self) -> torch.device:  # type: ignore[override]
        # verl moves modules with .to(device=get_device_id()): an integer would mean CUDA device 0.
        return torch.device("cpu")

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return VISIBLE_DEVICES_ENV

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return RAY_RESOURCE

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


def _register_engines() -> None:
    """Register verl's FSDP engines for device ``cpu`` (verl registers them for cuda and npu only),
    through verl's own ``EngineRegistry.register``."""
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead, FSDPEngineWithValueHead

    for model_type, engine in (("language_model", FSDPEngineWithLMHead), ("value_model", FSDPEngineWithValueHead)):
        if "cpu" not in EngineRegistry._engines.get(model_type, {}).get("fsdp", {}):
            EngineRegistry.register(model_type=model_type, backend=["fsdp", "fsdp2"], device="cpu")(engine)


if cpu_platform_selected():
    refuse_on_npu_machine()
    _register_engines()
