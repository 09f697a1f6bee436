"""Issue 20's SAM drafter core: the group automaton of live streams against brute-force oracles, adaptive k,
the history store's rules, the drafter's lifecycle across replicas, and the new speculative_config keys."""

from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis", reason="hypothesis is in constraints/cpu.txt: install_stack.sh --cpu")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from npu_rl.spec_decode.config import resolve  # noqa: E402
from npu_rl.spec_decode.corpus import SamDrafter, prompt_key  # noqa: E402
from npu_rl.spec_decode.gsam import S_KCUR, S_MLEN, GroupAutomaton, new_stream  # noqa: E402
from npu_rl.spec_decode.history import HistoryStore, LocalHistory  # noqa: E402
from npu_rl.spec_decode.sam import SuffixAutomaton  # noqa: E402


def oracle(texts: list[list[int]], own: int) -> tuple[int, list[list[int]]]:
    """(L, continuations): the longest suffix of ``texts[own]`` that occurs elsewhere in the group (in
    another text, or ending earlier in its own), and the tokens after each such occurrence (an own
    occurrence continues periodically, as the drafter reads past its own end)."""
    t = texts[own]
    n = len(t)
    for L in range(n, 0, -1):
        suf = t[n - L :]
        conts = []
        for i, x in enumerate(texts):
            for e in range(L - 1, n - 1 if i == own else len(x)):
                if x[e - L + 1 : e + 1] == suf:
                    c = list(x[e + 1 :])
                    if i == own:
                        period = n - 1 - e
                        while len(c) < 16:
                            c.append(c[len(c) - period])
                    conts.append(c)
        if conts:
            return L, conts
    return 0, []


# interleaved appends to up to 4 streams over a small alphabet (long shared repeats: the hard case)
moves = st.lists(
    st.tuples(st.integers(0, 3), st.lists(st.integers(0, 3), min_size=1, max_size=3)), min_size=1, max_size=60
)


@settings(max_examples=60, deadline=None)
@given(moves, st.sampled_from([1, 300]))
def test_interleaved_streams_match_the_oracle_and_draft_real_continuations(ops, reserve):
    g = GroupAutomaton(reserve_tokens=reserve)  # 1: the arena doubles inside the steps (copy path)
    streams = [new_stream(4) for _ in range(4)]
    texts: list[list[int]] = [[] for _ in range(4)]
    out = np.empty(4, np.int32)
    for i, toks in ops:
        texts[i] += toks
        n = g.step(streams[i], np.array(toks, np.int32), out, 4)
        length, conts = oracle(texts, i)
        assert streams[i][S_MLEN] == length, (texts, i)
        if n:  # a draft is the continuation of some occurrence of the match
            assert any(c[:n] == list(out[:n]) for c in conts), (texts, i, out[:n])


def test_one_stream_equals_the_issue6_automaton_through_hash_migrations():
    """A long single stream: the match length equals SuffixAutomaton's at every step, while the hash
    table grows several times by incremental migration (lookups in both tables)."""
    rng = np.random.default_rng(3)
    text = rng.integers(0, 40, 20_000).astype(np.int32)
    text[5000:9000] = text[1000:5000]  # long repeats
    g = GroupAutomaton(reserve_tokens=4096)
    ref = SuffixAutomaton(capacity=64)
    d = SamDrafter(k=3, reserve_tokens=4096)  # the drafter's inlined step and its slow path
    d.start("r", np.empty(0, np.int32))
    st_ = new_stream(3)
    out = np.empty(3, np.int32)
    for i in range(0, len(text), 7):
        chunk = text[i : i + 7]
        n = g.step(st_, chunk, out, 3)
        assert d.step("r", chunk).tolist() == out[:n].tolist()
        ref.append(chunk)
        assert st_[S_MLEN] == ref.suffix_match()[0]
    assert g.hash_grows >= 3 and g.grows >= 1
    assert d.requests["r"].group.gsam.grows == g.grows
    assert g.num_tokens == len(text)
    # one stream writes the token after a state's first end position before any edge leaves the
    # state, so every state but the root and the last holds its implicit edge, and only the other
    # transitions are hashed
    assert g.num_edges - g.num_hashed_edges == g.num_states - 2


def test_live_sibling_drafts_the_step_after_it_was_written():
    d = SamDrafter(k=4, group_budget_bytes=64 << 20)
    prompt = np.arange(100, 110, dtype=np.int32)
    d.start("a", prompt)
    d.start("b", prompt)
    d.step("a", np.array([5, 6, 7, 8, 9, 10], np.int32))  # a runs ahead
    assert d.step("b", np.array([5, 6], np.int32)).tolist() == [7, 8, 9, 10]
    assert d.step("b", np.array([7], np.int32), max_draft=2).tolist() == [8, 9]
    assert d.step("b", np.array([8], np.int32), max_draft=0).tolist() == []  # gated: catches up only
    d.start("c", np.array([1, 2, 3], np.int32))  # another prompt sees nothing of a's
    assert d.step("c", np.array([5, 6], np.int32)).tolist() == []
    assert len(d.groups) == 2


def test_a_request_resumed_as_prompt_plus_output_rejoins_its_group():
    # verl's partial rollout re-sends a request aborted at a weight sync with the same id and
    # prompt + tokens so far as its prompt (llm_server.py generate): it must still see its siblings.
    d = SamDrafter(k=4, group_budget_bytes=64 << 20)
    prompt = np.arange(100, 110, dtype=np.int32)
    out = np.arange(200, 240, dtype=np.int32)  # no repeats: only a sibling can draft it
    d.start("a", prompt)
    d.start("b", prompt)
    d.step("a", out)  # sibling a wrote the whole response
    d.step("b", out[:10])
    d.drop("b")  # aborted at the weight sync
    d.start("b", np.concatenate([prompt, out[:10]]))  # resumed: vLLM counts it all as prompt
    assert len(d.groups) == 1 and d.resumed == 1
    assert d.step("b", out[10:12]).tolist() == out[12:16].tolist()
    # A prompt that only shares a prefix of another group's prompt (not the whole of it) is new.
    d.start("c", np.concatenate([prompt[:5], out[:10]]))
    assert len(d.groups) == 2 and d.resumed == 1
    assert d.step("c", out[10:12]).tolist() == []


