"""``apply_all_patches.sh bump NAME VERSION``: move one upstream to a new release, all or nothing.

The README's "Bumping a pin" steps as one resumable command:

1. **Resolve** the release: the archive from the package index the user configured (its sha256
   computed here from the downloaded bytes), the tag (the old ``ref`` with the old version
   replaced, or ``--ref``) and its commit (``git ls-remote`` on the lock's repository or on
   ``--git-url``, a mirror). Git-only upstreams are fetched at that commit.
2. **Stage** everything in ``sources/.bump/NAME-VERSION/``: the new baseline tree (made exactly as
   ``download_sources.sh`` makes it), the old baseline and the old series as commits (so git has
   every blob a three-way merge needs).
3. **Replay** the series onto the new baseline, one ``git cherry-pick`` (three-way merge) per
   patch. A patch whose *reverse* applies cleanly is already contained upstream: it is skipped
   and proposed for dropping (``--drop NAME`` confirms). The first conflict stops the bump with
   the patch, files and hunks named; the staged tree is left mid cherry-pick, so the maintainer
   resolves with git (``git add``, ``git cherry-pick --continue``, or further commits) and runs
   the same command again, which continues where it stopped.
4. **Export** the commits as the new series (patch numbers kept), write the new lock entry (the
   note kept, what changed appended) with tomlkit, and bring the new tree to the state the old
   one was in (pristine or applied).
5. **Switch**: a journal (``COMMIT``) is written, then the series, the tree and ``sources.lock``
   are switched and the README's stack table regenerated. A run killed during the switch is
   finished by the next run (and ``apply_all_patches.sh`` refuses the tree until then).

Until step 5 nothing outside the staging folder changes: an interrupted or conflicting bump
leaves the old pin fully usable. ``--abort`` deletes the staging folder. A bump to the version
the lock already pins is a no-op. Two bumps of one upstream at once: the second is refused.
"""

from __future__ import annotations

import datetime as _dt
import fcntl
import json
import os
import re
import shutil
import signal
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from npu_rl.errors import ConflictError, NpuRlError, SourceError, SourceUnreachable, TreeStateError, UsageError
from npu_rl.gittree import BASELINE_TAG, FIXED_DATE, Tree, git, git_error_text, gitpython
from npu_rl.lock import LOCK_PATH, PypiArchive, Upstream, load_lock, stack_table
from npu_rl.patches import engine
from npu_rl.patches.export import export, install_series, patch_message
from npu_rl.patches.series import PATCHES_DIR, Series, load_series
from npu_rl.table import splice_table

STAGE_DIR = ".bump"
COMMIT_MARK = "COMMIT"
STATE_FILE = "state.json"
OLD_BASE_REF = "refs/npu-rl/old-baseline"
RESULT_REF = "refs/npu-rl/bumped-series"
_DATES = {"GIT_AUTHOR_DATE": FIXED_DATE, "GIT_COMMITTER_DATE": FIXED_DATE}
#: Test hook: ``NPU_RL_TEST_KILL_AT=<point>`` makes the process SIGKILL itself at that point, so the
#: tests can interrupt a bump exactly where a power cut or ``kill -9`` could.
KILL_ENV = "NPU_RL_TEST_KILL_AT"


class BumpDecision(NpuRlError):
    """The replay finished but needs the maintainer's decision (patches upstream contains)."""

    exit_code = 6


def _kill_point(point: str) -> None:
    if os.environ.get(KILL_ENV) == point:
        os.kill(os.getpid(), signal.SIGKILL)


