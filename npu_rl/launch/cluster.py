"""The Ray side of the launcher: start or join the job's cluster, wait for its NPUs, stop what we started.

Ray runs as ``ray start --block`` in its own session: its daemons are that process's children, so
stopping the job's Ray means signalling that one process group — never ``ray stop`` (which stops every
Ray of this user on the machine) and never ``pkill``.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from npu_rl.errors import ClusterBusy, LaunchError, NodesMissing

Log = Callable[[str], None]


def port_open(host: str, port: int, timeout: float = 1.0) -> bool:
    """True if something accepts TCP connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def running_raylets() -> list[str]:
    """Descriptions ("pid N (user U), GCS A") of Ray node processes already running on this machine."""
    import psutil

    found = []
    for p in psutil.process_iter(["pid", "name", "username", "cmdline", "status"]):
        if p.info["name"] != "raylet" or p.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        gcs = next((a.split("=", 1)[1] for a in p.info["cmdline"] or [] if a.startswith("--gcs-address=")), "?")
        found.append(f"pid {p.info['pid']} (user {p.info['username']}), GCS {gcs}")
    return found


def refuse_running_node() -> None:
    """Raise if a Ray node already runs on this machine (a stale session or another job's).

    Raises:
        ClusterBusy: naming its pid, user and GCS address. Nothing is stopped: it may not be ours.
    """
    raylets = running_raylets()
    if raylets:
        raise ClusterBusy(
            "a Ray node is already running on this machine: "
            + "; ".join(raylets)
            + ". This launcher does not join or reuse a cluster it did not start. If it is yours and finished, "
            "stop it (`ray stop` stops your Ray processes on this node); if it is another job's, wait or use "
            "other nodes"
        )


def port_holders(port: int) -> list[str]:
    """Who listens on TCP ``port`` on this machine: "pid N (user U): COMMAND" for each process this
    user may see, "a process of another user (...)" for a socket whose owner is hidden."""
    import psutil

    try:
        conns = psutil.net_connections(kind="inet")
    except (psutil.Error, OSError):
        return []
    found: list[str] = []
    for c in conns:
        if c.status != psutil.CONN_LISTEN or not c.laddr or c.laddr.port != port:
            continue
        if c.pid is None:
            found.append(f"a process this user cannot see (another user's; `sudo ss -ltnp 'sport = :{port}'` names it)")
            continue
        try:
            p = psutil.Process(c.pid)
            cmd = " ".join(p.cmdline()) or p.name()
            found.append(f"pid {c.pid} (user {p.username()}): {cmd[:160]}")
        except psutil.Error:
            found.append(f"pid {c.pid}")
    return list(dict.fromkeys(found))


def port_busy_message(host: str, port: int) -> str:
    """What the head says when its Ray port is taken: the holder when it can be named, and the fix."""
    holders = port_holders(port)
    who = "; ".join(holders) if holders else "a process `ss -ltnp` names (as root for other users')"
    return (
        f"MASTER_PORT {port} on {host} is already in use by {who}: pick a free MASTER_PORT (the same on every "
        "node), or stop that program if it is yours"
    )


def refuse_foreign_cluster(host: str, port: int) -> None:
    """Raise unless this node is free for the head of a new cluster on host:port.

    Raises:
        ClusterBusy: a Ray node already runs here, or something already listens on the head port
            (the message names the listening process when this user can see it).
    """
    refuse_running_node()
    if port_open(host, port):
        raise ClusterBusy(port_busy_message(host, port))