def test_a_resumed_request_joins_the_longest_cached_prompt_prefix():
    # Cached groups at several prompt lengths that are all prefixes of the resumed prompt: the longest wins,
    # and the incremental digests equal prompt_key's.
    d = SamDrafter(k=3, group_budget_bytes=64 << 20)
    prompt = np.arange(100, 120, dtype=np.int32)
    out = np.arange(200, 230, dtype=np.int32)
    d.start("a", prompt)
    d.step("a", out)
    for n in (9, 4):  # longest first: a new prompt with a shorter cached prompt as its prefix would join it
        d.start(f"short{n}", prompt[:n])
        d.drop(f"short{n}")
    assert sorted(d._prompt_lens) == [4, 9, 20] and d.resumed == 0
    d.start("b", np.concatenate([prompt, out[:8]]))
    assert d.requests["b"].key == prompt_key(prompt) and d.resumed == 1
    assert d.step("b", out[8:10]).tolist() == out[10:13].tolist()


def test_adaptive_k_grows_on_full_acceptance_and_halves_on_a_miss():
    d = SamDrafter(k=6, group_budget_bytes=64 << 20, adaptive_k=True)
    period = np.array([1, 2, 3, 4, 5, 6, 7], np.int32)
    d.start("r", np.concatenate([period, period]))
    st_ = d.requests["r"].st
    st_[S_KCUR] = 2  # start low to watch it grow
    draft = d.step("r", period[:1])
    seen = []
    pos = 1
    for _ in range(5):  # the text keeps repeating: every draft is accepted
        nxt = np.concatenate([draft, [period[(pos + len(draft)) % 7]]]).astype(np.int32)
        pos += len(nxt)
        draft = d.step("r", nxt)
        seen.append(d.k_of("r"))
    assert seen == [3, 4, 5, 6, 6]  # +1 per fully accepted draft, capped at k
    assert d.counters("r")["accepted"] == d.counters("r")["drafted"] - len(draft)
    d.step("r", np.array([99], np.int32))  # a miss on the first draft token
    assert d.k_of("r") == 3
    d.step("r", np.array([98], np.int32))  # no draft was proposed (no match): k unchanged
    assert d.k_of("r") == 3


def test_history_store_rules():
    s = HistoryStore(budget_bytes=9_000, max_responses=3)
    k1, k2 = prompt_key([1]), prompt_key([2])
    s.add(k1, [1] * 100, reward=1.0)
    s.add(k1, [2] * 100, reward=0.0)
    s.add(k1, [3] * 100, reward=1.0)
    s.add(k1, [3] * 100, reward=1.0)  # the same response again (another TP rank): kept once
    assert s.stats()["responses"] == 3
    s.add(k1, [4] * 100, reward=0.5)  # over max_responses: the weakest (reward 0) goes
    got = s.get(k1)
    assert [int(x[0]) for x in got] == [4, 1, 3]  # weakest first, best (highest reward, newest) last
    assert s.replaced_responses == 1
    s.add(k2, [5] * 1000)
    s.add(k2, [6] * 1000)  # over the byte cap: the least recently used prompt (k1) goes whole
    assert k1 not in s and k2 in s and s.nbytes <= s.budget_bytes and s.evicted_prompts == 1
    s2 = HistoryStore(1 << 20, reward_weighted=False, max_tokens_per_prompt=150)
    s2.add(k1, [1] * 100, reward=9.0)
    s2.add(k1, [2] * 100, reward=0.0)
    got = s2.get(k1)  # age alone ranks: the newest whole, the older one cut to the 150-token cap
    assert [int(x[0]) for x in got] == [1, 2] and [len(x) for x in got] == [50, 100]
    with pytest.raises(ValueError, match="max_responses"):
        HistoryStore(1, max_responses=0)


def _recounted(s: HistoryStore) -> int:
    from npu_rl.spec_decode.history import RESPONSE_OVERHEAD

    return sum(r[2].nbytes + RESPONSE_OVERHEAD for e in s._prompts.values() for r in e.responses)


def test_rewards_that_arrive_after_the_responses_rank_a_whole_group():
    """A group of 32 (n > max_responses) stored unrated by the engine, then rated by the trainer: all 32
    wait for their rewards, and the 16 best rated stay (without await_rewards, age alone would have
    kept the newest 16 before any reward existed)."""
    from npu_rl.spec_decode.history import rating

    prompt = [7, 8, 9]
    key = prompt_key(prompt)
    responses = [[i] * 10 for i in range(32)]
    rewards = [1.0 if i % 4 == 0 else 0.0 for i in range(32)]  # 8 right answers, among the oldest too
    s = HistoryStore(1 << 20, max_responses=16, await_rewards=True)
    age_only = HistoryStore(1 << 20, max_responses=16)
    for r in responses:
        s.add(key, r)
        age_only.add(key, r)
    assert s.stats()["unrated"] == 32 and s.stats()["responses"] == 32
    assert age_only.stats()["responses"] == 16 and {int(x[0]) for x in age_only.get(key)} == set(range(16, 32))
    s.rate_many([rating(prompt, r, w) for r, w in zip(responses, rewards, strict=True)])
    got = [int(x[0]) for x in s.get(key)]
    assert s.stats()["unrated"] == 0 and len(got) == 16
    assert set(got[-8:]) == {0, 4, 8, 12, 16, 20, 24, 28}  # the right ones last (drafts continue them)
    assert s.stats()["ratings"] == s.stats()["rated"] == 32 and s.nbytes == _recounted(s)


