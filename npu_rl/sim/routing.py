"""Request routing policies for the rollout simulator (the pull interface :func:`npu_rl.sim.simulate` calls).

A routing decides which waiting request a replica starts next. The simulator calls:

- ``reset(requests, n_replicas)`` once before the step;
- ``next_for(replica, now_ms) -> rid | None`` whenever ``replica`` has a free slot (fewer than
  ``max_num_seqs`` running) and no request already waiting in its own engine queue; the returned request
  becomes the replica's (it waits there until its KV fits, as in vLLM). Return None when nothing is
  available for that replica now;
- ``on_finish(rid, replica, now_ms)`` whenever a request leaves a replica (finished, truncated or aborted);
- ``requeue(rid, now_ms, generated)`` (optional) when a policy aborts a running request and hands it back to
  the routing without naming a target replica; ``generated`` tokens are appended to its prompt.
"""

from __future__ import annotations

import heapq
import random as pyrandom
from collections import deque
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from npu_rl.sim.model import SimError, SimRequest


@runtime_checkable
class Routing(Protocol):
    """The pull interface the simulator drives (see the module docstring for when each call happens)."""

    def reset(self, requests: Sequence[SimRequest], n_replicas: int) -> None: ...

    def next_for(self, replica: int, now_ms: float) -> int | None: ...

    def on_finish(self, rid: int, replica: int, now_ms: float) -> None: ...


