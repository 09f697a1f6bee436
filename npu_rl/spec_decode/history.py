"""History corpus of the SAM drafter (issue 20, item 1): earlier rounds' responses, per prompt.

:class:`HistoryStore` keeps raw response token ids (int32, 4 B per token: the automata are built only
in the engine that serves the prompt, incrementally, see :class:`npu_rl.spec_decode.corpus.SamDrafter`)
per prompt key, with

- a cap in bytes over all prompts (``budget_bytes``; token bytes plus a fixed 64 B per response);
- per prompt at most ``max_responses`` responses: a new response replaces the prompt's *weakest*
  one, the lowest ``(reward, age)``: lowest reward first (``None`` counts as 0), oldest among equals;
- eviction over the cap: whole prompts, least recently used (added to or read) first.

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
ACTOR_NAME = "npu_rl_sam_history"
ACTOR_NAMESPACE = "npu_rl"


def response_digest(tokens) -> bytes:
    """16-byte BLAKE2b digest of a response's int32 token ids: its identity in the store and in a
    drafter's group (the store computes it once at :meth:`HistoryStore.add`, off the engine)."""
    return hashlib.blake2b(np.ascontiguousarray(tokens, np.int32).tobytes(), digest_size=16).digest()


@dataclass
class _Entry:
    # (reward, seq, tokens, digest of the whole response)
    responses: list[tuple[float, int, np.ndarray, bytes]] = field(default_factory=list)
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
    ):
        if budget_bytes < 0:
            raise ValueError(f"budget_bytes={budget_bytes} must be >= 0 (0 keeps no history)")
        if max_responses < 1:
            raise ValueError(f"max_responses={max_responses} must be >= 1")
        self.budget_bytes = int(budget_bytes)
        self.max_responses = int(max_responses)
        self.reward_weighted = bool(reward_weighted)
        self.max_tokens_per_prompt = int(max_tokens_per_prompt)
        self._prompts: OrderedDict[bytes, _Entry] = OrderedDict()
        self._seq = itertools.count()
        self.nbytes = 0
        self.evicted_prompts = 0
        self.replaced_responses = 0

    def __len__(self) -> int:
        return len(self._prompts)

    def __contains__(self, key: bytes) -> bool:
        return key in self._prompts

    def _weight(self, item: tuple[float, int, np.ndarray]) -> tuple[float, int]:
        return (item[0], item[1]) if self.reward_weighted else (0.0, item[1])

    def add(self, key: bytes, tokens, reward: float | None = None) -> None:
        """Store one response (token ids, no prompt) of prompt ``key``; ``reward`` None counts as 0."""
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
                if reward is not None and float(reward) > r:
                    entry.responses[i] = (float(reward), seq, old, dg)
                return
        item = (0.0 if reward is None else float(reward), next(self._seq), tokens, digest)
        cost = tokens.nbytes + RESPONSE_OVERHEAD
        entry.responses.append(item)
        entry.nbytes += cost
        self.nbytes += cost
        if len(entry.responses) > self.max_responses:
            weakest = min(range(len(entry.responses)), key=lambda i: self._weight(entry.responses[i]))
            gone = entry.responses.pop(weakest)
            entry.nbytes -= gone[2].nbytes + RESPONSE_OVERHEAD
            self.nbytes -= gone[2].nbytes + RESPONSE_OVERHEAD
            self.replaced_responses += 1
        while self.nbytes > self.budget_bytes and self._prompts:
            _, old = self._prompts.popitem(last=False)
            self.nbytes -= old.nbytes
            self.evicted_prompts += 1

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
        }


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

    def __init__(self, budget_bytes: int, max_responses: int = 16, reward_weighted: bool = True, scope: str = ""):
        import ray

        self._ray = ray
        self.name = f"{ACTOR_NAME}.{scope}" if scope else ACTOR_NAME
        self.where = f"Ray actor {ACTOR_NAMESPACE}/{self.name} (every replica, ends with the job)"
        self._args = (budget_bytes, max_responses, reward_weighted)
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
        return self._cls.options(name=self.name, namespace=ACTOR_NAMESPACE, get_if_exists=True).remote(*self._args)

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