def test_a_rating_finds_the_engines_longer_copy_and_cuts_it_to_the_response():
    """The engine's copy of a response can run past its end (vLLM samples the last forward's drafts past
    a stop): the rating names the response as the trainer saw it, matches the copy it begins, and cuts it."""
    from npu_rl.spec_decode.history import rating

    key = prompt_key([1])
    s = HistoryStore(1 << 20, await_rewards=True)
    s.add(key, [5, 6, 7, 8, 2, 9, 9])  # response 5 6 7 8 2, then 2 drafted tokens past the stop
    s.add(key, [5, 6, 7, 3])
    s.rate_many([rating([1], [5, 6, 7, 8, 2], 1.0), rating([1], [5, 6, 7, 3], 0.0)])
    assert [x.tolist() for x in s.get(key)] == [[5, 6, 7, 3], [5, 6, 7, 8, 2]]
    assert s.stats()["rated"] == 2 and s.nbytes == _recounted(s)
    s.add(key, [5, 6, 7, 8, 2])  # the same response again: one copy, its reward kept
    assert s.stats()["responses"] == 2 and s.get(key)[-1].tolist() == [5, 6, 7, 8, 2]


def test_a_rating_that_arrives_before_its_response_waits_for_it(monkeypatch):
    from npu_rl.spec_decode import history
    from npu_rl.spec_decode.history import rating

    k1, k2, k3 = prompt_key([1]), prompt_key([2]), prompt_key([3])
    s = HistoryStore(1 << 20, await_rewards=True)
    s.rate_many([rating([1], [4, 4], 1.0)])  # the engine has not sent it yet
    assert s.stats()["ratings_waiting"] == 1 and s.stats()["rated"] == 0
    s.add(k1, [3, 3])
    s.add(k1, [4, 4, 4])  # arrives (with one token past its end)
    assert s.stats()["ratings_waiting"] == 0 and s.stats()["rated"] == 1
    assert [x.tolist() for x in s.get(k1)] == [[3, 3], [4, 4]]
    monkeypatch.setattr(history, "MAX_EARLY", 2)
    s.rate_many([rating([2], [1], 1.0), rating([3], [1], 1.0), rating([3], [2], 1.0)])
    assert s.stats()["ratings_waiting"] == 2 and s.stats()["ratings_dropped"] == 1  # the oldest prompt's went
    s.add(k2, [1])
    s.add(k3, [2])
    assert s.stats()["rated"] == 2


def test_unrated_responses_are_capped_per_prompt_oldest_first():
    key = prompt_key([1])
    s = HistoryStore(1 << 20, max_responses=2, await_rewards=True, max_unrated=3)
    for i in range(5):
        s.add(key, [i + 1] * 4)
    assert {int(x[0]) for x in s.get(key)} == {3, 4, 5} and s.replaced_responses == 2
    with pytest.raises(ValueError, match="max_unrated"):
        HistoryStore(1, max_unrated=0)


def test_a_rating_hashes_only_its_own_prompts_responses(monkeypatch):
    """Cost at the scale of a whole dataset of history: with 17,000 prompts cached, rating a step's
    1,024 responses hashes at most the responses of their own prompts (counted, not timed)."""
    from npu_rl.spec_decode import history
    from npu_rl.spec_decode.history import rating

    s = HistoryStore(1 << 30, max_responses=4, await_rewards=True)
    for p in range(17_000):
        for j in range(4):
            s.add(prompt_key([p]), [p % 97, j, 1])
    step = [rating([p], [p % 97, j, 1], 1.0) for p in range(256) for j in range(4)]
    prefix = rating([5], [5, 0], 0.5)
    calls = []
    real = history.response_digest
    monkeypatch.setattr(history, "response_digest", lambda t: calls.append(1) or real(t))
    s.rate_many(step)
    assert s.stats()["rated"] == 1024 and calls == []  # exact lengths: the stored digests answer
    s.rate_many([prefix])  # a prefix: hashes at most that prompt's 4 responses
    assert len(calls) <= 4


@pytest.mark.parametrize("build", ["inline", "thread"])
def test_history_reaches_another_replica_through_the_store_built_off_the_live_automaton(build):
    store = HistoryStore(64 << 20)
    prompt = np.arange(200, 220, dtype=np.int32)
    earlier = np.arange(1000, 1600, dtype=np.int32) % 97 + 500  # round t-1's response
    r1 = SamDrafter(k=4, group_budget_bytes=64 << 20, history=LocalHistory(store))
    r1.start("x", prompt)
    r1.step("x", earlier)
    r1.finish("x", reward=1.0)
    assert store.stats()["responses"] == 1
    r2 = SamDrafter(k=4, group_budget_bytes=64 << 20, history=LocalHistory(store), history_build=build)
    r2.start("y", prompt)
    live = r2.groups[prompt_key(prompt)].gsam
    assert r2.step("y", earlier[:3]).tolist() == []  # no history yet
    attached = r2.tick()
    r2.wait_history()
    attached += r2.tick()
    assert attached == earlier.shape[0] + 1  # the response and its separator, in the history automaton
    assert live.num_tokens == prompt.shape[0] + 3  # nothing inserted into the live automaton
    # the running stream matched its recent output when the history arrived: it drafts right away
    assert r2.step("y", earlier[3:5]).tolist() == earlier[5:9].tolist()
    r2.start("z", prompt)  # a stream started after the history arrived drafts from it too
    assert r2.step("z", earlier[:40]).tolist() == earlier[40:44].tolist()
    assert r2.stats()["history_bytes"] > 0
    r2.drop("y")  # dropped (aborted): not sent to the store
    assert store.stats()["responses"] == 1
    with pytest.raises(ValueError, match="group_budget_bytes > 0"):
        SamDrafter(k=4, history=LocalHistory(store))
    with pytest.raises(ValueError, match="history_build"):
        SamDrafter(k=4, group_budget_bytes=1 << 20, history=LocalHistory(store), history_build="later")


