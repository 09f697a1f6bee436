"""Where this node sits in the job: node count, head address, network interface, NPUs per node.

Everything comes from the environment (the ENV_SCRIPT or the shell) with defaults that make one node
work with no configuration. The probes that look at the machine (interfaces, routes, devices) sit
behind :class:`Probe` so the rules are tested with any network layout, not only this machine's.
"""

from __future__ import annotations

import glob
import ipaddress
import re
import shutil
import socket
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

from npu_rl.errors import TopologyError

DEFAULT_NPUS_PER_NODE = 16  # an Atlas A3 node: 8 cards x 2 dies
DEFAULT_MASTER_PORT = 6379  # Ray's own default GCS port


@dataclass(frozen=True)
class Topology:
    """The resolved topology of this node.

    ``npus_per_node`` counts dies (an A3 card is 2 dies); ``npus_source`` says where the number came
    from (``NPUS_PER_NODE``, ``/dev/davinci*``, ``npu-smi`` or ``default``).
    """

    nnodes: int
    master_addr: str
    master_port: int
    npus_per_node: int
    npus_source: str
    ifname: str
    node_ip: str
    is_head: bool
    notes: tuple[str, ...] = ()
    devices_found: bool = True  # False when no /dev/davinci* and no npu-smi: a machine without NPUs

    @property
    def world_size(self) -> int:
        """NPU dies in the whole job."""
        return self.nnodes * self.npus_per_node

    @property
    def address(self) -> str:
        """``host:port`` of the Ray head (what workers and the training driver connect to)."""
        return f"{self.master_addr}:{self.master_port}"


class Probe:
    """What the topology rules need to know about the machine. Tests pass a fake."""

    def interfaces(self) -> dict[str, list[str]]:
        """Interface name -> its IPv4/IPv6 addresses (no scope suffix)."""
        import psutil  # a Ray dependency: present wherever the launcher can run

        out: dict[str, list[str]] = {}
        for name, addrs in psutil.net_if_addrs().items():
            for a in addrs:
                if a.family in (socket.AF_INET, socket.AF_INET6):
                    out.setdefault(name, []).append(a.address.split("%")[0])
        return out

    def route_get(self, ip: str) -> tuple[str, str] | None:
        """(interface, source address) the kernel uses to reach ``ip``, or None if unknown."""
        if shutil.which("ip"):
            r = subprocess.run(["ip", "-o", "route", "get", ip], capture_output=True, text=True, check=False)
            dev = re.search(r"\bdev (\S+)", r.stdout)
            src = re.search(r"\bsrc (\S+)", r.stdout)
            if r.returncode == 0 and dev and src:
                return dev.group(1), src.group(1)
        # No iproute2: a UDP "connect" sends nothing but makes the kernel choose the source address.
        family = socket.AF_INET6 if ":" in ip else socket.AF_INET
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as s:
                s.connect((ip, 9))
                src = s.getsockname()[0]
        except OSError:
            return None
        for name, addrs in self.interfaces().items():
            if src in addrs:
                return name, src
        return None

    def resolve(self, host: str) -> str:
        """IP address of ``host`` (an IP is returned as is)."""
        return socket.getaddrinfo(host, None)[0][4][0]

    def count_npus(self) -> tuple[int, str] | None:
        """(dies on this node, how they were counted), or None when no NPU is visible."""
        devices = [p for p in glob.glob("/dev/davinci*") if re.fullmatch(r"/dev/davinci\d+", p)]
        if devices:
            return len(devices), "/dev/davinci*"
        if shutil.which("npu-smi"):
            r = subprocess.run(["npu-smi", "info", "-m"], capture_output=True, text=True, check=False)
            # Rows: "NPU ID  Chip ID  Chip Logic ID  Chip Name"; MCU rows have no logic id.
            rows = [ln.split() for ln in r.stdout.splitlines()]
            dies = [row for row in rows if len(row) >= 4 and row[0].isdigit() and row[2].isdigit()]
            if r.returncode == 0 and dies:
                return len(dies), "npu-smi"
        return None


