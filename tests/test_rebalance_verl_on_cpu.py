"""Rollout rebalance glue against the REAL patched verl 0.9.1 (imported on CPU, no Ray started).

The patched ``LLMServerManager`` wires our balancer, its actor options and our client in when
``ROLLOUT_REBALANCE_ENABLE=1`` and is exactly upstream when off; our balancer and client run verl's
own ``LLMServerClient.generate`` against fake server handles (asyncio), including DP-rank routing and
a replica that dies. ``vLLMHttpServer.generate`` needs a running vLLM engine, so its passthrough is
checked on the source, like verl's own contract tests do.
"""

from __future__ import annotations

import ast
import asyncio
import os
import types
from collections import Counter
from pathlib import Path

import pytest
from omegaconf import OmegaConf

llm_server = pytest.importorskip("verl.workers.rollout.llm_server")
from ray.exceptions import ActorDiedError  # noqa: E402
from verl.workers.rollout.replica import TokenOutput  # noqa: E402

from npu_rl.errors import NpuRlError  # noqa: E402
from npu_rl.rebalance import verl_hook  # noqa: E402
from npu_rl.rebalance.settings import settings_from  # noqa: E402
from npu_rl.rebalance.verl_lb import RebalanceClientMixin, RebalanceLoadBalancer, split_server_id  # noqa: E402

SOURCES = Path(os.environ.get("NPU_RL_SOURCES", Path(__file__).resolve().parents[1] / "sources"))


def config(dp: int = 1, max_num_seqs: int = 4, **rollout):
    return OmegaConf.create(
        {
            "actor_rollout_ref": {
                "rollout": {
                    "name": "vllm",
                    "nnodes": 1,
                    "max_num_seqs": max_num_seqs,
                    "data_parallel_size": dp,
                    "response_length": 1024,
                    "full_determinism": False,
                    "disaggregation": {"enabled": False},
                    **rollout,
                },
                "model": {},
            }
        }
    )


class RecordingRemote:
    """Stands in for ``ray.remote`` inside llm_server: records the class and the actor options."""

    def __init__(self):
        self.options = None
        self.cls = None

    def __call__(self, cls):
        self.cls = cls
        outer = self

        class Remote:
            def options(self, **kw):
                outer.options = kw
                return self

            def remote(self, **kw):
                return ("actor", cls, kw)

        return Remote()


def new_manager(cfg, **kw):
    """A real LLMServerManager; the replica class is preset (verl's recipe hook) because importing
    vLLMHttpServer needs vLLM's multimodal extras."""
    m = llm_server.LLMServerManager.__new__(llm_server.LLMServerManager)
    m.rollout_replica_class = object
    m.__init__(cfg, **kw)
    return m


@pytest.fixture
def manager(monkeypatch):
    def make(env: dict[str, str], cfg=None):
        for k in list(os.environ):
            if k.startswith("ROLLOUT_REBALANCE"):
                monkeypatch.delenv(k)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        rec = RecordingRemote()
        monkeypatch.setattr(llm_server.ray, "remote", rec)
        m = new_manager(cfg or config())
        m.server_addresses, m.server_handles = ["a:1", "b:2"], [object(), object()]
        asyncio.run(m._init_global_load_balancer())
        return m, rec

    return make


def test_switch_off_is_upstream(manager):
    m, rec = manager({})
    assert m._load_balancer_cls is None  # verl 0.9.1: its router picks the strategy (router_config_path)
    assert rec.cls is llm_server.GlobalRequestLoadBalancer and rec.options is None
    assert m.global_load_balancer[2]["full_determinism"] is False
    assert type(m.get_client()) is llm_server.LLMServerClient
    assert type(m.get_client(client_cls=llm_server.FullyAsyncLLMServerClient)) is llm_server.FullyAsyncLLMServerClient
    m, rec = manager({"ROLLOUT_REBALANCE_ENABLE": "0"})
    assert m._load_balancer_cls is None and rec.options is None


def test_switch_on_wires_ours(manager):
    m, rec = manager({"ROLLOUT_REBALANCE_ENABLE": "1", "ROLLOUT_REBALANCE_KEEP_GROUPS": "1"}, config(dp=4))
    assert issubclass(m._load_balancer_cls, RebalanceLoadBalancer)
    s = m._load_balancer_cls.rebalance_settings
    assert (s.max_num_seqs, s.data_parallel_size, s.keep_groups, s.prior_len) == (4, 4, True, 256.0)
    assert rec.options == {"max_concurrency": verl_hook.MAX_CONCURRENCY}
    assert "full_determinism" not in m.global_load_balancer[2]
    client = m.get_client()
    assert isinstance(client, RebalanceClientMixin) and isinstance(client, llm_server.LLMServerClient)
    fa = m.get_client(client_cls=llm_server.FullyAsyncLLMServerClient)
    assert isinstance(fa, RebalanceClientMixin) and isinstance(fa, llm_server.FullyAsyncLLMServerClient)
    # a balancer passed in by the caller wins; full_determinism keeps verl's hash routing
    m2 = new_manager(config(), load_balancer_cls=llm_server.GlobalRequestLoadBalancer)
    assert m2._load_balancer_cls is llm_server.GlobalRequestLoadBalancer