def test_the_longer_match_drafts_history_or_group_ties_to_the_group():
    store = HistoryStore(64 << 20)
    hist = np.array([100, 101, 102, 103, 104, 105, 106, 107], np.int32)
    p1, p2 = np.arange(10, dtype=np.int32), np.arange(10, 20, dtype=np.int32)
    store.add(prompt_key(p1), hist)
    store.add(prompt_key(p2), hist)
    # a generous build budget per tick: with the default 0.5 ms a loaded machine defers the second build
    d = SamDrafter(
        k=3, group_budget_bytes=64 << 20, history=LocalHistory(store), history_ms_per_step=1e3, history_build="inline"
    )
    d.start("tie", p1)
    d.start("longer", p2)
    d.tick()  # both groups get their history automaton
    # "101 102" occurs earlier in the stream (then 200) and in the history (then 103): a tie, the group drafts
    assert d.step("tie", np.array([101, 102, 200, 101, 102], np.int32)).tolist() == [200, 101, 102]
    # "100 101 102" occurs only in the history, "101 102" in the stream (then 300): the history drafts
    assert d.step("longer", np.array([101, 102, 300, 100, 101, 102], np.int32)).tolist() == [103, 104, 105]
    assert d.counters("longer")["match"] == 2  # the group match, which lost


def test_each_tick_builds_at_least_one_history_when_the_lookup_ate_the_budget():
    """The per-tick build budget bounds the time on the engine's step, but a tick whose lookup alone
    took longer than the budget (a loaded host) still builds one answer: the history always arrives."""
    store = HistoryStore(64 << 20)
    hist = np.arange(100, 108, dtype=np.int32)
    prompts = [np.arange(i * 10, i * 10 + 10, dtype=np.int32) for i in range(3)]
    for p in prompts:
        store.add(prompt_key(p), hist)
    d = SamDrafter(
        k=3, group_budget_bytes=64 << 20, history=LocalHistory(store), history_ms_per_step=1e-9, history_build="inline"
    )
    for i, p in enumerate(prompts):
        d.start(f"r{i}", p)
    attached = [d.tick() for _ in range(4)]
    assert attached == [len(hist) + 1] * 3 + [0]  # one group per tick (the response and its separator)


def test_a_group_cached_from_an_earlier_round_gets_what_another_replica_added_since():
    # round 1: replica A and replica B both serve the prompt; round 2: A serves it again. A's group is
    # still cached (it holds A's own response); B's response reaches it through the store, A's own
    # response is not inserted a second time, not even the opening the store's cap cuts it to.
    store = HistoryStore(64 << 20, max_tokens_per_prompt=350)
    prompt = np.arange(200, 220, dtype=np.int32)
    mine = np.arange(1000, 1400, dtype=np.int32) % 89 + 500  # A's round-1 response
    theirs = np.arange(2000, 2300, dtype=np.int32) % 83 + 5000  # B's round-1 response: other tokens
    a = SamDrafter(k=4, group_budget_bytes=64 << 20, history=LocalHistory(store), history_ms_per_step=1e3)
    b = SamDrafter(k=4, group_budget_bytes=64 << 20, history=LocalHistory(store), history_ms_per_step=1e3)
    a.start("a1", prompt)
    b.start("b1", prompt)
    a.tick(), b.tick()  # round 1's lookups: the store is empty
    a.step("a1", mine)
    a.finish("a1", reward=1.0)
    b.step("b1", theirs)
    b.finish("b1", reward=1.0)
    assert store.stats()["responses"] == 2
    assert [t.shape[0] for t in store.get(prompt_key(prompt))] == [50, 300]  # A's cut, B's (newest) whole
    group = a.groups[prompt_key(prompt)].gsam
    before = group.num_tokens
    a.start("a2", prompt)
    assert a.step("a2", theirs[:3]).tolist() == []  # B's text is not in A's cached group yet
    attached = a.tick()
    a.wait_history()
    attached += a.tick()
    assert attached == theirs.shape[0] + 1  # only B's response (and its separator): A's own is in the group
    assert group.num_tokens == before + prompt.shape[0] + 3  # history stays out of the live automaton
    assert a.step("a2", theirs[3:5]).tolist() == theirs[5:9].tolist()


def test_history_lookups_and_answers_are_bounded_per_tick():
    from npu_rl.spec_decode.corpus import HISTORY_KEYS_PER_LOOKUP

    store = HistoryStore(64 << 20)
    prompts = [np.arange(i * 50, i * 50 + 20, dtype=np.int32) for i in range(3 * HISTORY_KEYS_PER_LOOKUP + 5)]
    for p in prompts:
        store.add(prompt_key(p), np.arange(300, 340, dtype=np.int32))
    d = SamDrafter(
        k=4, group_budget_bytes=256 << 20, history=LocalHistory(store), history_ms_per_step=1e3, history_build="inline"
    )
    for i, p in enumerate(prompts):
        d.start(f"r{i}", p)
    for t in range(4):
        d.tick()
        assert d.history_lookups == t + 1  # one lookup per tick, of at most HISTORY_KEYS_PER_LOOKUP prompts
        assert sum(not g.waiting for g in d.groups.values()) == min(len(prompts), (t + 1) * HISTORY_KEYS_PER_LOOKUP)
    assert d.stats()["history_tokens_built"] == 41 * len(prompts)  # 40 tokens and a separator each


def test_idle_groups_are_evicted_within_the_budget_running_ones_never():
    d = SamDrafter(k=2, group_budget_bytes=1)  # everything is over budget
    d.start("a", np.arange(50, dtype=np.int32))
    d.start("b", np.arange(50, 90, dtype=np.int32))
    assert len(d.groups) == 2  # running: kept
    d.finish("a")
    assert len(d.groups) == 1 and d.evictions == 1
    private = SamDrafter(k=2)  # no group corpus: one private automaton per request, freed at finish
    private.start("a", np.arange(10, dtype=np.int32))
    private.start("b", np.arange(10, dtype=np.int32))
    assert len(private.groups) == 2
    private.finish("a")
    private.finish("b")
    assert not private.groups and private.nbytes == 0


