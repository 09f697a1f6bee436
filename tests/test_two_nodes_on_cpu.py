"""Two nodes on one machine (issue 36): the launcher's worker path, and failures across nodes.

Each node is a network namespace of tests/netns.py (10.231.0.1 the head, 10.231.0.2 the worker),
both running the same ``bash ray_start_npu.sh`` with a real Ray; the recipe is the launcher test's
stand-in (tests/recipes/exit_code.sh), so what is tested is the launcher and Ray across nodes.
Every test ends with no process left on either node, and the namespaces removed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from npu_rl import REPO_ROOT
from tests import netns

# Their own xdist group, one test at a time, beside the serial group's Ray tests (~230 s of what was
# the suite's longest chain): each node is a network namespace, so their Ray ports, raylets
# (npu_rl.launch.cluster counts only this namespace's) and addresses are not the host's. Each test runs
# its own copy of the recipe (RECIPE under its tmp_path): the serial group's launcher tests find
# leftovers by their recipe's path in a command line, and when these tests ran tests/recipes/exit_code.sh
# itself beside them (ac1e462, 2026-12-07), three of those tests blamed these tests' processes.
# slow: not in the --quick tier.
pytestmark = [pytest.mark.xdist_group("two_nodes"), pytest.mark.slow]

pytest.importorskip("ray")
if (why := netns.available()) is not None:
    pytest.skip(f"network namespaces unavailable: {why}", allow_module_level=True)

RECIPE = REPO_ROOT / "tests" / "recipes" / "exit_code.sh"  # copied into each test's tmp_path
HEAD, WORKER = 0, 1


@pytest.fixture
def cluster(tmp_path):
    """Two nodes, each with its own Ray temp dir (RAY_TMPDIR: Ray's default one, per node) and env."""
    netns.sweep_stale()
    shutil.copy2(RECIPE, tmp_path / RECIPE.name)
    tmp = [tempfile.mkdtemp(prefix=f"/tmp/nrl2n{i}") for i in range(2)]  # short: Ray's socket paths
    base = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "NNODES", "MASTER_"))}
    envs = [
        {
            **base,
            "NNODES": "2",
            "MASTER_ADDR": "10.231.0.1",
            "MASTER_PORT": "6379",
            "NPUS_PER_NODE": "1",
            "RAY_AUTH_MODE": "disabled",
            "RAY_TMPDIR": tmp[i],
            "LOG_DIR": str(tmp_path / f"logs{i}"),
            "RAY_START_ARGS": "--num-cpus=1 --include-dashboard=false",
            # Ray's GCS declares a node dead after health_check_failure_threshold missed checks, each
            # waiting health_check_timeout_ms (defaults 5 x 10 s): a killed node's packets are dropped,
            # so on a loaded machine the head once did not hear of it within 120 s (2026-12-07). A
            # check a second, 5 s each, 3 misses: dead within ~20 s; a live node never misses three.
            "RAY_health_check_period_ms": "1000",
            "RAY_health_check_timeout_ms": "5000",
            "RAY_health_check_failure_threshold": "3",
            "NPU_RL_TRAIN_PYTHON": sys.executable,
            "NPU_RL_ALLOW_NO_NPU": "1",
            "NPU_RL_WORKER_POLL": "1",
            "HEAD_LOST_GRACE": "5",
            "NODE_WAIT_TIMEOUT": "120",
            "WORKER_JOIN_TIMEOUT": "120",
        }  # fmt: skip
        for i in range(2)
    ]
    with netns.Nodes(2) as nodes:
        yield nodes, envs, tmp_path
        # A launcher that just exited may still be reaping its children; Ray's daemons on a loaded machine
        # took over 60 s once (before the bytecode fix). Waited only while something is left.
        deadline = time.monotonic() + 120
        while any(nodes.pids(i) for i in range(2)) and time.monotonic() < deadline:
            time.sleep(0.5)
        left = {i: nodes.pids(i) for i in range(2)}
    for d in tmp:
        shutil.rmtree(d, ignore_errors=True)
    assert not any(left.values()), f"processes left on the nodes: {_describe(left)}"
    assert not set(nodes.names) & set(netns.namespaces())


def _describe(left: dict[int, list[int]]) -> dict[int, list[str]]:
    import psutil

    out: dict[int, list[str]] = {}
    for i, pids in left.items():
        for pid in pids:
            try:
                out.setdefault(i, []).append(f"{pid}: {' '.join(psutil.Process(pid).cmdline())[:120]}")
            except psutil.Error:
                out.setdefault(i, []).append(f"{pid}: (gone)")
    return out


