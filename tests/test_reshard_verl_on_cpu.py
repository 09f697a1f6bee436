"""verl patch 0005 (expert reshard) and mbridge patch 0001 (export skip) against the real, patched code.

What runs for real: verl's ``MegatronEngine.get_per_tensor_param`` (the patched export),
``ActorRolloutRefWorker.update_weights`` (the patched naive branch), mbridge 0.15.1's
``Qwen3MoEBridge.export_weights`` (PP broadcast, TP merge, EP all-gather, HF names) with the skip
argument, megatron-core's ``initialize_model_parallel`` (TP 2 x PP 2 x EP 2 on 4 gloo processes) and
npu_rl's planner and exchange. What is replaced: the Megatron GPTModel itself (TEGroupedMLP needs
Transformer Engine and a device) by a module with the same parameter names and layer numbers, the
engine object (built without ``__init__``), the device (``load_megatron_model_to_gpu``, mbridge's
``torch.cuda.current_device()`` buffers on the CPU) and, for
``update_weights``, the rollout server and device-memory helpers. The vLLM side is checked on the
names: every yielded expert name maps through vLLM's own ``FusedMoE.make_expert_params_mapping``;
that ``FusedMoE.weight_loader`` returns False for experts that are not local (so a subset loads) was
read in the pinned tree (``vllm/model_executor/layers/fused_moe/layer.py``), not run.
"""

from __future__ import annotations

import asyncio
import types

import pytest
import torch
from omegaconf import OmegaConf

from npu_rl.errors import NpuRlError
from npu_rl.reshard import hook
from npu_rl.reshard.exchange import hf_names
from npu_rl.reshard.plan import RolloutLayout, is_expert_param
from tests.procs import run_gloo_ranks

pytest.importorskip("verl", reason="verl is not installed: run 'bash install_stack.sh --cpu' first")

H, F, E, LAYERS, VOCAB = 8, 12, 8, 4, 32


def _rollout_cfg(on: bool, tp: int = 2, dp: int = 2):
    return OmegaConf.create(
        {
            "tensor_model_parallel_size": tp,
            "data_parallel_size": dp,
            "pipeline_model_parallel_size": 1,
            "expert_parallel_size": tp * dp,
            "checkpoint_engine": {"backend": "naive", "expert_reshard": on},
            "free_cache_engine": False,
        }
    )


class FakeGPT(torch.nn.Module):
    """Parameter names and layer numbers of a Megatron Qwen3-MoE GPTModel (TEGroupedMLP) on one PP stage."""

    def __init__(self, pp_rank: int, pp: int, ep_rank: int, ep: int):
        super().__init__()
        per_stage, per_rank = LAYERS // pp, E // ep
        g = torch.Generator().manual_seed(7)
        rnd = lambda *s: torch.randn(*s, generator=g).to(torch.bfloat16)  # noqa: E731 - same values on all ranks
        full = {
            (layer, e): (rnd(2 * F, H), rnd(H, F)) for layer in range(LAYERS) for e in range(E)
        }  # linear_fc1 [gate; up], linear_fc2
        self.decoder = torch.nn.Module()
        self.decoder.layers = torch.nn.ModuleList()
        for i in range(per_stage):
            glob = pp_rank * per_stage + i
            layer = torch.nn.Module()
            layer.layer_number = glob + 1
            layer.self_attention = torch.nn.Module()
            layer.self_attention.linear_proj = torch.nn.Module()
            layer.self_attention.linear_proj.weight = torch.nn.Parameter(rnd(H, H) + glob)
            layer.mlp = torch.nn.Module()
            layer.mlp.router = torch.nn.Module()
            layer.mlp.router.weight = torch.nn.Parameter(rnd(E, H))
            layer.mlp.experts = torch.nn.Module()
            for fam, idx in (("linear_fc1", 0), ("linear_fc2", 1)):
                m = torch.nn.Module()
                for k in range(per_rank):
                    m.register_parameter(f"weight{k}", torch.nn.Parameter(full[(glob, ep_rank * per_rank + k)][idx]))
                setattr(layer.mlp.experts, fam, m)
            self.decoder.layers.append(layer)
        if pp_rank == 0:
            self.embedding = torch.nn.Module()
            self.embedding.word_embeddings = torch.nn.Module()
            self.embedding.word_embeddings.weight = torch.nn.Parameter(rnd(VOCAB, H))
        if pp_rank == pp - 1:
            self.decoder.final_layernorm = torch.nn.Module()
            self.decoder.final_layernorm.weight = torch.nn.Parameter(rnd(H))
            self.output_layer = torch.nn.Module()
            self.output_layer.weight = torch.nn.Parameter(rnd(VOCAB, H))


