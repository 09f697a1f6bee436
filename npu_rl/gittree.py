"""Upstream trees under ``sources/``: git repositories with one pristine baseline commit.

Every git call of the package goes through :func:`git` (GitPython), with an environment that
ignores the user's and the system's git configuration, so a tree behaves the same on every
machine. A tree's *state* is the git tree hash of its working tree (tracked and untracked files,
ignored ones excluded), computed in a throw-away index: comparing hashes tells exactly whether a
tree is pristine, fully patched, or something else, without trusting file stamps or markers.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

try:
    import git as gitpython
except ImportError:  # pragma: no cover - depends on the interpreter
    raise SystemExit(
        "npu_rl needs GitPython: use the entry points (bash apply_all_patches.sh ..., which bootstrap it), "
        "or pip install -r constraints/tools.txt"
    ) from None

from npu_rl import signals
from npu_rl.errors import IOFailure, NpuRlError

#: Tag of the baseline commit in every tree.
BASELINE_TAG = "upstream"
#: Trailer in the baseline commit's message that records which lock entry the tree is.
IDENTITY_TRAILER = "Npu-Rl-Baseline"
#: Trailer recording where the tree came from (pypi archive name or git commit).
SOURCE_TRAILER = "Npu-Rl-Source"
#: Trailer recording the sha256 of the index archive a tree was unpacked from (absent for git trees).
ARCHIVE_TRAILER = "Npu-Rl-Archive-Sha256"

_IDENT = {
    "GIT_AUTHOR_NAME": "npu-rl-recipes",
    "GIT_AUTHOR_EMAIL": "npu-rl-recipes@localhost",
    "GIT_COMMITTER_NAME": "npu-rl-recipes",
    "GIT_COMMITTER_EMAIL": "npu-rl-recipes@localhost",
}
# Fixed dates make the baseline commit (and so its hash) identical on every machine.
FIXED_DATE = "2000-01-01T00:00:00+0000"
# Build artefacts that running upstream code or tests leaves in a tree; never part of its state.
# (Editable installs build megatron-core's C++ helper in place: *.so.)
_EXCLUDES = "__pycache__/\n*.py[cod]\n.pytest_cache/\n*.egg-info/\n.eggs/\n*.so\n/build/\n"


def _write_excludes(tree: Path) -> None:
    path = tree / ".git" / "info" / "exclude"
    if not path.exists() or path.read_text(encoding="utf-8") != _EXCLUDES:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(_EXCLUDES, encoding="utf-8")


def git_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for git: no system/global config, no prompts, no pager, no hooks surprises."""
    env = {
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_PAGER": "cat",
        "LC_ALL": "C",
        **_IDENT,
    }
    if extra:
        env.update(extra)
    return env


def git(
    cwd: Path | str,
    *args: str,
    env: Mapping[str, str] | None = None,
    stdin: bytes | None = None,
    strip: bool = True,
    timeout: float | None = None,
) -> str:
    """Run ``git args...`` in ``cwd`` and return stdout (str).

    git runs in a session of its own: a terminal's Ctrl-C (sent to the whole foreground process
    group) reaches only our process, which decides when to stop (:mod:`npu_rl.signals`), so no git
    is killed halfway through writing a tree.

    Raises:
        GitIOError: git failed because the file system refused (disk full, read-only, permission,
            a held ``index.lock``); the message names the tree and the fix.
        gitpython.GitCommandError: any other failure; ``.stderr`` holds git's message.
    """
    runner = gitpython.Git(str(cwd))
    kwargs = {
        "env": git_env(env),
        "with_extended_output": False,
        "strip_newline_in_stdout": strip,
        "kill_after_timeout": timeout,
        "start_new_session": True,
    }
    try:
        for attempt in (1, 2):
            try:
                if stdin is not None:
                    # GitPython streams istream to the process; a temporary file keeps large patches safe.
                    with tempfile.TemporaryFile() as fh:
                        fh.write(stdin)
                        fh.seek(0)
                        return runner.execute(["git", *args], istream=fh, **kwargs)
                return runner.execute(["git", *args], **kwargs)
            except gitpython.GitCommandError as exc:
                if attempt == 1 and _killed_before_exec(exc):
                    continue
                raise
    except gitpython.GitCommandError as exc:
        io = GitIOError.from_git(Path(cwd), args, git_error_text(exc))
        if io is not None:
            raise io from None
        raise
    except OSError as exc:  # the temporary file (disk full) or git itself could not be started
        raise IOFailure.from_os_error(exc, f"running git {args[0] if args else ''} in {cwd}") from None


