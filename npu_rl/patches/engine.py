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

from npu_rl.errors import ConflictError, TreeStateError, VerifyError
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
    changed = t.changed_files(plan.expected[0], plan.current)
    plan.detail = (
        f"{t.path} was modified outside the patch series; files that differ from the baseline:\n"
        f"{_file_list(changed)}\n    run apply_all_patches.sh --revert (your changes are saved to a "
        "backup diff) or export them as a patch"
    )
    return plan


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
    return plans


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
    touched: list[TreePlan] = []
    try:
        for p in plans:
            if p.state == APPLIED:
                log(f"{p.upstream.name:14} already applied: {p.n} patch(es), nothing to do")
                continue
            touched.append(p)
            for patch in p.series.patches:
                p.tree.apply(f"patches/{p.upstream.name}/{patch.name}", patch.data)
            got = p.tree.worktree_hash()
            if got != p.expected[-1]:
                diff = p.tree.changed_files(p.expected[-1], got)
                raise VerifyError(
                    f"{p.tree.path}: after applying, the tree differs from what the series defines:\n{_file_list(diff)}"
                )
            log(f"{p.upstream.name:14} applied {p.n} patch(es) (series {p.series.digest})")
    except BaseException as exc:
        _rollback(touched, log)
        if isinstance(exc, PatchApplyError):
            raise ConflictError(f"{exc.label} failed to apply: {exc.detail}\nEvery tree was rolled back.") from None
        raise
    return plans


def _rollback(touched: list[TreePlan], log) -> None:
    failed = []
    for p in touched:
        p.tree.reset_to_baseline()
        if p.tree.worktree_hash() != p.expected[0]:
            failed.append(str(p.tree.path))
    if touched:
        log(f"rolled back {', '.join(p.upstream.name for p in touched)} to the baseline")
    if failed:
        raise VerifyError(f"rollback did not restore the baseline of: {', '.join(failed)}")


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
    for p in plans:
        t = p.tree
        base = t.baseline_tree()
        current = t.worktree_hash()
        if current == base and p.state != HEAD_MOVED:
            log(f"{p.upstream.name:14} already at its baseline")
            continue
        try:
            expected = t.expected_trees([(q.name, q.data) for q in p.series.patches])
        except PatchApplyError:
            expected = [base]
        if current not in expected:
            stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
            backup = sources_dir / ".backup" / f"{p.upstream.name}-{stamp}.diff"
            backup.parent.mkdir(parents=True, exist_ok=True)
            backup.write_text(t.binary_diff(base, current), encoding="utf-8")
            log(
                f"{p.upstream.name:14} saved the tree as a diff from the pristine baseline (series changes "
                f"included) to {backup}; after --revert, 'git apply' it in {t.path} to get the tree back"
            )
        t.reset_to_baseline()
        if t.worktree_hash() != base:
            raise VerifyError(f"{t.path}: revert did not restore the baseline tree {base}")
        log(f"{p.upstream.name:14} reverted to baseline {p.upstream.identity}")
    return plans


@dataclass
class StatusRow:
    name: str
    version: str
    source: str
    baseline: str
    applied: str
    digest: str
    ok: bool


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
            rows.append(StatusRow(up.name, up.version, "-", "not downloaded", "-", digest, True))
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
        rows.append(StatusRow(up.name, up.version, source, "ok", applied, digest, plan.state in (PRISTINE, APPLIED)))
    return rows


__all__ = ["apply", "check", "revert", "status", "inspect", "TreePlan", "StatusRow", "IDENTITY_TRAILER"]