@dataclass
class BumpState:
    """What a bump has done so far (``state.json`` in the staging folder)."""

    name: str
    from_version: str
    to_version: str
    ref: str
    commit: str
    commit_how: str
    source: str  # "pypi <filename>" or "git <commit>"
    project: str = ""
    filename: str = ""
    sha256: str = ""
    old_state: str = engine.PRISTINE
    old_series: list[str] = field(default_factory=list)
    old_commits: list[str] = field(default_factory=list)
    next: int = 0
    picked: list[str] = field(default_factory=list)
    by_hand: list[str] = field(default_factory=list)
    contained: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    conflict: str = ""
    head_at_conflict: str = ""
    pending: str = ""  # the patch being cherry-picked, and HEAD before it (a kill may come in between)
    head_before: str = ""
    staged: bool = False  # the new baseline and the old series are in the staging folder
    command: str = ""  # the first run's command line (its choices hold for the whole bump)

    def save(self, stage: Path) -> None:
        tmp = stage / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, stage / STATE_FILE)

    @classmethod
    def load(cls, stage: Path) -> BumpState | None:
        path = stage / STATE_FILE
        return cls(**json.loads(path.read_text(encoding="utf-8"))) if path.exists() else None


@dataclass
class BumpOptions:
    """The command line's choices (see ``build_maintainer_parser``)."""

    ref: str | None = None
    filename: str | None = None
    git_url: str | None = None
    commit: str | None = None
    no_commit: bool = False
    drop: tuple[str, ...] = ()
    abort: bool = False
    downgrade: bool = False

    def command(self, name: str, version: str) -> str:
        """The command line that repeats this request (printed where a rerun is asked for)."""
        parts = ["bash apply_all_patches.sh bump", name, version]
        for flag, value in (
            ("--ref", self.ref),
            ("--filename", self.filename),
            ("--git-url", self.git_url),
            ("--commit", self.commit),
        ):
            if value:
                parts += [flag, value]
        parts += ["--no-commit"] * self.no_commit + ["--downgrade"] * self.downgrade
        return " ".join(parts)


@contextmanager
def _exclusive(path: Path, what: str) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+", encoding="utf-8") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            raise TreeStateError(
                f"another bump of {what} is running (pid {fh.read().strip() or '?'}); wait for it"
            ) from None
        fh.seek(0)
        fh.truncate()
        fh.write(str(os.getpid()))
        fh.flush()
        yield


def _replace_version(text: str, old: str, new: str, what: str, flag: str) -> str:
    if old not in text:
        raise UsageError(f"cannot derive the new {what} from {text!r} (it does not contain {old!r}); give {flag}")
    return text.replace(old, new)


# --- resolving the release ----------------------------------------------------------------------
def resolve_commit(url: str, ref: str, cwd: Path) -> str:
    """The commit that tag (peeled) or branch ``ref`` names in repository ``url``.

    Raises:
        SourceUnreachable: git cannot reach ``url``. SourceError: ``url`` has no such ref.
    """
    from npu_rl.sources import GIT_TIMEOUT_S

    try:
        out = git(
            cwd,
            "ls-remote",
            url,
            f"refs/tags/{ref}",
            f"refs/tags/{ref}^{{}}",
            f"refs/heads/{ref}",
            timeout=GIT_TIMEOUT_S,
        )
    except gitpython.GitCommandError as exc:
        msg = git_error_text(exc)
        raise SourceUnreachable(f"cannot reach {url} ({msg.splitlines()[-1] if msg else 'no answer'})") from None
    refs = dict(reversed(line.split("\t", 1)) for line in out.splitlines() if "\t" in line)
    for key in (f"refs/tags/{ref}^{{}}", f"refs/tags/{ref}", f"refs/heads/{ref}"):
        if key in refs:
            return refs[key]
    raise SourceError(f"{url} has no tag or branch {ref!r}; give the right one with --ref")


def _short(exc: Exception) -> str:
    """The last line of an error (git's own reason), without the command around it."""
    return str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__


