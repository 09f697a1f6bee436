"""History corpus of the SAM drafter (issue 20, item 1): earlier rounds' responses, per prompt.

:class:`HistoryStore` keeps raw response token ids (int32, 4 B per token: the automata are built only
in the engine that serves the prompt, incrementally, see :class:`npu_rl.spec_decode.corpus.SamDrafter`)
per prompt key, with

- a cap in bytes over all prompts (``budget_bytes``; token bytes plus a fixed 64 B per response);
- per prompt at most ``max_responses`` responses: a new response replaces the prompt's *weakest*
  one, the lowest ``(reward, age)``: lowest reward first (``None`` counts as 0), oldest among equals;
- eviction over the cap: whole prompts, least recently used (added to or read) first.

Rewards come from the trainer, after the engine has stored the response (issue 34, item 5): with
``await_rewards`` the store holds a response the engine sends without a reward as *unrated* (at most
``max_unrated`` per prompt, oldest dropped first; they do not count against ``max_responses``) until
:meth:`HistoryStore.rate_many` gives it one, then ranks it with the rated ones. A rating names the
response by its prompt key, its length and the digest of its tokens as the trainer saw them
(:func:`rating`: 36 bytes, no tokens sent again); the engine's copy may run past the response's end by
up to k tokens (vLLM samples the last forward's drafts past a stop), so a rating matches the stored
response it is a prefix of, and cuts it to the real response. A rating that arrives before its
response (the engine sends finished outputs at its next step) waits, at most :data:`MAX_EARLY` of them.

:meth:`HistoryStore.get` returns a prompt's responses in the order the drafter inserts them: weakest
first, so the best rewarded and newest response is the *latest* occurrence, the one a "recent"
draft continues (this is the reward weighting: with ``reward_weighted=False`` only age counts).

Keys are the group keys of :func:`npu_rl.spec_decode.corpus.prompt_key` (a digest of the prompt
token ids), not verl's dataset index: the same prompt in a later epoch or a later step has the same
token ids in every replica, so the key needs no plumbing through verl and vLLM's request, and two
dataset rows with the same prompt share a history, which is what a drafter wants.

Reachability across replicas (verl routes a prompt to any replica next round): :class:`RayHistory`
is a named Ray actor holding one :class:`HistoryStore` for the whole cluster, with
non-blocking calls (``add`` is fire-and-forget; ``prefetch`` returns a handle the engine polls with a
zero timeout, so no engine step waits on it). Without Ray the drafter uses an in-process store
(history then reaches only prompts served again by the same engine); the proposer logs which.
Cost per step: ``benchmarks/bench_sam_history.py``.
"""

from __future__ import annotations

import hashlib
import itertools
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

RESPONSE_OVERHEAD = 64  # bytes charged per stored response (array header, bookkeeping)
MAX_EARLY = 1 << 16  # ratings held for responses not stored yet (oldest dropped first)
ACTOR_NAME = "npu_rl_sam_history"
ACTOR_NAMESPACE = "npu_rl"


def response_digest(tokens) -> bytes:
    """16-byte BLAKE2b digest of a response's int32 token ids: its identity in the store and in a
    drafter's group (the store computes it once at :meth:`HistoryStore.add`, off the engine)."""
    return hashlib.blake2b(np.ascontiguousarray(tokens, np.int32).tobytes(), digest_size=16).digest()


def rating(prompt_ids, response_ids, reward: float) -> tuple[bytes, int, bytes, float]:
    """What the trainer sends :meth:`HistoryStore.rate_many` for one response: (prompt key, response
    length in tokens, :func:`response_digest` of the response, reward). ``prompt_ids`` are the prompt's
    token ids as the engine got them (no padding), ``response_ids`` the response's (no padding)."""
    from npu_rl.spec_decode.corpus import prompt_key

    response = np.ascontiguousarray(response_ids, np.int32).reshape(-1)
    return prompt_key(prompt_ids), int(response.shape[0]), response_digest(response), float(reward)


