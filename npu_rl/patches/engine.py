"""Check, apply, revert and report the patch series over every tree, all or nothing.

The state of a tree is decided by tree hashes, never by markers: with ``T0`` the baseline tree
and ``T1..Tn`` the trees after each patch (computed in a throw-away index, which is also the dry
run of the whole series), the working tree is *pristine* (``== T0``), *applied* (``== Tn``),
*partial* (``== Tk``, 0 < k < n: an older or interrupted series) or *modified* (anything else).
Only pristine trees are patched; applied ones are left alone (idempotence); every other state is
refused with the list of files that differ, before any tree is touched.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from pathlib import Path

from git.exc import GitCommandError

from npu_rl import signals
from npu_rl.errors import ConflictError, IOFailure, NpuRlError, RollbackIncomplete, TreeStateError, VerifyError
from npu_rl.gittree import BASELINE_TAG, IDENTITY_TRAILER, SOURCE_TRAILER, PatchApplyError, Tree, git
from npu_rl.lock import Lock, Upstream
from npu_rl.patches.series import Series, load_series

PRISTINE, APPLIED, PARTIAL, MODIFIED = "pristine", "applied", "partial", "modified"
MISSING, FOREIGN, WRONG_PIN, HEAD_MOVED = "missing", "not-ours", "wrong-pin", "head-moved"
AT_PIN = "at-pin"  # baseline and HEAD checked, working tree not compared (dry_run=False)
_SHOW_FILES = 20


@dataclass
class TreePlan:
    """What the engine knows about one upstream tree before touching it."""

    upstream: Upstream
    tree: Tree
    series: Series
    state: str = MISSING
    detail: str = ""
    expected: list[str] = field(default_factory=list)  # T0..Tn
    current: str = ""
    applied_count: int = 0

    @property
    def n(self) -> int:
        return len(self.series.patches)


def _file_list(lines: list[str]) -> str:
    shown = "\n".join(f"      {line}" for line in lines[:_SHOW_FILES])
    more = f"\n      ... and {len(lines) - _SHOW_FILES} more" if len(lines) > _SHOW_FILES else ""
    return shown + more


def inspect(
    up: Upstream,
    sources_dir: Path,
    patches_dir: Path | None = None,
    dry_run: bool = True,
    series: Series | None = None,
) -> TreePlan:
    """Classify one tree; with ``dry_run`` also compute T0..Tn (raises ConflictError on conflict).

    ``series`` saves re-reading the patches when the caller has loaded them already.
    """
    series = series if series is not None else load_series(up.name, patches_dir)
    plan = TreePlan(up, Tree(sources_dir / up.name), series)
    t = plan.tree
    if not t.exists():
        plan.state = MISSING
        plan.detail = f"{t.path} does not exist; run download_sources.sh"
        return plan
    if not t.is_ours():
        plan.state = FOREIGN
        plan.detail = (
            f"{t.path} is not a tree made by download_sources.sh (no '{BASELINE_TAG}' baseline tag); "
            "move it away, or run download_sources.sh --force"
        )
        return plan
    ident = t.identity()
    if ident != up.identity:
        plan.state = WRONG_PIN
        plan.detail = (
            f"{t.path} is at baseline {ident!r} but sources.lock pins {up.identity!r}; "
            "run download_sources.sh --force to replace it"
        )
        return plan
    if t.head() != t.baseline_commit():
        count = _commit_count(t)
        plan.state = HEAD_MOVED
        plan.detail = (
            f"{t.path} has {count} commit(s) on top of its baseline (maintainer mode); export them with "
            f"'bash apply_all_patches.sh export {up.name}', then '--revert --force' to go back"
        )
        return plan
    if not dry_run:
        plan.state = AT_PIN
        return plan
    labels = [(f"patches/{up.name}/{p.name}", p.data) for p in plan.series.patches]
    try:
        plan.expected = t.expected_trees(labels)
    except PatchApplyError as exc:
        raise ConflictError(
            f"{exc.label} does not apply to {t.path} (baseline {up.identity}):\n    {exc.detail}\n"
            "No tree was changed. Refresh the patch against the pinned tree (see README: 'Refreshing a patch')."
        ) from None
    plan.current = t.worktree_hash()
    if plan.current in plan.expected:
        k = plan.expected.index(plan.current) if plan.current != plan.expected[-1] else plan.n
        plan.applied_count = k
        plan.state = PRISTINE if k == 0 else APPLIED if k == plan.n else PARTIAL
        if plan.state == PARTIAL:
            plan.detail = (
                f"{t.path} has patches 1..{k} of {plan.n} applied (a series from an older checkout?); "
                "run apply_all_patches.sh --revert, then apply again"
            )
        return plan
    plan.state = MODIFIED
    k, changed = closest_series_state(t, plan.expected, plan.current)
    plan.detail = (
        f"{t.path} was modified outside the patch series; files that differ from {_state_name(k, plan.n)}:\n"
        f"{_file_list(changed)}\n    run apply_all_patches.sh --revert (these changes are saved as a diff "
        "that applies on top of the series) or export them as a patch"
    )
    return plan


def closest_series_state(t: Tree, expected: list[str], current: str) -> tuple[int, list[str]]:
    """The series state (``k`` patches applied, ``expected[k]``) that the tree ``current`` differs from in
    the fewest files, and those files (``STATUS path`` lines): what was edited by hand, file by file.
    Ties go to the later state (a hand edit on an applied tree is the common case)."""
    best_k, best = 0, None
    for k in range(len(expected) - 1, -1, -1):
        changed = t.changed_files(expected[k], current)
        if best is None or len(changed) < len(best):
            best_k, best = k, changed
    return best_k, best or []


def _state_name(k: int, n: int) -> str:
    if k == 0:
        return "the pristine baseline"
    return "what the series produces" if k == n else f"what patches 1..{k} of {n} produce"


def _refuse_pending_bump(sources_dir: Path, name: str) -> None:
    from npu_rl.patches.bump import pending_switch

    version = pending_switch(sources_dir, name)
    if version:
        raise TreeStateError(
            f"a bump of {name} to {version} was interrupted while switching the series, the tree and "
            f"sources.lock; finish it with 'bash apply_all_patches.sh bump {name} {version}'"
        )


def _commit_count(t: Tree) -> int:
    return int(git(t.path, "rev-list", "--count", f"refs/tags/{BASELINE_TAG}..HEAD"))


def select(lock: Lock, names: list[str] | None) -> list[Upstream]:
    """Upstreams to act on: those named, else all in the lock (in lock order)."""
    return [lock.get(n) for n in names] if names else list(lock.upstreams.values())


def _plans(
    lock: Lock, sources_dir: Path, patches_dir: Path | None, names: list[str] | None, log=print
) -> list[TreePlan]:
    """Inspect every selected tree; refuse (TreeStateError listing all problems) before touching any."""
    plans, problems = [], []
    for up in select(lock, names):
        signals.check()
        _refuse_pending_bump(sources_dir, up.name)
        series = load_series(up.name, patches_dir)
        if not series.patches:
            if names:  # asked for by name: say why nothing happens
                log(f"{up.name:14} has no patches in the series: nothing to do")
            continue  # its tree is not required
        plan = inspect(up, sources_dir, patches_dir, dry_run=True, series=series)
        if plan.state in (MISSING, FOREIGN, WRONG_PIN, HEAD_MOVED, PARTIAL, MODIFIED):
            problems.append(f"  {up.name}: {plan.detail}")
        plans.append(plan)
    if problems:
        raise TreeStateError("refusing to touch any tree:\n" + "\n".join(problems))
    _refuse_held_index_locks([p for p in plans if p.state != APPLIED], "apply_all_patches.sh")
    return plans


def _refuse_held_index_locks(plans: list[TreePlan], rerun: str) -> None:
    """Refuse (IOFailure) before touching any tree when one has a ``.git/index.lock``: a rollback
    there could not ``git reset``. Names each lock, the fix and the command to rerun."""
    held = [(p, p.tree.index_lock()) for p in plans]
    held = [(p, lock) for p, lock in held if lock is not None]
    if held:
        lines = "\n".join(
            f"  {p.upstream.name}: {lock} exists: a git process is running in {p.tree.path}, or one crashed; "
            f"when none runs: rm -f {lock}"
            for p, lock in held
        )
        names = " ".join(p.upstream.name for p, _ in held)
        raise IOFailure(
            f"git lock file held: refusing to touch any tree:\n{lines}\n  then: bash {rerun} --only {names}"
        )


def check(
    lock: Lock, sources_dir: Path, patches_dir: Path | None = None, names: list[str] | None = None, log=print
) -> list[TreePlan]:
    """Dry-run the whole series on every tree; change nothing. Raises on any problem."""
    plans = _plans(lock, sources_dir, patches_dir, names, log)
    for p in plans:
        verb = "already applied" if p.state == APPLIED else "would apply"
        log(f"{p.upstream.name:14} {verb} {p.n} patch(es) (series {p.series.digest})")
    return plans


def apply(
    lock: Lock, sources_dir: Path, patches_dir: Path | None = None, names: list[str] | None = None, log=print
) -> list[TreePlan]:
    """Apply every series, all or nothing; a second run changes nothing.

    Raises:
        TreeStateError: a tree is missing, at another pin, modified or partially patched (nothing
            touched). ConflictError: a patch does not apply (nothing touched, or everything rolled
            back). VerifyError: a tree did not reach the expected tree hash (rolled back).
    """
    plans = _plans(lock, sources_dir, patches_dir, names, log)
    touched: list[tuple[TreePlan, list[int]]] = []  # (tree, [patches fully applied]) in apply order
    with signals.deferred():
        try:
            for p in plans:
                if p.state == APPLIED:
                    log(f"{p.upstream.name:14} already applied: {p.n} patch(es), nothing to do")
                    continue
                done = [0]
                touched.append((p, done))
                for patch in p.series.patches:
                    signals.check()
                    p.tree.apply(f"patches/{p.upstream.name}/{patch.name}", patch.data)
                    done[0] += 1
                got = p.tree.worktree_hash()
                if got != p.expected[-1]:
                    diff = p.tree.changed_files(p.expected[-1], got)
                    raise VerifyError(
                        f"{p.tree.path}: after applying, the tree differs from what the series defines:\n"
                        + _file_list(diff)
                    )
                log(f"{p.upstream.name:14} applied {p.n} patch(es) (series {p.series.digest})")
            signals.check()  # a signal during the last tree's last step: put every tree back, as it said
        except BaseException as exc:
            why = _why(exc)
            failed = _rollback(touched, log, why)
            if failed:
                raise RollbackIncomplete(
                    f"{why}\nThe rollback could not restore every tree:\n{failed}\n"
                    "Every other tree is back at its baseline."
                ) from None
            if isinstance(exc, PatchApplyError):
                raise ConflictError(f"{exc.label} failed to apply: {exc.detail}\nEvery tree was rolled back.") from None
            raise
    return plans


def _why(exc: BaseException) -> str:
    if isinstance(exc, signals.Interrupted):
        return f"interrupted by {exc}"
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    if isinstance(exc, PatchApplyError):
        return f"{exc.label} failed to apply: {exc.detail}"
    return str(exc) or type(exc).__name__


def _restore(p: TreePlan, done: int) -> str | None:
    """Put one tree back to its baseline, trying every way that can work; None when it is back,
    else the last reason it is not. ``done``: patches of its series fully applied."""
    t, base = p.tree, p.expected[0]
    reasons: list[str] = []

    def at_baseline() -> bool:
        try:
            return t.worktree_hash() == base
        except (NpuRlError, GitCommandError, OSError) as exc:
            reasons.append(f"cannot hash the tree: {exc}")
            return False

    if at_baseline():
        return None  # nothing was written (the first patch failed before writing anything)
    patches = [(q.name, q.data) for q in p.series.patches[:done]]
    for how in (
        t.reset_to_baseline,  # git reset --hard, git clean
        lambda: (t.clean(), t.reset_to_baseline()),  # a full disk: free the new files' space first
        lambda: t.unapply(patches),  # a held index.lock: git apply -R writes no index
    ):
        try:
            how()
        except (NpuRlError, GitCommandError, OSError) as exc:
            reasons.append(str(exc).strip())
            continue
        if at_baseline():
            return None
    return reasons[-1] if reasons else "the tree still differs from its baseline"


def _rollback(touched: list[tuple[TreePlan, list[int]]], log, why: str) -> str:
    """Restore every touched tree (all are tried, whatever fails); return the lines naming those
    that could not be restored, each with the command that fixes it ("" when all are back)."""
    if not touched:
        return ""
    log(f"{why.splitlines()[0]}: putting {', '.join(p.upstream.name for p, _ in touched)} back at the baseline")
    failed, restored = [], []
    for p, done in reversed(touched):
        reason = _restore(p, done[0])
        if reason is None:
            restored.append(p.upstream.name)
            continue
        first = reason.splitlines()[0]
        failed.append(
            f"  {p.upstream.name}: {first}\n    then: bash apply_all_patches.sh --revert --only {p.upstream.name}"
        )
    if restored:
        log(f"rolled back {', '.join(reversed(restored))} to the baseline")
    return "\n".join(reversed(failed))


def revert(
    lock: Lock,
    sources_dir: Path,
    patches_dir: Path | None = None,
    names: list[str] | None = None,
    force: bool = False,
    log=print,
) -> list[TreePlan]:
    """Return every tree present to its exact baseline.

    Hand modifications are first saved as a binary diff under ``sources/.backup/`` (path printed).
    A tree with commits on top of its baseline is refused unless ``force``.
    """
    plans, problems = [], []
    for up in select(lock, names):
        _refuse_pending_bump(sources_dir, up.name)
        plan = inspect(up, sources_dir, patches_dir, dry_run=False)
        if plan.state == MISSING:
            continue
        if plan.state in (FOREIGN, WRONG_PIN) or (plan.state == HEAD_MOVED and not force):
            problems.append(f"  {up.name}: {plan.detail}")
        plans.append(plan)
    if problems:
        raise TreeStateError("refusing to revert:\n" + "\n".join(problems))
    todo = []
    for p in plans:
        signals.check()
        base = p.tree.baseline_tree()
        current = p.tree.worktree_hash()
        if current == base and p.state != HEAD_MOVED:
            log(f"{p.upstream.name:14} already at its baseline")
            continue
        todo.append((p, base, current))
    _refuse_held_index_locks([p for p, _, _ in todo], "apply_all_patches.sh --revert")
    failed: list[tuple[str, NpuRlError]] = []
    with signals.deferred("finishing the tree being reverted"):
        for p, base, current in todo:
            signals.check()  # between trees: each one ends at its baseline or as it was
            try:
                _revert_one(p, base, current, sources_dir, log)
            except (IOFailure, VerifyError) as exc:
                failed.append((p.upstream.name, exc))
    if failed:
        lines = "\n".join(
            f"  {name}: {str(exc).splitlines()[0]}\n    then: bash apply_all_patches.sh --revert --only {name}"
            for name, exc in failed
        )
        kind = IOFailure if all(isinstance(e, IOFailure) for _, e in failed) else VerifyError
        raise kind(f"could not revert every tree (the others are at their baseline):\n{lines}")
    return plans


def _revert_one(p: TreePlan, base: str, current: str, sources_dir: Path, log) -> None:
    """Reset one tree to its baseline, first saving hand changes (not the series') as a diff."""
    t = p.tree
    try:
        expected = t.expected_trees([(q.name, q.data) for q in p.series.patches])
    except PatchApplyError:
        expected = [base]
    if current not in expected:
        stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        backup = sources_dir / ".backup" / f"{p.upstream.name}-{stamp}.diff"
        k, changed = closest_series_state(t, expected, current)
        n = len(expected) - 1
        try:
            backup.parent.mkdir(parents=True, exist_ok=True)
            backup.write_text(t.binary_diff(expected[k], current), encoding="utf-8")
        except OSError as exc:  # the tree is left as it is: its changes are not saved yet
            raise IOFailure.from_os_error(exc, f"saving the changes of {t.path} before reverting it") from None
        again = (
            "bash apply_all_patches.sh, then" if k == n and n else "" if k == 0 else f"re-apply patches 1..{k}, then"
        )
        log(
            f"{p.upstream.name:14} saved your changes to {len(changed)} file(s) (against "
            f"{_state_name(k, n)}) to {backup}:\n{_file_list(changed)}\n"
            f"    to get them back: {again + ' ' if again else ''}git apply {backup} (in {t.path})"
        )
    t.reset_to_baseline()
    if t.worktree_hash() != base:
        raise VerifyError(f"{t.path}: revert did not restore the baseline tree {base}")
    log(f"{p.upstream.name:14} reverted to baseline {p.upstream.identity}")


@dataclass
class StatusRow:
    name: str
    version: str
    source: str
    baseline: str
    applied: str
    digest: str
    ok: bool
    state: str = ""
    patches: int = 0


def status(
    lock: Lock, sources_dir: Path, patches_dir: Path | None = None, names: list[str] | None = None
) -> list[StatusRow]:
    """One row per upstream: version, source, baseline ok?, patches applied n/m, series digest."""
    rows = []
    for up in select(lock, names):
        series = load_series(up.name, patches_dir)
        n = len(series.patches)
        digest = series.digest if n else "-"
        try:
            plan = inspect(up, sources_dir, patches_dir, dry_run=True)
        except ConflictError:
            rows.append(StatusRow(up.name, up.version, "?", "ok", f"conflict/{n}", digest, False))
            continue
        if plan.state == MISSING:
            rows.append(StatusRow(up.name, up.version, "-", "not downloaded", "-", digest, True, MISSING, n))
            continue
        source = plan.tree.baseline_trailers().get(SOURCE_TRAILER, "?") if plan.state != FOREIGN else "?"
        if plan.state in (FOREIGN, WRONG_PIN):
            found = plan.tree.identity() if plan.state == WRONG_PIN else "not ours"
            rows.append(StatusRow(up.name, up.version, source, f"NO ({found})", "-", digest, False))
            continue
        if plan.state == HEAD_MOVED:
            rows.append(StatusRow(up.name, up.version, source, "ok", "commits on top", digest, False))
            continue
        applied = f"{plan.applied_count}/{n}" if plan.state != MODIFIED else f"modified/{n}"
        ok = plan.state in (PRISTINE, APPLIED)
        rows.append(StatusRow(up.name, up.version, source, "ok", applied, digest, ok, plan.state, n))
    return rows


def status_problems(rows: list[StatusRow]) -> list[str]:
    """Why a set of trees is not ready to use or to re-apply; empty when consistent: every tree at
    its baseline or fully applied, and the patched trees all applied or all at their baseline (a mix
    is what an interrupted or raced set-up leaves)."""
    problems = [f"{r.name}: {r.baseline if not r.baseline.startswith('ok') else r.applied}" for r in rows if not r.ok]
    patched = [r for r in rows if r.patches and r.ok and r.state in (PRISTINE, APPLIED)]
    applied = [r.name for r in patched if r.state == APPLIED]
    pristine = [r.name for r in patched if r.state == PRISTINE]
    if applied and pristine:
        problems.append(
            f"mixed: {', '.join(applied)} applied while {', '.join(pristine)} at the baseline (an interrupted or "
            "concurrent set-up?): run 'bash apply_all_patches.sh' to apply the rest, or '--revert' for none"
        )
    missing = [r.name for r in rows if r.patches and r.baseline == "not downloaded"]
    if missing and patched:
        problems.append(f"not downloaded: {', '.join(missing)}: run 'bash download_sources.sh'")
    return problems


__all__ = [
    "apply",
    "check",
    "revert",
    "status",
    "status_problems",
    "inspect",
    "TreePlan",
    "StatusRow",
    "IDENTITY_TRAILER",
]
