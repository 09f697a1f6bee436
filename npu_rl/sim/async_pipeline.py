"""Simulated asynchronous RL pipelines: verl 0.9.1's fully-async trainer and one-step-off-policy, against sync.

Three schedules of the same GRPO training on the same dies (times in ms inside the simulator, seconds in
the summaries; sizes in tokens):

- **sync** (``main_ppo``, colocated): every step generates the whole batch on all dies
  (:func:`npu_rl.sim.simulate`), then the trainer computes old log-probs and updates on all dies, then a
  colocated weight update. :func:`simulate_sync`.
- **one-step-off-policy** (``verl/experimental/one_step_off_policy/ray_trainer.py``): separate rollout and
  trainer pools; batch k+1 is generated while the trainer updates on batch k; a weight sync starts when
  both are done. :func:`simulate_one_step_off`.
- **fully async** (``verl/experimental/fully_async_policy``): :func:`simulate_fully_async`, an event-driven
  model of the rollouter, the message queue and the trainer, written from the pinned code:

  * The rollouter (``fully_async_rollouter.py:_processor_worker``) submits one prompt at a time (a
    "sample": ``gen_batch_size`` = 1 prompt, repeated ``rollout.n`` times by
    ``detach_utils.prepare_single_generation_data``) while three gates are open: active samples <
    ``max_concurrent_samples``; ``staleness_samples`` (samples submitted since the last weight sync, reset
    to active + queued at the sync, ``reset_staleness``) < ``max_required_samples`` =
    ``required_samples * (staleness_threshold + 1) * trigger_parameter_sync_step``; queue size <
    ``max_queue_size`` (= ``max_required_samples``, ``_should_pause_generation``). ``required_samples`` =
    ``ppo_mini_batch_size * require_batches`` prompts.
  * Each request goes to the replica with the fewest requests in flight (verl's
    ``GlobalRequestLoadBalancer``, random ties); a replica is the decode model of :mod:`npu_rl.sim.engine`
    (continuous batching, ``t0 + t1*b + t2*kv`` per iteration, slot and KV-budget admission, FIFO, KV
    preemption of the latest admitted request, prefix caching per group, lockstep ranks under expert
    parallelism). A sample enters the message queue when all its n responses are done (the agent loop
    returns the sample whole); a full queue drops its oldest sample (``message_queue.py:put_sample``).
  * The trainer (``fully_async_trainer.py:fit_step``) takes ``required_samples`` samples in completion
    order, trains for :meth:`TrainerModel.step_s` (no old log-prob pass: the fully-async config forces
    ``algorithm.rollout_correction.bypass_mode=True``), and every ``trigger_parameter_sync_step`` steps
    syncs weights (``_fit_update_weights``). The sync (``checkpoint_engine/base.py:
    CheckpointEngineManager.update_weights``) aborts every in-flight request at its replica's next
    iteration boundary, releases the KV cache, broadcasts the weights (:meth:`WeightSyncModel.sync_s`),
    resumes; with ``partial_rollout`` the client re-sends each aborted request to the same server with its
    tokens appended (``llm_server.py``, after ``asyncio.sleep(1)``): the prefix cache was reset, so prompt
    + generated tokens are prefilled again. Without ``partial_rollout`` the aborted request ends with what
    it generated (the pinned client does not retry; the sample is trained truncated).

Not modelled: the rollouter's 10 s monitor poll that lifts a queue-full pause, reward computation (streamed
on the rollouter's CPU side), validation and checkpoints, dynamic resource scheduling, vLLM's token
sampled at a resumed request's prefill (we charge one extra iteration, as the engine does on re-admission).
"""

from __future__ import annotations

import heapq
import math
import random as pyrandom
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from npu_rl.sim.engine import _sum_max_lines, prefill_lump, simulate
from npu_rl.sim.model import CostModel, ReplicaConfig, SimError, SimRequest
from npu_rl.sim.routing import VerlDefaultRouting

# ---- published figures the trainer and weight-sync models are built from --------------------------------

#: Qwen3-235B-A22B GRPO step 1 on 64 A3 cards (128 dies), 8192 responses, mean prompt 73.7 / response
#: 7344.973 tokens: ref prefill 1262.269 s, update 2353.23 s, rollout 4065.71 s, total 7780.36 s, 122.05
#: tokens/s per card (hicann/cann-recipes-train docs/llm_rl/qwen3_235B_32k_longseq_rl_train_optimization.md,
#: table 1.3.1; old log-prob skipped there). Tokens = prompt + response, as in its throughput columns.
REF_235B_TOKENS = 8192 * (73.7 + 7344.973)
REF_235B_DIES = 128
REF_235B_UPDATE_S = 2353.23
REF_235B_FORWARD_S = 1262.269
REF_235B_ROLLOUT_S = 4065.71
#: Active parameters (billions): Qwen3-235B-A22B 22 (model card), Qwen3-32B 32.8 (model card).
ACTIVE_PARAMS_B = {"qwen3_235b": 22.0, "qwen3_32b": 32.8}
TOTAL_PARAMS_B = {"qwen3_235b": 235.1, "qwen3_32b": 32.8, "qwen3_30b_a3b": 30.5}
#: verl checkpoint engine, Qwen3-30B-A3B (30.5B params, BF16) weight sync ~11 s over HCCL on 2 x 16 910C
#: (REFERENCE §4): 61 GB / 11 s = 5.5 GB/s effective.
REF_SYNC_GB = TOTAL_PARAMS_B["qwen3_30b_a3b"] * 2
REF_SYNC_S = 11.0


