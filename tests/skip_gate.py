"""Skip gate: a pytest plugin that fails the session on any skip or xfail whose reason is not allowed.

CI installs the whole CPU stack, so a skipped test there almost always means something is missing
(one absent package used to drop every SAM-vLLM glue test while the run stayed green). At the end of
the session the gate prints a summary of every skipped and xfailed test (marks, ``pytest.skip``,
``pytest.importorskip``, ``skipif``, module-level skips at collection, ``xfail``) with its reason,
checks each reason against the allow-list ``tests/skip_allowlist.toml`` (a regex per entry, searched
in the reason, with a comment saying why that skip is legitimate) and sets a non-zero exit status
when any is not allowed. An XPASS (an xfail mark on a test that passes) counts as unexpected too.

Registered by ``tests/conftest.py``; elsewhere ``python -m pytest -p tests.skip_gate``.

* ``--skip-allowlist PATH``: another allow-list file (the gate's own tests use it).
* ``NPU_RL_ALLOW_SKIPS=1``: for a developer running a subset of the suite without the full set-up;
  the summary still lists every skip but the session does not fail for them. Ignored, loudly, when
  ``CI`` is set (``CI=true``, as CI services set it); ``tools/run_tests.sh`` never passes it on.
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

DEFAULT_ALLOWLIST = Path(__file__).with_name("skip_allowlist.toml")
ALLOW_ENV = "NPU_RL_ALLOW_SKIPS"
_FALSE = ("", "0", "false", "no", "off")


@dataclass(frozen=True)
class Allowed:
    """One allow-list entry: ``reason`` is a regex searched in the skip reason, ``why`` the justification."""

    reason: re.Pattern[str]
    why: str


@dataclass
class Skip:
    """One skipped or xfailed test (or a module skipped while collecting it)."""

    nodeid: str
    kind: str  # "skipped", "skipped at collection", "xfailed", "xpassed"
    reason: str
    allowed_by: Allowed | None = None


def load_allowlist(path: Path) -> list[Allowed]:
    """Read ``path`` (``[[allow]]`` tables with ``reason`` and ``why``); raise pytest.UsageError if malformed."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise pytest.UsageError(f"skip gate: cannot read the allow-list {path}: {exc}") from exc
    entries = data.get("allow", [])
    unknown = sorted(set(data) - {"allow"})
    if unknown or not isinstance(entries, list):
        raise pytest.UsageError(f"skip gate: {path}: only [[allow]] tables are allowed (found {unknown or 'allow'})")
    allowed = []
    for n, entry in enumerate(entries, 1):
        where = f"{path}: [[allow]] entry {n}"
        if not isinstance(entry, dict) or set(entry) != {"reason", "why"}:
            keys = sorted(entry) if isinstance(entry, dict) else entry
            raise pytest.UsageError(f"skip gate: {where} must have exactly 'reason' and 'why' (has {keys})")
        reason, why = entry["reason"], entry["why"]
        if not isinstance(reason, str) or not reason.strip() or not isinstance(why, str) or not why.strip():
            raise pytest.UsageError(f"skip gate: {where}: 'reason' and 'why' must be non-empty strings")
        try:
            pattern = re.compile(reason)
        except re.error as exc:
            raise pytest.UsageError(f"skip gate: {where}: 'reason' is not a valid regex ({exc}): {reason!r}") from exc
        allowed.append(Allowed(pattern, " ".join(why.split())))
    return allowed


def _skip_reason(longrepr) -> str:
    """The reason of a skip report (its longrepr is ``(path, lineno, "Skipped: reason")``)."""
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        message = str(longrepr[2])
    else:
        message = str(longrepr)
    return message.removeprefix("Skipped: ").strip()


def _truthy(value: str | None) -> bool:
    return value is not None and value.strip().lower() not in _FALSE


