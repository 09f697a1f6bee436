"""ray_start_npu.sh as a new user meets it: the cases the launcher must refuse, or must not refuse.

Every case runs the real launcher with real bash (issue 17, part 4 and part of 5): the two scripts
swapped, an ENV_SCRIPT that exits or trains, plan mode against anything that would train or start
Ray, malformed device-visibility lists, a signal during the preflight, a recipe copied out of the
repository, a taken MASTER_PORT, and the dry run's output. None of them starts Ray: each refusal comes
before it, and the accepted cases are dry runs. Each rejected case asserts the file or variable and
the fix in the message; each accepted case asserts that no false alarm was raised.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from npu_rl import REPO_ROOT
from npu_rl.errors import TopologyError
from npu_rl.launch.topology import Probe, resolve_topology
from tests.procs import free_port

# Runs the launcher's head path, which refuses to start beside a Ray node of another test (serial group).
pytestmark = pytest.mark.serial

pytest.importorskip("ray")

LAUNCHER = REPO_ROOT / "ray_start_npu.sh"
TESTS = REPO_ROOT / "tests" / "recipes"
STAND_IN = TESTS / "exit_code.sh"  # plan mode: a stand-in preflight that passes at once
SLOW = TESTS / "slow_preflight.sh"
QWEN32_RECIPE = "recipes/qwen3-32b/grpo_32die.sh"
QWEN32_ENV = "recipes/qwen3-32b/env_2node.sh"
ENV_2X16 = TESTS / "env_2x16.sh"


@pytest.fixture
def env(tmp_path):
    """The calling shell's environment without its topology (the head is this machine); no Ray is started."""
    drop = ("NNODES", "NPUS_PER_NODE", "MASTER_ADDR", "MASTER_PORT", "RAY_ADDRESS", "PYTHONPATH")
    e = {k: v for k, v in os.environ.items() if k not in drop and "VISIBLE_DEVICES" not in k}
    e.update(
        NPU_RL_TRAIN_PYTHON=sys.executable,
        LOG_DIR=str(tmp_path / "logs"),
        RAY_AUTH_MODE="disabled",
        MASTER_PORT=str(free_port()),
        ASCEND_SET_ENV_FILES="/nonexistent/set_env.sh",
    )
    return e


def _launch(env, *args, timeout=300):
    """The launcher from the repository root (as users run it); ``.stdout`` holds stdout and stderr."""
    return subprocess.run(
        ["bash", str(LAUNCHER), *map(str, args)],
        env=env, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        timeout=timeout, check=False,
    )  # fmt: skip