@dataclass(frozen=True)
class TrainerModel:
    """Trainer time per step, linear in the trained tokens (prompt + response) and in 1 / trainer dies.

    ``update_tok_s_die``: actor update (forward + backward + optimizer), tokens per second per die.
    ``forward_tok_s_die``: one log-prob forward pass (old log-prob or ref), tokens per second per die.
    ``step_s(tokens, dies, forward_passes)`` = tokens / dies * (1/update + forward_passes/forward).
    Perfect scaling in dies is assumed (no fixed per-step overhead): the published figures are one step at
    128 dies; smaller trainer pools with the same parallel layout per die keep the per-die rate.
    """

    update_tok_s_die: float
    forward_tok_s_die: float
    source: str = ""

    def __post_init__(self):
        for k in ("update_tok_s_die", "forward_tok_s_die"):
            v = getattr(self, k)
            if not (math.isfinite(v) and v > 0):
                raise SimError(f"TrainerModel.{k}={v!r}: must be a finite rate > 0 (tokens/s per die)")

    @classmethod
    def qwen3_235b(cls) -> TrainerModel:
        """From the reference's 235B GRPO step breakdown (128 dies): 201.8 update / 376.1 forward tok/s/die."""
        return cls(
            update_tok_s_die=REF_235B_TOKENS / REF_235B_UPDATE_S / REF_235B_DIES,
            forward_tok_s_die=REF_235B_TOKENS / REF_235B_FORWARD_S / REF_235B_DIES,
            source="cann-recipes-train Qwen3-235B GRPO table 1.3.1: update 2353.23 s, ref prefill 1262.269 s, 128 dies",
        )

    @classmethod
    def qwen3_32b(cls) -> TrainerModel:
        """The 235B rates scaled by active parameters (22B / 32.8B): same FLOP rate per die assumed.

        No 32B update time is published by the reference; a dense 32B usually reaches a higher FLOP rate
        than an EP-sharded MoE, so this is pessimistic for the trainer (uncertainty: x0.5-2).
        """
        s = ACTIVE_PARAMS_B["qwen3_235b"] / ACTIVE_PARAMS_B["qwen3_32b"]
        b = cls.qwen3_235b()
        return cls(
            update_tok_s_die=b.update_tok_s_die * s,
            forward_tok_s_die=b.forward_tok_s_die * s,
            source="235B per-die rates x 22/32.8 (active parameters); no published 32B breakdown",
        )

    def scaled(self, factor: float) -> TrainerModel:
        """A trainer ``factor`` times slower (factor > 1) or faster."""
        return TrainerModel(self.update_tok_s_die / factor, self.forward_tok_s_die / factor, self.source)

    def step_s(self, tokens: float, dies: int, forward_passes: int = 0) -> float:
        """Seconds for one update on ``tokens`` tokens with ``dies`` trainer dies, plus log-prob passes."""
        if dies < 1:
            raise SimError(f"trainer dies={dies}: must be >= 1")
        per_tok = 1.0 / self.update_tok_s_die + forward_passes / self.forward_tok_s_die
        return tokens * per_tok / dies


@dataclass(frozen=True)
class WeightSyncModel:
    """Seconds per weight sync between separate pools: BF16 weights / bandwidth + fixed overhead.

    Default bandwidth 5.5 GB/s from verl's checkpoint engine on 910C (Qwen3-30B-A3B, ~11 s, REFERENCE §4);
    ``resume_s`` = 1 s: the client's ``asyncio.sleep(1)`` before re-sending an aborted request.
    ``colocated_s``: the sync recipe's in-place weight update (resharding, no network): the reference's
    all-to-all-v reshard figure, 11.5 s per step (DeepSeek-V3), used for both models (small next to steps
    of thousands of seconds).
    """

    gb_per_s: float = REF_SYNC_GB / REF_SYNC_S
    resume_s: float = 1.0
    colocated_s: float = 11.5

    def sync_s(self, params_b: float) -> float:
        """Seconds to broadcast ``params_b`` billion BF16 parameters (without ``resume_s``)."""
        return params_b * 2.0 / self.gb_per_s