def _resolve(up: Upstream, version: str, opts: BumpOptions, cwd: Path, log) -> tuple[Upstream, BumpState]:
    """Find the release: its index archive first (sha256 computed), then the tag's commit."""
    ref = opts.ref or _replace_version(up.ref, up.version, version, "git ref", "--ref")
    state = BumpState(up.name, up.version, version, ref, "", "", source="")
    pypi = None
    if up.pypi:
        from npu_rl.sources import Downloader, cache_dir

        filename = opts.filename or _replace_version(
            up.pypi.filename, up.version, version, "archive name", "--filename"
        )
        archive, sha, got = Downloader(cache_dir(), log=log).fetch_release(up.name, up.pypi.project, filename)
        log(f"{up.name}: {filename} {got}; sha256 {sha} (computed from {archive})")
        pypi = PypiArchive(up.pypi.project, filename, sha)
        state.project, state.filename, state.sha256, state.source = up.pypi.project, filename, sha, f"pypi {filename}"
    url = opts.git_url or up.git
    commit, how = "", ""
    try:
        commit = resolve_commit(url, ref, cwd)
        how = f"resolved from {ref} at {url}"
        if opts.commit and opts.commit != commit:
            raise SourceError(f"--commit {opts.commit} but {url} says {ref} is {commit}; refused")
    except SourceUnreachable as exc:
        if opts.commit:
            commit, how = opts.commit, f"given with --commit, not verified ({url} unreachable: {_short(exc)})"
        elif opts.no_commit and up.pypi:
            how = f"not resolved ({url} unreachable: {_short(exc)})"
        else:
            raise SourceUnreachable(
                f"{exc}: cannot resolve {up.name} {ref}'s commit. Give a reachable mirror with --git-url, "
                "the commit with --commit SHA, or (index archives only) --no-commit to pin the archive alone"
            ) from None
    state.commit, state.commit_how = commit, how
    if not up.pypi:
        if not commit:
            raise SourceUnreachable(f"{up.name} is git only: its commit must be resolved (--git-url or --commit)")
        state.source = f"git {commit[:12]}"
    log(f"{up.name}: {ref} = {commit or 'no commit'} ({how})")
    return replace(up, version=version, ref=ref, commit=commit, pypi=pypi), state


def _check_request(up: Upstream, version: str, series: Series, opts: BumpOptions) -> None:
    """Refuse a malformed request before anything is downloaded or staged (UsageError)."""
    from packaging.version import InvalidVersion, Version

    try:
        new, old = Version(version), Version(up.version)
    except InvalidVersion:
        raise UsageError(f"version {version!r} is not a PEP 440 version (e.g. 0.9.1, without a 'v')") from None
    if str(new) != version:
        raise UsageError(f"version {version!r} is not a PEP 440 version as the index names it: write {str(new)!r}")
    if new < old and not opts.downgrade:
        raise UsageError(f"{up.name} {version} is older than the pinned {up.version}; pass --downgrade if you mean it")
    if opts.commit and not re.fullmatch(r"[0-9a-f]{40}", opts.commit):
        raise UsageError(f"--commit {opts.commit!r} must be a full 40-hex-digit SHA")
    names = [p.name for p in series.patches]
    for name in opts.drop:
        if name not in names:
            raise UsageError(f"--drop {name}: not a patch of the {up.name} series ({', '.join(names) or 'empty'})")


def _new_upstream(up: Upstream, st: BumpState) -> Upstream:
    pypi = PypiArchive(st.project, st.filename, st.sha256) if st.filename else None
    return replace(up, version=st.to_version, ref=st.ref, commit=st.commit, pypi=pypi)