def _start(nodes, i, env, tmp_path, *args):
    """The launcher on node ``i``; its output goes to a file (nobody reads a pipe while it runs)."""
    out = tmp_path / f"node{i}.out"
    with out.open("a") as sink:
        proc = nodes.popen(
            i, ["bash", str(REPO_ROOT / "ray_start_npu.sh"), str(tmp_path / RECIPE.name), *args], env=env,
            stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO_ROOT,
        )  # fmt: skip
    return proc, out


def _wait_for(where: Path, pattern: str, procs, timeout: float = 240, glob: str = "") -> None:
    """Until ``pattern`` is in the file ``where`` (or in one of ``where.glob(glob)``); ``procs`` must live."""
    deadline = time.monotonic() + timeout
    while not any(pattern in p.read_text(errors="replace") for p in (where.glob(glob) if glob else [where])):
        for proc, out in procs:
            assert proc.poll() is None, f"exited {proc.returncode} early:\n{out.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"{pattern!r} not seen in {where}/{glob} within {timeout:g}s"
        time.sleep(0.5)


def _finish(proc, out, timeout: float) -> tuple[int, str, float]:
    started = time.monotonic()
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
        raise AssertionError(f"did not exit within {timeout:g}s:\n{out.read_text()[-3000:]}") from None
    return rc, out.read_text(errors="replace"), time.monotonic() - started


def _current_cluster(tmp_dir: str) -> Path:
    return Path(tmp_dir) / "ray" / "ray_current_cluster"


def _worker_then_head(cluster, head_env: dict, timeout: float):
    """The worker first; once it waits for the head, the head with ``head_env`` until it exits:
    ``(worker, worker's output file, the head's exit code, the head's output)``."""
    nodes, envs, tmp_path = cluster
    worker, wout = _start(nodes, WORKER, envs[WORKER], tmp_path)
    _wait_for(wout, "waiting for the head 10.231.0.1:6379", [(worker, wout)])
    head, hout = _start(nodes, HEAD, {**envs[HEAD], **head_env}, tmp_path)
    rc, text, _ = _finish(head, hout, timeout)
    return worker, wout, rc, text


def test_a_worker_started_first_waits_joins_and_leaves_with_the_head(cluster):
    nodes, envs, tmp_path = cluster
    worker, wout, rc, text = _worker_then_head(cluster, {"TRAIN_SLEEP": "3"}, 300)
    assert rc == 0, text[-4000:]
    assert "worker" not in text.split("head node 10.231.0.1 (eth0)")[0]  # the head knew it was the head
    assert "this head waits up to NODE_WAIT_TIMEOUT=120s for 1 other node(s)" in text
    assert "on each of them run the same command: MASTER_ADDR=10.231.0.1 MASTER_PORT=6379 NNODES=2 bash" in text
    assert "cluster ready: 2/2 nodes, NPU 2/2" in text and "10.231.0.2 (NPU 1)" in text
    (train_log,) = Path(envs[HEAD]["LOG_DIR"]).glob("*/train.log")
    assert "training on 10.231.0.1:6379 with 2 x 1 NPU" in train_log.read_text()
    rc, wtext, waited = _finish(worker, wout, 90)  # HEAD_LOST_GRACE 5 s after the head stopped
    assert rc == 0, wtext[-4000:]
    assert "worker node 10.231.0.2 (eth0)" in wtext and "joining 10.231.0.1:6379 with 1 NPU" in wtext
    assert "the head went away" in wtext or "is gone" in wtext
    # `ray stop` would have removed Ray's current-cluster file; the launchers stop by pid and must too,
    # or a plain ray.init() on either node tries the dead cluster for minutes.
    for d in map(_current_cluster, (envs[HEAD]["RAY_TMPDIR"], envs[WORKER]["RAY_TMPDIR"])):
        assert not d.exists(), f"{d} still names {d.read_text()}"
    assert "removed Ray's current-cluster file" in text


def test_a_head_whose_preflight_rejects_the_job_tells_the_waiting_worker_why(cluster):
    nodes, envs, tmp_path = cluster
    worker, wout, rc, text = _worker_then_head(cluster, {"PLAN_EXIT": "65"}, 120)
    assert rc == 65, text[-4000:]
    assert "the preflight rejected" in text and "the cluster was not started" in text
    assert "told 1 node(s) (10.231.0.2)" in text, text[-3000:]
    rc, wtext, waited = _finish(worker, wout, 60)
    assert rc == 65, wtext[-4000:]
    assert waited < 10, f"the worker took {waited:.0f}s after the head's notice"  # not WORKER_JOIN_TIMEOUT=120
    assert "the head 10.231.0.1:6379 rejected the job in its preflight, so this node does not join" in wtext
    assert "the stand-in preflight rejects this recipe (PLAN_EXIT=65)" in wtext  # the head's own words
    assert "/preflight.txt)" in wtext and "joining" not in wtext, wtext
    assert not list(Path(envs[WORKER]["LOG_DIR"]).glob("*/ray-worker.log"))  # its Ray never started


