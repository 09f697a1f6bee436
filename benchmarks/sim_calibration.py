"""Sanity check of the rollout simulator against published rollout figures (REFERENCE §4, §7, rollout_traces).

    python benchmarks/sim_calibration.py --data-dir ../shared/data [--out docs] [--no-sweep]

Prints, from one run:

1. The published long-tail curves (``rollout_traces/*.csv``) next to the real-length workloads of
   ``benchmarks/data/response_lengths.json``: fraction of responses longer than 1K/4K/8K/16K tokens (when
   all requests start together, the running count at decode step s is the number of responses longer
   than s: the curves are survival functions of the response length).
2. Qwen3-235B recipe (GBS 512 x n 16 = 8192 requests, 32 DP ranks in lockstep, 256 seqs, 900K KV tokens
   per rank) on lengths drawn from the published per-DP survival curve (mean 7345 tokens): simulated
   generate time vs the published 10213 s (before rollout rebalance) / 7841 s / 6102 s, with the ratio
   swept over the §7 uncertainty ranges; KV preemptions; the simulated running count per rank against
   the published KV hyperbola (900,608 / length).
3. Qwen3-32B. (a) The published 32B run replayed with its own settings: GBS 128 x n 16 = 2048 requests
   on 16 A3 cards = 4 TP8 replicas, max_num_seqs 128 (cann-recipes-train llm_rl/qwen3/README.md table and
   internal/train_grpo_qwen3_32b_32die_true_weight.sh: INFER_TP 8, INFER_DP 4, MAX_NUM_SEQS 128), lengths
   from the published 235B curve; the eager preset against the published eager first-step generate times
   without SAM (README: GRPO 2261 s; REFERENCE §4 write-up: 2444 s), the graph preset against the
   write-up's 1621 s (graph mode + SAM; no plain graph-mode figure is published). (b) Our recipe's own
   step (GBS 64 x n 16 = 1024 requests, 256 seqs, graph mode) on the same curve and on the real Sky-T1 and
   MATH lengths: generate time, share of the step with <= 8 running requests (published 32B run: 34%),
   ratio to the lower bound. (b) has no published counterpart (half the requests of (a)).

Writes ``sim_calibration_tails.png`` and ``sim_calibration_timelines.png`` under ``--out``.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import os
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from npu_rl.sim import CostModel, ReplicaConfig, SimRequest, simulate  # noqa: E402
from npu_rl.sim.plot import plot_timelines, running_matrix  # noqa: E402
from npu_rl.sim.routing import VerlDefaultRouting  # noqa: E402
from npu_rl.sim.sweep import sweep  # noqa: E402
from npu_rl.sim.workloads import lengths_from_survival, load_workload, sample_step  # noqa: E402

PUBLISHED_235B_S = {"baseline": 10213.0, "rebalance 1": 7841.0, "rebalance 2": 6102.0}
# Published Qwen3-32B GRPO first-step generate times, GBS 128 x n 16, 2K/34K, 16 A3 cards (32 dies).
PUBLISHED_32B_EAGER_S = {"README, SAM off": 2261.0, "write-up, no SAM": 2444.0}
PUBLISHED_32B_GRAPH_SAM_S = 1621.0  # write-up: graph mode + SAM (2106 s with SAM in eager mode)
REF_32B_PROMPTS, REF_32B_MAX_NUM_SEQS = 128, 128  # README table GBS; internal/train_grpo_qwen3_32b_32die_*.sh
CAP = 32768


def default_data_dir() -> Path:
    env = os.environ.get("NPU_RL_DATA_DIR")
    return Path(env) if env else REPO.parent / "shared" / "data"


def read_curve(path: Path, x: str, y: str) -> tuple[np.ndarray, np.ndarray]:
    if not path.is_file():
        sys.exit(f"{path} not found: pass --data-dir pointing at the shared data folder (or set NPU_RL_DATA_DIR)")
    rows = [r for r in csv.DictReader(line for line in path.read_text().splitlines() if not line.startswith("#"))]
    return np.array([float(r[x]) for r in rows]), np.array([float(r[y]) for r in rows])


def survival(lengths: np.ndarray, at: list[int]) -> list[float]:
    return [float((lengths > a).mean()) for a in at]


def curve_requests(xs, fs, n_groups, n, rng, prompt_len):
    lens = lengths_from_survival(xs, fs, n_groups * n, rng)
    lens = np.minimum(lens, CAP)
    return [SimRequest(k, k // n, prompt_len, int(v)) for k, v in enumerate(lens)]


def tail_share(res, max_running: int, per_replica: bool = False) -> float:
    """Share of the step during which at most ``max_running`` requests run (all replicas, or mean per replica)."""
    times = np.linspace(0, res.step_ms, 4000, endpoint=False)
    mat = running_matrix(res, times)
    if per_replica:
        return float(((mat <= max_running) & (mat > 0)).mean())
    return float((mat.sum(axis=0) <= max_running).mean())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", type=Path, default=default_data_dir())
    ap.add_argument("--out", type=Path, default=REPO / "docs")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-sweep", action="store_true", help="skip the sensitivity sweeps (faster)")
    ap.add_argument("--steps", type=int, default=10, help="sampled 32B steps per workload (default 10)")
    args = ap.parse_args(argv)
    traces = args.data_dir / "rollout_traces"
    rng = np.random.default_rng([args.seed, 2])

    # ---- 1. tail shapes ------------------------------------------------------------------------------
    ds_x, ds_f = read_curve(traces / "dsv3_256die_running_vs_decode_step.csv", "decode_step", "frac_remaining")
    q_x, q_f = read_curve(traces / "qwen3_235b_per_dp_survival_approx.csv", "response_length_tokens", "frac_remaining")
    ds_f = np.append(ds_f, 0.0)  # the last request of the DSV3 run finished at the 32K cap
    ds_x = np.append(ds_x, CAP)
    at = [1000, 4000, 8000, 16000]
    print("== 1. long tails: fraction of responses longer than", at, "tokens")
    rows = {
        "published DSV3 (8192 req, OpenR1-Math)": [float(np.interp(a, ds_x, ds_f)) for a in at],
        "published Qwen3-235B (DeepScaleR)": [float(np.interp(a, q_x, q_f)) for a in at],
    }
    wl = {name: load_workload(name) for name in ("qwen25math_maj8", "skyt1_short", "skyt1_long", "skyt1")}
    for name, w in wl.items():
        rows[f"{name} (real, {w.n_capped()} capped)"] = survival(w.all_lengths(), at)
    for name, vals in rows.items():
        print(f"  {name:44s} " + "  ".join(f"{v:6.3f}" for v in vals))
    means = {n: float(w.all_lengths().mean()) for n, w in wl.items()}
    print("  mean response tokens:", {k: round(v) for k, v in means.items()}, "(published 235B run: 7345)")

    # ---- 2. 235B recipe on the published curve -------------------------------------------------------
    cost235 = CostModel.qwen3_235b_dp_rank()
    cfg235 = ReplicaConfig.qwen3_235b_recipe()
    reqs235 = curve_requests(q_x, q_f, 512, 16, rng, prompt_len=200)
    r235 = simulate(reqs235, cost235, cfg235, VerlDefaultRouting(seed=args.seed))
    print("\n== 2. Qwen3-235B recipe, lengths from the published per-DP curve")
    print(f"  requests {len(reqs235)}, mean length {np.mean([r.response_len for r in reqs235]):.0f}")
    print(
        f"  simulated generate time {r235.step_ms / 1e3:.0f} s, lower bound {r235.lower_bound_ms / 1e3:.0f} s "
        f"(ratio {r235.ratio_to_lower_bound:.2f}), KV preemptions {int(r235.preemptions.sum())}, "
        f"mean idle fraction {r235.idle_fraction.mean():.2f}, share of the step with <= 1.2% of requests running "
        f"{tail_share(r235, int(0.012 * len(reqs235))):.2f} (published DSV3: the last 75% of decode steps)"
    )
    for k, v in PUBLISHED_235B_S.items():
        print(f"  published {k}: {v:.0f} s -> simulated / published = {r235.step_ms / 1e3 / v:.2f}")
    # running per rank vs decode iteration against the KV hyperbola y = 900608 / x
    times = np.linspace(0, r235.step_ms, 2000)
    mat = running_matrix(r235, times)
    print(f"  max running on any rank: {int(mat.max())} (max_num_seqs 256)")
    w = wl["skyt1"]
    sky235 = sample_step(w, rng.integers(0, w.n_prompts, 512), 16, rng)
    r = simulate(sky235, cost235, cfg235, VerlDefaultRouting(seed=args.seed))
    print(
        f"  same recipe on Sky-T1 lengths (mean {np.mean([q.response_len for q in sky235]):.0f}): "
        f"{r.step_ms / 1e3:.0f} s, LB ratio {r.ratio_to_lower_bound:.2f}, KV preemptions {int(r.preemptions.sum())}, "
        f"idle {r.idle_fraction.mean():.2f}, share with <= 1.2% running {tail_share(r, int(0.012 * len(sky235))):.2f}"
    )
    if not args.no_sweep:
        s = sweep(
            lambda c: simulate(reqs235, c, cfg235, VerlDefaultRouting(seed=args.seed)).step_ms / 1e3 / 7841.0, cost235
        )
        print("  sweep:", s.summary("simulated / published 7841 s", ".2f"))

    # ---- 3. 32B: the published run's settings, then our recipe -----------------------------------------
    def fmt(vals, f):
        return f"{np.mean(vals):{f}} [{np.min(vals):{f}}, {np.max(vals):{f}}]"

    def run_steps(draw, cost, cfg):
        stats = {k: [] for k in ("len", "step", "lb", "tail8", "tail8r", "idle", "preempt")}
        first = None
        for _ in range(args.steps):
            reqs = draw()
            res = simulate(reqs, cost, cfg, VerlDefaultRouting(seed=args.seed))
            first = first or (reqs, res)
            stats["len"].append(np.mean([r.response_len for r in reqs]))
            stats["step"].append(res.step_ms / 1e3)
            stats["lb"].append(res.ratio_to_lower_bound)
            stats["tail8"].append(tail_share(res, 8))
            stats["tail8r"].append(tail_share(res, 8, per_replica=True))
            stats["idle"].append(res.idle_fraction.mean())
            stats["preempt"].append(int(res.preemptions.sum()))
        return stats, first

    def report(label, stats):
        print(
            f"  {label:24s} mean len {np.mean(stats['len']):6.0f}  step s {fmt(stats['step'], '.0f')}  "
            f"LB ratio {fmt(stats['lb'], '.2f')}  idle {fmt(stats['idle'], '.2f')}  "
            f"KV preemptions {fmt(stats['preempt'], '.0f')}\n"
            f"  {'':24s} share of step with <=8 running: all replicas {fmt(stats['tail8'], '.2f')}, "
            f"per replica while busy {fmt(stats['tail8r'], '.2f')}"
        )

    ref_cfg32 = dataclasses.replace(ReplicaConfig.qwen3_32b_recipe(), max_num_seqs=REF_32B_MAX_NUM_SEQS)
    n_ref = REF_32B_PROMPTS * 16
    print(
        f"\n== 3a. published Qwen3-32B run replayed: {n_ref} requests ({REF_32B_PROMPTS} x 16), "
        f"4 x TP8, max_num_seqs {REF_32B_MAX_NUM_SEQS}, lengths from the published 235B curve; "
        f"{args.steps} sampled steps: mean [min, max]"
    )
    presets = {"eager": CostModel.qwen3_32b_tp8_a3_eager(), "graph": CostModel.qwen3_32b_tp8_a3_graph()}
    published = {"eager": PUBLISHED_32B_EAGER_S, "graph": {"write-up, graph + SAM": PUBLISHED_32B_GRAPH_SAM_S}}
    ref_first = {}
    for mode, cost in presets.items():
        rng_ref = np.random.default_rng([args.seed, 4])  # same lengths for both presets
        stats, ref_first[mode] = run_steps(
            lambda rng_ref=rng_ref: curve_requests(q_x, q_f, REF_32B_PROMPTS, 16, rng_ref, prompt_len=200),
            cost,
            ref_cfg32,
        )
        report(f"{mode} preset", stats)
        for k, v in published[mode].items():
            ratios = [x / v for x in stats["step"]]
            print(f"  {'':24s} published {k}: {v:.0f} s -> simulated / published = {fmt(ratios, '.2f')}")
    print(
        f"  published eager / graph (both with SAM): 2106 / 1621 = {2106 / 1621:.2f}; simulated eager / graph "
        f"(no SAM, first step): {ref_first['eager'][1].step_ms / ref_first['graph'][1].step_ms:.2f}"
    )
    if not args.no_sweep:
        for mode, pub in (("eager", PUBLISHED_32B_EAGER_S["README, SAM off"]), ("graph", PUBLISHED_32B_GRAPH_SAM_S)):
            reqs = ref_first[mode][0]
            s = sweep(
                lambda c, reqs=reqs, pub=pub: (
                    simulate(reqs, c, ref_cfg32, VerlDefaultRouting(seed=args.seed)).step_ms / 1e3 / pub
                ),
                presets[mode],
            )
            print("  sweep (first step):", s.summary(f"{mode} preset / published {pub:.0f} s", ".2f"))

    cost32 = CostModel.qwen3_32b_tp8_a3_graph()
    cfg32 = ReplicaConfig.qwen3_32b_recipe()
    print(
        f"\n== 3b. our Qwen3-32B recipe (1024 requests = 64 x 16, 4 x TP8, 256 seqs, graph mode; no published "
        f"counterpart); {args.steps} sampled steps: mean [min, max]"
    )
    rng3 = np.random.default_rng([args.seed, 3])

    def draw(name):
        if name == "published 235B curve":
            return curve_requests(q_x, q_f, 64, 16, rng3, prompt_len=200)
        w = wl[name]
        return sample_step(w, rng3.integers(0, w.n_prompts, 64), 16, rng3)

    runs, results = {}, {}
    for name in ("published 235B curve", "skyt1", "skyt1_long", "qwen25math_maj8"):
        stats, (runs[name], results[name]) = run_steps(lambda name=name: draw(name), cost32, cfg32)
        report(name, stats)
    if not args.no_sweep:
        reqs = runs["skyt1"]
        s = sweep(lambda c: simulate(reqs, c, cfg32, VerlDefaultRouting(seed=args.seed)).ratio_to_lower_bound, cost32)
        print("  sweep (first step):", s.summary("Sky-T1 step / lower bound", ".2f"))

    # ---- plots ----------------------------------------------------------------------------------------
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(ds_x, ds_f, "k-o", ms=3, label="published DSV3 running/8192 vs decode step")
    ax.plot(q_x, q_f, "k--s", ms=3, label="published Qwen3-235B per-DP survival")
    grid = np.arange(0, CAP + 1, 256)
    for name, w in wl.items():
        lens = w.all_lengths()
        ax.plot(grid, [(lens > g).mean() for g in grid], label=f"{name} (real lengths)")
    ax.set_yscale("log")
    ax.set_ylim(1e-3, 1.1)
    ax.set_xlabel("response length = decode step (tokens)")
    ax.set_ylabel("fraction still running")
    ax.legend(fontsize=7)
    ax.set_title("Long tails: published rollout curves vs the real-length workloads")
    fig.tight_layout()
    args.out.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out / "sim_calibration_tails.png", dpi=110)
    plt.close(fig)
    plot_timelines(
        {"235B recipe, published curve (32 ranks, lockstep)": r235, "32B recipe, Sky-T1 lengths": results["skyt1"]},
        args.out / "sim_calibration_timelines.png",
        title="verl default routing, simulated",
    )
    print(f"\nwrote {args.out / 'sim_calibration_tails.png'} and {args.out / 'sim_calibration_timelines.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