def test_full_determinism_with_the_switch_on_is_a_loud_error_not_a_silent_off(manager, monkeypatch):
    # before: the patched manager logged a warning and kept verl's hash routing, while every rollout
    # server still took DP x max_num_seqs concurrent calls (server_max_concurrency)
    with pytest.raises(NpuRlError, match="full_determinism=True.*would do nothing"):
        manager({"ROLLOUT_REBALANCE_ENABLE": "1"}, config(full_determinism=True))
    monkeypatch.setenv("ROLLOUT_REBALANCE_ENABLE", "1")
    with pytest.raises(NpuRlError, match="ROLLOUT_REBALANCE_ENABLE=0"):
        verl_hook.server_max_concurrency(config(dp=4, full_determinism=True).actor_rollout_ref.rollout, 1000)
    assert verl_hook.server_max_concurrency(config(dp=4).actor_rollout_ref.rollout, 10) == 4 * 4 + 16
    monkeypatch.setenv("ROLLOUT_REBALANCE_ENABLE", "0")  # off: deterministic runs are upstream's
    m, rec = manager({}, config(full_determinism=True))
    assert m._load_balancer_cls is None and rec.cls is llm_server.GlobalRequestLoadBalancer
    assert m.global_load_balancer[2]["full_determinism"] is True


def test_bad_switch_values_name_the_variable(monkeypatch):
    monkeypatch.setenv("ROLLOUT_REBALANCE_ENABLE", "maybe")
    with pytest.raises(NpuRlError, match="ROLLOUT_REBALANCE_ENABLE"):
        verl_hook.load_balancer_cls(config())
    with pytest.raises(NpuRlError, match="ROLLOUT_REBALANCE_ORDER"):
        settings_from({"ROLLOUT_REBALANCE_ORDER": "shortest"})
    with pytest.raises(NpuRlError, match="ROLLOUT_REBALANCE_GATHER_S"):
        settings_from({"ROLLOUT_REBALANCE_GATHER_S": "-1"})


class FakeRemoteMethod:
    def __init__(self, fn):
        self.fn = fn

    def remote(self, *args, **kwargs):
        out = self.fn(*args, **kwargs)
        if asyncio.iscoroutine(out):
            return asyncio.ensure_future(out)
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(out)
        return fut


class ActorLike:
    """Exposes a plain object's methods as ``handle.method.remote(...)`` awaitables (no Ray)."""

    def __init__(self, obj):
        self._obj = obj

    def __getattr__(self, name):
        return FakeRemoteMethod(getattr(self._obj, name))


class FakeServer:
    """A vLLMHttpServer stand-in: response length from the prompt, slots counted per DP rank."""

    def __init__(self, name: str, dies: bool = False):
        self.name, self.dies = name, dies
        self.inflight: Counter = Counter()
        self.max_inflight: Counter = Counter()
        self.ranks: list = []

    async def generate(self, *, prompt_ids, sampling_params, request_id, data_parallel_rank=None, **kw):
        if self.dies:
            raise ActorDiedError()
        r = data_parallel_rank
        self.ranks.append(r)
        self.inflight[r] += 1
        self.max_inflight[r] = max(self.max_inflight[r], self.inflight[r])
        try:
            await asyncio.sleep(0.001 * prompt_ids[0])
            return TokenOutput(token_ids=[1] * (10 * prompt_ids[0]), extra_fields={})
        finally:
            self.inflight[r] -= 1


def run_clients(servers: dict[str, FakeServer], env: dict[str, str], cfg, prompts: list[list[int]]):
    lb_cls = None
    old = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("ROLLOUT_REBALANCE")}
    os.environ.update(env)
    try:
        lb_cls = verl_hook.load_balancer_cls(cfg)
    finally:
        for k in env:
            os.environ.pop(k, None)
        os.environ.update(old)

    async def main():
        lb = lb_cls(servers={k: ActorLike(v) for k, v in servers.items()})
        client_cls = verl_hook.client_cls(llm_server.LLMServerClient, lb_cls)
        client = client_cls(config=cfg, load_balancer_handle=ActorLike(lb))
        outs = await asyncio.gather(
            *(
                client.generate(f"req{i}", prompt_ids=p, sampling_params={"temperature": 1.0})
                for i, p in enumerate(prompts)
            )
        )
        await asyncio.sleep(0.01)  # fire-and-forget releases
        return lb, outs

    return asyncio.run(main())