def _script(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _evidence(path) -> subprocess.CompletedProcess:
    """internal/launch.sh's static rule on one file (what makes it a train script)."""
    code = 'source internal/common.sh; source internal/launch.sh; launch::recipe_evidence "$1"'
    return subprocess.run(
        ["bash", "-c", code, "_", str(path)], cwd=REPO_ROOT, capture_output=True, text=True, check=False
    )


# --- 1. TRAIN_SCRIPT / ENV_SCRIPT told apart; nothing trains in plan mode, whatever the order ----------
def test_the_rule_tells_every_shipped_train_script_from_every_env_script():
    scripts = sorted(REPO_ROOT.glob("recipes/*/*.sh")) + sorted(TESTS.glob("*.sh"))
    envs = [p for p in scripts if p.name.startswith("env_")]
    assert len(envs) >= 6
    for p in envs:
        r = _evidence(p)
        assert r.returncode == 1 and not r.stdout, f"{p} looks like a train script: {r.stdout}"
    stand_ins = ("exit_code.sh", "no_run_verl.sh", "slow_preflight.sh")  # test doubles, not recipes
    trains = [p for p in scripts if not p.name.startswith("env_") and p.name not in stand_ins]
    assert len(trains) >= 12
    for p in trains:
        assert _evidence(p).returncode == 0, f"{p} is not recognised as a train script"


@pytest.mark.parametrize("dry", [True, False])
def test_swapped_scripts_are_refused_before_anything_is_sourced(env, dry):
    args = ["--dry-run"] if dry else []
    started = time.monotonic()
    r = _launch(env, *args, QWEN32_ENV, QWEN32_RECIPE)
    assert r.returncode == 2, r.stdout
    assert "TRAIN_SCRIPT and ENV_SCRIPT are swapped" in r.stdout
    assert f"{QWEN32_RECIPE} is the train script (line " in r.stdout and "run_verl" in r.stdout
    assert f"{QWEN32_ENV} has no such line (run_verl, main_ppo, internal/verl.sh, exec)" in r.stdout
    fixed = " ".join(["bash ray_start_npu.sh", *args, QWEN32_RECIPE, QWEN32_ENV])
    assert fixed in r.stdout, r.stdout
    assert "Nothing was sourced or started" in r.stdout
    assert not Path(env["LOG_DIR"]).exists()  # no run directory: the launcher's Python never ran
    assert time.monotonic() - started < 10


def test_a_swapped_wrapper_recipe_is_recognised_by_its_exec(env):
    r = _launch(env, "--dry-run", ENV_2X16, TESTS / "case2_mini_batch_rounds_to_zero.sh")
    assert r.returncode == 2, r.stdout
    assert "swapped" in r.stdout and "exec bash" in r.stdout
    assert f"case2_mini_batch_rounds_to_zero.sh {ENV_2X16}" in r.stdout


def test_two_train_scripts_are_refused_naming_the_second(env):
    r = _launch(env, "--dry-run", QWEN32_RECIPE, "recipes/qwen3-32b/grpo_32die_sam.sh")
    assert r.returncode == 2, r.stdout
    assert "ENV_SCRIPT recipes/qwen3-32b/grpo_32die_sam.sh is a train script (line" in r.stdout
    assert "recipes/<model>/env_*.sh" in r.stdout and "swapped" not in r.stdout


def test_run_verl_reached_while_sourcing_the_env_script_refuses(env, tmp_path):
    # The env script's own text is clean; the train script it sources is only found while sourcing.
    shutil.copy(TESTS / "base_qwen3_32b.sh", tmp_path / "inner.sh")
    env_script = _script(tmp_path / "env_indirect.sh", 'f="$(dirname "${BASH_SOURCE[0]}")/inner.sh"\n. "$f"\n')
    r = _launch(env, "--dry-run", STAND_IN, env_script)
    assert r.returncode == 2, r.stdout
    assert f"run_verl was reached while the launcher sourced ENV_SCRIPT {env_script}" in r.stdout
    assert "inner.sh:" in r.stdout and "The train script comes first" in r.stdout
    assert "preflight of" not in r.stdout and "Traceback" not in r.stdout


def _plan_recipe(tmp_path, body: str) -> Path:
    return _script(
        tmp_path / "plan_probe.sh",
        '#!/usr/bin/env bash\nset -euo pipefail\nsource "$NPU_RL_ROOT/internal/verl.sh"\n' + body,
    )


@pytest.mark.parametrize(
    ("body", "refused"),
    [
        ('"$NPU_RL_TRAIN_PYTHON" -m verl.trainer.main_ppo trainer.nnodes=1\n', "run python -m verl.trainer.main_ppo"),
        ('"$NPU_RL_TRAIN_PYTHON" -c "import verl.trainer.main_ppo"\n', "import verl.trainer.main_ppo"),
        (
            '"$NPU_RL_TRAIN_PYTHON" -m verl.experimental.fully_async_policy.fully_async_main trainer.nnodes=1\n',
            "run python -m verl.experimental.fully_async_policy.fully_async_main",
        ),
        (
            '"$NPU_RL_TRAIN_PYTHON" "$NPU_RL_ROOT/sources/verl/verl/experimental/one_step_off_policy/main_ppo.py"\n',
            f"run {REPO_ROOT}/sources/verl/verl/experimental/one_step_off_policy/main_ppo.py",
        ),
        ('"$(dirname "$NPU_RL_TRAIN_PYTHON")/ray" start --head --port=1\n', "start Ray (`ray start`)"),
        (
            'unset RAY_ADDRESS\n"$NPU_RL_TRAIN_PYTHON" -c "import ray; ray.init()"\n',
            "start a local Ray cluster (ray.init() without an address)",
        ),
    ],
    ids=["main_ppo", "import-main_ppo", "fully-async", "one-step-off-file", "ray-start", "ray-init"],
)
def test_plan_mode_refuses_whatever_would_train_or_start_ray(env, tmp_path, body, refused):
    r = _launch(env, "--dry-run", _plan_recipe(tmp_path, body))
    assert r.returncode == 65, r.stdout
    assert f"refused to {refused}: plan mode" in r.stdout
    assert "stopped (exit 2) before the preflight gave a verdict" in r.stdout
    assert "dry run: nothing was checked" in r.stdout
    assert "the preflight rejected" not in r.stdout


def test_plan_mode_holds_when_the_recipe_resets_npu_rl_mode(env, tmp_path):
    # The launcher's plan marker keeps run_verl on the preflight even if NPU_RL_MODE is overwritten.
    recipe = _plan_recipe(
        tmp_path, 'export NPU_RL_MODE=run\nbash "$NPU_RL_ROOT/tests/recipes/base_qwen3_32b.sh" "$@"\n'
    )
    r = _launch(env, "--dry-run", recipe, ENV_2X16)
    assert "preflight of" in r.stdout and "refused" not in r.stdout, r.stdout
    assert r.returncode == 0, r.stdout[-3000:]


# --- 2. an ENV_SCRIPT that exits, or execs ---------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "line", "command"),
    [
        ("export A=1\n\nexit 0\n", 3, "exit 0"),
        ("export A=1\nstop() {\n    exit 4\n}\nif true; then stop; fi\n", 3, "exit 4"),
        ("export A=1\n(exit 3) || true\nexit\n", 3, "exit"),
    ],
    ids=["exit-0", "exit-in-function", "bare-exit"],
)
def test_an_env_script_that_exits_is_an_error_naming_its_line(env, tmp_path, text, line, command):
    env_script = _script(tmp_path / "env_exits.sh", text)
    for args in (["--dry-run"], []):
        r = _launch(env, *args, STAND_IN, env_script)
        assert r.returncode == 2, r.stdout
        assert f"ENV_SCRIPT {env_script} calls `{command}` at {env_script}:{line}" in r.stdout
        assert "use `return` to leave the script early" in r.stdout
        assert not Path(env["LOG_DIR"]).exists()


