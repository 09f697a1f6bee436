"""ray_start_npu.sh end to end with a real single-machine Ray (fake NPU counts, loopback only).

Every test checks that nothing it started outlives it: Ray is given a private --temp-dir, and no
process whose command line mentions it (or the test recipe) may be left afterwards.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from npu_rl import REPO_ROOT
from npu_rl.launch.cluster import port_open
from tests.procs import free_port

# Starts Ray heads through the launcher (tests/conftest.py: the xdist 'serial' group).
pytestmark = pytest.mark.serial

pytest.importorskip("ray")

RECIPE = REPO_ROOT / "tests" / "recipes" / "exit_code.sh"


def _ours(marker: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and any(marker in part for part in p.info["cmdline"] or []):
                found.append(p)
        except psutil.Error:
            continue
    return [p for p in found if p.pid != os.getpid()]


@pytest.fixture
def job(tmp_path):
    """Environment of a one-machine job; on teardown, asserts (then ensures) nothing was left running."""
    ray_tmp = tempfile.mkdtemp(prefix="/tmp/nrl")  # short: Ray's socket paths must fit 107 bytes
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "NPUS_PER_NODE": "4",
        "RAY_AUTH_MODE": "disabled",
        "LOG_DIR": str(tmp_path / "logs"),
        "NPU_RL_TRAIN_PYTHON": sys.executable,
        "RAY_START_ARGS": f"--temp-dir={ray_tmp} --num-cpus=1 --include-dashboard=false",
        "NPU_RL_WORKER_POLL": "1",
        "NPU_RL_ALLOW_NO_NPU": "1",  # this machine has no NPU: the launcher is what is tested
    }
    env.pop("RAY_ADDRESS", None)
    yield env, ray_tmp
    left = _ours(ray_tmp) + _ours(str(RECIPE))
    for p in left:
        p.kill()
    assert not left, f"processes left behind: {[p.pid for p in left]}"


def _launch(env, *args, timeout=180):
    """Run the launcher; ``.stdout`` holds stdout and stderr together (the recipe's output is teed to stdout)."""
    return subprocess.run(
        ["bash", str(REPO_ROOT / "ray_start_npu.sh"), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        check=False,
    )


def _run_dir(env) -> Path:
    (run,) = Path(env["LOG_DIR"]).iterdir()
    return run


@pytest.mark.parametrize("code", [0, 3])
def test_head_runs_the_recipe_and_exits_with_its_code(job, code):
    env, _ = job
    r = _launch({**env, "TRAIN_EXIT": str(code)}, str(RECIPE))
    assert r.returncode == code, r.stdout
    run = _run_dir(env)
    assert run.name.endswith("-exit_code")
    assert f"training on 127.0.0.1:{env['MASTER_PORT']} with 1 x 4 NPU" in (run / "train.log").read_text()
    assert "plan mode" in (run / "preflight.txt").read_text()  # the head ran the preflight first
    assert "cluster ready: 1/1 nodes, NPU 4/4" in r.stdout
    assert "stopping Ray" in (run / "launcher.log").read_text()


def test_case7_head_times_out_waiting_for_a_second_node(job):
    env, _ = job
    started = time.monotonic()
    r = _launch({**env, "NNODES": "2", "SOCKET_IFNAME": "lo", "NODE_WAIT_TIMEOUT": "4"}, str(RECIPE))
    assert r.returncode == 75, r.stdout
    assert "NODE_WAIT_TIMEOUT=4s passed: 1/2 nodes, NPU 4/8" in r.stdout
    assert "missing: 1 node(s), 4 NPU" in r.stdout
    assert "stopping Ray" in r.stdout
    assert not (_run_dir(env) / "train.log").exists()  # the recipe never ran
    assert time.monotonic() - started < 120


def test_worker_gives_up_when_no_head_listens(job):
    env, _ = job
    r = _launch(
        {**env, "NNODES": "2", "MASTER_ADDR": "127.0.0.2", "SOCKET_IFNAME": "lo", "WORKER_JOIN_TIMEOUT": "3"},
        str(RECIPE),
    )
    assert r.returncode == 69, r.stdout
    assert "worker node 127.0.0.1 (lo)" in r.stdout
    assert f"the head 127.0.0.2:{env['MASTER_PORT']} did not answer after" in r.stdout


def test_case1_gpu_registered_node_is_named_and_a_foreign_cluster_is_not_reused(job):
    env, ray_tmp = job
    port = env["MASTER_PORT"]
    ray = Path(sys.executable).with_name("ray")
    cmd = [str(ray), "start", "--block", "--head", f"--port={port}", "--node-ip-address=127.0.0.1", "--num-gpus=4"]
    foreign = subprocess.Popen(
        [*cmd, f"--temp-dir={ray_tmp}", "--num-cpus=1", "--include-dashboard=false", "--disable-usage-stats"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not port_open("127.0.0.1", int(port)):
            assert foreign.poll() is None and time.monotonic() < deadline, "the test's Ray head did not start"
            time.sleep(0.5)
        w = subprocess.run(
            [sys.executable, "-m", "npu_rl.launch", "wait", f"--address=127.0.0.1:{port}", "--nodes=1",
             "--npus-per-node=4", "--timeout=3"],
            env=env, capture_output=True, text=True, timeout=120, check=False, cwd=REPO_ROOT,
        )  # fmt: skip
        assert w.returncode == 75, w.stderr
        assert "registered 4 GPU and no NPU" in w.stderr and "--num-gpus" in w.stderr
        r = _launch(env, str(RECIPE))
        assert r.returncode == 69, r.stdout
        assert "a Ray node is already running on this machine" in r.stdout
        assert foreign.poll() is None  # refused, and left alone
    finally:
        foreign.send_signal(signal.SIGTERM)  # `ray start --block` drains, then stops its daemons
        foreign.wait(timeout=60)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(foreign.pid, signal.SIGKILL)


def test_sigterm_stops_the_recipe_and_ray(job):
    env, _ = job
    proc = subprocess.Popen(
        ["bash", str(REPO_ROOT / "ray_start_npu.sh"), str(RECIPE)],
        env={**env, "TRAIN_SLEEP": "120"}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while True:
        logs = list(Path(env["LOG_DIR"]).glob("*/train.log"))
        if logs and "sleeping" in logs[0].read_text():
            break
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    err, _ = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "SIGTERM: stopping exit_code.sh" in err and "stopping Ray" in err


def test_token_auth_on_a_fresh_machine_creates_a_private_token_and_never_prints_it(job, tmp_path):
    env, _ = job
    home = tmp_path / "home"
    home.mkdir()
    env = {**env, "HOME": str(home)}
    env.pop("RAY_AUTH_MODE")  # the launcher's default: token authentication on
    r = _launch(env, str(RECIPE))
    assert r.returncode == 0, r.stdout
    token = home / ".ray" / "auth_token"
    assert token.is_file() and (token.stat().st_mode & 0o777) == 0o600
    secret = token.read_text().strip()
    assert secret and secret not in r.stdout
    assert secret not in "".join(p.read_text() for p in Path(env["LOG_DIR"]).rglob("*.log") if p.is_file())
    assert re.search(r"RAY_AUTH_MODE\s+token", r.stdout)


def test_a_real_run_on_a_machine_without_npus_is_refused(job):
    env, _ = job
    env = {k: v for k, v in env.items() if k != "NPU_RL_ALLOW_NO_NPU"}
    r = _launch(env, str(RECIPE))
    assert r.returncode == 78 and "this node has no NPU" in r.stdout and "--dry-run" in r.stdout


CPU_RECIPE = REPO_ROOT / "recipes" / "qwen3-tiny" / "grpo_cpu.sh"
CPU_ENV = REPO_ROOT / "recipes" / "qwen3-tiny" / "env_cpu.sh"


def test_cpu_env_script_on_a_machine_with_npus_is_refused(job, tmp_path):
    env, _ = job
    fake = tmp_path / "bin"
    fake.mkdir()
    smi = fake / "npu-smi"  # what npu-smi info -m prints on a node with two dies
    smi.write_text(
        "#!/bin/sh\necho 'NPU ID Chip ID Chip Logic ID Chip Name'\necho '0 0 0 Ascend'\necho '0 1 1 Ascend'\n"
    )
    smi.chmod(0o755)
    env = {k: v for k, v in env.items() if k not in ("NPU_RL_ALLOW_NO_NPU", "NPUS_PER_NODE")}
    env["PATH"] = f"{fake}:{env['PATH']}"
    r = _launch(env, str(CPU_RECIPE), str(CPU_ENV))
    assert r.returncode == 78, r.stdout[-2000:]
    assert "VERL_PLATFORM=cpu" in r.stdout and "node with NPUs" in r.stdout
    assert "starting the Ray head" not in r.stdout


def test_cpu_recipe_with_an_npu_env_script_is_refused(job):
    env, _ = job
    r = _launch(env, "--dry-run", str(CPU_RECIPE), str(REPO_ROOT / "recipes" / "qwen3-0.6b" / "env_1node.sh"))
    assert r.returncode == 65, r.stdout[-2000:]
    assert "runs on verl's CPU platform only" in r.stdout
    assert "recipes/qwen3-tiny/env_cpu.sh" in r.stdout