class RayNodeProcess:
    """One ``ray start --block`` process of this job, in its own session, logging to ``log_path``."""

    def __init__(self, ray_exe: str, args: Sequence[str], log_path: Path, env: Mapping[str, str]):
        self.cmd = [ray_exe, "start", "--block", *args]
        self.log_path = log_path
        self.env = dict(env)
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=self.env, start_new_session=True,
            )  # fmt: skip

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join("    " + ln for ln in text[-lines:])

    def stop(self, grace: float = 45.0) -> None:
        """SIGTERM ``ray start`` alone (it drains the node through the GCS, then stops its daemons; signalling
        the whole group would kill the GCS first and stall the drain), then SIGKILL whatever is left."""
        if self.proc is None:
            return
        pgid = self.proc.pid  # session leader: its pid is the group id
        try:
            os.kill(pgid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
        # Daemons that outlived the leader are still in its group.
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if self.proc.poll() is None:
            self.proc.wait(timeout=10)


def ensure_head_token(ray_exe: str, env: Mapping[str, str], log: Log) -> None:
    """Create the cluster's Ray token on the head when token auth is on and none exists yet.

    ``ray start --head`` refuses to create one (it requires an existing token in token mode), so the
    launcher asks Ray's own CLI (``ray get-auth-token --generate``), discards its output (it prints
    the token), and makes the file readable by its owner only.

    Raises:
        LaunchError: Ray could not generate the token.
    """
    if env.get("RAY_AUTH_MODE") != "token" or env.get("RAY_AUTH_TOKEN") or env.get("RAY_AUTH_TOKEN_PATH"):
        return
    path = Path(env.get("HOME", str(Path.home()))) / ".ray" / "auth_token"
    if path.is_file():
        return
    r = subprocess.run(
        [ray_exe, "get-auth-token", "--generate"], env=dict(env), capture_output=True, text=True, check=False
    )
    if r.returncode != 0 or not path.is_file():
        raise LaunchError(f"`ray get-auth-token --generate` failed (exit {r.returncode}); set RAY_AUTH_TOKEN_PATH")
    path.chmod(0o600)
    log(f"generated this cluster's Ray token in {path} (mode 600); workers need the same file")


def ray_start_args(*, head: bool, topo_address: str, node_ip: str, port: int, npus: int, extra: str) -> list[str]:
    """Arguments of ``ray start`` for a node of this job. NPUs are a custom ``NPU`` resource, never GPUs."""
    args = ["--head", f"--port={port}"] if head else [f"--address={topo_address}"]
    args += [f"--node-ip-address={node_ip}", "--resources=" + json.dumps({"NPU": npus}), "--disable-usage-stats"]
    return args + shlex.split(extra)


@dataclass
class Assessment:
    """What the head knows about the nodes that joined (from ``ray.nodes()``)."""

    ready: bool
    joined: list[tuple[str, float, float]] = field(default_factory=list)  # (ip, NPU, GPU) of alive nodes
    npus: float = 0
    problems: list[str] = field(default_factory=list)

    def summary(self, expected_nodes: int, npus_per_node: int) -> str:
        nodes = ", ".join(f"{ip} (NPU {npu:g})" for ip, npu, _ in self.joined) or "none"
        return (
            f"{len(self.joined)}/{expected_nodes} nodes, NPU {self.npus:g}/{expected_nodes * npus_per_node}; "
            f"joined: {nodes}"
        )


def assess(nodes: Sequence[Mapping], expected_nodes: int, npus_per_node: int) -> Assessment:
    """Judge ``ray.nodes()`` records against the expected job (pure; the wait loop calls it).

    Ready when at least ``expected_nodes × npus_per_node`` NPUs are registered. Problems name nodes
    that registered their accelerators as ``GPU`` (started with ``--num-gpus`` or by another tool) or
    registered an NPU count other than ``npus_per_node``.
    """
    a = Assessment(ready=False)
    for n in nodes:
        if not n.get("Alive", False):
            continue
        res = n.get("Resources", {})
        ip = n.get("NodeManagerAddress", "?")
        npu, gpu = float(res.get("NPU", 0)), float(res.get("GPU", 0))
        a.joined.append((ip, npu, gpu))
        a.npus += npu
        if gpu and not npu:
            a.problems.append(
                f"node {ip} registered {gpu:g} GPU and no NPU: it was started with --num-gpus (or by another "
                "launcher); verl asks Ray for the NPU resource, so these devices are invisible to the job. "
                "Stop it and start it with this launcher, which registers --resources='{\"NPU\": N}'"
            )
        elif npu != npus_per_node:
            a.problems.append(
                f"node {ip} registered {npu:g} NPU, expected NPUS_PER_NODE={npus_per_node}: set NPUS_PER_NODE "
                "(and the visible devices) identically on every node"
            )
    a.ready = a.npus >= expected_nodes * npus_per_node
    return a


def wait_for_npus(
    address: str,
    expected_nodes: int,
    npus_per_node: int,
    timeout: float,
    log: Log,
    poll: float = 2.0,
) -> Assessment:
    """Poll the cluster at ``address`` until the job's NPUs registered, printing progress as nodes join.

    Raises:
        NodesMissing: the NPUs did not all register within ``timeout`` seconds (the message lists the
            nodes that joined, how many are missing, and any node registered wrongly).
    """
    import ray

    ray.init(address=address, logging_level="ERROR", log_to_driver=False, configure_logging=False)
    try:
        start = time.monotonic()
        last, last_print = None, 0.0
        while True:
            a = assess(ray.nodes(), expected_nodes, npus_per_node)
            now = time.monotonic()
            line = a.summary(expected_nodes, npus_per_node)
            if a.ready:
                log(f"cluster ready: {line}")
                for p in a.problems:
                    log(f"warning: {p}")
                return a
            if line != last or now - last_print > 15:
                log(f"waiting for nodes ({now - start:.0f}s/{timeout:g}s): {line}")
                last, last_print = line, now
            if now - start > timeout:
                missing = expected_nodes - len(a.joined)
                msg = [
                    f"NODE_WAIT_TIMEOUT={timeout:g}s passed: {line}; missing: {max(missing, 0)} node(s), "
                    f"{expected_nodes * npus_per_node - a.npus:g} NPU.",
                    *a.problems,
                    "On each missing node run the same command (bash ray_start_npu.sh TRAIN_SCRIPT ENV_SCRIPT) "
                    f"with MASTER_ADDR/MASTER_PORT reaching {address}; check its launcher output and firewall, "
                    "or raise NODE_WAIT_TIMEOUT.",
                ]
                raise NodesMissing("\n  ".join(msg))
            time.sleep(poll)
    finally:
        ray.shutdown()


def wait_for_head(host: str, port: int, timeout: float, log: Log, poll: float = 3.0) -> None:
    """Bounded wait until the head's GCS port accepts connections.

    Raises:
        ClusterBusy: the head did not answer within ``timeout`` seconds.
    """
    start = time.monotonic()
    tries = 0
    while True:
        tries += 1
        if port_open(host, port):
            return
        waited = time.monotonic() - start
        if waited > timeout:
            raise ClusterBusy(
                f"the head {host}:{port} did not answer after {tries} tries in {waited:.0f}s (WORKER_JOIN_TIMEOUT="
                f"{timeout:g}): start the head node first, check MASTER_ADDR/MASTER_PORT are the head's, and that "
                "this node can reach it (firewall, SOCKET_IFNAME)"
            )
        if tries == 1 or tries % 10 == 0:
            log(f"waiting for the head {host}:{port} ({waited:.0f}s/{timeout:g}s)")
        time.sleep(poll)
