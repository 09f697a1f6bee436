"""Length-aware resampler vs random order: simulated epoch generation time on real response lengths.

    python benchmarks/bench_resampler.py [--epochs 4] [--seed 0] [--sweep] [--plot docs/resampler.png]

Replays several epochs of synchronous GRPO rollout with the rollout simulator (:mod:`npu_rl.sim`,
verl 0.9.0's routing, continuous batching, KV budget) at the 32B and 235B recipes' settings, on the
real-length workloads of :mod:`npu_rl.sim.workloads` (``qwen25math_maj8``: 100 MATH prompts x 8
samples; ``skyt1``: 30 AIME24 prompts x 22 long/short reasoning traces; Qwen3 tokenizer). In every
epoch each prompt's n response lengths are drawn from its real samples; the draws are shared by the
orders compared (paired), so differences come from the order alone:

- ``random``: verl's default (a fresh random permutation per epoch);
- ``length-aware``: :class:`npu_rl.sampler.LengthAwareEpochSampler`, learning its EMA table from the
  steps it has seen (epoch 0 is random: nothing is known yet);
- ``oracle``: the same bucketing on each prompt's true mean length (what a perfect predictor gives).

Scaling to the data size: the workloads have 100 and 30 prompts, fewer than one 235B batch. The
prompt pool is replicated (``copies`` rows per prompt, each row a dataset entry of its own) until an
epoch holds ``--steps`` full generation batches at the recipe's own GBS x n and replica layout, so
per-replica concurrency, KV budget and routing are the recipe's. Copies of a prompt share its length
distribution, like similar prompts of a larger dataset.

Reported per recipe and workload, over epochs 1.. (after the first, learning epoch): generation time
per epoch, the length-aware reduction versus random, and each order's ratio to the lower bound (the
sum over steps of ``max(longest response, total work / capacity)``, :func:`npu_rl.sim.lower_bound`).
``--sweep`` repeats the 32B comparison over 18 cost models spanning REFERENCE §7's uncertainty (t0
+-50%, t1 x1-6, t2 x0.4-1.6) with :func:`npu_rl.sim.sweep.sweep` (fresh length draws). ``--guard``
adds the long-tail guard on top of both orders (cut fraction and time saved; see docs/resampler.md).
Prints ratios measured in this one run.
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from npu_rl.sampler import LengthAwareEpochSampler  # noqa: E402
from npu_rl.sampler.core import OrderParams, epoch_order  # noqa: E402
from npu_rl.sampler.guard import GuardParams, stragglers_to_abort  # noqa: E402
from npu_rl.sim import CostModel, ReplicaConfig, SimRequest, simulate  # noqa: E402
from npu_rl.sim.model import SimError  # noqa: E402
from npu_rl.sim.routing import VerlDefaultRouting  # noqa: E402
from npu_rl.sim.sweep import sweep  # noqa: E402
from npu_rl.sim.workloads import Workload, load_lengths_file, load_workload  # noqa: E402
from npu_rl.table import format_table  # noqa: E402

# Corners and middle of REFERENCE §7's uncertainty (t0 +-50%, t1 up to 6x, t2 x0.4-1.6): 18 cost models.
SWEEP_LEVELS = {"t0": (0.5, 1.0, 1.5), "t1": (1.0, 6.0), "t2": (0.4, 1.0, 1.6)}


@dataclass(frozen=True)
class Recipe:
    name: str
    gbs: int
    n: int
    cost: CostModel
    replicas: ReplicaConfig
    max_response: int = 32768


RECIPES = {
    "32B": Recipe(
        "32B (GBS 64 x n 16, 4 x TP8, 256 seqs)",
        64,
        16,
        CostModel.qwen3_32b_tp8_a3_graph(),
        ReplicaConfig.qwen3_32b_recipe(),
    ),
    "235B": Recipe(
        "235B (GBS 512 x n 16, 32 DP ranks lockstep)",
        512,
        16,
        CostModel.qwen3_235b_dp_rank(),
        ReplicaConfig.qwen3_235b_recipe(),
    ),
}


@dataclass
class EpochRun:
    step_ms: list[float]
    lower_ms: list[float]
    busy: list[float]  # utilisation per step: sum of replica busy time / (R * step time)
    cut: int = 0
    lost_tokens: int = 0
    total_tokens: int = 0


def draw_lengths(w: Workload, rows_pid: np.ndarray, n: int, epochs: int, cap: int, rng) -> np.ndarray:
    """(epochs, rows, n) response lengths, each drawn from its prompt's real samples."""
    out = np.empty((epochs, len(rows_pid), n), dtype=np.int64)
    for e in range(epochs):
        for row, pid in enumerate(rows_pid):
            out[e, row] = rng.choice(w.responses[pid], size=n, replace=True)
    return np.minimum(out, cap)


