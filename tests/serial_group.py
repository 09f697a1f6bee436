"""The "serial" group: a pytest plugin that keeps tests which start Ray or a vLLM engine, or mount a
tmpfs, from running beside each other when the suite runs on several pytest-xdist workers.

tools/run_tests.sh runs ``pytest -n 2 --dist loadgroup``: xdist sends each ``xdist_group`` as a whole
to one worker, which runs its tests one after another, and spreads the other tests over all workers.
This plugin gives every test marked ``serial`` (pyproject.toml), and every test that uses a fixture of
:data:`SERIAL_FIXTURES`, the group ``serial``. Without xdist nothing changes.

Why these tests: two Ray clusters on one machine fight over ports and the launcher's head refuses to
start beside another Ray node (and its tests kill every process that runs their recipe); two vLLM
engines each want the memory and cores the tests size them for; a tmpfs mount is machine-wide.

The serial tests are also moved to the front of the collection, then the tests of other xdist groups
(see the hook).

Registered by ``tests/conftest.py``; elsewhere ``python -m pytest -p tests.serial_group``.
Note: the grouping needs pytest 9.1 (constraints/cpu.txt): on 9.2 xdist's group suffix is ignored and
every test is spread (pytest-xdist issue 1386); tests/test_test_tiers_on_cpu.py checks it.
"""

from __future__ import annotations

import pytest

GROUP = "serial"
#: Fixtures that start Ray, or need it absent from the process: a test that uses one is serial without
#: a mark (so a module's Ray-free tests and its Ray tests run on one worker, in the module's order).
SERIAL_FIXTURES = frozenset({"local_ray", "no_ray"})


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if SERIAL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.serial)
        if item.get_closest_marker("serial"):
            item.add_marker(pytest.mark.xdist_group(GROUP))
    # The serial tests first (a stable sort: each keeps its order): xdist hands out work in collection
    # order, so the group, the longest piece of work (~9 of the suite's ~24 CPU-minutes), starts at
    # once on one worker while the other takes the rest; placed where its first module sorts, it
    # started halfway and the run waited for it at the end.
    # Then the other groups (tests/test_two_nodes_on_cpu.py's), for the same reason.
    items.sort(key=_order)


def _order(item: pytest.Item) -> int:
    if item.get_closest_marker("serial"):
        return 0
    return 1 if item.get_closest_marker("xdist_group") else 2
