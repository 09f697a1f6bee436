"""The dispatch policy: which waiting request goes to which rollout target, and when.

Pure and synchronous (no asyncio, no Ray, no clock of its own), so the same object drives the live
dispatcher (:mod:`npu_rl.rebalance.dispatcher`) and the simulator adapter used by the benchmark.

A *target* is one place vLLM runs a request: a replica (one ``vLLMHttpServer``) or, when one replica
holds several data-parallel ranks, one DP rank of it (vLLM's ``AsyncLLM.generate(...,
data_parallel_rank=r)``). Each has a capacity (``max_num_seqs``, or a lower dispatcher cap).

Rules, in order:

1. **On demand.** A request is released only when a target has a free slot; nothing queues inside a
   replica, so a request never waits behind another replica's backlog.
2. **Longest predicted first.** Waiting requests leave in decreasing predicted work
   (:func:`~npu_rl.rebalance.predictor.predicted_work`), arrival order breaking ties; ``order="fifo"``
   keeps arrival order (the pull-only baseline).
3. **Least predicted load.** Among targets with a free slot, the one with the least predicted work in
   flight gets it (LPT list scheduling: Graham 1969, 4/3-approximation of the makespan).
4. **Affinity.** A request that names a target (a later turn of a multi-turn request, verl's sticky
   session) waits for that target. With ``keep_groups`` the n samples of a prompt follow the first
   one to its target (prefix-cache reuse).
5. **Failures.** A failed request goes back to the queue with its place in the order; a target with
   ``max_target_failures`` consecutive failures stops receiving work until :meth:`add_target` or
   :meth:`restore_target`. Requests are never dropped silently: the caller gives up after its own
   retry budget.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field

from npu_rl.errors import NpuRlError
from npu_rl.rebalance.predictor import DEFAULT_KV_RATIO, predicted_work

ORDERS = ("longest", "fifo")


@dataclass
class Pending:
    """One request known to the policy (waiting or in flight)."""

    request_id: str
    group: str
    prompt_len: int
    predicted_len: float
    work: float
    seq: int
    affinity: str | None = None
    attempts: int = 0
    target: str | None = None
    t_submit: float = 0.0
    t_start: float = 0.0


@dataclass
class TargetState:
    """Slots, health and per-step accounting of one target."""

    name: str
    capacity: int
    inflight: dict[str, Pending] = field(default_factory=dict)
    load: float = 0.0
    kv: float = 0.0  # predicted peak KV tokens of the requests in flight (prompt + predicted response)
    healthy: bool = True
    failures: int = 0
    busy_since: float | None = None
    busy_s: float = 0.0
    requests: int = 0
    predicted_tokens: float = 0.0
    actual_tokens: float = 0.0
    predicted_work: float = 0.0
    actual_work: float = 0.0

    @property
    def free(self) -> int:
        return self.capacity - len(self.inflight) if self.healthy else 0


@dataclass
class StepStats:
    """Accounting of one burst of requests (a generation step): from the first request into an idle
    dispatcher until it is idle again. Times are in the caller's clock units (seconds live)."""

    t_begin: float
    t_end: float = 0.0
    per_target: dict[str, dict[str, float]] = field(default_factory=dict)
    pairs: list[tuple[float, float]] = field(default_factory=list)  # (predicted, actual) response length
    retries: int = 0
    failed_targets: list[str] = field(default_factory=list)

    def metrics(self, prefix: str = "rollout_rebalance") -> dict[str, float]:
        """Flat per-step metrics: step time, per-target busy time / idle fraction / requests, and
        predicted vs actual work (sum and Pearson correlation of response lengths)."""
        span = max(self.t_end - self.t_begin, 1e-9)
        out: dict[str, float] = {f"{prefix}/step_s": span, f"{prefix}/retries": float(self.retries)}
        idles, reqs = [], []
        for name, acc in self.per_target.items():
            idle = 1.0 - min(acc["busy_s"] / span, 1.0)
            idles.append(idle)
            reqs.append(acc["requests"])
            out[f"{prefix}/{name}/busy_s"] = acc["busy_s"]
            out[f"{prefix}/{name}/idle_fraction"] = idle
            out[f"{prefix}/{name}/requests"] = acc["requests"]
            out[f"{prefix}/{name}/predicted_work"] = acc["predicted_work"]
            out[f"{prefix}/{name}/actual_work"] = acc["actual_work"]
        if idles:
            out[f"{prefix}/idle_fraction/mean"] = sum(idles) / len(idles)
            out[f"{prefix}/idle_fraction/max"] = max(idles)
            out[f"{prefix}/requests/min"] = float(min(reqs))
            out[f"{prefix}/requests/max"] = float(max(reqs))
        if self.pairs:
            p = [a for a, _ in self.pairs]
            y = [b for _, b in self.pairs]
            out[f"{prefix}/predicted_len/mean"] = sum(p) / len(p)
            out[f"{prefix}/actual_len/mean"] = sum(y) / len(y)
            out[f"{prefix}/predicted_actual_corr"] = _pearson(p, y)
        return out