def test_client_and_balancer_through_verl_generate():
    servers = {"a:1": FakeServer("a"), "b:2": FakeServer("b")}
    prompts = [[L, 7, 7] for L in (5, 1, 9, 2, 8, 3, 7, 4, 6, 1, 1, 1)]
    lb, outs = run_clients(
        servers, {"ROLLOUT_REBALANCE_ENABLE": "1", "ROLLOUT_REBALANCE_GATHER_S": "0"}, config(), prompts
    )
    assert [len(o.token_ids) for o in outs] == [10 * p[0] for p in prompts]
    assert sum(len(s.ranks) for s in servers.values()) == len(prompts)
    assert all(m <= 4 for s in servers.values() for m in s.max_inflight.values())
    assert all(r is None for s in servers.values() for r in s.ranks)  # one target per replica: no DP rank
    assert lb.dispatcher.policy.idle()
    assert len(lb.dispatcher.predictor) == len({tuple(p) for p in prompts})  # learned from the responses
    (m,) = asyncio.run(lb.get_rebalance_metrics())
    assert m["rollout_rebalance/replica0/requests"] + m["rollout_rebalance/replica1/requests"] == len(prompts)
    assert lb.get_all_servers() == ["a:1", "b:2"] and lb.get_total_inflight() == 0


def test_dp_ranks_of_one_replica_are_targets():
    servers = {"only:1": FakeServer("only")}
    prompts = [[1 + i % 5, i] for i in range(40)]
    lb, outs = run_clients(servers, {"ROLLOUT_REBALANCE_ENABLE": "1"}, config(dp=4, max_num_seqs=3), prompts)
    assert len(outs) == 40
    ranks = Counter(servers["only:1"].ranks)
    assert set(ranks) == {0, 1, 2, 3}
    assert max(servers["only:1"].max_inflight.values()) <= 3
    assert sorted(lb.dispatcher.policy.targets) == [f"replica0#dp{r}" for r in range(4)]
    # with DP-rank routing off, vLLM chooses the rank again (no data_parallel_rank passed)
    servers = {"only:1": FakeServer("only")}
    run_clients(servers, {"ROLLOUT_REBALANCE_ENABLE": "1", "ROLLOUT_REBALANCE_DP_RANKS": "0"}, config(dp=4), prompts)
    assert set(servers["only:1"].ranks) == {None}


def test_dead_replica_is_retried_elsewhere():
    servers = {"dead:1": FakeServer("dead", dies=True), "ok:2": FakeServer("ok")}
    prompts = [[2, i] for i in range(12)]
    lb, outs = run_clients(servers, {"ROLLOUT_REBALANCE_ENABLE": "1"}, config(), prompts)
    assert len(outs) == 12 and len(servers["ok:2"].ranks) == 12
    assert lb.dispatcher.policy.targets["replica0"].healthy is False  # "dead:1" registered first


def test_split_server_id():
    assert split_server_id("replica2#dp3|abc:7") == ("replica2#dp3", "abc:7", 3)
    assert split_server_id("replica0|x:1") == ("replica0", "x:1", None)
    assert split_server_id("10.0.0.1:80") == ("10.0.0.1:80", "", None)  # verl's own id: no ticket


def _function(path: Path, cls: str, name: str) -> ast.AsyncFunctionDef:
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for f in node.body:
                if isinstance(f, ast.AsyncFunctionDef | ast.FunctionDef) and f.name == name:
                    return f
    raise AssertionError(f"{cls}.{name} not found in {path}")


def test_vllm_server_passes_dp_rank_only_when_set():
    f = _function(SOURCES / "verl/verl/workers/rollout/vllm_rollout/vllm_async_server.py", "vLLMHttpServer", "generate")
    args = [a.arg for a in f.args.args]
    assert args[-1] == "data_parallel_rank" and isinstance(f.args.defaults[-1], ast.Constant)
    assert f.args.defaults[-1].value is None
    calls = [
        n
        for n in ast.walk(f)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "generate"
    ]
    engine_call = next(c for c in calls if ast.unparse(c.func) == "self.engine.generate")
    assert any(k.arg is None and "data_parallel_rank" in ast.unparse(k.value) for k in engine_call.keywords)
    assert "if data_parallel_rank is not None" in ast.unparse(engine_call)
    # vLLM 0.23's AsyncLLM.generate takes the rank
    g = _function(SOURCES / "vllm/vllm/v1/engine/async_llm.py", "AsyncLLM", "generate")
    assert "data_parallel_rank" in [a.arg for a in g.args.args + g.args.kwonlyargs]


