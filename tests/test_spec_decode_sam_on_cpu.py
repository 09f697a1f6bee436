"""The SAM drafter core (npu_rl.spec_decode.sam / corpus) against brute-force oracles (issue 6)."""

from __future__ import annotations

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis", reason="hypothesis is in constraints/cpu.txt: install_stack.sh --cpu")
from hypothesis import example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from npu_rl.spec_decode.corpus import GroupCorpus, SamDrafterV1, prompt_key  # noqa: E402
from npu_rl.spec_decode.sam import (  # noqa: E402
    C_GLEN,
    C_MATCH,
    C_SOURCE,
    CE,
    CH,
    CS,
    CT,
    RESYNC_TOKENS,
    SOURCE_GROUP,
    SOURCE_OWN,
    SuffixAutomaton,
    new_ctl,
)

# small alphabets make long repeats (the interesting case); chunks exercise multi-token catch-up
texts = st.lists(st.integers(0, 3), min_size=1, max_size=80)
chunked = st.lists(st.lists(st.integers(0, 4), min_size=1, max_size=5), min_size=1, max_size=25)
# found by a stress run: appending the second 2 needs 129 edges (the state of "... 1 2" gets its edge
# on 2, then its clone copies it); the capacity check counted 128 = capacity, so the extension wrote
# one edge past the edge arrays and the automaton lost the match of the final 1
OVERFLOW_PROMPT = [1, *[0] * 29, 1, *[0] * 8, 1, 0, 0, 0, 1, 0, 0, 0, 0, 1]


def longest_suffix_match_bruteforce(text) -> tuple[int, list[int]]:
    """Oracle: (L, end positions) of the longest suffix of ``text`` that also ends earlier.

    O(n^2) per call. End positions are every i < n-1 where text[i-L+1 : i+1] equals the suffix.
    """
    t = list(text)
    n = len(t)
    for L in range(n - 1, 0, -1):
        suf = t[n - L :]
        ends = [i for i in range(L - 1, n - 1) if t[i - L + 1 : i + 1] == suf]
        if ends:
            return L, ends
    return 0, []


def longest_match_in_bruteforce(text, corpus) -> int:
    """Oracle: length of the longest suffix of ``text`` that occurs in ``corpus``.

    O(min(len(text), len(corpus))^2 * len(corpus)) per call: no match is longer than the corpus.
    """
    t, c = list(text), list(corpus)
    for L in range(min(len(t), len(c)), 0, -1):
        suf = t[len(t) - L :]
        if any(c[i : i + L] == suf for i in range(len(c) - L + 1)):
            return L
    return 0


def assert_within_arena(sam: SuffixAutomaton) -> None:
    """The counters never pass the capacities the arena was laid out for (the hash at most half full)."""
    m = sam.meta
    assert len(sam) <= m[CT] and sam.num_states <= m[CS] and sam.num_edges <= m[CE] and 2 * sam.num_edges <= m[CH]


@settings(max_examples=150, deadline=None)
@given(texts, st.sampled_from(["recent", "first"]))
@example(text=[*OVERFLOW_PROMPT, 2, 2, 1], occurrence="recent")
def test_longest_repeated_suffix_matches_the_oracle_after_every_append(text, occurrence):
    sam = SuffixAutomaton(capacity=1, occurrence=occurrence)  # tiny: every growth path runs
    for i, tok in enumerate(text):
        sam.append([tok])
        assert_within_arena(sam)
        length, ends = longest_suffix_match_bruteforce(text[: i + 1])
        got_len, pos = sam.suffix_match()
        assert got_len == length
        if length:
            assert pos in ends  # the draft continues a real earlier occurrence of the matched suffix
            if occurrence == "first":
                assert pos == min(ends)
    assert list(sam.text) == text


@settings(max_examples=100, deadline=None)
@given(texts, st.integers(1, 8))
def test_draft_is_the_continuation_of_the_match_extended_periodically(text, k):
    sam = SuffixAutomaton(capacity=4)
    sam.append(text)
    length, pos = sam.suffix_match()
    draft = list(sam.propose(k))
    if length == 0:
        assert draft == []
        return
    # oracle: continue from pos; past the end of the text the match says the text has period n-1-pos
    ext = list(text)
    period = len(text) - 1 - pos
    for _ in range(k):
        ext.append(ext[-period])
    assert draft == ext[pos + 1 : pos + 1 + k]
    assert len(draft) == k
    assert list(sam.propose(k, min_match=length + 1)) == []


