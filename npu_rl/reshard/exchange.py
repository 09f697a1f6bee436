"""Run a :class:`~npu_rl.reshard.plan.ReshardPlan`: one ``all_to_all_single`` per collective of the plan.

Every rank calls :func:`exchange_experts` with its own expert shards and iterates the result to the
end (the collectives run while iterating, in the same order on every rank). It yields
``(hf_name, tensor)`` for exactly the experts the colocated vLLM rank owns, in the names vLLM 0.23's
Qwen3-MoE loader maps through ``FusedMoE.make_expert_params_mapping``
(``model.layers.{L}.mlp.experts.{E}.{gate,up,down}_proj.weight``). Works on any torch.distributed
backend that implements ``all_to_all_single`` (HCCL on NPU, gloo on CPU).

:func:`allgather_experts` is the pinned path for comparison (mbridge 0.15.1 ``Bridge.export_weights``:
PP broadcast, EP all-gather, ETP all-gather, merge): every rank ends with every expert.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch
import torch.distributed as dist

from npu_rl.reshard.plan import FAMILIES, ReshardPlan, Unit

Key = tuple[int, str, int]  # (layer, family, global expert)


def hf_names(layer: int, family: str, expert: int) -> list[str]:
    """Hugging Face names of one expert weight: fc1 -> gate_proj, up_proj; fc2 -> down_proj."""
    base = f"model.layers.{layer}.mlp.experts.{expert}."
    return [base + "gate_proj.weight", base + "up_proj.weight"] if family == "fc1" else [base + "down_proj.weight"]


def merge_shards(family: str, shards: list[torch.Tensor]) -> list[torch.Tensor]:
    """Full HF tensors from the ETP shards of one expert (mbridge 0.15.1 ``_weight_merge_across_tp`` then
    ``_weight_to_hf_format``): fc1 shards ``[2F/ETP, H]`` (gate rows, then up rows) -> gate ``[F, H]``,
    up ``[F, H]``; fc2 shards ``[H, F/ETP]`` -> down ``[H, F]``. One shard gives views, no copy."""
    if family == "fc1":
        halves = [s.chunk(2) for s in shards]
        if len(shards) == 1:
            return list(halves[0])
        return [torch.cat([h[0] for h in halves]), torch.cat([h[1] for h in halves])]
    return [shards[0] if len(shards) == 1 else torch.cat(shards, dim=1)]


def _shard_shape(plan: ReshardPlan, family: str) -> tuple[int, int]:
    h, f, etp = plan.shape.hidden, plan.shape.ffn, plan.train.etp
    return (2 * f // etp, h) if family == "fc1" else (h, f // etp)


def exchange_experts(
    plan: ReshardPlan,
    local: Mapping[Key, torch.Tensor],
    group: dist.ProcessGroup | None = None,
    overlap: bool = False,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield the experts this rank's rollout owns, moving only what the plan says.

    Args:
        plan: the same plan on every rank of ``group`` (whose ranks are the plan's ranks).
        local: this rank's shards, ``(layer, "fc1"|"fc2", global expert) -> tensor`` of shape
            ``[2F/ETP, H]`` / ``[H, F/ETP]`` (its ETP rank's shard), for every expert it holds.
        overlap: start the next collective before yielding the current one's tensors (two in flight:
            faster when the consumer copies on another engine, twice the transient memory).

    Yields:
        ``(hf_name, tensor)``; tensors may be views of a receive buffer or of ``local`` (copy them
        before changing the weights).

    Raises:
        ValueError: the group, a shard's shape or dtype does not match the plan.
    """
    rank = dist.get_rank(group)
    if dist.get_world_size(group) != plan.train.world:
        raise ValueError(f"the plan is for {plan.train.world} ranks, the group has {dist.get_world_size(group)}")
    if not local:
        raise ValueError(f"rank {rank} holds no expert shards; the plan says every train rank holds some")
    some = next(iter(local.values()))
    dtype, device = some.dtype, some.device
    if some.element_size() != plan.shape.dtype_bytes:
        raise ValueError(f"shards are {dtype} but the plan counts {plan.shape.dtype_bytes} bytes per element")
    for (layer, family, e), t in local.items():
        if tuple(t.shape) != _shard_shape(plan, family):
            raise ValueError(
                f"layer {layer} {family} expert {e}: shard {tuple(t.shape)} != planned {_shard_shape(plan, family)}"
            )

    def assemble(u: Unit, received: Mapping[tuple[int, int, int], torch.Tensor]) -> Iterator[tuple[str, torch.Tensor]]:
        shards = []
        for s, src in enumerate(u.srcs):
            shards.append(local[(u.layer, u.family, u.expert)] if src == rank else received[(u.layer, u.expert, s)])
        yield from zip(hf_names(u.layer, u.family, u.expert), merge_shards(u.family, shards), strict=True)

    for u in plan.local_units:
        if u.dst == rank:
            yield from assemble(u, {})

    rounds = plan.rank_rounds(rank)

    def start(k: int):
        rr = rounds[k]
        pieces = [local[(p.layer, rr.family, p.expert)] for dst in rr.send for p in dst]
        if len(pieces) == 1:
            send = pieces[0].reshape(-1)  # a contiguous parameter: no staging copy
        elif pieces:
            send = torch.cat([p.reshape(-1) for p in pieces])
        else:
            send = torch.empty(0, dtype=dtype, device=device)
        recv = torch.empty(sum(rr.out_splits), dtype=dtype, device=device)
        work = dist.all_to_all_single(
            recv, send, output_split_sizes=rr.out_splits, input_split_sizes=rr.in_splits, group=group, async_op=True
        )
        return rr, recv, send, work

    pending = start(0) if rounds else None
    for k in range(len(rounds)):
        rr, recv, _send, work = pending
        pending = start(k + 1) if overlap and k + 1 < len(rounds) else None
        work.wait()
        shape = _shard_shape(plan, rr.family)
        n = shape[0] * shape[1]
        received, off = {}, 0
        for src_pieces in rr.recv:
            for p in src_pieces:
                received[(p.layer, p.expert, p.shard)] = recv[off : off + n].view(shape)
                off += n
        for u in rr.units:
            yield from assemble(u, received)
        del received, recv, _send
        if pending is None and k + 1 < len(rounds):
            pending = start(k + 1)


