"""The dispatcher in the rollout simulator: a :mod:`npu_rl.sim` routing that runs :class:`DispatchPolicy`,
and a migration policy for the simulator's ``on_finish`` hook (issue 8 part 3, measured only).

:class:`DispatcherRouting` makes exactly the decisions the live dispatcher makes (same policy object),
with the simulator's clock instead of asyncio. The simulator asks a replica for work when it has a
free slot (``next_for``); the adapter then lets the policy place every request that fits (longest
predicted first, least predicted load), and hands the asking replica the head of its own list.

:class:`Migration` moves running sequences off the most loaded replica when another one has far
fewer: the sequence is aborted there and started elsewhere with its generated tokens appended to its
prompt (as verl's partial-rollout resume loop would), paying the re-prefill the simulator charges.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

from npu_rl.errors import NpuRlError
from npu_rl.rebalance.policy import DispatchPolicy
from npu_rl.rebalance.predictor import DEFAULT_KV_RATIO


class DispatcherRouting:
    """``npu_rl.sim`` routing backed by :class:`DispatchPolicy`.

    Args:
        max_num_seqs: slots per replica (the simulator's ``ReplicaConfig.max_num_seqs``).
        max_inflight: optional lower dispatcher cap per replica (``ROLLOUT_REBALANCE_MAX_INFLIGHT``).
        order, keep_groups, kv_ratio: as in :class:`DispatchPolicy`.
        use_predictions: use ``SimRequest.predicted_len``; otherwise every request gets ``prior_len``
            (then only the prompt length ranks them, as the live dispatcher does for unseen prompts).
        prior_len: length assumed for requests without a prediction (tokens).
    """

    def __init__(
        self,
        max_num_seqs: int,
        *,
        max_inflight: int | None = None,
        order: str = "longest",
        keep_groups: bool = False,
        kv_ratio: float = DEFAULT_KV_RATIO,
        use_predictions: bool = True,
        prior_len: float = 4096.0,
        kv_budget: float | None = None,
    ):
        if max_num_seqs < 1:
            raise NpuRlError(f"DispatcherRouting max_num_seqs={max_num_seqs}: must be >= 1")
        self.slots = min(max_num_seqs, max_inflight) if max_inflight else max_num_seqs
        self.order, self.keep_groups, self.kv_ratio = order, keep_groups, kv_ratio
        self.use_predictions, self.prior_len = use_predictions, prior_len
        self.kv_budget = kv_budget

    def reset(self, requests: Sequence[Any], n_replicas: int) -> None:
        self.policy = DispatchPolicy(
            {str(r): self.slots for r in range(n_replicas)},
            order=self.order,
            keep_groups=self.keep_groups,
            kv_ratio=self.kv_ratio,
            kv_budget=self.kv_budget,
        )
        self._req = {r.rid: r for r in requests}
        self._pending = deque(sorted(requests, key=lambda r: r.arrival_ms))
        self.queues: list[deque[int]] = [deque() for _ in range(n_replicas)]
        self.assignment: dict[int, int] = {}
        self._release(0.0)

    def _predicted(self, r: Any) -> float:
        if self.use_predictions and r.predicted_len is not None:
            return float(r.predicted_len)
        return self.prior_len

    def _submit(self, r: Any, now_ms: float, generated: int = 0) -> None:
        pred = max(self._predicted(r) - generated, 1.0)
        req = self.policy.make_request(
            str(r.rid), group=str(r.group), prompt_len=r.prompt_len + generated, predicted_len=pred
        )
        self.policy.submit(req, now_ms)

    def _release(self, now_ms: float) -> None:
        while self._pending and self._pending[0].arrival_ms <= now_ms:
            self._submit(self._pending.popleft(), now_ms)

    def next_for(self, replica: int, now_ms: float) -> int | None:
        self._release(now_ms)
        q = self.queues[replica]
        if not q:
            for req in self.policy.assign(now_ms):
                rid, r = int(req.request_id), int(req.target)
                self.queues[r].append(rid)
                self.assignment[rid] = r
        return q.popleft() if q else None

    def on_finish(self, rid: int, replica: int, now_ms: float) -> None:
        if str(rid) not in self.policy.inflight_ids():  # moved by the simulator itself (abort to a replica)
            return
        self.policy.finish(str(rid), now_ms, self._req[rid].response_len)

    def requeue(self, rid: int, now_ms: float, generated: int) -> None:
        self._submit(self._req[rid], now_ms, generated)


class Migration:
    """``on_finish`` hook of :func:`npu_rl.sim.simulate`: move running sequences from the replica with
    the most to the one with the fewest when the fewest is below ``ratio`` x the most.

    Moves half the difference, at most ``max_moves`` per event, each request at most once, preferring
    the sequences that generated the most so far (the long tail); the simulator charges their
    re-prefill (prompt + generated tokens) on the destination. ``min_gap_ms`` spaces migrations.
    ``moved`` counts the moved sequences, ``moved_tokens`` their generated tokens.
    """

    def __init__(self, *, ratio: float = 0.25, max_moves: int = 16, min_gap_ms: float = 5_000.0, min_running: int = 4):
        if not 0.0 < ratio < 1.0:
            raise NpuRlError(f"Migration ratio={ratio}: must be in (0, 1)")
        self.ratio, self.max_moves, self.min_gap_ms, self.min_running = ratio, max_moves, min_gap_ms, min_running
        self.moved = 0
        self.moved_tokens = 0
        self._last = -float("inf")
        self._done: set[int] = set()

    def __call__(self, state: Any) -> None:
        if state.now_ms - self._last < self.min_gap_ms:
            return
        counts = [len(state.running(r)) + len(state.waiting(r)) for r in range(state.n_replicas)]
        hi = max(range(len(counts)), key=counts.__getitem__)
        lo = min(range(len(counts)), key=counts.__getitem__)
        if counts[hi] < self.min_running or counts[lo] > self.ratio * counts[hi]:
            return
        k = min(self.max_moves, (counts[hi] - counts[lo]) // 2)
        cands = [rid for rid in state.running(hi) if rid not in self._done]
        cands.sort(key=state.generated, reverse=True)
        for rid in cands[:k]:
            self.moved_tokens += state.generated(rid)
            state.abort(rid, to_replica=lo)
            self._done.add(rid)
            self.moved += 1
        if cands[:k]:
            self._last = state.now_ms