def test_recent_occurrence_is_the_latest_on_a_real_pattern():
    # the longest repeated suffix "5 1 2" ends at 5 and at 9: first continues with 8, recent with 9
    text = [1, 2, 7, 5, 1, 2, 8, 5, 1, 2, 9, 5, 1, 2]
    recent, first = SuffixAutomaton(occurrence="recent"), SuffixAutomaton(occurrence="first")
    recent.append(text)
    first.append(text)
    assert recent.propose(1).tolist() == [9]
    assert first.propose(1).tolist() == [8]
    assert recent.suffix_match() == (3, 9) and first.suffix_match() == (3, 5)


responses = st.lists(st.lists(st.integers(0, 4), min_size=1, max_size=12), max_size=4)
joins = st.lists(st.booleans(), max_size=25)  # joins[i]: a pending response joins the group before chunk i
# a request's prompt, appended before its first step (as SamDrafter.start does): with it the text
# crosses the own arena's first doublings (64 tokens, 128 states and edges) inside the steps
prompts = st.lists(st.integers(0, 4), max_size=120)
# found by a random CI run: after the last chunk's first two tokens the own arena (128 edges) had no
# room for the third's, the step grew it and retried with the third token only, and the group match
# skipped the two, claiming "0 0" (2) where the text ends "1 0" (longest match 1)
CI_CHUNKS = [[0, 0, 0, 0], [1, 0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], *[[0] * 5] * 5, [0, 0, 2, 0], [0, 1, 0]]


@settings(max_examples=100, deadline=None)
@given(prompts, chunked, responses, joins)
@example(prompt=[], chunks=CI_CHUNKS, responses=[[0, 0]], joins=[True])
def test_group_match_is_exact_while_the_group_automaton_grows(prompt, chunks, responses, joins):
    """The running match against a growing corpus never overstates and, after a resync, is the longest."""
    group = SuffixAutomaton(capacity=1)
    ctl = new_ctl(3, group=True)
    own = SuffixAutomaton(capacity=1)
    own.append(prompt)
    seen: list[int] = list(prompt)
    corpus: list[int] = []
    pending = list(responses)
    out = np.empty(3, np.int32)
    for i, chunk in enumerate(chunks):
        if pending and i < len(joins) and joins[i]:
            resp = pending.pop()
            group.append([-len(corpus) - 1, *resp])  # unique separator, as GroupCorpus writes
            corpus += [-len(corpus) - 1, *resp]
        seen += chunk
        n = own.step(np.array(chunk, np.int32), out, ctl, group)
        best = longest_match_in_bruteforce(seen, corpus)
        glen = int(ctl[C_GLEN])
        if len(seen) <= RESYNC_TOKENS:  # the resync window covers the whole text: exact
            assert glen == best
        assert glen <= best
        own_len = own.suffix_match()[0]
        assert ctl[C_MATCH] == max(own_len, glen)
        if n:
            src = int(ctl[C_SOURCE])
            if src == SOURCE_GROUP:
                pos = group.match_position(ctl)
                assert group.text[pos - glen + 1 : pos + 1].tolist() == seen[len(seen) - glen :]
                assert out[:n].tolist() == group.continuation(pos, n).tolist()
            else:
                assert src == SOURCE_OWN and own_len >= glen


@settings(max_examples=100, deadline=None)
@given(prompts, chunked, responses, joins, st.integers(1, 4))
@example(prompt=[], chunks=CI_CHUNKS, responses=[[0, 0]], joins=[True], k=3)
@example(prompt=OVERFLOW_PROMPT, chunks=[[2, 2, 1]], responses=[], joins=[], k=1)
def test_a_step_does_not_depend_on_when_the_own_arena_grows(prompt, chunks, responses, joins, k):
    """Same tokens, same group: a tiny own arena (grows inside multi-token steps) drafts exactly as a
    roomy one (never grows) after every step: same draft, source, match and group match state."""
    group = SuffixAutomaton(capacity=1)
    tiny, roomy = SuffixAutomaton(capacity=1), SuffixAutomaton(capacity=4096)
    tiny.append(prompt)
    roomy.append(prompt)
    ctl_tiny, ctl_roomy = new_ctl(k, group=True), new_ctl(k, group=True)
    out_tiny, out_roomy = np.empty(k, np.int32), np.empty(k, np.int32)
    pending = list(responses)
    grew = 0
    for i, chunk in enumerate(chunks):
        if pending and i < len(joins) and joins[i]:
            group.append([-1 - i, *pending.pop()])
        new = np.array(chunk, np.int32)
        cap = tiny.nbytes
        n_tiny = tiny.step(new, out_tiny, ctl_tiny, group)
        grew += tiny.nbytes != cap
        n_roomy = roomy.step(new, out_roomy, ctl_roomy, group)
        assert_within_arena(tiny)
        assert_within_arena(group)
        assert out_tiny[:n_tiny].tolist() == out_roomy[:n_roomy].tolist()
        assert ctl_tiny.tolist() == ctl_roomy.tolist()
    assert roomy.nbytes == SuffixAutomaton(capacity=4096).nbytes  # the reference never grew
    if len(prompt) <= 64 < len(prompt) + sum(map(len, chunks)):
        assert grew  # and the tiny one did, inside the steps


