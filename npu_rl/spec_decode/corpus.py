"""The SAM drafter of a whole engine: per-prompt group automata with live siblings, history, adaptive k.

API (:class:`SamDrafter`; engine-independent, no vllm imports; the vLLM proposer and the benchmarks
drive it the same way)::

    d = SamDrafter(k=5, group_budget_bytes=256 << 20, adaptive_k=True,
                   history=LocalHistory(HistoryStore(512 << 20)))   # or RayHistory(...), or None
    d.start(req_id, prompt_ids, num_prompt=None, key=None)  # key: group key, default prompt_key(prompt)
    draft = d.step(req_id, new_tokens, max_draft=None)      # feed the tokens sampled since the last
                                                            # call (int32 array), get up to k tokens;
                                                            # max_draft=0 feeds only, an empty array
                                                            # proposes only
    d.tick()                                                # once per engine step: history lookups,
                                                            # builds handed to a worker, attaches
    d.finish(req_id, reward=None)                           # done: its output goes to the history
    d.drop(req_id)                                          # aborted/preempted: not to the history
    d.k_of(req_id); d.counters(req_id); d.stats()           # adaptive k, drafted/accepted, memory
    d.history.add(key, tokens, reward); d.history.store.get(key)   # the store directly (LocalHistory)

- Group: every request of one key (the n samples of a prompt, and the same prompt again in a later
  round served by this engine) is a *stream* of one :class:`~npu_rl.spec_decode.gsam.GroupAutomaton`,
  grown token by token as the engine samples (live siblings: a request drafts from a sibling's text
  the step after the sibling wrote it). Finishing a request only closes its stream: no bulk insert.
- Resumed requests: a request re-sent as prompt + its tokens so far (verl's partial rollout, after a
  weight sync) joins the cached group whose prompt is the longest proper prefix of its prompt
  (:meth:`SamDrafter._resumed_key`), so it keeps drafting from its siblings and history. So does any
  new prompt that extends a cached prompt (a later turn of the same conversation).
- Draft: the continuation of the longest suffix of the request's own text that occurs anywhere in
  the group (own earlier text, live or finished siblings) or in the group's history automaton
  (the longer match wins, ties go to the group), most recent occurrence first; ``max_draft`` caps
  it (0: catch up only, e.g. above the batch-size gate).
- Adaptive k (``adaptive_k=True``): :meth:`step` scores the previous draft against the tokens it is
  fed (a draft token is accepted iff the engine sampled it: vLLM's rejection sampler with a
  draft probability of 1), so no separate feedback call exists. A fully accepted draft of the
  current length grows k by one, a miss halves it; k stays in [1, k] (the engine's
  ``num_speculative_tokens``); the batch-size gate stays with the caller (``max_draft``).
- History (``history`` given): when a key's group is created, and again when a request of a cached
  group with no running request starts (another replica may have added responses since), the
  drafter asks the store for the key's earlier responses (non-blocking). The responses its group
  does not already hold are built into a read-only suffix automaton *off the engine step*, on a
  worker thread (numba releases the GIL; ``history_build="inline"`` builds inside :meth:`tick`, for
  replays and tests), and :meth:`tick` attaches it when ready: each running stream of the group
  matches its last :data:`~npu_rl.spec_decode.gsam.HISTORY_RESYNC` output tokens once, then the
  history match advances with the stream's tokens in the same fused call. No history token is
  inserted on the engine's critical path. :meth:`finish` sends the output to the store (with
  ``reward`` when the caller has it). Store rules: :mod:`npu_rl.spec_decode.history`.
- Memory: groups without running requests are evicted least recently used first to stay within
  ``group_budget_bytes`` (groups with running requests are never evicted: their automaton is the
  requests' own state). ``group_budget_bytes=0`` gives every request a private automaton, freed
  at finish (no group corpus, no history).

:class:`SamDrafterV1` and :class:`GroupCorpus` are the issue-6 drafter (one automaton per request
plus a corpus of finished responses, bulk-inserted at drop), kept as the benchmarks' baseline.
"""

