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
3. Qwen3-32B recipe (GBS 64 x n 16 = 1024 requests, 4 TP8 replicas, 256 seqs, 1.35M KV tokens) on the same
   curve and on the real Sky-T1 and MATH lengths: generate time (published 32B 2K/34K run: 1621 s with
   graph mode + SAM), share of the step with <= 8 running requests (published: 34%), ratio to the lower
   bound.

Writes ``sim_calibration_tails.png`` and ``sim_calibration_timelines.png`` under ``--out``.
"""

from __future__ import annotations

import argparse
import csv
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
PUBLISHED_32B_S = 1621.0
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

    # ---- 3. 32B recipe --------------------------------------------------------------------------------
    cost32 = CostModel.qwen3_32b_tp8_a3_graph()
    cfg32 = ReplicaConfig.qwen3_32b_recipe()
    print(f"\n== 3. Qwen3-32B recipe (1024 requests, 4 x TP8, graph mode); {args.steps} sampled steps: mean [min, max]")
    rng3 = np.random.default_rng([args.seed, 3])

    def draw(name):
        if name == "published 235B curve":
            return curve_requests(q_x, q_f, 64, 16, rng3, prompt_len=200)
        w = wl[name]
        return sample_step(w, rng3.integers(0, w.n_prompts, 64), 16, rng3)

    def fmt(vals, f):
        return f"{np.mean(vals):{f}} [{np.min(vals):{f}}, {np.max(vals):{f}}]"

    runs, results = {}, {}
    for name in ("published 235B curve", "skyt1", "skyt1_long", "qwen25math_maj8"):
        stats = {k: [] for k in ("len", "step", "lb", "tail8", "tail8r", "idle")}
        for k in range(args.steps):
            reqs = draw(name)
            res = simulate(reqs, cost32, cfg32, VerlDefaultRouting(seed=args.seed))
            if k == 0:
                runs[name], results[name] = reqs, res
            stats["len"].append(np.mean([r.response_len for r in reqs]))
            stats["step"].append(res.step_ms / 1e3)
            stats["lb"].append(res.ratio_to_lower_bound)
            stats["tail8"].append(tail_share(res, 8))
            stats["tail8r"].append(tail_share(res, 8, per_replica=True))
            stats["idle"].append(res.idle_fraction.mean())
        print(
            f"  {name:20s} mean len {np.mean(stats['len']):6.0f}  step s {fmt(stats['step'], '.0f')}  "
            f"LB ratio {fmt(stats['lb'], '.2f')}  idle {fmt(stats['idle'], '.2f')}\n"
            f"  {'':20s} share of step with <=8 running: all replicas {fmt(stats['tail8'], '.2f')}, "
            f"per replica while busy {fmt(stats['tail8r'], '.2f')}"
        )
    print(f"  published 32B 2K/34K generate time (graph mode + SAM): {PUBLISHED_32B_S:.0f} s; tail <=8 running: 34%")
    if not args.no_sweep:
        reqs = runs["published 235B curve"]
        s = sweep(
            lambda c: simulate(reqs, c, cfg32, VerlDefaultRouting(seed=args.seed)).step_ms / 1e3 / PUBLISHED_32B_S,
            cost32,
        )
        print("  sweep (first step):", s.summary("simulated (235B curve) / published 1621 s", ".2f"))
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