# --- staging ------------------------------------------------------------------------------------
def _build_stage(up: Upstream, new: Upstream, sources_dir: Path, series: Series, st: BumpState, stage: Path) -> None:
    """New baseline tree in ``stage/tree/NAME``, with the old baseline and old series as commits."""
    from npu_rl.sources import Downloader, build_from_archive, build_from_git, cache_dir

    trees = stage / "tree"
    if (trees / up.name).exists():
        shutil.rmtree(trees / up.name)  # a half-built one from an interrupted run
    trees.mkdir(parents=True, exist_ok=True)
    if new.pypi:
        archive = Downloader(cache_dir()).archives / new.pypi.filename
        build_from_archive(new, archive, trees, force=False)
    else:
        build_from_git(new, trees, force=False)
    _kill_point("after-baseline")
    path = trees / up.name
    st.old_series, st.old_commits = [], []
    if not series.patches:
        return  # nothing to replay: the old tree is not needed
    git(path, "fetch", "--quiet", "--no-tags", str(sources_dir / up.name), f"refs/tags/{BASELINE_TAG}:{OLD_BASE_REF}")
    commits, parent = [], git(path, "rev-parse", OLD_BASE_REF)

    def build(env):
        nonlocal parent
        git(path, "read-tree", OLD_BASE_REF, env=env)
        for p in series.patches:
            git(path, "apply", "--cached", "--whitespace=nowarn", "-", env=env, stdin=p.data)
            tree = git(path, "write-tree", env=env)
            parent = git(path, "commit-tree", tree, "-p", parent, "-m", patch_message(p), env={**env, **_DATES})
            commits.append(parent)

    Tree(path)._with_temp_index(build, seed_from_real=False)
    st.old_series = [p.name for p in series.patches]
    st.old_commits = commits


def _conflict_report(path: Path, data: bytes) -> str:
    files = git(path, "diff", "--name-only", "--diff-filter=U").split()
    lines = []
    for f in files:
        try:
            text = (path / f).read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            text = []
        marks = [str(i) for i, ln in enumerate(text, 1) if ln.startswith("<<<<<<< ")]
        lines.append(f"      {f}: conflict markers at line(s) {', '.join(marks) or '?'}")
    plain = ""

    def check(env):
        nonlocal plain
        git(path, "read-tree", "HEAD", env=env)
        try:
            git(path, "apply", "--cached", "--check", "--whitespace=nowarn", "-", env=env, stdin=data)
        except gitpython.GitCommandError as exc:
            plain = "\n".join(f"      {ln}" for ln in git_error_text(exc).splitlines()[:6])

    Tree(path)._with_temp_index(check, seed_from_real=False)
    return "\n".join(lines) + (f"\n    the hunk(s) that no longer fit (git apply):\n{plain}" if plain else "")


def _tree_busy(path: Path) -> str:
    if (path / ".git" / "CHERRY_PICK_HEAD").exists():
        return "a cherry-pick is in progress"
    if git(path, "status", "--porcelain", "--untracked-files=normal"):
        return "it has uncommitted changes"
    return ""


def _replay(stage: Path, st: BumpState, series: Series, opts: BumpOptions, log) -> None:
    path = stage / "tree" / st.name
    by_name = {p.name: p for p in series.patches}
    for name in opts.drop:
        if name not in st.dropped:
            st.dropped.append(name)
    if st.conflict:
        busy = _tree_busy(path)
        if busy:
            raise TreeStateError(
                f"{path}: {busy}. Finish resolving {st.conflict} there (git add FILES; git cherry-pick --continue), "
                f"or 'git cherry-pick --abort' and rerun with --drop {st.conflict}, or rerun with --abort"
            )
        if git(path, "rev-parse", "HEAD") != st.head_at_conflict:
            log(f"{st.conflict}: resolved by hand in {path}")
            st.by_hand.append(st.conflict)
            st.picked.append(st.conflict)
            st.next += 1
        st.conflict, st.head_at_conflict = "", ""
        st.save(stage)
    elif _tree_busy(path):
        # No conflict was handed to a person, so only this tool wrote here: a run was killed inside git.
        if (path / ".git" / "CHERRY_PICK_HEAD").exists():
            git(path, "cherry-pick", "--abort")
        git(path, "reset", "--quiet", "--hard", "HEAD")
        git(path, "clean", "--quiet", "-d", "--force")
        log(f"{path}: cleaned up after an interrupted run")
    while st.next < len(st.old_series):
        name = st.old_series[st.next]
        patch = by_name[name]
        head = git(path, "rev-parse", "HEAD")
        if name in st.dropped:
            log(f"{name}: dropped (--drop)")
        elif st.pending == name and head != st.head_before:
            st.picked.append(name)  # picked just before a kill, not yet recorded
            log(f"{name}: replayed (before the interruption)")
        elif _reverse_applies(path, patch.data):
            if name not in st.contained:
                st.contained.append(name)
            log(f"{name}: already contained in {st.name} {st.to_version} (its reverse applies cleanly)")
        else:
            st.pending, st.head_before = name, head
            st.save(stage)
            try:
                git(path, "cherry-pick", "--allow-empty-message", st.old_commits[st.next], env=_DATES)
                _kill_point("mid-pick")
            except gitpython.GitCommandError as exc:
                if "is now empty" in git_error_text(exc) or "nothing to commit" in git_error_text(exc):
                    git(path, "cherry-pick", "--skip")
                    st.contained.append(name)
                    log(f"{name}: already contained in {st.name} {st.to_version} (it changes nothing)")
                else:
                    st.conflict, st.head_at_conflict = name, head
                    st.save(stage)
                    report = _conflict_report(path, patch.data)
                    raise ConflictError(
                        f"{name} conflicts with {st.name} {st.to_version}:\n{report}\n"
                        f"  The old pin ({st.name} {st.from_version}) is untouched. To go on: in {path}, resolve the "
                        "files, 'git add' them and 'git cherry-pick --continue' (the patch header stays the "
                        f"message), then rerun: {st.command}. To drop the patch instead: 'git cherry-pick --abort' "
                        f"and rerun with --drop {name}. To give up: rerun with --abort."
                    ) from None
            else:
                st.picked.append(name)
                log(f"{name}: replayed")
        st.pending, st.head_before = "", ""
        st.next += 1
        st.save(stage)
        _kill_point("during-replay")