def test_exit_in_a_file_the_env_script_sources_names_that_file(env, tmp_path):
    inner = _script(tmp_path / "inner_env.sh", "export B=2\nexit 0\n")
    env_script = _script(tmp_path / "env_outer.sh", f"export A=1\nsource {inner}\n")
    r = _launch(env, "--dry-run", STAND_IN, env_script)
    assert r.returncode == 2, r.stdout
    assert f"ENV_SCRIPT {env_script} calls `exit 0` at {inner}:2" in r.stdout


def test_an_env_script_that_execs_a_command_is_refused(env, tmp_path):
    inner = _script(tmp_path / "inner_env.sh", 'export B=2\nexec bash -c "echo replaced"\n')
    env_script = _script(tmp_path / "env_outer.sh", f"source {inner}\n")
    r = _launch(env, "--dry-run", STAND_IN, env_script)
    assert r.returncode == 2, r.stdout
    assert f'runs `exec bash -c "echo replaced"` at {inner}:2' in r.stdout and "replaced\n" not in r.stdout
    direct = _script(tmp_path / "env_direct.sh", "exec python3 -c pass\n")
    r = _launch(env, "--dry-run", QWEN32_RECIPE, direct)
    assert r.returncode == 2 and f"ENV_SCRIPT {direct} is a train script (line 1: exec python3" in r.stdout


NOT_PARSED = "has a syntax error (bash -n); nothing was sourced or started"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('touch "$MARK"\nexport B="2\n', NOT_PARSED),
        ('touch "$MARK"\nif true; then\n    export B=2\n', NOT_PARSED),
        ("export A=1\nif [[ x ]; then\n    export B=2\nfi\n", "failed (its last command returned 2; bash's message"),
        ("export A=1\nfalse\n", "failed (its last command returned 1; bash's message"),
    ],
    ids=["open-quote", "open-if", "bad-conditional", "last-command-fails"],
)
def test_an_env_script_that_does_not_parse_or_fails_exits_2_naming_it(env, tmp_path, text, says):
    """Found by a user: a syntax error exited 1 (undocumented; the message said "exit 2") and one kind
    printed a spurious ``internal/launch.sh: debug trap: ... syntax error``. What bash -n finds is found
    before a line of the file runs; what only running finds ends the launcher with 2 as well."""
    mark = tmp_path / "sourced"
    env_script = _script(tmp_path / "env_bad.sh", text)
    r = _launch({**env, "MARK": str(mark)}, "--dry-run", STAND_IN, env_script)
    assert r.returncode == 2, r.stdout
    assert f"ENV_SCRIPT {env_script} {says}" in r.stdout
    assert "debug trap" not in r.stdout and "internal/launch.sh" not in r.stdout, r.stdout
    assert not mark.exists() and not Path(env["LOG_DIR"]).exists()
    if "bash -n" in says:
        assert f"{env_script}: line " in r.stdout  # bash's own words, with the line


