"""Fully-async and one-step-off-policy pipelines against the synchronous recipe, in the simulator (issue 21, item 4).

    python benchmarks/bench_async.py            # both settings, both workloads, plot + JSON in docs/
    python benchmarks/bench_async.py --quick    # a small run for tests (no files unless --out-* given)

Settings (same dies for every schedule; GRPO, n 16, 2K/32K):
  Qwen3-32B        32 dies. sync: 4 x TP8 vLLM replicas, then old log-prob + update on 32 dies, GBS 64.
                   async: r rollouter dies (r/8 TP8 replicas), 32 - r trainer dies; ppo_mini_batch_size 16,
                   require_batches 1, trigger_parameter_sync_step 4 (64 prompts per weight version).
  Qwen3-235B-A22B  128 dies. sync: TP4 x DP32 lockstep ranks (EP128), then old log-prob + update on 128.
                   async: r rollouter dies (TP4 x DP r/4, EP r: fewer dies hold more experts each, so the
                   per-rank KV budget shrinks and t0 grows, see ``setting_235b``), 128 - r trainer dies;
                   ppo_mini_batch_size 64, trigger 8 (512 prompts per version).
  Trainer: ``TrainerModel`` (the reference's published 235B step breakdown, per die; 32B scaled by
  active parameters); async trains with rollout log-probs (verl forces bypass_mode) so it has no
  old log-prob pass, the sync recipe has one. Weight sync between pools: 5.5 GB/s (verl's checkpoint
  engine on 910C) + 1 s resume; colocated: 11.5 s.
Workloads: ``skyt1`` (real per-prompt lengths, AIME24 long reasoning, 32K cap; npu_rl.sim.workloads) and
``curve`` (lengths drawn from the published Qwen3-235B DeepScaleR per-DP survival curve, mean ~7.4K,
i.i.d. per response; needs the shared data folder, skipped when absent).

Printed per setting and workload: tokens/s per die and per A3 card (2 dies) of every schedule and split,
the ratio async / sync, and each schedule's ratio to its lower bound:
  sync      per step: the engine's generation lower bound + trainer + colocated sync;
  pipeline  "ideal pipeline" for the split: per weight version max(rollout work / rollouter replicas,
            trainer time) with every slot full and no sync (work = the engine's LB2 numerator).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from npu_rl.sim import CostModel, ReplicaConfig, SimRequest  # noqa: E402
from npu_rl.sim.async_pipeline import (  # noqa: E402
    REF_235B_ROLLOUT_S,
    TOTAL_PARAMS_B,
    AsyncConfig,
    SampleSource,
    TrainerModel,
    WeightSyncModel,
    _batch_requests,
    rollout_work_ms,
    simulate_fully_async,
    simulate_one_step_off,
    simulate_sync,
)
from npu_rl.sim.model import SimError  # noqa: E402
from npu_rl.sim.workloads import lengths_from_survival, load_lengths_file, load_workload  # noqa: E402

MAX_RESPONSE = 32768
N = 16
CURVE = "rollout_traces/qwen3_235b_per_dp_survival_approx.csv"
#: 235B rollout memory (reference write-up, TP4 DP32 EP128): MoE weights 3.30 GB per die; KV per token per
#: die = 94 layers x 4 KV heads x 128 x 2 (K, V) x 2 B / TP4 = 48,128 B; HBM 1.6 TB/s per die (REFERENCE §7).
MOE_GB_PER_DIE_EP128 = 3.30
KV_BYTES_PER_TOKEN_PER_DIE = 94 * 4 * 128 * 2 * 2 / 4
HBM_GB_PER_MS = 1.6


@dataclass(frozen=True)
class Setting:
    name: str
    dies: int
    dies_per_replica: int
    batch_prompts: int  # sync GBS
    mini: int  # ppo_mini_batch_size (= required_samples, require_batches 1)
    trigger: int
    params_b: float
    trainer: TrainerModel
    splits: tuple[int, ...]  # rollouter dies tried
    lockstep: bool

    def rollout(self, dies: int) -> tuple[CostModel, ReplicaConfig]:
        raise NotImplementedError


class Setting32(Setting):
    def rollout(self, dies: int) -> tuple[CostModel, ReplicaConfig]:
        return CostModel.qwen3_32b_tp8_a3_graph(), ReplicaConfig.qwen3_32b_recipe(n_replicas=dies // 8)


class Setting235(Setting):
    def rollout(self, dies: int) -> tuple[CostModel, ReplicaConfig]:
        """TP4 x DP dies/4, EP = dies: each die holds 128/dies times the experts of the EP128 layout, which
        costs HBM reads per step (t0 += extra bytes / 1.6 TB/s) and KV room (900K per rank at EP128)."""
        extra_gb = MOE_GB_PER_DIE_EP128 * (128 / dies - 1)
        base = CostModel.qwen3_235b_dp_rank()
        cost = CostModel(
            base.t0 + extra_gb / HBM_GB_PER_MS, base.t1, base.t2, base.prefill_per_token, base.prefill_ctx_tokens
        )
        kv = int(900_000 - extra_gb * 1e9 / KV_BYTES_PER_TOKEN_PER_DIE)
        return cost, ReplicaConfig(n_replicas=dies // 4, max_num_seqs=256, kv_budget_tokens=kv, lockstep=True)


def setting_32b(quick: bool) -> Setting:
    return Setting32(
        "Qwen3-32B",
        32,
        8,
        64,
        16,
        4,
        TOTAL_PARAMS_B["qwen3_32b"],
        TrainerModel.qwen3_32b(),
        (8, 16, 24) if not quick else (16,),
        False,
    )


def setting_235b(quick: bool) -> Setting:
    return Setting235(
        "Qwen3-235B-A22B",
        128,
        4,
        512,
        64,
        8,
        TOTAL_PARAMS_B["qwen3_235b"],
        TrainerModel.qwen3_235b(),
        (32, 48, 64, 80) if not quick else (64,),
        True,
    )


def make_source(kind: str, seed: int, data_dir: Path | None, lengths: Path | None = None) -> tuple[SampleSource, str]:
    """Sample k -> (prompt tokens, 16 response lengths), the same for every schedule (seeded by k).
    ``kind`` "file": the user's ``lengths`` (:func:`npu_rl.sim.workloads.load_lengths_file`), sampled as skyt1."""
    if kind in ("skyt1", "file"):
        w = load_workload("skyt1") if kind == "skyt1" else load_lengths_file(lengths)

        def src(k: int):
            rng = np.random.default_rng([seed, k])
            pid = int(rng.integers(w.n_prompts))
            lens = np.minimum(rng.choice(w.responses[pid], size=N, replace=True), MAX_RESPONSE)
            return int(w.prompt_tokens[pid]), [int(x) for x in lens]

        what = "AIME24 prompts" if kind == "skyt1" else f"prompts of {lengths}"
        return src, f"{w.name} (real lengths, {w.n_prompts} {what}, mean {w.all_lengths().mean():.0f})"
    if kind == "curve":
        path = (data_dir or Path()) / CURVE
        rows = [r for r in csv.DictReader(x for x in path.read_text().splitlines() if not x.startswith("#"))]
        xs = [float(r["response_length_tokens"]) for r in rows]
        fs = [float(r["frac_remaining"]) for r in rows]

        def src(k: int):
            rng = np.random.default_rng([seed, k, 1])
            lens = np.minimum(lengths_from_survival(xs, fs, N, rng), MAX_RESPONSE)
            return 74, [int(x) for x in lens]  # published mean prompt 73.7 tokens

        return src, "curve (published Qwen3-235B DeepScaleR per-DP survival, i.i.d., prompt 74)"
    raise SystemExit(f"unknown workload {kind!r}: use skyt1 or curve")