def _reverse_applies(path: Path, data: bytes) -> bool:
    try:
        git(path, "apply", "--check", "--reverse", "--whitespace=nowarn", "-", stdin=data)
    except gitpython.GitCommandError:
        return False
    return True


# --- the new lock entry -------------------------------------------------------------------------
def _note_addition(st: BumpState, series_after: Series) -> str:
    date = _dt.date.today().isoformat()
    parts = [f"Bumped from {st.from_version} on {date} with 'apply_all_patches.sh bump'"]
    if st.filename:
        parts.append(f"sha256 computed from {st.filename} as downloaded")
    parts.append(f"commit {st.commit_how}")
    dropped = sorted(set(st.dropped) | set(st.contained))
    if dropped:
        parts.append("patches dropped (upstream contains them): " + ", ".join(dropped))
    if st.by_hand:
        parts.append("refreshed by hand: " + ", ".join(st.by_hand))
    parts.append(f"series: {len(series_after.patches)} patch(es)")
    return textwrap.fill("; ".join(parts) + ".", width=100, break_on_hyphens=False, break_long_words=False)


def write_lock_entry(lock_text: str, new: Upstream, note_addition: str) -> str:
    """Return ``lock_text`` with the ``[[upstream]]`` table of ``new.name`` set to ``new``
    (comments and the other tables kept byte for byte; the note kept, ``note_addition`` appended)."""
    try:
        import tomlkit
    except ImportError:
        raise UsageError("bump needs tomlkit: pip install -r constraints/tools.txt (or install_stack.sh)") from None
    doc = tomlkit.parse(lock_text)
    for table in doc["upstream"]:
        if table["name"] == new.name:
            table["version"] = new.version
            table["ref"] = new.ref
            if new.commit:
                table["commit"] = new.commit
            elif "commit" in table:
                del table["commit"]
            if new.pypi:
                table["pypi"]["filename"] = new.pypi.filename
                table["pypi"]["sha256"] = new.pypi.sha256
            note = str(table.get("note", "")).rstrip("\n")
            table["note"] = tomlkit.string((note + "\n" if note else "") + note_addition, multiline=True)
            return tomlkit.dumps(doc)
    raise TreeStateError(f"sources.lock has no [[upstream]] named {new.name!r}")