@dataclass(frozen=True)
class AsyncConfig:
    """The fully-async trainer's keys (``async_training.*`` and the batch sizes that feed them).

    ``n``: ``rollout.n``. ``required_samples``: ``ppo_mini_batch_size * require_batches`` prompts per trainer
    step. ``trigger_parameter_sync_step``: trainer steps per weight sync. ``staleness_threshold``: >= 0.
    ``partial_rollout``: resume aborted requests (True) or end them truncated (False).
    ``max_concurrent_samples``: prompts in flight (verl: active replicas x ``concurrent_samples_per_replica``,
    capped at ``max_required_samples``); None = enough to fill every replica's ``max_num_seqs``.
    ``sync_s``: seconds per weight sync (broadcast; ``resume_s`` is added), ``resume_s``.
    """

    n: int
    required_samples: int
    trigger_parameter_sync_step: int = 1
    staleness_threshold: float = 0.0
    partial_rollout: bool = True
    max_concurrent_samples: int | None = None
    sync_s: float = 0.0
    resume_s: float = 0.0

    def __post_init__(self):
        if self.n < 1 or self.required_samples < 1 or self.trigger_parameter_sync_step < 1:
            raise SimError(
                f"AsyncConfig n={self.n}, required_samples={self.required_samples}, "
                f"trigger_parameter_sync_step={self.trigger_parameter_sync_step}: each must be >= 1"
            )
        if not (self.staleness_threshold >= 0 and math.isfinite(self.staleness_threshold)):
            raise SimError(f"AsyncConfig staleness_threshold={self.staleness_threshold!r}: must be >= 0")
        if self.max_concurrent_samples is not None and self.max_concurrent_samples < 1:
            raise SimError(f"AsyncConfig max_concurrent_samples={self.max_concurrent_samples}: must be >= 1")
        if self.sync_s < 0 or self.resume_s < 0:
            raise SimError(f"AsyncConfig sync_s={self.sync_s}, resume_s={self.resume_s}: must be >= 0")

    @property
    def max_required_samples(self) -> int:
        """verl's ``set_max_required_samples``: int(required * (staleness + 1) * trigger)."""
        return int(self.required_samples * (self.staleness_threshold + 1) * self.trigger_parameter_sync_step)


#: A prompt source: called with the sample index, returns (prompt_len, n response lengths).
SampleSource = Callable[[int], tuple[int, Sequence[int]]]


@dataclass
class TrainerStep:
    """One trainer step: ``start_ms``/``end_ms`` of the update, ``samples`` (sample ids), ``tokens`` trained
    (prompt + generated), ``version`` (parameter version trained), ``staleness`` per sample (version at
    training minus the version its first token was generated with), ``partial`` per sample (generated
    under more than one version), ``sync_end_ms`` (after this step's weight sync, or None)."""

    start_ms: float
    end_ms: float
    samples: list[int]
    tokens: int
    version: int
    staleness: list[int]
    partial: list[bool]
    sync_end_ms: float | None = None


@dataclass
class AsyncResult:
    """Outcome of :func:`simulate_fully_async` (times in ms).

    ``steps``: the trainer steps. ``sample_submit_ms`` / ``sample_done_ms``: per submitted sample (NaN: not
    done). ``max_queue_len``, ``dropped_samples`` (queue overflow, verl drops the oldest), ``aborts`` (request
    aborts at syncs), ``reprefill_tokens`` (tokens prefilled again on resume or after KV preemption),
    ``rollout_busy_ms`` per replica, ``syncs`` (start, end) pairs, ``max_in_flight_samples``,
    ``max_submitted_per_version`` (most samples submitted between two syncs).
    """

    steps: list[TrainerStep]
    sample_submit_ms: np.ndarray
    sample_done_ms: np.ndarray
    max_queue_len: int
    dropped_samples: int
    aborts: int
    truncated_requests: int
    reprefill_tokens: int
    rollout_busy_ms: np.ndarray
    syncs: list[tuple[float, float]]
    max_in_flight_samples: int
    max_submitted_per_version: int
    extra: dict = field(default_factory=dict)

    def throughput(self, warmup: int = 1) -> tuple[float, float, int]:
        """(trained tokens, elapsed ms, steps) over the trainer steps after ``warmup``: from the end of step
        ``warmup`` (its sync included) to the end of the last step. Raises when too few steps ran."""
        if len(self.steps) <= warmup:
            raise SimError(f"throughput: {len(self.steps)} trainer steps, need more than warmup={warmup}")
        first = self.steps[warmup - 1] if warmup > 0 else None
        t0 = 0.0 if first is None else (first.sync_end_ms if first.sync_end_ms is not None else first.end_ms)
        last = self.steps[-1]
        t1 = last.sync_end_ms if last.sync_end_ms is not None else last.end_ms
        tokens = sum(s.tokens for s in self.steps[warmup:])
        return float(tokens), t1 - t0, len(self.steps) - warmup


# ---- the fully-async simulator ----------------------------------------------------------------------------

