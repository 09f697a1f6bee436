"""Where the test suite's time goes, from pytest's JUnit XML (``pytest --junitxml=FILE``).

    python tools/test_durations.py FILE [--top 30] [--markdown]

Prints the seconds of each test file (set-up, call and teardown of its tests added up, so under
``pytest -n 2`` the files' total is about twice the wall time) with its number of tests, then the
``--top`` slowest tests. ``--markdown`` writes both as tables (the README's measured section).
tools/run_tests.sh prints it after the pytest stage.
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path


def read_cases(path: Path) -> list[tuple[str, float]]:
    """(test id ``tests/FILE.py::NAME``, seconds) for every test case of the report at ``path``.

    Raises:
        SystemExit: the file is missing or is not a JUnit XML report (names the file).
    """
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as e:
        raise SystemExit(f"{path}: not a readable JUnit XML report ({e}): write one with pytest --junitxml") from e
    cases = []
    for case in root.iter("testcase"):
        module = case.get("classname", "")
        name = case.get("name", "")
        # classname is the dotted module (and class) path: tests.test_x_on_cpu[.Class]
        parts = module.split(".")
        cut = next((i for i, p in enumerate(parts) if p.startswith("test_")), len(parts) - 1)
        file = "/".join(parts[: cut + 1]) + ".py"
        inner = "::".join([*parts[cut + 1 :], name])
        cases.append((f"{file}::{inner}", float(case.get("time") or 0.0)))
    return cases


def per_file(cases: list[tuple[str, float]]) -> list[tuple[str, int, float]]:
    """(file, tests, seconds) per file, slowest first."""
    count: dict[str, int] = defaultdict(int)
    total: dict[str, float] = defaultdict(float)
    for test_id, seconds in cases:
        file = test_id.split("::", 1)[0]
        count[file] += 1
        total[file] += seconds
    return sorted(((f, count[f], total[f]) for f in total), key=lambda r: -r[2])


def render(cases: list[tuple[str, float]], top: int, markdown: bool) -> str:
    files = per_file(cases)
    slow = sorted(cases, key=lambda c: -c[1])[:top]
    total = sum(s for _, s in cases)
    out = []
    if markdown:
        out += ["| test file | tests | seconds |", "|---|---|---|"]
        out += [f"| `{f}` | {n} | {s:,.1f} |" for f, n, s in files]
        out += [f"| all | {len(cases)} | {total:,.1f} |", "", "| slowest tests | seconds |", "|---|---|"]
        out += [f"| `{t}` | {s:,.1f} |" for t, s in slow]
    else:
        out.append(f"seconds per test file ({len(cases)} tests, {total:,.1f} s added up):")
        out += [f"{s:9.1f} s {n:4d} tests  {f}" for f, n, s in files]
        if slow:
            out.append(f"the {len(slow)} slowest tests:")
            out += [f"{s:9.1f} s  {t}" for t, s in slow]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python tools/test_durations.py", description=__doc__.split("\n\n")[0])
    p.add_argument("report", type=Path, help="pytest's JUnit XML report")
    p.add_argument("--top", type=int, default=30, help="how many of the slowest tests to list (default 30)")
    p.add_argument("--markdown", action="store_true", help="write Markdown tables")
    a = p.parse_args(argv)
    print(render(read_cases(a.report), a.top, a.markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
