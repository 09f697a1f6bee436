"""Topology, node environment and the head's node assessment, with fake machines (no Ray started)."""

from __future__ import annotations

import os
import socket
import threading

import pytest

from npu_rl.errors import TopologyError
from npu_rl.launch.cluster import REFUSAL_BANNER, assess, probe_head, serve_refusal
from npu_rl.launch.environ import derived_env, is_secret, ray_auth, shown_env
from npu_rl.launch.topology import Probe, resolve_topology


class FakeProbe(Probe):
    """A machine with eth0 10.0.0.5 and lo, routing 10.0.0.0/24 via eth0, with ``npus`` davinci devices."""

    def __init__(self, npus=None, ifaces=None):
        self.npus = npus
        self.ifaces = ifaces or {"lo": ["127.0.0.1", "::1"], "eth0": ["10.0.0.5"], "ib0": ["192.168.1.5"]}

    def interfaces(self):
        return self.ifaces

    def route_get(self, ip):
        if ip.startswith("127."):
            return "lo", "127.0.0.1"
        if ip.startswith("10.0.0."):
            return "eth0", "10.0.0.5"
        if ip.startswith("192.168.1."):
            return "ib0", "192.168.1.5"
        if ip == "192.0.2.1":  # the default route
            return "eth0", "10.0.0.5"
        return None

    def resolve(self, host):
        if host == "head.example":
            return "10.0.0.1"
        if host[0].isdigit() or ":" in host:
            return host
        raise OSError("unknown host")

    def count_npus(self):
        return (self.npus, "/dev/davinci*") if self.npus else None


def test_one_node_needs_no_configuration():
    t = resolve_topology({}, FakeProbe())
    assert (t.nnodes, t.is_head, t.master_addr, t.ifname, t.node_ip) == (1, True, "10.0.0.5", "eth0", "10.0.0.5")
    assert (t.npus_per_node, t.npus_source, t.master_port) == (16, "default", 6379)


def test_npus_counted_from_devices_unless_set():
    assert resolve_topology({}, FakeProbe(npus=8)).npus_per_node == 8
    t = resolve_topology({"NPUS_PER_NODE": "4"}, FakeProbe(npus=8))
    assert (t.npus_per_node, t.npus_source) == (4, "NPUS_PER_NODE")


def test_head_is_the_node_that_owns_master_addr():
    t = resolve_topology({"NNODES": "2", "MASTER_ADDR": "10.0.0.5"}, FakeProbe())
    assert t.is_head and t.ifname == "eth0"


def test_worker_uses_the_interface_that_routes_to_the_head():
    t = resolve_topology({"NNODES": "2", "MASTER_ADDR": "head.example"}, FakeProbe())
    assert (t.is_head, t.ifname, t.node_ip, t.world_size) == (False, "eth0", "10.0.0.5", 32)
    t = resolve_topology({"NNODES": "2", "MASTER_ADDR": "192.168.1.9"}, FakeProbe())
    assert (t.is_head, t.ifname, t.node_ip) == (False, "ib0", "192.168.1.5")


def test_socket_ifname_must_exist_and_agree_with_master_addr():
    with pytest.raises(TopologyError, match="SOCKET_IFNAME='eth9' is not an interface.*eth0"):
        resolve_topology({"SOCKET_IFNAME": "eth9"}, FakeProbe())
    with pytest.raises(TopologyError, match="MASTER_ADDR=10.0.0.5 is on interface eth0.*SOCKET_IFNAME=ib0"):
        resolve_topology({"NNODES": "2", "MASTER_ADDR": "10.0.0.5", "SOCKET_IFNAME": "ib0"}, FakeProbe())
    t = resolve_topology({"NNODES": "2", "MASTER_ADDR": "10.0.0.1", "SOCKET_IFNAME": "ib0"}, FakeProbe())
    assert (t.is_head, t.ifname, t.node_ip) == (False, "ib0", "192.168.1.5")


