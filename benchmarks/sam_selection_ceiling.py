"""How much of SAM's acceptance is lost to choosing *which* earlier occurrence to continue (issue 20).

Sky-T1 successive checkpoints, one request at a time (no siblings in this data set, so the order does
not matter), with the history of every earlier checkpoint's uncapped response to the same prompt.
At each target forward pass the drafter has up to four candidate continuations:

- ``own recent`` / ``own first``: the longest suffix of the request's text that occurred earlier in
  it, continued from its most recent / first earlier occurrence (what SAM drafts from its own text);
- ``history recent`` / ``history first``: the longest suffix that occurs in the history, continued
  from its latest / first occurrence there;
- and, for the rows that say so, ``engine-wide``: the longest suffix that occurs in any earlier
  response to *any* prompt (every earlier checkpoint's and the ones before it in this checkpoint),
  continued from its latest occurrence: the corpus of vLLM's suffix decoding (its global tree).

Rules compared (tokens per forward = 1 + accepted draft tokens, greedy match against the recorded
response, as in ``sam_replay.py``):

- ``longest``: the longer match drafts (own on ties), as ``SamDrafter`` does;
- ``history frequent``: as ``longest``, but a history draft follows, token by token, the most
  frequent continuation among the history's occurrences (occurrence counts of the history automaton);
- ``follow the leader``: the candidate that would have accepted most in the previous pass;
- ``learned by match lengths``: own or history, by which one would have accepted more so far (summed
  over every earlier pass of the run) in the same cell of (own match, history match) lengths, cells
  by powers of two; what a pass would have accepted is judged on the tokens the pass emitted, all an
  engine knows;
- ``longest of own/history/engine-wide``: as ``longest``, the engine-wide match drafting when it
  is longer than both (ties to own, then history);
- ``vote over the five chains``: token by token, the token most of the candidate chains still in
  the running propose (own recent/first, history recent/first, engine-wide; ties to the chain of
  the longest match), the chains that disagree dropping out;
- ``oracle own/history``, ``oracle all four`` and ``oracle own/history/engine-wide``: the best
  candidate, known only afterwards (a ceiling for any rule that picks one of these chains, not a
  drafter).

    python benchmarks/sam_selection_ceiling.py [--k 3 5 8] [--data-dir DIR]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from numba import njit

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import bench_sam as B  # noqa: E402

from npu_rl.spec_decode import sam as S  # noqa: E402

RULES = (
    "longest",
    "history frequent",
    "follow the leader",
    "learned by match lengths",
    "longest of own/history/engine-wide",
    "vote over the five chains",
    "oracle own/history",
    "oracle all four",
    "oracle own/history/engine-wide",
)


@njit(cache=True)
def _accepted(a, pos, n_text, period, truth, p, k):
    """Tokens of SAM's draft after end position ``pos`` of ``a[:n_text]`` (``sam._continuation``: past
    the end it repeats the last ``period`` tokens) that equal truth[p:p+k]."""
    out = np.empty(max(k, 1), np.int32)
    n = S._continuation(a, n_text, pos, period, k, out)
    m = 0
    while m < n and p + m < truth.shape[0] and out[m] == truth[p + m]:
        m += 1
    return m


@njit(cache=True)
def _draft(a, pos, n_text, period, k):
    """SAM's draft of up to ``k`` tokens after end position ``pos`` (as in :func:`_accepted`)."""
    out = np.empty(max(k, 1), np.int32)
    n = S._continuation(a, n_text, pos, period, k, out)
    return out[:n].copy()


def _vote(drafts: list[np.ndarray], order: list[int], k: int) -> list[int]:
    """Token by token, the token most chains still in the running propose; ``order``: the chains by
    priority (ties go to the earliest); a chain that disagrees with the token chosen drops out."""
    alive = [i for i in order if len(drafts[i])]
    chain: list[int] = []
    for j in range(k):
        votes: dict[int, list[int]] = {}
        for i in alive:
            if len(drafts[i]) > j:
                votes.setdefault(int(drafts[i][j]), []).append(i)
        if not votes:
            break
        alive = max(votes.values(), key=lambda v: (len(v), -order.index(v[0])))
        chain.append(int(drafts[alive[0]][j]))
    return chain