def test_no_train_script_and_help_say_what_to_give(env):
    r = _launch(env)
    assert r.returncode == 2
    assert "TRAIN_SCRIPT [ENV_SCRIPT] [K=V ...]" in r.stdout and "give a TRAIN_SCRIPT (a recipe)" in r.stdout
    assert "required" not in r.stdout  # argparse called the optional ENV_SCRIPT "required"
    h = _launch(env, "--help")
    assert h.returncode == 0
    codes = h.stdout.split("exit codes:\n", 1)[1]
    assert "--dry-run: 0 when the preflight passes" in codes and "an ENV_SCRIPT with a syntax" in codes
    for entry in re.split(r"\n  (?=\S)", codes.strip()):  # each code's text, continuation lines joined
        assert re.search(r"[\w)]$", entry.strip()) and not entry.strip().endswith("'s"), entry


def test_return_subshell_exits_and_redirections_are_no_false_alarm(env, tmp_path):
    env_script = _script(
        tmp_path / "env_ok.sh",
        "export NPU_RL_TEST_EARLY=1\nv=$(exit 3) || true\n(exit 4) || true\nexec 3>/dev/null\n"
        "if true; then return 0; fi\nexport NPU_RL_TEST_EARLY=never\n",
    )
    r = _launch(env, "--dry-run", STAND_IN, env_script)
    assert r.returncode == 0, r.stdout
    assert re.search(r"NPU_RL_TEST_EARLY\s+1\s+ENV_SCRIPT", r.stdout), r.stdout
    assert "error" not in r.stdout and "dry run: the preflight passed (exit 0)" in r.stdout


# --- 3. device visibility ----------------------------------------------------------------------------
class Node(Probe):
    """One machine, eth0 10.0.0.5, with ``npus`` dies counted (None: no NPU seen)."""

    def __init__(self, npus=16):
        self.npus = npus

    def interfaces(self):
        return {"lo": ["127.0.0.1"], "eth0": ["10.0.0.5"]}

    def route_get(self, ip):
        return ("lo", "127.0.0.1") if ip.startswith("127.") else ("eth0", "10.0.0.5")

    def resolve(self, host):
        return host

    def count_npus(self):
        return (self.npus, "/dev/davinci*") if self.npus else None


@pytest.mark.parametrize(
    ("env", "npus", "key", "fix"),
    [
        ({"ASCEND_RT_VISIBLE_DEVICES": "0, 1,2"}, 16, "' 1', not a die id", "write ASCEND_RT_VISIBLE_DEVICES=0,1,2"),
        ({"ASCEND_RT_VISIBLE_DEVICES": "0,1,"}, 16, "has an empty entry", "write ASCEND_RT_VISIBLE_DEVICES=0,1"),
        ({"ASCEND_RT_VISIBLE_DEVICES": "0;1"}, 16, "'0;1', not a die id", "comma-separated die ids"),
        ({"ASCEND_RT_VISIBLE_DEVICES": ""}, 16, "is set but empty", "unset it"),
        ({"ASCEND_RT_VISIBLE_DEVICES": "2,2,3"}, 16, "lists die 2 more than once", "ASCEND_RT_VISIBLE_DEVICES=2,3"),
        ({"ASCEND_RT_VISIBLE_DEVICES": "3,1,2"}, 16, "not in ascending order", "write ASCEND_RT_VISIBLE_DEVICES=1,2,3"),
        ({"ASCEND_RT_VISIBLE_DEVICES": "6,7,8,9"}, 8, "names die 9 but this node has 8", "list ids below 8"),
        (
            {"ASCEND_RT_VISIBLE_DEVICES": "0,1", "NPUS_PER_NODE": "4"},
            16,
            "NPUS_PER_NODE=4 but ASCEND_RT_VISIBLE_DEVICES=0,1 makes 2 die(s) visible",
            "set NPUS_PER_NODE=2",
        ),
        ({"ASCEND_VISIBLE_DEVICES": "0-3,x"}, 4, "ASCEND_VISIBLE_DEVICES='0-3,x' has 'x'", "ranges (0-3)"),
        (
            {"ASCEND_VISIBLE_DEVICES": "4-7", "ASCEND_RT_VISIBLE_DEVICES": "0,4"},
            4,
            "names die 4 but ASCEND_VISIBLE_DEVICES gives this container 4",
            "list ids below 4",
        ),
    ],
    ids=["space", "empty-entry", "separator", "empty", "duplicate", "order", "range", "count", "container", "nested"],
)
def test_bad_visible_device_lists_are_refused_with_the_reason_and_the_fix(env, npus, key, fix):
    with pytest.raises(TopologyError) as e:
        resolve_topology(env, Node(npus))
    assert key in str(e.value) and fix in str(e.value), str(e.value)


