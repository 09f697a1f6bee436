"""Per-request SAM drafter state and the shared group corpus (device-agnostic; no vllm imports).

:class:`GroupCorpus` keeps, per prompt, one suffix automaton over the finished responses to that
prompt (its GRPO group and that prompt's responses in earlier epochs), keyed by a hash of the prompt
token ids (:func:`prompt_key`), so verl needs no change to pass a group identity. Responses are
separated by unique negative ids, so no match spans two responses. The corpus is bounded by a byte
budget and evicts whole prompts, least recently used first.

:class:`SamDrafter` owns one automaton per running request (prompt + output so far) and drafts from
the longer of the request's own match and its group match (Hu et al., "SAM Decoding", ACL 2025,
combine a dynamic and a static automaton the same way).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from npu_rl.spec_decode.sam import C_GGEN, C_GLEN, C_GROUP, C_GSTATE, SuffixAutomaton, new_ctl


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


class SamDrafter:
    """SAM drafting for many concurrent requests (the engine-independent half of the vLLM proposer).

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