def test_case6_loopback_master_without_socket_ifname_is_rejected_for_two_nodes():
    with pytest.raises(TopologyError, match="NNODES=2 but the job would bind to loopback"):
        resolve_topology({"NNODES": "2", "MASTER_ADDR": "127.0.0.1"}, FakeProbe())
    # One node on loopback is fine; an explicit SOCKET_IFNAME=lo is a deliberate one-machine cluster.
    assert resolve_topology({"MASTER_ADDR": "127.0.0.1"}, FakeProbe()).is_head
    t = resolve_topology({"NNODES": "2", "MASTER_ADDR": "127.0.0.1", "SOCKET_IFNAME": "lo"}, FakeProbe())
    assert t.is_head and any("loopback" in n for n in t.notes)


def test_multi_node_needs_master_addr_except_in_a_dry_run():
    with pytest.raises(TopologyError, match="MASTER_ADDR is not set"):
        resolve_topology({"NNODES": "4"}, FakeProbe())
    t = resolve_topology({"NNODES": "4"}, FakeProbe(), dry_run=True)
    assert t.is_head and t.master_addr == "10.0.0.5" and "set it for the real run" in t.notes[0]


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ({"NNODES": "two"}, "NNODES='two' is not an integer"),
        ({"NNODES": "0"}, "NNODES=0 is out of range"),
        ({"MASTER_PORT": "80"}, "MASTER_PORT=80 is out of range"),
        ({"NNODES": "2", "MASTER_ADDR": "nohost"}, "MASTER_ADDR='nohost' does not resolve"),
        ({"NNODES": "2", "MASTER_ADDR": "172.16.0.1"}, "no route from this node to MASTER_ADDR=172.16.0.1"),
    ],
)
def test_bad_topology_values_name_the_variable(env, match):
    with pytest.raises(TopologyError, match=match):
        resolve_topology(env, FakeProbe())