@dataclass(eq=False)  # a plugin object must stay hashable
class SkipGate:
    """Collects skip/xfail reports during the session; decides and reports at its end."""

    allowlist_path: Path
    allowlist: list[Allowed]
    relaxed: bool  # NPU_RL_ALLOW_SKIPS honoured: report, do not fail
    refused: bool  # NPU_RL_ALLOW_SKIPS set but ignored because CI is set
    skips: list[Skip] = field(default_factory=list)
    failed_session: bool = False

    def add(self, nodeid: str, kind: str, reason: str) -> None:
        """Record one skip; match it against the allow-list (XPASS is never allowed)."""
        skip = Skip(nodeid, kind, reason)
        if kind != "xpassed":
            skip.allowed_by = next((a for a in self.allowlist if a.reason.search(reason)), None)
        self.skips.append(skip)

    @property
    def unexpected(self) -> list[Skip]:
        return [s for s in self.skips if s.allowed_by is None]

    # --- hooks ---------------------------------------------------------------------------------

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.skipped:
            self.add(report.nodeid, "skipped at collection", _skip_reason(report.longrepr))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        wasxfail = getattr(report, "wasxfail", None)
        if report.skipped and wasxfail is not None:
            self.add(report.nodeid, "xfailed", wasxfail.removeprefix("reason: ") or "(xfail without a reason)")
        elif report.skipped:
            self.add(report.nodeid, "skipped", _skip_reason(report.longrepr))
        elif report.passed and wasxfail is not None and report.when == "call":
            self.add(report.nodeid, "xpassed", f"XPASS (the test passes: remove its xfail mark) {wasxfail}".strip())

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        # a failed or interrupted session keeps its own status; a green one turns red
        green = exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED)
        if self.unexpected and not self.relaxed and green:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
            self.failed_session = True

    def pytest_terminal_summary(self, terminalreporter) -> None:
        tr = terminalreporter
        unexpected = self.unexpected
        try:
            shown = self.allowlist_path.relative_to(Path.cwd())
        except ValueError:
            shown = self.allowlist_path
        tr.write_sep("=", "skip gate", bold=True, red=bool(unexpected) and not self.relaxed)
        if self.refused:
            tr.write_line(
                f"skip gate: {ALLOW_ENV} is set but CI is set too: IGNORED, every skip must be on the allow-list",
                red=True,
                bold=True,
            )
        tr.write_line(
            f"{len(self.skips)} skipped/xfailed, {len(self.skips) - len(unexpected)} allowed, "
            f"{len(unexpected)} not allowed (allow-list: {shown})"
        )
        for s in self.skips:
            verdict = f"allowed ({s.allowed_by.why})" if s.allowed_by else "NOT ALLOWED"
            tr.write_line(f"  {s.kind.upper()} {s.nodeid}: {s.reason}")
            tr.write_line(f"      -> {verdict}", red=s.allowed_by is None, green=s.allowed_by is not None)
        if not unexpected:
            return
        fix = (
            "Fix: install what the test needs (bash install_stack.sh --cpu; bash download_sources.sh && "
            "bash apply_all_patches.sh for sources/), or, if this skip is legitimate in CI, add a regex of "
            f"its reason to {shown} with a comment saying why."
        )
        if self.relaxed:
            tr.write_line(
                f"skip gate: {len(unexpected)} skip(s) not on the allow-list, tolerated because {ALLOW_ENV} is set "
                "(local use only: CI fails on them)",
                yellow=True,
                bold=True,
            )
        elif self.failed_session:
            tr.write_line(f"skip gate: FAILED: {len(unexpected)} skip(s) not on the allow-list:", red=True, bold=True)
        else:
            tr.write_line(f"skip gate: {len(unexpected)} skip(s) not on the allow-list:", red=True, bold=True)
        for s in unexpected:
            tr.write_line(f"  {s.nodeid} ({s.kind}): {s.reason}", red=not self.relaxed)
        tr.write_line(fix)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--skip-allowlist",
        default=None,
        metavar="PATH",
        help=f"skip gate: the allow-list of skip reasons (default: {DEFAULT_ALLOWLIST})",
    )


def pytest_configure(config: pytest.Config) -> None:
    option = config.getoption("--skip-allowlist")
    path = Path(option).resolve() if option else DEFAULT_ALLOWLIST
    wanted = _truthy(os.environ.get(ALLOW_ENV))
    in_ci = _truthy(os.environ.get("CI"))
    gate = SkipGate(path, load_allowlist(path), relaxed=wanted and not in_ci, refused=wanted and in_ci)
    config.pluginmanager.register(gate, "npu_rl_skip_gate")