def run_step(w, rows_pid, batch, lengths, recipe, cost, guard: GuardParams | None, seed: int):
    reqs = []
    for g, row in enumerate(batch):
        pid = int(rows_pid[row])
        for k in range(recipe.n):
            reqs.append(SimRequest(len(reqs), g, int(w.prompt_tokens[pid]), int(lengths[row, k]), prompt_id=int(row)))
    policy = None
    if guard is not None:
        finished: dict[int, int] = {}

        def policy(state):
            for rid in state.finished:
                if rid not in cut:
                    finished[rid] = state.request(rid).response_len
            running = [rid for r in range(state.n_replicas) for rid in state.running(r) if rid not in cut]
            gen = np.array([state.generated(rid) for rid in running])
            mask = stragglers_to_abort(np.fromiter(finished.values(), float), gen, guard)
            for rid, m in zip(running, mask, strict=True):
                if m:
                    cut.add(rid)
                    state.truncate(rid)

    cut: set[int] = set()
    res = simulate(reqs, cost, recipe.replicas, VerlDefaultRouting(seed=seed), on_finish=policy)
    util = float(res.replica_busy_ms.sum() / (len(res.replica_busy_ms) * res.step_ms))
    return res, util


def replay(w, recipe, cost, rows_pid, lengths, order_kind, seed, guard=None, bucket_size=1024):
    """Simulate every epoch under one ordering; returns one EpochRun per epoch."""
    epochs, rows, _ = lengths.shape
    steps = rows // recipe.gbs
    cfg = {
        "train_batch_size": recipe.gbs,
        "dataloader_num_workers": 0,
        "seed": seed,
        "sampler": {"bucket_size": bucket_size},
    }
    sampler = LengthAwareEpochSampler(list(range(rows)), cfg) if order_kind == "length-aware" else None
    true_mean = np.array([w.mean_lengths()[p] for p in rows_pid])
    rng = np.random.default_rng([seed, 99])
    out = []
    for e in range(epochs):
        if sampler is not None:
            order = np.fromiter(iter(sampler), dtype=np.int64)
        elif order_kind == "oracle":
            order, _ = epoch_order(true_mean, OrderParams(recipe.gbs, bucket_size), seed, e)
        else:
            order = rng.permutation(rows)
        run = EpochRun([], [], [])
        for s in range(steps):
            batch = order[s * recipe.gbs : (s + 1) * recipe.gbs]
            res, util = run_step(w, rows_pid, batch, lengths[e], recipe, cost, guard, seed + 1000 * e + s)
            run.step_ms.append(res.step_ms)
            run.lower_ms.append(res.lower_bound_ms)
            run.busy.append(util)
            run.cut += int((res.tokens_lost > 0).sum())
            run.lost_tokens += int(res.tokens_lost.sum())
            run.total_tokens += int(lengths[e][batch].sum())
            if sampler is not None:
                sampler.update(np.repeat(batch, recipe.n), lengths[e][batch].reshape(-1))
        out.append(run)
    return out


def get_workload(name: str) -> Workload:
    """A workload of :mod:`npu_rl.sim.workloads`, or ``mix``: qwen25math_maj8's 100 short MATH prompts and
    skyt1's 30 long AIME prompts in one dataset (easy and hard prompts side by side, as in DAPO-Math or
    DeepScaleR)."""
    if name != "mix":
        return load_workload(name)
    parts = [load_workload("qwen25math_maj8"), load_workload("skyt1")]
    return Workload(
        name="mix",
        prompt_names=tuple(f"{p.name}/{n}" for p in parts for n in p.prompt_names),
        prompt_tokens=np.concatenate([p.prompt_tokens for p in parts]),
        responses=tuple(r for p in parts for r in p.responses),
        capped=tuple(c for p in parts for c in p.capped),
        generation_cap=32768,
    )