def _engine(bridge, module):
    from verl.workers.engine.megatron.transformer_impl import MegatronEngine

    engine = object.__new__(MegatronEngine)  # no __init__: it would build the real model
    engine.peft_cls, engine.vanilla_bridge, engine._qat_enabled = None, True, False
    engine.model_config = types.SimpleNamespace(lora={})
    engine.bridge, engine.module = bridge, module
    return engine


def _rank_export(rank: int, world: int):
    import verl.workers.engine.megatron.transformer_impl as ti
    from mbridge import AutoBridge
    from megatron.core import parallel_state as mpu
    from transformers import Qwen3MoeConfig

    mpu.initialize_model_parallel(2, 2, expert_model_parallel_size=2, expert_tensor_parallel_size=1)
    ti.load_megatron_model_to_gpu = lambda *a, **k: None  # device moves only
    torch.cuda.current_device = lambda: "cpu"  # mbridge allocates PP-broadcast buffers there
    cfg = Qwen3MoeConfig(
        hidden_size=H, intermediate_size=16, moe_intermediate_size=F, num_experts=E, num_experts_per_tok=2,
        num_hidden_layers=LAYERS, num_attention_heads=2, num_key_value_heads=1, head_dim=4, vocab_size=VOCAB,
    )  # fmt: skip
    bridge = AutoBridge.from_config(cfg)
    module = [FakeGPT(mpu.get_pipeline_model_parallel_rank(), 2, mpu.get_expert_model_parallel_rank(), 2)]
    engine = _engine(bridge, module)
    out = {}

    # switch off: the patched export is mbridge's generator, unchanged
    off, _ = engine.get_per_tensor_param(layered_summon=False, base_sync_done=True, **hook.reshard_kwargs({}, {}))
    assert off.gi_code is type(bridge).export_weights.__code__, "switch off must return mbridge's own generator"
    pinned = [(n, t.clone()) for n, t in off]
    direct = list(bridge.export_weights(module))
    assert [n for n, _ in pinned] == [n for n, _ in direct]
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(pinned, direct, strict=True))
    out["pinned"] = len(pinned)

    # switch on (env alias): non-experts from mbridge as before, experts only this rank's vLLM ones
    kwargs = hook.reshard_kwargs(_rollout_cfg(False), {"ALL_TO_ALL_RESHARD": "1"})
    assert kwargs[hook.KWARG]["rollout"] == RolloutLayout(tp=2, dp=2, ep=4)
    on, _ = engine.get_per_tensor_param(layered_summon=False, base_sync_done=True, **kwargs)
    got = [(n, t.clone()) for n, t in on]
    ref = dict(pinned)
    roll = RolloutLayout(tp=2, dp=2, ep=4)
    mine = roll.experts(roll.ep_rank(rank), E)
    want_experts = {n for layer in range(LAYERS) for f in ("fc1", "fc2") for e in mine for n in hf_names(layer, f, e)}
    non_expert = [n for n in ref if ".mlp.experts." not in n]
    assert [n for n, _ in got if ".mlp.experts." not in n] == non_expert
    assert {n for n, _ in got if ".mlp.experts." in n} == want_experts
    assert len(got) == len(non_expert) + len(want_experts)
    for n, t in got:
        assert torch.equal(t, ref[n]), f"{n} differs from mbridge's export"
    out["resharded"] = len(got)
    out["expert_names"] = sorted(want_experts)

    # a rank order the planner does not know is refused, not silently mis-sent
    real = mpu.get_expert_model_parallel_rank
    mpu.get_expert_model_parallel_rank = lambda: 1 - real()
    try:
        hook.local_expert_shards(bridge, module, roll)
        raise AssertionError("a mismatching rank order was accepted")
    except NpuRlError as e:
        assert "the reshard planner" in str(e)
    finally:
        mpu.get_expert_model_parallel_rank = real
    return out


