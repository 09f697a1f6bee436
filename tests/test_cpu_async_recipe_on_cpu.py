"""recipes/qwen3-tiny/grpo_cpu_fully_async.sh: its own guard against too few Ray CPUs, through the real
launcher's dry run (the run itself is the CI stage "CPU main job, fully-async")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# Dry runs through the launcher in their own processes: left out of --quick.
pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[1]
RECIPE = REPO_ROOT / "recipes" / "qwen3-tiny" / "grpo_cpu_fully_async.sh"


def _dry_run(env_script: str, **env: str) -> subprocess.CompletedProcess:
    environ = {
        k: v for k, v in os.environ.items() if k not in ("NNODES", "NPUS_PER_NODE", "MASTER_ADDR", "RAY_START_ARGS")
    }
    environ.update(NPU_RL_TRAIN_PYTHON=sys.executable, **env)
    cmd = ["bash", str(REPO_ROOT / "ray_start_npu.sh"), "--dry-run", str(RECIPE), str(RECIPE.parent / env_script)]
    return subprocess.run(cmd, env=environ, capture_output=True, text=True, timeout=600, check=False)


def test_sync_env_script_is_refused_for_its_ray_cpus():
    # env_cpu.sh gives Ray 16 logical CPUs: verl's fully-async controllers alone ask for 23.
    r = _dry_run("env_cpu.sh")
    out = r.stdout + r.stderr
    assert r.returncode == 65, out
    assert "gives Ray 16 logical CPUs" in out and "env_cpu_async.sh" in out


def test_async_env_script_passes_the_preflight_with_both_pools():
    r = _dry_run("env_cpu_async.sh")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "preflight: ok (0 errors" in out
    assert "partial rollout  on" in out