def pool(w: Workload, recipe: Recipe, steps: int) -> np.ndarray:
    """Prompt id of every dataset row: the workload replicated to hold ``steps`` full batches."""
    copies = math.ceil(steps * recipe.gbs / w.n_prompts)
    return np.tile(np.arange(w.n_prompts), copies)


def summarize(runs: list[EpochRun]) -> tuple[float, float, float]:
    """(generation seconds per epoch, ratio to the lower bound, mean utilisation) over epochs 1.."""
    later = runs[1:] or runs
    t = sum(sum(r.step_ms) for r in later) / len(later) / 1e3
    lb = sum(sum(r.lower_ms) for r in later) / len(later) / 1e3
    util = float(np.mean([u for r in later for u in r.busy]))
    return t, t / lb, util


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=4, help="epochs replayed (the first one learns)")
    ap.add_argument("--steps", type=int, default=8, help="generation batches per epoch after scaling the data")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workloads", default="qwen25math_maj8,skyt1,mix")
    ap.add_argument(
        "--lengths",
        type=Path,
        default=None,
        help="your response lengths instead of --workloads (JSONL or a length table; docs/sim.md)",
    )
    ap.add_argument("--recipes", default="32B,235B", help=f"comma list of {', '.join(RECIPES)} (any case)")
    ap.add_argument("--bucket-size", type=int, default=1024)
    ap.add_argument("--sweep", action="store_true", help="32B comparison over the cost model's uncertainty corners")
    ap.add_argument("--guard", action="store_true", help="also simulate the long-tail guard (defaults) on random order")
    ap.add_argument("--plot", type=Path, default=None, help="write a PNG of per-step time and utilisation")
    args = ap.parse_args(argv)
    if args.epochs < 2:
        ap.error("--epochs must be >= 2 (the first epoch only learns)")
    names = {k.lower(): k for k in RECIPES}
    unknown = [r for r in args.recipes.split(",") if r.lower() not in names]
    if unknown:
        ap.error(f"--recipes: unknown {', '.join(unknown)}; choose from {', '.join(RECIPES)}")
    args.recipes = ",".join(names[r.lower()] for r in args.recipes.split(","))
    t_start = time.time()
    rng = np.random.default_rng(args.seed)
    rows_out, plot_data = [], {}
    pick = get_workload
    if args.lengths is not None:
        try:
            user = load_lengths_file(args.lengths)
        except SimError as e:
            ap.error(str(e))
        args.workloads, pick = user.name, lambda _name: user
    for wname, rname in itertools.product(args.workloads.split(","), args.recipes.split(",")):
        w, recipe = pick(wname), RECIPES[rname]
        rows_pid = pool(w, recipe, args.steps)
        lengths = draw_lengths(w, rows_pid, recipe.n, args.epochs, recipe.max_response, rng)
        res = {
            k: replay(w, recipe, recipe.cost, rows_pid, lengths, k, args.seed, bucket_size=args.bucket_size)
            for k in ("random", "length-aware", "oracle")
        }
        s = {k: summarize(v) for k, v in res.items()}
        line = {
            "workload": wname,
            "recipe": rname,
            "rows": len(rows_pid),
            "copies": len(rows_pid) // w.n_prompts,
            "steps": len(rows_pid) // recipe.gbs,
            **{f"{k}_s": s[k][0] for k in s},
            **{f"{k}_lb": s[k][1] for k in s},
            **{f"{k}_util": s[k][2] for k in s},
        }
        if args.guard:
            for kind, tag in (("random", "guard"), ("length-aware", "guard_aware")):
                g = replay(w, recipe, recipe.cost, rows_pid, lengths, kind, args.seed, guard=GuardParams())
                later = g[1:]
                line[f"{tag}_s"] = summarize(g)[0]
                line[f"{tag}_cut"] = sum(r.cut for r in later) / sum(
                    len(r.step_ms) * recipe.gbs * recipe.n for r in later
                )
                line[f"{tag}_lost"] = sum(r.lost_tokens for r in later) / sum(r.total_tokens for r in later)
        rows_out.append(line)
        plot_data[(wname, rname)] = res
    print(
        f"epochs {args.epochs} (epoch 0 learns; figures are means over epochs 1..{args.epochs - 1}), seed {args.seed}"
    )
    head = ("workload", "recipe", "rows", "steps", "random s", "aware s", "oracle s", "aware cut", "oracle cut")
    head += ("random/LB", "aware/LB", "oracle/LB", "util random", "util aware")
    table = [
        (
            r["workload"],
            r["recipe"],
            r["rows"],
            r["steps"],
            f"{r['random_s']:.1f}",
            f"{r['length-aware_s']:.1f}",
            f"{r['oracle_s']:.1f}",
            f"{1 - r['length-aware_s'] / r['random_s']:.1%}",
            f"{1 - r['oracle_s'] / r['random_s']:.1%}",
            f"{r['random_lb']:.2f}",
            f"{r['length-aware_lb']:.2f}",
            f"{r['oracle_lb']:.2f}",
            f"{r['random_util']:.2f}",
            f"{r['length-aware_util']:.2f}",
        )
        for r in rows_out
    ]
    print(format_table(head, table))
    if args.guard:
        print("\nlong-tail guard (factor 2, min 10000 tokens, 90% finished); time vs random order without it:")
        for r in rows_out:
            for tag, kind in (("guard", "random"), ("guard_aware", "length-aware")):
                print(
                    f"  {r['workload']:16} {r['recipe']:5} {kind:13} time {1 - r[f'{tag}_s'] / r['random_s']:6.1%} "
                    f"shorter, {r[f'{tag}_cut']:.2%} of responses cut, {r[f'{tag}_lost']:.2%} of tokens lost"
                )
    if args.sweep:
        print("\n32B sensitivity of the length-aware reduction vs random over the cost model (npu_rl.sim.sweep):")
        recipe = RECIPES["32B"]
        for wname in args.workloads.split(","):
            w = pick(wname)
            rows_pid = pool(w, recipe, args.steps)
            lengths = draw_lengths(w, rows_pid, recipe.n, args.epochs, recipe.max_response, rng)

            def reduction(cost, w=w, rows_pid=rows_pid, lengths=lengths):
                a = summarize(replay(w, recipe, cost, rows_pid, lengths, "random", args.seed))[0]
                b = summarize(replay(w, recipe, cost, rows_pid, lengths, "length-aware", args.seed))[0]
                return 1 - b / a

            res = sweep(reduction, recipe.cost, SWEEP_LEVELS)
            print(f"  {wname:16} {res.summary('reduction', '.1%')}")
    if args.plot:
        plot(plot_data, args.plot)
        print(f"\nplot: {args.plot}")
    print(f"wall time {time.time() - t_start:.0f} s")
    return 0