class _CountingGroups(dict):
    """``SamDrafter.groups`` that counts the walks over it (items/values/keys/iteration)."""

    walks = 0

    def _walk(self, it):
        _CountingGroups.walks += 1
        return it

    def items(self):
        return self._walk(super().items())

    def values(self):
        return self._walk(super().values())

    def keys(self):
        return self._walk(super().keys())

    def __iter__(self):
        return self._walk(super().__iter__())

    def move_to_end(self, key):  # the OrderedDict call SamDrafter.start makes
        self[key] = self.pop(key)


def _cost_of_a_round(cached: int, full: bool, history: bool, monkeypatch) -> tuple[int, int]:
    """(group size reads, walks over the groups) of 50 requests started, drafted and finished on new
    prompts, with ``cached`` idle groups already in the drafter; ``full``: the budget is exactly what is
    cached, so every new group evicts an old one."""
    from npu_rl.spec_decode import corpus

    reads = [0]
    size = corpus._Group.nbytes.fget
    monkeypatch.setattr(corpus._Group, "nbytes", property(lambda g: (reads.__setitem__(0, reads[0] + 1), size(g))[1]))
    rng = np.random.default_rng(0)
    d = SamDrafter(k=3, group_budget_bytes=1 << 40, history=LocalHistory(HistoryStore(1 << 30)) if history else None)
    d.groups = _CountingGroups(d.groups)
    prompts = rng.integers(0, 1000, (cached + 50, 12), dtype=np.int32)
    for i, p in enumerate(prompts[:cached]):
        d.start(f"old{i}", p)
        d.step(f"old{i}", rng.integers(0, 1000, 8, dtype=np.int32))
        d.finish(f"old{i}")
    d.tick()
    d.wait_history()
    d.tick()
    if full:
        d.budget_bytes = d._counted
    assert len(d.groups) == cached
    reads[0] = _CountingGroups.walks = 0
    for i, p in enumerate(prompts[cached:]):
        d.start(f"new{i}", p)
        d.step(f"new{i}", rng.integers(0, 1000, 8, dtype=np.int32))
        d.finish(f"new{i}")
        d.tick()
    assert d.evictions >= 50 if full else d.evictions == 0
    return reads[0], _CountingGroups.walks


@pytest.mark.parametrize("history", [False, True], ids=["corpus", "corpus+history"])
@pytest.mark.parametrize("full", [False, True], ids=["room", "full"])
def test_the_drafters_cost_per_request_does_not_grow_with_the_groups_cached(full, history, monkeypatch):
    """Issue 39: start, drop and tick each summed every cached group's bytes (and a full cache walked
    them all to evict), so each call was linear in the number of prompts cached: 7.7-8.3x SAM's cost at
    1,319 prompts per engine. Counted, not timed: the group size reads and the walks over the groups of
    one round of 50 requests are the same with 40 and with 2,000 groups cached."""
    small = _cost_of_a_round(40, full, history, monkeypatch)
    large = _cost_of_a_round(2000, full, history, monkeypatch)
    assert large == small, f"40 groups cached: {small}; 2,000: {large} (size reads, walks)"
    assert small[1] == 0 and small[0] <= 50 * 3  # a few reads per request, no walk


def test_new_keys_are_validated():
    s = resolve(3, None, 64, None, True, 128, env={})
    assert s.adaptive_k and s.history_bytes == 128 << 20
    assert resolve(3, None, None, None, "false", None, env={}).adaptive_k is False
    with pytest.raises(ValueError, match="sam_adaptive_k"):
        resolve(3, None, None, None, "sometimes", None, env={})
    with pytest.raises(ValueError, match="sam_history_mb=-1"):
        resolve(3, None, None, None, None, -1, env={})
    with pytest.raises(ValueError, match="needs the group corpus"):
        resolve(3, None, 0, None, None, 64, env={})
    assert resolve(3, None, None, None, None, 64, "exp-7", env={}).history_scope == "exp-7"
    for bad in (7, "", "x" * 129):
        with pytest.raises(ValueError, match=f"sam_history_scope={bad!r} must be a non-empty string"):
            resolve(3, None, None, None, None, 64, bad, env={})


def test_the_proposer_keeps_unscheduled_requests_and_finishes_finished_ones(no_ray):
    """With the runner at hand (the NPU runner passes it), a request that leaves the batch but stays
    in ``runner.requests`` (preempted or not scheduled: vLLM keeps its state) keeps its stream and
    continues without a rebuild; one the runner dropped (finished) is finished and sent to history."""
    pytest.importorskip("vllm")
    from types import SimpleNamespace

    from npu_rl.spec_decode.vllm_proposer import AscendSamProposer
    from tests.test_spec_decode_vllm_on_cpu import add, bookkeep, new_batch, remove, vllm_config

    runner = SimpleNamespace(input_batch=new_batch(), requests={})
    proposer = AscendSamProposer(vllm_config(sam_batch_size_threshold="always", sam_history_mb=16), runner)
    batch, d = runner.input_batch, proposer.drafter
    runner.requests["a"] = object()
    add(batch, "a", [1, 2, 3])
    for tok in [40, 41, 42, 43]:
        bookkeep(batch, [[tok]])
        proposer.propose([[tok]])
    stream = d.requests["a"].st
    remove(batch, "a")  # unscheduled this step, still in runner.requests
    proposer.propose([])
    assert "a" in d and d.history.store.stats()["responses"] == 0
    add(batch, "a", [1, 2, 3], output=[40, 41, 42, 43])  # scheduled again: continues the same stream
    bookkeep(batch, [[44]])
    proposer.propose([[44]])
    assert d.requests["a"].st is stream and d.num_tokens("a") == 8
    remove(batch, "a")
    del runner.requests["a"]  # finished: vLLM popped it
    proposer.propose([])
    assert "a" not in d
    assert d.history.store.get(next(iter(d.groups)))[0].tolist() == [40, 41, 42, 43, 44]


