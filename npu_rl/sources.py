"""Download the pinned upstream trees into ``sources/`` (``download_sources.sh``).

Each upstream becomes ``sources/<name>``: a git repository whose single commit, tagged
``upstream``, is the pristine tree, so the patch engine can check, apply and revert with git.
Archives come from the package index the user configured for pip (``PIP_INDEX_URL`` or
``pip config``; the client library's default otherwise), are verified against the sha256 in
``sources.lock`` and cached in ``$NPU_RL_CACHE``; git checkouts are verified against the
locked commit. Nothing unverified is ever kept: a mismatching download is deleted.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from npu_rl import REPO_ROOT, cache_dir, signals, srclock
from npu_rl.errors import (
    DigestError,
    IOFailure,
    LockError,
    NpuRlError,
    SourceError,
    SourceUnreachable,
    TreeStateError,
)
from npu_rl.gittree import (
    ARCHIVE_TRAILER,
    IDENTITY_TRAILER,
    SOURCE_TRAILER,
    Tree,
    git,
    git_error_text,
    gitpython,
    init_baseline,
)
from npu_rl.lock import Artifact, Lock, Upstream, load_lock
from npu_rl.table import format_table

CHUNK = 1 << 20
GIT_TIMEOUT_S = float(os.environ.get("NPU_RL_GIT_TIMEOUT", "120"))


# --- configuration ------------------------------------------------------------------------------
def pip_setting(key: str) -> str | None:
    """The effective value of a pip option (``index-url``, ``cert``) as pip itself resolves it:
    ``PIP_<KEY>`` environment variable, then the ``download``/``install``/``global`` sections of
    the pip configuration files (``pip config list``). None when unset."""
    env = os.environ.get("PIP_" + key.upper().replace("-", "_"))
    if env:
        return env.split()[0]
    try:
        out = subprocess.run(
            [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=60, check=False
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = {}
    for line in out.splitlines():
        name, _, value = line.partition("=")
        section, _, option = name.partition(".")
        if option == key:
            found[section] = value.strip().strip("'\"")
    for section in ("download", "install", "global"):
        if section in found:
            return found[section].split()[0]
    return None


# --- archives -----------------------------------------------------------------------------------
def sha256_of(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest()


@dataclass
class Outcome:
    """One line of the summary table."""

    name: str
    version: str
    source: str = "-"
    sha: str = "-"
    state: str = ""
    seconds: float = 0.0


class Downloader:
    """Fetches and verifies archives into the cache, using the configured package index."""

    def __init__(self, cache: Path, log=print, git_allowed: bool = True) -> None:
        self.cache = cache
        self.archives = cache / "archives"
        self.log = log
        self.git_allowed = git_allowed  # False under --no-git: no message may suggest --from git
        self._client = None
        self.index_url = pip_setting("index-url")

    def _pypi(self):
        if self._client is None:
            from pypi_simple import PyPISimple

            cert = pip_setting("cert")
            kwargs = {"endpoint": self.index_url} if self.index_url else {}
            self._client = PyPISimple(**kwargs)
            if cert:
                self._client.s.verify = cert
        return self._client

    def fetch(self, up: Upstream | Artifact) -> tuple[Path, str]:
        """Return the verified archive of ``up`` in the cache and how it got there.

        States: ``cached`` (present and verified), ``downloaded``, ``re-downloaded`` (a cached copy
        that the index showed damaged was replaced, or an interrupted download was left behind).

        Three witnesses decide who is wrong when the cached file does not have the locked sha256:
        the cache, the index (its published digest, else a fresh download) and ``sources.lock``. A
        cached file is replaced only when the index's file matches the lock; when the cache and the
        index agree against the lock, the lock is named and nothing is deleted; when the index cannot
        be reached, the cached file is kept.

        Raises:
            DigestError: the index's file does not have the locked sha256 (the download is deleted; a
                cached file is kept), or the cache and the index agree and the lock differs.
            SourceError: the index does not list the locked file, or the download failed.
        """
        assert up.pypi is not None
        self.archives.mkdir(parents=True, exist_ok=True)
        # The cache is often shared (an NFS home): one process per archive at a time, or a second
        # node would take the first one's .part for a leftover and delete it mid-download.
        with srclock.exclusive(
            self.archives, f"downloading {up.pypi.filename}", self.log, name=f".{up.pypi.filename}.lock"
        ):
            return self._fetch_locked(up)

    def _fetch_locked(self, up: Upstream | Artifact) -> tuple[Path, str]:
        final = self.archives / up.pypi.filename
        part = final.with_name(final.name + ".part")
        again = False
        if part.exists():
            self.log(f"{up.name}: removing {part.name} left by an interrupted download")
            part.unlink()
            again = True
        cached = sha256_of(final) if final.exists() else None
        if cached == up.pypi.sha256:
            return final, "cached"
        if cached:
            self.log(
                f"{up.name}: cached {final.name} has sha256 {cached[:12]}... ({final.stat().st_size} bytes), "
                f"sources.lock pins {up.pypi.sha256[:12]}...; asking {self._index_label()} which is right "
                "(the cached file is kept until then)"
            )
        kept = f" The cached {final} was kept." if cached else ""
        try:
            pkg = self._find(up.name, up.pypi.project, up.pypi.filename, hint="is the mirror complete?")
            published = (pkg.digests or {}).get("sha256")
            if cached and published == cached:  # the index's own digest sides with the cache
                raise DigestError(
                    self._lock_suspect(up, cached, f"the index's published sha256 ({self._index_label()})")
                )
            self._download(up.name, pkg, part)
        except SourceError as e:
            if cached and not isinstance(e, DigestError):
                raise type(e)(
                    f"{e}.{kept} It does not have the sha256 sources.lock pins; which one is wrong "
                    "is unknown until the index can be read"
                ) from None
            raise
        got = sha256_of(part)
        if got != up.pypi.sha256:
            part.unlink()
            if got == cached:
                raise DigestError(self._lock_suspect(up, cached, f"a fresh download from {self._index_label()}"))
            git_hint = " or use --from git," if getattr(up, "commit", None) and self.git_allowed else ""
            raise DigestError(
                f"{up.name}: {up.pypi.filename} from {self._index_label()} has sha256 {got}, "
                f"but sources.lock pins {up.pypi.sha256}. The download was deleted.{kept} If your index is a "
                f"mirror, it serves a different file under this name: fix the mirror,{git_hint} or check the "
                "pin in sources.lock against the project's published sha256."
            )
        if cached:
            self.log(f"{up.name}: the index's {final.name} matches sources.lock: the cached copy was damaged, replaced")
        os.replace(part, final)
        return final, "re-downloaded" if again or cached else "downloaded"

    @staticmethod
    def _lock_suspect(up: Upstream | Artifact, digest: str, witness: str) -> str:
        return (
            f"{up.name}: sources.lock pins sha256 {up.pypi.sha256} for {up.pypi.filename}, but the cached "
            f"file and {witness} both have {digest}: sources.lock is the likely culprit (an edit or a "
            "typo). Nothing was deleted. Compare the pin with the project's published sha256 and correct "
            "sources.lock (or restore it: git checkout sources.lock)."
        )

    def fetch_release(self, name: str, project: str, filename: str) -> tuple[Path, str, str]:
        """Fetch a release archive that the lock does not pin yet (``bump``): return its path in
        the cache, its sha256 computed from the bytes on disk, and how it got there.

        The file must be listed by the index for ``project``; where the index publishes a sha256
        for it (PEP 503 ``#sha256=``), the download must match it (else deleted, DigestError).

        Raises:
            SourceUnreachable: the index cannot be read. SourceError: the file is not listed
            (the message lists the archives the index has for the project's versions nearby).
        """
        pkg = self._find(name, project, filename, hint="check the version, or name the file with --filename")
        published = (pkg.digests or {}).get("sha256")
        self.archives.mkdir(parents=True, exist_ok=True)
        final = self.archives / filename
        how, digest = "cached", sha256_of(final) if final.exists() else None
        if digest and published and digest != published:
            self.log(f"{name}: cached {filename} does not match the index's sha256; fetching it again")
            final.unlink()
            digest = None
        if digest is None:
            part = final.with_name(final.name + ".part")
            if part.exists():
                part.unlink()
            self._download(name, pkg, part)
            digest = sha256_of(part)
            if published and digest != published:
                part.unlink()
                raise DigestError(
                    f"{name}: {filename} from {self._index_label()} has sha256 {digest}, but the index "
                    f"publishes {published} for it; the file was deleted (a broken mirror or transfer)"
                )
            os.replace(part, final)
            how = "downloaded"
        return final, digest, how

    def _index_label(self) -> str:
        return self.index_url or "the default package index"

    def _find(self, name: str, project: str, filename: str, hint: str):
        """The index's entry (a ``pypi_simple.DistributionPackage``) for ``filename`` of ``project``.

        Raises:
            SourceUnreachable: the index cannot be read. SourceError: it does not list the file (the
                message lists the archives it has, and ``hint``).
        """
        try:
            page = self._pypi().get_project_page(project)
        except Exception as exc:  # noqa: BLE001 - requests/pypi_simple raise many kinds
            raise SourceUnreachable(
                f"{name}: cannot read project {project!r} from {self._index_label()}: {exc}"
            ) from None
        for pkg in page.packages:
            if pkg.filename == filename:
                return pkg
        listed = sorted(p.filename for p in page.packages if p.filename.endswith((".tar.gz", ".zip")))[-8:]
        raise SourceError(
            f"{name}: {self._index_label()} does not list {filename} for project {project!r} "
            f"(archives it lists, newest names last: {', '.join(listed) or 'none'}); {hint}"
        )

    def _download(self, name: str, pkg, dest: Path) -> None:
        """Download index entry ``pkg`` to ``dest`` (removed again if the transfer fails)."""
        import requests

        progress = None
        if sys.stderr.isatty():
            from pypi_simple import tqdm_progress_factory

            progress = tqdm_progress_factory(desc=pkg.filename, leave=False)
        try:
            self._pypi().download_package(pkg, dest, verify=False, progress=progress, keep_on_error=True)
        except (requests.RequestException, OSError) as exc:
            if dest.exists():
                dest.unlink()
            raise SourceError(f"{name}: downloading {pkg.filename} failed: {exc}") from None


def _extract(archive: Path, into: Path) -> Path:
    """Extract ``archive`` into ``into``; return the tree root (the single top folder, stripped)."""
    if archive.name.endswith(".tar.gz"):
        with tarfile.open(archive, "r:gz") as tf:
            # The "data" filter (Python >= 3.11.4) refuses absolute paths, links out of the tree, devices.
            if hasattr(tarfile, "data_filter"):
                tf.extractall(into, filter="data")
            else:  # pragma: no cover - older 3.11 patch releases
                tf.extractall(into)
    else:
        with zipfile.ZipFile(archive) as zf:
            zf.extractall(into)
    entries = list(into.iterdir())
    if archive.name.endswith(".tar.gz") and len(entries) == 1 and entries[0].is_dir():
        return entries[0]
    return into


# --- trees --------------------------------------------------------------------------------------
def tree_state(up: Upstream, dest: Path) -> str:
    """'absent', 'ok' (at the locked baseline), or a description of what is there instead.

    A tree unpacked from an index archive records the archive's sha256; when sources.lock now pins
    another digest for that archive, the tree is not what the lock says, even at the same commit."""
    tree = Tree(dest / up.name)
    if not tree.exists():
        return "absent"
    if not tree.is_ours():
        return "not a tree made by download_sources.sh"
    trailers = tree.baseline_trailers()
    ident = trailers.get(IDENTITY_TRAILER)
    if ident != up.identity:
        return f"at baseline {ident!r}"
    made_from = trailers.get(ARCHIVE_TRAILER)
    if made_from and up.pypi and made_from != up.pypi.sha256:
        return (
            f"unpacked from {up.pypi.filename} with sha256 {made_from}, but sources.lock pins {up.pypi.sha256} "
            "for it (a changed pin, or a typo in sources.lock: compare it with the project's published sha256)"
        )
    return "ok"


def _install_tree(
    up: Upstream, built_root: Path, dest: Path, source: str, force: bool, archive_sha256: str | None = None
) -> None:
    trailers = {IDENTITY_TRAILER: up.identity, SOURCE_TRAILER: source}
    if archive_sha256:
        trailers[ARCHIVE_TRAILER] = archive_sha256
    init_baseline(built_root, f"{up.name} {up.version}: pristine upstream tree", trailers)
    target = dest / up.name
    with signals.deferred("replacing the tree"):  # the two renames are not split by a signal
        if target.exists():
            if not force:  # checked before downloading; re-checked in case it appeared meanwhile
                raise TreeStateError(f"{target} exists; use --force to replace it")
            trash = dest / f".{up.name}.old-{os.getpid()}"
            os.replace(target, trash)
            os.replace(built_root, target)
            shutil.rmtree(trash, ignore_errors=True)  # a leftover is removed by the next run
        else:
            os.replace(built_root, target)
    signals.check()


def build_from_archive(up: Upstream, archive: Path, dest: Path, force: bool) -> None:
    """Unpack a verified archive into ``dest/<name>`` as a baseline git tree (atomic rename)."""
    with tempfile.TemporaryDirectory(prefix=f".{up.name}.tmp-", dir=dest) as tmp:
        root = _extract(archive, Path(tmp) / "x")
        # the archive was verified against the lock by Downloader.fetch
        _install_tree(up, root, dest, f"pypi {up.pypi.filename}", force, archive_sha256=up.pypi.sha256)


def build_from_git(up: Upstream, dest: Path, force: bool) -> None:
    """Fetch exactly the locked commit, verify it, and make ``dest/<name>`` from its tree.

    Raises:
        SourceUnreachable: the repository cannot be reached (network, DNS, missing path).
        DigestError: the repository does not have the locked commit.
    """
    if not up.commit:
        raise SourceUnreachable(
            f"{up.name} {up.version}: sources.lock records no commit for this release (see its note), "
            "so it can only come from the package index (--from pypi)"
        )
    with tempfile.TemporaryDirectory(prefix=f".{up.name}.tmp-", dir=dest) as tmp:
        clone = Path(tmp) / "clone"
        clone.mkdir()
        git(clone, "init", "--quiet")
        try:
            git(clone, "fetch", "--quiet", "--depth", "1", up.git, up.commit, timeout=GIT_TIMEOUT_S)
        except gitpython.GitCommandError as exc:
            msg = git_error_text(exc)
            if any(
                s in msg
                for s in ("not our ref", "couldn't find remote ref", "unadvertised object", "no such remote ref")
            ):
                raise DigestError(
                    f"{up.name}: {up.git} has no commit {up.commit} (sources.lock); git said: {msg}"
                ) from None
            raise SourceUnreachable(f"cannot reach {up.git} ({msg.splitlines()[-1] if msg else 'no answer'})") from None
        got = git(clone, "rev-parse", "FETCH_HEAD")
        if got != up.commit:
            raise DigestError(f"{up.name}: fetched commit {got}, sources.lock pins {up.commit}; refused")
        git(clone, "checkout", "--quiet", "FETCH_HEAD")
        if (clone / ".gitmodules").exists():
            git(
                clone,
                "submodule",
                "update",
                "--quiet",
                "--init",
                "--recursive",
                "--depth",
                "1",
                timeout=GIT_TIMEOUT_S * 5,
            )
        root = Path(tmp) / "tree"
        root.mkdir()
        for rel in up.paths or [p.name for p in clone.iterdir() if p.name != ".git"]:
            src = clone / rel
            if not src.exists():
                raise SourceError(f"{up.name}: sources.lock paths entry {rel!r} is not in commit {up.commit}")
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            if src.is_dir():
                shutil.copytree(src, root / rel, symlinks=True, ignore=shutil.ignore_patterns(".git"))
            else:
                shutil.copy2(src, root / rel)
        _install_tree(up, root, dest, f"git {up.commit[:12]}", force)


# --- command line -------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="download_sources.sh",
        description="Download the pinned upstream trees (sources.lock) into DEST as baseline git trees.",
        epilog="exit codes: 0 every requested tree is at its pin (SKIPPED: only a git-only upstream that "
        "sources.lock marks optional, or one under --no-git); "
        "1 a download or verification failed (an unreachable index included); 2 usage (also an unknown --only name); "
        "3 a tree is at another pin (use --force); "
        "4 sources.lock is malformed; 7 the file system refused a write (disk full, read-only); "
        "8 another set-up command holds DEST (named) past NPU_RL_LOCK_TIMEOUT; 129/130/143 SIGHUP/SIGINT/SIGTERM.\n"
        "environment: NPU_RL_CACHE (archive cache), PIP_INDEX_URL / pip.conf (package index), "
        "NPU_RL_GIT_TIMEOUT (seconds per git fetch).",
    )
    p.add_argument(
        "--from",
        dest="source",
        choices=("auto", "pypi", "git"),
        default="auto",
        help="auto: the package index where the lock has an archive, git otherwise (default)",
    )
    p.add_argument("--dest", type=Path, default=None, help="destination folder (default: <repo>/sources)")
    p.add_argument("--only", nargs="+", metavar="NAME", help="only these upstreams (failures are then fatal)")
    p.add_argument("--force", action="store_true", help="replace trees that are at another baseline")
    p.add_argument(
        "--no-git",
        action="store_true",
        help="never contact git hosts: upstreams without an index archive are SKIPPED (CI)",
    )
    p.add_argument(
        "--artifact",
        metavar="NAME",
        help="only fetch and verify the locked artifact NAME into the cache and print its path (install_stack.sh)",
    )
    p.add_argument("--lock", type=Path, default=None, help=argparse.SUPPRESS)
    return p


def _print_artifact(lock: Lock, name: str) -> int:
    """``--artifact NAME``: fetch (or find in the cache) and verify one artifact; print its path."""
    art = lock.artifact(name)
    try:
        path, how = Downloader(cache_dir(), log=lambda m: print(m, file=sys.stderr)).fetch(art)
    except NpuRlError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    print(f"{art.name}: {art.pypi.filename} {how} (sha256 {art.pypi.sha256[:12]}... verified)", file=sys.stderr)
    print(path)
    return 0


def process(
    up: Upstream | Artifact, how: str, dest: Path, downloader: Downloader, force: bool, no_git: bool = False
) -> Outcome:
    """Bring one upstream to its locked baseline (an artifact: into the verified cache); return its
    summary row."""
    out = Outcome(up.name, up.version)
    started = time.monotonic()
    if isinstance(up, Artifact):
        _, how_got = downloader.fetch(up)
        out.source, out.sha, out.state = "pypi", up.pypi.sha256[:12], f"{how_got} (artifact, cache only)"
        out.seconds = time.monotonic() - started
        return out
    state = tree_state(up, dest)
    source = ("pypi" if up.pypi else "git") if how == "auto" else how
    out.source = source
    out.sha = up.pypi.sha256[:12] if source == "pypi" and up.pypi else up.commit[:12]
    if state == "ok":
        out.state = "up to date"
    elif state != "absent" and not force:
        what = state if state.startswith("unpacked from") else f"{state}, not {up.identity!r}"
        raise TreeStateError(
            f"{dest / up.name} is {what}; rerun with --force to replace it "
            "(local changes in it are lost), or choose another --dest"
        )
    elif source == "pypi":
        if up.pypi is None:
            raise SourceUnreachable("no archive on the package index (git only); use --from auto or git")
        archive, how_got = downloader.fetch(up)
        build_from_archive(up, archive, dest, force)
        out.state = f"{how_got}, unpacked"
    else:
        if no_git:
            raise SourceUnreachable("git sources disabled by --no-git (this upstream is git only)")
        build_from_git(up, dest, force)
        out.state = "cloned"
    out.seconds = time.monotonic() - started
    return out


def _skippable(up: Upstream | Artifact, how: str, only: bool, no_git: bool) -> str | None:
    """Why an unreachable upstream may be skipped, or None when that is a failure: only the git-only
    upstreams the lock marks optional (the NPU stack's), or git-only ones under --no-git; never one
    asked for by name (--only)."""
    if only or isinstance(up, Artifact):
        return None
    if no_git and up.pypi is None:
        return "--no-git"
    if up.optional and up.pypi is None:
        return "optional in sources.lock (the NPU stack needs it: install_stack.sh --npu and docker/ fail without it)"
    return None


def main(argv: list[str] | None = None) -> int:
    signals.install()
    args = build_parser().parse_args(argv)
    started = time.monotonic()
    try:
        lock: Lock = load_lock(args.lock)
        if args.artifact:
            return _print_artifact(lock, args.artifact)
        names = args.only or list(lock.upstreams) + list(lock.artifacts)
        ups = [lock.artifact(n) if n in lock.artifacts else lock.get(n) for n in names]
    except LockError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    dest = (args.dest or REPO_ROOT / "sources").resolve()
    downloader = Downloader(cache_dir(), log=lambda m: print(m, file=sys.stderr), git_allowed=not args.no_git)
    rows, failures, code = [], [], 0
    try:
        with srclock.exclusive(dest, "download_sources.sh " + " ".join(argv if argv is not None else sys.argv[1:])):
            srclock.clean_leftovers(dest, lambda m: print(m, file=sys.stderr))
            for up in ups:
                try:
                    rows.append(process(up, args.source, dest, downloader, args.force, args.no_git))
                except SourceUnreachable as exc:
                    why = _skippable(up, args.source, bool(args.only), args.no_git)
                    if why:
                        print(f"SKIPPED {up.name}: {exc} ({why})")
                        rows.append(Outcome(up.name, up.version, "-", "-", "SKIPPED"))
                    else:
                        failures.append(f"{up.name}: {exc}")
                        code = max(code, exc.exit_code)
                        rows.append(Outcome(up.name, up.version, args.source, "-", "FAILED"))
                except NpuRlError as exc:
                    failures.append(f"{up.name}: {exc}" if up.name not in str(exc) else str(exc))
                    code = max(code, exc.exit_code)
                    rows.append(Outcome(up.name, up.version, "-", "-", "FAILED"))
                except OSError as exc:  # our own writes: disk full, read-only, permission
                    failures.append(str(IOFailure.from_os_error(exc, f"building {up.name}")))
                    code = max(code, IOFailure.exit_code)
                    rows.append(Outcome(up.name, up.version, "-", "-", "FAILED"))
    except NpuRlError as exc:  # the lock: busy, or the folder cannot be written
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt as exc:
        print(
            f"interrupted ({exc or 'SIGINT'}): trees already built are complete; the one being built was "
            "discarded (its leftovers go at the next run); rerun the same command to go on",
            file=sys.stderr,
        )
        return signals.exit_code(exc)
    head = ("upstream", "version", "source", "sha", "state", "time")
    print(format_table(head, [(r.name, r.version, r.source, r.sha, r.state, f"{r.seconds:.1f}s") for r in rows]))
    print(f"sources in {dest}; cache {downloader.archives}; took {time.monotonic() - started:.1f} s")
    for f in failures:
        print(f"error: {f}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