def test_a_rejected_head_with_nobody_waiting_tells_nobody_and_exits_after_its_notice(cluster):
    nodes, envs, tmp_path = cluster
    head, hout = _start(nodes, HEAD, {**envs[HEAD], "PLAN_EXIT": "65", "NODE_REFUSAL_NOTICE": "2"}, tmp_path)
    rc, text, waited = _finish(head, hout, 120)
    assert rc == 65, text[-4000:]
    assert "NODE_REFUSAL_NOTICE=2s" in text
    assert "told 0 node(s) (none); 1 did not ask within 2s and wait out their WORKER_JOIN_TIMEOUT" in text


def test_a_node_that_dies_mid_run_stops_the_head_which_names_it(cluster):
    nodes, envs, tmp_path = cluster
    head, hout = _start(nodes, HEAD, {**envs[HEAD], "TRAIN_SLEEP": "600"}, tmp_path)
    worker, wout = _start(nodes, WORKER, envs[WORKER], tmp_path)
    _wait_for(Path(envs[HEAD]["LOG_DIR"]), "sleeping 600s", [(head, hout), (worker, wout)], glob="*/train.log")
    assert nodes.kill(WORKER)  # the worker machine is gone: every process on it, no clean-up
    rc, text, waited = _finish(head, hout, 120)
    assert rc == 75, text[-4000:]
    assert waited < 60, f"the head took {waited:.0f}s to notice"
    assert "node 10.231.0.2 left the Ray cluster" in text
    assert "stopping exit_code.sh" in text and "stopping Ray" in text
    worker.wait(timeout=30)


def test_the_head_dying_ends_the_worker_within_its_grace(cluster):
    nodes, envs, tmp_path = cluster
    head, hout = _start(nodes, HEAD, {**envs[HEAD], "TRAIN_SLEEP": "600"}, tmp_path)
    worker, wout = _start(nodes, WORKER, envs[WORKER], tmp_path)
    _wait_for(Path(envs[HEAD]["LOG_DIR"]), "sleeping 600s", [(head, hout), (worker, wout)], glob="*/train.log")
    assert nodes.kill(HEAD)
    rc, text, waited = _finish(worker, wout, 120)
    assert waited < 60, f"the worker took {waited:.0f}s to notice"
    assert "the head went away" in text or "the head 10.231.0.1:6379 is gone" in text, text[-3000:]
    head.wait(timeout=30)


def test_a_node_with_another_stack_is_refused_with_both_values(cluster):
    nodes, envs, tmp_path = cluster
    head, hout = _start(nodes, HEAD, {**envs[HEAD], "NODE_WAIT_TIMEOUT": "90"}, tmp_path)
    _wait_for(hout, "waiting for nodes", [(head, hout)])
    # 1. a launcher with another recipe command line (an override the head does not have)
    worker, wout = _start(nodes, WORKER, envs[WORKER], tmp_path, "trainer.total_epochs=3")
    rc, text, _ = _finish(worker, wout, 120)
    assert rc == 78, text[-4000:]
    (line,) = [ln for ln in text.splitlines() if "does not run the same stack as" in ln]
    assert "this node 10.231.0.2 does not run the same stack as the head 10.231.0.1" in line
    assert "the TRAIN_SCRIPT, ENV_SCRIPT and overrides: the head 10.231.0.1 " in line
    assert "sources.lock:" not in line and "npu_rl (its" not in line  # only what differs is named
    assert "joining" not in text  # refused before its Ray node started
    # 2. a node started by hand (plain `ray start`, no stack labels) joins: the head refuses the job
    ray = str(Path(sys.executable).with_name("ray"))
    raw = nodes.popen(
        WORKER, [ray, "start", "--block", "--address=10.231.0.1:6379", "--node-ip-address=10.231.0.2",
                 "--resources={\"NPU\": 1}", "--num-cpus=1", "--disable-usage-stats"],
        env=envs[WORKER], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    rc, text, _ = _finish(head, hout, 120)
    assert rc == 78, text[-4000:]
    assert "node 10.231.0.2 does not run the same stack as the head" in text
    assert "sources.lock: the head " in text and ", node 10.231.0.2 none" in text
    assert not list(Path(envs[HEAD]["LOG_DIR"]).glob("*/train.log"))  # the recipe never ran
    raw.send_signal(signal.SIGTERM)  # its head is gone: `ray start --block` ends, its daemons may not
    raw.wait(timeout=60)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(raw.pid, signal.SIGKILL)