def _torch_chunk_sizes(n: int, chunks: int) -> list[int]:
    """Sizes ``torch.chunk`` / ``TensorDict.chunk`` gives: ceil(n/chunks) each, the last smaller, maybe fewer."""
    if n == 0:
        return []
    size = -(-n // chunks)
    sizes = [size] * (n // size)
    if n % size:
        sizes.append(n % size)
    return sizes


class VerlDefaultRouting:
    """verl 0.9.1's request path: the whole batch pushed at once, least-in-flight replica per request, FIFO.

    Modelled on the pinned sources (``sources/verl``):

    - ``verl/trainer/ppo/v1/agent_loop_tq.py:AgentLoopManagerTQ.generate_sequences`` splits the step's
      prompts by count over the agent-loop workers (``TensorDict.chunk``: ceil-sized chunks, in batch order;
      the legacy ``verl/experimental/agent_loop/agent_loop.py:AgentLoopManager.generate_sequences`` does the
      same with ``DataProto.chunk`` on the n-times-repeated batch), ``rollout.agent.num_workers`` = 8.
    - ``AgentLoopWorkerTQ.generate_sequences`` / ``_run_prompt`` start, per prompt in order, its n sessions:
      within a worker, requests reach the load balancer prompt-major. The workers run concurrently, so the
      global order is an interleaving of the workers' orders: ``interleave="random"`` (default, seeded),
      ``"round_robin"`` or ``"sequential"``.
    - ``verl/workers/rollout/router.py:GlobalRequestLoadBalancer.acquire_server`` picks the server with
      the fewest in-flight requests, ties broken by ``random.choice`` over them in registration order
      (verl 0.9.0 took the first, ``candidates[0]``: ``ties="first"``), and counts the request in flight
      until ``release_server`` after the response returns. All acquisitions of a step happen before the
      first response, so every round of ``n_replicas`` arrivals covers each replica once, in random order.
      The tie-breaker is ``random.Random(seed)``: the same sequence verl's module-level ``random`` gives
      after ``random.seed(seed)``.
    - Each replica's vLLM engine serves its requests FIFO (``rollout.scheduling_policy: fcfs``).

    Requests with ``arrival_ms > 0`` are acquired when they arrive (in-flight counts as of then). A request
    handed back with :meth:`requeue` is acquired again by least in-flight (verl's sticky session would
    send a resumed request back to its server; a requeue exists to move it, so the sticky cache is not
    modelled). ``assignment`` maps rid to replica.
    """

    def __init__(self, num_workers: int = 8, interleave: str = "random", seed: int = 0, ties: str = "random"):
        if ties not in ("random", "first"):
            raise SimError(f"VerlDefaultRouting ties={ties!r}: use 'random' (verl 0.9.1) or 'first' (verl 0.9.0)")
        self.ties = ties
        if num_workers < 1:
            raise SimError(f"VerlDefaultRouting num_workers={num_workers}: must be >= 1 (rollout.agent.num_workers)")
        if interleave not in ("random", "round_robin", "sequential"):
            raise SimError(f"VerlDefaultRouting interleave={interleave!r}: use 'random', 'round_robin' or 'sequential'")
        self.num_workers = num_workers
        self.interleave = interleave
        self.seed = seed

    def arrival_order(self, requests: Sequence[SimRequest]) -> list[int]:
        """The rids in the order they reach the load balancer (see the class docstring)."""
        groups: dict[int, list[int]] = {}
        for r in sorted(requests, key=lambda r: r.arrival_ms):  # stable: batch order within a time
            groups.setdefault(r.group, []).append(r.rid)
        prompts = list(groups.values())
        streams: list[list[int]] = []
        start = 0
        for size in _torch_chunk_sizes(len(prompts), self.num_workers):
            streams.append([rid for g in prompts[start : start + size] for rid in g])
            start += size
        if self.interleave == "sequential":
            return [rid for s in streams for rid in s]
        if self.interleave == "round_robin":
            out, queues = [], [deque(s) for s in streams]
            while any(queues):
                for q in queues:
                    if q:
                        out.append(q.popleft())
            return out
        rng = np.random.default_rng(self.seed)
        owner = np.concatenate([np.full(len(s), w) for w, s in enumerate(streams)]) if streams else np.array([])
        rng.shuffle(owner)  # a uniformly random interleaving that keeps each worker's own order
        its = [iter(s) for s in streams]
        return [next(its[int(w)]) for w in owner]

    def reset(self, requests: Sequence[SimRequest], n_replicas: int) -> None:
        self.n_replicas = n_replicas
        self._req = {r.rid: r for r in requests}
        order = self.arrival_order(requests)
        # arrivals processed lazily in (arrival_ms, order) order
        self._pending = deque(sorted(order, key=lambda rid: self._req[rid].arrival_ms))
        self.inflight = [0] * n_replicas
        self.queues: list[deque[int]] = [deque() for _ in range(n_replicas)]
        self.assignment: dict[int, int] = {}
        self._tie_rng = pyrandom.Random(self.seed)
        self._acquire_arrived(0.0)

    def _acquire(self, rid: int) -> None:
        counts = self.inflight
        low = min(counts)
        candidates = [i for i, c in enumerate(counts) if c == low]  # fewest in flight
        server = candidates[0] if self.ties == "first" else self._tie_rng.choice(candidates)
        counts[server] += 1
        self.assignment[rid] = server
        self.queues[server].append(rid)

    def _acquire_arrived(self, now_ms: float) -> None:
        while self._pending and self._req[self._pending[0]].arrival_ms <= now_ms:
            self._acquire(self._pending.popleft())

    def next_for(self, replica: int, now_ms: float) -> int | None:
        self._acquire_arrived(now_ms)
        q = self.queues[replica]
        return q.popleft() if q else None

    def on_finish(self, rid: int, replica: int, now_ms: float) -> None:
        if self.inflight[replica] > 0:
            self.inflight[replica] -= 1

    def requeue(self, rid: int, now_ms: float, generated: int) -> None:
        self._acquire(rid)


class PullRouting:
    """One global queue; a replica takes the next request when it has a free slot (on-demand dispatch).

    ``key(request) -> sortable`` orders the queue (smallest first; ties keep batch order). Default: longest
    predicted first (``-predicted_len``) when every request has a prediction, otherwise FIFO (batch order).
    A requeued request goes back into the queue with key ``key(request)`` (its prediction is not reduced
    by what it already generated unless ``key`` does so via ``self.generated``).
    """

    def __init__(self, key: Callable[[SimRequest], object] | None = None):
        self.key = key

    @staticmethod
    def longest_predicted_first(r: SimRequest) -> float:
        """Key: longest ``predicted_len`` first (requires a prediction on every request)."""
        if r.predicted_len is None:
            raise SimError(f"request {r.rid} has no predicted_len: longest-predicted-first needs one on every request")
        return -float(r.predicted_len)

    @staticmethod
    def fifo(r: SimRequest) -> float:
        """Key: batch order (first come, first served)."""
        return 0.0

    def reset(self, requests: Sequence[SimRequest], n_replicas: int) -> None:
        reqs = list(requests)
        key = self.key
        if key is None:
            if reqs and all(r.predicted_len is not None for r in reqs):
                key = self.longest_predicted_first
            else:
                key = self.fifo  # the sequence number keeps batch order
        self._key = key
        self._req = {r.rid: r for r in reqs}
        self.generated: dict[int, int] = {}
        self._seq = 0
        self._heap: list = []
        self._pending = deque(sorted(reqs, key=lambda r: r.arrival_ms))  # stable
        self.admission_order: list[int] = []
        self._release(0.0)

    def _push(self, r: SimRequest) -> None:
        heapq.heappush(self._heap, (self._key(r), self._seq, r.rid))
        self._seq += 1

    def _release(self, now_ms: float) -> None:
        while self._pending and self._pending[0].arrival_ms <= now_ms:
            self._push(self._pending.popleft())

    def next_for(self, replica: int, now_ms: float) -> int | None:
        self._release(now_ms)
        if not self._heap:
            return None
        rid = heapq.heappop(self._heap)[2]
        self.admission_order.append(rid)
        return rid

    def on_finish(self, rid: int, replica: int, now_ms: float) -> None:
        pass

    def requeue(self, rid: int, now_ms: float, generated: int) -> None:
        self.generated[rid] = generated
        self._push(self._req[rid])
