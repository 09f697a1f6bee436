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
        self.problems.append(Problem(key, message, fix, True))

    def warn(self, key: str, message: str, fix: str = "") -> None:
        self.problems.append(Problem(key, message, fix, False))

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.error]

    @property
    def warnings(self) -> list[Problem]:
        return [p for p in self.problems if not p.error]

    def keys(self) -> set[str]:
        return {p.key for p in self.problems}
