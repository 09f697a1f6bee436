"""Recipe dry runs for the tests, each configuration paid for once per test process.

Two ways, both through the real launcher (``bash ray_start_npu.sh --dry-run``: the ENV_SCRIPT, the
topology, the recipe's arrays, ``run_verl``'s plan-mode branch and its Hydra command line):

- :func:`launch`: the whole dry run as a user runs it (:func:`npu_rl.recipes.dry_run`), the preflight in
  its own Python process. It imports verl, vLLM and torch again: ~15-20 s on 2 cores (40 s cold).
- :func:`plan`: the same launcher and recipe, but the Python that ``run_verl`` starts for the preflight
  is a stand-in (:data:`SHIM`) that records its command line, environment and working directory; the
  verdict is then :func:`npu_rl.preflight.check_command` of exactly those, in this process, where verl
  and vLLM are imported already (~1-3 s). The output is the launcher's with the preflight's text in the
  place the stand-in printed, and the exit code and the launcher's closing line are the preflight's.

Tests whose subject is the bash wiring itself (the launcher's argument handling, the env scripts, the
plan's order on screen, the preflight's memo between processes) use :func:`launch`; the others
:func:`plan`. Both are memoised on the recipe, the arguments and the environment (less the variables
that pytest and the tests' fixtures change per test), and both run with one HOME and vLLM cache per
test process, so the preflight's memo (``<cache>/preflight``) is shared where a test repeats a
configuration. A test that tests the memo itself sets its own cache (``NPU_RL_CACHE``) or switch
(``NPU_RL_PREFLIGHT_CACHE``), which are part of the key.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from npu_rl import REPO_ROOT
from npu_rl.recipes import SHELL_TOPOLOGY_VARS
from npu_rl.recipes import dry_run as _launcher_dry_run

#: Printed by the stand-in where the preflight's own text goes.
MARKER = "@@npu-rl-tests: the preflight text goes here@@"
#: The Python that ``run_verl`` runs (``NPU_RL_TRAIN_PYTHON``): records the preflight's call, passes
#: every other call (the launcher's ``import ray`` probe, ``-m npu_rl.launch``) to the real interpreter.
SHIM = r"""#!/usr/bin/env bash
set -euo pipefail
if [[ "${1:-}" == -P && "${2:-}" == -m && "${3:-}" == npu_rl.preflight && "${4:-}" == check ]]; then
    shift 4
    "$NPU_RL_TEST_REAL_PYTHON" -S -c '
import json, os, sys
out = {"argv": sys.argv[1:], "env": dict(os.environ), "cwd": os.getcwd()}
with open(os.environ["NPU_RL_TEST_CAPTURE"], "w") as f:
    json.dump(out, f)
' "$@"
    : >"$NPU_RL_PLAN_MARK"
    printf '%s\n' '@MARKER@'
    exit 0
fi
exec "$NPU_RL_TEST_REAL_PYTHON" "$@"
"""
# Changed per test by pytest and tests/conftest.py (the isolated HOME, the vLLM cache), or the
# launcher's topology, which npu_rl.recipes.dry_run removes: not part of a configuration.
_PER_TEST = frozenset({"PYTEST_CURRENT_TEST", "HOME", "VLLM_CACHE_ROOT", "NNODES", "NPUS_PER_NODE", "MASTER_ADDR"})


@functools.cache
def _home() -> Path:
    """One HOME per test process for the dry runs (the preflight's memo, vLLM's cache)."""
    d = Path(tempfile.mkdtemp(prefix="npu-rl-dryrun-home-"))
    atexit.register(shutil.rmtree, d, True)
    (d / "shim").write_text(SHIM.replace("@MARKER@", MARKER))
    (d / "shim").chmod(0o755)
    return d


def _env_key() -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in os.environ.items() if k not in _PER_TEST))


@contextlib.contextmanager
def _dry_run_env(**extra: str):
    """os.environ with the shared HOME and vLLM cache (and ``extra``) for one dry run."""
    home = _home()
    saved = dict(os.environ)
    os.environ.update(HOME=str(home), VLLM_CACHE_ROOT=str(home / "vllm-cache"), **extra)
    try:
        yield home
    finally:
        os.environ.clear()
        os.environ.update(saved)


def launch(recipe: Path, env_script: Path | None = None, *extra: str) -> tuple[int, str, dict]:
    """``bash ray_start_npu.sh --dry-run RECIPE [ENV_SCRIPT] [EXTRA ...]`` as a user runs it: (exit code,
    stdout + stderr, the preflight's facts; empty if it did not run). Memoised per configuration."""
    return _launch(Path(recipe), Path(env_script) if env_script else None, tuple(extra), _env_key())


@functools.cache
def _launch(recipe, env_script, extra, _key):
    with _dry_run_env():
        return _launcher_dry_run(recipe, env_script, *extra)


def plan(recipe: Path, env_script: Path | None = None, *extra: str) -> tuple[int, str, dict]:
    """The verdict of ``bash ray_start_npu.sh --dry-run RECIPE [ENV_SCRIPT] [EXTRA ...]`` with the
    preflight run in this process on the command line and environment ``run_verl`` gave it: (exit code,
    output, facts), as :func:`launch` returns them. Memoised per configuration.

    Raises:
        AssertionError: the launcher ran the preflight but the stand-in left no record.
    """
    return _plan(Path(recipe), Path(env_script) if env_script else None, tuple(extra), _env_key())


@functools.cache
def _plan(recipe, env_script, extra, _key):
    from npu_rl.preflight import check_command

    with tempfile.TemporaryDirectory() as tmp, _dry_run_env() as home:
        capture = Path(tmp) / "capture.json"
        env = {k: v for k, v in os.environ.items() if k not in SHELL_TOPOLOGY_VARS}
        env.update(
            NPU_RL_TRAIN_PYTHON=str(home / "shim"),
            NPU_RL_TEST_REAL_PYTHON=sys.executable,
            NPU_RL_TEST_CAPTURE=str(capture),
        )
        cmd = ["bash", str(REPO_ROOT / "ray_start_npu.sh"), "--dry-run", str(recipe)]
        cmd += [str(env_script)] if env_script else []
        r = subprocess.run([*cmd, *extra], env=env, capture_output=True, text=True, timeout=600, check=False)
        if not capture.exists():  # the launcher or the recipe stopped before run_verl: its own verdict
            assert MARKER not in r.stdout, "the stand-in ran but left no record"
            return r.returncode, r.stdout + r.stderr, {}
        call = json.loads(capture.read_text())
        job_env = {k: v for k, v in call["env"].items() if not k.startswith("NPU_RL_TEST_")}
        job_env["NPU_RL_TRAIN_PYTHON"] = sys.executable
        argv = call["argv"]
        dash = argv.index("--")
        opts = dict(zip(argv[:dash:2], argv[1:dash:2], strict=True))
        with contextlib.chdir(call["cwd"]):
            code, text, facts = check_command(argv[dash + 1 :], job_env, opts["--trainer"], opts["--recipe"])
    stdout, stderr = r.stdout.replace(MARKER, text), r.stderr
    rc = r.returncode
    if rc == 0 and code != 0:
        rc = code
        passed, rejected = "the preflight passed (exit 0)", f"the preflight rejected the recipe (exit {code})"
        stderr = stderr.replace(f"dry run: {passed}", f"dry run: {rejected}")
    return rc, stdout + stderr, facts
