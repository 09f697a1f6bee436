"""Proof of the result, not of the bytes: after an all-to-all-v sync every vLLM rank holds, bit for bit, the
expert weights the all-gather path gives it, with the sharding and the expectation built without the planner.

Garbled MoE rollouts after a weight sync (experts sent to the wrong rank: vLLM's loader skips them and
the old weights stay) are among the most reported Ascend RL bugs, so nothing here comes from
``npu_rl/reshard/plan.py`` except through the code under test:

- training side: megatron-core's own ``initialize_model_parallel`` on 8 gloo processes; each rank's
  expert coordinates come from megatron-core's ``RankGenerator`` (the expert generator
  ``initialize_model_parallel`` builds, order ``tp-cp-ep-dp-pp``: checked against ``parallel_state``),
  its experts are Megatron's contiguous block ``[ep*E/EP, (ep+1)*E/EP)`` and its ETP shard is cut by
  mbridge's own loader functions (``_weight_to_mcore_format``, ``_weight_split_across_tp``) from seeded
  Hugging Face tensors;
- expectation: mbridge 0.15.1's ``Bridge.export_weights`` (the all-gather path) on the same module,
  kept for the experts vLLM places on the colocated rank: vLLM's ``determine_expert_map`` (linear, what
  vllm-ascend builds without EPLB) for EP rank = trainer rank mod (rollout TP x DP) (verl's
  ``ServerAdapter`` pairing; vLLM's EP rank = ``dp_rank * TP + tp_rank``);
- under test: the patched verl ``MegatronEngine.get_per_tensor_param`` with the kwargs
  ``reshard_kwargs`` gives (real planner and ``all_to_all_single`` exchange);
- the vLLM side is simulated as its loader does it: each weight goes to ``expert_map[global id]`` and
  is skipped when -1 (``FusedMoE.weight_loader`` returns False); the local expert slots start as
  "stale" tensors and must all be overwritten with the all-gather path's values.
"""

from __future__ import annotations

import io
import types

import pytest
import torch

from tests.procs import run_gloo_ranks

# gloo processes with real vLLM weight loading: left out of --quick.
pytestmark = pytest.mark.slow

pytest.importorskip("verl", reason="verl is not installed: run 'bash install_stack.sh --cpu' first")

H, F, LAYERS, VOCAB = 8, 12, 4, 32
WORLD = 8
# Megatron (TP, PP, EP, ETP) -> vLLM (TP, DP), experts per layer
LAYOUTS = [
    ((2, 2, 4, 1), (2, 4), 16),  # the 235B recipe's ratios: EP over a PP stage, one replica
    ((2, 2, 2, 2), (4, 2), 16),  # ETP 2: shards merged as mbridge merges them
    ((1, 1, 2, 1), (8, 1), 8),  # EDP 4: four copies of every expert shard
    ((1, 1, 8, 1), (2, 2), 16),  # two rollout replicas of 4
    ((4, 1, 2, 4), (1, 8), 8),  # ETP 4, rollout DP only
]
PROJ = ("gate_proj", "up_proj", "down_proj")


def hf_expert(layer: int, expert: int) -> dict[str, torch.Tensor]:
    """Seeded Hugging Face tensors of one expert (the same on every rank)."""
    g = torch.Generator().manual_seed(7919 * layer + expert)
    return {
        "gate_proj": torch.randn(F, H, generator=g).to(torch.bfloat16),
        "up_proj": torch.randn(F, H, generator=g).to(torch.bfloat16),
        "down_proj": torch.randn(H, F, generator=g).to(torch.bfloat16),
    }