from __future__ import annotations

import hashlib
import itertools
import time
from collections import Counter, OrderedDict, deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from npu_rl.spec_decode.gsam import (
    DEFAULT_RESERVE,
    DONE,
    HISTORY_RESYNC,
    MIG,
    NO_HISTORY,
    S_ACCEPTED,
    S_DRAFTED,
    S_KCUR,
    S_MLEN,
    S_NTOK,
    S_POS,
    S_STEPS,
    GroupAutomaton,
    _step,
    attach_history,
    new_stream,
)
from npu_rl.spec_decode.history import HistoryStore, LocalHistory, RayHistory, response_digest
from npu_rl.spec_decode.sam import C_GGEN, C_GLEN, C_GROUP, C_GSTATE, SuffixAutomaton, new_ctl

__all__ = [
    "GroupCorpus",
    "HistoryStore",
    "LocalHistory",
    "RayHistory",
    "SamDrafter",
    "SamDrafterV1",
    "prompt_key",
]


HISTORY_KEYS_PER_LOOKUP = 32  # new prompts per history lookup (one lookup per tick)
_NO_TOKENS = np.empty(0, np.int32)


def prompt_key(prompt_ids) -> bytes:
    """Group identity of a request: 16-byte BLAKE2b digest of its prompt token ids (as int32)."""
    return hashlib.blake2b(np.ascontiguousarray(prompt_ids, dtype=np.int32).tobytes(), digest_size=16).digest()


class GroupCorpus:
    """Suffix automata over finished responses, one per prompt, within ``budget_bytes`` (LRU by prompt).

    ``budget_bytes`` counts the automata's allocated arrays (:attr:`SuffixAutomaton.nbytes`). A
    prompt whose automaton alone exceeds the budget is dropped. Automata evicted while a running
    request still matches against them stay alive until that request lets go of them.
    """

    def __init__(self, budget_bytes: int, occurrence: str = "recent"):
        if budget_bytes < 0:
            raise ValueError(f"budget_bytes={budget_bytes} must be >= 0 (0 disables the group corpus)")
        self.budget_bytes = int(budget_bytes)
        self.occurrence = occurrence
        self._groups: OrderedDict[bytes, SuffixAutomaton] = OrderedDict()
        self._responses: dict[bytes, int] = {}
        self.nbytes = 0
        self.evictions = 0
        self.version = 0  # changes whenever a prompt's automaton is created or evicted

    def __len__(self) -> int:
        return len(self._groups)

    def __contains__(self, key: bytes) -> bool:
        return key in self._groups

    def get(self, key: bytes) -> SuffixAutomaton | None:
        """The automaton of prompt ``key`` (marked as recently used), or None."""
        sam = self._groups.get(key)
        if sam is not None:
            self._groups.move_to_end(key)
        return sam

    def add(self, key: bytes, response) -> None:
        """Add one response (token ids) to prompt ``key``'s automaton; evict to stay within budget."""
        response = np.ascontiguousarray(response, dtype=np.int32)
        if self.budget_bytes == 0 or response.shape[0] == 0:
            return
        sam = self._groups.get(key)
        if sam is None:
            sam = self._groups[key] = SuffixAutomaton(capacity=2 * response.shape[0] + 2, occurrence=self.occurrence)
            self._responses[key] = 0
            self.nbytes += sam.nbytes
            self.version += 1
        self._groups.move_to_end(key)
        before = sam.nbytes
        self._responses[key] += 1
        sam.append(np.concatenate([np.array([-self._responses[key]], np.int32), response]))
        self.nbytes += sam.nbytes - before
        while self.nbytes > self.budget_bytes and self._groups:
            old, dropped = self._groups.popitem(last=False)
            del self._responses[old]
            self.nbytes -= dropped.nbytes
            self.evictions += 1
            self.version += 1

    def clear(self) -> None:
        """Drop every prompt's automaton."""
        self._groups.clear()
        self._responses.clear()
        self.nbytes = 0
        self.version += 1


