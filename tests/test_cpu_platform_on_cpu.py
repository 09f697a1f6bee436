"""npu_rl.cpu.platform: verl's CPU platform, registered through verl's own plugin mechanism."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from npu_rl import REPO_ROOT

pytest.importorskip("verl", reason="the patched verl is installed by install_stack.sh --cpu")


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONPATH": str(REPO_ROOT), **env}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=300)


@pytest.mark.slow  # verl imported in fresh processes
def test_verl_selects_the_cpu_platform_through_its_plugin_variables():
    code = (
        "import verl, torch\n"
        "from verl.plugin.platform import get_platform\n"
        "from verl.utils.device import get_device_name, get_nccl_backend, get_torch_device, get_device_id\n"
        "from verl.workers.engine.base import EngineRegistry\n"
        "p = get_platform()\n"
        "print(type(p).__name__, get_device_name(), get_nccl_backend(), get_device_id(), p.ray_resource_name())\n"
        "dm = get_torch_device()\n"
        "free, total = dm.mem_get_info()\n"
        "assert 0 < free <= total and dm.memory_allocated() > 0 and dm.is_available()\n"
        "print(EngineRegistry.get_engine_cls('language_model', 'fsdp2').__name__)\n"
    )
    r = _python(code, VERL_USE_EXTERNAL_MODULES="npu_rl.cpu.platform", VERL_PLATFORM="cpu")
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.strip().splitlines()
    assert lines[-2] == "PlatformCPU cpu gloo cpu NPU"
    assert lines[-1] == "FSDPEngineWithLMHead"


def test_never_auto_detected():
    r = _python(
        "import verl\nfrom verl.plugin.platform import get_platform\nprint(type(get_platform()).__name__)",
        VERL_USE_EXTERNAL_MODULES="npu_rl.cpu.platform",
        VERL_PLATFORM="",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] != "PlatformCPU"


def test_refused_on_a_machine_with_npus(monkeypatch):
    from npu_rl.cpu import platform
    from npu_rl.launch import topology

    monkeypatch.setattr(topology.Probe, "count_npus", lambda self: (16, "/dev/davinci*"))
    with pytest.raises(
        platform.CpuPlatformRefused, match=r"machine with NPUs \(16 die\(s\) by /dev/davinci\*\).*env_1node"
    ):
        platform.PlatformCPU()
    monkeypatch.setattr(topology.Probe, "count_npus", lambda self: None)
    assert platform.npus_present() == []


@pytest.mark.slow  # gloo processes
def test_gloo_process_group_on_the_platform_backend():
    # verl's own initialize_global_process_group_ray with the platform's backend (verl patch 0009).
    code = (
        "import os, verl, torch.distributed as dist\n"
        "os.environ.update(RANK='0', WORLD_SIZE='1', MASTER_ADDR='127.0.0.1', MASTER_PORT='29581')\n"
        "from verl.utils.distributed import initialize_global_process_group_ray\n"
        "initialize_global_process_group_ray()\n"
        "print(dist.get_backend())\n"
    )
    r = _python(code, VERL_USE_EXTERNAL_MODULES="npu_rl.cpu.platform", VERL_PLATFORM="cpu")
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "gloo"


def test_vllm_keeps_cpu_linear_weights_only_under_the_cpu_platform(monkeypatch):
    from npu_rl.cpu import keep_cpu_linear_weights

    monkeypatch.setenv("VERL_PLATFORM", "cpu")
    assert keep_cpu_linear_weights()
    monkeypatch.setenv("VERL_PLATFORM", "npu")
    assert not keep_cpu_linear_weights()
    monkeypatch.delenv("VERL_PLATFORM")
    assert not keep_cpu_linear_weights()