def test_trainer_gets_the_step_metrics(monkeypatch):
    assert verl_hook.step_metrics(None) == {}
    off = types.SimpleNamespace(_load_balancer_cls=llm_server.GlobalRequestLoadBalancer)
    assert verl_hook.step_metrics(off) == {}
    servers = {"a:1": FakeServer("a"), "b:2": FakeServer("b")}
    lb, _ = run_clients(servers, {"ROLLOUT_REBALANCE_ENABLE": "1"}, config(), [[3, i] for i in range(10)])
    handle = types.SimpleNamespace(
        get_rebalance_metrics=types.SimpleNamespace(remote=lambda **kw: lb.get_rebalance_metrics(**kw))
    )
    manager = types.SimpleNamespace(_load_balancer_cls=type(lb), global_load_balancer=handle)
    monkeypatch.setattr(verl_hook_ray(), "get", asyncio.run)  # the actor call, run here (no Ray)
    m = verl_hook.step_metrics(manager, wait_idle_s=0.1)
    assert m["rollout_rebalance/steps"] == 1.0
    assert m["rollout_rebalance/replica0/requests"] + m["rollout_rebalance/replica1/requests"] == 10
    assert 0.0 <= m["rollout_rebalance/idle_fraction/max"] <= 1.0
    assert verl_hook.step_metrics(manager, wait_idle_s=0.0) == {}  # consumed
    # the V1 trainer calls the hook right after the replay buffer returned the step's batch
    f = _function(SOURCES / "verl/verl/trainer/ppo/v1/trainer_base.py", "PPOTrainer", "_step_once")
    body = ast.unparse(f)
    assert body.index("self.replay_buffer.sample(") < body.index("rebalance_hook.step_metrics(")


def verl_hook_ray():
    import ray

    return ray


def test_classes_travel_to_ray_workers_with_their_settings(monkeypatch, tmp_path):
    """Ray ships the balancer class and the client instance by cloudpickle: a fresh process without
    the switch set must get the bound settings back."""
    import subprocess
    import sys

    from ray import cloudpickle

    monkeypatch.setenv("ROLLOUT_REBALANCE_ENABLE", "1")
    monkeypatch.setenv("ROLLOUT_REBALANCE_KEEP_GROUPS", "1")
    lb_cls = verl_hook.load_balancer_cls(config(dp=2, max_num_seqs=7))
    client = verl_hook.client_cls(llm_server.LLMServerClient, lb_cls)(config=config(), load_balancer_handle=None)
    blob = tmp_path / "blob.pkl"
    blob.write_bytes(cloudpickle.dumps((lb_cls, client)))
    code = (
        f"import pickle; lb, c = pickle.load(open({str(blob)!r}, 'rb')); s = lb.rebalance_settings; "
        "print(s.max_num_seqs, s.data_parallel_size, s.keep_groups, type(c).__mro__[1].__name__)"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLOUT_REBALANCE")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.stdout.split() == ["7", "2", "True", "RebalanceClientMixin"], out.stderr[-2000:]


def test_replica_server_concurrency(monkeypatch):
    """verl lets a replica's server actor run max(1000, max_num_seqs + 16) calls; with DP ranks as
    targets the dispatcher needs DP x max_num_seqs of them (the real property, patched)."""
    from verl.workers.rollout.replica import RolloutReplica

    class Replica(RolloutReplica):  # the property under test is RolloutReplica's own
        async def launch_servers(self):
            raise NotImplementedError

    replica = Replica.__new__(Replica)
    replica.config = types.SimpleNamespace(max_num_seqs=256, data_parallel_size=32)
    monkeypatch.delenv("ROLLOUT_REBALANCE_ENABLE", raising=False)
    assert replica.max_concurrency == 1000  # upstream value: ~30 requests per DP rank reach vLLM
    monkeypatch.setenv("ROLLOUT_REBALANCE_ENABLE", "1")
    assert replica.max_concurrency == 32 * 256 + 16
    replica.config = types.SimpleNamespace(max_num_seqs=256, data_parallel_size=1)
    assert replica.max_concurrency == 1000  # one engine per replica: verl's value already suffices


def test_preflight_refuses_the_switch_with_full_determinism():
    from npu_rl.preflight import run_preflight
    from tests.test_preflight_on_cpu import BASE, ENV_2X16

    on = {**ENV_2X16, "ROLLOUT_REBALANCE_ENABLE": "1"}
    r = run_preflight([*BASE, "actor_rollout_ref.rollout.full_determinism=True"], on)
    p = {e.key: e for e in r.report.errors}["ROLLOUT_REBALANCE_ENABLE"]
    assert "keeps verl's hash routing: rollout rebalance would do nothing" in p.message
    assert p.fix == "set ROLLOUT_REBALANCE_ENABLE=0, or actor_rollout_ref.rollout.full_determinism=False"
    assert "ROLLOUT_REBALANCE_ENABLE" not in {e.key for e in run_preflight(list(BASE), on).report.errors}