@pytest.mark.slow  # gloo processes
def test_patched_megatron_export_with_real_mbridge_on_gloo():
    results = run_gloo_ranks(_rank_export, 4)
    _check_vllm_maps(sorted({n for out in results for n in out["expert_names"]}))
    for out in results:
        # every rank exported all 4 layers x 8 experts x 3 weights before, 4 x 2 x 3 now (8 experts / EP 4)
        assert out["pinned"] - out["resharded"] == LAYERS * (E - 2) * 3


def _check_vllm_maps(names: list[str]) -> None:
    """Each expert name maps to exactly its expert and shard in vLLM's Qwen3-MoE expert mapping."""
    from vllm.model_executor.layers.fused_moe.layer import FusedMoE

    mapping = FusedMoE.make_expert_params_mapping(torch.nn.Module(), "gate_proj", "down_proj", "up_proj", E)
    shard = {"gate_proj": "w1", "down_proj": "w2", "up_proj": "w3"}
    assert len(names) == LAYERS * E * 3  # the ranks together received every expert weight once per replica
    for n in names:
        hits = [(eid, sid) for _, wname, eid, sid in mapping if wname in n]
        assert hits == [(int(n.split(".")[5]), shard[n.split(".")[6]])], (n, hits)


def _worker_env(monkeypatch):
    """verl's ActorRolloutRefWorker module with the device-memory helpers stubbed (no accelerator here)."""
    import verl.workers.engine_workers as ew

    for name in ("set_expandable_segments", "aggressive_empty_cache", "log_gpu_memory_usage"):
        monkeypatch.setattr(ew, name, lambda *a, **k: None)
    # verl 0.9.1 synchronises and empties the device cache after the sync: no accelerator here
    device = types.SimpleNamespace(synchronize=lambda *a: None, empty_cache=lambda: None)
    monkeypatch.setattr(ew, "get_torch_device", lambda: device)
    for k in ("ALL_TO_ALL_RESHARD", "USE_ALLTOALL_OVERLAP", "ALL_TO_ALL_RESHARD_BUCKET_MB"):
        monkeypatch.delenv(k, raising=False)
    return ew


def _recording(engine_cls, calls: list, vanilla: bool = True, runs_reshard: bool = True):
    """An engine object of ``engine_cls`` (no ``__init__``) whose export records its kwargs and, with
    ``runs_reshard``, marks them as ``hook.export_weights`` does when its exchange ran to the end."""

    class Recording(engine_cls):
        is_param_offload_enabled = False

        def get_per_tensor_param(self, **kwargs):
            calls.append({k: dict(v) if isinstance(v, dict) else v for k, v in kwargs.items()})
            if runs_reshard and hook.KWARG in kwargs:
                kwargs[hook.KWARG]["received"] = 1
            return iter([("w", torch.ones(1))]), None

    engine = object.__new__(Recording)
    engine.vanilla_bridge = vanilla
    return engine


def _worker(ew, rollout_cfg, engine, loaded: list):
    class Rollout:
        async def update_weights(self, weights, **kwargs):
            loaded.extend(weights)

    worker = object.__new__(ew.ActorRolloutRefWorker)
    worker.config = OmegaConf.create({"rollout": rollout_cfg})
    worker.actor = types.SimpleNamespace(engine=engine)
    worker.rollout, worker.peft_merge, worker.layered_summon, worker.base_sync_done = Rollout(), False, False, True
    return worker


def test_update_weights_passes_the_rollout_layout_only_when_switched_on(monkeypatch):
    from verl.workers.engine.megatron.transformer_impl import MegatronEngine

    ew = _worker_env(monkeypatch)
    calls, loaded, returned = [], [], []
    for on, env in ((False, {}), (True, {}), (False, {"ALL_TO_ALL_RESHARD": "1"})):
        worker = _worker(ew, _rollout_cfg(on, tp=4, dp=8), _recording(MegatronEngine, calls), loaded)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        returned.append(asyncio.run(ew.ActorRolloutRefWorker.update_weights.__wrapped__(worker, mode="naive")))
    # the step metric: verl's None when off, the active flag when the export resharded
    assert returned == [None, {hook.ACTIVE_METRIC: 1.0}, {hook.ACTIVE_METRIC: 1.0}]
    assert hook.KWARG not in calls[0]
    assert calls[1][hook.KWARG] == calls[2][hook.KWARG]
    assert calls[1][hook.KWARG] == {"rollout": RolloutLayout(tp=4, dp=8, ep=32), "bucket_bytes": None, "overlap": False}
    assert len(loaded) == 3