def test_the_proposer_picks_its_history_store_and_says_why(no_ray, monkeypatch, capsys):
    """verl runs vLLM with the mp executor: the drafter lives in processes vLLM spawned, where Ray is not
    initialized. Without RAY_ADDRESS it keeps an in-process store and warns; under external_launcher
    (every rank schedules from its own drafts) history is off, with a warning."""
    from types import SimpleNamespace

    from vllm.config import ParallelConfig

    from npu_rl.spec_decode.vllm_proposer import SamProposer
    from tests.test_spec_decode_vllm_on_cpu import vllm_config

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    p = SamProposer(vllm_config(sam_history_mb=16))
    assert p.drafter.history.where.startswith("in-process")
    err = capsys.readouterr().err
    assert "[npu-rl] warning: SAM history: this process is not connected to Ray and RAY_ADDRESS is not set" in err
    assert "[npu-rl] SAM history corpus: in-process (this engine only), 16 MiB" in err
    cfg = vllm_config(sam_history_mb=16)
    launcher = SimpleNamespace(
        **vars(cfg), parallel_config=ParallelConfig(distributed_executor_backend="external_launcher")
    )
    assert SamProposer(launcher).drafter.history is None
    assert "[npu-rl] warning: SAM history is off (sam_history_mb=16)" in capsys.readouterr().err
    assert "SAM drafter: 0 steps" in p.stats_line() and "history: 0 lookups" in p.stats_line()


@pytest.fixture(scope="module")
def local_ray():
    """One private local Ray instance for this module's Ray tests (a second start in the same process
    can outlast Ray's wait for its GCS port on a loaded machine)."""
    import os

    ray = pytest.importorskip("ray")
    before = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"  # a spawned process connects without the launcher's token setup
    try:
        ctx = ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
        yield ray, ctx
    finally:
        ray.shutdown()
        if before is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = before


def test_history_through_the_ray_actor_reaches_another_replica(local_ray):
    """Two drafters (replicas) share one named Ray actor store: the first one's finished output is
    drafted by the second, and no tick waits for the actor (lookups are polled)."""

    from npu_rl.spec_decode.history import RayHistory

    ray, _ = local_ray
    prompt = np.arange(300, 320, dtype=np.int32)
    earlier = (np.arange(800) % 89 + 600).astype(np.int32)
    r1 = SamDrafter(k=4, group_budget_bytes=64 << 20, history=RayHistory(64 << 20))
    r1.start("x", prompt)
    r1.step("x", earlier)
    r1.finish("x", reward=1.0)
    r1.tick()  # flushes the output to the actor
    r2 = SamDrafter(k=4, group_budget_bytes=64 << 20, history=RayHistory(1))  # same actor, by name
    assert r2.history.actor._actor_id == r1.history.actor._actor_id
    assert r2.history.stats()["responses"] == 1
    r2.start("y", prompt)
    r2.step("y", earlier[:3])
    deadline = time.monotonic() + 60
    while r2.stats()["history_tokens_built"] < len(earlier) + 1 and time.monotonic() < deadline:
        r2.tick()  # polls the actor's answer, then the builder thread
        time.sleep(0.001)
    assert r2.step("y", earlier[3:5]).tolist() == earlier[5:9].tolist()
    ray.kill(r1.history.actor)


def test_a_spawned_engine_process_reaches_the_cluster_store_through_ray_address(tmp_path, local_ray):
    """A process with Ray not initialized and RAY_ADDRESS set (what vLLM's workers inherit from verl's
    server actor under the launcher) connects and uses the named actor."""
    import json
    import os
    import subprocess
    import sys

    from npu_rl import REPO_ROOT

    ray, ctx = local_ray
    script = tmp_path / "engine.py"
    script.write_text(
        "import json\n"
        "from tests.test_spec_decode_vllm_on_cpu import vllm_config\n"
        "from npu_rl.spec_decode.vllm_proposer import SamProposer\n"
        "p = SamProposer(vllm_config(sam_history_mb=16))\n"
        "p.drafter.history.add(b'k' * 16, [1, 2, 3], 1.0)\n"
        "p.drafter.history.flush()\n"
        "print('RESULT ' + json.dumps([p.drafter.history.where, p.drafter.history.stats()['responses']]))\n"
    )
    env = {
        **os.environ,
        "RAY_ADDRESS": ctx.address_info["gcs_address"],
        "RAY_AUTH_MODE": "disabled",
        "PYTHONPATH": str(REPO_ROOT),
    }
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    assert r.returncode == 0 and lines, r.stderr[-3000:]
    where, responses = json.loads(lines[-1][len("RESULT ") :])
    assert where.startswith("Ray actor npu_rl/npu_rl_sam_history.") and responses == 1
    from npu_rl.spec_decode.history import ACTOR_NAMESPACE

    # the store was the engine's own (not detached): it ended with the process, as a job's store must
    # on a long-lived cluster (the next job would otherwise inherit its history, settings and memory)
    name = where.split()[2].split("/", 1)[1]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            ray.get_actor(name, namespace=ACTOR_NAMESPACE)
        except ValueError:
            break
        time.sleep(0.5)
    else:
        pytest.fail(f"the history actor {name} outlived the engine process that created it")


def test_a_dead_history_actor_is_replaced_and_no_tick_raises(local_ray, capsys):
    """The actor's owner (another engine) ends first: the drafter's next calls notice it, say so once,
    and go on with a new store by the same name; the lookup in flight answers "no history", and the
    response sent to the dead store reaches the new one."""
    from npu_rl.spec_decode.history import ACTOR_NAMESPACE, RayHistory

    ray, _ = local_ray
    d = SamDrafter(k=4, group_budget_bytes=64 << 20, history=RayHistory(64 << 20, scope="dies"))
    first = d.history.actor
    d.start("x", np.arange(300, 320, dtype=np.int32))
    d.step("x", np.arange(5, dtype=np.int32))
    ray.kill(first)
    with pytest.raises(ray.exceptions.RayActorError):  # dead before anything is sent to it
        ray.get(first.stats.remote(), timeout=60)
    d.finish("x", reward=1.0)
    d.start("y", np.arange(400, 420, dtype=np.int32))
    deadline = time.monotonic() + 60
    while (d.history.restarts == 0 or d.history._pending) and time.monotonic() < deadline:
        d.tick()  # sends x's output to the dead actor, polls y's lookup from it, then re-sends x's output
        time.sleep(0.01)
    assert d.history.restarts == 1
    assert "warning: SAM history store npu_rl/npu_rl_sam_history.dies: died" in capsys.readouterr().err
    assert d.history.actor._actor_id != first._actor_id
    live = ray.get_actor("npu_rl_sam_history.dies", namespace=ACTOR_NAMESPACE)
    assert live._actor_id == d.history.actor._actor_id
    stats = d.history.stats()
    assert (stats["responses"], stats["restarts"], stats["lost_responses"]) == (1, 1, 0)  # x's output, re-sent
    d.history.add(b"k" * 16, [1, 2, 3], 1.0)
    assert d.history.stats()["responses"] == 2  # the new store takes responses
    ray.kill(live)


