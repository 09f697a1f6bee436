"""One exception hierarchy for the whole package; CLIs turn these into messages and exit codes."""


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


class PreflightError(NpuRlError):
    """The preflight rejected the recipe; the message lists every problem with its key and fix."""

    exit_code = 65
