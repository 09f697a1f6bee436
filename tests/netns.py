"""Nodes on one machine: Linux network namespaces on a private bridge (issue 36).

Each node is a network namespace with its own address (``10.231.0.1``, ``.2``, ...) and its own
loopback; the nodes share this machine's file system, like a cluster with a shared home. They are
joined by a bridge in one more namespace (the hub), so no interface or address is added to the
machine's own network, and no packet can leave the namespaces made here.

Everything made is named ``nrl<creator pid>-...`` and removed on exit (``with Nodes(2) as nodes``),
on SIGTERM/SIGHUP of the creator, and, for what a killed creator left, by the next user
(:func:`sweep_stale`) or by hand::

    python -m tests.netns up 2        # make two nodes, print their names and addresses, keep them
    python -m tests.netns run nrl123-n0 -- ip addr     # a command on a node (ip netns exec)
    python -m tests.netns down        # remove every set whose creator is gone (or: down 123)

Needs root (CI runs as root) and ``ip`` from iproute2.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence

PREFIX = "nrl"
SUBNET = "10.231.0"  # private, and only ever configured inside the namespaces made here
_NAME = re.compile(rf"^{PREFIX}(\d+)-(hub|n\d+)$")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def available() -> str | None:
    """Why namespaces cannot be made here (not root, no ``ip``), or None when they can."""
    if os.geteuid() != 0:
        return "not root"
    try:
        _ip("netns", "list")
    except (OSError, subprocess.CalledProcessError) as e:
        return f"`ip netns` does not work: {e}"
    return None


def namespaces() -> list[str]:
    """Names of every network namespace on the machine (``ip netns list``)."""
    out = _ip("netns", "list", check=False).stdout
    return [ln.split()[0] for ln in out.splitlines() if ln.strip()]


def pids_in(name: str) -> list[int]:
    """Processes whose network namespace is ``name``."""
    out = _ip("netns", "pids", name, check=False).stdout
    return [int(p) for p in out.split() if p.isdigit()]


def kill_all(name: str, grace: float = 5.0) -> list[int]:
    """SIGTERM every process of namespace ``name``, SIGKILL what is left after ``grace`` s; returns the pids.

    Only namespaces made here are passed: their processes were started in them by the test.
    """
    first = pids_in(name)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids_in(name):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + (grace if sig == signal.SIGTERM else 5.0)
        while pids_in(name) and time.monotonic() < deadline:
            time.sleep(0.2)
    return first


def remove(names: Sequence[str]) -> None:
    """Stop every process in each namespace, then delete it (the veth pairs go with them)."""
    for name in names:
        if name in namespaces():
            kill_all(name)
            _ip("netns", "del", name, check=False)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def sweep_stale(owner: int | None = None) -> list[str]:
    """Remove the namespaces of dead creators (or all of ``owner``'s); returns their names."""
    gone = []
    for name in namespaces():
        m = _NAME.match(name)
        if m and (int(m.group(1)) == owner if owner is not None else not _alive(int(m.group(1)))):
            gone.append(name)
    # nodes first, the hub (their bridge) last
    gone.sort(key=lambda n: n.endswith("-hub"))
    remove(gone)
    return gone


class Nodes:
    """``count`` nodes: namespaces ``nrl<pid>-n0..`` with addresses ``10.231.0.1..`` on one bridge.

    ``with Nodes(2) as nodes: nodes.popen(0, [...])``. Leaving the block (also by an exception or a
    SIGTERM/SIGHUP of this process) stops every process started in the nodes and removes them.
    """

    def __init__(self, count: int = 2, tag: int | None = None):
        if not 1 <= count <= 200:
            raise ValueError(f"count={count}: 1 to 200 nodes")
        tag = os.getpid() if tag is None else tag
        self.hub = f"{PREFIX}{tag}-hub"
        self.names = [f"{PREFIX}{tag}-n{i}" for i in range(count)]
        self.ips = [f"{SUBNET}.{i + 1}" for i in range(count)]
        self._saved: dict[int, object] = {}

    # -- making and removing --------------------------------------------------------------------
    def up(self) -> Nodes:
        """Make the hub, its bridge, and each node with its veth pair and address.

        Raises:
            RuntimeError: a namespace of that name exists already, or ``ip`` failed (what was made is removed).
        """
        taken = set(namespaces()) & {self.hub, *self.names}
        if taken:
            raise RuntimeError(f"namespaces {sorted(taken)} exist already: python -m tests.netns down")
        try:
            _ip("netns", "add", self.hub)
            _ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.hub, "link", "set", "br0", "up")
            for i, (name, ip) in enumerate(zip(self.names, self.ips, strict=True)):
                _ip("netns", "add", name)
                _ip("-n", name, "link", "add", "eth0", "type", "veth", "peer", "name", f"n{i}", "netns", self.hub)
                _ip("-n", self.hub, "link", "set", f"n{i}", "master", "br0")
                _ip("-n", self.hub, "link", "set", f"n{i}", "up")
                _ip("-n", name, "addr", "add", f"{ip}/24", "dev", "eth0")
                _ip("-n", name, "link", "set", "eth0", "up")
                _ip("-n", name, "link", "set", "lo", "up")
        except subprocess.CalledProcessError as e:
            self.down()
            raise RuntimeError(f"`ip {' '.join(e.cmd[1:])}` failed: {e.stderr.strip()}") from e
        return self

    def down(self) -> None:
        """Stop every process in the nodes and remove the namespaces (idempotent)."""
        remove([*self.names, self.hub])

    def __enter__(self) -> Nodes:
        for sig in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(sig) in (signal.SIG_DFL, None):
                self._saved[sig] = signal.signal(sig, _exit_on_signal)
        return self.up()

    def __exit__(self, *exc) -> None:
        try:
            self.down()
        finally:
            for sig, handler in self._saved.items():
                signal.signal(sig, handler)

    # -- using ------------------------------------------------------------------------------------
    def cmd(self, i: int, argv: Sequence[str]) -> list[str]:
        """``argv`` run on node ``i`` (``ip netns exec``)."""
        return ["ip", "netns", "exec", self.names[i], *argv]

    def popen(self, i: int, argv: Sequence[str], env: Mapping[str, str] | None = None, **kw) -> subprocess.Popen:
        """Start ``argv`` on node ``i`` in its own session."""
        return subprocess.Popen(self.cmd(i, argv), env=None if env is None else dict(env), start_new_session=True, **kw)

    def run(self, i: int, argv: Sequence[str], **kw) -> subprocess.CompletedProcess:
        return subprocess.run(self.cmd(i, argv), **kw)

    def pids(self, i: int) -> list[int]:
        """Processes still running on node ``i``."""
        return pids_in(self.names[i])

    def kill(self, i: int) -> list[int]:
        """Node ``i`` dies: SIGKILL every process on it at once (no clean-up code runs); returns the pids."""
        first = pids_in(self.names[i])
        for pid in first:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return first