def plot(data: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = sorted({k[0] for k in data})
    recipes = sorted({k[1] for k in data}, key=lambda r: float(r.rstrip("B")))
    fig, axes = plt.subplots(len(workloads), 2 * len(recipes), figsize=(4.0 * 2 * len(recipes), 2.8 * len(workloads)))
    axes = np.atleast_2d(axes)
    colors = {"random": "tab:red", "length-aware": "tab:blue", "oracle": "tab:gray"}
    for (i, wname), (j, rname) in itertools.product(enumerate(workloads), enumerate(recipes)):
        runs_by_kind = data.get((wname, rname))
        if runs_by_kind is None:
            continue
        ax_t, ax_u = axes[i, 2 * j], axes[i, 2 * j + 1]
        for kind, runs in runs_by_kind.items():
            style = dict(color=colors[kind], lw=1.1, ls=":" if kind == "oracle" else "-", label=kind)
            ax_t.plot([ms / 1e3 for r in runs for ms in r.step_ms], **style)
            ax_u.plot([x for r in runs for x in r.busy], **style)
        per_epoch = len(runs_by_kind["random"][0].step_ms)
        for ax in (ax_t, ax_u):
            for e in range(1, len(runs_by_kind["random"])):
                ax.axvline(e * per_epoch - 0.5, color="k", lw=0.5, alpha=0.3)
            ax.set_xlabel("step (lines: epoch starts)", fontsize=8)
        ax_t.set_title(f"{wname} @ {rname}: time per step", fontsize=9)
        ax_t.set_yscale("log")
        ax_t.set_ylabel("generation s")
        ax_u.set_title(f"{wname} @ {rname}: replica utilisation", fontsize=9)
        ax_u.set_ylim(0, 1.02)
    axes[0, 0].legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
