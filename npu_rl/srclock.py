"""One set-up command at a time per sources folder, across processes and NFS clients.

``download_sources.sh``, ``apply_all_patches.sh`` (apply, check, revert, status and the maintainer
commands) take :func:`exclusive` on the sources folder before they look at any tree. The set-up line
run over pdsh on every node against one shared checkout then serialises: the first node applies, the
others wait and find the trees applied. The lock is ``fcntl``-based (py-filelock's ``FileLock``):
the kernel releases it when its holder dies, however it dies, and Linux NFS clients map it onto
NFS byte-range locks, so it holds across nodes. Who holds it (pid, host, command, since) is written
next to it, for the waiting message.

Once the lock is held, :func:`clean_leftovers` removes what an interrupted run of ours left behind
(half-unpacked ``.NAME.tmp-*`` folders, ``.NAME.old-*`` trees being replaced, throw-away index files
in the trees' ``.git``); nothing else can be using them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import filelock

from npu_rl.errors import IOFailure, SourcesBusy, UsageError

LOCK_NAME = ".npu-rl.lock"
#: Seconds to wait for another run (default); NPU_RL_LOCK_TIMEOUT overrides, 0 = do not wait.
DEFAULT_TIMEOUT_S = 600.0
_REPORT_EVERY_S = 10.0
#: Names a run of ours leaves in a sources folder only when it was interrupted.
LEFTOVER_PATTERNS = (".*.tmp-*", ".*.old-*")


def lock_timeout() -> float:
    raw = os.environ.get("NPU_RL_LOCK_TIMEOUT")
    if raw is None or raw == "":
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        raise SourcesBusy(
            f"NPU_RL_LOCK_TIMEOUT={raw!r} is not a number of seconds (e.g. 600, or 0: do not wait)"
        ) from None
    if value < 0:
        raise UsageError(f"NPU_RL_LOCK_TIMEOUT={raw!r} must be >= 0 seconds")
    return value


def _owner(folder: Path, name: str = LOCK_NAME) -> str:
    try:
        info = json.loads((folder / f"{name}.owner").read_text(encoding="utf-8"))
        since = time.strftime("%H:%M:%S", time.localtime(info["since"]))
        return f"pid {info['pid']} on {info['host']} ({info['command']}, since {since})"
    except (OSError, ValueError, KeyError, TypeError):
        return "a process whose details are not readable"


@contextlib.contextmanager
def exclusive(
    folder: Path,
    command: str,
    log: Callable[[str], None] | None = None,
    timeout: float | None = None,
    read_only: bool = False,
    name: str = LOCK_NAME,
) -> Iterator[None]:
    """Hold the exclusive lock of sources folder ``folder`` (created if missing) while inside.

    ``command`` names this run for others' waiting message. Waits at most ``timeout`` seconds
    (default :func:`lock_timeout`), printing who holds the lock every 10 s. ``read_only``: the
    command only reads (status, check); where the lock file cannot be created (a read-only
    checkout) it runs without the lock and says so, instead of failing. ``name``: the lock file's
    name in ``folder`` (the archive cache locks one archive at a time).

    Raises:
        SourcesBusy: still held by another run after the timeout (names the holder).
        IOFailure: the folder or the lock file cannot be created (read-only, disk full).
    """
    log = log or (lambda m: print(m, file=sys.stderr))
    timeout = lock_timeout() if timeout is None else timeout
    if read_only and not folder.is_dir():
        yield  # nothing there to read, and no folder to create
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if read_only and not os.access(folder, os.W_OK):
            raise PermissionError(13, "Permission denied", str(folder))
    except OSError as exc:
        if read_only:
            log(f"reading {folder} without its lock ({exc.strerror}): a set-up command running meanwhile is not seen")
            yield
            return
        raise IOFailure.from_os_error(exc, "creating the sources folder") from None
    owner = folder / f"{name}.owner"
    lock = filelock.FileLock(folder / name, is_singleton=False, thread_local=False)
    deadline = time.monotonic() + timeout
    announced = False
    while True:
        try:
            lock.acquire(timeout=min(_REPORT_EVERY_S, max(0.0, deadline - time.monotonic())), poll_interval=0.05)
            break
        except filelock.Timeout:
            if time.monotonic() >= deadline:
                raise SourcesBusy(
                    f"{folder / name} is held by {_owner(folder, name)}; gave up after {timeout:.0f} s "
                    "(NPU_RL_LOCK_TIMEOUT). Wait for it to end, or stop it; the lock goes away with its process"
                ) from None
            log(
                f"waiting for {folder}: in use by {_owner(folder)}"
                + ("" if announced else "; set-up commands run one at a time")
            )
            announced = True
        except OSError as exc:
            raise IOFailure.from_os_error(exc, f"taking the lock {folder / name}") from None
    try:
        info = {"pid": os.getpid(), "host": socket.gethostname(), "command": command, "since": time.time()}
        tmp = owner.with_name(f"{owner.name}.{os.getpid()}")
        with contextlib.suppress(OSError):  # the owner note is for messages only
            tmp.write_text(json.dumps(info), encoding="utf-8")
            os.replace(tmp, owner)
        yield
    finally:
        with contextlib.suppress(OSError):
            owner.unlink()
        lock.release()


def _size(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, f)).st_size
    return total


def clean_leftovers(folder: Path, log: Callable[[str], None]) -> list[str]:
    """Remove the leftovers of interrupted runs in ``folder`` (call with the lock held); return their
    names. A leftover that cannot be removed is reported and kept (never fatal)."""
    removed = []
    if not folder.is_dir():
        return removed
    for pattern in LEFTOVER_PATTERNS:
        for path in sorted(folder.glob(pattern)):
            size = _size(path) if path.is_dir() else 0
            try:
                shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
            except OSError as exc:
                log(f"could not remove {path}, left by an interrupted run: {exc.strerror}")
                continue
            removed.append(path.name)
            log(f"removed {path.name} ({size / 1e6:.0f} MB), left by an interrupted run")
    for tmp in sorted(folder.glob("*/.git/npu_rl-index-*")):
        with contextlib.suppress(OSError):
            tmp.unlink()
            removed.append(str(tmp.relative_to(folder)))
    for stray in folder.glob(f"{LOCK_NAME}.owner.*"):
        with contextlib.suppress(OSError):
            stray.unlink()
    return removed
