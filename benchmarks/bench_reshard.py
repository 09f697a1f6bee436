"""Benchmark the all-to-all-v expert reshard against the all-gather path (mbridge 0.15.1).

Two parts, printed as one table per part, with ratios from this run:

1. From the plan, for the shipped MoE recipes' layouts (read from the recipe scripts; model shapes from
   ``recipes/models/<model>.json``): bytes each rank receives and sends for the experts, the lower
   bound (each needed byte not already on the rank, received once), peak transient memory per rank,
   collectives, all against the all-gather path.
2. Measured on CPU/gloo: wall time of both paths for a scaled-down model with the same layout ratios
   on ``--procs`` processes (8 by default), median of ``--repeats`` runs.

    python benchmarks/bench_reshard.py [--procs 8] [--repeats 3] [--skip-measure]
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from npu_rl.reshard.plan import (  # noqa: E402
    MoeShape,
    RolloutLayout,
    TrainLayout,
    build_plan,
    layer_stages,
)

RECIPES = ["recipes/qwen3-235b-a22b/grpo_128die.sh", "recipes/qwen3-30b-a3b/grpo_16die.sh"]
GB = 1e9


@dataclass
class RecipeLayout:
    name: str
    train: TrainLayout
    rollout: RolloutLayout
    shape: MoeShape
    stages: tuple[int, ...]


def recipe_layout(path: str) -> RecipeLayout:
    """The train/rollout layout and model shape a recipe script sets (its ``KEY=N`` overrides)."""
    text = (REPO / path).read_text()
    nnodes = int(re.search(r'NNODES="\$\{NNODES:-(\d+)\}"', text).group(1))
    per_node = int(re.search(r'NPUS_PER_NODE="\$\{NPUS_PER_NODE:-(\d+)\}"', text).group(1))
    model = re.search(r'MODEL_PATH="\$\{MODEL_PATH:-.*/([\w.-]+)\}"', text).group(1)
    cfg = json.loads((REPO / "recipes" / "models" / f"{model}.json").read_text())
    train_tp = int(re.search(r"ENGINE\.tensor_model_parallel_size=(\d+)", text).group(1))
    pp = int(re.search(r"ENGINE\.pipeline_model_parallel_size=(\d+)", text).group(1))
    ep = int(re.search(r"ENGINE\.expert_model_parallel_size=(\d+)", text).group(1))
    etp_m = re.search(r"ENGINE\.expert_tensor_parallel_size=(\d+)", text)
    first_m = re.search(r"num_layers_in_first_pipeline_stage=(\d+)", text)
    last_m = re.search(r"num_layers_in_last_pipeline_stage=(\d+)", text)
    roll_tp = int(re.search(r"rollout\.tensor_model_parallel_size=(\d+)", text).group(1))
    roll_dp = int(re.search(r"rollout\.data_parallel_size=(\d+)", text).group(1))
    roll_ep = int(re.search(r"rollout\.expert_parallel_size=(\d+)", text).group(1))
    train = TrainLayout(
        world=nnodes * per_node, tp=train_tp, pp=pp, ep=ep, etp=int(etp_m.group(1)) if etp_m else train_tp
    )
    shape = MoeShape(cfg["num_experts"], cfg["num_hidden_layers"], cfg["hidden_size"], cfg["moe_intermediate_size"])
    stages = layer_stages(
        shape.layers, pp, 1, int(first_m.group(1)) if first_m else None, int(last_m.group(1)) if last_m else None
    )
    return RecipeLayout(f"{model} ({Path(path).name})", train, RolloutLayout(tp=roll_tp, dp=roll_dp, ep=roll_ep),
                        shape, stages)  # fmt: skip


def analytic(lay: RecipeLayout, figures: dict | None = None) -> list[tuple[str, str]]:
    plan = build_plan(lay.train, lay.rollout, lay.shape, lay.stages)
    ranks = range(lay.train.world)
    recv = [plan.bytes_received(r) for r in ranks]
    lb = [plan.lower_bound_received(r) for r in ranks]
    sent = [plan.bytes_sent(r) for r in ranks]
    ag = [plan.allgather_received(r) for r in ranks]
    peak = max(plan.peak_transient(r) for r in ranks)
    peak_ov = max(plan.peak_transient(r, overlap=True) for r in ranks)
    ag_peak = plan.allgather_peak()
    unit = max(plan.piece_bytes(f) * lay.train.etp for f in ("fc1", "fc2"))
    held = max(
        sum(plan.piece_bytes(f) for (_, f, _) in plan.needed(r)) * lay.train.etp for r in ranks
    )  # expert bytes each rollout rank loads
    t, ro = lay.train, lay.rollout
    rows = [
        ("layout", f"train TP{t.tp} PP{t.pp} EP{t.ep} ETP{t.etp} (EDP {t.edp}) on {t.world}; rollout TP{ro.tp} x "
                   f"DP{ro.dp} EP{ro.ep_size}; {lay.shape.experts} experts x {lay.shape.layers} layers"),
        ("expert bytes a rollout rank loads", f"{held / GB:.2f} GB"),
        ("received/rank, max: reshard", f"{max(recv) / GB:.2f} GB"),
        ("received/rank, max: lower bound", f"{max(lb) / GB:.2f} GB (equal on every rank: {recv == lb})"),
        ("received/rank, max: all-gather", f"{max(ag) / GB:.1f} GB"),
        ("received ratio reshard / all-gather", f"{max(recv) / max(ag):.4f}" if max(ag) else "n/a"),
        ("sent/rank, max (min)", f"{max(sent) / GB:.2f} ({min(sent) / GB:.2f}) GB"),
        ("peak transient/rank: reshard", f"{peak / 1e6:.1f} MB (overlap on: {peak_ov / 1e6:.1f} MB)"),
        ("peak transient/rank: all-gather", f"{ag_peak / 1e6:.1f} MB"),
        ("peak ratio reshard / all-gather", f"{peak / ag_peak:.4f} (1/EP = {1 / t.ep:.4f}; "
                                            f"<= 1/EP: {peak * t.ep <= ag_peak})"),
        ("peak lower bound when a rank receives (one fc1 expert)", f"{unit / 1e6:.1f} MB"),
        ("collectives: reshard (lower bound)", f"{len(plan.rounds)} ({sum(plan.min_rounds().values())})"),
        ("collectives: all-gather", f"{lay.shape.layers * 2 * (lay.shape.experts // t.ep) * (1 + (t.pp > 1))}"
                                     + (f" + {lay.shape.layers * 2 * lay.shape.experts} ETP" if t.etp > 1 else "")),
    ]  # fmt: skip
    if figures is not None:
        figures[lay.name] = {"received": max(recv), "lower bound": max(lb), "all-gather received": max(ag),
                             "peak": peak, "all-gather peak": ag_peak}  # fmt: skip
    return rows


LABELS = {"received": "reshard", "lower bound": "lower bound", "all-gather received": "all-gather",
          "peak": "reshard", "all-gather peak": "all-gather"}  # fmt: skip


def plot(figures: dict, path: Path) -> None:
    """Two log-scale bar panels: expert bytes received per rank, and peak transient memory per rank."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    names = list(figures)
    panels = (
        ("expert bytes received per rank (GB)", ("received", "lower bound", "all-gather received"), 1e9),
        ("peak transient memory per rank (MB)", ("peak", "all-gather peak"), 1e6),
    )
    for ax, (title, keys, unit) in zip(axes, panels, strict=True):
        width = 0.8 / len(keys)
        for i, k in enumerate(keys):
            vals = [max(figures[n][k] / unit, 1e-3) for n in names]
            bars = ax.bar([x + i * width for x in range(len(names))], vals, width, label=LABELS[k])
            ax.bar_label(bars, labels=[f"{figures[n][k] / unit:.3g}" for n in names], fontsize=7)
        ax.set_yscale("log")
        ax.set_xticks([x + width * (len(keys) - 1) / 2 for x in range(len(names))], [n.split(" (")[0] for n in names])
        ax.set_title(title)
        ax.legend(fontsize=8)
    fig.suptitle("all-to-all-v expert reshard vs all-gather (from the plan; floor 1e-3 for zero)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# ---------------------------------------------------------------- measured part (gloo, CPU)
def scaled(lay: RecipeLayout, procs: int) -> tuple[TrainLayout, RolloutLayout, MoeShape, tuple[int, ...]]:
    """The recipe's ratios on ``procs`` ranks: PP 2 if it pipelines, the recipe's EDP and ETP, EP filling
    the rest; rollout expert parallel over all ranks when the recipe's is over all dies, with the
    recipe's experts per rollout rank; hidden 512, moe_intermediate 384, 4 layers per stage."""
    t, ro = lay.train, lay.rollout
    pp = 2 if t.pp > 1 else 1
    ep = max(1, procs // (pp * t.edp * t.etp))
    roll_ep = procs if ro.ep_size == t.world else max(1, ro.ep_size * procs // t.world)
    experts = lay.shape.experts // ro.ep_size * roll_ep
    rtp = min(ro.tp, roll_ep)
    train = TrainLayout(world=procs, tp=min(t.tp, procs // pp), pp=pp, ep=ep, etp=t.etp)
    layers = 4 * pp
    shape = MoeShape(experts, layers, 512, 384)
    return train, RolloutLayout(tp=rtp, dp=roll_ep // rtp), shape, layer_stages(layers, pp)


def _worker(rank, world, port, train, rollout, shape, stages, repeats, queue):
    import torch
    import torch.distributed as dist

    from npu_rl.reshard.exchange import TrainGroups, allgather_experts, exchange_experts

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    plan = build_plan(train, rollout, shape, stages)
    c = train.coords(rank)
    per = shape.experts // train.ep
    g = torch.Generator().manual_seed(rank)
    local = {}
    for layer in range(shape.layers):
        if stages[layer] == c["pp"]:
            for e in range(c["ep"] * per, (c["ep"] + 1) * per):
                local[(layer, "fc1", e)] = torch.randn(2 * shape.ffn, shape.hidden, generator=g).to(torch.bfloat16)
                local[(layer, "fc2", e)] = torch.randn(shape.hidden, shape.ffn, generator=g).to(torch.bfloat16)
    groups = TrainGroups(plan)
    times = {"reshard": [], "all-gather": []}
    for _ in range(repeats):
        for name, run in (
            ("reshard", lambda: exchange_experts(plan, local)),
            ("all-gather", lambda: allgather_experts(plan, local, groups)),
        ):
            dist.barrier()
            t0 = time.perf_counter()
            n = sum(t.numel() for _, t in run())
            dist.barrier()
            times[name].append(time.perf_counter() - t0)
            assert n > 0
    queue.put((rank, times))
    dist.destroy_process_group()


def measure(train, rollout, shape, stages, procs: int, repeats: int) -> dict[str, float]:
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = (procs, port, train, rollout, shape, stages, repeats, queue)
    ps = [ctx.Process(target=_worker, args=(r, *args)) for r in range(procs)]
    for p in ps:
        p.start()
    results = [queue.get(timeout=600) for _ in ps]
    for p in ps:
        p.join(timeout=60)
    # a run ends when its slowest rank ends (barriers); median over repeats
    return {k: statistics.median(max(r[1][k][i] for r in results) for i in range(repeats)) for k in results[0][1]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--procs", type=int, default=8, help="processes for the measured part (default 8)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--skip-measure", action="store_true", help="only the figures computed from the plan")
    p.add_argument("--plot", type=Path, help="write the from-the-plan bar charts to this PNG")
    a = p.parse_args(argv)
    layouts = [recipe_layout(r) for r in RECIPES]
    figures: dict = {}
    for lay in layouts:
        print(f"\n## {lay.name}: from the plan (bf16)\n")
        print("| quantity | value |\n|---|---|")
        for k, v in analytic(lay, figures):
            print(f"| {k} | {v} |")
    if a.plot:
        plot(figures, a.plot)
        print(f"\nplot: {a.plot}")
    if a.skip_measure:
        return 0
    print(f"\n## measured on CPU/gloo, {a.procs} processes, median of {a.repeats} (slowest rank)\n")
    print("| recipe ratios | scaled layout | expert MB/rank received: reshard / all-gather | reshard s | "
          "all-gather s | speed-up |\n|---|---|---|---|---|---|")  # fmt: skip
    for lay in layouts:
        train, roll, shape, stages = scaled(lay, a.procs)
        plan = build_plan(train, roll, shape, stages)
        rec = max(plan.bytes_received(r) for r in range(a.procs)) / 1e6
        ag = max(plan.allgather_received(r) for r in range(a.procs)) / 1e6
        t = measure(train, roll, shape, stages, a.procs, a.repeats)
        desc = (f"TP{train.tp} PP{train.pp} EP{train.ep} -> TP{roll.tp} x DP{roll.dp}, {shape.experts} experts x "
                f"{shape.layers} layers, H {shape.hidden} F {shape.ffn}")  # fmt: skip
        print(f"| {lay.name} | {desc} | {rec:.1f} / {ag:.1f} | {t['reshard']:.3f} | {t['all-gather']:.3f} | "
              f"{t['all-gather'] / t['reshard']:.1f}x |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
