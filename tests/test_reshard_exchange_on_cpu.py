"""The all-to-all-v exchange (npu_rl.reshard.exchange) in real multi-process runs on gloo.

A tiny Qwen3-MoE-shaped state (8-16 experts, 2 layers, hidden 8, moe_intermediate 12, bf16) is
sharded the way Megatron holds it (EP/ETP/PP/EDP by the planner's rank map) over 4 and 8 processes;
for each train/rollout layout every rank must end with exactly the experts its rollout rank owns,
bit-identical to the original tensors and to the all-gather path (mbridge 0.15.1's algorithm).
One spawn per world size runs all its layouts, to keep the file fast on 2 cores.
"""

from __future__ import annotations

import pytest
import torch

from npu_rl.reshard.exchange import TrainGroups, allgather_experts, exchange_experts, hf_names
from npu_rl.reshard.plan import MoeShape, RolloutLayout, TrainLayout, build_plan
from tests.procs import run_gloo_ranks

# gloo processes: left out of --quick.
pytestmark = pytest.mark.slow

HIDDEN, FFN, LAYERS = 8, 12, 2

# (train, rollout, experts, bucket_bytes, overlap[, layers with experts])
LAYOUTS = {
    4: [
        (TrainLayout(world=4, ep=4), RolloutLayout(tp=2, dp=2), 8, None, False),  # all local
        (TrainLayout(world=4, tp=2, ep=2, etp=2), RolloutLayout(tp=4, placement="round_robin"), 8, None, False),
        (TrainLayout(world=4, pp=2, ep=2), RolloutLayout(tp=2), 16, None, False),  # two rollout replicas
        (TrainLayout(world=4, ep=4), RolloutLayout(tp=1, dp=4, placement="round_robin"), 16, 2 * 384, True),
        (TrainLayout(world=4, ep=2), RolloutLayout(tp=4), 8, None, False, (1,)),  # layer 0 dense
    ],
    8: [
        (TrainLayout(world=8, tp=2, pp=2, ep=4), RolloutLayout(tp=2, dp=4), 16, None, False),  # 235B ratios
        (TrainLayout(world=8, tp=2, pp=2, ep=2, etp=2), RolloutLayout(tp=4, dp=2), 16, None, True),
        (TrainLayout(world=8, ep=2), RolloutLayout(tp=8), 8, 10_000, True),  # EDP 4 copies
        (TrainLayout(world=8, ep=8), RolloutLayout(tp=2, dp=2), 16, None, False),  # two replicas
        (TrainLayout(world=8, tp=4, ep=2, etp=4, order="tp-cp-ep-pp-dp"), RolloutLayout(tp=1, dp=8), 8, None, False),
    ],
}


def full_expert(layer: int, expert: int) -> dict[str, torch.Tensor]:
    """The Hugging Face tensors of one expert, the same on every rank."""
    g = torch.Generator().manual_seed(1000 * layer + expert)
    return {
        "gate_proj": torch.randn(FFN, HIDDEN, generator=g).to(torch.bfloat16),
        "up_proj": torch.randn(FFN, HIDDEN, generator=g).to(torch.bfloat16),
        "down_proj": torch.randn(HIDDEN, FFN, generator=g).to(torch.bfloat16),
    }


def megatron_shards(plan, rank: int) -> dict:
    """What Megatron holds on ``rank``: linear_fc1 = [gate; up] rows and linear_fc2 columns of its ETP shard."""
    t = plan.train
    c = t.coords(rank)
    per = plan.shape.experts // t.ep
    n = FFN // t.etp
    rows = slice(c["etp"] * n, (c["etp"] + 1) * n)
    out = {}
    for layer in range(LAYERS):
        if plan.layer_stage[layer] != c["pp"] or layer not in plan.moe_layers:
            continue
        for e in range(c["ep"] * per, (c["ep"] + 1) * per):
            w = full_expert(layer, e)
            out[(layer, "fc1", e)] = torch.cat([w["gate_proj"][rows], w["up_proj"][rows]]).contiguous()
            out[(layer, "fc2", e)] = w["down_proj"][:, rows].contiguous()
    return out


def _rank_exchange(rank: int, world: int):
    report = []
    for i, (train, roll, experts, bucket, overlap, *moe) in enumerate(LAYOUTS[world]):
        shape = MoeShape(experts, LAYERS, HIDDEN, FFN)
        plan = build_plan(train, roll, shape, bucket_bytes=bucket, moe_layers=moe[0] if moe else None)
        local = megatron_shards(plan, rank)
        got = dict(exchange_experts(plan, local, overlap=overlap))
        mine = roll.experts(roll.ep_rank(rank), experts)
        want = {n for la in plan.moe_layers for f in ("fc1", "fc2") for e in mine for n in hf_names(la, f, e)}
        assert set(got) == want, f"layout {i}: names differ: {sorted(set(got) ^ want)[:4]}"
        reference = {n: t for n, t in allgather_experts(plan, local, TrainGroups(plan)) if n in want}
        assert set(reference) == want
        for name, tensor in got.items():
            layer, e, proj = int(name.split(".")[2]), int(name.split(".")[5]), name.split(".")[6]
            assert tensor.dtype == torch.bfloat16
            assert torch.equal(tensor, reference[name]), f"layout {i}: {name} differs from the all-gather path"
            assert torch.equal(tensor, full_expert(layer, e)[proj]), f"layout {i}: {name} differs from the model"
        report.append((i, len(plan.rounds), len(got)))
    # a plan for another world size is refused before any collective
    bad = build_plan(TrainLayout(world=2 * world, ep=2), RolloutLayout(tp=2), MoeShape(8, LAYERS, HIDDEN, FFN))
    try:
        next(exchange_experts(bad, megatron_shards(plan, rank)))
        report.append("world mismatch accepted")
    except ValueError as e:
        assert "the plan is for" in str(e)
    return report


@pytest.mark.parametrize("world", [4, 8])
def test_exchange_matches_allgather_on_gloo(world):
    for report in run_gloo_ranks(_rank_exchange, world):
        assert [r[0] for r in report] == list(range(len(LAYOUTS[world])))
        assert report[0][1] == 0 or world == 8  # the first 4-rank layout is all local: no collective