def _eplb(**vllm):
    cfg = _rollout_cfg(True, tp=4, dp=8)
    cfg.engine_kwargs = {"vllm": vllm}
    return cfg


# (what is wrong, rollout config, engine class path, vanilla_mbridge, mode, key named in the error)
DROPPED = [
    ("Megatron-Bridge (verl's default)", _rollout_cfg(True), "megatron", False, "naive", "megatron.vanilla_mbridge"),
    ("FSDP engine", _rollout_cfg(True), "fsdp", False, "naive", "actor.strategy"),
    ("non-naive backend", _rollout_cfg(True), "megatron", True, "nccl", "checkpoint_engine.backend"),
    ("sglang rollout", OmegaConf.merge(_rollout_cfg(True), {"name": "sglang"}), "megatron", True, "naive", "name"),
    ("vLLM EPLB", _eplb(enable_eplb=True), "megatron", True, "naive", "vllm.enable_eplb"),
    (
        "vLLM redundant experts",
        _eplb(eplb_config={"num_redundant_experts": 2}),
        "megatron",
        True,
        "naive",
        "eplb_config.num_redundant_experts",
    ),
    ("round-robin placement", _eplb(expert_placement_strategy="round_robin"), "megatron", True, "naive", "placement"),
    (
        "vllm-ascend dynamic EPLB",
        _eplb(additional_config={"eplb_config": {"dynamic_eplb": True}}),
        "megatron",
        True,
        "naive",
        "additional_config.eplb_config.dynamic_eplb",
    ),
    (
        "vllm-ascend expert map (JSON string)",
        _eplb(additional_config='{"eplb_config": {"expert_map_path": "/x/map.json"}}'),
        "megatron",
        True,
        "naive",
        "additional_config.eplb_config.expert_map_path",
    ),
    (
        "vllm-ascend redundant experts",
        _eplb(additional_config={"eplb_config": {"num_redundant_experts": 16}}),
        "megatron",
        True,
        "naive",
        "additional_config.eplb_config.num_redundant_experts",
    ),
    (
        "vllm-ascend mix placement",
        _eplb(additional_config={"mix_placement": True}),
        "megatron",
        True,
        "naive",
        "additional_config.mix_placement",
    ),
]


def _engine_cls(kind: str):
    if kind == "fsdp":
        from verl.workers.engine.fsdp.transformer_impl import FSDPEngine

        return FSDPEngine
    from verl.workers.engine.megatron.transformer_impl import MegatronEngine

    return MegatronEngine


@pytest.mark.parametrize("what,rollout_cfg,engine,vanilla,mode,key", DROPPED, ids=[d[0] for d in DROPPED])
def test_update_weights_refuses_a_switched_on_reshard_it_would_drop(
    monkeypatch, what, rollout_cfg, engine, vanilla, mode, key
):
    """No silent no-op: the switch on and the path that honours it not taken is a loud error before any
    weight moves; the same settings with the switch off sync as before."""
    ew = _worker_env(monkeypatch)
    calls, loaded = [], []

    async def send_weights(*a, **k):  # a non-naive backend: the checkpoint engine would send instead
        loaded.append("sent")
        return {}

    worker = _worker(ew, rollout_cfg, _recording(_engine_cls(engine), calls, vanilla), loaded)
    worker.checkpoint_engine = types.SimpleNamespace(send_weights=send_weights)
    with pytest.raises(NpuRlError, match="is on but this weight sync would not do it") as err:
        asyncio.run(ew.ActorRolloutRefWorker.update_weights.__wrapped__(worker, mode=mode))
    assert key in str(err.value) and "unset ALL_TO_ALL_RESHARD" in str(err.value)
    assert calls == [] and loaded == []  # nothing exported, nothing loaded
    worker.config.rollout.checkpoint_engine.expert_reshard = False
    asyncio.run(ew.ActorRolloutRefWorker.update_weights.__wrapped__(worker, mode=mode))
    assert loaded and all(hook.KWARG not in c for c in calls)


def test_an_export_that_takes_the_kwargs_and_ignores_them_is_a_loud_error_after_the_sync(monkeypatch):
    """The second guard, independent of the engine's class: the sync checks that the export ran the reshard."""
    from verl.workers.engine.megatron.transformer_impl import MegatronEngine

    ew = _worker_env(monkeypatch)
    calls, loaded = [], []
    engine = _recording(MegatronEngine, calls, vanilla=True, runs_reshard=False)
    worker = _worker(ew, _rollout_cfg(True), engine, loaded)
    with pytest.raises(NpuRlError, match="did not run the reshard"):
        asyncio.run(ew.ActorRolloutRefWorker.update_weights.__wrapped__(worker, mode="naive"))
    assert hook.KWARG in calls[0]