def test_bytes_per_token_and_free():
    rng = np.random.default_rng(0)
    text = rng.integers(0, 2000, 50_000)
    sam = SuffixAutomaton(capacity=64)
    for i in range(0, len(text), 7):
        sam.append(text[i : i + 7])
    assert len(sam) == len(text)
    # text 4 B + <=2 states x 20 B + ~2 edges x 16 B + hash: well under the reference's ~650 B/token
    assert sam.used_bytes / len(sam) < 150
    assert sam.bytes_per_token() < 250
    sam.free()
    assert len(sam) == 0 and sam.nbytes < 10_000
    assert list(sam.propose(3)) == []


def test_group_corpus_evicts_least_recently_used_prompts_within_its_budget():
    rng = np.random.default_rng(1)
    one = SuffixAutomaton(capacity=2 * 1000 + 2)
    one.append(rng.integers(0, 50, 1001))
    corpus = GroupCorpus(budget_bytes=int(2.5 * one.nbytes))
    keys = [prompt_key([i, i + 1]) for i in range(4)]
    corpus.add(keys[0], rng.integers(0, 50, 1000))
    corpus.add(keys[1], rng.integers(0, 50, 1000))
    assert corpus.get(keys[0]) is not None  # touch: keys[1] is now the least recently used
    corpus.add(keys[2], rng.integers(0, 50, 1000))
    assert keys[1] not in corpus and keys[0] in corpus and keys[2] in corpus
    assert corpus.nbytes <= corpus.budget_bytes and corpus.evictions == 1
    corpus.add(keys[3], rng.integers(0, 50, 10 * 1000))  # alone over budget: everything goes
    assert len(corpus) == 0 and corpus.nbytes == 0


def test_drafter_uses_finished_siblings_and_releases_memory():
    prompt = np.array([100, 101, 102], np.int32)
    sibling = np.array([5, 6, 7, 8, 9, 10, 11, 12], np.int32)
    d = SamDrafterV1(k=4, group_budget_bytes=1 << 20)
    d.start("a", prompt)
    for t in sibling:
        d.step("a", np.array([t], np.int32))
    d.drop("a")  # finished: its output joins the group corpus of this prompt
    assert d.request_bytes == 0 and d.corpus.nbytes > 0
    d.start("b", prompt)
    assert d.step("b", np.array([5, 6], np.int32)).tolist() == [7, 8, 9, 10]
    assert d.step("b", np.array([7], np.int32), max_draft=2).tolist() == [8, 9]
    assert d.step("b", np.array([8], np.int32), max_draft=0).tolist() == []  # gated: catches up only
    assert d.num_tokens("b") == 3 + 4
    d.start("c", np.array([1, 2, 3], np.int32))  # another prompt sees nothing
    assert d.step("c", np.array([5, 6], np.int32)).tolist() == []
    d.drop("b")
    d.drop("c")
    assert d.request_bytes == 0 and not d.requests