def _killed_before_exec(exc: gitpython.GitCommandError) -> bool:
    """Whether git died of a signal this process received, which can only have happened before git ran.

    A signal sent to our process group (a terminal's Ctrl-C, ``timeout``, a closed ssh session) can
    reach the child in the moment between fork and its ``setsid``: CPython's child has reset its
    signal handlers to the default by then, so it dies before ``exec`` (seen in CI: ``git
    write-tree`` exit -1 after SIGHUP, during a ``--revert``). After ``setsid`` no group signal reaches
    it. So such a git never started, and running it again is safe (once)."""
    status = exc.status if isinstance(exc.status, int) else 0
    return status < 0 and -status in signals.received()


class GitIOError(IOFailure):
    """git failed because the file system refused a write; ``kind`` says how (see IOFailure.KINDS)."""

    def __init__(self, message: str, path: Path, kind: str) -> None:
        super().__init__(message)
        self.path = path
        self.kind = kind

    @classmethod
    def from_git(cls, tree: Path, args: tuple[str, ...], text: str) -> GitIOError | None:
        found = IOFailure.classify(text)
        if found is None:
            return None
        kind, fix = found
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        said = next((ln for ln in lines if any(w in ln for ws, k, _ in IOFailure.KINDS if k == kind for w in ws)), "")
        sub = next((a for a in args if not a.startswith("-")), "git")
        return cls(f"{kind} in {tree}: git {sub} said: {said or lines[-1]}. Fix: {fix.format(path=tree)}", tree, kind)


def git_error_text(exc: gitpython.GitCommandError) -> str:
    """git's own message from a failed call, without GitPython's decoration."""
    text = exc.stderr if isinstance(exc.stderr, str) else str(exc.stderr or "")
    text = text.strip()
    if text.startswith("stderr: "):
        text = text[len("stderr: ") :]
    return text.strip().strip("'").strip()


def init_baseline(tree: Path, message_title: str, trailers: Mapping[str, str]) -> str:
    """Turn directory ``tree`` into a git repository whose single commit is its content.

    The commit has fixed author, committer and dates, so the same content gives the same commit
    hash everywhere; it is tagged :data:`BASELINE_TAG`. Files the upstream's own .gitignore
    ignores are still committed (``add --force``): the baseline is the whole pristine tree.

    Returns:
        The baseline commit SHA.
    """
    git(tree, "init", "--quiet", "--initial-branch=main")
    for key, value in (
        ("core.autocrlf", "false"),
        ("core.safecrlf", "false"),
        ("gc.auto", "0"),
        ("advice.detachedHead", "false"),
    ):
        git(tree, "config", key, value)
    _write_excludes(tree)
    git(tree, "add", "--all", "--force", ".")
    body = "\n".join(f"{k}: {v}" for k, v in trailers.items())
    dates = {"GIT_AUTHOR_DATE": FIXED_DATE, "GIT_COMMITTER_DATE": FIXED_DATE}
    git(tree, "commit", "--quiet", "--no-verify", "-m", f"{message_title}\n\n{body}\n", env=dates)
    git(tree, "tag", BASELINE_TAG)
    return git(tree, "rev-parse", "HEAD")


