"""Plan the all-to-all-v expert reshard: which rank sends which local expert shard to which rank.

Pure Python (no torch). Inputs are the two layouts and the MoE shape; the output, a
:class:`ReshardPlan`, lists for every rank the pieces it sends and receives in each collective (the
split sizes of one ``all_to_all_single``) and the pieces it already holds.

Training side (Megatron-core 0.16 ``parallel_state.initialize_model_parallel``): the expert ranks come
from ``RankGenerator(tp=ETP, ep=EP, dp=world // (ETP*EP*PP), pp=PP, cp=1, order=order)``, default
order ``"tp-cp-ep-dp-pp"`` (verl 0.9.1 passes none), i.e. for that order
``rank = etp + ETP * (ep + EP * (edp + EDP * pp))``. An EP rank owns the contiguous experts
``[ep * E/EP, (ep+1) * E/EP)`` (Megatron's ``local_expert_indices_offset``; mbridge 0.15.1 names them
``...mlp.experts.linear_fc{1,2}.weight{k}``); each holds ETP rank ``etp``'s shard of every such expert:
rows of ``linear_fc1`` (``[2*F/ETP, H]``, gate rows then up rows) and columns of ``linear_fc2``
(``[H, F/ETP]``). The EDP ranks hold identical copies.

Rollout side (colocated): trainer rank ``r`` feeds the vLLM worker on its die, rollout rank
``r % (TP*DP*PP)`` of replica ``r // (TP*DP*PP)`` (verl ``ServerAdapter``); that worker's EP rank is
``dp_rank * TP + tp_rank`` = its rollout rank (vLLM 0.23 ``FusedMoEParallelConfig.make`` /
``flatten_tp_across_dp_and_pcp``). Its experts come from ``determine_expert_map`` (vLLM 0.23
``fused_moe/expert_map_manager.py``): ``linear`` (contiguous blocks, the default and the only one
vllm-ascend 0.23.0.post1 uses without EPLB) or ``round_robin`` (``ep_rank, ep_rank + EP, ...``).
vLLM's MoE weights are not tensor-parallel under EP, so a rollout rank needs every ETP shard of its
experts, assembled into full Hugging Face tensors.

Each needed shard comes from the rank itself when it holds a copy, else from the EDP copy with the
fewest bytes to send so far, so every rank receives each needed byte exactly once (the lower bound).
Collectives ("rounds") move one parameter family; each round gives every rank at most one expert
(all its ETP shards) to receive and one shard to send, or, with ``bucket_bytes``, as many as fit that
many bytes each way. Non-expert parameters keep the existing export path (:func:`is_expert_param`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from npu_rl.errors import NpuRlError

Family = Literal["fc1", "fc2"]
FAMILIES: tuple[Family, ...] = ("fc1", "fc2")
# mbridge 0.15.1 Bridge.export_weights: what it all-gathers over EP (and ETP); the rest keeps its path.
EXPERT_MARK = ".mlp.experts.linear_fc"
PLACEMENTS = ("linear", "round_robin")
DEFAULT_ORDER = "tp-cp-ep-dp-pp"


def is_expert_param(mcore_name: str) -> bool:
    """True for a routed-expert weight (``decoder.layers.L.mlp.experts.linear_fc{1,2}.weight{k}``)."""
    return EXPERT_MARK in mcore_name


class ReshardLayoutError(NpuRlError):
    """The layouts cannot be resharded; ``problems`` holds (key, message, fix) for each reason."""

    def __init__(self, problems: list[tuple[str, str, str]]):
        self.problems = problems
        super().__init__("; ".join(f"{k}: {m} ({f})" if f else f"{k}: {m}" for k, m, f in problems))


@dataclass(frozen=True)
class TrainLayout:
    """Megatron training parallelism over ``world`` ranks (the expert part of it is what moves)."""

    world: int
    tp: int = 1
    pp: int = 1
    ep: int = 1
    etp: int = 1
    cp: int = 1
    order: str = DEFAULT_ORDER

    @property
    def edp(self) -> int:
        """Expert data-parallel size: copies of each expert shard."""
        return self.world // (self.etp * self.ep * self.pp)

    def _generator(self) -> tuple[list[str], list[int]]:
        sizes = {"tp": self.etp, "cp": 1, "ep": self.ep, "dp": self.edp, "pp": self.pp}
        tokens = self.order.lower().split("-")
        tokens += [t for t in sizes if t not in tokens]  # Megatron appends missing size-1 tokens
        strides, s = [], 1
        for t in tokens:
            strides.append(s)
            s *= sizes[t]
        return tokens, strides

    def coords(self, rank: int) -> dict[str, int]:
        """Expert coordinates of a global rank: ``{"etp", "ep", "edp", "pp"}`` (Megatron's RankGenerator)."""
        tokens, strides = self._generator()
        sizes = {"tp": self.etp, "cp": 1, "ep": self.ep, "dp": self.edp, "pp": self.pp}
        c = {t: (rank // st) % sizes[t] for t, st in zip(tokens, strides, strict=True)}
        return {"etp": c["tp"], "ep": c["ep"], "edp": c["dp"], "pp": c["pp"]}

    def rank(self, etp: int, ep: int, edp: int, pp: int) -> int:
        """The global rank with these expert coordinates (inverse of :meth:`coords`)."""
        tokens, strides = self._generator()
        idx = {"tp": etp, "cp": 0, "ep": ep, "dp": edp, "pp": pp}
        return sum(idx[t] * st for t, st in zip(tokens, strides, strict=True))


@dataclass(frozen=True)
class RolloutLayout:
    """vLLM rollout parallelism: replicas of TP x DP x PP dies with expert parallel over TP x DP."""

    tp: int = 1
    dp: int = 1
    pp: int = 1
    ep: int = 0  # 0: TP x DP (what verl requires when expert parallel is on); 1: expert parallel off
    placement: str = "linear"

    @property
    def replica(self) -> int:
        return self.tp * self.dp * self.pp

    @property
    def ep_size(self) -> int:
        return self.ep or self.tp * self.dp

    def ep_rank(self, rank: int) -> int:
        """EP rank of the vLLM worker colocated with trainer ``rank``."""
        return rank % self.replica

    def experts(self, ep_rank: int, num_experts: int) -> tuple[int, ...]:
        """Global expert ids vLLM places on ``ep_rank`` (vLLM 0.23 ``determine_expert_map``)."""
        n = self.ep_size
        base, rem = divmod(num_experts, n)
        local = base + 1 if ep_rank < rem else base
        if self.placement == "round_robin":
            return tuple(range(ep_rank, num_experts, n))
        start = ep_rank * base + min(ep_rank, rem)
        return tuple(range(start, start + local))


@dataclass(frozen=True)
class MoeShape:
    """Routed-expert shape: ``experts`` per layer, ``hidden`` H, ``ffn`` F (moe_intermediate_size)."""

    experts: int
    layers: int
    hidden: int
    ffn: int
    dtype_bytes: int = 2

    def numel(self, family: Family, etp: int = 1) -> int:
        """Elements of one ETP shard of one expert: fc1 ``2F/ETP x H``, fc2 ``H x F/ETP``."""
        full = 2 * self.ffn * self.hidden if family == "fc1" else self.hidden * self.ffn
        return full // etp


def layer_stages(
    num_layers: int, pp: int, vpp: int = 1, first: int | None = None, last: int | None = None
) -> tuple[int, ...]:
    """The pipeline stage of every decoder layer, as Megatron-core 0.16 builds them.

    ``first``/``last`` are ``num_layers_in_{first,last}_pipeline_stage`` (uneven pipelines, no VPP);
    with VPP the layers split into ``pp * vpp`` equal chunks and chunk ``c`` lives on stage ``c % pp``
    (``get_transformer_layer_offset``). The runtime reads the real map from the model instead.

    Raises:
        ReshardLayoutError: the layers do not split that way.
    """
    key = "override_transformer_config.num_layers_in_{first,last}_pipeline_stage"
    if first is None and last is None:
        chunks = pp * vpp
        if num_layers % chunks:
            raise ReshardLayoutError(
                [("pipeline_model_parallel_size", f"{num_layers} layers do not split into PP {pp} x VPP {vpp}", "")]
            )
        per = num_layers // chunks
        return tuple((layer // per) % pp for layer in range(num_layers))
    if vpp > 1:
        raise ReshardLayoutError([(key, "uneven pipeline stages with VPP are not modelled here", "")])
    f, la = first or 0, last or 0
    middle = pp - (first is not None) - (last is not None)
    rest = num_layers - f - la
    if middle < 0 or rest < 0 or (middle and rest % middle) or (not middle and rest):
        raise ReshardLayoutError([(key, f"{num_layers} layers do not fit first {first} / last {last} in PP {pp}", "")])
    sizes = ([f] if first is not None else []) + [rest // middle if middle else 0] * middle
    sizes += [la] if last is not None else []
    return tuple(stage for stage, n in enumerate(sizes) for _ in range(n))


def layout_problems(
    train: TrainLayout, rollout: RolloutLayout, num_experts: int, ffn: int | None = None
) -> list[tuple[str, str, str]]:
    """Every reason the reshard cannot run, as (key, message, fix); empty when it can."""
    p: list[tuple[str, str, str]] = []
    w = train.world
    for name, v in (("TP", train.tp), ("PP", train.pp), ("EP", train.ep), ("ETP", train.etp), ("CP", train.cp)):
        if v < 1:
            p.append((f"train {name}", f"= {v}", "use a size >= 1"))
    for name, v in (("TP", rollout.tp), ("DP", rollout.dp), ("PP", rollout.pp)):
        if v < 1:
            p.append((f"rollout {name}", f"= {v}", "use a size >= 1"))
    if p:
        return p
    if w % (train.tp * train.pp * train.cp):
        p.append(("train layout", f"world {w} is not divisible by TP {train.tp} x PP {train.pp} x CP {train.cp}", ""))
    if w % (train.etp * train.ep * train.pp):
        p.append(
            (
                "train layout",
                f"world {w} is not divisible by ETP {train.etp} x EP {train.ep} x PP {train.pp}",
                "choose expert_model_parallel_size x expert_tensor_parallel_size x PP dividing the world",
            )
        )
    tokens = train.order.lower().split("-")
    if sorted(set(tokens)) != sorted(tokens) or not set(tokens) <= {"tp", "cp", "ep", "dp", "pp"}:
        p.append(("train order", f"{train.order!r} is not a Megatron order", f"e.g. {DEFAULT_ORDER!r}"))
    if num_experts < 1:
        p.append(("num_experts", "the model has no routed experts", "unset ALL_TO_ALL_RESHARD for dense models"))
        return p
    if num_experts % train.ep:
        p.append(
            (
                "expert_model_parallel_size",
                f"train EP {train.ep} does not divide {num_experts} experts",
                "Megatron needs equal experts per EP rank",
            )
        )
    if ffn is not None and ffn % train.etp:
        p.append(("expert_tensor_parallel_size", f"ETP {train.etp} does not divide moe_intermediate_size {ffn}", ""))
    if rollout.ep_size <= 1:
        p.append(
            (
                "rollout expert_parallel_size",
                "expert parallelism is off: every rollout rank needs every expert, so there is nothing to save",
                "set actor_rollout_ref.rollout.expert_parallel_size = TP x DP, or unset ALL_TO_ALL_RESHARD",
            )
        )
    elif rollout.ep_size != rollout.tp * rollout.dp:
        p.append(
            (
                "rollout expert_parallel_size",
                f"EP {rollout.ep_size} != TP {rollout.tp} x DP {rollout.dp} (vLLM spreads experts over TP x DP)",
                f"set it to {rollout.tp * rollout.dp}",
            )
        )
    elif num_experts % rollout.ep_size:
        p.append(
            (
                "rollout expert_parallel_size",
                f"rollout EP {rollout.ep_size} does not divide {num_experts} experts "
                "(vllm-ascend 0.23 gives every rank global // EP experts)",
                "choose rollout TP x DP dividing the expert count",
            )
        )
    if rollout.pp != 1:
        p.append(("rollout pipeline_model_parallel_size", f"= {rollout.pp}: not supported by the reshard", "use 1"))
    if w % rollout.replica:
        p.append(("rollout layout", f"a replica of {rollout.replica} dies does not tile the world of {w}", ""))
    if rollout.placement not in PLACEMENTS:
        p.append(("expert_placement_strategy", f"{rollout.placement!r} is not one of {PLACEMENTS}", ""))
    return p


@dataclass(frozen=True)
class Piece:
    """One ETP shard of one expert's weight: what a training rank holds as one parameter."""

    layer: int
    family: Family
    expert: int
    shard: int


@dataclass(frozen=True)
class Unit:
    """One full expert weight a rank needs: ``srcs[s]`` is the rank that provides ETP shard ``s``."""

    dst: int
    layer: int
    family: Family
    expert: int
    srcs: tuple[int, ...]

    def pieces(self) -> list[tuple[int, Piece]]:
        return [(src, Piece(self.layer, self.family, self.expert, s)) for s, src in enumerate(self.srcs)]


@dataclass
class RankRound:
    """One collective as one rank sees it: ``send[d]``/``recv[s]`` are the pieces to/from each rank
    (in this order inside the flat buffers), ``in_splits``/``out_splits`` their element counts, and
    ``units`` the experts this rank assembles after the collective."""

    family: Family
    send: list[list[Piece]]
    recv: list[list[Piece]]
    in_splits: list[int]
    out_splits: list[int]
    units: list[Unit]


@dataclass
class ReshardPlan:
    """The reshard of every expert weight of every layer (see the module docstring)."""

    train: TrainLayout
    rollout: RolloutLayout
    shape: MoeShape
    layer_stage: tuple[int, ...]
    bucket_bytes: int | None
    moe_layers: tuple[int, ...] = ()  # the layers that have routed experts (all when the plan is built)
    local_units: list[Unit] = field(default_factory=list)  # needed and held entirely by the rank itself
    rounds: list[tuple[Family, list[Unit]]] = field(default_factory=list)

    def piece_bytes(self, family: Family) -> int:
        return self.shape.numel(family, self.train.etp) * self.shape.dtype_bytes

    def holders(self, layer: int, expert: int, shard: int) -> list[int]:
        """Training ranks that hold this shard (the EDP copies)."""
        t = self.train
        owner = expert // (self.shape.experts // t.ep)
        return [t.rank(shard, owner, d, self.layer_stage[layer]) for d in range(t.edp)]

    def needed(self, rank: int) -> list[tuple[int, Family, int]]:
        """(layer, family, expert) of every full expert weight the rollout rank on ``rank`` loads."""
        experts = self.rollout.experts(self.rollout.ep_rank(rank), self.shape.experts)
        return [(layer, f, e) for layer in self.moe_layers for f in FAMILIES for e in experts]

    def rank_rounds(self, rank: int) -> list[RankRound]:
        """Per collective, what ``rank`` sends and receives (in the same order on every rank)."""
        w = self.train.world
        out = []
        for family, units in self.rounds:
            send: list[list[Piece]] = [[] for _ in range(w)]
            recv: list[list[Piece]] = [[] for _ in range(w)]
            mine = []
            for u in units:
                for src, piece in u.pieces():
                    if src == u.dst:
                        continue
                    if src == rank:
                        send[u.dst].append(piece)
                    if u.dst == rank:
                        recv[src].append(piece)
                if u.dst == rank:
                    mine.append(u)
            key = _piece_key
            send = [sorted(s, key=key) for s in send]
            recv = [sorted(r, key=key) for r in recv]
            n = self.shape.numel(family, self.train.etp)
            out.append(RankRound(family, send, recv, [len(s) * n for s in send], [len(r) * n for r in recv], mine))
        return out

    # ---- accounting (bytes per rank) -------------------------------------------------------------
    def bytes_received(self, rank: int) -> int:
        """Bytes ``rank`` receives from other ranks over all collectives."""
        total = 0
        for family, units in self.rounds:
            total += sum(src != rank for u in units if u.dst == rank for src in u.srcs) * self.piece_bytes(family)
        return total

    def bytes_sent(self, rank: int) -> int:
        """Bytes ``rank`` sends to other ranks over all collectives."""
        total = 0
        for family, units in self.rounds:
            total += sum(src == rank for u in units if u.dst != rank for src in u.srcs) * self.piece_bytes(family)
        return total

    def lower_bound_received(self, rank: int) -> int:
        """Bytes of the experts ``rank``'s rollout needs that no copy on ``rank`` holds: the minimum any
        scheme must deliver to it (each needed byte once)."""
        total = 0
        for layer, family, e in self.needed(rank):
            for s in range(self.train.etp):
                if rank not in self.holders(layer, e, s):
                    total += self.piece_bytes(family)
        return total

    def peak_transient(self, rank: int, overlap: bool = False) -> int:
        """Peak bytes the exchange allocates on ``rank`` beyond the model: receive buffer, send staging
        (only when a rank sends more than one shard in a collective), assembly of ETP shards into one
        full tensor; with ``overlap`` two consecutive collectives are in flight."""
        assembly = 0
        etp = self.train.etp
        if etp > 1:
            for u in self.local_units:
                if u.dst == rank:
                    assembly = max(assembly, self.piece_bytes(u.family) * etp)
        per_round = []
        for family, units in self.rounds:
            pb = self.piece_bytes(family)
            recv = sum(src != rank for u in units if u.dst == rank for src in u.srcs) * pb
            sent = sum(src == rank for u in units if u.dst != rank for src in u.srcs)
            staging = sent * pb if sent > 1 else 0
            asm = pb * etp if etp > 1 and any(u.dst == rank for u in units) else 0
            per_round.append(recv + staging + asm)
        peak = max(per_round, default=0)
        if overlap and len(per_round) > 1:
            peak = max(a + b for a, b in zip(per_round, per_round[1:], strict=False))
        return max(peak, assembly)

    # ---- the pinned path, for comparison (mbridge 0.15.1 Bridge.export_weights) -------------------
    def allgather_received(self, rank: int) -> int:
        """Bytes ``rank`` receives for the experts on the all-gather path: per layer, family and local
        expert index, the PP broadcast from the owning stage (unless it is this rank's), the EP
        all-gather (EP-1 shards) and, for each of the EP experts, the ETP all-gather (ETP-1 shards)."""
        t = self.train
        own = t.coords(rank)["pp"]
        per = self.shape.experts // t.ep
        total = 0
        for layer in self.moe_layers:
            shards = (t.pp > 1 and self.layer_stage[layer] != own) + (t.ep - 1) + t.ep * (t.etp - 1)
            total += per * shards * sum(self.piece_bytes(f) for f in FAMILIES)
        return total

    def allgather_peak(self) -> int:
        """Peak transient bytes per rank on the all-gather path, following mbridge 0.15.1's code: PP
        broadcast buffer (1 shard), EP all-gather output (EP shards), ETP all-gather output (ETP shards)
        and, when Megatron TP > 1, the merge copies (fc1: gate and up, then their concatenation, 2
        experts; fc2: 1 expert)."""
        t = self.train
        peak = 0
        for f in FAMILIES:
            shard = self.piece_bytes(f)
            expert = shard * t.etp
            merge = (2 if f == "fc1" else 1) * expert if t.tp > 1 else 0
            peak = max(peak, shard * ((t.pp > 1) + t.ep) + (expert if t.etp > 1 else 0) + merge)
        return peak

    def min_rounds(self) -> dict[Family, int]:
        """A lower bound on the collectives per family at one expert / one shard per rank: the most
        units any rank receives or shards any rank sends."""
        out = {}
        for family in FAMILIES:
            recv: dict[int, int] = defaultdict(int)
            send: dict[int, int] = defaultdict(int)
            for f, units in self.rounds:
                if f != family:
                    continue
                for u in units:
                    recv[u.dst] += 1
                    for src in u.srcs:
                        if src != u.dst:
                            send[src] += 1
            out[family] = max([*recv.values(), *send.values(), 0])
        return out


def _piece_key(p: Piece) -> tuple[int, int, int]:
    return (p.layer, p.expert, p.shard)


def build_plan(
    train: TrainLayout,
    rollout: RolloutLayout,
    shape: MoeShape,
    layer_stage: Sequence[int] | None = None,
    bucket_bytes: int | None = None,
    moe_layers: Iterable[int] | None = None,
) -> ReshardPlan:
    """Plan the reshard of every routed-expert weight from ``train`` to the colocated ``rollout``.

    Args:
        layer_stage: pipeline stage of each decoder layer (default: even split, :func:`layer_stages`).
        bucket_bytes: most bytes a rank sends and receives in one collective; None (default) moves one
            expert per rank per collective, the least transient memory (the send side then needs no
            staging copy: a single shard is sent straight from its parameter).
        moe_layers: the layers with routed experts (default all; e.g. DeepSeek-V3's first 3 are dense).

    Returns:
        The plan; ``plan.rank_rounds(rank)`` gives each rank's split sizes.

    Raises:
        ReshardLayoutError: with every problem :func:`layout_problems` finds, or a bad ``layer_stage``.

    Example (hand-checked): 8 experts, train EP 4 on 4 ranks, rollout TP 2 x DP 2 (EP 4, linear): rank
    r owns experts 2r, 2r+1 on both sides, so every unit is local and there are no collectives; with
    rollout EP 2 on 4 ranks (two replicas of TP 2) rank 1 needs experts 4..7, held by ranks 2 and 3.
    """
    problems = layout_problems(train, rollout, shape.experts, shape.ffn)
    stages = tuple(layer_stage) if layer_stage is not None else None
    if stages is None and not problems:
        stages = layer_stages(shape.layers, train.pp)
    if stages is not None and (len(stages) != shape.layers or any(not 0 <= s < train.pp for s in stages)):
        problems.append(("layer_stage", f"needs {shape.layers} stages in [0, {train.pp}), got {stages}", ""))
    moe = tuple(sorted(set(range(shape.layers) if moe_layers is None else moe_layers)))
    if any(not 0 <= x < shape.layers for x in moe):
        problems.append(("moe_layers", f"{moe} are not all layers of a {shape.layers}-layer model", ""))
    if problems:
        raise ReshardLayoutError(problems)
    assert stages is not None
    plan = ReshardPlan(train, rollout, shape, stages, bucket_bytes, moe)
    send_load: dict[int, int] = defaultdict(int)
    remote: list[Unit] = []
    for dst in range(train.world):
        for layer, family, e in plan.needed(dst):
            srcs = []
            for s in range(train.etp):
                cands = plan.holders(layer, e, s)
                if dst in cands:
                    srcs.append(dst)
                    continue
                src = min(cands, key=lambda c: (send_load[c], c))
                send_load[src] += plan.piece_bytes(family)
                srcs.append(src)
            unit = Unit(dst, layer, family, e, tuple(srcs))
            (plan.local_units if all(x == dst for x in srcs) else remote).append(unit)
    for family in FAMILIES:
        plan.rounds += [(family, r) for r in _schedule([u for u in remote if u.family == family], plan)]
    return plan


def _schedule(units: Iterable[Unit], plan: ReshardPlan) -> list[list[Unit]]:
    """First-fit the units into collectives under the per-rank budget; units are taken round-robin over
    their first sender so that every sender starts in the first collective."""
    by_src: dict[int, list[Unit]] = defaultdict(list)
    for u in units:
        by_src[next(s for s in u.srcs if s != u.dst)].append(u)
    order = []
    queues = [by_src[k] for k in sorted(by_src)]
    for i in range(max((len(q) for q in queues), default=0)):
        order += [q[i] for q in queues if i < len(q)]
    budget = plan.bucket_bytes
    rounds: list[list[Unit]] = []
    recv: list[dict[int, int]] = []
    send: list[dict[int, int]] = []
    first_free: dict[int, int] = defaultdict(int)  # per dst: rounds before this are full (minimal budget)
    for u in order:
        pb = plan.piece_bytes(u.family)
        need_r = sum(s != u.dst for s in u.srcs) * pb
        senders = [s for s in u.srcs if s != u.dst]
        k = first_free[u.dst] if budget is None else 0
        while True:
            if k == len(rounds):
                rounds.append([])
                recv.append(defaultdict(int))
                send.append(defaultdict(int))
            r, s = recv[k], send[k]
            if budget is None:
                ok = r[u.dst] == 0 and all(s[x] == 0 for x in senders)
            else:
                ok = (r[u.dst] == 0 or r[u.dst] + need_r <= budget) and all(
                    s[x] == 0 or s[x] + pb * senders.count(x) <= budget for x in senders
                )
            if ok:
                break
            k += 1
        rounds[k].append(u)
        recv[k][u.dst] += need_r
        for x in senders:
            send[k][x] += pb
        if budget is None:
            while first_free[u.dst] < len(rounds) and recv[first_free[u.dst]][u.dst]:
                first_free[u.dst] += 1
    return rounds
