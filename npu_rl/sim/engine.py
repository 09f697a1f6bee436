"""Event-driven simulation of one rollout generation step (R replicas with continuous batching).

Model (one vLLM engine per replica; times in ms, see :class:`~npu_rl.sim.model.CostModel`):

- A replica runs decode iterations over its ``b`` running sequences; an iteration costs
  ``t0 + t1*b + t2*kv`` with ``kv`` the cached tokens of all of them (prompt + generated so far, the token
  being fed included). Every iteration adds one token to every running sequence.
- Admission (at iteration boundaries, FIFO from the replica's own queue, then from the routing; replicas
  at a boundary at the same moment, e.g. all at t=0, take one request each in turn, so a shared queue is
  dealt round-robin rather than drained by replica 0): a slot
  must be free (``b < max_num_seqs``) and the request's prompt + generated tokens (+1 for a fresh
  request's first token) must fit the KV budget. The admitted requests are prefilled in one lump that
  the replica spends before its next decode iteration (vLLM V1 mixes prefill chunks into decode steps;
  the lump slightly overstates their cost, negligible at RL prompt lengths). A fresh request's prefill
  samples its first token, so a response of L tokens needs L-1 decode iterations.
- KV exhaustion: before an iteration, if the running sequences' kv exceeds the budget, the most recently
  admitted running request is preempted by recompute (vLLM V1 ``Scheduler.schedule``), back to the head
  of the replica's queue, and nothing new is admitted at that boundary. On re-admission it re-prefills
  prompt + generated tokens and does not sample a token (vLLM samples one: we are pessimistic by at most
  one iteration per preemption, which keeps :func:`~npu_rl.sim.model.lower_bound` a true bound).
- Between events the running set is constant, so ``m`` iterations cost
  ``m*(t0+t1*b) + t2*(m*kv0 + b*m*(m-1)/2)`` (exact, no per-iteration loop). Events: a request finishes,
  the KV budget is reached, a request arrives, a policy aborts a request.
- Lockstep (expert parallelism): one global iteration counter; an iteration costs the max over the ranks
  that run sequences. Between events each rank's cost is linear in the iteration index, so the sum of
  the max is computed exactly from the upper envelope of at most R lines. A prefill lump costs the max
  over ranks of their own lumps.

Hooks: ``on_finish(state)`` is called at every boundary where requests finished, with a
:class:`SimState`: the policy may read running requests and generated tokens and ``abort`` (requeue,
generated tokens appended to the prompt, re-prefill cost) or ``truncate`` (finish now, tokens lost
recorded) running requests on any replica.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Sequence

import numpy as np

from npu_rl.sim.model import CostModel, ReplicaConfig, SimError, SimRequest, SimResult, lower_bound
from npu_rl.sim.routing import Routing

_PENDING, _WAITING, _RUNNING, _DONE = 0, 1, 2, 3


class _Replica:
    __slots__ = (
        "r",
        "clock",
        "it",
        "b",
        "kv",
        "heap",
        "order",
        "localq",
        "cached",
        "busy",
        "work",
        "iters",
        "tl_t",
        "tl_b",
        "version",
        "next_m",
        "next_t",
        "aborts",
    )

    def __init__(self, r: int):
        self.r = r
        self.clock = 0.0
        self.it = 0
        self.b = 0
        self.kv = 0
        self.heap: list = []  # (finish_iter, epoch, i)
        self.order: list = []  # (i, epoch) in admission order, for preemption
        self.localq: deque[int] = deque()
        self.cached: set[int] = set()
        self.busy = 0.0
        self.work = 0.0
        self.iters = 0
        self.tl_t = [0.0]
        self.tl_b = [0]
        self.version = 0
        self.next_m = 0
        self.next_t = math.inf
        self.aborts: list[tuple[int, str, int | None]] = []


def _sum_max_lines(a: list[float], s: list[float], m: int) -> float:
    """sum_{i=0}^{m-1} max_k (a[k] + s[k]*i), exactly, via the upper envelope (slopes s >= 0)."""
    total, i0 = 0.0, 0
    n = len(a)
    while i0 < m:
        best = max(range(n), key=lambda k: (a[k] + s[k] * i0, s[k]))
        ab, sb = a[best], s[best]
        nxt = m
        for k in range(n):
            if s[k] > sb:
                x = (ab - a[k]) / (s[k] - sb)  # line k is above from i > x
                sw = max(i0 + 1, math.floor(x) + 1)
                if sw < nxt:
                    nxt = sw
        cnt = nxt - i0
        total += cnt * ab + sb * (i0 + nxt - 1) * cnt / 2.0
        i0 = nxt
    return total


class SimState:
    """What an ``on_finish`` policy sees at a boundary, and its two actions.

    ``now_ms``: the boundary's time. ``replica``: the replica whose boundary it is (None in lockstep:
    all ranks). ``finished``: rids finished at this boundary. ``running(r)`` / ``waiting(r)``: rids running
    on / queued in replica r's engine. ``generated(rid)``: tokens generated so far (for a request on
    another replica, as of that replica's last completed iteration). ``n_finished`` / ``n_requests``.
    """

    def __init__(self, eng: _Engine, now_ms: float, replica: int | None, finished: list[int]):
        self._e = eng
        self.now_ms = now_ms
        self.replica = replica
        self.finished = finished

    @property
    def n_replicas(self) -> int:
        return len(self._e.reps)

    @property
    def n_requests(self) -> int:
        return len(self._e.reqs)

    @property
    def n_finished(self) -> int:
        return self._e.n_done

    def request(self, rid: int) -> SimRequest:
        return self._e.reqs[self._e.index(rid)]

    def replica_of(self, rid: int) -> int | None:
        i = self._e.index(rid)
        return self._e.rep_of[i] if self._e.status[i] in (_WAITING, _RUNNING) else None

    def running(self, replica: int) -> list[int]:
        e = self._e
        rep = e.reps[replica]
        return [e.reqs[i].rid for (_, ep, i) in rep.heap if e.status[i] == _RUNNING and e.epoch[i] == ep]

    def waiting(self, replica: int) -> list[int]:
        return [self._e.reqs[i].rid for i in self._e.reps[replica].localq]

    def generated(self, rid: int) -> int:
        e = self._e
        i = e.index(rid)
        if e.status[i] == _RUNNING:
            rep = e.reps[e.rep_of[i]]
            return e.gen_at(i, rep.it + e.iters_done(rep, self.now_ms))
        return e.gen[i]

    def abort(self, rid: int, to_replica: int | None = None) -> None:
        """Abort a running (or queued) request and start it again with its generated tokens appended to
        its prompt: on ``to_replica`` if given, else handed back to the routing's ``requeue``. The move
        takes effect at that replica's next iteration boundary at or after ``now_ms``."""
        self._e.request_abort(rid, "requeue", to_replica, self.now_ms)

    def truncate(self, rid: int) -> None:
        """Stop a running (or queued) request for good: it finishes with the tokens generated so far and
        ``tokens_lost`` records the rest (the long-tail guard's cut)."""
        self._e.request_abort(rid, "truncate", None, self.now_ms)