@njit(cache=True)
def _most_frequent_next(a, m):
    """Per state: the outgoing token (and its target) whose target has the most end positions."""
    ns, ne = m[S.N_STATES], m[S.N_EDGES]
    ln, lk, fi = a[m[S.O_LEN] : m[S.O_LEN] + ns], a[m[S.O_LINK] : m[S.O_LINK] + ns], a[m[S.O_FIRST] : m[S.O_FIRST] + ns]
    cnt = np.zeros(ns, np.int64)
    for s in range(1, ns):
        if ln[s] == fi[s] + 1:  # created by an extension (not a clone): one end position of its own
            cnt[s] = 1
    for s in np.argsort(-ln):
        if s > 0 and lk[s] > 0:
            cnt[lk[s]] += cnt[s]
    btok, bdst, best = np.full(ns, -1, np.int32), np.full(ns, -1, np.int32), np.zeros(ns, np.int64)
    src, tok, dst = a[m[S.O_SRC] : m[S.O_SRC] + ne], a[m[S.O_TOK] : m[S.O_TOK] + ne], a[m[S.O_DST] : m[S.O_DST] + ne]
    for e in range(ne):
        if tok[e] >= 0 and cnt[dst[e]] > best[src[e]]:
            best[src[e]], btok[src[e]], bdst[src[e]] = cnt[dst[e]], tok[e], dst[e]
    return btok, bdst


@njit(cache=True)
def _frequent_accepted(btok, bdst, s, truth, p, k):
    n = 0
    while n < k and p + n < truth.shape[0] and btok[s] >= 0 and btok[s] == truth[p + n]:
        s = bdst[s]
        n += 1
    return n


def _cell(n: int) -> int:
    return min(int(n).bit_length(), 7)