def test_derived_env_keeps_explicit_socket_names_and_exports_the_topology():
    t = resolve_topology({"NNODES": "2", "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "7000"}, FakeProbe())
    env = derived_env(t, {"HCCL_SOCKET_IFNAME": "ib0"})
    assert env["HCCL_SOCKET_IFNAME"] == "ib0"
    assert env["GLOO_SOCKET_IFNAME"] == env["TP_SOCKET_IFNAME"] == "eth0"
    assert (env["RAY_ADDRESS"], env["NNODES"], env["NPUS_PER_NODE"]) == ("10.0.0.5:7000", "2", "16")


def test_secrets_are_never_shown():
    rows = dict(shown_env({"RAY_AUTH_TOKEN": "s3cret", "HCCL_EXEC_TIMEOUT": "3600", "HOME": "/root"}))
    assert rows == {"RAY_AUTH_TOKEN": "<set, hidden>", "HCCL_EXEC_TIMEOUT": "3600"}


@pytest.mark.parametrize(
    "key",
    [
        "RAY_AUTH_TOKEN", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "MODELSCOPE_API_TOKEN", "GITHUB_TOKEN",
        "WANDB_API_KEY", "OPENAI_API_KEY", "AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID", "SWANLAB_KEY",
        "NPU_RL_DB_PASSWORD", "PGPASSWORD", "PGPASSWD", "npu_rl_secret", "MLFLOW_TRACKING_PASSWORD",
        "GOOGLE_APPLICATION_CREDENTIALS",
    ],
)  # fmt: skip
def test_names_that_hold_a_secret_are_secret(key):
    assert is_secret(key)


@pytest.mark.parametrize(
    "key",
    [
        "VLLM_ROLLOUT_EARLY_STOP_MIN_TOKENS", "TOKENIZERS_PARALLELISM", "VLLM_MAX_TOKENS", "NPU_RL_NUM_TOKENS",
        "RAY_AUTH_TOKEN_PATH", "NPU_RL_KEYS", "HCCL_EXEC_TIMEOUT", "KEY", "NPU_RL_MONKEY",
    ],
)  # fmt: skip
def test_names_that_only_contain_a_secret_word_are_shown(key):
    """Found by a user: the environment table hid VLLM_ROLLOUT_EARLY_STOP_MIN_TOKENS (a substring match
    on TOKEN). A whole word of the name decides, and a name that says where a secret is (``_PATH``) is
    shown: the launcher's own messages name RAY_AUTH_TOKEN_PATH."""
    assert not is_secret(key)
    env = {key: "16", "RAY_AUTH_TOKEN": "s3cret"}
    shown = dict(shown_env(env))
    assert shown["RAY_AUTH_TOKEN"] == "<set, hidden>"
    assert shown.get(key, "16") == "16"  # shown as it is where the table shows its prefix


def test_ray_token_auth_stays_on_and_token_files_must_be_private(tmp_path):
    head = resolve_topology({"NNODES": "2", "MASTER_ADDR": "10.0.0.5"}, FakeProbe())
    worker = resolve_topology({"NNODES": "2", "MASTER_ADDR": "10.0.0.1"}, FakeProbe())
    home = {"HOME": str(tmp_path)}
    assert ray_auth(home, head)[0] == {"RAY_AUTH_MODE": "token"}  # Ray creates the token on the head
    with pytest.raises(TopologyError, match="this worker has no Ray auth token"):
        ray_auth(home, worker)
    token = tmp_path / "token"
    token.write_text("abc")
    os.chmod(token, 0o644)
    with pytest.raises(TopologyError, match=f"chmod 600 {token}"):
        ray_auth({**home, "RAY_AUTH_TOKEN_PATH": str(token)}, worker)
    os.chmod(token, 0o600)
    assert ray_auth({**home, "RAY_AUTH_TOKEN_PATH": str(token)}, worker)[0]["RAY_AUTH_TOKEN_PATH"] == str(token)
    updates, notes = ray_auth({"RAY_AUTH_MODE": "disabled"}, worker)
    assert updates == {"RAY_AUTH_MODE": "disabled"} and "can run code as you" in notes[0]


def _node(ip, **res):
    return {"Alive": True, "NodeManagerAddress": ip, "Resources": {"CPU": 192.0, **res}}


def test_case1_nodes_that_registered_gpus_are_named():
    a = assess([_node("10.0.0.1", NPU=16.0), _node("10.0.0.2", GPU=16.0)], expected_nodes=2, npus_per_node=16)
    assert not a.ready and a.npus == 16
    assert len(a.problems) == 1
    assert "node 10.0.0.2 registered 16 GPU and no NPU" in a.problems[0] and "--num-gpus" in a.problems[0]


def test_assess_counts_npus_and_flags_wrong_counts():
    nodes = [_node("10.0.0.1", NPU=16.0), _node("10.0.0.2", NPU=8.0), {**_node("10.0.0.3", NPU=16.0), "Alive": False}]
    a = assess(nodes, expected_nodes=2, npus_per_node=16)
    assert not a.ready and a.npus == 24 and [ip for ip, *_ in a.joined] == ["10.0.0.1", "10.0.0.2"]
    assert "node 10.0.0.2 registered 8 NPU, expected NPUS_PER_NODE=16" in a.problems[0]
    assert assess(nodes[:1] + [_node("10.0.0.3", NPU=16.0)], 2, 16).ready


def _serve_once(payload: bytes | None):
    """A loopback server for one connection that sends ``payload`` (None: says nothing) then closes."""
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]

    def run():
        conn, _ = srv.accept()
        with conn:
            if payload is None:
                conn.recv(1)  # silent until the client hangs up, as Ray's GCS (gRPC) is
            else:
                conn.sendall(payload)
        srv.close()

    threading.Thread(target=run, daemon=True).start()
    return port


def test_a_worker_reads_a_heads_refusal_and_nothing_else_as_one():
    assert probe_head("127.0.0.1", _serve_once(REFUSAL_BANNER + b"  error: bad key\n")) == (True, "  error: bad key")
    assert probe_head("127.0.0.1", _serve_once(None)) == (True, None)  # a real head
    assert probe_head("127.0.0.1", _serve_once(b"SSH-2.0-OpenSSH\r\n")) == (True, None)  # something else
    assert probe_head("127.0.0.1", _serve_once(REFUSAL_BANNER[:5])) == (True, None)  # a cut-off banner is not one
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    assert probe_head("127.0.0.1", free) == (False, None)
    # the head's side: each worker that asks is told, once per address; nobody asking ends with the window
    assert serve_refusal("127.0.0.1", free, "  error: x", expect=1, window=0.6) == []