def per_die(tokens: float, ms: float, dies: int) -> float:
    return tokens / (ms / 1e3) / dies


def run_setting(
    st: Setting,
    src: SampleSource,
    versions: int,
    sync_steps: int,
    staleness: list[float],
    seed: int,
    sync_model: WeightSyncModel,
    trainer_factor: float = 1.0,
    pool_trainer_factor: float = 1.0,
    rollout_factor: float = 1.0,
) -> dict:
    def rollout(dies: int) -> tuple[CostModel, ReplicaConfig]:
        cost, cfg = st.rollout(dies)
        f = rollout_factor
        return cost.scaled(t0=f, t1=f, t2=f, prefill=f), cfg

    trainer = st.trainer.scaled(trainer_factor)
    pool_trainer = trainer.scaled(pool_trainer_factor)  # the separate trainer pool (async, one-step-off)
    out: dict = {
        "setting": st.name,
        "dies": st.dies,
        "trainer_source": trainer.source,
        "trainer_factor": trainer_factor,
        "pool_trainer_factor": pool_trainer_factor,
        "rollout_factor": rollout_factor,
    }
    # sync recipe on all dies
    cost, cfg = rollout(st.dies)
    t = time.perf_counter()
    sres = simulate_sync(
        src,
        cost,
        cfg,
        st.batch_prompts,
        lambda tok: trainer.step_s(tok, st.dies, 1),
        sync_steps,
        colocated_sync_s=sync_model.colocated_s,
        seed=seed,
    )
    tok, ms, _ = sres.throughput(warmup=0)
    lb_ms = sum(sres.rollout_lb_ms) + sum(sres.train_ms) + sync_model.colocated_s * 1e3 * len(sres.train_ms)
    out["sync"] = {
        "tok_s_die": per_die(tok, ms, st.dies),
        "step_s": ms / 1e3 / len(sres.tokens),
        "gen_s": float(np.mean(sres.gen_ms) / 1e3),
        "train_s": float(np.mean(sres.train_ms) / 1e3),
        "ratio_to_lb": ms / lb_ms,
        "sim_s": time.perf_counter() - t,
    }
    sync_tps = out["sync"]["tok_s_die"]
    # resource bound: the sync steps' work with every die busy all the time, every decode slot full, no old
    # log-prob pass (async's bypass mode), no weight sync, at the all-dies rollout cost model
    reqs = _batch_requests(src, 0, st.batch_prompts * sync_steps)
    die_ms = rollout_work_ms(reqs, cost, cfg) * st.dies_per_replica
    die_ms += sum(trainer.step_s(t, 1, 0) * 1e3 for t in sres.tokens)
    out["resource_bound_tok_s_die"] = per_die(sum(sres.tokens), die_ms / st.dies, st.dies)
    sync_w = sync_model.sync_s(st.params_b) + sync_model.resume_s
    out["weight_sync_s"] = sync_w
    out["async"], out["one_step_off"] = [], []
    for r in st.splits:
        tdies = st.dies - r
        cost, cfg = rollout(r)
        train_s = lambda tok, d=tdies: pool_trainer.step_s(tok, d, 0)  # noqa: E731
        # one-step-off: batch = the sync GBS; bypass mode too (its config sets rollout_correction.bypass_mode)
        t = time.perf_counter()
        ores = simulate_one_step_off(
            src, cost, cfg, st.batch_prompts, train_s, sync_steps + 1, sync_s=sync_w, seed=seed
        )
        tok, ms, _ = ores.throughput(warmup=1)
        out["one_step_off"].append(
            {
                "rollout_dies": r,
                "trainer_dies": tdies,
                "tok_s_die": per_die(tok, ms, st.dies),
                "ratio_to_sync": per_die(tok, ms, st.dies) / sync_tps,
                "gen_s": float(np.mean(ores.gen_ms) / 1e3),
                "train_s": float(np.mean(ores.train_ms) / 1e3),
                "sim_s": time.perf_counter() - t,
            }
        )
        for stale in staleness:
            acfg = AsyncConfig(
                n=N,
                required_samples=st.mini,
                trigger_parameter_sync_step=st.trigger,
                staleness_threshold=stale,
                partial_rollout=True,
                sync_s=sync_model.sync_s(st.params_b),
                resume_s=sync_model.resume_s,
            )
            t = time.perf_counter()
            ares = simulate_fully_async(src, cost, cfg, acfg, train_s, st.trigger * (versions + 1), seed=seed)
            warm = st.trigger
            tok, ms, nsteps = ares.throughput(warmup=warm)
            measured = ares.steps[warm:]
            # ideal pipeline bound over the measured versions
            reqs = []
            for s in measured:
                for sid in s.samples:
                    for q in _batch_requests(src, sid, 1):
                        reqs.append(SimRequest(len(reqs), sid, q.prompt_len, q.response_len))
            work = rollout_work_ms(reqs, cost, cfg)
            train_ms = sum(s.end_ms - s.start_ms for s in measured)
            bound = max(work / cfg.n_replicas, train_ms)
            busy = ares.rollout_busy_ms
            stal = [x for s in measured for x in s.staleness]
            part = [x for s in measured for x in s.partial]
            tps = per_die(tok, ms, st.dies)
            out["async"].append(
                {
                    "rollout_dies": r,
                    "trainer_dies": tdies,
                    "staleness_threshold": stale,
                    "tok_s_die": tps,
                    "ratio_to_sync": tps / sync_tps,
                    "ratio_to_pipeline_bound": ms / bound,
                    "version_s": ms / 1e3 / versions,
                    "trainer_busy": train_ms / ms,
                    "rollout_work_share": (work / cfg.n_replicas) / ms,
                    "mean_staleness": float(np.mean(stal)),
                    "max_staleness": int(max(stal)),
                    "partial_fraction": float(np.mean(part)),
                    "aborts_per_sync": ares.aborts / max(1, len(ares.syncs)),
                    "reprefill_tokens_per_sync": ares.reprefill_tokens / max(1, len(ares.syncs)),
                    "max_queue_len": ares.max_queue_len,
                    "max_required_samples": ares.extra["max_required_samples"],
                    "dropped_samples": ares.dropped_samples,
                    "rollout_busy_mean": float(busy.mean() / ares.syncs[-1][1]),
                    "sim_s": time.perf_counter() - t,
                }
            )
    best = max(out["async"], key=lambda a: a["tok_s_die"])
    out["best_async"] = best
    out["best_one_step_off"] = max(out["one_step_off"], key=lambda a: a["tok_s_die"])
    # verl's default async_training.concurrent_samples_per_replica = 16 prompts per verl replica (one vLLM
    # server: TP x DP x PP dies). 32B: a TP8 server, 16 x n 16 = its 256 slots. 235B: ONE server over all
    # rollouter dies (DP inside), so 16 prompts = 256 sequences for all of its DP ranks.
    r = best["rollout_dies"]
    servers = r // 8 if st.dies_per_replica == 8 else 1
    cost, cfg = rollout(r)
    acfg = AsyncConfig(
        n=N,
        required_samples=st.mini,
        trigger_parameter_sync_step=st.trigger,
        staleness_threshold=best["staleness_threshold"],
        max_concurrent_samples=16 * servers,
        sync_s=sync_model.sync_s(st.params_b),
        resume_s=sync_model.resume_s,
    )
    ares = simulate_fully_async(
        src,
        cost,
        cfg,
        acfg,
        lambda tok: pool_trainer.step_s(tok, st.dies - r, 0),
        st.trigger * (versions + 1),
        seed=seed,
    )
    tok, ms, _ = ares.throughput(warmup=st.trigger)
    out["best_with_verl_default_concurrency"] = {
        "rollout_dies": r,
        "max_concurrent_samples": 16 * servers,
        "tok_s_die": per_die(tok, ms, st.dies),
        "ratio_to_sync": per_die(tok, ms, st.dies) / sync_tps,
    }
    return out