class TrainGroups:
    """The expert process groups of a train layout (PP, EP, ETP), created on every rank in one order."""

    def __init__(self, plan: ReshardPlan):
        t = plan.train
        self.pp, self.ep, self.etp = {}, {}, {}
        for edp in range(t.edp):
            for a in range(t.etp):
                for b in range(t.ep):
                    self._add(self.pp, [t.rank(a, b, edp, p) for p in range(t.pp)])
            for a in range(t.etp):
                for p in range(t.pp):
                    self._add(self.ep, [t.rank(a, b, edp, p) for b in range(t.ep)])
            for b in range(t.ep):
                for p in range(t.pp):
                    self._add(self.etp, [t.rank(a, b, edp, p) for a in range(t.etp)])

    @staticmethod
    def _add(table: dict, ranks: list[int]) -> None:
        g = dist.new_group(ranks) if len(ranks) > 1 else None
        for r in ranks:
            table[r] = (g, ranks)


def allgather_experts(
    plan: ReshardPlan, local: Mapping[Key, torch.Tensor], groups: TrainGroups
) -> Iterator[tuple[str, torch.Tensor]]:
    """The pinned export of expert weights (mbridge 0.15.1 ``Bridge.export_weights``) for comparison:
    for each layer, family and local expert index, broadcast the shard over PP from the stage that owns
    the layer, all-gather it over EP, then all-gather each of those over ETP and merge. Every rank
    yields every expert of every layer. Call on every rank; ``local`` as in :func:`exchange_experts`."""
    t, shape = plan.train, plan.shape
    rank = dist.get_rank()
    me = t.coords(rank)
    per_rank = shape.experts // t.ep
    some = next(iter(local.values()))
    for layer in plan.moe_layers:
        stage = plan.layer_stage[layer]
        for family in FAMILIES:
            sshape = _shard_shape(plan, family)
            for k in range(per_rank):
                if me["pp"] == stage:
                    param = local[(layer, family, me["ep"] * per_rank + k)]
                else:
                    param = torch.empty(sshape, dtype=some.dtype, device=some.device)
                pp_group, pp_ranks = groups.pp[rank]
                if pp_group is not None:
                    dist.broadcast(param, pp_ranks[stage], group=pp_group)
                ep_group, _ = groups.ep[rank]
                gathered = [torch.empty_like(param) for _ in range(t.ep)]
                if ep_group is not None:
                    dist.all_gather(gathered, param, group=ep_group)
                else:
                    gathered = [param]
                for ep_rank, shard in enumerate(gathered):
                    etp_group, _ = groups.etp[rank]
                    shards = [torch.empty_like(shard) for _ in range(t.etp)]
                    if etp_group is not None:
                        dist.all_gather(shards, shard, group=etp_group)
                    else:
                        shards = [shard]
                    e = ep_rank * per_rank + k
                    yield from zip(hf_names(layer, family, e), merge_shards(family, shards), strict=True)
