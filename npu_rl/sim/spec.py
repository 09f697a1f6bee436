"""Speculative decoding in the rollout simulator: per-request acceptance, verify cost, batch-size gate.

:func:`simulate_spec` simulates one generation step like :func:`npu_rl.sim.simulate` (same
:class:`~npu_rl.sim.model.CostModel`, :class:`~npu_rl.sim.model.ReplicaConfig`, routings, admission,
prefill lumps, prefix caching, KV preemption, lockstep) and adds model-free speculative decoding
(SAM, n-gram, suffix decoding) as vLLM runs it:

- **Gate** (:attr:`SpecConfig.batch_threshold`): an engine drafts only while its running batch is at
  most the threshold (our ``sam_batch_size_threshold``, the reference's
  ``VLLM_SPECULATIVE_BATCH_SIZE_THRE``); above it an iteration is a plain decode step. Per engine, also
  in lockstep (each DP rank's proposer sees its own batch).
- **Verify cost**: a drafting iteration verifies (k + 1) tokens per request and costs
  ``t0*(1 + gamma*k) + t1*b*(k + 1) + t2*kv`` (:meth:`SpecConfig.step_ms`): the per-sequence term
  scales with the tokens computed, attention still reads each cached token once, and ``gamma`` is the
  fixed overhead per draft token (rejection sampler, extra kernels, host work, graph fallbacks) as a
  fraction of t0, calibrated from a measured end-to-end gain (``benchmarks/sim_spec.py``).
- **Acceptance**: in a drafting iteration request i advances by ``rate_i(pos)`` tokens (accepted
  draft tokens + 1, a real number >= 1, capped at its remaining tokens), replayed from a measured
  :class:`AcceptanceTrace` (tokens per forward pass per chunk of the response, by position). Progress
  is fractional (the mean of the chunk), so kv and positions are real numbers.

Time advances event to event as in the engine while no engine drafts (b > threshold), and one
iteration at a time while one does (only in the tail, so it stays fast). With drafting switched off
(``batch_threshold=0`` or ``spec=None``) the result equals :func:`npu_rl.sim.simulate`'s (tested).
Not modelled: ``arrival_ms`` > 0 and ``on_finish`` policies (rejected with :class:`SimError`).
"""

from __future__ import annotations

import heapq
import json
import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from npu_rl.sim.engine import _sum_max_lines, _validate, fill_round_robin, prefill_lump
from npu_rl.sim.model import CostModel, ReplicaConfig, SimError, SimRequest, SimResult, lower_bound
from npu_rl.sim.routing import Routing

__all__ = ["AcceptanceTrace", "SpecConfig", "load_acceptance", "simulate_spec"]

_EPS = 1e-9


@dataclass(frozen=True)
class SpecConfig:
    """Speculative decoding of every engine in the step.

    - ``k``: ``num_speculative_tokens`` (draft tokens per request per drafting iteration, >= 1).
    - ``batch_threshold``: draft only while the engine's running batch is <= this (0: never draft).
    - ``gamma``: fixed verify overhead per draft token as a fraction of ``t0`` (>= 0, dimensionless).
    """

    k: int
    batch_threshold: int
    gamma: float = 0.0

    def __post_init__(self):
        if not (isinstance(self.k, int) and self.k >= 1):
            raise SimError(f"SpecConfig.k={self.k!r}: num_speculative_tokens must be an int >= 1")
        if not (isinstance(self.batch_threshold, int) and self.batch_threshold >= 0):
            raise SimError(f"SpecConfig.batch_threshold={self.batch_threshold!r}: must be an int >= 0 (0 = never)")
        if not (math.isfinite(self.gamma) and self.gamma >= 0):
            raise SimError(f"SpecConfig.gamma={self.gamma!r}: must be a finite number >= 0")

    def step_ms(self, cost: CostModel, b: float, kv: float) -> float:
        """One drafting iteration over ``b`` requests holding ``kv`` cached tokens (ms)."""
        return cost.t0 * (1.0 + self.gamma * self.k) + cost.t1 * b * (self.k + 1) + cost.t2 * kv