def regenerate_readme(readme: Path, lock_path: Path) -> bool:
    """Rewrite the stack table between ``<!-- stack-table:begin/end -->`` in ``readme`` from the
    lock. Returns False (and changes nothing) when the file or its markers are missing."""
    if not readme.is_file():
        return False
    text = readme.read_text(encoding="utf-8")
    try:
        new = splice_table(text, "stack", stack_table(load_lock(lock_path)))
    except KeyError:
        return False
    if new != text:
        tmp = readme.with_name(f".{readme.name}.tmp")
        tmp.write_text(new, encoding="utf-8")
        os.replace(tmp, readme)
    return True


# --- the switch ---------------------------------------------------------------------------------
def _prepare_switch(up, new, st, stage, lock_path, patches_root, log) -> None:
    path = stage / "tree" / st.name
    if git(path, "for-each-ref", RESULT_REF):  # an earlier run got this far: back to the replayed commits
        git(path, "reset", "--quiet", "--hard", RESULT_REF)
        git(path, "clean", "--quiet", "-d", "--force")
    out = stage / "patches"
    if out.exists():
        shutil.rmtree(out)
    (out / st.name).mkdir(parents=True)
    if git(path, "rev-list", "--count", f"refs/tags/{BASELINE_TAG}..HEAD") != "0":
        export(new, stage / "tree", patches_dir=out, log=log, numbers_from=patches_root)
    else:
        (out / st.name / "series").write_text(
            f"# Patch series for {st.name}: empty (every patch is contained upstream since {st.to_version}).\n",
            encoding="utf-8",
        )
    series = load_series(st.name, out)
    git(path, "update-ref", RESULT_REF, "HEAD")
    tree = Tree(path)
    tree.reset_to_baseline()
    _kill_point("in-prepare")
    plan = engine.inspect(new, stage / "tree", out, series=series)  # raises if the new series does not apply
    if st.old_state == engine.APPLIED and series.patches:
        for p in series.patches:
            tree.apply(f"patches/{st.name}/{p.name}", p.data)
        if tree.worktree_hash() != plan.expected[-1]:
            raise TreeStateError(f"{path}: the new series did not reach its expected tree; nothing was switched")
    text = write_lock_entry(lock_path.read_text(encoding="utf-8"), new, _note_addition(st, series))
    (stage / "sources.lock").write_text(text, encoding="utf-8")
    got = load_lock(stage / "sources.lock").get(st.name)
    if replace(got, note="") != replace(new, note=""):
        raise TreeStateError(f"the rewritten lock entry reads back as {got}, not {new}; nothing was switched")
    if git(path, "for-each-ref", OLD_BASE_REF):
        git(path, "update-ref", "-d", OLD_BASE_REF)
    (stage / COMMIT_MARK).write_text(
        json.dumps({"lock": str(lock_path), "patches": str(patches_root / st.name), "version": st.to_version}) + "\n",
        encoding="utf-8",
    )
    _kill_point("after-journal")


def _switch(stage: Path, sources_dir: Path, st: BumpState, readme: Path | None, log) -> None:
    """Carry out the journal in ``stage/COMMIT``; every step can be redone after a kill."""
    journal = json.loads((stage / COMMIT_MARK).read_text(encoding="utf-8"))
    lock_path, patches = Path(journal["lock"]), Path(journal["patches"])
    install_series(stage / "patches" / st.name, patches)
    _kill_point("after-patches")
    new_tree, target = stage / "tree" / st.name, sources_dir / st.name
    if new_tree.exists():
        if target.exists():
            os.replace(target, stage / "old-tree")
        _kill_point("between-trees")
        os.replace(new_tree, target)
    tmp = lock_path.with_name(f".{lock_path.name}.tmp")
    shutil.copyfile(stage / "sources.lock", tmp)
    os.replace(tmp, lock_path)
    _kill_point("after-lock")
    if readme is not None and regenerate_readme(readme, lock_path):
        log(f"regenerated the stack table in {readme}")
    trash = stage.with_name(f".trash-{stage.name}-{os.getpid()}")
    os.replace(stage, trash)
    shutil.rmtree(trash, ignore_errors=True)