@dataclass
class _Entry:
    # (reward or None while unrated, seq, tokens, digest of the whole response)
    responses: list[tuple[float | None, int, np.ndarray, bytes]] = field(default_factory=list)
    nbytes: int = 0


class HistoryStore:
    """Earlier responses per prompt key within ``budget_bytes`` (see the module docstring for the rules).

    ``max_responses``: per-prompt cap (>= 1). ``reward_weighted``: order by reward, then age (else age
    only). ``max_tokens_per_prompt``: the most tokens :meth:`get` returns for one prompt (the best
    responses first); bounds the insert work an engine takes on when the prompt starts (Sky-T1,
    bench_sam_history.py: 12K tokens cost 0.97 us per generated token, 32K 2.38 us, for 2.233 vs
    2.310 tokens per forward at k=5).
    """

    def __init__(
        self,
        budget_bytes: int,
        max_responses: int = 16,
        reward_weighted: bool = True,
        max_tokens_per_prompt: int = 1 << 14,
        await_rewards: bool = False,
        max_unrated: int = 64,
    ):
        if budget_bytes < 0:
            raise ValueError(f"budget_bytes={budget_bytes} must be >= 0 (0 keeps no history)")
        if max_responses < 1:
            raise ValueError(f"max_responses={max_responses} must be >= 1")
        if max_unrated < 1:
            raise ValueError(f"max_unrated={max_unrated} must be >= 1")
        self.budget_bytes = int(budget_bytes)
        self.max_responses = int(max_responses)
        self.reward_weighted = bool(reward_weighted)
        self.max_tokens_per_prompt = int(max_tokens_per_prompt)
        self.await_rewards = bool(await_rewards)
        self.max_unrated = int(max_unrated)
        self._prompts: OrderedDict[bytes, _Entry] = OrderedDict()
        self._seq = itertools.count()
        self.nbytes = 0
        self.evicted_prompts = 0
        self.replaced_responses = 0
        # ratings of responses not stored yet: prompt key -> [(length, digest, reward)], oldest key first
        self._early: OrderedDict[bytes, list[tuple[int, bytes, float]]] = OrderedDict()
        self._n_early = 0
        self.ratings = 0  # ratings received
        self.rated = 0  # ratings that found their response (at once, or when it arrived)
        self.early_dropped = 0  # ratings whose response never arrived within MAX_EARLY later ratings

    def __len__(self) -> int:
        return len(self._prompts)

    def __contains__(self, key: bytes) -> bool:
        return key in self._prompts

    def _weight(self, item: tuple) -> tuple[float, int]:
        reward = 0.0 if item[0] is None else item[0]
        return (reward, item[1]) if self.reward_weighted else (0.0, item[1])

    def add(self, key: bytes, tokens, reward: float | None = None) -> None:
        """Store one response (token ids, no prompt) of prompt ``key``; ``reward`` None counts as 0, or,
        with ``await_rewards``, leaves the response unrated until :meth:`rate_many` rates it."""
        tokens = np.array(tokens, dtype=np.int32, copy=True).reshape(-1)
        if self.budget_bytes == 0 or tokens.shape[0] == 0:
            return
        entry = self._prompts.get(key)
        if entry is None:
            entry = self._prompts[key] = _Entry()
        self._prompts.move_to_end(key)
        digest = response_digest(tokens)
        for i, (r, seq, old, dg) in enumerate(entry.responses):  # the same response again (every TP
            if dg == digest:  # rank sends it): keep one copy
                if reward is not None and (r is None or float(reward) > r):
                    entry.responses[i] = (float(reward), seq, old, dg)
                return
        if reward is None and not self.await_rewards:
            reward = 0.0
        item = (None if reward is None else float(reward), next(self._seq), tokens, digest)
        cost = tokens.nbytes + RESPONSE_OVERHEAD
        entry.responses.append(item)
        entry.nbytes += cost
        self.nbytes += cost
        if item[0] is None and key in self._early:
            self._apply_early(key, entry)
        self._trim(entry)
        self._fit()

    def _drop(self, entry: _Entry, i: int, replaced: bool = True) -> None:
        gone = entry.responses.pop(i)
        entry.nbytes -= gone[2].nbytes + RESPONSE_OVERHEAD
        self.nbytes -= gone[2].nbytes + RESPONSE_OVERHEAD
        self.replaced_responses += replaced

    def _trim(self, entry: _Entry) -> None:
        """The per-prompt caps: the weakest rated response over ``max_responses``, the oldest unrated
        one over ``max_unrated`` (a prompt holds at most ``max_responses + max_unrated``)."""
        rated = [i for i, r in enumerate(entry.responses) if r[0] is not None]
        while len(rated) > self.max_responses:
            weakest = min(rated, key=lambda i: self._weight(entry.responses[i]))
            self._drop(entry, weakest)
            rated = [i for i, r in enumerate(entry.responses) if r[0] is not None]
        unrated = [i for i, r in enumerate(entry.responses) if r[0] is None]
        while len(unrated) > self.max_unrated:
            self._drop(entry, min(unrated, key=lambda i: entry.responses[i][1]))
            unrated = [i for i, r in enumerate(entry.responses) if r[0] is None]

    def _fit(self) -> None:
        while self.nbytes > self.budget_bytes and self._prompts:
            _, old = self._prompts.popitem(last=False)
            self.nbytes -= old.nbytes
            self.evicted_prompts += 1

    def _match(self, entry: _Entry, length: int, digest: bytes) -> int | None:
        """The index of the stored response whose first ``length`` tokens have ``digest`` (an unrated one
        first), or None. An exact stored digest is checked before any prefix is hashed."""
        best = None
        for i, (r, _, tokens, dg) in enumerate(entry.responses):
            n = tokens.shape[0]
            if n < length:
                continue
            same = dg == digest if n == length else response_digest(tokens[:length]) == digest
            if same and r is None:
                return i
            if same and best is None:
                best = i
        return best

    def _rate(self, entry: _Entry, i: int, length: int, digest: bytes, reward: float) -> None:
        r, seq, tokens, dg = entry.responses[i]
        if tokens.shape[0] > length:  # the engine's copy ran past the response: keep the response only
            cut = tokens[:length].copy()
            entry.nbytes -= tokens.nbytes - cut.nbytes
            self.nbytes -= tokens.nbytes - cut.nbytes
            tokens, dg = cut, digest
        kept = entry.responses[i] = (reward if r is None else max(r, reward), seq, tokens, dg)
        self.rated += 1
        for j in range(len(entry.responses) - 1, -1, -1):  # the cut copy may equal another stored one
            if entry.responses[j] is not kept and entry.responses[j][3] == dg:
                self._drop(entry, j, replaced=False)

    def _apply_early(self, key: bytes, entry: _Entry) -> None:
        waiting = self._early[key]
        keep = []
        for length, digest, reward in waiting:
            i = self._match(entry, length, digest)
            if i is None:
                keep.append((length, digest, reward))
            else:
                self._rate(entry, i, length, digest, reward)
        self._n_early -= len(waiting) - len(keep)
        if keep:
            self._early[key] = keep
        else:
            del self._early[key]

    def rate_many(self, items: list[tuple[bytes, int, bytes, float]]) -> None:
        """Give stored responses their rewards: ``items`` are :func:`rating` tuples (prompt key, length,
        digest of the response's tokens, reward). A rated response keeps its best reward; one cut by the
        per-prompt cap or the budget is gone, and its rating is counted in ``ratings`` only; a rating
        whose response has not arrived waits for it (see the module docstring)."""
        touched = {}
        for key, length, digest, reward in items:
            self.ratings += 1
            entry = self._prompts.get(key)
            i = None if entry is None else self._match(entry, int(length), digest)
            if i is not None:
                self._rate(entry, i, int(length), digest, float(reward))
                touched[key] = entry
                continue
            self._early.setdefault(key, []).append((int(length), digest, float(reward)))
            self._early.move_to_end(key)
            self._n_early += 1
            while self._n_early > MAX_EARLY:
                _, gone = self._early.popitem(last=False)
                self._n_early -= len(gone)
                self.early_dropped += len(gone)
        for entry in touched.values():
            self._trim(entry)

    def add_many(self, items: list[tuple[bytes, np.ndarray, float | None]]) -> None:
        """:meth:`add` for several (key, tokens, reward) (one round trip when the store is an actor)."""
        for key, tokens, reward in items:
            self.add(key, tokens, reward)

    def get(self, key: bytes, digests: bool = False) -> list:
        """Prompt ``key``'s responses, weakest first and best last, at most ``max_tokens_per_prompt``
        tokens in all: the best first, the one that crosses the cap cut to its opening tokens, the
        rest left out; [] when none. Marks the prompt as used. ``digests``: (digest of the whole
        response, tokens) pairs instead of arrays, so that a drafter skips what its group already
        holds, a cut response included, without hashing on the engine."""
        entry = self._prompts.get(key)
        if entry is None:
            return []
        self._prompts.move_to_end(key)
        ranked = sorted(entry.responses, key=self._weight, reverse=True)
        out, total = [], 0
        for _, _, tokens, digest in ranked:
            room = self.max_tokens_per_prompt - total
            if room <= 0:
                break
            out.append((digest, tokens[:room]) if digests else tokens[:room])
            total += min(room, tokens.shape[0])
        return out[::-1]

    def get_many(self, keys: list[bytes], digests: bool = False) -> list[list]:
        """:meth:`get` for several keys (one round trip when the store is an actor)."""
        return [self.get(k, digests) for k in keys]

    def stats(self) -> dict:
        """Prompts, responses, bytes, evictions."""
        return {
            "prompts": len(self._prompts),
            "responses": sum(len(e.responses) for e in self._prompts.values()),
            "nbytes": self.nbytes,
            "budget_bytes": self.budget_bytes,
            "evicted_prompts": self.evicted_prompts,
            "replaced_responses": self.replaced_responses,
            "unrated": sum(r[0] is None for e in self._prompts.values() for r in e.responses),
            "ratings": self.ratings,
            "rated": self.rated,
            "ratings_waiting": self._n_early,
            "ratings_dropped": self.early_dropped,
        }