class Tree:
    """One upstream tree under ``sources/`` (may not exist yet)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    # --- identity -----------------------------------------------------------------------------
    def exists(self) -> bool:
        return self.path.is_dir()

    def is_ours(self) -> bool:
        """True if the directory is a git repository with our baseline tag."""
        if not (self.path / ".git").is_dir():
            return False
        try:
            git(self.path, "rev-parse", "--verify", "--quiet", f"refs/tags/{BASELINE_TAG}^{{commit}}")
        except gitpython.GitCommandError:
            return False
        return True

    def baseline_commit(self) -> str:
        return git(self.path, "rev-parse", f"refs/tags/{BASELINE_TAG}^{{commit}}")

    def baseline_tree(self) -> str:
        return git(self.path, "rev-parse", f"refs/tags/{BASELINE_TAG}^{{tree}}")

    def baseline_trailers(self) -> dict[str, str]:
        """The ``Key: value`` trailers of the baseline commit message."""
        msg = git(self.path, "log", "-1", "--format=%B", f"refs/tags/{BASELINE_TAG}")
        out = {}
        for line in msg.splitlines():
            key, sep, value = line.partition(": ")
            if sep and key.startswith("Npu-Rl-"):
                out[key] = value.strip()
        return out

    def identity(self) -> str | None:
        return self.baseline_trailers().get(IDENTITY_TRAILER)

    def head(self) -> str:
        return git(self.path, "rev-parse", "HEAD")

    # --- state --------------------------------------------------------------------------------
    def _with_temp_index(self, fn, seed_from_real: bool = True):
        fd, name = tempfile.mkstemp(prefix="npu_rl-index-", dir=self.path / ".git")
        os.close(fd)
        try:
            real = self.path / ".git" / "index"
            if seed_from_real and real.exists():
                # Keeps the stat cache (only changed files are hashed). copy2 keeps the index's mtime,
                # which git's racy-entry check needs: a file rewritten in the second it was indexed,
                # at the same size, is re-hashed only if the index is not newer than it.
                shutil.copy2(real, name)
            else:
                os.unlink(name)
            return fn({"GIT_INDEX_FILE": name})
        finally:
            if os.path.exists(name):
                os.unlink(name)

    def worktree_hash(self) -> str:
        """Git tree hash of the working tree as it is now (untracked non-ignored files included)."""

        _write_excludes(self.path)  # trees made by an older version get the current list

        def run(env):
            git(self.path, "add", "--all", ".", env=env)
            return git(self.path, "write-tree", env=env)

        return self._with_temp_index(run)

    def changed_files(self, from_tree: str, to_tree: str) -> list[str]:
        """``STATUS path`` lines for the files that differ between two tree hashes."""
        out = git(self.path, "diff-tree", "-r", "--no-renames", "--name-status", from_tree, to_tree)
        return [line.replace("\t", " ", 1) for line in out.splitlines() if line]

    def binary_diff(self, from_tree: str, to_tree: str) -> str:
        """A ``git apply``-able diff between two tree hashes (binary files included)."""
        return git(self.path, "diff", "--binary", "--no-color", "--no-ext-diff", from_tree, to_tree, strip=False)

    def expected_trees(self, patches: Iterable[tuple[str, bytes]]) -> list[str]:
        """Apply patches in order to the baseline in a throw-away index; touch no file.

        Args:
            patches: ``(label, patch_bytes)`` in series order.

        Returns:
            ``[T0, T1, ..., Tn]``: the tree hash after 0, 1, ..., n patches.

        Raises:
            PatchApplyError: a patch does not apply; carries the label and git's message.
        """

        def run(env):
            git(self.path, "read-tree", f"refs/tags/{BASELINE_TAG}", env=env)
            trees = [git(self.path, "write-tree", env=env)]
            for label, data in patches:
                try:
                    git(self.path, "apply", "--cached", "--whitespace=nowarn", "-", env=env, stdin=data)
                except gitpython.GitCommandError as exc:
                    raise PatchApplyError(label, git_error_text(exc)) from None
                trees.append(git(self.path, "write-tree", env=env))
            return trees

        return self._with_temp_index(run, seed_from_real=False)

    # --- changes ------------------------------------------------------------------------------
    def apply(self, label: str, data: bytes) -> None:
        """Apply one patch to the working tree (run at the tree root, so no file is skipped)."""
        try:
            git(self.path, "apply", "--whitespace=nowarn", "-", stdin=data)
        except gitpython.GitCommandError as exc:
            raise PatchApplyError(label, git_error_text(exc)) from None

    def reset_to_baseline(self) -> None:
        """Make the working tree and index exactly the baseline (untracked files removed,
        ignored build artefacts kept), with HEAD on the baseline commit."""
        git(self.path, "reset", "--quiet", "--hard", f"refs/tags/{BASELINE_TAG}")
        self.clean()

    def clean(self) -> None:
        """Remove untracked files and folders (ignored build artefacts kept); frees the space the
        patches' new files took, and needs no index lock."""
        git(self.path, "clean", "--quiet", "-d", "--force")

    def unapply(self, patches: Iterable[tuple[str, bytes]]) -> None:
        """Reverse ``(label, data)`` patches on the working tree, last first (``git apply -R``: the
        index is not written, so a held ``index.lock`` does not stop it).

        Raises:
            PatchApplyError: a patch does not reverse (the tree is not in the state it produced).
        """
        for label, data in reversed(list(patches)):
            try:
                git(self.path, "apply", "-R", "--whitespace=nowarn", "-", stdin=data)
            except gitpython.GitCommandError as exc:
                raise PatchApplyError(label, git_error_text(exc)) from None

    def index_lock(self) -> Path | None:
        """The tree's ``.git/index.lock`` when one exists (a git running there, or one that crashed)."""
        lock = self.path / ".git" / "index.lock"
        return lock if lock.exists() else None


class PatchApplyError(NpuRlError):
    """git apply refused a patch; ``label`` names it, ``detail`` is git's message."""

    def __init__(self, label: str, detail: str) -> None:
        super().__init__(f"{label}: {detail}")
        self.label = label
        self.detail = detail