@dataclass
class _Request:
    sam: SuffixAutomaton
    ctl: np.ndarray
    key: bytes
    num_prompt: int
    group: SuffixAutomaton | None = None
    corpus_version: int = -1


class SamDrafterV1:
    """The issue-6 drafter, kept as the benchmarks' "SAM as today" baseline: one automaton per running
    request plus a :class:`GroupCorpus` of *finished* responses (bulk insert at drop).

    ``k``: maximum draft tokens per step. ``min_match``: shortest suffix match that yields a draft.
    ``group_budget_bytes``: byte budget of the :class:`GroupCorpus` (0 turns the group corpus off).
    ``occurrence``: which earlier occurrence a draft continues ("recent" or "first").
    """

    def __init__(self, k: int, min_match: int = 1, group_budget_bytes: int = 0, occurrence: str = "recent"):
        if k < 1:
            raise ValueError(f"k={k}: the number of speculative tokens must be >= 1")
        if min_match < 1:
            raise ValueError(f"min_match={min_match} must be >= 1")
        self.k = int(k)
        self.min_match = int(min_match)
        self.occurrence = occurrence
        self.corpus = GroupCorpus(group_budget_bytes, occurrence) if group_budget_bytes > 0 else None
        self.requests: dict[str, _Request] = {}
        self._contributed: OrderedDict[str, int] = OrderedDict()  # req id -> output tokens already in the corpus
        self._out = np.empty(self.k, np.int32)
        self._no_room = np.empty(0, np.int32)
        self.last_source = np.zeros(0, np.int64)

    # ---- lifecycle ---------------------------------------------------------------------------
    def start(self, req_id: str, prompt_ids, num_prompt: int | None = None) -> None:
        """Begin (or restart) ``req_id`` with its token ids so far; the first ``num_prompt`` are the prompt.

        ``prompt_ids`` may already include output tokens (a request resumed after preemption):
        pass ``num_prompt`` then.
        """
        ids = np.ascontiguousarray(prompt_ids, dtype=np.int32)
        num_prompt = ids.shape[0] if num_prompt is None else int(num_prompt)
        self.drop(req_id, contribute=False)
        key = prompt_key(ids[:num_prompt])
        sam = SuffixAutomaton(capacity=max(2 * ids.shape[0], 256), occurrence=self.occurrence)
        req = _Request(sam, new_ctl(self.k, self.min_match, group=self.corpus is not None), key, num_prompt)
        self.requests[req_id] = req
        sam.append(ids)
        if self.corpus is not None:
            self._attach_group(req)

    def drop(self, req_id: str, contribute: bool = True) -> None:
        """Forget ``req_id`` and free its automaton; with ``contribute``, its output joins its group corpus.

        A request that comes back (preempted, then resumed) contributes only output not yet given.
        """
        req = self.requests.pop(req_id, None)
        if req is None:
            return
        if contribute and self.corpus is not None:
            given = self._contributed.pop(req_id, 0)
            out = req.sam.text[req.num_prompt + given :]
            if out.shape[0]:
                self.corpus.add(req.key, out)
            self._contributed[req_id] = given + out.shape[0]
            while len(self._contributed) > 65536:
                self._contributed.popitem(last=False)
        req.group = None  # the automaton is released with the last reference (no copy is kept)

    def __contains__(self, req_id: str) -> bool:
        return req_id in self.requests

    def num_tokens(self, req_id: str) -> int:
        """Tokens of ``req_id`` the drafter has seen (prompt + output)."""
        return len(self.requests[req_id].sam)

    def last_token(self, req_id: str) -> int:
        """The last token id seen for ``req_id``."""
        return int(self.requests[req_id].sam.text[-1])

    # ---- drafting ----------------------------------------------------------------------------
    def step(self, req_id: str, new_tokens: np.ndarray, max_draft: int | None = None) -> np.ndarray:
        """Append ``new_tokens`` (contiguous int32 array) to ``req_id``; return its draft.

        The draft is a view valid until the next call. ``max_draft`` caps it (0: catch up only).
        """
        req = self.requests[req_id]
        if self.corpus is not None and req.corpus_version != self.corpus.version:
            self._attach_group(req)
        out = self._out if max_draft is None else self._out[: max(0, max_draft)]
        return out[: req.sam.step(new_tokens, out, req.ctl, req.group)]

    def _attach_group(self, req: _Request) -> None:
        """Point ``req`` at its prompt's group automaton (the corpus created or evicted one)."""
        group = self.corpus.get(req.key)
        req.corpus_version = self.corpus.version
        if group is req.group:
            return
        req.group = group
        req.ctl[C_GROUP] = int(group is not None)
        req.ctl[C_GSTATE] = 0
        req.ctl[C_GLEN] = 0
        req.ctl[C_GGEN] = -1  # makes the next step match the recent tokens against the new automaton

    # ---- accounting --------------------------------------------------------------------------
    @property
    def request_bytes(self) -> int:
        """Bytes allocated by the running requests' automata."""
        return sum(r.sam.nbytes for r in self.requests.values())

    @property
    def nbytes(self) -> int:
        """Bytes allocated by the drafter: running requests plus the group corpus."""
        return self.request_bytes + (self.corpus.nbytes if self.corpus is not None else 0)


