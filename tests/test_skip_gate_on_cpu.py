"""The skip gate (tests/skip_gate.py): real pytest sessions in a subprocess, on small test folders.

An unexpected skip fails the session and the summary names it; an allowed reason, or no skip at
all, passes; NPU_RL_ALLOW_SKIPS tolerates skips locally but not under CI; the real allow-list is
well formed and every entry says why.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from npu_rl import REPO_ROOT
from tests.skip_gate import DEFAULT_ALLOWLIST, load_allowlist

ALLOWLIST = """\
[[allow]]
# the one legitimate skip of this demo
reason = '^demo tree is not downloaded'
why = "git-only demo tree"
"""


def run_session(
    tmp_path: Path, tests: str, *, allowlist: str | None = ALLOWLIST, env: dict | None = None, extra: tuple = ()
):
    """Run pytest with the real plugin on ``tests`` (the text of one test file) and the pytest options
    ``extra``; return CompletedProcess."""
    (tmp_path / "test_demo.py").write_text(textwrap.dedent(tests))
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.skip_gate", *extra]
    if allowlist is not None:
        (tmp_path / "allow.toml").write_text(allowlist)
        args += ["--skip-allowlist", str(tmp_path / "allow.toml")]
    full_env = {k: v for k, v in os.environ.items() if k not in ("CI", "NPU_RL_ALLOW_SKIPS", "PYTEST_ADDOPTS")}
    full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    full_env.update(env or {})
    return subprocess.run(
        [*args, "test_demo.py"], cwd=tmp_path, env=full_env, capture_output=True, text=True, timeout=120, check=False
    )


MISSING_MODULE = """\
import pytest


def test_ok():
    pass


def test_needs_a_missing_package():
    pytest.importorskip("npu_rl_no_such_module_xyz")