def print_setting(res: dict, workload: str) -> None:
    s = res["sync"]
    print(f"\n== {res['setting']} ({res['dies']} dies), workload {workload}")
    print(
        f"   trainer model: {res['trainer_source']} (x{res['trainer_factor']}, pool x{res['pool_trainer_factor']}); "
        f"rollout cost x{res['rollout_factor']}; "
        f"weight sync {res['weight_sync_s']:.1f} s"
    )
    print(
        f"   sync recipe      {s['tok_s_die']:7.1f} tok/s/die ({2 * s['tok_s_die']:7.1f}/card)  "
        f"step {s['step_s']:7.0f} s "
        f"(gen {s['gen_s']:.0f} + train {s['train_s']:.0f} + sync)  step/LB {s['ratio_to_lb']:.2f}"
    )
    for o in res["one_step_off"]:
        print(
            f"   one-step-off {o['rollout_dies']:3d}:{o['trainer_dies']:<3d} {o['tok_s_die']:7.1f} tok/s/die "
            f"({2 * o['tok_s_die']:7.1f}/card)  x{o['ratio_to_sync']:.2f} vs sync  "
            f"(gen {o['gen_s']:.0f} s, train {o['train_s']:.0f} s)"
        )
    for a in res["async"]:
        print(
            f"   fully-async {a['rollout_dies']:3d}:{a['trainer_dies']:<3d} stale {a['staleness_threshold']:.2g}  "
            f"{a['tok_s_die']:7.1f} tok/s/die ({2 * a['tok_s_die']:7.1f}/card)  x{a['ratio_to_sync']:.2f} vs sync  "
            f"/pipeline-LB {a['ratio_to_pipeline_bound']:.2f}  trainer busy {a['trainer_busy']:.0%}  "
            f"staleness mean {a['mean_staleness']:.2f} max {a['max_staleness']}  partial {a['partial_fraction']:.0%}  "
            f"queue max {a['max_queue_len']}/{a['max_required_samples']}  [{a['sim_s']:.1f} s]"
        )
    b = res["best_async"]
    rb = res["resource_bound_tok_s_die"]
    d = res["best_with_verl_default_concurrency"]
    print(
        f"   same split with verl's default concurrent_samples_per_replica=16 ({d['max_concurrent_samples']} prompts "
        f"in flight): {d['tok_s_die']:.1f} tok/s/die, x{d['ratio_to_sync']:.2f} vs sync"
    )
    print(
        f"   resource bound {rb:.1f} tok/s/die (all dies always busy, full decode slots, no old log-prob, no sync): "
        f"sync reaches {s['tok_s_die'] / rb:.0%}, best fully-async {b['tok_s_die'] / rb:.0%}"
    )
    print(
        f"   BEST fully-async split {b['rollout_dies']}:{b['trainer_dies']} "
        f"(staleness {b['staleness_threshold']:.2g}): "
        f"async/sync = {b['ratio_to_sync']:.2f}x, ratio to its ideal-pipeline bound {b['ratio_to_pipeline_bound']:.2f}"
    )


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = sorted({(r["setting"], r["dies"]) for r in results}, key=lambda k: k[1])
    fig, axes = plt.subplots(1, len(keys), figsize=(6.2 * len(keys), 4.4), squeeze=False)
    for ax, (name, dies) in zip(axes[0], keys, strict=True):
        for k, r in enumerate(x for x in results if x["setting"] == name):
            wl = r["workload_short"]
            col = f"C{k}"
            line = ax.axhline(r["sync"]["tok_s_die"], ls=":", lw=1.2, color=col)
            for stale in sorted({a["staleness_threshold"] for a in r["async"]}):
                pts = [(a["rollout_dies"], a["tok_s_die"]) for a in r["async"] if a["staleness_threshold"] == stale]
                ax.plot(
                    *zip(*pts, strict=True),
                    "-o",
                    color=col,
                    ms=4,
                    alpha=1.0 if stale else 0.5,
                    label=f"{wl}: fully-async, staleness {stale:g}",
                )
            pts = [(o["rollout_dies"], o["tok_s_die"]) for o in r["one_step_off"]]
            ax.plot(*zip(*pts, strict=True), "--s", color=col, ms=4, alpha=0.7, label=f"{wl}: one-step-off")
            line.set_label(f"{wl}: sync recipe ({dies} dies)")
        ax.set_title(f"{name}, {dies} dies (simulated)")
        ax.set_xlabel("rollouter dies (trainer = the rest)")
        ax.set_ylabel("tokens / s per die (prompt + response)")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="one split, 32B only, 2 weight versions (for tests)")
    ap.add_argument("--settings", default=None, help="comma list of 32b, 235b (default: both; --quick: 32b)")
    ap.add_argument("--workloads", default=None, help="comma list of skyt1, curve (default: both; --quick: skyt1)")
    ap.add_argument(
        "--lengths",
        type=Path,
        default=None,
        help="your response lengths instead of --workloads (JSONL or a length table; docs/sim.md)",
    )
    ap.add_argument("--versions", type=int, default=0, help="measured weight versions (after one warm-up)")
    ap.add_argument("--staleness", default=None, help="comma list (default 0,0.5; --quick 0.5)")
    ap.add_argument("--trainer-factor", type=float, default=1.0, help="trainer time x this (sensitivity)")
    ap.add_argument(
        "--pool-trainer-factor",
        type=float,
        default=1.0,
        help="separate trainer pool's time x this (0.5: the pool trains as fast per step as all dies colocated)",
    )
    ap.add_argument(
        "--rollout-factor", type=float, default=1.0, help="rollout cost model x this, every schedule (sensitivity)"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data-dir", type=Path, default=REPO.parent / "shared" / "data")
    ap.add_argument("--out-json", type=Path, default=None, help="default docs/async_sim.json (none with --quick)")
    ap.add_argument("--out-png", type=Path, default=None, help="default docs/async_sim.png (none with --quick)")
    args = ap.parse_args(argv)
    quick = args.quick
    settings = (args.settings or ("32b" if quick else "32b,235b")).split(",")
    workloads = (args.workloads or ("skyt1" if quick else "skyt1,curve")).split(",")
    if args.lengths is not None:
        try:
            load_lengths_file(args.lengths)  # its errors before anything runs
        except SimError as e:
            ap.error(str(e))
        workloads = ["file"]
    staleness = [float(x) for x in (args.staleness or ("0.5" if quick else "0,0.5")).split(",")]
    versions = args.versions or (2 if quick else 3)
    out_json = args.out_json or (None if quick else REPO / "docs" / "async_sim.json")
    out_png = args.out_png or (None if quick else REPO / "docs" / "async_sim.png")
    sync_model = WeightSyncModel()
    results = []
    t_all = time.perf_counter()
    for wl in workloads:
        if wl == "curve" and not (args.data_dir / CURVE).is_file():
            print(f"SKIPPED workload curve: {args.data_dir / CURVE} not found (pass --data-dir)")
            continue
        src, desc = make_source(wl, args.seed, args.data_dir, args.lengths)
        for name in settings:
            st = {"32b": setting_32b, "235b": setting_235b}[name](quick)
            sync_steps = 2 if quick else (4 if name == "32b" else 3)
            res = run_setting(
                st,
                src,
                versions,
                sync_steps,
                staleness,
                args.seed,
                sync_model,
                args.trainer_factor,
                args.pool_trainer_factor,
                args.rollout_factor,
            )
            res["workload"], res["workload_short"] = desc, wl
            if name == "235b" and wl == "curve":
                res["sync_gen_vs_published"] = res["sync"]["gen_s"] / REF_235B_ROLLOUT_S
                print(
                    f"   (235B sync generation on the published curve: {res['sync']['gen_s']:.0f} s simulated vs "
                    f"{REF_235B_ROLLOUT_S} s published rollout, x{res['sync_gen_vs_published']:.2f})"
                )
            print_setting(res, desc)
            results.append(res)
    print(f"\ntotal {time.perf_counter() - t_all:.0f} s")
    if out_json:
        meta = {
            "command": " ".join(["python benchmarks/bench_async.py", *(argv if argv is not None else sys.argv[1:])]),
            "seed": args.seed,
            "versions": versions,
            "staleness": staleness,
            "weight_sync_gb_per_s": sync_model.gb_per_s,
            "colocated_sync_s": sync_model.colocated_s,
        }
        out_json.write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")
        print(f"wrote {out_json}")
    if out_png:
        plot(results, out_png)
        print(f"wrote {out_png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