@dataclass
class _Group:
    gsam: GroupAutomaton
    live: int = 0
    waiting: bool = False  # history lookup in flight
    hist: SuffixAutomaton | None = None  # read-only history automaton (attached), its id (0: none)
    hist_id: int = 0
    building: bool = False  # a history automaton is being built for this group
    evicted: bool = False
    prompt_len: int = 0  # tokens prompt_key hashed (0: a caller's key, never matched as a prefix)
    own: set = field(default_factory=set)  # digests of the outputs finished in gsam (not history again)
    streams: dict = field(default_factory=dict)  # req_id -> ctl of its running requests
    counted: int = 0  # its nbytes as of its last start, drop or attached history (SamDrafter._recount)

    @property
    def nbytes(self) -> int:
        return self.gsam.nbytes + (self.hist.nbytes if self.hist is not None else 0)


def build_history(responses: list[np.ndarray], occurrence: str = "recent") -> SuffixAutomaton:
    """A suffix automaton over ``responses`` (int32 token ids), each followed by its own negative
    separator, in the order given (the last is the latest occurrence). Runs on the builder thread:
    the numba extension releases the GIL, so the engine's thread goes on meanwhile."""
    sa = SuffixAutomaton(sum(int(r.shape[0]) + 1 for r in responses), occurrence)
    for i, r in enumerate(responses):
        sa.append(r)
        sa.append(np.array([-1 - i], np.int32))
    sa.freeze()  # read-only from here on: exact sizes, no edge lists
    return sa


@dataclass
class _Req:
    st: np.ndarray
    group: _Group
    key: object