def expert_coords(rank: int, tp: int, pp: int, ep: int, etp: int) -> dict[str, int]:
    """(etp, ep, pp) ranks of ``rank`` from megatron-core's expert ``RankGenerator``, as
    ``initialize_model_parallel`` builds it (verl passes no order: the default ``tp-cp-ep-dp-pp``)."""
    from megatron.core.parallel_state import RankGenerator

    gen = RankGenerator(tp=etp, ep=ep, dp=WORLD // (etp * ep * pp), pp=pp, cp=1, order="tp-cp-ep-dp-pp")
    out = {}
    for key, token in (("etp", "tp"), ("ep", "ep"), ("pp", "pp")):
        (group,) = [g for g in gen.get_ranks(token) if rank in g]
        out[key] = group.index(rank)
    return out


class MegatronMoE(torch.nn.Module):
    """Parameter names and layer numbers of Megatron's Qwen3-MoE GPTModel (TEGroupedMLP) on one rank,
    the expert weights cut from :func:`hf_expert` by mbridge's loader functions."""

    def __init__(self, bridge, coords: dict[str, int], pp: int, ep: int, etp: int, experts: int):
        super().__init__()
        per_stage, per_rank = LAYERS // pp, experts // ep
        g = torch.Generator().manual_seed(11)
        rnd = lambda *s: torch.randn(*s, generator=g).to(torch.bfloat16)  # noqa: E731 - same on all ranks
        self.decoder = torch.nn.Module()
        self.decoder.layers = torch.nn.ModuleList()
        for i in range(per_stage):
            glob = coords["pp"] * per_stage + i
            layer = torch.nn.Module()
            layer.layer_number = glob + 1
            layer.self_attention = torch.nn.Module()
            layer.self_attention.linear_proj = torch.nn.Module()
            layer.self_attention.linear_proj.weight = torch.nn.Parameter(rnd(H, H) + glob)
            layer.mlp = torch.nn.Module()
            layer.mlp.router = torch.nn.Module()
            layer.mlp.router.weight = torch.nn.Parameter(rnd(experts, H))
            layer.mlp.experts = torch.nn.Module()
            fams = {"linear_fc1": torch.nn.Module(), "linear_fc2": torch.nn.Module()}
            for k in range(per_rank):
                e = coords["ep"] * per_rank + k  # Megatron's local_expert_indices
                w = hf_expert(glob, e)
                for fam, hf in (("linear_fc1", [w["gate_proj"], w["up_proj"]]), ("linear_fc2", [w["down_proj"]])):
                    name = f"decoder.layers.{glob}.mlp.experts.{fam}.weight{e}"
                    full = bridge._weight_to_mcore_format(name, hf)
                    shard = list(bridge._weight_split_across_tp(name, full, full, etp))[coords["etp"]]
                    fams[fam].register_parameter(f"weight{k}", torch.nn.Parameter(shard.contiguous().clone()))
            for fam, m in fams.items():
                setattr(layer.mlp.experts, fam, m)
            self.decoder.layers.append(layer)
        if coords["pp"] == 0:
            self.embedding = torch.nn.Module()
            self.embedding.word_embeddings = torch.nn.Module()
            self.embedding.word_embeddings.weight = torch.nn.Parameter(rnd(VOCAB, H))
        if coords["pp"] == pp - 1:
            self.decoder.final_layernorm = torch.nn.Module()
            self.decoder.final_layernorm.weight = torch.nn.Parameter(rnd(H))
            self.output_layer = torch.nn.Module()
            self.output_layer.weight = torch.nn.Parameter(rnd(VOCAB, H))


def vllm_load(stream, expert_map: torch.Tensor, experts: int) -> tuple[dict, int]:
    """What vLLM's FusedMoE loader keeps of a weight stream: ``{(layer, proj): [local experts]}``, the
    local slots first filled with stale values; a weight whose ``expert_map`` entry is -1 is skipped.
    Returns the slots and how many expert weights were skipped."""
    local = int((expert_map >= 0).sum())
    stale = torch.full((), -7.0, dtype=torch.bfloat16)
    slots = {
        (la, p): [stale.expand(F, H).clone() if p != "down_proj" else stale.expand(H, F).clone() for _ in range(local)]
        for la in range(LAYERS)
        for p in PROJ
    }
    skipped = 0
    for name, tensor in stream:
        if ".mlp.experts." not in name:
            continue
        parts = name.split(".")  # model.layers.L.mlp.experts.E.proj.weight
        layer, e, proj = int(parts[2]), int(parts[5]), parts[6]
        assert 0 <= e < experts, name
        slot = int(expert_map[e])
        if slot < 0:
            skipped += 1
            continue
        slots[(layer, proj)][slot] = tensor.clone()
    return slots, skipped


def _rank_proof(rank: int, world: int):
    import verl.workers.engine.megatron.transformer_impl as ti
    from mbridge import AutoBridge
    from megatron.core import parallel_state as mpu
    from omegaconf import OmegaConf
    from transformers import Qwen3MoeConfig

    from npu_rl.reshard import hook

    ti.load_megatron_model_to_gpu = lambda *a, **k: None  # device moves only
    torch.cuda.current_device = lambda: "cpu"  # mbridge allocates PP-broadcast buffers there
    report = []
    for i, ((tp, pp, ep, etp), (rtp, rdp), experts) in enumerate(LAYOUTS):
        mpu.initialize_model_parallel(tp, pp, expert_model_parallel_size=ep, expert_tensor_parallel_size=etp)
        try:
            coords = expert_coords(rank, tp, pp, ep, etp)
            real = {
                "etp": mpu.get_expert_tensor_parallel_rank(),
                "ep": mpu.get_expert_model_parallel_rank(),
                "pp": mpu.get_pipeline_model_parallel_rank(),
            }
            assert coords == real, f"layout {i}: RankGenerator {coords} != parallel_state {real}"
            cfg = Qwen3MoeConfig(
                hidden_size=H, intermediate_size=16, moe_intermediate_size=F, num_experts=experts,
                num_experts_per_tok=2, num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=4,
                head_dim=2, vocab_size=VOCAB,
            )  # fmt: skip
            bridge = AutoBridge.from_config(cfg)
            module = [MegatronMoE(bridge, coords, pp, ep, etp, experts)]
            engine = object.__new__(ti.MegatronEngine)  # no __init__: it would build the real model
            engine.peft_cls, engine.vanilla_bridge, engine._qat_enabled = None, True, False
            engine.model_config = types.SimpleNamespace(lora={})
            engine.bridge, engine.module = bridge, module

            # the all-gather path (mbridge's own export) and the model itself
            allgather = [(n, t.clone()) for n, t in bridge.export_weights(module)]
            # the all-to-all-v path, switched on as update_weights switches it on
            rollout = OmegaConf.create(
                {
                    "name": "vllm",
                    "tensor_model_parallel_size": rtp,
                    "data_parallel_size": rdp,
                    "pipeline_model_parallel_size": 1,
                    "expert_parallel_size": rtp * rdp,
                    "checkpoint_engine": {"backend": "naive", "expert_reshard": True},
                }
            )
            kwargs = hook.reshard_kwargs(rollout, {}, engine=engine, backend="naive")
            resharded, _ = engine.get_per_tensor_param(layered_summon=False, base_sync_done=True, **kwargs)
            resharded = [(n, t.clone()) for n, t in resharded]
            assert hook.sync_metrics(kwargs) == {hook.ACTIVE_METRIC: 1.0}  # the export ran the exchange

            # the non-expert stream is mbridge's, unchanged
            dense_got = [(n, t) for n, t in resharded if ".mlp.experts." not in n]
            dense_want = [(n, t) for n, t in allgather if ".mlp.experts." not in n]
            assert [n for n, _ in dense_got] == [n for n, _ in dense_want], f"layout {i}"
            assert all(torch.equal(a, b) for (_, a), (_, b) in zip(dense_got, dense_want, strict=True))
            # the experts go back to the test process, which loads them as vLLM does (one vLLM import)
            experts_of = lambda stream: [(n, t) for n, t in stream if ".mlp.experts." in n]  # noqa: E731
            buf = io.BytesIO()  # bytes, not tensors: a queued tensor's shared memory dies with its process
            torch.save((experts_of(resharded), experts_of(allgather)), buf)
            report.append((i, rank, buf.getvalue()))
        finally:
            mpu.destroy_model_parallel()
    return report


def test_every_vllm_rank_holds_the_allgather_experts_bit_for_bit():
    from vllm.model_executor.layers.fused_moe.expert_map_manager import determine_expert_map

    results = {(i, rank): torch.load(io.BytesIO(data)) for out in run_gloo_ranks(_rank_proof, WORLD, timeout=600)
               for i, rank, data in out}  # fmt: skip
    for i, (_, (rtp, rdp), experts) in enumerate(LAYOUTS):
        held = []
        for rank in range(WORLD):
            got, allgather = results[(i, rank)]
            # the all-gather path hands every rank every expert; vLLM keeps the ones its expert map places here
            assert len(allgather) == LAYERS * experts * 3
            _, expert_map, _ = determine_expert_map(rtp * rdp, rank % (rtp * rdp), experts)
            local = [e for e in range(experts) if int(expert_map[e]) >= 0]
            want_slots, _ = vllm_load(allgather, expert_map, experts)
            got_slots, skipped = vllm_load(got, expert_map, experts)
            assert skipped == 0, (
                f"layout {i} rank {rank}: {skipped} expert weights sent to a rank that does not own them"
            )
            assert len(got) == LAYERS * len(local) * 3, f"layout {i} rank {rank}: {len(got)} expert weights received"
            for (layer, proj), tensors in got_slots.items():
                for slot, e in enumerate(local):
                    t = tensors[slot]  # still stale if the expert never arrived
                    assert t.dtype == torch.bfloat16
                    assert torch.equal(t, want_slots[(layer, proj)][slot]), (
                        f"layout {i} rank {rank}: layer {layer} expert {e} {proj} differs from the all-gather path"
                    )
                    assert torch.equal(t, hf_expert(layer, e)[proj]), f"layout {i} rank {rank}: {layer}/{e}/{proj}"
            held += local
        # every rollout replica's EP ranks together hold every expert exactly once
        assert sorted(held) == sorted(list(range(experts)) * (WORLD // (rtp * rdp))), f"layout {i}"
