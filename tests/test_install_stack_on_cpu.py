"""install_stack.sh's build helpers, run in bash on small made-up trees (no pip, no network, no NPU)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from npu_rl import REPO_ROOT

SCRIPT = REPO_ROOT / "install_stack.sh"


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(HOME=str(tmp_path), GIT_CONFIG_NOSYSTEM="1", GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t")
    env.update(GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t", **extra)
    return env


def _bash(tmp_path: Path, body: str, **extra: str) -> subprocess.CompletedProcess:
    script = f'set -euo pipefail\nsource "{SCRIPT}"\n{body}\n'
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=_env(tmp_path, **extra))


def _tree(tmp_path: Path) -> Path:
    """A baseline git tree as download_sources.sh makes them, with one file changed by 'the series'."""
    tree = tmp_path / "tree"
    (tree / "pkg").mkdir(parents=True)
    (tree / "pkg" / "_version.py").write_text("commit_id = 'g1234'\n")
    (tree / "pkg" / "patched.py").write_text("upstream\n")
    (tree / "pkg" / "plain.py").write_text("upstream\n")
    (tree / ".gitignore").write_text("build/\n")
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "baseline"]):
        subprocess.run(["git", "-C", str(tree), *args], check=True, capture_output=True, env=_env(tmp_path))
    (tree / "pkg" / "patched.py").write_text("patched\n")
    return tree


def test_in_tree_puts_back_what_the_build_rewrote_and_keeps_the_series(tmp_path):
    tree = _tree(tmp_path)
    build = """fake_build() {
    echo "commit_id = None" >"$1/pkg/_version.py"; echo rewritten >"$1/pkg/plain.py"
    mkdir -p "$1/build" && touch "$1/build/out.o" "$1/stray.txt"; return 3
}"""
    r = _bash(
        tmp_path,
        f'{build}\nrc=0; install::in_tree "{tree}" pkg/_version.py fake_build "{tree}" || rc=$?\necho "rc=$rc"',
    )
    assert r.returncode == 0 and "rc=3" in r.stdout, r.stderr  # the build's status comes back
    assert (tree / "pkg" / "_version.py").read_text() == "commit_id = 'g1234'\n"
    assert (tree / "pkg" / "plain.py").read_text() == "upstream\n"
    assert (tree / "pkg" / "patched.py").read_text() == "patched\n"  # the series' change stays
    assert "put back pkg/plain.py" in r.stderr and "put back pkg/_version.py" not in r.stderr
    assert "untracked files in" in r.stderr and "stray.txt" in r.stderr and "out.o" not in r.stderr


def test_in_tree_stops_when_the_build_rewrote_a_file_of_the_series(tmp_path):
    tree = _tree(tmp_path)
    r = _bash(
        tmp_path, f'fake_build() {{ echo other >"{tree}/pkg/patched.py"; }}\ninstall::in_tree "{tree}" "" fake_build'
    )
    assert r.returncode == 1
    assert "rewrote files the patch series changed: pkg/patched.py" in r.stderr


def _venv(tmp_path: Path) -> Path:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    (venv / "build-tools" / "setuptools_scm").mkdir(parents=True)  # install::build_tools: already there
    return venv


def test_locked_version_reads_sources_lock(tmp_path):
    lock = tomllib.loads((REPO_ROOT / "sources.lock").read_text())
    want = {u["name"]: u["version"] for u in lock["upstream"]}
    venv = _venv(tmp_path)
    r = _bash(tmp_path, f'VENV="{venv}"; install::locked_version vllm-ascend; install::locked_version vllm')
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [want["vllm-ascend"], want["vllm"]]
    r = _bash(tmp_path, f'VENV="{venv}"; install::locked_version no-such-tree')
    assert r.returncode != 0 and "no single [[upstream]] named 'no-such-tree'" in r.stderr


def test_vllm_ascend_builds_with_setuptools_scm_from_build_tools_and_keeps_canns_pythonpath(tmp_path):
    root = tmp_path / "root"
    (root / "sources").mkdir(parents=True)
    (root / "sources.lock").write_text((REPO_ROOT / "sources.lock").read_text())
    tree = _tree(tmp_path).rename(root / "sources" / "vllm-ascend")
    venv = _venv(tmp_path)
    out = tmp_path / "pip-call"
    body = f"""NPU_RL_ROOT="{root}"; VENV="{venv}"