_WAIT, _RUN, _DONE, _PARKED = 1, 2, 3, 4


class _Rank:
    __slots__ = ("r", "b", "kv", "heap", "order", "waitq", "cached", "busy", "parked", "inflight")

    def __init__(self, r: int):
        self.r = r
        self.b = 0
        self.kv = 0
        self.heap: list = []  # (done_it, epoch, i)
        self.order: list = []  # (i, epoch) in admission order (preemption pops the latest)
        self.waitq: deque[int] = deque()
        self.cached: set[int] = set()
        self.busy = 0.0
        self.parked: list[int] = []
        self.inflight = 0


class _Group:
    """Replicas that step together: one rank (independent replica) or all ranks (lockstep)."""

    __slots__ = ("ranks", "clock", "it", "next_t", "next_m", "version", "stopped", "idle")

    def __init__(self, ranks: list[_Rank]):
        self.ranks = ranks
        self.clock = 0.0
        self.it = 0
        self.next_t = math.inf
        self.next_m = 0
        self.version = 0
        self.stopped = False
        self.idle = True


class _AsyncSim:
    def __init__(
        self,
        source: SampleSource,
        cost: CostModel,
        cfg: ReplicaConfig,
        acfg: AsyncConfig,
        train_s: Callable[[int], float],
        n_steps: int,
        seed: int,
        max_events: int,
    ):
        self.source, self.cost, self.cfg, self.acfg = source, cost, cfg, acfg
        self.train_s = train_s
        self.n_steps = n_steps
        self.max_events = max_events
        self.budget = math.inf if cfg.kv_budget_tokens is None else cfg.kv_budget_tokens
        self.ranks = [_Rank(r) for r in range(cfg.n_replicas)]
        self.groups = [_Group(self.ranks)] if cfg.lockstep else [_Group([rk]) for rk in self.ranks]
        self.group_of = {}
        for g in self.groups:
            for rk in g.ranks:
                self.group_of[rk.r] = g
        self.tie_rng = pyrandom.Random(seed)
        self.max_conc = acfg.max_concurrent_samples or max(1, cfg.n_replicas * cfg.max_num_seqs // acfg.n)
        self.max_conc = min(self.max_conc, acfg.max_required_samples)
        self.max_req = acfg.max_required_samples
        # requests
        self.P: list[int] = []
        self.L: list[int] = []
        self.S: list[int] = []  # sample of the request
        self.gen: list[int] = []
        self.status: list[int] = []
        self.rank_of: list[int] = []
        self.adm_it: list[int] = []
        self.adm_s: list[int] = []
        self.epoch: list[int] = []
        self.ver0: list[int] = []  # parameter version of the request's first token (-1: none yet)
        self.multi_ver: list[bool] = []
        # samples
        self.s_reqs: list[list[int]] = []
        self.s_left: list[int] = []
        self.s_submit: list[float] = []
        self.s_done: list[float] = []
        self.queue: deque[int] = deque()
        self.active = 0
        self.staleness_samples = 0
        self.submitted_this_version = 0
        self.max_submitted_per_version = 0
        self.max_in_flight = 0
        self.max_queue_len = 0
        self.dropped = 0
        self.aborts = 0
        self.truncated = 0
        self.reprefill = 0
        # trainer and syncs
        self.param_version = 0
        self.trainer_busy = False
        self.syncing = False
        self.sync_start = math.nan
        self.steps: list[TrainerStep] = []
        self.syncs: list[tuple[float, float]] = []
        self.events: list = []  # (t, seq, kind, payload)
        self.seq = 0
        self.done = False

    # -- events
    def push(self, t: float, kind: str, payload=None) -> None:
        heapq.heappush(self.events, (t, self.seq, kind, payload))
        self.seq += 1

    # -- submission (the rollouter's processor)
    def submit(self, now: float) -> None:
        while (
            not self.done
            and self.active < self.max_conc
            and self.staleness_samples < self.max_req
            and len(self.queue) < self.max_req
        ):
            sid = len(self.s_reqs)
            plen, lens = self.source(sid)
            lens = [int(x) for x in lens]
            if len(lens) != self.acfg.n or min(lens) < 1 or plen < 0:
                raise SimError(f"sample source gave prompt {plen} and lengths {lens[:4]}: need n={self.acfg.n} >= 1")
            for length in lens:
                if plen + length > self.budget:
                    raise SimError(
                        f"sample {sid}: prompt {plen} + response {length} exceed kv_budget_tokens={self.budget}"
                    )
            self.staleness_samples += 1
            self.submitted_this_version += 1
            self.max_submitted_per_version = max(self.max_submitted_per_version, self.submitted_this_version)
            self.active += 1
            self.max_in_flight = max(self.max_in_flight, self.active)
            ids = []
            for length in lens:
                i = len(self.P)
                self.P.append(int(plen))
                self.L.append(length)
                self.S.append(sid)
                self.gen.append(0)
                self.status.append(_WAIT)
                self.adm_it.append(0)
                self.adm_s.append(0)
                self.epoch.append(0)
                self.ver0.append(-1)
                self.multi_ver.append(False)
                # verl GlobalRequestLoadBalancer: fewest in flight, random tie-break
                low = min(rk.inflight for rk in self.ranks)
                cands = [rk for rk in self.ranks if rk.inflight == low]
                rk = cands[0] if len(cands) == 1 else self.tie_rng.choice(cands)
                rk.inflight += 1
                self.rank_of.append(rk.r)
                rk.waitq.append(i)
                ids.append(i)
                self.wake(self.group_of[rk.r], now)
            self.s_reqs.append(ids)
            self.s_left.append(len(ids))
            self.s_submit.append(now)
            self.s_done.append(math.nan)

    def wake(self, g: _Group, now: float) -> None:
        if g.idle and not g.stopped:
            g.idle = False
            g.clock = max(g.clock, now)
            g.version += 1
            g.next_t, g.next_m = g.clock, 0
            self.push(g.clock, "grp", (g, g.version))

    # -- trainer
    def try_train(self, now: float) -> None:
        if self.trainer_busy or self.syncing or self.done or len(self.queue) < self.acfg.required_samples:
            return
        batch = [self.queue.popleft() for _ in range(self.acfg.required_samples)]
        tokens = sum(self.P[i] + self.gen[i] for s in batch for i in self.s_reqs[s])
        stal = [self.param_version - min(self.ver0[i] for i in self.s_reqs[s]) for s in batch]
        part = [any(self.multi_ver[i] for i in self.s_reqs[s]) for s in batch]
        dur = self.train_s(tokens) * 1e3
        self.steps.append(TrainerStep(now, now + dur, batch, tokens, self.param_version, stal, part))
        self.trainer_busy = True
        self.push(now + dur, "train_done")
        self.submit(now)  # the queue shrank

    def train_done(self, now: float) -> None:
        self.trainer_busy = False
        if len(self.steps) % self.acfg.trigger_parameter_sync_step == 0:
            self.start_sync(now)
        elif len(self.steps) >= self.n_steps:
            self.done = True
        else:
            self.try_train(now)

    def start_sync(self, now: float) -> None:
        self.syncing = True
        self.sync_start = now
        for g in self.groups:
            if g.idle:
                self.stop_group(g, now)
            else:
                self.cut(g, now)
        self.maybe_sync_ready()

    def maybe_sync_ready(self) -> None:
        if self.syncing and all(g.stopped for g in self.groups):
            t = max(g.clock for g in self.groups)
            t = max(t, self.sync_start)
            self.push(t + (self.acfg.sync_s + self.acfg.resume_s) * 1e3, "sync_end", t)

    def sync_end(self, now: float) -> None:
        self.syncs.append((self.sync_start, now))
        self.steps[-1].sync_end_ms = now
        self.param_version += 1
        self.syncing = False
        for rk in self.ranks:
            rk.cached.clear()  # reset_prefix_cache at the sync
            if rk.parked:
                for i in reversed(rk.parked):
                    self.status[i] = _WAIT
                    rk.waitq.appendleft(i)
                rk.parked = []
        for g in self.groups:
            g.stopped = False
            g.idle = True
            g.clock = max(g.clock, now)
        # reset_staleness
        self.staleness_samples = self.active + len(self.queue)
        self.submitted_this_version = 0
        if len(self.steps) >= self.n_steps:
            self.done = True
            return
        for g in self.groups:
            if any(rk.waitq or rk.b for rk in g.ranks):
                self.wake(g, now)
        self.submit(now)
        self.try_train(now)

    # -- replicas
    def group_cost(self, g: _Group, m: int) -> float:
        c = self.cost
        act = [rk for rk in g.ranks if rk.b > 0]
        if not act or m <= 0:
            return 0.0
        if len(act) == 1:
            rk = act[0]
            return c.decode_run_ms(rk.b, rk.kv, m)
        a = [c.t0 + c.t1 * rk.b + c.t2 * rk.kv for rk in act]
        s = [c.t2 * rk.b for rk in act]
        return _sum_max_lines(a, s, m)

    def iters_to_reach(self, g: _Group, dt: float) -> int:
        """Smallest m with group_cost(m) >= dt (binary search; dt <= 0 gives 0)."""
        if dt <= 0:
            return 0
        lo, hi = 0, 1
        while self.group_cost(g, hi) < dt:
            lo, hi = hi, hi * 2
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.group_cost(g, mid) >= dt:
                hi = mid
            else:
                lo = mid
        return hi

    def cut(self, g: _Group, t_stop: float) -> None:
        """Make g's next boundary the first at or after t_stop (where the sync's abort takes effect)."""
        if g.next_t <= t_stop:
            return  # its own boundary comes first; it stops at the first boundary >= t_stop from there
        m = self.iters_to_reach(g, t_stop - g.clock)
        if m < g.next_m:
            g.version += 1
            g.next_m = m
            g.next_t = g.clock + self.group_cost(g, m)
            self.push(g.next_t, "grp", (g, g.version))

    def stop_group(self, g: _Group, now: float) -> None:
        """Abort at a sync: running and queued requests are parked (partial) or truncated."""
        g.stopped = True
        g.idle = True
        g.version += 1
        g.next_t = math.inf
        for rk in g.ranks:
            running = [i for (i, e) in rk.order if self.status[i] == _RUN and self.epoch[i] == e]
            for i in running:
                self.gen[i] = self.adm_s[i] + (g.it - self.adm_it[i])
            rk.heap.clear()
            rk.order.clear()
            rk.b = 0
            rk.kv = 0
            queued = list(rk.waitq)
            rk.waitq.clear()
            if self.acfg.partial_rollout:
                for i in running:
                    self.status[i] = _PARKED
                    self.aborts += 1
                rk.parked = running + queued  # resumed requests first, then the never-started ones
            else:
                for i in running:
                    self.truncated += 1
                    self.finish(rk, i, now)
                rk.parked = queued

    def finish(self, rk: _Rank, i: int, now: float) -> None:
        self.status[i] = _DONE
        rk.inflight -= 1
        s = self.S[i]
        self.s_left[s] -= 1
        if self.s_left[s] == 0:
            self.s_done[s] = now
            self.active -= 1
            if len(self.queue) >= self.max_req:
                self.queue.popleft()
                self.dropped += 1
            self.queue.append(s)
            self.max_queue_len = max(self.max_queue_len, len(self.queue))

    def boundary(self, g: _Group, now: float) -> None:
        # advance g.next_m iterations
        m = g.next_m
        if m:
            for rk in g.ranks:
                if rk.b:
                    rk.kv += rk.b * m
            dt = now - g.clock
            for rk in g.ranks:
                if rk.b:
                    rk.busy += dt
            g.it += m
        g.clock = now
        it = g.it
        # finished requests
        completed = False
        for rk in g.ranks:
            h = rk.heap
            while h and h[0][0] <= it:
                _, ep, i = heapq.heappop(h)
                if self.status[i] != _RUN or self.epoch[i] != ep:
                    continue
                self.gen[i] = self.L[i]
                rk.b -= 1
                rk.kv -= self.P[i] + self.L[i]
                self.finish(rk, i, now)
                completed = True
            if completed:
                rk.order = [(i, e) for (i, e) in rk.order if self.status[i] == _RUN and self.epoch[i] == e]
        if self.syncing and now >= self.sync_start:
            self.stop_group(g, now)
            self.maybe_sync_ready()
            if completed:
                self.try_train(now)
            return
        if completed:
            self.submit(now)
            self.try_train(now)
        # preemption, then admission
        lumps = []
        for rk in g.ranks:
            pre = False
            while rk.b and rk.kv > self.budget:
                while rk.order:
                    i, e = rk.order.pop()
                    if self.status[i] == _RUN and self.epoch[i] == e:
                        break
                else:
                    break
                self.gen[i] = self.adm_s[i] + (it - self.adm_it[i])
                self.status[i] = _WAIT
                self.epoch[i] += 1
                rk.b -= 1
                rk.kv -= self.P[i] + self.gen[i]
                rk.waitq.appendleft(i)
                pre = True
            lumps.append(0.0 if pre else self.admit(rk, it))
        lump = max(lumps) if lumps else 0.0
        if lump:
            for rk, own in zip(g.ranks, lumps, strict=True):
                if rk.b or own:
                    rk.busy += lump
            g.clock += lump
        self.schedule(g)

    def admit(self, rk: _Rank, it: int) -> float:
        lump = 0.0
        maxb = self.cfg.max_num_seqs
        while rk.waitq and rk.b < maxb:
            i = rk.waitq[0]
            g0 = self.gen[i]
            s = g0 if g0 > 0 else 1
            if rk.kv + self.P[i] + s > self.budget:
                break
            rk.waitq.popleft()
            ms, new = prefill_lump(self.cost, self.cfg.prefix_caching, rk.cached, self.S[i], self.P[i], g0)
            if g0 > 0:
                self.reprefill += new
            lump += ms
            if self.ver0[i] < 0:
                self.ver0[i] = self.param_version
            elif self.ver0[i] != self.param_version:
                self.multi_ver[i] = True
            self.status[i] = _RUN
            self.gen[i] = s
            self.adm_it[i] = it
            self.adm_s[i] = s
            self.epoch[i] += 1
            rk.kv += self.P[i] + s
            rk.b += 1
            heapq.heappush(rk.heap, (it + self.L[i] - s, self.epoch[i], i))
            rk.order.append((i, self.epoch[i]))
        return lump

    def schedule(self, g: _Group) -> None:
        g.version += 1
        m = math.inf
        for rk in g.ranks:
            if not rk.b:
                continue
            h = rk.heap
            while h and (self.status[h[0][2]] != _RUN or self.epoch[h[0][2]] != h[0][1]):
                heapq.heappop(h)
            mr = h[0][0] - g.it
            if self.budget != math.inf:
                mr = min(mr, int((self.budget - rk.kv) // rk.b) + 1)
            m = min(m, mr)
        if m == math.inf:
            g.idle = True
            g.next_t, g.next_m = math.inf, 0
            return
        g.idle = False
        g.next_m = int(m)
        g.next_t = g.clock + self.group_cost(g, g.next_m)
        self.push(g.next_t, "grp", (g, g.version))
        if self.syncing:
            self.cut(g, self.sync_start)

    def run(self) -> None:
        self.submit(0.0)
        n_ev = 0
        while self.events and not self.done:
            t, _, kind, payload = heapq.heappop(self.events)
            n_ev += 1
            if n_ev > self.max_events:
                raise SimError(f"fully-async simulation exceeded max_events={self.max_events}")
            if kind == "grp":
                g, ver = payload
                if ver != g.version:
                    continue
                self.boundary(g, t)
            elif kind == "train_done":
                self.train_done(t)
            elif kind == "sync_end":
                self.sync_end(t)
        if len(self.steps) < self.n_steps:
            raise SimError(
                f"fully-async simulation stalled after {len(self.steps)} of {self.n_steps} trainer steps "
                f"(queue {len(self.queue)}, active samples {self.active}): the gates never let enough samples through"
            )


def simulate_fully_async(
    source: SampleSource,
    cost: CostModel,
    replica_cfg: ReplicaConfig,
    acfg: AsyncConfig,
    train_s: Callable[[int], float],
    n_steps: int,
    *,
    seed: int = 0,
    max_events: int = 20_000_000,
) -> AsyncResult:
    """Simulate verl 0.9.1's fully-async pipeline for ``n_steps`` trainer steps (module docstring: the model).

    ``source(k)`` gives sample k's prompt length and its ``acfg.n`` response lengths (tokens).
    ``train_s(tokens)``: seconds of one trainer step on that many trained tokens (prompt + generated).
    ``replica_cfg`` / ``cost``: the rollouter's replicas (the engine's model). Deterministic for a seed.
    Raises :class:`~npu_rl.sim.model.SimError` on bad input, a request larger than the KV budget, or a
    pipeline that cannot deliver ``n_steps`` steps.
    """
    if n_steps < 1:
        raise SimError(f"simulate_fully_async n_steps={n_steps}: must be >= 1")
    sim = _AsyncSim(source, cost, replica_cfg, acfg, train_s, n_steps, seed, max_events)
    sim.run()
    return AsyncResult(
        steps=sim.steps,
        sample_submit_ms=np.array(sim.s_submit),
        sample_done_ms=np.array(sim.s_done),
        max_queue_len=sim.max_queue_len,
        dropped_samples=sim.dropped,
        aborts=sim.aborts,
        truncated_requests=sim.truncated,
        reprefill_tokens=sim.reprefill,
        rollout_busy_ms=np.array([rk.busy for rk in sim.ranks]),
        syncs=sim.syncs,
        max_in_flight_samples=sim.max_in_flight,
        max_submitted_per_version=sim.max_submitted_per_version,
        extra={"max_concurrent_samples": sim.max_conc, "max_required_samples": sim.max_req},
    )


# ---- sync and one-step-off -------------------------------------------------------------------------------


def _batch_requests(source: SampleSource, first_sample: int, n_prompts: int) -> list[SimRequest]:
    reqs: list[SimRequest] = []
    for k in range(n_prompts):
        plen, lens = source(first_sample + k)
        for length in lens:
            reqs.append(SimRequest(len(reqs), k, int(plen), int(length)))
    return reqs


@dataclass
class BatchResult:
    """Per step of a batch schedule: ``gen_ms``, ``train_ms``, ``tokens``, ``rollout_lb_ms`` (the engine's
    lower bound of that step's generation), and ``step_end_ms`` (cumulative)."""

    gen_ms: list[float]
    train_ms: list[float]
    tokens: list[int]
    rollout_lb_ms: list[float]
    step_end_ms: list[float]

    def throughput(self, warmup: int = 1) -> tuple[float, float, int]:
        """(tokens, elapsed ms, steps) after ``warmup`` steps (as :meth:`AsyncResult.throughput`)."""
        if len(self.step_end_ms) <= warmup:
            raise SimError(f"throughput: {len(self.step_end_ms)} steps, need more than warmup={warmup}")
        t0 = self.step_end_ms[warmup - 1] if warmup > 0 else 0.0
        return float(sum(self.tokens[warmup:])), self.step_end_ms[-1] - t0, len(self.tokens) - warmup


def simulate_sync(
    source: SampleSource,
    cost: CostModel,
    replica_cfg: ReplicaConfig,
    batch_prompts: int,
    train_s: Callable[[int], float],
    n_steps: int,
    *,
    colocated_sync_s: float = 0.0,
    seed: int = 0,
) -> BatchResult:
    """The synchronous colocated recipe: per step generate ``batch_prompts`` prompts on all replicas (verl's
    default routing), then ``train_s(tokens)`` seconds (old log-prob + update on all dies), then the
    colocated weight update. Step k uses samples k*batch .. (k+1)*batch-1 of ``source``."""
    out = BatchResult([], [], [], [], [])
    t = 0.0
    for k in range(n_steps):
        reqs = _batch_requests(source, k * batch_prompts, batch_prompts)
        res = simulate(reqs, cost, replica_cfg, VerlDefaultRouting(seed=seed + k))
        tokens = sum(r.prompt_len + r.response_len for r in reqs)
        tr = train_s(tokens) * 1e3
        t += res.step_ms + tr + colocated_sync_s * 1e3
        out.gen_ms.append(res.step_ms)
        out.train_ms.append(tr)
        out.tokens.append(tokens)
        out.rollout_lb_ms.append(res.lower_bound_ms)
        out.step_end_ms.append(t)
    return out


def simulate_one_step_off(
    source: SampleSource,
    cost: CostModel,
    replica_cfg: ReplicaConfig,
    batch_prompts: int,
    train_s: Callable[[int], float],
    n_steps: int,
    *,
    sync_s: float = 0.0,
    seed: int = 0,
) -> BatchResult:
    """verl's one-step-off-policy trainer on separate pools (``ray_trainer.py:fit_step``): step k waits for
    batch k's generation, syncs weights (``sync_s``; both pools wait), starts generating batch k+1 and trains
    on batch k at the same time. ``step_end_ms[k]``: when the update on batch k ends."""
    gens, toks, lbs = [], [], []
    for k in range(n_steps + 1):
        reqs = _batch_requests(source, k * batch_prompts, batch_prompts)
        res = simulate(reqs, cost, replica_cfg, VerlDefaultRouting(seed=seed + k))
        gens.append(res.step_ms)
        lbs.append(res.lower_bound_ms)
        toks.append(sum(r.prompt_len + r.response_len for r in reqs))
    out = BatchResult([], [], [], [], [])
    gen_end = gens[0]  # batch 0 generated from t = 0 (after the initial sync)
    train_end = 0.0
    for k in range(n_steps):
        s = max(gen_end, train_end) + sync_s * 1e3
        gen_end = s + gens[k + 1]
        tr = train_s(toks[k]) * 1e3
        train_end = s + tr
        out.gen_ms.append(gens[k])
        out.train_ms.append(tr)
        out.tokens.append(toks[k])
        out.rollout_lb_ms.append(lbs[k])
        out.step_end_ms.append(train_end)
    return out


# ---- bounds ------------------------------------------------------------------------------------------------


def rollout_work_ms(requests: Sequence[SimRequest], cost: CostModel, replica_cfg: ReplicaConfig) -> float:
    """Replica-ms of work to generate ``requests`` with every decode slot full: the numerator W of the
    engine's LB2 (:func:`npu_rl.sim.model.lower_bound`), ``sum_i sum_{j=1}^{L_i-1} (t0/B + t1 + t2*(P_i+j))``
    + one prompt prefill per group (per request without prefix caching), B = ``max_num_seqs``.

    An iteration of b <= B sequences costs at least ``t0/B + t1 + t2*kv`` per sequence, so generating these
    requests keeps the replicas busy for at least W in total, whatever the schedule, interleaving with
    other requests included: W / R bounds the time R replicas need for them.
    """
    reqs = list(requests)
    if not reqs:
        return 0.0
    p = np.array([r.prompt_len for r in reqs], dtype=np.float64)
    k = np.array([r.response_len for r in reqs], dtype=np.float64) - 1
    kvsum = k * p + k * (k + 1) / 2.0
    work = float(np.sum(k * (cost.t0 / replica_cfg.max_num_seqs + cost.t1) + cost.t2 * kvsum))
    if replica_cfg.prefix_caching:
        seen: dict[int, float] = {}
        for r in reqs:
            seen.setdefault(r.group, cost.prefill_ms(r.prompt_len))
        return work + sum(seen.values())
    return work + sum(cost.prefill_ms(r.prompt_len) for r in reqs)


__all__ = [
    "AsyncConfig",
    "AsyncResult",
    "BatchResult",
    "SampleSource",
    "TrainerModel",
    "TrainerStep",
    "WeightSyncModel",
    "rollout_work_ms",
    "simulate_fully_async",
    "simulate_one_step_off",
    "simulate_sync",
]
