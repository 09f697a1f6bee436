"""The reshard planner (npu_rl.reshard.plan) on hand-checked tiny layouts and against the real upstream
rank/expert/layer maps (megatron-core RankGenerator and get_transformer_layer_offset, vLLM
determine_expert_map)."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pytest

from npu_rl.reshard.plan import (
    MoeShape,
    ReshardLayoutError,
    RolloutLayout,
    TrainLayout,
    build_plan,
    is_expert_param,
    layer_stages,
)

SHAPE = MoeShape(experts=8, layers=2, hidden=4, ffn=6)


@pytest.mark.parametrize(
    "world,tp,pp,ep,etp,order",
    [(8, 2, 2, 2, 1, "tp-cp-ep-dp-pp"), (16, 2, 2, 2, 2, "tp-cp-ep-dp-pp"), (8, 1, 2, 4, 1, "tp-cp-ep-dp-pp"),
     (16, 4, 2, 4, 2, "tp-cp-ep-dp-pp"), (8, 2, 2, 2, 1, "tp-pp-dp-ep-cp")],
)  # fmt: skip
def test_train_coords_match_megatron_rank_generator(world, tp, pp, ep, etp, order):
    from megatron.core.parallel_state import RankGenerator

    lay = TrainLayout(world=world, tp=tp, pp=pp, ep=ep, etp=etp, order=order)
    gen = RankGenerator(tp=etp, ep=ep, dp=lay.edp, pp=pp, cp=1, order=order)
    for token, key in (("ep", "ep"), ("tp", "etp"), ("pp", "pp"), ("dp", "edp")):
        for group in gen.get_ranks(token):
            # inside a group only that coordinate varies, and it runs 0..n-1 in group order
            assert [lay.coords(r)[key] for r in group] == list(range(len(group)))
            others = {tuple(v for k, v in lay.coords(r).items() if k != key) for r in group}
            assert len(others) == 1
    assert sorted(lay.rank(**lay.coords(r)) for r in range(world)) == list(range(world))


def test_train_coords_hand_checked():
    # order tp-cp-ep-dp-pp, ETP 1: rank = ep + EP * (edp + EDP * pp); world 8, EP 2, PP 2 -> EDP 2
    lay = TrainLayout(world=8, tp=2, pp=2, ep=2, etp=1)
    assert lay.coords(5) == {"etp": 0, "ep": 1, "edp": 0, "pp": 1}
    assert lay.coords(6) == {"etp": 0, "ep": 0, "edp": 1, "pp": 1}


@pytest.mark.parametrize("experts,ep", [(8, 4), (16, 8), (10, 4), (128, 128), (128, 16)])
@pytest.mark.parametrize("placement", ["linear", "round_robin"])
def test_rollout_experts_match_vllm(experts, ep, placement):
    from vllm.model_executor.layers.fused_moe.expert_map_manager import determine_expert_map

    roll = RolloutLayout(tp=1, dp=ep, placement=placement)
    for rank in range(ep):
        _, emap, _ = determine_expert_map(ep, rank, experts, placement)
        assert roll.experts(rank, experts) == tuple(int(i) for i in (emap >= 0).nonzero().flatten())


def test_layer_stages_hand_checked():
    assert layer_stages(4, 2) == (0, 0, 1, 1)
    assert layer_stages(8, 2, vpp=2) == (0, 0, 1, 1, 0, 0, 1, 1)
    st = layer_stages(94, 8, first=11, last=11)  # the Qwen3-235B recipe
    assert Counter(st) == {0: 11, 7: 11, **{p: 12 for p in range(1, 7)}}
    with pytest.raises(ReshardLayoutError, match="do not split"):
        layer_stages(5, 2)


@pytest.mark.parametrize(
    "layers,pp,vpp,first,last",
    [(8, 2, None, None, None), (94, 8, None, 11, 11), (12, 4, 3, None, None), (10, 3, None, 2, None)],
)
def test_layer_stages_match_megatron_offsets(layers, pp, vpp, first, last):
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    cfg = SimpleNamespace(
        pipeline_model_parallel_size=pp, pipeline_model_parallel_layout=None, num_layers=layers,
        num_layers_in_first_pipeline_stage=first, num_layers_in_last_pipeline_stage=last,
        virtual_pipeline_model_parallel_size=vpp, account_for_embedding_in_pipeline_split=False,
        account_for_loss_in_pipeline_split=False,
    )  # fmt: skip
    starts = sorted(
        (get_transformer_layer_offset(cfg, vp_stage=v, pp_rank=p), p) for p in range(pp) for v in range(vpp or 1)
    )
    want = []
    for (start, p), (end, _) in zip(starts, [*starts[1:], (layers, None)], strict=True):
        want += [p] * (end - start)
    assert layer_stages(layers, pp, vpp or 1, first, last) == tuple(want)


def _check_complete(plan):
    """Every rank gets exactly the expert weights its rollout rank owns, each shard exactly once."""
    world = plan.train.world
    got = {r: Counter() for r in range(world)}
    for u in plan.local_units:
        got[u.dst][(u.layer, u.family, u.expert)] += 1
    for _, units in plan.rounds:
        for u in units:
            got[u.dst][(u.layer, u.family, u.expert)] += 1
            for s, src in enumerate(u.srcs):
                assert src in plan.holders(u.layer, u.expert, s)
    for r in range(world):
        assert got[r] == Counter(plan.needed(r))
        assert plan.bytes_received(r) == plan.lower_bound_received(r)


def test_all_local_when_layouts_agree():
    # 8 experts, train EP 4 on 4 ranks; rollout TP 2 x DP 2 (EP 4, linear): rank r owns experts 2r, 2r+1 on both sides
    plan = build_plan(TrainLayout(world=4, ep=4), RolloutLayout(tp=2, dp=2), SHAPE)
    assert plan.rounds == []
    assert sorted({u.expert for u in plan.local_units if u.dst == 3}) == [6, 7]
    _check_complete(plan)


def test_two_replicas_hand_checked():
    # rollout EP 2 (two replicas of TP 2) on 4 ranks, train EP 4: rank 1 is EP rank 1 -> experts 4..7,
    # held by train ranks 2 (4, 5) and 3 (6, 7); per layer and family 4 experts arrive, none is local
    plan = build_plan(TrainLayout(world=4, ep=4), RolloutLayout(tp=2, dp=1), SHAPE)
    units = [u for _, us in plan.rounds for u in us]
    srcs = {(u.expert, u.srcs) for u in units if u.dst == 1 and u.layer == 0 and u.family == "fc1"}
    assert srcs == {(4, (2,)), (5, (2,)), (6, (3,)), (7, (3,))}
    fc1, fc2 = 2 * 6 * 4 * 2, 4 * 6 * 2  # bytes of one expert: 2F x H and H x F in bf16
    assert plan.bytes_received(1) == 2 * 4 * (fc1 + fc2)  # 2 layers x 4 experts
    # rank 2 (EP rank 0 of replica 1) needs 0..3 from ranks 0, 1 and sends 4, 5 to ranks 1 and 3
    assert plan.bytes_sent(2) == 2 * 2 * 2 * (fc1 + fc2)
    _check_complete(plan)


def test_etp_units_gather_every_shard():
    # world 4, EP 2 x ETP 2 (EDP 1): rank = etp + 2 * ep; rollout TP 4 (EP 4): rank r needs experts 2r, 2r+1
    plan = build_plan(TrainLayout(world=4, tp=2, ep=2, etp=2), RolloutLayout(tp=4), SHAPE)
    units = {u.expert: u.srcs for _, us in plan.rounds for u in us if u.dst == 0 and u.layer == 1}
    assert units == {0: (0, 1), 1: (0, 1)}  # shard 0 is local, shard 1 comes from rank 1
    assert {u.expert: u.srcs for _, us in plan.rounds for u in us if u.dst == 3 and u.layer == 1} == {
        6: (2, 3),
        7: (2, 3),
    }
    _check_complete(plan)


def test_pipeline_and_edp_copies_balance_senders():
    # world 8, PP 2, EP 2, ETP 1 -> EDP 2: each shard has two copies; rollout TP 2 x DP 2 -> EP 4, 2 replicas
    train = TrainLayout(world=8, tp=2, pp=2, ep=2)
    plan = build_plan(train, RolloutLayout(tp=2, dp=2), MoeShape(8, 4, 4, 6))
    _check_complete(plan)
    sent = [plan.bytes_sent(r) for r in range(8)]
    assert max(sent) - min(sent) <= plan.piece_bytes("fc1") + plan.piece_bytes("fc2")


@pytest.mark.parametrize("bucket", [None, 1, 200, 5000])
def test_rounds_respect_the_budget(bucket):
    plan = build_plan(TrainLayout(world=8, pp=2, ep=4), RolloutLayout(tp=1, dp=8), MoeShape(16, 4, 4, 6), None, bucket)
    _check_complete(plan)
    for r in range(8):
        for rr in plan.rank_rounds(r):
            n_recv = sum(len(p) for p in rr.recv)
            n_send = sum(len(p) for p in rr.send)
            pb = plan.piece_bytes(rr.family)
            if bucket is None or bucket < pb:
                assert len(rr.units) <= 1 and n_send <= 1
            else:
                assert n_recv * pb <= bucket and n_send * pb <= bucket
            assert sum(rr.in_splits) == n_send * plan.shape.numel(rr.family)
    if bucket is None:
        assert all(len(plan.rounds) >= n for n in plan.min_rounds().values())


def test_dense_layers_are_left_out():
    # layer 0 dense (as DeepSeek-V3's first layers): only layers 1 and 2 move experts
    plan = build_plan(TrainLayout(world=4, ep=4), RolloutLayout(tp=2), MoeShape(8, 3, 4, 6), moe_layers=[2, 1])
    assert plan.moe_layers == (1, 2)
    assert {u.layer for _, us in plan.rounds for u in us} | {u.layer for u in plan.local_units} == {1, 2}
    _check_complete(plan)
    with pytest.raises(ReshardLayoutError, match="moe_layers"):
        build_plan(TrainLayout(world=4, ep=4), RolloutLayout(tp=2), MoeShape(8, 3, 4, 6), moe_layers=[3])


def test_split_sizes_agree_between_sender_and_receiver():
    plan = build_plan(TrainLayout(world=8, tp=2, ep=2, etp=2), RolloutLayout(tp=2, dp=4), MoeShape(16, 3, 4, 6))
    views = [plan.rank_rounds(r) for r in range(8)]
    for k in range(len(plan.rounds)):
        for a in range(8):
            for b in range(8):
                assert views[a][k].send[b] == views[b][k].recv[a]
                assert views[a][k].in_splits[b] == views[b][k].out_splits[a]


@pytest.mark.parametrize(
    "train,roll,experts,key,text",
    [
        (TrainLayout(world=8, ep=3), RolloutLayout(tp=2, dp=4), 8, "train layout", "not divisible by ETP 1 x EP 3"),
        (TrainLayout(world=8, ep=8), RolloutLayout(tp=2, dp=4), 12, "expert_model_parallel_size", "does not divide 12"),
        (TrainLayout(world=8, ep=4), RolloutLayout(tp=8), 12, "rollout expert_parallel_size", "does not divide 12"),
        (TrainLayout(world=8, ep=4), RolloutLayout(tp=8, ep=1), 8, "rollout expert_parallel_size", "is off"),
        (TrainLayout(world=8, ep=4), RolloutLayout(tp=2, dp=2, ep=2), 8, "rollout expert_parallel_size", "!= TP 2"),
        (TrainLayout(world=8, ep=4), RolloutLayout(tp=2, dp=3), 12, "rollout layout", "does not tile"),
        (TrainLayout(world=8, ep=4), RolloutLayout(tp=2, dp=2, pp=2), 8, "rollout pipeline", "not supported"),
        (TrainLayout(world=8, ep=4, order="tp-ep-xx"), RolloutLayout(tp=8), 8, "train order", "not a Megatron"),
        (TrainLayout(world=8, ep=4), RolloutLayout(tp=8, placement="spread"), 8, "expert_placement", "not one of"),
    ],
)
def test_bad_layouts_are_rejected_with_the_reason(train, roll, experts, key, text):
    with pytest.raises(ReshardLayoutError) as e:
        build_plan(train, roll, MoeShape(experts, 2, 4, 6))
    assert any(k.startswith(key) and text in m for k, m, _ in e.value.problems), e.value.problems
    assert text in str(e.value)


def test_every_problem_is_reported_at_once():
    with pytest.raises(ReshardLayoutError) as e:
        build_plan(TrainLayout(world=8, ep=3), RolloutLayout(tp=8, ep=1), MoeShape(8, 2, 4, 6))
    assert len(e.value.problems) >= 2


def test_expert_param_names_follow_mbridge():
    assert is_expert_param("decoder.layers.3.mlp.experts.linear_fc1.weight7")
    assert not is_expert_param("decoder.layers.3.mlp.shared_experts.linear_fc1.weight")
    assert not is_expert_param("decoder.layers.3.mlp.router.weight")


def test_qwen3_235b_recipe_layout():
    # grpo_128die.sh: train TP 4 PP 8 (11 / 6 x 12 / 11) EP 16 ETP 1; rollout TP 4 x DP 32, EP 128
    shape = MoeShape(experts=128, layers=94, hidden=4096, ffn=1536)
    plan = build_plan(
        TrainLayout(world=128, tp=4, pp=8, ep=16), RolloutLayout(tp=4, dp=32), shape, layer_stages(94, 8, 1, 11, 11)
    )
    one_expert = 3 * 4096 * 1536 * 2
    for r in (0, 5, 127):
        assert plan.lower_bound_received(r) == plan.bytes_received(r)
        assert plan.bytes_received(r) <= 94 * one_expert  # one expert per layer
        assert plan.peak_transient(r) == 2 * 4096 * 1536 * 2  # one fc1 expert, nothing staged
