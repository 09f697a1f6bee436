"""The Ray side of the launcher: start or join the job's cluster, wait for its NPUs, stop what we started.

Ray runs as ``ray start --block`` in its own session: its daemons are that process's children, so
stopping the job's Ray means signalling that one process group — never ``ray stop`` (which stops every
Ray of this user on the machine) and never ``pkill``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from npu_rl.errors import ClusterBusy, HeadRefused, LaunchError, NodesMissing, StackMismatch
from npu_rl.launch import stack

Log = Callable[[str], None]


def port_open(host: str, port: int, timeout: float = 1.0) -> bool:
    """True if something accepts TCP connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _net_namespace(pid: int | str) -> str | None:
    """The network namespace of a process (``net:[inode]``), or None when it cannot be read (another user's)."""
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


def running_raylets() -> list[str]:
    """Descriptions ("pid N (user U), GCS A") of Ray node processes already running on this node.

    A node is a network namespace: a raylet in another one (a container with its own network, or
    one of the two nodes of tests/netns.py on one machine) binds other addresses and is not in the
    way; one whose namespace cannot be read counts, to be safe.
    """
    import psutil

    here = _net_namespace("self")
    found = []
    for p in psutil.process_iter(["pid", "name", "username", "cmdline", "status"]):
        if p.info["name"] != "raylet" or p.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        theirs = _net_namespace(p.info["pid"])
        if here is not None and theirs is not None and theirs != here:
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