def actor_name(scope: str, model: str, history_bytes: int) -> str:
    """The name of the history actor that engines of ``model`` with ``sam_history_scope`` ``scope`` (the
    resolved one: the Ray job's when the key is unset) and a history budget of ``history_bytes`` share:
    :data:`ACTOR_NAME` plus a digest of the three. The engine (its proposer) and the trainer (which
    sends the rewards, :mod:`npu_rl.spec_decode.rewards`) both name it with this."""
    key = f"{scope}\0{model}\0{history_bytes}"
    return f"{ACTOR_NAME}.{hashlib.blake2b(key.encode(), digest_size=6).hexdigest()}"


class LocalHistory:
    """The drafter's view of an in-process :class:`HistoryStore` (same interface as :class:`RayHistory`)."""

    where = "in-process (this engine only)"

    def __init__(self, store: HistoryStore):
        self.store = store

    def add(self, key: bytes, tokens, reward: float | None = None) -> None:
        self.store.add(key, tokens, reward)

    def prefetch(self, keys: list[bytes]):
        """A handle for :meth:`poll` of the lookup of ``keys`` (here: the answers themselves): per
        key, (digest, tokens) per response as :meth:`HistoryStore.get` with ``digests=True``."""
        return self.store.get_many(keys, True)

    def flush(self) -> None:
        """Nothing buffered here."""

    def poll(self, handle) -> list[list[tuple[bytes, np.ndarray]]] | None:
        """The (digest, tokens) responses per key once ready, else None (never blocks)."""
        return handle


