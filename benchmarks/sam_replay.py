"""Offline replay of real responses through speculative drafters: the verifier, the engine loop, adapters.

Used by ``benchmarks/bench_sam.py`` (issue 20, items 0 and 5) and tested by
``tests/test_bench_sam_replay_on_cpu.py``. No vLLM engine runs: each real response (token ids) is
the target model's output, and a **greedy-match verifier** stands in for vLLM's rejection sampler
at temperature 0: a forward pass with draft ``d`` accepts the longest prefix of ``d`` equal to the
true continuation and yields it plus one token from the target (vLLM's "accepted tokens per
forward" = 1 + accepted draft tokens; a pass without a draft yields 1).

**Concurrent replay** (:func:`replay_rounds`): the responses of a round (one RL step) are handed to
``E`` engines round-robin in batch order (verl's least-in-flight load balancer does this for a batch
submitted at once, so the siblings of a group land on different engines). Every request of an engine
starts in the same step and does one target forward pass per engine step, so siblings decode at the
same pace and finish at their real relative lengths. A request's draft for step ``s + 1`` is
computed after step ``s``, from what its engine's drafter holds then: its own tokens, the tokens of
every request on the same engine so far (live siblings, for drafters that use them), the responses
that finished there, and whatever history the drafter keeps across rounds. Engines keep their
drafter (and its corpus) from round to round; a round ends when every engine is done (a synchronous
RL step). The batch-size gate drafts only while the engine's running batch is at most ``gate``.

**Sequential replay** (``max_num_seqs=1``, one engine): the responses run one after another, each
seeing every earlier one as finished: an UPPER BOUND for corpus drafters (a real step decodes the
siblings at the same time), kept only as that.

Each request gets a unique id, as vLLM gives them (the replay of issue 6 reused one id for every
response, so the drafter's preemption-resume rule kept later responses out of the group corpus).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

EMPTY = np.empty(0, np.int32)


# ------------------------------------------------------------------------------------- the interface
class Drafter(Protocol):
    """What the replay needs from a drafter: one engine's speculative proposer, request by request.

    ``on_start(req_id, group_key, prompt)``: a request enters the engine (``group_key``: its prompt's
    identity, e.g. the dataset index); ``on_tokens(req_id, tokens)``: the tokens its last forward pass
    produced (every step, gated or not); ``propose(req_id, k)``: up to ``k`` draft tokens (int32
    array, maybe empty); ``feedback(req_id, accepted)``: how many draft tokens the last pass accepted;
    ``on_finish(req_id, reward)``: the request left the engine with this reward.
    """

    def on_start(self, req_id: str, group_key: int, prompt: np.ndarray) -> None: ...
    def on_tokens(self, req_id: str, tokens: np.ndarray) -> None: ...
    def propose(self, req_id: str, k: int) -> np.ndarray: ...
    def feedback(self, req_id: str, accepted: int) -> None: ...
    def on_finish(self, req_id: str, reward: float) -> None: ...


def accept(draft: Sequence[int], truth: np.ndarray, pos: int, k: int) -> int:
    """Draft tokens a greedy verifier accepts: the longest prefix of ``draft[:k]`` equal to
    ``truth[pos:]`` (at most ``len(truth) - pos``).

    >>> accept([5, 6, 9], np.array([1, 5, 6, 7]), 1, 3)
    2
    """
    m = min(len(draft), k, truth.shape[0] - pos)
    a = 0
    while a < m and draft[a] == truth[pos + a]:
        a += 1
    return a


# ------------------------------------------------------------------------------------------ requests
@dataclass
class Request:
    """One response to replay: ``truth`` is what the target generates after ``prompt``."""

    req_id: str
    group_key: int
    prompt: np.ndarray
    truth: np.ndarray
    capped: bool = False  # ran into the generation cap (a repetition loop): reported separately
    reward: float = 0.0
    pos: int = 0
    draft: np.ndarray = field(default_factory=lambda: EMPTY)


@dataclass
class Tally:
    """Counters of one response class (``capped`` or not), summed over requests and steps."""

    tokens: int = 0  # response tokens produced
    passes: int = 0  # target forward passes
    tail_tokens: int = 0  # ... in steps whose running batch was at most the gate
    tail_passes: int = 0
    draft_tokens: int = 0  # ... in passes that carried a non-empty draft
    draft_passes: int = 0
    responses: int = 0

    def add(self, other: Tally) -> None:
        for f in self.__dataclass_fields__:
            setattr(self, f, getattr(self, f) + getattr(other, f))

    def row(self) -> dict:
        """Tokens per forward pass overall, in the tail (batch <= gate) and over passes with a draft."""
        return {
            "tokens_per_pass": self.tokens / max(self.passes, 1),
            "tail_tokens_per_pass": self.tail_tokens / max(self.tail_passes, 1),
            "drafted_tokens_per_pass": self.draft_tokens / max(self.draft_passes, 1),
            "draft_fraction": self.draft_passes / max(self.passes, 1),
            "tail_fraction": self.tail_passes / max(self.passes, 1),
            "tokens": self.tokens,
            "passes": self.passes,
            "responses": self.responses,
        }


@dataclass
class Stats:
    """One replay's outcome: a tally per response class and the drafter's CPU time."""

    uncapped: Tally = field(default_factory=Tally)
    capped: Tally = field(default_factory=Tally)
    ns: int = 0  # thread CPU time inside drafter calls
    calls: int = 0  # propose calls
    engine_steps: int = 0
    peak_bytes: int = 0  # largest drafter memory seen at a round's end (where the drafter reports it)

    @property
    def all(self) -> Tally:
        t = Tally()
        t.add(self.uncapped)
        t.add(self.capped)
        return t


# ----------------------------------------------------------------------------------------- the loop
def run_engine(drafter: Drafter, requests: list[Request], k: int, gate: int, max_num_seqs: int, stats: Stats) -> None:
    """Decode ``requests`` on one engine whose proposer is ``drafter`` (see the module docstring).

    Requests are admitted in order while fewer than ``max_num_seqs`` run; an admitted request's
    first pass (the prefill) has no draft. After every step: the new tokens of every running request
    go to the drafter, then the finished ones leave (``on_finish``), then the drafter's optional
    ``end_step()`` runs (per-step maintenance), then, if the batch that runs
    next has at most ``gate`` requests, each remaining request gets a draft of up to ``k`` tokens.
    """
    clock = time.thread_time_ns
    end_step = getattr(drafter, "end_step", None)  # optional: once per engine step (maintenance)
    waiting = list(reversed(requests))
    running: list[Request] = []
    ns = calls = 0
    while waiting or running:
        while waiting and len(running) < max_num_seqs:
            r = waiting.pop()
            r.pos, r.draft = 0, EMPTY
            t0 = clock()
            drafter.on_start(r.req_id, r.group_key, r.prompt)
            ns += clock() - t0
            running.append(r)
        tail = len(running) <= gate
        stats.engine_steps += 1
        produced, accepted = [], []
        for r in running:  # the forward pass of every running request
            truth, draft = r.truth, r.draft
            a = accept(draft, truth, r.pos, k) if draft.shape[0] else 0
            step = min(a + 1, truth.shape[0] - r.pos)
            new = truth[r.pos : r.pos + step]
            r.pos += step
            t = stats.capped if r.capped else stats.uncapped
            t.tokens += step
            t.passes += 1
            if tail:
                t.tail_tokens += step
                t.tail_passes += 1
            if draft.shape[0]:
                t.draft_tokens += step
                t.draft_passes += 1
            produced.append(new)
            accepted.append(a)
        t0 = clock()
        for r, new, a in zip(running, produced, accepted, strict=True):
            if r.draft.shape[0]:
                drafter.feedback(r.req_id, a)
            drafter.on_tokens(r.req_id, new)
        still = []
        for r in running:
            if r.pos >= r.truth.shape[0]:
                drafter.on_finish(r.req_id, r.reward)
                (stats.capped if r.capped else stats.uncapped).responses += 1
            else:
                still.append(r)
        running = still
        if end_step is not None:
            end_step()
        nxt = len(running) + min(len(waiting), max_num_seqs - len(running))
        if nxt <= gate:
            for r in running:
                r.draft = drafter.propose(r.req_id, k)
            calls += len(running)
        else:
            for r in running:
                r.draft = EMPTY
        ns += clock() - t0
    stats.ns += ns
    stats.calls += calls


def replay_rounds(
    make_drafter: Callable[[int], Drafter],
    rounds: list[list[Request]],
    k: int,
    engines: int,
    gate: int,
    max_num_seqs: int = 1 << 30,
    end_round: Callable[[], None] | None = None,
    nbytes: Callable[[Drafter], int] | None = None,
    by_prompt: bool = False,
    rotate: bool = False,
) -> Stats:
    """Replay ``rounds`` (one list of requests per RL step) on ``engines`` engines; see the module doc.

    ``make_drafter(engine_index)`` builds each engine's drafter once; the drafters persist across
    rounds. Within a round, request ``i`` goes to engine ``i % engines`` (round-robin in batch
    order), or with ``by_prompt`` to engine ``group_key % engines`` (a prompt-affine router: every
    sibling, and the prompt in every round, on one engine); with ``rotate`` as well, to engine
    ``(group_key + round) % engines`` (a group's siblings together, a prompt's rounds on different
    engines: rollout rebalance's ``ROLLOUT_REBALANCE_KEEP_GROUPS=1``). ``end_round`` is called after every
    round (e.g. to publish a history store); ``nbytes`` reads a drafter's memory, whose maximum at a
    round's end is ``Stats.peak_bytes``.
    Raises ValueError on a non-positive ``engines``, ``k`` or ``max_num_seqs``.
    """
    if engines < 1 or k < 1 or max_num_seqs < 1:
        raise ValueError(f"engines={engines}, k={k}, max_num_seqs={max_num_seqs}: each must be >= 1")
    drafters = [make_drafter(e) for e in range(engines)]
    stats = Stats()
    for t, reqs in enumerate(rounds):
        shift = t if rotate else 0
        for e, d in enumerate(drafters):
            mine = [r for r in reqs if (r.group_key + shift) % engines == e] if by_prompt else reqs[e::engines]
            run_engine(d, mine, k, gate, max_num_seqs, stats)
        if end_round is not None:
            end_round()
        if nbytes is not None:
            stats.peak_bytes = max(stats.peak_bytes, max(nbytes(d) for d in drafters))
    return stats