def _pearson(x: list[float], y: list[float]) -> float:
    n = len(x)
    if n < 2:
        return 0.0
    mx, my = sum(x) / n, sum(y) / n
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y, strict=True))
    sxx = sum((a - mx) ** 2 for a in x)
    syy = sum((b - my) ** 2 for b in y)
    return sxy / (sxx * syy) ** 0.5 if sxx > 0 and syy > 0 else 0.0


class DispatchPolicy:
    """Pull-based, longest-predicted-first assignment of requests to targets (see module docstring).

    Args:
        targets: name -> capacity (slots, >= 1).
        order: "longest" (predicted work, descending) or "fifo" (arrival order).
        keep_groups: the samples of one prompt (same ``group``) go to the target of the first one.
        kv_ratio: t2/t1 of the decode cost model, weighs long responses (see ``predicted_work``).
        max_target_failures: consecutive failures after which a target gets no more work.

    Raises:
        NpuRlError: no targets, a capacity < 1, an unknown order, max_target_failures < 1.
    """

    def __init__(
        self,
        targets: Mapping[str, int],
        *,
        order: str = "longest",
        keep_groups: bool = False,
        kv_ratio: float = DEFAULT_KV_RATIO,
        max_target_failures: int = 3,
        kv_budget: float | None = None,
    ):
        if kv_budget is not None and kv_budget <= 0:
            raise NpuRlError(f"kv_budget must be > 0 tokens, got {kv_budget} (a simulator setting, no variable)")
        self.kv_budget = kv_budget
        if order not in ORDERS:
            raise NpuRlError(f"dispatch order {order!r} unknown: use one of {ORDERS} (ROLLOUT_REBALANCE_ORDER)")
        if max_target_failures < 1:
            raise NpuRlError(f"max_target_failures must be >= 1, got {max_target_failures}")
        self.order = order
        self.keep_groups = keep_groups
        self.kv_ratio = kv_ratio
        self.max_target_failures = max_target_failures
        self.targets: dict[str, TargetState] = {}
        for name, cap in targets.items():
            self.add_target(name, cap)
        self._heap: list[tuple[float, int, Pending]] = []
        self._waiting_ids: set[str] = set()
        self._seq = itertools.count()
        self._inflight: dict[str, Pending] = {}
        self._group_target: dict[str, str] = {}
        self.step: StepStats | None = None
        self.finished_steps: list[StepStats] = []
        self._new_steps: list[StepStats] = []

    # ----- targets
    def add_target(self, name: str, capacity: int) -> None:
        """Register (or re-enable) a target with ``capacity`` slots."""
        if capacity < 1:
            raise NpuRlError(f"target {name!r}: capacity must be >= 1, got {capacity} (max_num_seqs)")
        if name in self.targets:
            self.targets[name].capacity = capacity
            self.restore_target(name)
        else:
            self.targets[name] = TargetState(name, capacity)

    def remove_target(self, name: str) -> None:
        """Stop sending work to ``name`` (its in-flight requests finish or fail on their own)."""
        if name in self.targets:
            self.targets[name].healthy = False

    def restore_target(self, name: str) -> None:
        """Let a target that was marked failed receive work again."""
        st = self.targets[name]
        st.healthy, st.failures = True, 0

    def healthy_targets(self) -> list[str]:
        return [n for n, t in self.targets.items() if t.healthy]

    # ----- requests
    @property
    def waiting(self) -> int:
        return len(self._heap)

    @property
    def inflight(self) -> int:
        return len(self._inflight)

    def inflight_ids(self) -> set[str]:
        """Ids of the requests in flight (a view: do not modify)."""
        return self._inflight.keys()  # type: ignore[return-value]

    def idle(self) -> bool:
        return not self._heap and not self._inflight

    def make_request(
        self,
        request_id: str,
        *,
        group: str,
        prompt_len: int,
        predicted_len: float,
        affinity: str | None = None,
    ) -> Pending:
        """A request with its predicted work computed (not yet submitted)."""
        return Pending(
            request_id=request_id,
            group=group,
            prompt_len=int(prompt_len),
            predicted_len=float(predicted_len),
            work=predicted_work(float(predicted_len), float(prompt_len), self.kv_ratio),
            seq=next(self._seq),
            affinity=affinity,
        )

    def submit(self, req: Pending, now: float) -> None:
        """Queue ``req``; a duplicate id still waiting or in flight is an error (it would run twice)."""
        if req.request_id in self._inflight or req.request_id in self._waiting_ids:
            raise NpuRlError(f"request {req.request_id!r} submitted twice to the rollout dispatcher")
        if self.step is None:
            self.step = StepStats(t_begin=now)
        req.t_submit = now
        self._push(req)

    def _push(self, req: Pending) -> None:
        key = -req.work if self.order == "longest" else 0.0
        heapq.heappush(self._heap, (key, req.seq, req))
        self._waiting_ids.add(req.request_id)

    def _allowed(self, req: Pending) -> str | None:
        """The one target ``req`` must use, or None when any target will do."""
        if req.affinity is not None and req.affinity in self.targets and self.targets[req.affinity].healthy:
            return req.affinity
        if self.keep_groups:
            t = self._group_target.get(req.group)
            if t is not None and self.targets[t].healthy:
                return t
        return None

    @staticmethod
    def footprint(req: Pending) -> float:
        """Predicted peak KV tokens of a request: its prompt plus its predicted response."""
        return req.prompt_len + req.predicted_len

    def _fits(self, t: TargetState, req: Pending) -> bool:
        if t.free <= 0:
            return False
        if self.kv_budget is None or not t.inflight:
            return True
        return t.kv + self.footprint(req) <= self.kv_budget

    def assign(self, now: float) -> list[Pending]:
        """Release as many waiting requests as free slots (and, with ``kv_budget``, the targets'
        predicted KV room) allow; each returned request has ``target`` set and counts as in flight until
        :meth:`finish` or :meth:`fail`. Strict order: when the head request fits nowhere, the ones
        behind it wait too (long requests must not starve behind a stream of short ones)."""
        out: list[Pending] = []
        deferred: list[tuple[float, int, Pending]] = []
        while self._heap and any(t.free > 0 for t in self.targets.values()):
            item = heapq.heappop(self._heap)
            req = item[2]
            self._waiting_ids.discard(req.request_id)
            need = self._allowed(req)
            if need is not None:
                if not self._fits(self.targets[need], req):
                    deferred.append(item)
                    continue
                target = need
            else:
                fits = [t for t in self.targets.values() if self._fits(t, req)]
                if not fits:
                    deferred.append(item)
                    break
                target = min(fits, key=lambda t: (t.load, len(t.inflight))).name
            self._start(req, target, now)
            out.append(req)
        for item in deferred:
            heapq.heappush(self._heap, item)
            self._waiting_ids.add(item[2].request_id)
        return out

    def _start(self, req: Pending, target: str, now: float) -> None:
        st = self.targets[target]
        if not st.inflight:
            st.busy_since = now
        req.target, req.t_start = target, now
        st.inflight[req.request_id] = req
        st.load += req.work
        st.kv += self.footprint(req)
        self._inflight[req.request_id] = req
        if self.keep_groups:
            self._group_target.setdefault(req.group, target)

    def _stop(self, req: Pending, now: float) -> TargetState:
        st = self.targets[req.target]
        del st.inflight[req.request_id]
        del self._inflight[req.request_id]
        st.load = max(0.0, st.load - req.work) if st.inflight else 0.0
        st.kv = max(0.0, st.kv - self.footprint(req)) if st.inflight else 0.0
        if not st.inflight and st.busy_since is not None:
            st.busy_s += now - st.busy_since
            st.busy_since = None
        return st

    def finish(self, request_id: str, now: float, response_len: int | None = None) -> Pending:
        """Mark ``request_id`` done on its target; frees its slot.

        Raises:
            NpuRlError: the request is not in flight (released twice or never assigned).
        """
        req = self._inflight.get(request_id)
        if req is None:
            raise NpuRlError(f"request {request_id!r} released but not in flight in the rollout dispatcher")
        st = self._stop(req, now)
        st.failures = 0
        st.requests += 1
        st.predicted_tokens += req.predicted_len
        st.predicted_work += req.work
        if response_len is not None:
            st.actual_tokens += response_len
            st.actual_work += predicted_work(float(response_len), float(req.prompt_len), self.kv_ratio)
            if self.step is not None:
                self.step.pairs.append((req.predicted_len, float(response_len)))
        self._maybe_end_step(now)
        return req

    def fail(self, request_id: str, now: float, *, requeue: bool = True) -> Pending:
        """Mark ``request_id`` failed on its target. With ``requeue`` it waits again (same order key,
        no affinity to the failing target); a target that keeps failing is taken out of rotation."""
        req = self._inflight.get(request_id)
        if req is None:
            raise NpuRlError(f"request {request_id!r} failed but not in flight in the rollout dispatcher")
        st = self._stop(req, now)
        st.failures += 1
        if st.failures >= self.max_target_failures and st.healthy:
            st.healthy = False
            if self.step is not None:
                self.step.failed_targets.append(st.name)
        if self._group_target.get(req.group) == st.name:
            del self._group_target[req.group]
        req.attempts += 1
        if self.step is not None:
            self.step.retries += 1
        if requeue:
            if req.affinity == st.name:
                req.affinity = None
            req.target = None
            self._push(req)
        else:
            self._maybe_end_step(now)
        return req

    def cancel(self, request_id: str, now: float) -> Pending | None:
        """Drop a waiting request (its caller gave up); None when it is not waiting."""
        for i, (_, _, p) in enumerate(self._heap):
            if p.request_id == request_id:
                self._heap.pop(i)
                heapq.heapify(self._heap)
                self._waiting_ids.discard(request_id)
                self._maybe_end_step(now)
                return p
        return None

    def _maybe_end_step(self, now: float) -> None:
        if not self.idle() or self.step is None:
            return
        step, self.step = self.step, None
        step.t_end = now
        for name, st in self.targets.items():
            step.per_target[name] = {
                "busy_s": st.busy_s,
                "requests": float(st.requests),
                "predicted_work": st.predicted_work,
                "actual_work": st.actual_work,
                "predicted_tokens": st.predicted_tokens,
                "actual_tokens": st.actual_tokens,
            }
            st.busy_s = st.requests = 0
            st.predicted_tokens = st.actual_tokens = st.predicted_work = st.actual_work = 0.0
        self._group_target.clear()
        self.finished_steps.append(step)
        del self.finished_steps[:-64]
        self._new_steps.append(step)

    def drain_steps(self) -> list[StepStats]:
        """The steps that ended since the last call, oldest first."""
        out, self._new_steps = self._new_steps, []
        return out