install::pip() {{
    {{ printf '%s\\n' "$@"; env | grep -E '^(PYTHONPATH|PATH|SETUPTOOLS_SCM_PRETEND_VERSION)='; }} >"{out}"
}}
install::vllm_ascend /c/npu.txt"""
    r = _bash(tmp_path, body, PYTHONPATH="/cann/python/site-packages")
    assert r.returncode == 0, r.stderr
    lines = out.read_text().splitlines()
    version = next(u["version"] for u in tomllib.loads((root / "sources.lock").read_text())["upstream"]
                   if u["name"] == "vllm-ascend")  # fmt: skip
    assert f"SETUPTOOLS_SCM_PRETEND_VERSION={version}" in lines
    assert f"PYTHONPATH={venv}/build-tools:/cann/python/site-packages" in lines  # build tools first, CANN's kept
    path = next(line for line in lines if line.startswith("PATH=")).removeprefix("PATH=").split(":")
    assert path[:2] == [f"{venv}/build-tools/bin", f"{venv}/bin"]  # "python3 -m pip show torch-npu": the venv's
    assert lines[:5] == ["-c", "/c/npu.txt", "--no-build-isolation", "--no-deps", "-e"] and lines[5] == str(tree)


@pytest.mark.parametrize("function", ["install::upstreams", "install::vllm_ascend", "install::npu"])
def test_every_build_in_a_source_tree_goes_through_in_tree(function):
    """A pip call that builds a tree under sources/ (-e "$sources/..." or "$tree") is wrapped by install::in_tree."""
    script = SCRIPT.read_text()
    body = re.search(rf"^{re.escape(function)}\(\) {{\n(.*?)^}}", script, re.MULTILINE | re.DOTALL)[1]
    joined = re.sub(r"\\\n\s*", " ", body)
    for line in joined.splitlines():
        if re.search(r"\binstall::pip\b.*-e \"\$(sources/(vllm|vllm-ascend|mindspeed)|tree)\"", line):
            assert "install::in_tree" in line, line


def _run_install(tmp_path: Path, *args: str, **extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in _env(tmp_path, **extra).items() if k not in ("ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH")}
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=120)


def test_npu_on_a_machine_without_npu_or_cann_says_use_cpu_and_makes_nothing(tmp_path):
    """Found by a user: --npu without CANN refused clearly, but only after creating a .venv with system
    site-packages that a later --cpu install silently reused, and never said "no NPU here: use --cpu"."""
    if list(Path("/dev").glob("davinci[0-9]*")) or shutil.which("npu-smi"):
        pytest.fail("this test describes a machine without NPUs; it runs on the CPU CI machine")
    venv = tmp_path / "venv"
    r = _run_install(tmp_path, "--npu", "--venv", str(venv))
    assert r.returncode != 0
    assert "no Ascend NPU or CANN on this machine" in r.stderr and "use bash install_stack.sh --cpu" in r.stderr
    assert "nothing was made" in r.stderr and not venv.exists()


@pytest.mark.parametrize(("made", "asked"), [("npu", "cpu"), ("cpu", "npu")])
def test_a_venv_made_for_the_other_mode_is_refused_not_reused(tmp_path, made, asked):
    venv = tmp_path / "venv"
    cmd = [sys.executable, "-m", "venv", "--without-pip", str(venv)]
    subprocess.run(cmd + (["--system-site-packages"] if made == "npu" else []), check=True)
    cfg = (venv / "pyvenv.cfg").read_text()
    r = _run_install(tmp_path, f"--{asked}", "--venv", str(venv), ASCEND_TOOLKIT_HOME="/nonexistent/cann")
    assert r.returncode != 0
    assert f"{venv} was made by install_stack.sh --{made}" in r.stderr and f"not --{asked}" in r.stderr
    assert f"rm -rf {venv}" in r.stderr and (venv / "pyvenv.cfg").read_text() == cfg
