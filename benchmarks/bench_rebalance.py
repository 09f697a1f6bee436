"""Rollout rebalance in the rollout simulator, on real response lengths (issue 8 measurements).

    python benchmarks/bench_rebalance.py                 # both settings, 2 workloads, sweep, plots
    python benchmarks/bench_rebalance.py --steps 4 --settings 32b --no-plots

Settings (REFERENCE §7, ``npu_rl.sim`` presets): Qwen3-32B = 4 replicas of TP8, max_num_seqs 256,
~1.35M KV tokens each, GBS 64 x n 16 = 1024 requests; Qwen3-235B-A22B = one replica of TP4 x DP32
whose 32 DP ranks step in lockstep (EP128), 256 seqs and ~900K KV tokens per rank, GBS 512 x n 16 =
8192 requests. Response lengths: ``npu_rl.sim.workloads`` (real sampled responses, Qwen3 tokenizer),
``skyt1`` by default (AIME24 long-reasoning traces, 32K cap), capped at the recipes' 32768.

Routings, each over the same steps (same requests):
  verl default     verl 0.9.0: least in-flight count per request (one replica with DP ranks: vLLM's
                   internal DP balancer, also by count) - ``npu_rl.sim.routing.VerlDefaultRouting``
  ... as deployed  235B only: verl's server actor runs at most 1000 calls, so ~31 requests per DP
                   rank reach vLLM, FIFO from Ray's queue (approximated as a FIFO pull, 31 per rank)
  pull FIFO        on-demand release in arrival order, no placement rule (``PullRouting``)
  dispatcher       ours (``DispatchPolicy`` via ``DispatcherRouting``): longest predicted first,
                   least predicted load; without predictions (prompt length only) and with them
  + keep groups    the n samples of a prompt on one target (prefix cache)
  + cap 192        ROLLOUT_REBALANCE_MAX_INFLIGHT=192 (a central queue keeps late decisions possible)
  + resampler      steps composed of prompts of similar predicted length (issue 5's ordering)
  + migration      running sequences moved from the busiest to the idlest replica, re-prefilled there
Predictions: per prompt, the mean of n fresh samples of it (what one earlier epoch's EMA holds).

Printed per routing: generate-step time (mean over steps), ratio to the simulator's lower bound
max(longest response alone, total work / capacity), idle fraction per replica (mean and max), change
vs verl default, re-prefilled tokens. Then the sensitivity sweep over the cost-model ranges of
REFERENCE §7 (npu_rl.sim.sweep: t0 x0.5-1.5, t1 x0.6-6, t2 x0.4-1.6), and per-replica timeline PNGs in docs/.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from npu_rl.rebalance.simroute import DispatcherRouting, Migration  # noqa: E402
from npu_rl.sim import CostModel, ReplicaConfig, lower_bound, simulate  # noqa: E402
from npu_rl.sim.model import SimError  # noqa: E402
from npu_rl.sim.plot import plot_timelines  # noqa: E402
from npu_rl.sim.routing import PullRouting, VerlDefaultRouting  # noqa: E402
from npu_rl.sim.sweep import sweep  # noqa: E402
from npu_rl.sim.workloads import load_lengths_file, load_workload, sample_step  # noqa: E402

MAX_RESPONSE = 32768


@dataclass
class Setting:
    name: str
    cost: CostModel
    replicas: ReplicaConfig
    prompts: int
    steps: int = 4  # generation steps per routing (each a fresh draw of prompts and lengths)
    n: int = 16
    # requests per replica that reach vLLM under verl 0.9.0: its server actor runs at most
    # max(1000, max_num_seqs + 16) calls; None when that exceeds the replica's slots
    deployed_cap: int | None = None


SETTINGS = {
    "32b": Setting(
        "Qwen3-32B: 4 x TP8, GBS 64 x n 16",
        CostModel.qwen3_32b_tp8_a3_graph(),
        ReplicaConfig.qwen3_32b_recipe(),
        64,
        steps=16,
    ),
    "235b": Setting(
        "Qwen3-235B-A22B: TP4 x DP32 lockstep, GBS 512 x n 16",
        CostModel.qwen3_235b_dp_rank(),
        ReplicaConfig.qwen3_235b_recipe(),
        512,
        steps=8,
        deployed_cap=1000 // 32,
    ),
}


def routings(seqs: int) -> dict[str, tuple]:
    """name -> (routing factory, migration factory or None, uses predictions)."""
    return {
        "verl default": (lambda: VerlDefaultRouting(), None),
        "pull FIFO (no placement rule)": (lambda: PullRouting(key=lambda r: 0.0), None),
        "dispatcher, no prediction": (lambda: DispatcherRouting(seqs, use_predictions=False), None),
        "dispatcher, predictions": (lambda: DispatcherRouting(seqs), None),
        "dispatcher + keep groups": (lambda: DispatcherRouting(seqs, keep_groups=True), None),
        "dispatcher + cap 192": (lambda: DispatcherRouting(seqs, max_inflight=192), None),
        "verl default + migration": (lambda: VerlDefaultRouting(), Migration),
        "dispatcher + cap 192 + migration": (lambda: DispatcherRouting(seqs, max_inflight=192), Migration),
    }


@dataclass
class Agg:
    step_s: list[float] = field(default_factory=list)
    ratio: list[float] = field(default_factory=list)
    idle_mean: list[float] = field(default_factory=list)
    idle_max: list[float] = field(default_factory=list)
    reprefill: list[int] = field(default_factory=list)
    moved: list[int] = field(default_factory=list)
    iters_t0_s: list[float] = field(default_factory=list)

    def add(self, res, lb_ms: float, cost: CostModel, moved: int = 0) -> None:
        self.step_s.append(res.step_ms / 1e3)
        self.ratio.append(res.step_ms / lb_ms)
        self.idle_mean.append(float(res.idle_fraction.mean()))
        self.idle_max.append(float(res.idle_fraction.max()))
        self.reprefill.append(int(res.reprefill_tokens))
        self.moved.append(moved)
        self.iters_t0_s.append(float(res.decode_iterations.mean()) * cost.t0 / 1e3)


def predictions(workload, n: int, rng: np.random.Generator) -> np.ndarray:
    """Per prompt: the mean of n fresh samples of its real response lengths (one earlier epoch)."""
    return np.array([float(np.minimum(rng.choice(r, n), MAX_RESPONSE).mean()) for r in workload.responses])


def resampler_batches(pred: np.ndarray, batch: int, n_batches: int, seed: int) -> np.ndarray:
    """Prompt ids of ``n_batches`` generation batches ordered by the length-aware resampler (issue 5):
    its ``epoch_order`` when ``npu_rl.sampler`` is present, else the same rule inline (sort by length
    bucket of 1024 tokens, cut into batches, shuffle the batches). The workload has few prompts, so a
    virtual dataset repeats them (8 batches' worth per requested batch)."""
    k = len(pred)
    rows = np.tile(np.arange(k), -(-batch * n_batches * 8 // k))
    try:
        from npu_rl.sampler.core import OrderParams, epoch_order

        order, _ = epoch_order(pred[rows], OrderParams(batch_size=batch), seed, 0)
    except ImportError:
        rng = np.random.default_rng(seed)
        perm = rng.permutation(len(rows))[: len(rows) // batch * batch]
        perm = perm[np.argsort(np.floor(pred[rows][perm] / 1024), kind="stable")]
        blocks = perm.reshape(-1, batch)
        order = blocks[rng.permutation(len(blocks))].reshape(-1)
    return rows[order[: batch * n_batches]].reshape(n_batches, batch)


def make_steps(workload, st: Setting, steps: int, seed: int, bucketed: bool, oracle: bool = False) -> list[list]:
    """The requests of ``steps`` generation steps: prompts drawn uniformly, or (``bucketed``) in the
    resampler's batches. ``oracle``: every request's prediction is its true length (no predictor can
    know more; an upper bound on what predictions can give)."""
    rng = np.random.default_rng(seed)
    pred = predictions(workload, st.n, rng)
    batches = resampler_batches(pred, st.prompts, steps, seed) if bucketed else None
    out = []
    for s in range(steps):
        pids = batches[s] if bucketed else rng.choice(workload.n_prompts, st.prompts)
        reqs = sample_step(workload, pids, st.n, rng, predicted=pred, max_response_len=MAX_RESPONSE)
        if oracle:
            for r in reqs:
                r.predicted_len = float(r.response_len)
        out.append(reqs)
    return out


def within_share(workload) -> float:
    """Share of the response-length variance that lies within prompts (what per-prompt predictions
    cannot see), capped lengths."""
    lens = [np.minimum(r, MAX_RESPONSE).astype(float) for r in workload.responses]
    allv = np.concatenate(lens)
    within = sum(((x - x.mean()) ** 2).sum() for x in lens)
    return float(within / ((allv - allv.mean()) ** 2).sum())


def run_setting(st: Setting, workload, steps: int, seed: int, cost: CostModel | None = None, only=None) -> dict:
    cost = cost or st.cost
    all_steps = make_steps(workload, st, steps, seed, bucketed=False)
    table: dict[str, Agg] = {}
    for name, (mk, mig_mk) in routings(st.replicas.max_num_seqs).items():
        if only and name not in only:
            continue
        agg = table.setdefault(name, Agg())
        for reqs in all_steps:
            mig = mig_mk() if mig_mk else None
            res = simulate(reqs, cost, st.replicas, mk(), on_finish=mig)
            agg.add(res, lower_bound(reqs, cost, st.replicas), cost, mig.moved if mig else 0)
    if only is None and st.deployed_cap:
        # verl as deployed: Ray's FIFO queue in front of the server, vLLM's DP balancer by count
        agg = table.setdefault(f"verl default as deployed ({st.deployed_cap}/rank)", Agg())
        for reqs in all_steps:
            rt = DispatcherRouting(st.replicas.max_num_seqs, order="fifo", max_inflight=st.deployed_cap)
            res = simulate(reqs, cost, st.replicas, rt)
            agg.add(res, lower_bound(reqs, cost, st.replicas), cost)
    if only is None:
        seqs = st.replicas.max_num_seqs
        extra = {
            "dispatcher, ORACLE lengths (bound)": (make_steps(workload, st, steps, seed, False, oracle=True), None),
            "verl default + resampler": (make_steps(workload, st, steps, seed, bucketed=True), VerlDefaultRouting),
        }
        extra["dispatcher, predictions + resampler"] = (extra["verl default + resampler"][0], None)
        for name, (reqs_list, rt) in extra.items():
            agg = table.setdefault(name, Agg())
            for reqs in reqs_list:
                res = simulate(reqs, cost, st.replicas, rt() if rt else DispatcherRouting(seqs))
                agg.add(res, lower_bound(reqs, cost, st.replicas), cost)
    return table


def print_table(title: str, table: dict[str, Agg]) -> None:
    base = np.mean(table["verl default"].step_s)
    base_rs = np.mean(table["verl default + resampler"].step_s) if "verl default + resampler" in table else base
    print(f"\n## {title}")
    head = (
        f"{'routing':38s} {'step s':>8s} {'/ LB':>6s} {'vs verl':>8s} {'idle mean':>9s} {'idle max':>8s} "
        f"{'re-prefill tok':>14s} {'moved':>6s}"
    )
    print(head)
    print("-" * len(head))
    for name, a in table.items():
        ref = base_rs if "resampler" in name else base  # resampler rows: other batches, own baseline
        vs = f"{np.mean(a.step_s) / ref - 1:+8.1%}"
        print(
            f"{name:38s} {np.mean(a.step_s):8.0f} {np.mean(a.ratio):6.3f} {vs} "
            f"{np.mean(a.idle_mean):9.3f} {np.mean(a.idle_max):8.3f} {np.mean(a.reprefill):14,.0f} "
            f"{np.mean(a.moved):6.0f}"
        )


def sweep_setting(st: Setting, workload, steps: int, seed: int) -> None:
    """``npu_rl.sim.sweep`` over REFERENCE §7's ranges (36 cost models): dispatcher (default switches)
    step time / verl default's, and both against the lower bound."""
    reqs_list = make_steps(workload, st, steps, seed, bucketed=False)
    seqs = st.replicas.max_num_seqs
    lb_ratio: dict[str, list[float]] = {"verl": [], "disp": []}

    def metric(cost: CostModel) -> float:
        v = d = 0.0
        for reqs in reqs_list:
            lb = lower_bound(reqs, cost, st.replicas)
            rv = simulate(reqs, cost, st.replicas, VerlDefaultRouting()).step_ms
            rd = simulate(reqs, cost, st.replicas, DispatcherRouting(seqs)).step_ms
            lb_ratio["verl"].append(rv / lb)
            lb_ratio["disp"].append(rd / lb)
            v, d = v + rv, d + rd
        return d / v

    res = sweep(metric, st.cost)
    print(f"\n## sensitivity sweep, {st.name}, {workload.name} ({steps} step(s) per cost model)")
    print("dispatcher / verl default: " + res.summary("step-time ratio"))
    for k, name in (("verl", "verl default"), ("disp", "dispatcher")):
        r = np.array(lb_ratio[k])
        print(f"{name} / lower bound: min {r.min():.3f} / median {np.median(r):.3f} / max {r.max():.3f}")


def plot_setting(st: Setting, key: str, workload, seed: int, out_dir: Path) -> Path:
    """Per-replica timelines (running sequences) of one step: verl default vs the dispatcher."""
    reqs = make_steps(workload, st, 1, seed, bucketed=False)[0]
    oracle = make_steps(workload, st, 1, seed, bucketed=False, oracle=True)[0]
    seqs = st.replicas.max_num_seqs
    results = {
        "verl default": simulate(reqs, st.cost, st.replicas, VerlDefaultRouting()),
        "dispatcher (predictions)": simulate(reqs, st.cost, st.replicas, DispatcherRouting(seqs)),
        "dispatcher, oracle lengths": simulate(oracle, st.cost, st.replicas, DispatcherRouting(seqs)),
    }
    return plot_timelines(
        results,
        out_dir / f"rebalance_timeline_{key}.png",
        title=f"{st.name}, {workload.name}: running sequences per replica / DP rank",
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--settings", default="32b,235b", help="comma list of 32b, 235b")
    ap.add_argument(
        "--workloads",
        default="skyt1_long,skyt1",
        help="comma list of npu_rl.sim.workloads datasets (default skyt1_long,skyt1)",
    )
    ap.add_argument(
        "--lengths",
        type=Path,
        default=None,
        help="your response lengths instead of --workloads (JSONL or a length table; docs/sim.md)",
    )
    ap.add_argument("--steps", type=int, default=0, help="generation steps per routing (default: 16 at 32B, 8 at 235B)")
    ap.add_argument("--sweep-steps", type=int, default=1, help="steps per sweep cost model (default 1; 0: none)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("--plot-dir", type=Path, default=REPO / "docs")
    args = ap.parse_args(argv)
    keys = [k.strip() for k in args.settings.split(",") if k.strip()]
    bad = [k for k in keys if k not in SETTINGS]
    if bad:
        ap.error(f"unknown setting(s) {bad}: choose from {sorted(SETTINGS)}")
    t_start = time.time()
    if args.lengths is not None:
        try:
            workloads = [load_lengths_file(args.lengths)]
        except SimError as e:
            ap.error(str(e))
    else:
        workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    for wi, wname in enumerate(workloads):
        workload = wname if args.lengths is not None else load_workload(wname)
        lengths = workload.all_lengths()
        print(
            f"\n# workload {workload.name}: {workload.n_prompts} prompts, {len(lengths)} responses, mean "
            f"{lengths.mean():.0f} tokens (within-prompt share of variance {within_share(workload):.0%}), "
            f"capped at {MAX_RESPONSE}; seed {args.seed}"
        )
        for key in keys:
            st = SETTINGS[key]
            steps = args.steps or st.steps
            table = run_setting(st, workload, steps, args.seed)
            print_table(f"{st.name}, {workload.name} ({steps} steps)", table)
            v = table["verl default"]
            print(
                f"verl default: mean decode iterations x t0 = {np.mean(v.iters_t0_s):.0f} s per replica "
                f"(the lower bound charges t0 once per {st.replicas.max_num_seqs} running sequences)"
            )
            if wi == 0 and args.sweep_steps:
                sweep_setting(st, workload, args.sweep_steps, args.seed)
            if wi == 0 and not args.no_plots:
                args.plot_dir.mkdir(parents=True, exist_ok=True)
                print(f"timeline: {plot_setting(st, key, workload, args.seed, args.plot_dir)}")
    print(f"\ndone in {time.time() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
