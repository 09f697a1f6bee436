"""CPU micro-benchmark: Python GC pauses inside engine steps, with and without ``NPU_RL_ENGINE_GC``.

    python benchmarks/bench_engine_gc.py [--steps 1500] [--batch 256] [--heap 300000] [--plot docs/engine_gc.png]

Simulates what vLLM's scheduler and output processing allocate per decode step of a large batch
(``--batch`` running requests): per request a small output object (dict + token list) and a
scheduled-request record tied to its request and to the step's scheduler output (reference cycles:
each step's records become cyclic garbage), a growing token list per request, and finished requests
replaced by new ones (a finished request is cyclic garbage in the oldest generation). A start-up heap
of ``--heap`` small objects is frozen after creation as vLLM does (``freeze_gc_heap`` in
``EngineCore.__init__``); ``--no-freeze`` leaves it for every full collection to traverse (worst case).

Three modes in one run, same seed and work:
- ``auto``: CPython's automatic GC (what vLLM 0.23 does after its start-up freeze);
- ``guard``: :class:`npu_rl.engine_gc.StepGC` with its defaults (no collection inside a step,
  bounded collections at step boundaries);
- ``off``: automatic GC disabled and never collected (the naive fix): memory grows without bound.

Reports per mode: step time p50/p99/max (ms), GC pauses inside steps (count, total, max; from
``gc.callbacks``), GC time at step boundaries, and memory (``sys.getallocatedblocks()``, peak and
final, relative to the start). Ratios guard/auto are measured in this run.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from npu_rl.engine_gc import StepGC  # noqa: E402


class Request:
    __slots__ = ("rid", "tokens", "blocks", "sched", "__weakref__")

    def __init__(self, rid: int, prompt_len: int):
        self.rid = rid
        self.tokens = list(range(prompt_len))
        self.blocks = [[] for _ in range(prompt_len // 16 + 1)]
        self.sched = None


class Scheduled:
    """Per-step record of a scheduled request; ``req.sched`` points back: a reference cycle."""

    def __init__(self, req: Request, step: int, parent: dict):
        self.parent = parent  # the step's scheduler output lists this record: a cycle per step
        self.req = req
        self.step = step
        self.new_token_ids = [step % 151_000]
        self.extra = {"num_computed": len(req.tokens), "spec": []}
        req.sched = self


def make_heap(n: int) -> list:
    return [{"k": i, "v": [i]} for i in range(n)]


def run(mode: str, steps: int, batch: int, heap_n: int, seed: int, freeze: bool = True) -> dict:
    rng = random.Random(seed)
    gc.collect()
    gc.enable()
    heap = make_heap(heap_n)  # noqa: F841 - long-lived start-up state
    if freeze:  # what vLLM does after start-up (freeze_gc_heap): the collector never scans it again
        gc.collect()
        gc.freeze()
    running = [Request(i, rng.randint(64, 512)) for i in range(batch)]
    next_id = batch
    in_step = False
    pauses_in: list[float] = []
    pauses_out: list[float] = []
    full_ms: list[float] = []
    t_start = [0.0]

    def cb(phase, info):
        if phase == "start":
            t_start[0] = time.perf_counter()
        else:
            dt = time.perf_counter() - t_start[0]
            (pauses_in if in_step else pauses_out).append(dt)
            if info["generation"] == 2:
                full_ms.append(dt * 1e3)

    guard = StepGC() if mode == "guard" else None
    if mode == "off":
        gc.disable()
    base_blocks = sys.getallocatedblocks()
    blocks: list[int] = []
    step_s: list[float] = []
    gc.callbacks.append(cb)
    try:
        for step in range(steps):
            t0 = time.perf_counter()
            in_step = True
            if guard is not None:
                guard.__enter__()
            outputs = []
            sched_out = {"step": step, "scheduled": []}
            for r in running:
                s = Scheduled(r, step, sched_out)
                sched_out["scheduled"].append(s)
                r.tokens.append(s.new_token_ids[0])
                if len(r.tokens) % 16 == 0:
                    r.blocks.append([])
                outputs.append({"request_id": r.rid, "new_token_ids": list(s.new_token_ids), "finish": None})
            for i in range(len(running)):
                if rng.random() < 0.01:  # finished: replaced by a new request, its cycle is garbage
                    running[i] = Request(next_id, rng.randint(64, 512))
                    next_id += 1
            del outputs, sched_out, s
            in_step = False
            step_s.append(time.perf_counter() - t0)
            if guard is not None:
                guard.__exit__(None, None, None)  # boundary collection, timed by the callback
            blocks.append(sys.getallocatedblocks() - base_blocks)
    finally:
        gc.callbacks.remove(cb)
        gc.unfreeze()
        gc.enable()
        gc.collect()

    ms = sorted(x * 1e3 for x in step_s)

    def pct(p):
        return ms[min(len(ms) - 1, int(p / 100 * len(ms)))]

    return {
        "mode": mode,
        "p50_ms": statistics.median(ms),
        "p99_ms": pct(99),
        "max_ms": ms[-1],
        "total_s": sum(step_s),
        "gc_in_step_n": len(pauses_in),
        "gc_in_step_ms": sum(pauses_in) * 1e3,
        "gc_in_step_max_ms": max(pauses_in, default=0.0) * 1e3,
        "gc_boundary_n": len(pauses_out),
        "gc_boundary_ms": sum(pauses_out) * 1e3,
        "gc_boundary_max_ms": max(pauses_out, default=0.0) * 1e3,
        "full_n": len(full_ms),
        "full_ms": sum(full_ms),
        "blocks_peak": max(blocks),
        "blocks_final": blocks[-1],
        "step_ms": [x * 1e3 for x in step_s],
        "blocks": blocks,
    }


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for r in results:
        xs = sorted(r["step_ms"])
        a.plot(xs, [i / len(xs) for i in range(len(xs))], label=r["mode"])
        b.plot([x / 1e3 for x in r["blocks"]], label=r["mode"])
    a.set_xscale("log")
    a.set_xlabel("step time (ms, log)")
    a.set_ylabel("fraction of steps")
    a.set_title("step time CDF")
    a.legend()
    b.set_xlabel("step")
    b.set_ylabel("allocated blocks above start (thousands)")
    b.set_title("memory")
    b.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--batch", type=int, default=256, help="running requests per step")
    ap.add_argument("--heap", type=int, default=300_000, help="long-lived start-up objects (dict + list each)")
    ap.add_argument(
        "--no-freeze", action="store_true", help="leave the start-up heap unfrozen (vLLM freezes it: freeze_gc_heap)"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--plot", type=Path, default=None, help="write a PNG (step-time CDF, memory)")
    args = ap.parse_args()
    if min(args.steps, args.batch) < 1 or args.heap < 0:
        ap.error("--steps and --batch must be >= 1, --heap >= 0")
    g = StepGC()
    print(
        f"python {sys.version.split()[0]}, gc thresholds {gc.get_threshold()}; guard every={g.every} "
        f"max_gen0={g.max_gen0} full_growth={g.full_growth}; {args.steps} steps x {args.batch} requests, "
        f"start-up heap {args.heap} {'unfrozen' if args.no_freeze else 'frozen'}"
    )
    freeze = not args.no_freeze
    results = [run(m, args.steps, args.batch, args.heap, args.seed, freeze) for m in ("auto", "guard", "off")]
    cols = [
        ("p50_ms", "{:.3f}"), ("p99_ms", "{:.3f}"), ("max_ms", "{:.2f}"), ("total_s", "{:.2f}"),
        ("gc_in_step_n", "{}"), ("gc_in_step_ms", "{:.1f}"), ("gc_in_step_max_ms", "{:.2f}"),
        ("gc_boundary_n", "{}"), ("gc_boundary_ms", "{:.1f}"), ("gc_boundary_max_ms", "{:.2f}"),
        ("full_n", "{}"), ("full_ms", "{:.1f}"),
        ("blocks_peak", "{}"), ("blocks_final", "{}"),
    ]  # fmt: skip
    print("| mode | " + " | ".join(c for c, _ in cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for r in results:
        print(f"| {r['mode']} | " + " | ".join(f.format(r[c]) for c, f in cols) + " |")
    auto, guard, off = results

    def gc_ms(r):
        return r["gc_in_step_ms"] + r["gc_boundary_ms"]

    print(
        f"guard/auto: p99 step {guard['p99_ms'] / auto['p99_ms']:.2f}x, "
        f"max step {guard['max_ms'] / auto['max_ms']:.2f}x, total step time {guard['total_s'] / auto['total_s']:.2f}x, "
        f"all GC time {gc_ms(guard) / max(gc_ms(auto), 1e-9):.2f}x; "
        f"memory peak guard/auto {guard['blocks_peak'] / max(auto['blocks_peak'], 1):.2f}x, "
        f"off/auto final {off['blocks_final'] / max(auto['blocks_final'], 1):.1f}x"
    )
    if args.plot:
        plot(results, args.plot)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