def test_history_call_failures_are_sorted_by_what_ray_says(local_ray, capsys):
    """Which failures of a call to the store are worth trying again: an unreachable actor (no
    restart), a dead one (replaced once, whichever call notices first); a task that raised is not."""
    from ray import exceptions as exc

    from npu_rl.spec_decode.history import RayHistory

    ray, _ = local_ray
    h = RayHistory(1 << 20, scope="sorts")
    first = h.actor
    assert h._failed(exc.ActorUnavailableError("node unreachable", None), first)
    assert (h.restarts, h.unavailable, h.actor) == (0, 1, first)
    assert not h._failed(exc.OutOfMemoryError("task killed"), first)
    assert (h.restarts, h.actor) == (0, first)
    ray.kill(first)
    assert h._failed(exc.ActorDiedError(), first)
    assert h.restarts == 1 and h.actor is not first
    assert h._failed(exc.ActorDiedError(), first)  # a second call to the same dead actor: no second restart
    assert h.restarts == 1
    err = capsys.readouterr().err
    assert err.count("sorts: unreachable (") == 1 and err.count(": died (ActorDiedError)") == 1
    ray.kill(h.actor)


def test_the_history_actor_name_is_scoped_to_the_model_and_budget():
    """Engines of one job (same model, same sam_history_mb) share the store; another model's job on
    the same cluster, or other history settings, get their own."""
    from types import SimpleNamespace

    from npu_rl.spec_decode.config import SamSettings
    from npu_rl.spec_decode.vllm_proposer import _history_scope

    def cfg(model):
        return SimpleNamespace(model_config=SimpleNamespace(model=model))

    s16, s32 = (
        SamSettings(k=4, max_batch=32, group_corpus_bytes=1 << 28, min_match=1, history_bytes=mb << 20)
        for mb in (16, 32)
    )
    a = _history_scope(s16, cfg("/models/Qwen3-32B"))
    assert a == _history_scope(s16, cfg("/models/Qwen3-32B"))
    assert (
        len({a, _history_scope(s16, cfg("/models/Qwen3-30B-A3B")), _history_scope(s32, cfg("/models/Qwen3-32B"))}) == 3
    )


def _config_built_in_a_task(**spec):
    """What verl's rollout server does, in a Ray process of the calling job: build the engine's
    SpeculativeConfig (the patched vLLM's); it comes back pickled, as it reaches vLLM's workers."""
    from vllm.config import SpeculativeConfig

    return SpeculativeConfig(method="sam", num_speculative_tokens=3, **spec)


class _RolloutServer:
    """A Ray actor of the job, as verl's rollout server is: one process imports vLLM once and builds
    every engine config of this test (a task per config started a worker, and an import of vLLM, for
    each; one CI run on a loaded machine spent 284 s there)."""

    def build(self, **spec):
        return _config_built_in_a_task(**spec)