def _exit_on_signal(signum, _frame):
    raise SystemExit(128 + signum)  # unwinds through every `with Nodes(...)`, which removes them


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.netns", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    u = sub.add_parser("up", help="make N nodes and keep them (remove with: down TAG)")
    u.add_argument("count", type=int, nargs="?", default=2)
    d = sub.add_parser("down", help="remove the sets of dead creators, or every set of TAG")
    d.add_argument("tag", type=int, nargs="?")
    r = sub.add_parser("run", help="run a command on a node: run NAME -- CMD ...")
    r.add_argument("name")
    r.add_argument("argv", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    if (why := available()) is not None:
        print(f"error: cannot make network namespaces here: {why}", file=sys.stderr)
        return 1
    if a.what == "up":
        # tagged with this command's parent (the shell): `down` without a tag keeps them while it lives
        nodes = Nodes(a.count, tag=os.getppid()).up()
        for name, ip in zip(nodes.names, nodes.ips, strict=True):
            print(f"{name} {ip}")
        print(f"remove with: python -m tests.netns down {os.getppid()}")
        return 0
    if a.what == "down":
        for name in sweep_stale(a.tag):
            print(f"removed {name}")
        return 0
    argv_ = a.argv[1:] if a.argv[:1] == ["--"] else a.argv
    return subprocess.run(["ip", "netns", "exec", a.name, *argv_], check=False).returncode


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["Nodes", "available", "kill_all", "namespaces", "pids_in", "remove", "sweep_stale"]