def test_valid_visible_device_lists_are_accepted():
    t = resolve_topology({"ASCEND_RT_VISIBLE_DEVICES": "0,1,2,3"}, Node(16))
    assert (t.npus_per_node, t.npus_source, t.notes) == (4, "ASCEND_RT_VISIBLE_DEVICES", ())
    t = resolve_topology({"ASCEND_RT_VISIBLE_DEVICES": "8,9,10,11,12,13,14,15", "NPUS_PER_NODE": "8"}, Node(16))
    assert (t.npus_per_node, t.notes) == (8, ())
    t = resolve_topology({"ASCEND_RT_VISIBLE_DEVICES": "0,2,4,6", "NPUS_PER_NODE": "2"}, Node(None))
    assert t.npus_per_node == 2 and "the job uses the first 2" in t.notes[0]
    t = resolve_topology({"ASCEND_VISIBLE_DEVICES": "7,0-3", "ASCEND_RT_VISIBLE_DEVICES": "0,1,2,3,4"}, Node(5))
    assert t.npus_per_node == 5  # the container runtime mounts the set: its order does not matter


def test_the_dry_run_checks_visible_devices_too(env):
    r = _launch({**env, "ASCEND_RT_VISIBLE_DEVICES": "1,0"}, "--dry-run", STAND_IN)
    assert r.returncode == 78, r.stdout
    assert "ASCEND_RT_VISIBLE_DEVICES=1,0 is not in ascending order" in r.stdout
    assert "write ASCEND_RT_VISIBLE_DEVICES=0,1" in r.stdout
    r = _launch({**env, "ASCEND_RT_VISIBLE_DEVICES": "0,1,2,3"}, "--dry-run", STAND_IN)
    assert r.returncode == 0, r.stdout
    assert "x 4 NPU (ASCEND_RT_VISIBLE_DEVICES)" in r.stdout and "error" not in r.stdout
    assert re.search(r"ASCEND_RT_VISIBLE_DEVICES\s+0,1,2,3\s+shell", r.stdout)