class _Engine:
    def __init__(self, reqs, cost, cfg, routing, on_finish, max_events):
        self.reqs: list[SimRequest] = reqs
        self.cost: CostModel = cost
        self.cfg: ReplicaConfig = cfg
        self.routing = routing
        self.on_finish = on_finish
        self.max_events = max_events
        n = len(reqs)
        self._idx = {r.rid: i for i, r in enumerate(reqs)}
        self.P = [r.prompt_len for r in reqs]
        self.L = [r.response_len for r in reqs]
        self.G = [r.group for r in reqs]
        self.status = [_PENDING] * n
        self.rep_of = [-1] * n
        self.gen = [0] * n
        self.adm_it = [0] * n
        self.adm_s = [0] * n
        self.epoch = [0] * n
        self.admit_ms = [math.nan] * n
        self.finish_ms = [math.nan] * n
        self.n_preempt = [0] * n
        self.n_abort = [0] * n
        self.reprefill = 0
        self.n_done = 0
        self.budget = cfg.kv_budget_tokens if cfg.kv_budget_tokens is not None else math.inf
        self.reps = [_Replica(r) for r in range(cfg.n_replicas)]
        self.seq = 0
        self.events: list = []
        self.wake = False
        self.poke: set[int] = set()
        self.in_callback = False

    # ---- helpers -------------------------------------------------------------------------------------
    def index(self, rid: int) -> int:
        try:
            return self._idx[rid]
        except KeyError:
            raise SimError(f"unknown request id {rid!r}") from None

    def gen_at(self, i: int, it: int) -> int:
        return self.adm_s[i] + (it - self.adm_it[i])

    def _record(self, rep: _Replica) -> None:
        if rep.tl_b[-1] != rep.b:
            if rep.tl_t[-1] == rep.clock:
                rep.tl_b[-1] = rep.b
            else:
                rep.tl_t.append(rep.clock)
                rep.tl_b.append(rep.b)

    def _leave(self, rep: _Replica, i: int) -> None:
        """Remove running request i from rep's batch (its heap/order entries go stale via the epoch)."""
        g = self.gen_at(i, rep.it)
        self.gen[i] = g
        rep.kv -= self.P[i] + g
        rep.b -= 1
        self.epoch[i] += 1

    def _finish(self, rep: _Replica, i: int) -> None:
        self.status[i] = _DONE
        self.finish_ms[i] = rep.clock
        self.n_done += 1
        self.routing.on_finish(self.reqs[i].rid, rep.r, rep.clock)

    # ---- one replica's boundary ---------------------------------------------------------------------
    def _pop_finished(self, rep: _Replica, out: list[int]) -> None:
        h = rep.heap
        while h and h[0][0] <= rep.it:
            _, ep, i = heapq.heappop(h)
            if self.status[i] != _RUNNING or self.epoch[i] != ep:
                continue
            self._leave(rep, i)
            self._finish(rep, i)
            out.append(self.reqs[i].rid)

    def _do_aborts(self, rep: _Replica) -> None:
        todo, rep.aborts = rep.aborts, []
        for i, mode, target in todo:
            if self.status[i] == _RUNNING and self.rep_of[i] == rep.r:
                self._leave(rep, i)
            elif self.status[i] == _WAITING and self.rep_of[i] == rep.r and i in rep.localq:
                rep.localq.remove(i)
            else:
                continue  # finished (or moved) meanwhile
            self.n_abort[i] += 1
            if mode == "truncate":
                self._finish(rep, i)
                continue
            self.routing.on_finish(self.reqs[i].rid, rep.r, rep.clock)
            if target is None:
                if not hasattr(self.routing, "requeue"):
                    raise SimError(f"{type(self.routing).__name__} has no requeue(): pass to_replica to abort()")
                self.status[i] = _PENDING
                self.rep_of[i] = -1
                self.routing.requeue(self.reqs[i].rid, rep.clock, self.gen[i])
                self.wake = True
            else:
                self.status[i] = _WAITING
                self.rep_of[i] = target
                self.reps[target].localq.append(i)
                self.poke.add(target)

    def _preempt(self, rep: _Replica) -> bool:
        done = False
        while rep.kv > self.budget:
            i, ep = rep.order.pop()
            if self.status[i] != _RUNNING or self.epoch[i] != ep or self.rep_of[i] != rep.r:
                continue
            self._leave(rep, i)
            self.status[i] = _WAITING
            self.n_preempt[i] += 1
            rep.localq.appendleft(i)
            done = True
        return done

    def _fill(self, reps: list[_Replica], preempted: list[bool]) -> list[float]:
        """Admit at the same-time boundary of ``reps``, one request per replica in turn (round-robin), so no
        replica drains a shared queue before the others get a turn; a replica that preempted at this
        boundary admits nothing (vLLM V1). Returns each replica's prefill lump (ms), not yet on its clock."""
        return fill_round_robin(self._admit, reps, preempted)

    def _admit(self, rep: _Replica, limit: int | None = None) -> tuple[float, int]:
        """Admit what fits at rep's boundary (at most ``limit``); returns (prefill lump ms, number admitted)."""
        lump = 0.0
        count = 0
        maxb = self.cfg.max_num_seqs
        while rep.b < maxb and (limit is None or count < limit):
            if rep.localq:
                i = rep.localq[0]
            else:
                rid = self.routing.next_for(rep.r, rep.clock)
                if rid is None:
                    break
                i = self.index(rid)
                if self.status[i] != _PENDING:
                    raise SimError(
                        f"{type(self.routing).__name__}.next_for returned request {rid}, which is not waiting"
                    )
                self.status[i] = _WAITING
                self.rep_of[i] = rep.r
                rep.localq.append(i)
            g = self.gen[i]
            s = g if g > 0 else 1
            if rep.kv + self.P[i] + s > self.budget:
                break
            rep.localq.popleft()
            ms, new = prefill_lump(self.cost, self.cfg.prefix_caching, rep.cached, self.G[i], self.P[i], g)
            if g > 0:
                self.reprefill += new
            lump += ms
            self.status[i] = _RUNNING
            self.rep_of[i] = rep.r
            self.gen[i] = s
            self.adm_it[i] = rep.it
            self.adm_s[i] = s
            self.epoch[i] += 1
            if math.isnan(self.admit_ms[i]):
                self.admit_ms[i] = rep.clock
            rep.kv += self.P[i] + s
            rep.b += 1
            heapq.heappush(rep.heap, (rep.it + self.L[i] - s, self.epoch[i], i))
            rep.order.append((i, self.epoch[i]))
            count += 1
        return lump, count

    def _callback(self, now: float, replica: int | None, finished: list[int]) -> None:
        if self.on_finish is not None and finished:
            self.in_callback = True
            try:
                self.on_finish(SimState(self, now, replica, finished))
            finally:
                self.in_callback = False

    def request_abort(self, rid: int, mode: str, target: int | None, now: float) -> None:
        i = self.index(rid)
        if self.status[i] not in (_RUNNING, _WAITING):
            raise SimError(f"abort/truncate of request {rid}: it is not running or queued on a replica")
        if target is not None and not 0 <= target < len(self.reps):
            raise SimError(f"abort of request {rid} to replica {target}: replicas are 0..{len(self.reps) - 1}")
        rep = self.reps[self.rep_of[i]]
        rep.aborts.append((i, mode, target))
        self.poke.add(rep.r)

    # ---- independent replicas -------------------------------------------------------------------------
    def _boundary(self, rep: _Replica) -> None:
        self._boundary_group([rep])

    def _boundary_group(self, reps: list[_Replica]) -> None:
        """Boundaries of replicas at the same time: finish, policy hook, aborts, preempt, admit (round-robin)."""
        while True:
            for rep in reps:
                finished: list[int] = []
                self._pop_finished(rep, finished)
                self._callback(rep.clock, rep.r, finished)
            for rep in reps:
                self._do_aborts(rep)
                self.poke.discard(rep.r)
            lumps = self._fill(reps, [self._preempt(rep) for rep in reps])
            for rep, lump in zip(reps, lumps, strict=True):
                if lump:
                    rep.clock += lump
                    rep.busy += lump
                    rep.work += lump
                self._record(rep)
            if not any(rep.aborts or (rep.heap and rep.heap[0][0] <= rep.it) for rep in reps):
                break

    def _schedule(self, rep: _Replica) -> None:
        rep.version += 1
        h = rep.heap
        while h and (self.status[h[0][2]] != _RUNNING or self.epoch[h[0][2]] != h[0][1]):
            heapq.heappop(h)
        if rep.b == 0:
            rep.next_t, rep.next_m = math.inf, 0
            return
        m = h[0][0] - rep.it
        if self.budget != math.inf:
            m = min(m, int((self.budget - rep.kv) // rep.b) + 1)
        rep.next_m = m
        rep.next_t = rep.clock + self.cost.decode_run_ms(rep.b, rep.kv, m)
        heapq.heappush(self.events, (rep.next_t, self.seq, rep.r, rep.version))
        self.seq += 1

    def _advance(self, rep: _Replica, m: int) -> None:
        dt = self.cost.decode_run_ms(rep.b, rep.kv, m)
        rep.clock += dt
        rep.busy += dt
        rep.work += dt
        rep.kv += rep.b * m
        rep.it += m
        rep.iters += m

    def _iters_to_reach(self, rep: _Replica, dt: float) -> int:
        """Smallest m >= 0 whose m iterations from rep's state take at least dt ms (1e-9 relative slack, so
        a boundary that falls exactly on dt counts despite rounding)."""
        dt -= 1e-9 * max(1.0, abs(dt))
        if dt <= 0:
            return 0
        c = self.cost
        qa = c.t2 * rep.b / 2.0
        qb = c.t0 + c.t1 * rep.b + c.t2 * rep.kv - qa
        m = math.ceil(dt / qb) if qa == 0 else math.ceil((-qb + math.sqrt(qb * qb + 4 * qa * dt)) / (2 * qa))
        m = max(m, 0)
        while m > 0 and c.decode_run_ms(rep.b, rep.kv, m - 1) >= dt:
            m -= 1
        while c.decode_run_ms(rep.b, rep.kv, m) < dt:
            m += 1
        return m

    def iters_done(self, rep: _Replica, now: float) -> int:
        """Iterations of rep's current segment completed by ``now`` (0 in lockstep or when idle)."""
        if self.cfg.lockstep or rep.b == 0 or now <= rep.clock:
            return 0
        m = self._iters_to_reach(rep, now - rep.clock)
        if self.cost.decode_run_ms(rep.b, rep.kv, m) > (now - rep.clock) * (1 + 1e-9):
            m -= 1
        return max(0, min(m, rep.next_m))

    def _touch(self, rep: _Replica, now: float, need_room: bool) -> None:
        """Give rep an event at its first iteration boundary at or after ``now`` (an idle replica: ``now``),
        unless its own event comes first; there it admits / aborts. Events run in time order, and replicas
        whose events coincide act together (round-robin admission)."""
        if need_room and (rep.b >= self.cfg.max_num_seqs or rep.localq):
            return
        if rep.b == 0:
            t, m = max(rep.clock, now), 0
            if rep.next_t <= t:
                return
            rep.clock = t
        else:
            m = self._iters_to_reach(rep, now - rep.clock)
            if m >= rep.next_m:
                return  # its own event comes first (or at the same boundary): handled there
            t = rep.clock + self.cost.decode_run_ms(rep.b, rep.kv, m)
        rep.version += 1
        rep.next_m, rep.next_t = m, t
        heapq.heappush(self.events, (t, self.seq, rep.r, rep.version))
        self.seq += 1

    def _settle(self, now: float) -> None:
        pokes, self.poke = sorted(self.poke), set()
        for r in pokes:
            self._touch(self.reps[r], now, need_room=False)
        if self.wake:
            self.wake = False
            for rep in self.reps:
                self._touch(rep, now, need_room=True)

    def run_independent(self, arrivals: list[float]) -> None:
        self._boundary_group(self.reps)
        for rep in self.reps:
            self._schedule(rep)
        self._settle(0.0)
        ai, n_ev = 0, 0
        while True:
            t_arr = arrivals[ai] if ai < len(arrivals) else math.inf
            while self.events and self.events[0][3] != self.reps[self.events[0][2]].version:
                heapq.heappop(self.events)
            t_ev = self.events[0][0] if self.events else math.inf
            if t_arr == math.inf and t_ev == math.inf:
                break
            n_ev += 1
            if n_ev > self.max_events:
                raise SimError(f"simulation exceeded max_events={self.max_events}: a policy loops (abort/requeue?)")
            if t_arr <= t_ev:
                ai += 1
                self.wake = True
                self._settle(t_arr)
                continue
            group = []  # every replica whose event falls at this time
            while self.events and self.events[0][0] == t_ev:
                _, _, r, ver = heapq.heappop(self.events)
                rep = self.reps[r]
                if ver != rep.version:
                    continue
                self._advance(rep, rep.next_m)
                rep.clock = t_ev  # same value, without rounding drift
                group.append(rep)
            self._boundary_group(group)
            for rep in group:
                self._schedule(rep)
            self._settle(t_ev)

    # ---- lockstep ------------------------------------------------------------------------------------
    def _boundary_all(self, now: float) -> float:
        reps = self.reps
        while True:
            for rep in reps:
                rep.clock = now
            finished: list[int] = []
            for rep in reps:
                self._pop_finished(rep, finished)
            self._callback(now, None, finished)
            for rep in reps:
                self._do_aborts(rep)
            self.poke.clear()
            self.wake = False
            lumps = self._fill(reps, [self._preempt(rep) for rep in reps])
            lump = max(lumps)
            if lump:
                now += lump
                for rep, own in zip(reps, lumps, strict=True):
                    if rep.b > 0 or own > 0:
                        rep.busy += lump
                    rep.work += own
            for rep in reps:
                rep.clock = now
                self._record(rep)
            again = any(rep.aborts or (rep.heap and rep.heap[0][0] <= rep.it) for rep in reps)
            if not again:
                return now

    def _lockstep_cost(self, active: list[_Replica], m: int) -> float:
        c = self.cost
        a = [c.t0 + c.t1 * rep.b + c.t2 * rep.kv for rep in active]
        s = [c.t2 * rep.b for rep in active]
        return _sum_max_lines(a, s, m)

    def run_lockstep(self, arrivals: list[float]) -> None:
        now = self._boundary_all(0.0)
        ai, n_ev = 0, 0
        while True:
            t_arr = arrivals[ai] if ai < len(arrivals) else math.inf
            active = [rep for rep in self.reps if rep.b > 0]
            if not active:
                if t_arr == math.inf:
                    break
                ai += 1
                now = self._boundary_all(max(now, t_arr))
                continue
            n_ev += 1
            if n_ev > self.max_events:
                raise SimError(f"simulation exceeded max_events={self.max_events}: a policy loops (abort/requeue?)")
            m = math.inf
            for rep in active:
                h = rep.heap
                while h and (self.status[h[0][2]] != _RUNNING or self.epoch[h[0][2]] != h[0][1]):
                    heapq.heappop(h)
                mr = h[0][0] - rep.it
                if self.budget != math.inf:
                    mr = min(mr, int((self.budget - rep.kv) // rep.b) + 1)
                m = min(m, mr)
            dt = self._lockstep_cost(active, m)
            if now + dt > t_arr:  # stop at the first boundary at or after the arrival
                lo, hi = 0, m  # cost(lo) < t_arr - now <= cost(hi)
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    if self._lockstep_cost(active, mid) >= t_arr - now:
                        hi = mid
                    else:
                        lo = mid
                m, dt = hi, self._lockstep_cost(active, hi)
                ai += 1
            c = self.cost
            for rep in active:
                rep.work += c.decode_run_ms(rep.b, rep.kv, m)
                rep.busy += dt
                rep.kv += rep.b * m
                rep.iters += m
            for rep in self.reps:
                rep.it += m
            now = self._boundary_all(now + dt)

    def result(self) -> SimResult:
        n = len(self.reqs)
        finish = np.array(self.finish_ms, dtype=np.float64)
        if n and np.isnan(finish).any():
            stuck = [self.reqs[i].rid for i in range(n) if math.isnan(self.finish_ms[i])][:5]
            raise SimError(f"requests never finished (e.g. rids {stuck}): the routing never handed them out")
        gen = np.array(self.gen, dtype=np.int64)
        return SimResult(
            step_ms=float(finish.max()) if n else 0.0,
            replica_busy_ms=np.array([rep.busy for rep in self.reps]),
            replica_work_ms=np.array([rep.work for rep in self.reps]),
            rids=np.array([r.rid for r in self.reqs], dtype=np.int64),
            replica=np.array(self.rep_of, dtype=np.int64),
            admit_ms=np.array(self.admit_ms, dtype=np.float64),
            finish_ms=finish,
            generated=gen,
            tokens_lost=np.array(self.L, dtype=np.int64) - gen,
            preemptions=np.array(self.n_preempt, dtype=np.int64),
            aborts=np.array(self.n_abort, dtype=np.int64),
            timeline=[(np.array(rep.tl_t), np.array(rep.tl_b, dtype=np.int64)) for rep in self.reps],
            decode_iterations=np.array([rep.iters for rep in self.reps], dtype=np.int64),
            reprefill_tokens=int(self.reprefill),
            lower_bound_ms=lower_bound(self.reqs, self.cost, self.cfg),
        )


def _validate(reqs: list[SimRequest], cfg: ReplicaConfig) -> None:
    seen: set[int] = set()
    group_p: dict[int, int] = {}
    for r in reqs:
        if r.rid in seen:
            raise SimError(f"duplicate request id {r.rid}: rids must be unique")
        seen.add(r.rid)
        if not (isinstance(r.prompt_len, int | np.integer) and r.prompt_len >= 0):
            raise SimError(f"request {r.rid}: prompt_len={r.prompt_len!r} must be an int >= 0")
        if not (isinstance(r.response_len, int | np.integer) and r.response_len >= 1):
            raise SimError(f"request {r.rid}: response_len={r.response_len!r} must be an int >= 1")
        if not (math.isfinite(r.arrival_ms) and r.arrival_ms >= 0):
            raise SimError(f"request {r.rid}: arrival_ms={r.arrival_ms!r} must be finite and >= 0")
        if group_p.setdefault(r.group, r.prompt_len) != r.prompt_len:
            raise SimError(
                f"request {r.rid}: group {r.group} has prompt_len {r.prompt_len} and {group_p[r.group]}; "
                "the samples of one prompt share its prompt (give different prompts different groups)"
            )
        if cfg.kv_budget_tokens is not None and r.prompt_len + r.response_len > cfg.kv_budget_tokens:
            raise SimError(
                f"request {r.rid}: prompt {r.prompt_len} + response {r.response_len} tokens exceed "
                f"kv_budget_tokens={cfg.kv_budget_tokens}: vLLM could never hold it (raise the budget or cap lengths)"
            )


def simulate(
    requests: Sequence[SimRequest],
    cost: CostModel,
    replica_cfg: ReplicaConfig,
    routing: Routing,
    *,
    on_finish: Callable[[SimState], None] | None = None,
    max_events: int = 10_000_000,
) -> SimResult:
    """Simulate one generation step; returns a :class:`~npu_rl.sim.model.SimResult` (times in ms).

    ``requests``: the step's requests (unique ``rid``; the samples of one prompt share ``group`` and
    ``prompt_len``). ``routing``: a :class:`~npu_rl.sim.routing.Routing` (reset here). ``on_finish``: optional
    policy hook called with a :class:`SimState` at each boundary where requests finished (abort/truncate).
    Deterministic: same inputs, same result. Raises :class:`~npu_rl.sim.model.SimError` on bad requests
    (duplicate rid, response_len < 1, a request larger than the KV budget, a group with two prompt lengths),
    on a routing that hands out a request twice or never hands one out, and past ``max_events``.
    """
    reqs = list(requests)
    _validate(reqs, replica_cfg)
    routing.reset(reqs, replica_cfg.n_replicas)
    eng = _Engine(reqs, cost, replica_cfg, routing, on_finish, max_events)
    arrivals = sorted({r.arrival_ms for r in reqs if r.arrival_ms > 0})
    if replica_cfg.lockstep:
        eng.run_lockstep(arrivals)
    else:
        eng.run_independent(arrivals)
    return eng.result()


def prefill_lump(
    cost: CostModel, prefix_caching: bool, cached: set, group: object, prompt: float, generated: float
) -> tuple[float, float]:
    """Prefill of a request admitted with ``prompt`` prompt and ``generated`` generated tokens (a resumed
    one recomputes its output) on a replica whose prefix cache holds the prompts of groups ``cached``
    (``group`` is added when prefix caching is on). Returns (ms, tokens computed)."""
    ctx = prompt + generated
    new = ctx
    if prefix_caching:
        if group in cached:
            new -= prompt
        else:
            cached.add(group)
    return (cost.prefill_ms(new, ctx) if new > 0 else 0.0), new


def fill_round_robin(admit: Callable, reps: Sequence, preempted: Sequence[bool]) -> list[float]:
    """Admit at a same-time boundary of ``reps``, one request per replica in turn (``admit(rep, 1)`` ->
    (prefill ms, number admitted)) until none admits, skipping replicas that preempted at this
    boundary (vLLM V1). Returns each replica's prefill lump (ms)."""
    lumps = [0.0] * len(reps)
    open_ = [k for k in range(len(reps)) if not preempted[k]]
    while open_:
        still = []
        for k in open_:
            lump, n = admit(reps[k], 1)
            lumps[k] += lump
            if n:
                still.append(k)
        open_ = still
    return lumps