@pytest.mark.parametrize("occurrence", ["recent", "first"])
def test_a_frozen_automaton_matches_and_drafts_like_the_growing_one_and_refuses_to_grow(occurrence):
    from npu_rl.spec_decode import sam as S

    rng = np.random.default_rng(7)
    # three "responses" with their own separators; a small alphabet makes repeats, branching states
    # and states whose preferred occurrence ends a response (the end position then falls back)
    parts = [rng.integers(0, 6, 3000), [-1], rng.integers(0, 6, 2000), [-2], rng.integers(0, 3, 500), [-3]]
    text = np.concatenate(parts).astype(np.int32)
    grown, frozen = S.SuffixAutomaton(64, occurrence), S.SuffixAutomaton(64, occurrence)
    grown.append(text)
    frozen.append(text)
    frozen.freeze()
    assert frozen.nbytes < grown.nbytes / 2 and len(frozen) == len(grown) == text.shape[0]
    assert frozen.num_states == grown.num_states
    ga, gm, fa, fm = grown.arena, grown.meta, frozen.arena, frozen.meta
    # every transition on a real token is the same (state numbers are kept); separators have none
    for s in range(grown.num_states):
        for c in range(7):
            assert S._goto(fa, fm, s, c) == S._goto(ga, gm, s, c), (s, c)
        assert S._goto(fa, fm, s, -1) == -1
    # one end position per state: the preferred occurrence unless no real token follows it
    pref, other = (S.O_RECENT, S.O_FIRST) if occurrence == "recent" else (S.O_FIRST, S.O_RECENT)
    for s in range(1, grown.num_states):
        p, q, pos = ga[gm[pref] + s], ga[gm[other] + s], fa[fm[S.O_POS] + s]
        follows = p + 1 < text.shape[0] and text[p + 1] >= 0
        assert pos == (p if follows or not (q + 1 < text.shape[0] and text[q + 1] >= 0) else q), s
        n = ga[gm[S.O_LEN] + s]
        assert fa[fm[S.O_LEN] + s] == n
        assert text[pos - n + 1 : pos + 1].tolist() == text[p - n + 1 : p + 1].tolist()  # same string
    for _ in range(50):
        query = rng.integers(0, 6, 40).astype(np.int32)
        ctls = [S.new_ctl(4, 1, True) for _ in range(2)]
        for sa, ctl in zip((grown, frozen), ctls, strict=True):
            sa.advance(ctl, query)
        assert ctls[0][[S.C_GSTATE, S.C_GLEN]].tolist() == ctls[1][[S.C_GSTATE, S.C_GLEN]].tolist()
        n, p = int(ctls[1][S.C_GLEN]), frozen.match_position(ctls[1])
        assert n == 0 or text[p - n + 1 : p + 1].tolist() == query[-n:].tolist()
    with pytest.raises(RuntimeError, match="frozen"):
        frozen.append([1])
    with pytest.raises(RuntimeError, match="frozen"):  # appending through step() would corrupt memory
        frozen.step(np.array([1, 2], np.int32), np.empty(4, np.int32), S.new_ctl(4))
    assert frozen.step(np.empty(0, np.int32), np.empty(4, np.int32), S.new_ctl(4)) >= 0  # drafting still works


@pytest.mark.slow  # numba compiles twice
def test_a_change_to_sam_py_alone_recompiles_the_group_automaton(tmp_path):
    """numba's on-disk cache keys a function on its own file's content; gsam.py's compiled functions
    inline sam.py's, so an edit to sam.py alone (a git pull, a patch) must not load gsam's stale
    machine code. A copy of the package drafts from history (sam._continuation inside gsam._step),
    then sam._continuation is edited and the same script must draft differently; the unchanged
    second run must come from the cache (or the test would prove nothing)."""
    import json
    import os
    import shutil
    import subprocess
    import sys

    from npu_rl import REPO_ROOT

    shutil.copytree(REPO_ROOT / "npu_rl", tmp_path / "npu_rl", ignore=shutil.ignore_patterns("__pycache__"))
    script = tmp_path / "draft.py"
    script.write_text(
        "import json\n"
        "import numpy as np\n"
        "from npu_rl.spec_decode import gsam\n"
        "from npu_rl.spec_decode.corpus import SamDrafter\n"
        "from npu_rl.spec_decode.history import HistoryStore, LocalHistory\n"
        "store = HistoryStore(1 << 20)\n"
        "prompt = np.arange(8, dtype=np.int32)\n"
        "a = SamDrafter(4, group_budget_bytes=1 << 20, history=LocalHistory(store))\n"
        "a.start('a', prompt); a.step('a', np.arange(100, 140, dtype=np.int32)); a.finish('a'); a.tick()\n"
        "b = SamDrafter(4, group_budget_bytes=1 << 20, history=LocalHistory(store), history_build='inline')\n"
        "b.start('b', prompt); b.step('b', np.array([100, 101], np.int32)); b.tick()\n"
        "draft = b.step('b', np.array([102], np.int32)).tolist()\n"
        "print('RESULT ' + json.dumps([draft, sum(gsam._step.stats.cache_hits.values())]))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"} | {"PYTHONPATH": str(tmp_path)}

    def run():
        r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=600)
        lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
        assert r.returncode == 0 and lines, r.stderr[-3000:]
        return tuple(json.loads(lines[-1][len("RESULT ") :]))

    assert run() == ([103, 104, 105, 106], 0)  # compiled
    assert run() == ([103, 104, 105, 106], 1)  # loaded from the cache
    sam_py = tmp_path / "npu_rl" / "spec_decode" / "sam.py"
    text = sam_py.read_text()
    assert text.count("        out[n] = tok\n") == 1
    sam_py.write_text(text.replace("        out[n] = tok\n", "        out[n] = tok + 1000\n"))
    assert run() == ([1103, 1104, 1105, 1106], 0)  # recompiled with the new sam.py