def staged_bumps(sources_dir: Path) -> list[str]:
    """One line per bump staged under ``sources_dir/.bump`` (for ``--status``): upstream, versions,
    where it stands (switching, waiting at a conflict or for --drop, or mid-replay)."""
    root = sources_dir / STAGE_DIR
    lines = []
    for state_file in sorted(root.glob(f"*/{STATE_FILE}")) if root.is_dir() else []:
        try:
            st = BumpState.load(state_file.parent)
        except (ValueError, TypeError, OSError):
            lines.append(f"{state_file.parent.name}: unreadable state (rerun the bump, or --abort)")
            continue
        if (state_file.parent / COMMIT_MARK).exists():
            where = "interrupted while switching: rerun to finish"
        elif st.conflict:
            where = f"stopped at a conflict in {st.conflict}"
        elif st.next >= len(st.old_series) and [n for n in st.contained if n not in st.dropped]:
            where = "waiting for --drop of the patches upstream contains"
        else:
            where = f"{st.next} of {len(st.old_series)} patch(es) replayed"
        lines.append(f"{st.name} {st.from_version} -> {st.to_version} staged in {state_file.parent}: {where}")
    return lines


def pending_switch(sources_dir: Path, name: str) -> str | None:
    """The version a bump of ``name`` was switching to when it was interrupted, else None."""
    root = sources_dir / STAGE_DIR
    for mark in sorted(root.glob(f"{name}-*/{COMMIT_MARK}")) if root.is_dir() else []:
        try:
            return json.loads(mark.read_text(encoding="utf-8"))["version"]
        except (ValueError, KeyError, OSError):
            return mark.parent.name[len(name) + 1 :]
    return None