@dataclass(frozen=True)
class AcceptanceTrace:
    """Measured tokens per forward pass of one response, by position.

    ``starts`` (ascending, ``starts[0] == 0``): token positions where a chunk begins; ``rates``: tokens
    per forward pass (>= 1) in that chunk; ``length``: the response's tokens. ``meta``: where it came
    from (dataset, prompt id, source, capped). Build it with :meth:`from_forwards`.
    """

    starts: np.ndarray
    rates: np.ndarray
    length: int
    meta: tuple = ()

    @classmethod
    def from_forwards(cls, length: int, forwards: Sequence[int], chunk: int, meta: tuple = ()) -> AcceptanceTrace:
        """From the forward passes that started in each ``chunk``-token chunk of a ``length``-token response.

        Raises :class:`SimError` when the chunk count does not match the length or a count is < 1.
        """
        n = (length + chunk - 1) // chunk
        fw = np.asarray(forwards, dtype=np.float64)
        if length < 1 or fw.shape != (n,) or (fw < 1).any():
            raise SimError(
                f"acceptance trace {meta}: {len(fw)} chunk counts for a {length}-token response in {chunk}-token "
                f"chunks (need {n}, each >= 1)"
            )
        tokens = np.minimum(chunk, length - chunk * np.arange(n)).astype(np.float64)
        return cls(chunk * np.arange(n, dtype=np.float64), np.maximum(1.0, tokens / fw), int(length), meta)

    @property
    def tokens_per_forward(self) -> float:
        """Mean over the response: tokens / forward passes."""
        tokens = np.diff(np.append(self.starts, self.length))
        return float(tokens.sum() / (tokens / self.rates).sum())

    def scaled_to(self, length: int) -> AcceptanceTrace:
        """The same profile stretched to a ``length``-token response (chunk starts scaled by length ratio)."""
        return AcceptanceTrace(self.starts * (length / self.length), self.rates, int(length), self.meta)

    def rate_at(self, pos: float) -> float:
        return float(self.rates[int(np.searchsorted(self.starts, pos, side="right")) - 1])


def load_acceptance(
    path: str | Path, dataset: str, drafter: str, k: int, *, capped: bool | None = None
) -> list[AcceptanceTrace]:
    """Traces of one dataset / drafter / k from a ``benchmarks/sim_spec.py measure`` JSON file.

    ``capped``: None keeps every response, False only those that finished, True only those that ran
    into the generation cap. Raises :class:`SimError` naming the file and the missing key.
    """
    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise SimError(f"acceptance file {p}: {e} (write it with `python benchmarks/sim_spec.py measure`)") from e
    chunk = int(doc.get("chunk_tokens", 0))
    if dataset not in doc.get("datasets", {}):
        raise SimError(f"acceptance file {p}: no dataset {dataset!r} (has {sorted(doc.get('datasets', {}))})")
    out = []
    for r in doc["datasets"][dataset]:
        fw = r["forwards"].get(drafter, {}).get(str(k))
        if fw is None:
            raise SimError(
                f"acceptance file {p}: {dataset} has no drafter {drafter!r} at k={k} "
                f"(has {sorted(r['forwards'])}; rerun `sim_spec.py measure --k {k}`)"
            )
        if capped is not None and bool(r["capped"]) != capped:
            continue
        meta = (dataset, r["prompt_id"], r["source"], bool(r["capped"]))
        out.append(AcceptanceTrace.from_forwards(int(r["response_len"]), fw, chunk, meta))
    return out


class _Rep:
    __slots__ = ("r", "clock", "run", "kv", "localq", "cached", "busy", "work", "iters", "draft_iters", "tl_t", "tl_b")

    def __init__(self, r: int):
        self.r = r
        self.clock = 0.0
        self.run: list[int] = []  # running request indices in admission order (preemption pops the last)
        self.kv = 0.0
        self.localq: deque[int] = deque()
        self.cached: set[int] = set()
        self.busy = 0.0
        self.work = 0.0
        self.iters = 0
        self.draft_iters = 0
        self.tl_t = [0.0]
        self.tl_b = [0]