def _term_with_parent() -> None:
    """In the child before exec: SIGTERM it when the launcher dies (even by SIGKILL), so that a killed
    launcher does not leave its Ray node running (``prctl(PR_SET_PDEATHSIG)``; Linux only, else nothing)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass


_HEAD_ONLY = re.compile(r"`(--[\w-]+)` should only be specified when starting head node")


def head_only_flag(log_path: Path) -> str | None:
    """The flag a failed ``ray start`` on a worker refused as head-only (Ray's own message in its log)."""
    try:
        m = _HEAD_ONLY.search(log_path.read_text(errors="replace"))
    except OSError:
        return None
    return m.group(1) if m else None


def drop_flag(args: Sequence[str], flag: str) -> list[str]:
    """``args`` without ``flag`` (``--flag=value``, or ``--flag value`` when the next word is not a flag)."""
    out, skip = [], False
    for i, a in enumerate(args):
        if skip:
            skip = False
            continue
        if a == flag:
            skip = i + 1 < len(args) and not args[i + 1].startswith("--")
            continue
        if a.startswith(flag + "="):
            continue
        out.append(a)
    return out


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
                env=self.env, start_new_session=True, preexec_fn=_term_with_parent,
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


def ray_start_args(
    *,
    head: bool,
    topo_address: str,
    node_ip: str,
    port: int,
    npus: int,
    extra: str,
    labels: Mapping[str, str] | None = None,
) -> list[str]:
    """Arguments of ``ray start`` for a node of this job. NPUs are a custom ``NPU`` resource, never GPUs.

    ``labels`` (the node's stack, :mod:`npu_rl.launch.stack`) are merged into a ``--labels`` of
    ``extra`` (JSON or Ray's ``k=v,k2=v2``), which would otherwise replace them.

    Raises:
        LaunchError: a ``--labels`` in ``extra`` that Ray cannot parse.
    """
    args = ["--head", f"--port={port}"] if head else [f"--address={topo_address}"]
    args += [f"--node-ip-address={node_ip}", "--resources=" + json.dumps({"NPU": npus}), "--disable-usage-stats"]
    rest, theirs = [], {}
    it = iter(shlex.split(extra))
    for a in it:
        if a == "--labels" or a.startswith("--labels="):
            raw = a.split("=", 1)[1] if "=" in a else next(it, "")
            from ray._private.label_utils import parse_node_labels_json, parse_node_labels_string

            try:
                theirs = parse_node_labels_json(raw) if raw.strip().startswith("{") else parse_node_labels_string(raw)
            except ValueError as e:
                raise LaunchError(f"RAY_START_ARGS: --labels {raw!r} is not valid for Ray: {e}") from e
        else:
            rest.append(a)
    merged = {**theirs, **(labels or {})}
    return args + ([stack.ray_labels_arg(merged)] if merged else []) + rest


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


def assess(
    nodes: Sequence[Mapping], expected_nodes: int, npus_per_node: int, labels: Mapping[str, str] | None = None
) -> Assessment:
    """Judge ``ray.nodes()`` records against the expected job (pure; the wait loop calls it).

    Ready when at least ``expected_nodes × npus_per_node`` NPUs are registered. Problems name nodes
    that registered their accelerators as ``GPU`` (started with ``--num-gpus`` or by another tool) or
    registered an NPU count other than ``npus_per_node``.

    Raises:
        StackMismatch: ``labels`` (the head's stack) given and a node's differ (:mod:`npu_rl.launch.stack`).
    """
    a = Assessment(ready=False)
    for n in nodes:
        if not n.get("Alive", False):
            continue
        res = n.get("Resources", {})
        ip = n.get("NodeManagerAddress", "?")
        if labels is not None and (diffs := stack.differences(labels, n.get("Labels", {}), "the head", f"node {ip}")):
            raise StackMismatch(stack.mismatch_message(diffs, "the head", f"node {ip}"))
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
    labels: Mapping[str, str] | None = None,
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
            a = assess(ray.nodes(), expected_nodes, npus_per_node, labels)
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


# What a head whose preflight rejected a multi-node job serves on its Ray port for a while
# (serve_refusal), before the reason: a waiting worker reads it instead of waiting out its timeout.
# Ray's GCS (gRPC) never speaks first, so a real head sends nothing within probe_head's read.
REFUSAL_BANNER = b"NPU-RL-REFUSED\n"
REFUSAL_MAX_BYTES = 16384


def probe_head(host: str, port: int, timeout: float = 1.0, read: float = 0.5) -> tuple[bool, str | None]:
    """One connection to the head's Ray port: ``(accepts, refusal)``.

    ``accepts``: something accepts TCP connections on ``host:port``. ``refusal``: the text after
    :data:`REFUSAL_BANNER` when it is a head that rejected its job (:func:`serve_refusal`), else None;
    anything else that answers within ``read`` seconds is not a refusal.
    """
    try:
        conn = socket.create_connection((host, port), timeout=timeout)
    except OSError:
        return False, None
    data = b""
    with conn:
        conn.settimeout(read)
        try:
            while len(data) < REFUSAL_MAX_BYTES:
                chunk = conn.recv(4096)
                if not chunk:
                    break
                data += chunk
                if not REFUSAL_BANNER.startswith(data[: len(REFUSAL_BANNER)]):
                    return True, None
        except OSError:  # a timeout included: a real GCS waits for the client to speak
            pass
    if data.startswith(REFUSAL_BANNER):
        return True, data[len(REFUSAL_BANNER) :].decode("utf-8", "replace").rstrip()
    return True, None


def serve_refusal(host: str, port: int, message: str, expect: int, window: float) -> list[str]:
    """Serve ``message`` on ``host:port`` to each worker that connects, until ``expect`` distinct
    addresses have read it or ``window`` seconds passed; the addresses told, in order.

    Raises:
        OSError: the port cannot be bound (something else holds it).
    """
    told: list[str] = []
    payload = REFUSAL_BANNER + message.encode()[: REFUSAL_MAX_BYTES - len(REFUSAL_BANNER)]
    deadline = time.monotonic() + window
    with socket.create_server((host, port)) as srv:
        srv.settimeout(0.5)
        while len(told) < expect and time.monotonic() < deadline:
            try:
                conn, addr = srv.accept()
            except TimeoutError:
                continue
            with conn:
                try:
                    conn.sendall(payload)
                except OSError:
                    continue
            if addr[0] not in told:
                told.append(addr[0])
    return told


def wait_for_head(host: str, port: int, timeout: float, log: Log, poll: float = 3.0) -> None:
    """Bounded wait until the head's GCS port accepts connections.

    Raises:
        ClusterBusy: the head did not answer within ``timeout`` seconds.
        HeadRefused: the head rejected the job in its preflight (:func:`serve_refusal`); its reason.
    """
    start = time.monotonic()
    tries = 0
    while True:
        tries += 1
        accepts, refusal = probe_head(host, port)
        if refusal is not None:
            raise HeadRefused(
                f"the head {host}:{port} rejected the job in its preflight, so this node does not join:\n"
                f"{refusal}\nFix it on the head, then start the same command on every node again"
            )
        if accepts:
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


def ray_temp_dir(ray_start_args: str) -> str | None:
    """The ``--temp-dir`` of ``RAY_START_ARGS`` (``--temp-dir=X`` or ``--temp-dir X``), None for Ray's default."""
    args = shlex.split(ray_start_args)
    for i, a in enumerate(args):
        if a.startswith("--temp-dir="):
            return a.split("=", 1)[1]
        if a == "--temp-dir" and i + 1 < len(args):
            return args[i + 1]
    return None


def forget_cluster(addresses: Sequence[str], temp_dir: str | None, log: Log) -> bool:
    """Remove Ray's current-cluster file (``<temp dir>/ray_current_cluster``) if it still names the cluster
    this launcher stopped (any of ``addresses``: ``host:port`` as given and as resolved).

    ``ray start`` writes the file on every node; a plain ``ray.init()`` on that node then tries to
    connect to that cluster for minutes after it stopped. ``ray stop`` removes the file; a launcher that
    stops its own node by pid must too, but only while the file names the cluster it stopped (another
    ``ray start`` on this node may have written its own since). Ray's own functions find and remove it.
    Returns whether the file was removed.
    """
    from ray._common.utils import get_ray_address_file, reset_ray_address

    path = Path(get_ray_address_file(temp_dir))
    try:
        named = path.read_text().strip()
    except OSError:
        return False
    if named not in addresses:
        return False
    reset_ray_address(temp_dir)
    if path.exists():
        log(f"warning: could not remove {path}, which names the stopped cluster {named}: remove it by hand")
        return False
    return True


@dataclass
class GcsNode:
    """One node as the GCS records it (``ray._raylet.GcsClient``: no driver, no local Ray node needed)."""

    node_id: str
    ip: str
    alive: bool
    head: bool
    labels: dict[str, str]
    death: str = ""


def gcs_nodes(address: str, timeout: float = 10.0) -> list[GcsNode]:
    """Every node the GCS at ``address`` knows, alive or dead.

    Raises:
        LaunchError: the GCS did not answer within ``timeout`` seconds (the message has Ray's reason).
    """
    from ray._raylet import GcsClient

    try:
        info = GcsClient(address=address).get_all_node_info(timeout=timeout)
    except Exception as e:  # noqa: BLE001 - Ray raises RpcError, AuthenticationError, ...
        raise LaunchError(f"the Ray head {address} did not answer: {type(e).__name__}: {e}") from e
    out = []
    for n in info.values():
        death = ""
        if n.HasField("death_info"):
            death = n.death_info.reason_message or str(n.death_info.reason)
        out.append(
            GcsNode(n.node_id.hex(), n.node_manager_address, n.state == 0, n.is_head_node, dict(n.labels), death)
        )
    return out


def check_head_stack(address: str, labels: Mapping[str, str], me: str, wait: float = 120.0) -> None:
    """Compare this node's stack with the head's before joining.

    Raises:
        StackMismatch: naming every differing item with both values.
        LaunchError: the head did not answer, or has no alive head node.
    """
    deadline = time.monotonic() + wait
    while not (heads := [n for n in gcs_nodes(address) if n.head and n.alive]):
        # the GCS answers a moment before the head's own node registers with it
        if time.monotonic() > deadline:
            raise LaunchError(f"the Ray cluster at {address} has had no alive head node for {wait:g}s")
        time.sleep(1.0)
    head = f"the head {heads[0].ip}"
    if diffs := stack.differences(heads[0].labels, labels, head, me):
        raise StackMismatch(stack.mismatch_message(diffs, head, me))


def watch_nodes(
    address: str, on_lost: Callable[[str], None], interval: float = 2.0, stop: Callable[[], bool] = lambda: False
) -> None:
    """Poll the GCS until a node that was alive is dead or gone, then call ``on_lost(message)`` and return.

    Nodes that join later are watched from then on. A GCS that does not answer is retried (the
    head's own node going down is the launcher's to notice). ``stop()`` ends the watch early.
    """
    watched: dict[str, str] = {}
    while not stop():
        try:
            nodes = gcs_nodes(address, timeout=max(interval, 5.0))
        except LaunchError:
            time.sleep(interval)
            continue
        by_id = {n.node_id: n for n in nodes}
        for nid, ip in watched.items():
            n = by_id.get(nid)
            if n is None or not n.alive:
                why = f" ({n.death})" if n is not None and n.death else ""
                on_lost(f"node {ip} left the Ray cluster{why}")
                return
        for n in nodes:
            if n.alive:
                watched.setdefault(n.node_id, n.ip)
        time.sleep(interval)