class RayHistory:
    """A cluster-wide :class:`HistoryStore` in a named Ray actor (get-or-create by name).

    ``add`` buffers, :meth:`flush` (once per engine step, from the drafter's ``tick``) sends the
    buffer in one fire-and-forget call; ``prefetch`` starts one lookup for the step's new prompts
    and ``poll`` returns its answer only once it has arrived (``ray.wait`` with timeout 0), so no
    engine step blocks on the actor.

    Lifetime: the actor is not detached. The first engine process to start creates it and owns it,
    later ones reuse it by name, and it dies with its owner, so it ends with the job (on a
    long-lived cluster, a detached store would outlive the job, keep its memory, and hand its
    history and settings to the next job). ``scope`` goes into the name (the proposer passes a
    digest of ``sam_history_scope``, by default the Ray job, the model and the history budget), so
    concurrent jobs on one cluster keep apart stores.

    Failures never raise into the engine step:

    - the actor died (``ActorDiedError``, or any other ``RayActorError``; its owner went first): the
      first call to notice logs it once and gets or creates the actor of that name (history starts
      again); the sends that had not been stored go to the new actor, the lookups in flight answer
      "no history";
    - the actor is unreachable for a while (``ActorUnavailableError``: the call may or may not have
      run): no restart; a send is tried again at the next flush, at most :data:`SEND_TRIES` times
      in all (the store keeps one copy of a response sent twice), a lookup answers "no history";
    - any other failure of a send (the actor's task raised, out of memory): that batch is lost.

    At most :data:`MAX_PENDING` sends are in flight; past that, new responses wait in the buffer,
    and past :data:`MAX_BUFFERED` waiting responses the oldest are dropped. So every response is
    stored, in flight, waiting, or counted in ``lost_responses`` (logged at the first loss and at
    every 100th).
    """

    SEND_TRIES = 3
    MAX_PENDING = 64
    MAX_BUFFERED = 4096

    def __init__(
        self,
        budget_bytes: int,
        max_responses: int = 16,
        reward_weighted: bool = True,
        scope: str = "",
        await_rewards: bool = False,
    ):
        import ray

        self._ray = ray
        self.name = f"{ACTOR_NAME}.{scope}" if scope else ACTOR_NAME
        self.where = f"Ray actor {ACTOR_NAMESPACE}/{self.name} (every replica, ends with the job)"
        self._args = (budget_bytes, max_responses, reward_weighted)
        self._kwargs = {"await_rewards": await_rewards}
        self._cls = ray.remote(num_cpus=0)(HistoryStore)
        self.restarts = 0  # deaths noticed (each one replaced the actor)
        self.unavailable = 0  # calls that failed with ActorUnavailableError
        self.lost_responses = 0  # responses sent but never stored (tries spent, or the send failed)
        self._buffer: list = []
        # sends not yet seen to succeed: (ref, actor it went to, the batch, tries so far)
        self._pending: list[tuple[Any, Any, list, int]] = []
        self._losses = 0  # events that lost responses (the warning is said at the first and every 100th)
        self.actor = self._get_or_create()

    def _get_or_create(self):
        return self._cls.options(name=self.name, namespace=ACTOR_NAMESPACE, get_if_exists=True).remote(
            *self._args, **self._kwargs
        )

    def _warn(self, what: str) -> None:
        from npu_rl import worker_log

        worker_log(f"warning: SAM history store {ACTOR_NAMESPACE}/{self.name}: {what}")

    def _failed(self, err: BaseException, actor) -> bool:
        """Account for a call to ``actor`` that raised ``err`` (a ``RayError``); True when the call is
        worth trying again (the actor was unreachable, or it died and has been replaced)."""
        exc = self._ray.exceptions
        if isinstance(err, exc.ActorUnavailableError):
            self.unavailable += 1
            if self.unavailable == 1 or self.unavailable % 1000 == 0:
                self._warn(f"unreachable ({err!r:.200}); calls are tried again (seen {self.unavailable} times)")
            return True
        if isinstance(err, exc.RayActorError):
            if actor is self.actor:  # first to notice this death (other calls in flight to it fail too)
                self.restarts += 1
                self._warn(
                    f"died ({type(err).__name__}); getting or creating a new one, history starts again "
                    f"(restart {self.restarts})"
                )
                self.actor = self._get_or_create()
            return True
        return False

    def add(self, key: bytes, tokens, reward: float | None = None) -> None:
        self._buffer.append((key, np.ascontiguousarray(tokens, dtype=np.int32), reward))

    def flush(self) -> None:
        """Send the buffered responses (one call, not waited for). The earlier sends that have
        completed are checked first, without waiting: a failed one is sent again (see the class
        docstring), so a dead actor is noticed even while no lookup runs."""
        ray = self._ray
        again = []
        if self._pending:
            refs = [p[0] for p in self._pending]
            done = set(ray.wait(refs, num_returns=len(refs), timeout=0)[0])
            if done:
                still = []
                for ref, actor, batch, tries in self._pending:
                    if ref not in done:
                        still.append((ref, actor, batch, tries))
                        continue
                    try:
                        ray.get(ref)
                    except ray.exceptions.RayError as e:
                        if self._failed(e, actor) and tries < self.SEND_TRIES:
                            again.append((batch, tries))
                        else:
                            self._lose(len(batch), f"not stored after {tries} sends ({e!r:.200})")
                self._pending = still
        for batch, tries in again:  # they were in flight already: the cap below does not hold them back
            self._send(batch, tries + 1)
        if self._buffer and len(self._pending) < self.MAX_PENDING:
            self._send(self._buffer, 1)
            self._buffer = []
        elif len(self._buffer) > self.MAX_BUFFERED:
            drop = len(self._buffer) - self.MAX_BUFFERED
            del self._buffer[:drop]
            self._lose(drop, f"dropped unsent: {len(self._pending)} sends are still unanswered")

    def _send(self, batch: list, tries: int) -> None:
        self._pending.append((self.actor.add_many.remote(batch), self.actor, batch, tries))

    def _lose(self, n: int, why: str) -> None:
        self.lost_responses += n
        self._losses += 1
        if self._losses == 1 or self._losses % 100 == 0:
            self._warn(f"{n} responses {why}; {self.lost_responses} lost so far")

    def prefetch(self, keys: list[bytes]):
        """Start one lookup of ``keys``; the handle is for :meth:`poll`."""
        return self.actor.get_many.remote(keys, True), len(keys), self.actor

    def poll(self, handle) -> list[list[tuple[bytes, np.ndarray]]] | None:
        """The answer of :meth:`prefetch` once it has arrived, else None; no answers (one empty list per
        key) when the call failed (the actor died or was unreachable meanwhile)."""
        ref, n, actor = handle
        ready, _ = self._ray.wait([ref], timeout=0)
        if not ready:
            return None
        try:
            return self._ray.get(ready[0])
        except self._ray.exceptions.RayError as e:
            if not self._failed(e, actor):
                self._warn(f"a lookup failed ({e!r:.200})")
            return [[] for _ in range(n)]

    def stats(self) -> dict:
        """The store's :meth:`HistoryStore.stats` (blocks on the actor; for logs and tests, not the
        engine step), plus this client's ``restarts``, ``unavailable`` and ``lost_responses``."""
        self.flush()
        for attempt in range(self.SEND_TRIES + 1):
            actor = self.actor
            try:
                store = self._ray.get(actor.stats.remote())
                break
            except self._ray.exceptions.RayError as e:
                if not self._failed(e, actor) or attempt == self.SEND_TRIES:
                    raise
        return {
            **store,
            "restarts": self.restarts,
            "unavailable": self.unavailable,
            "lost_responses": self.lost_responses,
        }