# --- the command --------------------------------------------------------------------------------
def bump(
    name: str,
    version: str,
    sources_dir: Path,
    patches_dir: Path | None = None,
    lock_path: Path | None = None,
    readme: Path | None = None,
    opts: BumpOptions | None = None,
    log=print,
) -> str:
    """Move upstream ``name`` to ``version`` (see the module docstring). Returns what happened:
    ``"noop"``, ``"aborted"`` or ``"bumped"``.

    Raises:
        ConflictError: a patch conflicts (named, with files and hunks); resumable.
        BumpDecision: patches upstream already contains need ``--drop``; resumable.
        TreeStateError: the old pin is not usable, another bump runs, or a resolution is unfinished.
        SourceError / SourceUnreachable / UsageError: the release cannot be resolved as asked.
    """
    opts = opts or BumpOptions()
    lock_path = Path(lock_path or LOCK_PATH)
    patches_root = Path(patches_dir or PATCHES_DIR)
    root = sources_dir / STAGE_DIR
    lock = load_lock(lock_path)
    up = lock.get(name)  # an unknown name is refused before anything is written
    with _exclusive(root / f".{name}.lock", name):
        for trash in root.glob(f".trash-{name}-*"):
            shutil.rmtree(trash, ignore_errors=True)
        stage = root / f"{name}-{version}"
        staged = [d for d in root.glob(f"{name}-*") if d.is_dir() and (d / STATE_FILE).exists()]
        for d in root.glob(f"{name}-*"):  # left by a run that failed before it staged anything
            if d.is_dir() and d not in staged:
                shutil.rmtree(d)
        others = [d for d in staged if d != stage]
        if opts.abort:
            for d in staged:
                if (d / COMMIT_MARK).exists():
                    raise TreeStateError(f"{d}: the bump was already switching; rerun it to finish instead of aborting")
                shutil.rmtree(d)
                log(f"removed {d}; {name} stays at its old pin ({up.version})")
            if not staged:
                log(f"no bump of {name} is staged: nothing to abort ({name} is at {up.version})")
            return "aborted"
        if (stage / COMMIT_MARK).exists():
            st = BumpState.load(stage)
            log(f"{name}: finishing the interrupted switch to {version}")
            _switch(stage, sources_dir, st, readme, log)
            log(f"{name}: now at {version}")
            return "bumped"
        if others:
            raise TreeStateError(
                f"a bump of {name} to {others[0].name[len(name) + 1 :]} is staged in {others[0]}; finish it, "
                f"or discard it with: bash apply_all_patches.sh bump {name} {version} --abort"
            )
        series = load_series(name, patches_dir)
        from packaging.version import InvalidVersion, Version

        try:
            same = Version(version) == Version(up.version)
        except InvalidVersion:
            same = False
        if same and not stage.exists():
            log(f"{name} is already at {up.version} in {lock_path.name}: nothing to do")
            return "noop"
        _check_request(up, version, series, opts)
        plan = engine.inspect(up, sources_dir, patches_dir, series=series)
        if plan.state == engine.MISSING and not series.patches:
            plan.state = engine.PRISTINE  # nothing to replay: the new tree is simply put in place
        if plan.state not in (engine.PRISTINE, engine.APPLIED):
            raise TreeStateError(f"the bump starts from a usable old pin, and {plan.detail}")
        st = BumpState.load(stage)
        if st is None or not st.staged:
            root.mkdir(parents=True, exist_ok=True)
            new, st = _resolve(up, version, opts, root, log)
            st.old_state, st.command = plan.state, opts.command(name, version)
            stage.mkdir(parents=True, exist_ok=True)
            _kill_point("after-resolve")
            _build_stage(up, new, sources_dir, series, st, stage)
            st.staged = True
            st.save(stage)
            log(f"{name}: new baseline {new.identity} staged in {stage / 'tree' / name}")
        else:
            if st.old_series != [p.name for p in series.patches]:
                raise TreeStateError(
                    f"patches/{name} changed since this bump started in {stage}; rerun with --abort and start again"
                )
            new = _new_upstream(up, st)
            where = f"at {st.old_series[st.next]}" if st.next < len(st.old_series) else "every patch replayed"
            log(
                f"{name}: continuing the bump in {stage} ({where}), with the release the first run resolved "
                f"({st.source}, commit {st.commit or 'none'}: {st.commit_how})"
            )
        _replay(stage, st, series, opts, log)
        pending = [n for n in st.contained if n not in st.dropped]
        if pending:
            raise BumpDecision(
                "upstream already contains these patches (their reverse applies cleanly to "
                f"{name} {version} with the patches before them):\n"
                + "\n".join(f"    {n}" for n in pending)
                + f"\n  Proposed: drop them. Confirm with: {st.command} --drop {' '.join(pending)}\n"
                f"  The old pin ({name} {up.version}) is untouched."
            )
        _prepare_switch(up, new, st, stage, lock_path, patches_root, log)
        _switch(stage, sources_dir, st, readme, log)
        log(
            f"{name}: {up.version} -> {version}: {len(st.picked)} patch(es) kept ({len(st.by_hand)} refreshed by "
            f"hand), {len(st.dropped)} dropped; tree {st.old_state} like before"
        )
        _review_hints(lock_path.parent, name, up.version, log)
        return "bumped"


def _review_hints(repo: Path, name: str, old_version: str, log) -> None:
    """After a switch: what a maintainer reviews by hand (the kept note, files citing the old version)."""
    log(f"review: the note of {name} in sources.lock (kept; this bump appended), then the recipes and constraints/")
    try:
        out = git(
            repo, "grep", "-l", "-F", old_version, "--", ".", ":!patches", ":!sources.lock", ":!docs/maintaining.md"
        )
    except gitpython.GitCommandError:
        return  # not a git checkout, or no file mentions it
    files = out.split()
    if files:
        shown = ", ".join(files[:12]) + (f" and {len(files) - 12} more" if len(files) > 12 else "")
        log(f"review: {len(files)} tracked file(s) still mention {old_version}: {shown}")


__all__ = [
    "bump",
    "BumpOptions",
    "BumpDecision",
    "pending_switch",
    "staged_bumps",
    "write_lock_entry",
    "regenerate_readme",
]
