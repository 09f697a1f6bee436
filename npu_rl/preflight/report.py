"""Problems the preflight found: each names the dotted key (or env var), its value and the fix."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Problem:
    """One finding. ``key`` is a dotted config key, an env var, or a check name for cross-key rules."""

    key: str
    message: str
    fix: str = ""
    error: bool = True

    def render(self) -> str:
        head = f"{'error' if self.error else 'warning'}: {self.key}: {self.message}"
        return head + (f"\n    fix: {self.fix}" if self.fix else "")


@dataclass
class Report:
    """All findings of one preflight run; the run fails if any is an error."""

    problems: list[Problem] = field(default_factory=list)

    def error(self, key: str, message: str, fix: str = "") -> None:
        self._add(Problem(key, message, fix, True))

    def warn(self, key: str, message: str, fix: str = "") -> None:
        self._add(Problem(key, message, fix, False))

    def _add(self, problem: Problem) -> None:
        # A bad feature value is named by the settings layer's check (npu_rl.settings.check) and again
        # by its feature's own check, which also runs alone: the same finding (key, message, severity)
        # is reported once, with the first one's fix.
        if not any((p.key, p.message, p.error) == (problem.key, problem.message, problem.error) for p in self.problems):
            self.problems.append(problem)

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.error]

    @property
    def warnings(self) -> list[Problem]:
        return [p for p in self.problems if not p.error]

    def keys(self) -> set[str]:
        return {p.key for p in self.problems}