# --- 4. a signal while the preflight runs ---------------------------------------------------------
def _ours(marker: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and marker in (p.info["cmdline"] or []):
                found.append(p)
        except psutil.Error:
            continue
    return found


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("dry", [True, False], ids=["dry-run", "head"])
def test_a_signal_during_the_preflight_ends_it_with_one_line(env, tmp_path, sig, dry):
    marker = f"slow-preflight-{uuid.uuid4().hex}"
    out = tmp_path / "out.txt"
    run_env = {**env, "PREFLIGHT_MARKER": marker, "NPU_RL_ALLOW_NO_NPU": "1", "MASTER_ADDR": "127.0.0.1"}
    args = ["--dry-run"] if dry else []
    with open(out, "w") as f:
        proc = subprocess.Popen(
            ["bash", str(LAUNCHER), *args, str(SLOW)], env=run_env, cwd=REPO_ROOT, stdout=f, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 60
        while "preflight running" not in out.read_text() or not _ours(marker):
            assert proc.poll() is None and time.monotonic() < deadline, out.read_text()
            time.sleep(0.2)
        proc.send_signal(sig)
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = out.read_text()
    left = _ours(marker)
    for p in left:
        p.kill()
    assert not left, f"the preflight outlived the launcher: {[p.pid for p in left]}"
    assert rc == 128 + sig, text
    lines = [ln for ln in text.splitlines() if sig.name in ln]
    assert lines == [lines[0]] and f"{sig.name}: stopping the preflight of slow_preflight.sh" in lines[0], text
    assert "Traceback" not in text and "KeyboardInterrupt" not in text
    assert "starting the Ray head" not in text and "rejected" not in text


# --- 5. a recipe outside the repository --------------------------------------------------------------
def test_a_recipe_copied_outside_the_repository_works(env, tmp_path):
    copy = tmp_path / "my_recipe.sh"
    shutil.copy(TESTS / "base_qwen3_32b.sh", copy)
    r = _launch(env, "--dry-run", copy, ENV_2X16)
    assert r.returncode == 0, r.stdout[-3000:]
    assert "preflight: ok" in r.stdout and "outside the repository" not in r.stdout


def test_an_old_style_copy_outside_the_repository_says_why_it_fails(env, tmp_path):
    copy = tmp_path / "old_recipe.sh"
    text = (TESTS / "base_qwen3_32b.sh").read_text()
    old = text.replace('"${NPU_RL_ROOT:-$(dirname "${BASH_SOURCE[0]}")/../..}', '"$(dirname "${BASH_SOURCE[0]}")/../..')
    assert old != text
    copy.write_text(old)
    for args in (["--dry-run"], []):
        r = _launch({**env, "NPU_RL_ALLOW_NO_NPU": "1", "MASTER_ADDR": "127.0.0.1"}, *args, copy)
        assert r.returncode == 65, r.stdout
        assert f"{copy} stopped (exit 1) before the preflight gave a verdict" in r.stdout
        assert f"It is outside the repository ({REPO_ROOT})" in r.stdout
        assert 'source "${NPU_RL_ROOT:-$(dirname "${BASH_SOURCE[0]}")/../..}/internal/verl.sh"' in r.stdout
        assert "the preflight rejected" not in r.stdout and "starting the Ray head" not in r.stdout


# --- 6. MASTER_PORT taken by another program -------------------------------------------------------
@pytest.fixture
def port_holder(tmp_path):
    """Another program listening on a port of 127.0.0.1: (port, its process, a word of its command line)."""
    port = free_port()
    marker = f"port-holder-{uuid.uuid4().hex[:8]}"
    holder = _script(
        tmp_path / "holder.py",
        "import socket, sys, time\ns = socket.socket()\ns.bind(('127.0.0.1', int(sys.argv[2])))\ns.listen()\n"
        "print('listening', flush=True)\ntime.sleep(120)\n",
    )
    proc = subprocess.Popen([sys.executable, str(holder), marker, str(port)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "listening"
    yield port, proc, marker
    proc.kill()
    proc.wait()


def test_a_taken_master_port_names_its_holder(env, port_holder):
    port, proc, marker = port_holder
    env = {**env, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "NPU_RL_ALLOW_NO_NPU": "1"}
    r = _launch(env, STAND_IN)
    assert r.returncode == 69, r.stdout
    assert f"MASTER_PORT {port} on 127.0.0.1 is already in use by pid {proc.pid} (user " in r.stdout
    assert marker in r.stdout and "pick a free MASTER_PORT" in r.stdout
    assert "starting the Ray head" not in r.stdout
    r = _launch(env, "--dry-run", STAND_IN)  # the dry run says it too, and still checks the recipe
    assert r.returncode == 0, r.stdout
    note = f"note: the real run would stop here: MASTER_PORT {port} on 127.0.0.1 is already in use by pid {proc.pid}"
    assert note in r.stdout


def test_a_free_master_port_raises_no_alarm(env):
    r = _launch(env, "--dry-run", STAND_IN)
    assert r.returncode == 0, r.stdout
    assert "already in use" not in r.stdout and "would stop here" not in r.stdout


# --- 7. the dry run on one screen ----------------------------------------------------------------------
def test_the_dry_run_prints_the_plan_first_then_a_short_environment(env):
    r = _launch(env, "--dry-run", QWEN32_RECIPE, QWEN32_ENV)
    assert r.returncode == 0, r.stdout[-3000:]
    lines = r.stdout.splitlines()
    plan = next(i for i, ln in enumerate(lines) if ln.startswith("preflight of"))
    table = next(i for i, ln in enumerate(lines) if ln.startswith("environment"))
    assert plan < table and "dry run: the preflight passed (exit 0)" in lines[-1]
    assert not [ln for ln in lines[:plan] if "Warning" in ln or "warnings.warn" in ln], lines[:plan]  # issue 38
    assert "--verbose shows" in lines[table]
    rows = lines[table + 2 : len(lines) - 1]
    assert len(rows) <= 20, "\n".join(rows)
    shown = {ln.split()[0]: ln.split()[-1] for ln in rows}
    assert shown["NNODES"] == "ENV_SCRIPT" and shown["NPU_RL_ENGINE_GC"] == "ENV_SCRIPT"
    assert "HCCL_EXEC_TIMEOUT" not in shown  # a launcher default: only with --verbose
    verbose = _launch(env, "--dry-run", "--verbose", QWEN32_RECIPE, QWEN32_ENV)
    assert verbose.returncode == 0
    assert re.search(r"HCCL_EXEC_TIMEOUT\s+3600\s+default", verbose.stdout)
    assert re.search(r"RAY_ADDRESS\s+\S+:\d+\s+launcher", verbose.stdout)