class SamDrafter:
    """SAM drafting for every request of one engine (see the module docstring for the API and rules).

    ``k``: the engine's draft length (``num_speculative_tokens``). ``min_match``: shortest suffix
    match (tokens) that drafts. ``group_budget_bytes``: memory for the group automata (0: private
    automata, no group corpus). ``occurrence``: "recent" or "first". ``adaptive_k``: TCP-like draft
    length per request. ``history``: a :class:`~npu_rl.spec_decode.history.LocalHistory` or
    :class:`~npu_rl.spec_decode.history.RayHistory` (None: no history; needs a group budget).
    ``history_ms_per_step``: time per :meth:`tick` for handling history answers (checked per
    group). ``history_build``: "thread" (a worker thread builds history automata) or "inline" (in
    :meth:`tick`; its CPU time is counted in :attr:`history_build_ns`). ``reserve_tokens``: address
    space per group automaton (:class:`~npu_rl.spec_decode.gsam.GroupAutomaton`; past it the arena
    grows by a copy).
    """

    def __init__(
        self,
        k: int,
        min_match: int = 1,
        group_budget_bytes: int = 0,
        occurrence: str = "recent",
        *,
        adaptive_k: bool = False,
        history=None,
        history_ms_per_step: float = 0.5,
        history_build: str = "thread",
        reserve_tokens: int = DEFAULT_RESERVE,
    ):
        if k < 1:
            raise ValueError(f"k={k}: the number of speculative tokens must be >= 1")
        if min_match < 1:
            raise ValueError(f"min_match={min_match} must be >= 1")
        if occurrence not in ("recent", "first"):
            raise ValueError(f"occurrence={occurrence!r}: use 'recent' or 'first'")
        if group_budget_bytes < 0:
            raise ValueError(f"group_budget_bytes={group_budget_bytes} must be >= 0 (0 turns the group corpus off)")
        if history is not None and group_budget_bytes == 0:
            raise ValueError("history needs the group corpus: give group_budget_bytes > 0 (sam_group_corpus_mb)")
        if history_build not in ("thread", "inline"):
            raise ValueError(f"history_build={history_build!r}: use 'thread' or 'inline'")
        if history_ms_per_step <= 0:
            raise ValueError(f"history_ms_per_step={history_ms_per_step} must be > 0")
        self.k = int(k)
        self.min_match = int(min_match)
        self.occurrence = occurrence
        self.adaptive_k = bool(adaptive_k)
        self.budget_bytes = int(group_budget_bytes)
        self.history = history
        self.history_build = history_build
        self._pool = None  # the worker thread, started with the first build
        self._builds: list[tuple[_Group, object]] = []  # (group, future) in flight
        self._hist_ids = itertools.count(1)
        self.history_build_ns = 0  # thread CPU time of inline builds
        self.history_s_per_step = history_ms_per_step / 1e3
        self.reserve_tokens = int(reserve_tokens)
        self.groups: OrderedDict[object, _Group] = OrderedDict()
        # Memory accounting in O(1) per call, whatever the number of cached groups (issue 39): the sum
        # of every group's ``counted`` bytes, and the groups without running requests in the order they
        # went idle (least recently used first), the only ones eviction may take.
        self._counted = 0
        self._idle: OrderedDict[object, _Group] = OrderedDict()
        self.requests: dict[str, _Req] = {}
        self._out = np.empty(self.k, np.int32)
        self._to_fetch: list[tuple[object, _Group]] = []  # new groups: history looked up at the next tick
        self._awaiting: list[tuple[object, list[_Group]]] = []  # (lookup handle, its groups) in flight
        self._answers: deque[tuple[_Group, list]] = deque()  # history answers not yet looked at
        self.evictions = 0
        self.history_tokens_built = 0
        self.history_lookups = 0
        self.resumed = 0  # requests joined to their group by a prompt prefix (see _resumed_key)
        self._prompt_lens: Counter[int] = Counter()  # prompt lengths of the prompt-keyed groups

    # ---- lifecycle ---------------------------------------------------------------------------
    def start(self, req_id: str, prompt_ids, num_prompt: int | None = None, key=None) -> None:
        """Begin (or restart) ``req_id`` with its token ids so far; the first ``num_prompt`` are the prompt.

        ``key``: the group key (hashable; default :func:`prompt_key` of the prompt). ``prompt_ids``
        may already hold output (a request resumed after preemption): pass ``num_prompt`` then.
        """
        ids = np.ascontiguousarray(prompt_ids, dtype=np.int32)
        num_prompt = ids.shape[0] if num_prompt is None else int(num_prompt)
        self.drop(req_id)
        if self.budget_bytes == 0:
            key = ("private", req_id)
        elif key is None:
            key = prompt_key(ids[:num_prompt])
            if key not in self.groups:
                key, plen = self._resumed_key(ids, num_prompt) or (key, num_prompt)
            else:
                plen = num_prompt
        group = self.groups.get(key)
        if group is None:
            group = self.groups[key] = _Group(GroupAutomaton(self.reserve_tokens))
            if isinstance(key, bytes):
                group.prompt_len = plen
                self._prompt_lens[plen] += 1
            if self.history is not None:
                group.waiting = True
                self._to_fetch.append((key, group))
        elif self.history is not None and group.live == 0 and not group.waiting and not group.building:
            # a group cached from an earlier round: the store may hold responses another replica made
            # since (verl routes a prompt to any replica); look again, insert only the unseen ones
            group.waiting = True
            self._to_fetch.append((key, group))
        self.groups.move_to_end(key)
        if group.live == 0:
            self._idle.pop(key, None)
        group.live += 1
        st = new_stream(self.k, self.min_match, self.adaptive_k, num_prompt, self.occurrence)
        self.requests[req_id] = _Req(st, group, key)
        group.streams[req_id] = st
        group.gsam.append(st, ids)
        if group.hist is not None:
            attach_history(st, _NO_TOKENS, group.hist.arena, group.hist.meta, group.hist_id)
        self._recount(group)
        self._evict()

    def _resumed_key(self, ids: np.ndarray, num_prompt: int) -> tuple[bytes, int] | None:
        """The group of a request resumed as prompt + its tokens so far, or None.

        verl's partial rollout re-sends a request aborted at a weight sync with the same id and
        ``prompt_ids + tokens so far`` as its prompt (``verl/workers/rollout/llm_server.py``,
        ``generate``), and vLLM then counts all of it as prompt (under a new internal id: vLLM appends a
        random suffix to the caller's id, so the id cannot tell). Its group is the cached group whose
        prompt is the longest proper prefix of ``ids[:num_prompt]``. One incremental BLAKE2b pass over
        the ids yields :func:`prompt_key` of every prefix at a cached prompt length, so the cost is one
        hash of the prompt plus a digest copy per distinct cached prompt length, not a hash per length.
        """
        lens = sorted(n for n in self._prompt_lens if n < num_prompt)
        if not lens:
            return None
        h = hashlib.blake2b(digest_size=16)
        found, done = None, 0
        for n in lens:
            h.update(ids[done:n].tobytes())
            done = n
            key = h.copy().digest()
            if key in self.groups:
                found = (key, n)
        if found is not None:
            self.resumed += 1
        return found

    def finish(self, req_id: str, reward: float | None = None) -> None:
        """``req_id`` finished: close its stream (its text stays in the group) and send its output,
        with ``reward`` if known, to the history store."""
        req = self.requests.get(req_id)
        if req is not None and self.history is not None:
            out = req.group.gsam.output(req.st)
            if out.shape[0]:
                self.history.add(req.key, out, reward)
                req.group.own.add(response_digest(out))
        self.drop(req_id)

    def drop(self, req_id: str, contribute: bool = True) -> None:
        """Forget ``req_id`` (aborted, preempted, or finished without history); its text stays in its
        group until the group is evicted. ``contribute`` is accepted for the V1 signature."""
        req = self.requests.pop(req_id, None)
        if req is None:
            return
        group = req.group
        group.live -= 1
        group.streams.pop(req_id, None)
        if self.budget_bytes == 0:
            self.groups.pop(req.key, None)
            self._counted -= group.counted
            return
        self._recount(group)  # its output is in the group automaton now
        if group.live == 0:
            self._idle[req.key] = group
        self._evict()

    def __contains__(self, req_id: str) -> bool:
        return req_id in self.requests

    def num_tokens(self, req_id: str) -> int:
        """Tokens of ``req_id`` the drafter has seen (prompt + output)."""
        return int(self.requests[req_id].st[S_NTOK])

    def last_token(self, req_id: str) -> int:
        """The last token id seen for ``req_id``."""
        req = self.requests[req_id]
        return int(req.group.gsam.arena[req.st[S_POS]])

    # ---- drafting ----------------------------------------------------------------------------
    def step(self, req_id: str, new_tokens: np.ndarray, max_draft: int | None = None) -> np.ndarray:
        """Append ``new_tokens`` (contiguous int32 array) to ``req_id``; return its draft.

        The draft is a view valid until the next call, at most ``min(k_of(req_id), max_draft)`` tokens.
        """
        req = self.requests[req_id]
        kcap = self.k if max_draft is None else max_draft
        g = req.group.gsam
        hist = req.group.hist
        ha, hm = (NO_HISTORY.arena, NO_HISTORY.meta) if hist is None else (hist.arena, hist.meta)
        n = _step(new_tokens, g.arena, g.meta, g.h, g.ho, req.st, self._out, kcap, ha, hm)  # common case
        if n < 0:  # the arena or the hash table must grow first: the rest goes through the slow path
            n = g.step(req.st, new_tokens[int(g.meta[DONE]) :], self._out, kcap, hist)
        elif g.ho.shape[0] > 1 and g.meta[MIG] < 0:
            g.release_old_hash()
        return self._out[:n]

    def tick(self) -> int:
        """Once per engine step: send finished outputs to the store, start one history lookup (at most
        :data:`HISTORY_KEYS_PER_LOOKUP` new prompts), hand the answers that arrived to the builder
        (at least one, then for about ``history_ms_per_step``), and attach the history automata that are ready.

        Returns the history tokens attached. Nothing here inserts history tokens into a group
        automaton: the builds run on the worker thread ("thread") or, with "inline", here, timed
        apart in :attr:`history_build_ns`.
        """
        if self.history is None:
            return 0
        self.history.flush()
        t_end = time.perf_counter() + self.history_s_per_step
        if self._to_fetch:
            batch = self._to_fetch[:HISTORY_KEYS_PER_LOOKUP]
            self._to_fetch = self._to_fetch[HISTORY_KEYS_PER_LOOKUP:]
            keys, groups = zip(*batch, strict=True)
            self._awaiting.append((self.history.prefetch(list(keys)), list(groups)))
            self.history_lookups += 1
        if self._awaiting:
            still = []
            for handle, groups in self._awaiting:
                answers = self.history.poll(handle)
                if answers is None:
                    still.append((handle, groups))
                else:
                    self._answers.extend(zip(groups, answers, strict=True))
            self._awaiting = still
        # a response the group already holds (its own finished output) is left out by the digest the
        # store computed; the store lists the best last, the build inserts it last (latest occurrence).
        # At least one answer per tick, even when the lookup ate the budget: the history always progresses
        progressed = False
        while self._answers and (not progressed or time.perf_counter() < t_end):
            progressed = True
            group, got = self._answers.popleft()
            if group.evicted:
                continue
            group.waiting = False
            fresh = [t for dg, t in got if len(t) and dg not in group.own]
            if not fresh:
                continue
            group.building = True
            if self.history_build == "inline":
                t0 = time.thread_time_ns()
                built = build_history(fresh, self.occurrence)
                self.history_build_ns += time.thread_time_ns() - t0
                done = Future()  # already finished: attached below like a worker's build
                done.set_result(built)
                self._builds.append((group, done))
            else:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(1, thread_name_prefix="npu_rl_sam_history")
                self._builds.append((group, self._pool.submit(build_history, fresh, self.occurrence)))
        attached = 0
        if self._builds:
            still = []
            for group, fut in self._builds:
                if not fut.done():
                    still.append((group, fut))
                    continue
                group.building = False
                if group.evicted:
                    continue
                hist = fut.result()
                group.hist, group.hist_id = hist, next(self._hist_ids)
                for st in group.streams.values():  # its running streams match their recent output
                    recent = group.gsam.output(st)[-HISTORY_RESYNC:]
                    attach_history(st, recent, hist.arena, hist.meta, group.hist_id)
                attached += len(hist)
                self._recount(group)
            self._builds = still
            self._evict()
        self.history_tokens_built += attached
        return attached

    def wait_history(self, timeout: float = 60.0) -> None:
        """Block until the builds in flight are done (tests and replays; an engine never calls it)."""
        for _, fut in self._builds:
            fut.result(timeout=timeout)

    def k_of(self, req_id: str) -> int:
        """The request's current draft length (adaptive, or k)."""
        return int(self.requests[req_id].st[S_KCUR])

    def counters(self, req_id: str) -> dict:
        """Draft tokens proposed and accepted, drafting steps, current k and match length of ``req_id``."""
        st = self.requests[req_id].st
        return {
            "drafted": int(st[S_DRAFTED]),
            "accepted": int(st[S_ACCEPTED]),
            "draft_steps": int(st[S_STEPS]),
            "k": int(st[S_KCUR]),
            "match": int(st[S_MLEN]),
        }

    # ---- memory ------------------------------------------------------------------------------
    def _recount(self, group: _Group) -> None:
        """Bring ``group``'s share of the accounted bytes up to date (O(1)). Called where a group's size
        settles: a request starts in it, a request leaves it, a history automaton is attached. Between
        those, running requests grow their group by their new tokens, which the next of these counts."""
        n = group.nbytes
        self._counted += n - group.counted
        group.counted = n

    def _evict(self) -> None:
        """Evict idle groups, least recently used first, until the accounted bytes fit the budget;
        amortised O(1) per call (each group is evicted once), independent of the groups cached."""
        if self.budget_bytes == 0:
            return
        while self._counted > self.budget_bytes and self._idle:
            key, group = self._idle.popitem(last=False)
            del self.groups[key]
            group.waiting, group.evicted = False, True  # no history work for an evicted group
            if group.prompt_len:
                self._prompt_lens[group.prompt_len] -= 1
                if not self._prompt_lens[group.prompt_len]:
                    del self._prompt_lens[group.prompt_len]
            self._counted -= group.counted
            self.evictions += 1

    @property
    def request_bytes(self) -> int:
        """Bytes of the groups that have running requests."""
        return sum(g.nbytes for g in self.groups.values() if g.live)

    @property
    def nbytes(self) -> int:
        """Bytes allocated by the drafter (every group automaton and history automaton)."""
        return sum(g.nbytes for g in self.groups.values())

    def stats(self) -> dict:
        """Groups, running requests, tokens, bytes (allocated and per token), evictions, history work."""
        tokens = sum(g.gsam.num_tokens + (len(g.hist) if g.hist is not None else 0) for g in self.groups.values())
        nbytes = self.nbytes
        return {
            "groups": len(self.groups),
            "requests": len(self.requests),
            "tokens": tokens,
            "nbytes": nbytes,
            "bytes_per_token": nbytes / tokens if tokens else 0.0,
            "used_bytes_per_token": (
                sum(g.gsam.used_bytes + (g.hist.nbytes if g.hist is not None else 0) for g in self.groups.values())
                / tokens
                if tokens
                else 0.0
            ),
            "history_bytes": sum(g.hist.nbytes for g in self.groups.values() if g.hist is not None),
            "evictions": self.evictions,
            "history_lookups": self.history_lookups,
            "history_tokens_built": self.history_tokens_built,
            "history_builds_in_flight": len(self._builds),
            "history": getattr(self.history, "where", None),
        }