def test_each_ray_job_gets_its_own_history_store(local_ray):
    """Two concurrent jobs of one model and history budget on one Ray cluster: each engine config is
    built in a Ray process of its job, which names the job there (vLLM's workers, spawned outside
    Ray, cannot tell it), so the two keep apart stores. A scope the user sets is kept as it is: two
    jobs that set the same one share. Outside Ray nothing is named (the model and budget still are)."""
    import json
    import os
    import subprocess
    import sys

    from npu_rl import REPO_ROOT
    from npu_rl.spec_decode.config import from_speculative_config
    from npu_rl.spec_decode.vllm_proposer import _history_scope

    ray, ctx = local_ray
    server = ray.remote(num_cpus=0)(_RolloutServer).remote()
    try:
        spec, shared, off, again = ray.get(
            [
                server.build.remote(sam_history_mb=16),
                server.build.remote(sam_history_mb=16, sam_history_scope="shared"),
                server.build.remote(),  # history off: nothing to scope
                server.build.remote(sam_history_mb=16),  # another engine of this job
            ],
            timeout=300,
        )
    finally:
        ray.kill(server)
    job = ray.get_runtime_context().get_job_id()
    assert spec.sam_history_scope == f"ray-job-{job}"
    assert shared.sam_history_scope == "shared"
    assert off.sam_history_scope is None
    other = subprocess.run(  # a second job: another driver on the same cluster, a Ray process of its job
        [
            sys.executable,
            "-c",
            "import json, ray\n"
            "from tests.test_spec_decode_history_on_cpu import _config_built_in_a_task\n"
            "ray.init(address='auto', log_to_driver=False)\n"
            "spec = _config_built_in_a_task(sam_history_mb=16)\n"
            "print('RESULT ' + json.dumps([ray.get_runtime_context().get_job_id(), spec.sam_history_scope]))\n",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={
            **os.environ,
            "RAY_ADDRESS": ctx.address_info["gcs_address"],
            "RAY_AUTH_MODE": "disabled",
            "PYTHONPATH": str(REPO_ROOT),
        },
    )
    lines = [ln for ln in other.stdout.splitlines() if ln.startswith("RESULT ")]
    assert other.returncode == 0 and lines, other.stderr[-3000:]
    other_job, other_scope = json.loads(lines[-1][len("RESULT ") :])
    assert other_job != job and other_scope == f"ray-job-{other_job}"
    model = SimpleNamespace(model_config=SimpleNamespace(model="/models/Qwen3-32B"))
    ours = _history_scope(from_speculative_config(spec), model)
    assert _history_scope(from_speculative_config(again), model) == ours
    spec.sam_history_scope = other_scope
    assert _history_scope(from_speculative_config(spec), model) != ours
    outside = subprocess.run(  # no Ray initialized where the config is built (Ray imported or not)
        [sys.executable, "-c", "import ray\nfrom npu_rl.spec_decode import config\nprint(config.ray_job_scope())"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert outside.stdout.strip() == "None", outside.stderr[-3000:]


def test_a_backlogged_history_store_that_dies_loses_no_response_unaccounted(local_ray):
    """More sends than RayHistory keeps in flight wait in the buffer; when the backlogged store dies,
    every response reaches the replacement or is counted lost (none vanishes untracked)."""
    from npu_rl.spec_decode.history import HistoryStore, RayHistory

    class SlowStore(HistoryStore):  # a store that answers slower than the engine steps
        def add_many(self, items):
            time.sleep(0.2)
            super().add_many(items)

    ray, _ = local_ray
    h = RayHistory(64 << 20, scope="backlog")
    ray.kill(h.actor)
    h._cls = ray.remote(num_cpus=0)(SlowStore)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # the name is free once the first actor is gone
        try:
            h.actor = h._get_or_create()
            ray.get(h.actor.stats.remote())
            break
        except ray.exceptions.RayActorError:
            time.sleep(0.1)
    n = RayHistory.MAX_PENDING + 36
    for i in range(n):  # one finished response per engine step
        h.add(i.to_bytes(16, "little"), np.arange(i, i + 50, dtype=np.int32), 1.0)
        h.flush()
    assert len(h._pending) == RayHistory.MAX_PENDING and len(h._buffer) == 36
    h._cls = ray.remote(num_cpus=0)(HistoryStore)
    ray.kill(h.actor)
    deadline = time.monotonic() + 60
    while (h.restarts == 0 or h._pending or h._buffer) and time.monotonic() < deadline:
        h.flush()
        time.sleep(0.02)
    st = h.stats()
    assert st["restarts"] == 1 and st["responses"] + st["lost_responses"] == n
    assert st["lost_responses"] == 0  # here every one was sent again in time
    ray.kill(h.actor)


def test_with_no_history_actor_the_step_says_zero_sent_and_the_log_says_why(local_ray, tmp_path, capsys):
    from npu_rl.spec_decode import rewards
    from tests.test_sam_rewards_on_cpu import config, step_data

    rewards._FEEDS.clear()
    data = step_data([[1, 2]], [[3]], [[1.0]])
    out = rewards.step_rewards(data, np.ones(1, bool), config(str(tmp_path / "no-engine-model")))
    assert out == {"npu_rl/sam/history_rewards_sent": 0.0}
    assert "no history actor" in capsys.readouterr().err
    rewards.step_rewards(data, np.ones(1, bool), config(str(tmp_path / "no-engine-model")))
    assert "no history actor" not in capsys.readouterr().err  # said once


def test_the_trainers_rewards_rank_the_history_the_engines_stored(local_ray, tmp_path):
    """Engine: a group of 32 (n > the 16 kept) finishes, each copy with a token past its end, and is
    sent to the actor named as the proposer names it. Trainer: step_rewards with the step's rows (one
    of them padding). The store then holds the 16 best rated, cut to the real responses, best last."""
    from types import SimpleNamespace

    from npu_rl.spec_decode import rewards
    from npu_rl.spec_decode.config import ray_job_scope, resolve
    from npu_rl.spec_decode.history import RayHistory
    from npu_rl.spec_decode.vllm_proposer import _history_scope
    from tests.test_sam_rewards_on_cpu import config, step_data

    ray, _ = local_ray
    rewards._FEEDS.clear()
    model = str(tmp_path / "Qwen3-toy")
    settings = resolve(4, None, None, None, None, 16, ray_job_scope(), None, env={})
    assert settings.history_rewards  # on by default with the history
    engine = RayHistory(
        settings.history_bytes,
        scope=_history_scope(settings, SimpleNamespace(model_config=SimpleNamespace(model=model))),
        await_rewards=settings.history_rewards,
    )
    prompt = [11, 12, 13]
    responses = [[i, i + 1, 2] for i in range(32)]  # 2: the stop token
    wins = {0, 5, 10, 15, 20, 25}  # right answers, the oldest among them
    for r in responses:
        engine.add(prompt_key(prompt), [*r, 99])  # the engine's copy: one drafted token past the stop
    engine.flush()
    rows = [*responses, [7]]  # a padding row last
    data = step_data([prompt] * 33, rows, [[0.0, 0.0, 1.0 if i in wins else 0.0] for i in range(32)] + [[5.0]])
    keep = np.array([True] * 32 + [False])
    out = rewards.step_rewards(data, keep, config(model))
    assert out["npu_rl/sam/history_rewards_sent"] == 32.0
    deadline = time.monotonic() + 60
    while engine.stats()["rated"] < 32 and time.monotonic() < deadline:
        time.sleep(0.05)
    st = engine.stats()
    assert (st["ratings"], st["rated"], st["unrated"], st["responses"]) == (32, 32, 0, 16)
    got = ray.get(engine.actor.get.remote(prompt_key(prompt)))
    assert [g.tolist() for g in got[-len(wins) :]] == [[i, i + 1, 2] for i in sorted(wins)]  # cut, best last
    assert all(g.tolist()[-1] == 2 for g in got)
    later = rewards.step_rewards(step_data([prompt], [responses[1]], [[0.0]]), np.ones(1, bool), config(model))
    assert later["npu_rl/sam/history_ratings"] >= 32  # the store's counters, as of its last answer