"""


def test_an_unexpected_skip_fails_the_session_and_is_named(tmp_path):
    r = run_session(tmp_path, MISSING_MODULE)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "1 passed, 1 skipped" in out  # pytest's own verdict stays green; the gate turns it red
    assert "skip gate: FAILED: 1 skip(s) not on the allow-list" in out, out
    assert "test_demo.py::test_needs_a_missing_package (skipped): could not import 'npu_rl_no_such_module_xyz'" in out
    assert "NOT ALLOWED" in out and "add a regex of its reason to" in out and "install_stack.sh --cpu" in out


def test_a_module_skipped_at_collection_is_caught(tmp_path):
    module = 'import pytest\npytest.importorskip("npu_rl_no_such_module_xyz")\n\n\ndef test_x():\n    pass\n'
    r = run_session(tmp_path, module)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "SKIPPED AT COLLECTION test_demo.py: could not import 'npu_rl_no_such_module_xyz'" in out, out


@pytest.mark.slow  # pytest sessions on xdist workers
def test_the_gate_holds_on_two_xdist_workers(tmp_path):
    """tools/run_tests.sh runs the suite with pytest-xdist: the skips of the workers (in a test body, a
    skipif, an xfail, a module skipped while a worker collects it) reach the gate of the controlling
    process, which names each once and fails the session."""
    (tmp_path / "test_skipped_module.py").write_text('import pytest\npytest.importorskip("npu_rl_no_such_xyz")\n')
    body = MISSING_MODULE + '\n\n@pytest.mark.xfail(reason="demo xfail")\ndef test_xfail():\n    assert False\n'
    r = run_session(tmp_path, body, extra=("-n", "2", "test_skipped_module.py"))
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "3 skipped/xfailed, 0 allowed, 3 not allowed" in out, out
    assert out.count("SKIPPED AT COLLECTION test_skipped_module.py: could not import 'npu_rl_no_such_xyz'") == 1, out
    assert "SKIPPED test_demo.py::test_needs_a_missing_package" in out and "XFAILED test_demo.py::test_xfail" in out
    assert "skip gate: FAILED: 3 skip(s) not on the allow-list" in out
    clean = tmp_path / "clean"
    clean.mkdir()
    ok = run_session(clean, "def test_ok():\n    pass\n", extra=("-n", "2"))
    assert ok.returncode == 0 and "0 skipped/xfailed" in ok.stdout, ok.stdout + ok.stderr


def test_an_allowed_skip_and_no_skip_pass(tmp_path):
    allowed = """\
        import pytest

        def test_ok():
            pass

        @pytest.mark.skip(reason="demo tree is not downloaded (--no-git)")
        def test_needs_the_demo_tree():
            pass
    """
    r = run_session(tmp_path, allowed)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "1 skipped/xfailed, 1 allowed, 0 not allowed" in out
    assert "SKIPPED test_demo.py::test_needs_the_demo_tree: demo tree is not downloaded (--no-git)" in out
    assert "allowed (git-only demo tree)" in out

    r = run_session(tmp_path, "def test_ok():\n    pass\n")
    out = r.stdout + r.stderr
    assert r.returncode == 0 and "0 skipped/xfailed, 0 allowed, 0 not allowed" in out, out


def test_skipif_and_xfail_and_xpass_are_policed(tmp_path):
    tests = """\
        import pytest

        @pytest.mark.skipif(True, reason="some condition")
        def test_skipif():
            pass

        @pytest.mark.xfail(reason="known bug")
        def test_xfail():
            assert False

        @pytest.mark.xfail(reason="fixed already")
        def test_xpass():
            pass

        def test_skip_in_body():
            pytest.skip("decided at run time")
    """
    r = run_session(tmp_path, tests)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "4 skipped/xfailed, 0 allowed, 4 not allowed" in out, out
    for line in (
        "test_demo.py::test_skipif (skipped): some condition",
        "test_demo.py::test_xfail (xfailed): known bug",
        "test_demo.py::test_xpass (xpassed): XPASS (the test passes: remove its xfail mark) fixed already",
        "test_demo.py::test_skip_in_body (skipped): decided at run time",
    ):
        assert line in out, line


def test_failures_keep_their_exit_status(tmp_path):
    r = run_session(tmp_path, MISSING_MODULE + "\ndef test_bad():\n    assert False\n")
    out = r.stdout + r.stderr
    assert r.returncode == 1 and "1 failed" in out and "skip gate: 1 skip(s) not on the allow-list" in out, out


def test_allow_skips_is_local_only(tmp_path):
    r = run_session(tmp_path, MISSING_MODULE, env={"NPU_RL_ALLOW_SKIPS": "1"})
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "tolerated because NPU_RL_ALLOW_SKIPS is set (local use only: CI fails on them)" in out
    assert "test_demo.py::test_needs_a_missing_package (skipped)" in out

    r = run_session(tmp_path, MISSING_MODULE, env={"NPU_RL_ALLOW_SKIPS": "1", "CI": "true"})
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "NPU_RL_ALLOW_SKIPS is set but CI is set too: IGNORED" in out and "skip gate: FAILED" in out

    r = run_session(tmp_path, MISSING_MODULE, env={"NPU_RL_ALLOW_SKIPS": "0"})
    assert r.returncode == 1, r.stdout + r.stderr


@pytest.mark.parametrize(
    ("allowlist", "message"),
    [
        ("[[allow]]\nreason = 'x'\n", "must have exactly 'reason' and 'why'"),
        ("[[allow]]\nreason = 'x'\nwhy = ' '\n", "'reason' and 'why' must be non-empty strings"),
        ("[[allow]]\nreason = '('\nwhy = 'w'\n", "'reason' is not a valid regex"),
        ("reason = 'x'\n", "only [[allow]] tables are allowed"),
        ("[[allow]\n", "cannot read the allow-list"),
    ],
)
def test_a_malformed_allowlist_is_a_usage_error(tmp_path, allowlist, message):
    r = run_session(tmp_path, "def test_ok():\n    pass\n", allowlist=allowlist)
    assert r.returncode == pytest.ExitCode.USAGE_ERROR and message in r.stderr, r.stdout + r.stderr


def test_the_real_allowlist_is_short_and_justified():
    allowed = load_allowlist(DEFAULT_ALLOWLIST)
    assert 0 < len(allowed) <= 5, "keep tests/skip_allowlist.toml short: CI installs everything the tests need"
    text = DEFAULT_ALLOWLIST.read_text()
    assert all(a.why for a in allowed)
    # every entry carries a comment above it (the why at length)
    blocks = text.split("[[allow]]")[1:]
    assert len(blocks) == len(allowed) and all(b.lstrip("\n").startswith("#") for b in blocks)
    # the MindSpeed skip is allowed; a missing installed package is not
    assert any(a.reason.search("sources/mindspeed is not downloaded (git-only; --no-git)") for a in allowed)
    for reason in (
        "could not import 'pybase64': No module named 'pybase64'",
        "pybase64 is not installed: constraints/cpu.txt lists it: install_stack.sh --cpu",
        "sources/vllm-ascend is not downloaded",
    ):
        assert not any(a.reason.search(reason) for a in allowed), reason


def test_the_suite_registers_the_gate_and_the_test_command_keeps_it_on():
    assert '"tests.skip_gate"' in (REPO_ROOT / "tests" / "conftest.py").read_text().split("pytest_plugins = [", 1)[1]
    script = (REPO_ROOT / "tools" / "run_tests.sh").read_text()
    assert 'env -u NPU_RL_ALLOW_SKIPS "$PY" -m pytest -q' in script
