"""The test suite's own machinery (issue 33): the in-process dry run that most recipe tests use, and the
durations report tools/run_tests.sh prints.

- tests/dryrun.py's :func:`plan` must give what the launcher's own dry run gives (exit code, the
  preflight's text, its facts) for an accepted and a rejected recipe; otherwise every recipe test that
  uses it would judge something else than users run.
- tools/test_durations.py reads the JUnit XML pytest writes: test ids as pytest names them, tests and
  seconds per file.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest

from npu_rl import REPO_ROOT
from tests import dryrun

TESTS = REPO_ROOT / "tests" / "recipes"


def _preflight_text(out: str) -> str:
    """The preflight's block of a dry run's output: from 'preflight of' to its verdict line, with the
    free disk space it reads blanked (the other test worker writes to the same disk between the two
    dry runs; a CI run once saw 63 and 65 GiB)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("preflight of "))
    end = next(i for i, line in enumerate(lines) if line.startswith("preflight: "))
    return re.sub(r"[\d.,]+ ([KMGT]i?B) free", r"N \1 free", "\n".join(lines[start : end + 1]))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("recipe", "env", "extra", "code"),
    [
        (REPO_ROOT / "recipes/qwen3-0.6b/grpo_gsm8k_smoke.sh", REPO_ROOT / "recipes/qwen3-0.6b/env_1node.sh", (), 0),
        (TESTS / "case2_mini_batch_rounds_to_zero.sh", TESTS / "env_2x16.sh", (), 65),
        (TESTS / "drops_overrides.sh", TESTS / "env_2x16.sh", ("data.train_batch_size=128",), 65),
    ],
    ids=["accepted", "rejected", "dropped-override"],
)
def test_the_in_process_dry_run_gives_the_launchers_verdict(recipe, env, extra, code):
    rc_launch, out_launch, facts_launch = dryrun.launch(recipe, env, *extra)
    rc_plan, out_plan, facts_plan = dryrun.plan(recipe, env, *extra)
    assert rc_launch == code, out_launch[-3000:]
    assert rc_plan == rc_launch, out_plan[-3000:]
    assert _preflight_text(out_plan) == _preflight_text(out_launch)
    assert facts_plan == facts_launch
    verdict = "passed" if code == 0 else "rejected the recipe"
    assert f"dry run: the preflight {verdict} (exit {code})" in out_plan
    assert dryrun.MARKER not in out_plan


def test_a_recipe_that_stops_before_run_verl_gets_the_launchers_own_verdict():
    rc, out, facts = dryrun.plan(TESTS / "no_run_verl.sh")
    assert rc == 65 and "without reaching run_verl: nothing was checked" in out and facts == {}


JUNIT = """\
<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="4">
<testcase classname="tests.test_a_on_cpu" name="test_one" time="1.500" />
<testcase classname="tests.test_a_on_cpu" name="test_two[x-1]" time="0.250" />
<testcase classname="tests.test_b_on_cpu.TestGroup" name="test_three" time="12.000" />
<testcase classname="tests.sub.test_c_on_cpu" name="test_four" time="0.001"><skipped message="s" /></testcase>
</testsuite></testsuites>
"""


def test_durations_per_file_and_slowest_tests_from_a_junit_report(tmp_path):
    report = tmp_path / "junit.xml"
    report.write_text(JUNIT)
    out = subprocess.run(
        [sys.executable, str(REPO_ROOT / "tools/test_durations.py"), str(report), "--top", "2"],
        capture_output=True, text=True, check=True,
    ).stdout.splitlines()  # fmt: skip
    assert out[0] == "seconds per test file (4 tests, 13.8 s added up):"
    assert out[1:4] == [
        "     12.0 s    1 tests  tests/test_b_on_cpu.py",
        "      1.8 s    2 tests  tests/test_a_on_cpu.py",
        "      0.0 s    1 tests  tests/sub/test_c_on_cpu.py",
    ]
    assert out[4:] == [
        "the 2 slowest tests:",
        "     12.0 s  tests/test_b_on_cpu.py::TestGroup::test_three",
        "      1.5 s  tests/test_a_on_cpu.py::test_one",
    ]
    md = subprocess.run(
        [sys.executable, str(REPO_ROOT / "tools/test_durations.py"), str(report), "--top", "1", "--markdown"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "| `tests/test_b_on_cpu.py` | 1 | 12.0 |" in md and "| all | 4 | 13.8 |" in md
    bad = tmp_path / "not.xml"
    bad.write_text("{}")
    r = subprocess.run(
        [sys.executable, str(REPO_ROOT / "tools/test_durations.py"), str(bad)], capture_output=True, text=True
    )
    assert r.returncode == 1 and f"{bad}: not a readable JUnit XML report" in r.stderr


@pytest.mark.slow  # pytest sessions
def test_durations_names_tests_as_pytest_does(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "__init__.py").write_text("")
    (tmp_path / "tests" / "test_demo_on_cpu.py").write_text(
        textwrap.dedent(
            """\
            import pytest

            @pytest.mark.parametrize("n", [1, 2])
            def test_param(n):
                pass

            class TestKind:
                def test_method(self):
                    pass
            """
        )
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    base = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path), "tests"]
    ids = subprocess.run(
        [*base, "--collect-only"], cwd=tmp_path, env=env, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    subprocess.run([*base, "--junitxml=j.xml"], cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    out = subprocess.run(
        [sys.executable, str(REPO_ROOT / "tools/test_durations.py"), str(tmp_path / "j.xml"), "--top", "3"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    listed = sorted(line.split("  ")[-1] for line in out.splitlines()[-3:])
    assert listed == sorted(i for i in ids if "::" in i) and len(listed) == 3


@pytest.mark.slow  # a pytest session on xdist workers
def test_serial_tests_run_on_one_worker_one_after_another(tmp_path):
    """tests/serial_group.py under ``-n 2 --dist loadgroup`` (what tools/run_tests.sh runs): every test
    marked serial, or using a fixture that starts Ray, runs on the same worker; the others on both."""
    (tmp_path / "conftest.py").write_text("import pytest\n\n\n@pytest.fixture\ndef local_ray():\n    return None\n")
    (tmp_path / "test_marked.py").write_text(
        "import pytest\n\npytestmark = pytest.mark.serial\n\n\n"
        "@pytest.mark.parametrize('i', range(4))\ndef test_marked(i):\n    pass\n"
    )
    (tmp_path / "test_mixed.py").write_text(
        "import time\n\nimport pytest\n\n\n"
        "@pytest.mark.parametrize('i', range(3))\ndef test_ray(local_ray, i):\n    pass\n\n\n"
        "@pytest.mark.parametrize('i', range(8))\ndef test_free(i):\n    time.sleep(0.3)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-p", "tests.serial_group",
         "-n", "2", "--dist", "loadgroup", "--rootdir", str(tmp_path), str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    workers: dict[str, set[str]] = {}
    for line in r.stdout.splitlines():
        if "PASSED" in line and line.startswith("[gw"):
            worker, test = line.split()[0], line.split()[-1]
            workers.setdefault("serial" if "test_marked" in test or "test_ray" in test else "free", set()).add(worker)
            assert ("@serial" in test) == ("test_marked" in test or "test_ray" in test), line
    assert len(workers["serial"]) == 1, r.stdout  # 7 serial tests, one worker
    assert len(workers["free"]) == 2, r.stdout  # the others spread over both