def replay(rounds, k: int, rule: str) -> float:
    """Tokens per forward pass of ``rule`` over every request (checkpoint 0 has no history, as in bench_sam)."""
    history: dict[int, list[np.ndarray]] = {}
    tokens = forwards = 0
    cells = np.zeros((8, 8, 2))  # (own cell, history cell) -> what own / history would have accepted
    wide = S.SuffixAutomaton(1 << 16)  # every earlier response, any prompt (suffix decoding's global tree)
    n_wide = 0
    for reqs in rounds:
        for r in reqs:
            hsa = S.SuffixAutomaton(1 << 12)
            for i, h in enumerate(history.get(r.group_key, [])):
                hsa.append(h)
                hsa.append([-1 - i])
            btok, bdst = _most_frequent_next(hsa.arena, hsa.meta)
            own = S.SuffixAutomaton(1 << 12)
            own.append(r.prompt)
            wctl = S.new_ctl(k, 1, True)
            S._advance(np.ascontiguousarray(r.prompt, np.int32), wide.arena, wide.meta, wctl)
            ctl = S.new_ctl(k, 1, True)
            S._advance(np.ascontiguousarray(r.prompt, np.int32), hsa.arena, hsa.meta, ctl)
            truth = np.ascontiguousarray(r.truth, np.int32)
            p, n = 0, truth.shape[0]
            last = np.zeros(4)
            while p < n:
                a, m = own.arena, own.meta
                nt = int(m[S.N_TEXT])
                t = a[m[S.O_LINK] + m[S.LAST]]
                own_len = int(a[m[S.O_LEN] + t]) if t > 0 else 0
                hl, hs = int(ctl[S.C_GLEN]), int(ctl[S.C_GSTATE])
                ha, hm = hsa.arena, hsa.meta
                kk = min(k, n - p - 1)
                c = np.zeros(4, np.int64)  # own recent, own first, history recent, history first
                q = f = 0
                if own_len and kk > 0:
                    q, f = int(m[S.QPOS]), int(a[m[S.O_FIRST] + t])
                    c[0] = _accepted(a, q, nt, nt - 1 - q, truth, p, kk)
                    c[1] = _accepted(a, f, nt, nt - 1 - f, truth, p, kk)
                if hl and kk > 0:
                    c[2] = _accepted(ha, int(ha[hm[S.O_RECENT] + hs]), int(hm[S.N_TEXT]), 0, truth, p, kk)
                    c[3] = _accepted(ha, int(ha[hm[S.O_FIRST] + hs]), int(hm[S.N_TEXT]), 0, truth, p, kk)
                wl, ws = int(wctl[S.C_GLEN]), int(wctl[S.C_GSTATE])
                wa, wm = wide.arena, wide.meta
                wpos = int(wa[wm[S.O_RECENT] + ws])
                cw = _accepted(wa, wpos, int(wm[S.N_TEXT]), 0, truth, p, kk) if wl and kk > 0 else 0
                base = 0 if own_len >= hl else 2
                if rule == "longest":
                    acc = c[base]
                elif rule == "history frequent":
                    acc = c[0] if own_len >= hl else (_frequent_accepted(btok, bdst, hs, truth, p, kk) if kk > 0 else 0)
                elif rule == "follow the leader":
                    ok = [own_len > 0, own_len > 0, hl > 0, hl > 0]
                    best = base
                    for i in range(4):
                        if ok[i] and last[i] > last[best]:
                            best = i
                    acc = c[best]
                elif rule == "learned by match lengths":
                    w = cells[_cell(own_len), _cell(hl)]
                    acc = c[base] if not (own_len and hl) or w[0] == w[1] else c[0 if w[0] > w[1] else 2]
                elif rule == "longest of own/history/engine-wide":
                    acc = c[base] if max(own_len, hl) >= wl else cw
                elif rule == "vote over the five chains":
                    chains = [np.empty(0, np.int32)] * 5
                    if own_len and kk > 0:
                        chains[0] = _draft(a, q, nt, nt - 1 - q, kk)
                        chains[1] = _draft(a, f, nt, nt - 1 - f, kk)
                    if hl and kk > 0:
                        chains[2] = _draft(ha, int(ha[hm[S.O_RECENT] + hs]), int(hm[S.N_TEXT]), 0, kk)
                        chains[3] = _draft(ha, int(ha[hm[S.O_FIRST] + hs]), int(hm[S.N_TEXT]), 0, kk)
                    if wl and kk > 0:
                        chains[4] = _draft(wa, wpos, int(wm[S.N_TEXT]), 0, kk)
                    lens = (own_len, own_len, hl, hl, wl)
                    order = sorted(range(5), key=lambda i: (-lens[i], i))
                    chain = _vote(chains, order, kk) if kk > 0 else []
                    acc = 0
                    while acc < len(chain) and chain[acc] == truth[p + acc]:
                        acc += 1
                elif rule == "oracle own/history":
                    acc = max(c[0], c[2])
                elif rule == "oracle all four":
                    acc = c.max()
                else:
                    acc = max(c[0], c[2], cw)
                step = int(acc) + 1
                last = np.minimum(c, step).astype(float)  # what each candidate would have accepted
                if own_len and hl:
                    cells[_cell(own_len), _cell(hl)] += (last[0], last[2])
                new = truth[p : p + step]
                own.append(new)
                S._advance(new, ha, hm, ctl)
                S._advance(new, wide.arena, wide.meta, wctl)
                p += step
                forwards += 1
            tokens += n
            wide.append(truth)  # finished: every later request sees it, whatever its prompt
            n_wide += 1
            wide.append([-n_wide])
        for r in reqs:
            history.setdefault(r.group_key, []).append(np.ascontiguousarray(r.truth, np.int32))
    return tokens / forwards


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir")
    ap.add_argument("--k", type=int, nargs="+", default=[3, 5, 8])
    ap.add_argument("--prompts", type=int, default=30, help="AIME24 prompts per checkpoint")
    args = ap.parse_args(argv)
    rounds = B.load_skyt1(B.data_dir(args.data_dir), B.tokenizer(), args.prompts, with_capped=False)
    print(f"Sky-T1: {len(rounds)} checkpoints, {sum(map(len, rounds))} uncapped responses, tokens per forward pass")
    print("| rule | " + " | ".join(f"k = {k}" for k in args.k) + " |")
    print("|---|" + "---|" * len(args.k))
    for rule in RULES:
        t0 = time.time()
        vals = [replay(rounds, k, rule) for k in args.k]
        print(f"| {rule} | " + " | ".join(f"{v:.3f}" for v in vals) + f" |  [{time.time() - t0:.0f} s]", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