def test_the_active_metric_reaches_the_step_metrics(monkeypatch):
    """update_weights' return -> CheckpointEngineManager (naive) -> PPOTrainerSync.on_step_end ->
    _consume_sync_metrics, which fit() merges into the step's metrics."""
    import verl.checkpoint_engine.base as base
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    for workers, want in (([None, None], {}), ([{hook.ACTIVE_METRIC: 1.0}] * 2, {hook.ACTIVE_METRIC: 1.0})):
        manager = object.__new__(base.CheckpointEngineManager)
        manager.backend = "naive"
        manager.actor_wg = types.SimpleNamespace(update_weights=lambda workers=workers, **k: workers)
        monkeypatch.setattr(base.ray, "get", lambda refs: refs)
        trainer = object.__new__(PPOTrainerSync)
        trainer.checkpoint_manager, trainer.timing_raw, trainer.global_steps = manager, {}, 3
        trainer.on_step_end()
        assert trainer._consume_sync_metrics() == want
        assert trainer._consume_sync_metrics() == {}  # consumed once


def test_the_findings_the_run_time_check_guards_against():
    """Why update_weights checks before exporting: verl's own exports drop the kwarg without a word."""
    import inspect

    from verl.workers.engine.fsdp.transformer_impl import FSDPEngine
    from verl.workers.engine.megatron import transformer_impl as ti

    # Megatron with Megatron-Bridge (vanilla_mbridge=False, verl's default): export_hf_weights, kwarg dropped
    engine = object.__new__(ti.MegatronEngine)
    engine.peft_cls, engine.vanilla_bridge, engine._qat_enabled = None, False, False
    engine.model_config = types.SimpleNamespace(lora={})
    engine._hf_export_tasks, engine.module = None, []
    marker = iter([("all-gathered", torch.zeros(1))])
    engine.bridge = types.SimpleNamespace(get_conversion_tasks=lambda m: [], export_hf_weights=lambda *a, **k: marker)
    load = ti.load_megatron_model_to_gpu
    ti.load_megatron_model_to_gpu = lambda *a, **k: None
    try:
        out, _ = engine.get_per_tensor_param(base_sync_done=True, **{hook.KWARG: {"rollout": RolloutLayout(tp=2)}})
    finally:
        ti.load_megatron_model_to_gpu = load
    assert out is marker
    # FSDP takes **kwargs and never reads them
    assert "kwargs" in inspect.signature(FSDPEngine.get_per_tensor_param).parameters
    assert "kwargs[" not in inspect.getsource(FSDPEngine.get_per_tensor_param)
    assert hook.engine_kind(engine) == ("megatron", False)
    assert hook.engine_problems(*hook.engine_kind(engine))[0][0].endswith("megatron.vanilla_mbridge")


def test_switch_values():
    assert hook.reshard_kwargs(_rollout_cfg(False), {}) == {}
    on = hook.reshard_kwargs(_rollout_cfg(True), {"USE_ALLTOALL_OVERLAP": "1", "ALL_TO_ALL_RESHARD_BUCKET_MB": "64"})
    assert on[hook.KWARG]["overlap"] is True and on[hook.KWARG]["bucket_bytes"] == 64 << 20
    with pytest.raises(NpuRlError, match="ALL_TO_ALL_RESHARD='maybe' is not a boolean"):
        hook.reshard_kwargs(_rollout_cfg(False), {"ALL_TO_ALL_RESHARD": "maybe"})
    for bad in ("lots", "0", "-4", "nan"):
        with pytest.raises(NpuRlError, match="not a positive number of MiB"):
            hook.reshard_kwargs(_rollout_cfg(True), {"ALL_TO_ALL_RESHARD_BUCKET_MB": bad})
    assert is_expert_param("decoder.layers.0.mlp.experts.linear_fc2.weight3")


def test_config_key_is_in_verls_schema():
    from verl.workers.config.rollout import CheckpointEngineConfig

    assert CheckpointEngineConfig().expert_reshard is False
    assert CheckpointEngineConfig(expert_reshard=True).expert_reshard is True