def _int(env: Mapping[str, str], key: str, default: int, lo: int, hi: int | None = None) -> int:
    raw = env.get(key, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise TopologyError(f"{key}={raw!r} is not an integer; set {key} to a whole number (or unset it)") from None
    if value < lo or (hi is not None and value > hi):
        bound = f"between {lo} and {hi}" if hi is not None else f">= {lo}"
        raise TopologyError(f"{key}={value} is out of range: it must be {bound}")
    return value


def _is_loopback(ip: str) -> bool:
    try:
        return ipaddress.ip_address(ip).is_loopback
    except ValueError:
        return False


def default_address(probe: Probe) -> str:
    """This node's address on the interface of its default route (loopback if it has none)."""
    routed = probe.route_get("192.0.2.1")  # TEST-NET-1: never contacted, only routed
    if routed and not _is_loopback(routed[1]):
        return routed[1]
    try:
        return probe.resolve(socket.gethostname())
    except OSError:
        return "127.0.0.1"


# Device-visibility variables the stack reads. ASCEND_RT_VISIBLE_DEVICES is CANN's runtime mask
# (torch_npu, vLLM-Ascend, HCCL): logical die ids of this node, local rank i runs on the i-th id.
# ASCEND_VISIBLE_DEVICES is the Ascend Docker runtime's (which dies a container gets mounted; verl
# reads its first id to query npu-smi); it also takes ranges (0-3).
RT_VISIBLE = "ASCEND_RT_VISIBLE_DEVICES"
CONTAINER_VISIBLE = "ASCEND_VISIBLE_DEVICES"


def _parse_device_list(key: str, raw: str, ranges: bool) -> list[int]:
    """Die ids of a visibility variable; raises with the reason and a corrected value."""
    if not raw.strip():
        raise TopologyError(
            f"{key} is set but empty: the stack would see no NPU on this node; unset it (every die is "
            f"visible) or list the dies, e.g. {key}=0,1,2,3"
        )
    ids: list[int] = []
    bad: list[str] = []
    for token in raw.split(","):
        m = re.fullmatch(r"(\d+)-(\d+)", token, re.ASCII) if ranges else None
        if re.fullmatch(r"\d+", token, re.ASCII):
            ids.append(int(token))
        elif m and int(m.group(1)) <= int(m.group(2)):
            ids.extend(range(int(m.group(1)), int(m.group(2)) + 1))
        else:
            bad.append(token)
    if bad:
        what = "an empty entry" if any(not b.strip() for b in bad) else f"{bad[0]!r}, not a die id"
        clean = [t.strip() for t in raw.split(",") if t.strip()]
        fix = (
            f"; write {key}={','.join(clean)}"
            if clean and all(re.fullmatch(r"\d+", t, re.ASCII) for t in clean)
            else ""
        )
        form = "comma-separated die ids or ranges (0-3)" if ranges else "comma-separated die ids (0,1,2,3)"
        reader = (
            "the Ascend Docker runtime and verl's device probe (it reads the first id) cannot use it"
            if ranges
            else "CANN reads such a list only up to the first entry it cannot parse and silently drops the "
            "rest, so torch_npu would see fewer NPUs than listed (or none)"
        )
        raise TopologyError(f"{key}={raw!r} has {what}: it takes {form}, no spaces, no empty entries; {reader}{fix}")
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise TopologyError(
            f"{key}={raw} lists die {', '.join(map(str, dup))} more than once (CANN takes strictly ascending lists "
            f"only); list each die once: {key}={','.join(map(str, sorted(set(ids))))}"
        )
    return ids


def visible_devices(
    env: Mapping[str, str], explicit_npus: int | None, counted: int | None
) -> tuple[int | None, str | None, list[str]]:
    """Check the device-visibility variables of ``env`` on this node.

    Returns (the dies visible, the variable that limits them, notes); (None, None, []) when neither
    is set. ``explicit_npus`` is ``NPUS_PER_NODE`` when set;
    ``counted`` the dies this node has (/dev/davinci*, npu-smi), None when unknown.

    Raises:
        TopologyError: a list is malformed (spaces, empty entries, not a number), repeats a die, is
            not ascending (``ASCEND_RT_VISIBLE_DEVICES``: CANN takes ascending lists only), names a die
            this node does not have, or holds fewer dies than ``NPUS_PER_NODE``.
    """
    notes: list[str] = []
    limit: tuple[int, str] | None = None
    if CONTAINER_VISIBLE in env:
        ids = _parse_device_list(CONTAINER_VISIBLE, env[CONTAINER_VISIBLE], ranges=True)
        # Order does not matter here: the container runtime mounts the set.
        limit = (len(ids), CONTAINER_VISIBLE)
    if RT_VISIBLE in env:
        raw = env[RT_VISIBLE]
        ids = _parse_device_list(RT_VISIBLE, raw, ranges=False)
        if ids != sorted(ids):
            raise TopologyError(
                f"{RT_VISIBLE}={raw} is not in ascending order: CANN accepts ascending lists only and otherwise "
                "reports no usable NPU (torch.npu.is_available() is False, or 'it must be configured in "
                f"ascending order'). Local rank i runs on the i-th listed die either way; write "
                f"{RT_VISIBLE}={','.join(map(str, sorted(ids)))}"
            )
        have = counted if limit is None else limit[0]
        have_src = "this node has" if limit is None else f"{CONTAINER_VISIBLE} gives this container"
        if have is not None and ids[-1] >= have:
            raise TopologyError(
                f"{RT_VISIBLE}={raw} names die {ids[-1]} but {have_src} {have} (logical ids 0-{have - 1}, "
                "`npu-smi info -m` column Chip Logic ID): CANN silently drops ids it does not have and every id "
                f"after them, so fewer NPUs than listed would be visible; list ids below {have}"
            )
        limit = (len(ids), RT_VISIBLE)
    if limit is None:
        return None, None, notes
    n, key = limit
    if explicit_npus is not None and explicit_npus > n:
        raise TopologyError(
            f"NPUS_PER_NODE={explicit_npus} but {key}={env[key]} makes {n} die(s) visible: Ray would offer "
            f"{explicit_npus} NPU slots and the ranks past {n} would find no device. List {explicit_npus} dies "
            f"in {key}, or set NPUS_PER_NODE={n} (or unset it: it then defaults to the list's length)"
        )
    if explicit_npus is not None and explicit_npus < n:
        notes.append(
            f"{key} makes {n} dies visible and NPUS_PER_NODE={explicit_npus}: the job uses the first {explicit_npus}"
        )
    return n, key, notes


def resolve_topology(env: Mapping[str, str], probe: Probe | None = None, dry_run: bool = False) -> Topology:
    """Resolve this node's topology from ``env``.

    Keys: ``NNODES`` (default 1), ``MASTER_ADDR`` (default: this node; required when NNODES > 1),
    ``MASTER_PORT`` (default 6379), ``NPUS_PER_NODE`` (default: counted from ``/dev/davinci*`` or
    ``npu-smi``, else 16), ``SOCKET_IFNAME`` (default: the interface that holds MASTER_ADDR on the
    head, or that routes to it on a worker). The node is the head when MASTER_ADDR is one of its
    own addresses. A multi-node job on loopback is refused unless SOCKET_IFNAME names the loopback
    interface explicitly (several Ray nodes on one machine). A dry run plans a multi-node job without
    MASTER_ADDR as if this node were its head (noted in ``notes``), so a recipe can be checked before
    the cluster exists.

    Raises:
        TopologyError: a value is malformed, MASTER_ADDR is missing or unresolvable for a multi-node
            job, SOCKET_IFNAME names no interface of this node, or a multi-node job would bind
            Ray/HCCL/Gloo to loopback.
    """
    probe = probe or Probe()
    nnodes = _int(env, "NNODES", 1, 1)
    port = _int(env, "MASTER_PORT", DEFAULT_MASTER_PORT, 1024, 65535)

    counted = probe.count_npus()
    explicit = _int(env, "NPUS_PER_NODE", DEFAULT_NPUS_PER_NODE, 1) if env.get("NPUS_PER_NODE", "").strip() else None
    visible, visible_key, visible_notes = visible_devices(env, explicit, counted[0] if counted else None)
    if explicit is not None:
        npus, npus_source = explicit, "NPUS_PER_NODE"
    elif visible is not None:
        npus, npus_source = visible, str(visible_key)
    elif counted:
        npus, npus_source = counted
    else:
        npus, npus_source = DEFAULT_NPUS_PER_NODE, "default"

    master = env.get("MASTER_ADDR", "").strip()
    notes: list[str] = list(visible_notes)
    planned_head = False
    if not master and nnodes > 1 and dry_run:
        master, planned_head = default_address(probe), True
        notes.append(f"MASTER_ADDR is not set: planned with this node ({master}) as the head; set it for the real run")
    if not master:
        if nnodes > 1:
            raise TopologyError(
                f"NNODES={nnodes} but MASTER_ADDR is not set: set MASTER_ADDR to the head node's address "
                "on the cluster network, the same value on every node (a default would make every node a head)"
            )
        master = default_address(probe)
    try:
        master_ip = probe.resolve(master)
    except OSError as e:
        raise TopologyError(f"MASTER_ADDR={master!r} does not resolve ({e}): give the head's IP address") from None

    interfaces = probe.interfaces()
    local = {ip: name for name, ips in interfaces.items() for ip in ips}
    wanted_if = env.get("SOCKET_IFNAME", "").strip()
    if wanted_if:
        if wanted_if not in interfaces:
            raise TopologyError(
                f"SOCKET_IFNAME={wanted_if!r} is not an interface of this node; it has: "
                f"{', '.join(sorted(interfaces)) or 'none'}. Set SOCKET_IFNAME per node if names differ"
            )
        v4 = [ip for ip in interfaces[wanted_if] if ":" not in ip]
        if not (v4 or interfaces[wanted_if]):
            raise TopologyError(f"SOCKET_IFNAME={wanted_if!r} has no address: pick the cluster-network interface")
        is_head = master_ip in local
        if is_head and local[master_ip] != wanted_if:
            raise TopologyError(
                f"MASTER_ADDR={master} is on interface {local[master_ip]} of this node but SOCKET_IFNAME={wanted_if}: "
                f"Ray and HCCL/Gloo would use different networks; set SOCKET_IFNAME={local[master_ip]} "
                f"or MASTER_ADDR to {wanted_if}'s address"
            )
        ifname = wanted_if
        node_ip = master_ip if is_head else (v4 or interfaces[wanted_if])[0]
    elif master_ip in local:
        is_head, ifname, node_ip = True, local[master_ip], master_ip
    else:
        routed = probe.route_get(master_ip)
        if routed is None:
            raise TopologyError(
                f"no route from this node to MASTER_ADDR={master}: check the address, or set SOCKET_IFNAME"
            )
        is_head, (ifname, node_ip) = False, routed

    loopback = _is_loopback(master_ip) or _is_loopback(node_ip) or ifname == "lo"
    if nnodes > 1 and loopback and wanted_if:
        # Asked for explicitly (several "nodes" on one machine, e.g. tests): allowed, and said.
        notes.append(f"SOCKET_IFNAME={wanted_if} is loopback: only Ray nodes on this machine can join")
    elif nnodes > 1 and loopback and not planned_head:
        raise TopologyError(
            f"NNODES={nnodes} but the job would bind to loopback (MASTER_ADDR={master}, interface {ifname}): "
            "other nodes cannot reach it. Set MASTER_ADDR to the head's cluster-network address and "
            "SOCKET_IFNAME to that network's interface (see `ip -o -4 addr`)"
        )
    return Topology(
        nnodes, master, port, npus, npus_source, ifname, node_ip, is_head, tuple(notes), devices_found=bool(counted)
    )