class _SpecEngine:
    def __init__(self, reqs, cost, cfg, routing, spec, traces):
        self.reqs, self.cost, self.cfg, self.routing = reqs, cost, cfg, routing
        self.spec = spec if spec is not None and spec.batch_threshold > 0 else None
        n = len(reqs)
        # per request: rate-change positions (a trace of another length stretched to this one) and rates
        self.starts = [
            None if t is None else t.starts * (r.response_len / t.length) for t, r in zip(traces, reqs, strict=True)
        ]
        self.rates = [None if t is None else t.rates for t in traces]
        self.idx = {r.rid: i for i, r in enumerate(reqs)}
        self.P = [r.prompt_len for r in reqs]
        self.L = [r.response_len for r in reqs]
        self.G = [r.group for r in reqs]
        self.pos = [0.0] * n
        self.waiting = [False] * n
        self.admit_ms = [math.nan] * n
        self.finish_ms = [math.nan] * n
        self.n_preempt = [0] * n
        self.rep_of = [-1] * n
        self.forwards = [0] * n
        self.reprefill = 0.0
        self.budget = cfg.kv_budget_tokens if cfg.kv_budget_tokens is not None else math.inf
        self.reps = [_Rep(r) for r in range(cfg.n_replicas)]

    # ---- boundaries (as npu_rl.sim.engine) ---------------------------------------------------------
    def _record(self, rep: _Rep) -> None:
        b = len(rep.run)
        if rep.tl_b[-1] != b:
            if rep.tl_t[-1] == rep.clock:
                rep.tl_b[-1] = b
            else:
                rep.tl_t.append(rep.clock)
                rep.tl_b.append(b)

    def _pop_finished(self, rep: _Rep) -> None:
        keep = []
        for i in rep.run:
            if self.pos[i] >= self.L[i] - _EPS:
                self.pos[i] = float(self.L[i])
                rep.kv -= self.P[i] + self.L[i]
                self.finish_ms[i] = rep.clock
                self.routing.on_finish(self.reqs[i].rid, rep.r, rep.clock)
            else:
                keep.append(i)
        rep.run = keep

    def _preempt(self, rep: _Rep) -> bool:
        done = False
        while rep.kv > self.budget + _EPS and rep.run:
            i = rep.run.pop()
            rep.kv -= self.P[i] + self.pos[i]
            self.n_preempt[i] += 1
            rep.localq.appendleft(i)
            done = True
        return done

    def _admit(self, rep: _Rep, limit: int) -> tuple[float, int]:
        lump, count = 0.0, 0
        while len(rep.run) < self.cfg.max_num_seqs and count < limit:
            if rep.localq:
                i = rep.localq[0]
            else:
                rid = self.routing.next_for(rep.r, rep.clock)
                if rid is None:
                    break
                i = self.idx.get(rid)
                if i is None or self.waiting[i] or not math.isnan(self.finish_ms[i]) or self.rep_of[i] >= 0:
                    raise SimError(
                        f"{type(self.routing).__name__}.next_for returned request {rid}, which is not waiting"
                    )
                self.waiting[i] = True
                rep.localq.append(i)
            g = self.pos[i]
            s = g if g > 0 else 1.0
            if rep.kv + self.P[i] + s > self.budget:
                break
            rep.localq.popleft()
            ms, new = prefill_lump(self.cost, self.cfg.prefix_caching, rep.cached, self.G[i], self.P[i], g)
            if g > 0:
                self.reprefill += new
            lump += ms
            self.pos[i] = s
            self.rep_of[i] = rep.r
            if math.isnan(self.admit_ms[i]):
                self.admit_ms[i] = rep.clock
            rep.kv += self.P[i] + s
            rep.run.append(i)
            count += 1
        return lump, count

    def _fill(self, reps: list[_Rep], preempted: list[bool]) -> list[float]:
        return fill_round_robin(self._admit, reps, preempted)

    # ---- one segment of iterations -------------------------------------------------------------------
    def _drafts(self, rep: _Rep) -> bool:
        return self.spec is not None and 0 < len(rep.run) <= self.spec.batch_threshold

    def _rate(self, i: int) -> tuple[float, float]:
        """(tokens per forward now, position where the rate changes next) of running request i."""
        starts, rates = self.starts[i], self.rates[i]
        k = int(np.searchsorted(starts, self.pos[i], side="right")) - 1
        return float(rates[k]), float(starts[k + 1]) if k + 1 < len(starts) else math.inf

    def _plan(self, rep: _Rep) -> tuple[int, float, float, list[float] | None]:
        """rep's next segment, to the next event (a finish, the KV budget, a request's rate changing):
        (iterations m, own cost ms, first iteration's cost, kv growth per iteration, rates or None)."""
        b = len(rep.run)
        c = self.cost
        if self._drafts(rep):
            rates, m = [], math.inf
            for i in rep.run:
                rate, nxt = self._rate(i)
                p = self.pos[i]
                rates.append(rate)
                m = min(m, math.ceil((self.L[i] - p) / rate - _EPS))
                if nxt != math.inf:
                    m = min(m, math.ceil((nxt - p) / rate - _EPS))
            grow = sum(rates)
            first = self.spec.step_ms(c, b, rep.kv)
        else:
            rates, grow, first = None, float(b), c.decode_ms(b, rep.kv)
            m = min(math.ceil(self.L[i] - self.pos[i] - _EPS) for i in rep.run)
        if self.budget != math.inf:
            m = min(m, int((self.budget - rep.kv) // grow) + 1)
        m = max(int(m), 1)
        # m iterations at constant b, kv growing by `grow` per iteration (exact: no rate changes inside)
        return m, m * first + c.t2 * grow * m * (m - 1) / 2, first, grow, rates

    def _advance(self, rep: _Rep, m: int, rates: list[float] | None) -> None:
        rep.iters += m
        if rates is not None:
            rep.draft_iters += m
            for i, rate in zip(rep.run, rates, strict=True):
                p = self.pos[i]
                q = min(float(self.L[i]), p + m * rate)  # the last pass of a finishing request is partial
                self.pos[i] = q
                rep.kv += q - p
                self.forwards[i] += m
        else:
            for i in rep.run:
                self.pos[i] += m
                self.forwards[i] += m
            rep.kv += len(rep.run) * m

    # ---- drivers -------------------------------------------------------------------------------------
    def _done_waiting(self, reps: list[_Rep]) -> bool:
        """A request admitted with nothing left to decode (response_len 1) finishes at the same boundary."""
        return any(self.pos[i] >= self.L[i] - _EPS for rep in reps for i in rep.run)

    def _boundary_group(self, reps: list[_Rep]) -> None:
        while True:
            for rep in reps:
                self._pop_finished(rep)
            lumps = self._fill(reps, [self._preempt(rep) for rep in reps])
            for rep, lump in zip(reps, lumps, strict=True):
                if lump:
                    rep.clock += lump
                    rep.busy += lump
                    rep.work += lump
                self._record(rep)
            if not self._done_waiting(reps):
                return

    def run_independent(self) -> None:
        self._boundary_group(self.reps)
        events: list = []
        plans: dict[int, tuple[int, float, bool]] = {}

        def schedule(rep: _Rep) -> None:
            if rep.run:
                m, dt, _, _, rates = self._plan(rep)
                plans[rep.r] = (m, dt, rates)
                heapq.heappush(events, (rep.clock + dt, rep.r))

        for rep in self.reps:
            schedule(rep)
        while events:
            t = events[0][0]
            group = []
            while events and events[0][0] == t:
                _, r = heapq.heappop(events)
                rep = self.reps[r]
                m, dt, rates = plans.pop(r)
                self._advance(rep, m, rates)
                rep.busy += dt
                rep.work += dt
                rep.clock = t
                group.append(rep)
            self._boundary_group(group)
            for rep in group:
                schedule(rep)

    def run_lockstep(self) -> None:
        now = 0.0
        while True:
            while True:
                for rep in self.reps:
                    rep.clock = now
                for rep in self.reps:
                    self._pop_finished(rep)
                lumps = self._fill(self.reps, [self._preempt(rep) for rep in self.reps])
                lump = max(lumps)
                if lump:
                    now += lump
                    for rep, own in zip(self.reps, lumps, strict=True):
                        if rep.run or own > 0:
                            rep.busy += lump
                        rep.work += own
                for rep in self.reps:
                    rep.clock = now
                    self._record(rep)
                if not self._done_waiting(self.reps):
                    break
            active = [rep for rep in self.reps if rep.run]
            if not active:
                return
            plans = [self._plan(rep) for rep in active]
            m = min(p[0] for p in plans)
            # each rank's cost is linear in the iteration index within the segment: the sum of the max
            # over ranks is exact from the upper envelope (as the engine's lockstep)
            dt = _sum_max_lines([p[2] for p in plans], [self.cost.t2 * p[3] for p in plans], m)
            for rep, (_, _, first, grow, rates) in zip(active, plans, strict=True):
                rep.work += m * first + self.cost.t2 * grow * m * (m - 1) / 2
                rep.busy += dt
                self._advance(rep, m, rates)
            now += dt

    def result(self) -> SimResult:
        n = len(self.reqs)
        finish = np.array(self.finish_ms, dtype=np.float64)
        if n and np.isnan(finish).any():
            stuck = [self.reqs[i].rid for i in range(n) if math.isnan(self.finish_ms[i])][:5]
            raise SimError(f"requests never finished (e.g. rids {stuck}): the routing never handed them out")
        gen = np.array([round(p) for p in self.pos], dtype=np.int64)
        fw = np.array(self.forwards, dtype=np.int64)
        res = SimResult(
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
            aborts=np.zeros(n, dtype=np.int64),
            timeline=[(np.array(rep.tl_t), np.array(rep.tl_b, dtype=np.int64)) for rep in self.reps],
            decode_iterations=np.array([rep.iters for rep in self.reps], dtype=np.int64),
            reprefill_tokens=int(round(self.reprefill)),
            lower_bound_ms=lower_bound(self.reqs, self.cost, self.cfg) if self.spec is None else math.nan,
        )
        res.extra["draft_iterations"] = np.array([rep.draft_iters for rep in self.reps], dtype=np.int64)
        res.extra["forwards"] = fw  # decode forward passes per request (the prefill's first token excluded)
        return res


def simulate_spec(
    requests: Sequence[SimRequest],
    cost: CostModel,
    replica_cfg: ReplicaConfig,
    routing: Routing,
    spec: SpecConfig | None,
    acceptance: Mapping[int, AcceptanceTrace] | None = None,
) -> SimResult:
    """Simulate one generation step with speculative decoding; a :class:`~npu_rl.sim.model.SimResult`.

    ``acceptance``: one :class:`AcceptanceTrace` per request rid (a trace of another length is
    stretched to the request's length, :meth:`AcceptanceTrace.scaled_to`); needed when ``spec`` drafts.
    ``SimResult.extra``: ``draft_iterations`` (per replica), ``forwards`` (decode passes per request).
    ``lower_bound_ms`` is NaN when drafting is on (speculation breaks the bound's one-token iterations).
    Raises :class:`SimError` on bad requests (as :func:`npu_rl.sim.simulate`), arrivals after 0, or a
    missing trace.
    """
    reqs = list(requests)
    _validate(reqs, replica_cfg)
    late = [r.rid for r in reqs if r.arrival_ms > 0][:3]
    if late:
        raise SimError(f"simulate_spec: requests {late} have arrival_ms > 0; only whole-batch steps are modelled")
    drafting = spec is not None and spec.batch_threshold > 0
    traces: list = [None] * len(reqs)
    if drafting:
        acceptance = acceptance or {}
        missing = [r.rid for r in reqs if r.rid not in acceptance][:3]
        if missing:
            raise SimError(
                f"simulate_spec: no acceptance trace for requests {missing} (pass acceptance={{rid: trace}})"
            )
        traces = [acceptance[r.rid] for r in reqs]
    routing.reset(reqs, replica_cfg.n_replicas)
    eng = _SpecEngine(reqs, cost, replica_cfg, routing, spec, traces)
    if replica_cfg.lockstep:
        eng.run_lockstep()
    else:
        eng.run_independent()
    return eng.result()
