"""One exception hierarchy for the whole package; CLIs turn these into messages and exit codes."""

from __future__ import annotations


class NpuRlError(Exception):
    """Base of every error this package raises on bad input or a refused operation.

    ``exit_code`` is what a CLI exits with when this error ends it.
    """

    exit_code = 1


class UsageError(NpuRlError):
    """A command-line value cannot be used as given (the message names it and the fix)."""

    exit_code = 2


class LockError(NpuRlError):
    """sources.lock is missing, malformed, or does not name the requested upstream."""

    exit_code = 4


class UnknownUpstream(LockError):
    """A name given on the command line is not an upstream of sources.lock (a usage error)."""

    exit_code = 2


class SourceError(NpuRlError):
    """An upstream archive or checkout cannot be fetched, verified or unpacked."""

    exit_code = 1


class DigestError(SourceError):
    """A downloaded archive's sha256 (or a checkout's commit) is not the locked one."""


class SourceUnreachable(SourceError):
    """The upstream's host cannot be reached from this machine (network, DNS, firewall)."""


class TreeStateError(NpuRlError):
    """A tree under sources/ is missing, at another pin, or modified: refused, left untouched."""

    exit_code = 3


class SeriesError(NpuRlError):
    """The patch series is malformed: naming, order, missing file, missing header field."""

    exit_code = 4


class ConflictError(NpuRlError):
    """A patch of the series does not apply; every tree was left (or put back) as it started."""

    exit_code = 1


class VerifyError(NpuRlError):
    """A tree did not reach the state the series defines after applying or reverting."""

    exit_code = 5


class LaunchError(NpuRlError):
    """The launcher cannot go on; nothing it started is left running.

    Exit codes follow sysexits so that they do not read like a training script's own small codes.
    """

    exit_code = 70


class TopologyError(LaunchError):
    """NNODES / MASTER_ADDR / SOCKET_IFNAME / NPUS_PER_NODE are invalid or inconsistent."""

    exit_code = 78


class ClusterBusy(LaunchError):
    """A Ray cluster this launcher did not start is on the port, or the head is unreachable."""

    exit_code = 69


class NodesMissing(LaunchError):
    """Not every node (or not every NPU) joined the head before NODE_WAIT_TIMEOUT."""

    exit_code = 75


class NodeLost(LaunchError):
    """A node of the job left the Ray cluster during the run (killed, rebooted, its network gone)."""

    exit_code = 75


class StackMismatch(LaunchError):
    """A node runs another sources.lock, patch series, npu_rl or recipe than the head."""

    exit_code = 78


class HeadRefused(LaunchError):
    """A worker's head rejected the job in its preflight and told the worker why (its Ray port)."""

    exit_code = 65


class PreflightError(NpuRlError):
    """The preflight rejected the recipe; the message lists every problem with its key and fix."""

    exit_code = 65


class IOFailure(NpuRlError):
    """The file system or git refused a write (disk full, read-only, permission, a git lock file
    held): nothing was changed, or every tree was put back. The message names the path and the fix.
    """

    exit_code = 7

    #: (words in git's or the OS's message, what it is, what to do): the first match wins.
    KINDS = (
        (
            ("No space left on device", "Out of diskspace", "Disk quota exceeded"),
            "disk full",
            "free space on the file system of {path} (df -h {path})",
        ),
        (
            ("Read-only file system",),
            "read-only file system",
            "make {path} writable (a read-only mount or image layer?)",
        ),
        (
            ("Permission denied", "Operation not permitted"),
            "permission denied",
            "give this user write access to {path}",
        ),
        (
            ("index.lock': File exists", "index.lock: File exists"),
            "git lock file held",
            "another git process is running in {path}, or one crashed: when none runs, rm -f {path}/.git/index.lock",
        ),
        (("Input/output error",), "I/O error", "check the disk or the network file system behind {path}"),
    )

    @classmethod
    def classify(cls, message: str) -> tuple[str, str] | None:
        """``(kind, fix template)`` when ``message`` (git's or the OS's) is an I/O failure, else None."""
        for words, kind, fix in cls.KINDS:
            if any(w in message for w in words):
                return kind, fix
        return None

    @classmethod
    def from_os_error(cls, exc: OSError, doing: str) -> IOFailure:
        path = exc.filename or "?"
        kind, fix = cls.classify(exc.strerror or str(exc)) or ("I/O error", "check {path}")
        return cls(f"{kind} while {doing}: {path}: {exc.strerror or exc}. Fix: {fix.format(path=path)}")


class SourcesBusy(NpuRlError):
    """Another set-up command holds the sources folder's lock past the timeout (the message names it)."""

    exit_code = 8


class RollbackIncomplete(VerifyError):
    """A failure or interrupt started a rollback that could not restore every tree; the message
    lists each such tree with the reason and the command that fixes it."""


class ModelError(NpuRlError):
    """A model cannot be downloaded or made, or a model directory is incomplete."""

    exit_code = 1
