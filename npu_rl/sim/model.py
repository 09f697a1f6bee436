"""Data types of the rollout simulator: cost model, replica configuration, requests, results, lower bound.

Units: times in milliseconds, sizes in tokens. See ``docs/sim.md`` for the calibration of the presets
(REFERENCE §7: published numbers, not measured by us) and their uncertainty ranges.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from npu_rl.errors import NpuRlError


class SimError(NpuRlError, ValueError):
    """Bad input to the rollout simulator (a request, a configuration, a routing answer)."""


@dataclass(frozen=True)
class CostModel:
    """Time of one vLLM engine step on one rollout replica (one vLLM engine = one DP rank), in ms.

    Decode: ``t(b, kv) = t0 + t1*b + t2*kv`` for one iteration over ``b`` running sequences that hold
    ``kv`` cached tokens in total (every sequence: prompt + tokens generated so far).
    Prefill: ``prefill_per_token * new_tokens * (1 + ctx_tokens / prefill_ctx_tokens)`` for computing the
    KV of ``new_tokens`` tokens of a sequence whose context is ``ctx_tokens`` long (the P-dependent
    factor models attention's quadratic part; ``prefill_ctx_tokens=inf`` switches it off).

    Source: REFERENCE §7 (reference write-ups, vLLM-Ascend benchmarks, CloudMatrix384 paper); uncertainty
    t0 ±50%, t1 up to 6x, t2 x0.4-1.6 (use :mod:`npu_rl.sim.sweep`).
    """

    t0: float = 20.0
    t1: float = 0.05
    t2: float = 1.0e-4
    prefill_per_token: float = 0.055
    prefill_ctx_tokens: float = 62_500.0

    def __post_init__(self):
        for name in ("t0", "t1", "t2", "prefill_per_token"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and math.isfinite(v) and v >= 0):
                raise SimError(f"CostModel.{name}={v!r}: must be a finite number >= 0 (ms)")
        if not self.t0 > 0:
            raise SimError(f"CostModel.t0={self.t0!r}: must be > 0 (every engine step has a fixed cost)")
        if not self.prefill_ctx_tokens > 0:
            raise SimError(f"CostModel.prefill_ctx_tokens={self.prefill_ctx_tokens!r}: must be > 0 (or inf)")

    @classmethod
    def qwen3_32b_tp8_a3_graph(cls) -> CostModel:
        """Qwen3-32B, one TP8 replica on A3 (4 cards = 8 dies), full-decode graph mode (REFERENCE §7 row 1)."""
        return cls(t0=20.0, t1=0.05, t2=1.0e-4, prefill_per_token=0.055, prefill_ctx_tokens=62_500.0)

    @classmethod
    def qwen3_32b_tp8_a3_eager(cls) -> CostModel:
        """Same as :meth:`qwen3_32b_tp8_a3_graph` in eager mode: t0 = 75 ms (published range 50-100)."""
        return dataclasses.replace(cls.qwen3_32b_tp8_a3_graph(), t0=75.0)

    @classmethod
    def qwen3_235b_dp_rank(cls) -> CostModel:
        """Qwen3-235B-A22B rollout, one DP rank (TP4) of TP4 x DP32 with EP128, BF16 (REFERENCE §7 row 3).

        §7 calls prefill "negligible for RL prompts"; we use a FLOP estimate instead of zero: 22B active
        parameters = 44 GFLOP/token on 4 dies at ~30% of 376 TFLOPS = 0.04 ms/token (a 2K prompt: 80 ms,
        against steps of hundreds of seconds).
        """
        return cls(t0=25.0, t1=0.1, t2=1.8e-4, prefill_per_token=0.04, prefill_ctx_tokens=62_500.0)

    def scaled(self, t0: float = 1.0, t1: float = 1.0, t2: float = 1.0, prefill: float = 1.0) -> CostModel:
        """A copy with each coefficient multiplied by the given factor (sensitivity sweeps)."""
        return dataclasses.replace(
            self, t0=self.t0 * t0, t1=self.t1 * t1, t2=self.t2 * t2, prefill_per_token=self.prefill_per_token * prefill
        )

    def decode_ms(self, b, kv):
        """One decode iteration with ``b`` running sequences holding ``kv`` cached tokens (scalars or arrays)."""
        return self.t0 + self.t1 * b + self.t2 * kv

    def decode_run_ms(self, b: int, kv0: float, m: int) -> float:
        """``m`` consecutive iterations at constant ``b``, starting from ``kv0`` cached tokens.

        kv grows by ``b`` per iteration, so the sum is ``m*(t0 + t1*b) + t2*(m*kv0 + b*m*(m-1)/2)``.
        """
        return m * (self.t0 + self.t1 * b) + self.t2 * (m * kv0 + b * m * (m - 1) / 2)

    def prefill_ms(self, new_tokens: float, ctx_tokens: float | None = None) -> float:
        """Prefill of ``new_tokens`` tokens whose sequence is ``ctx_tokens`` long (default: new_tokens)."""
        ctx = new_tokens if ctx_tokens is None else ctx_tokens
        return self.prefill_per_token * new_tokens * (1.0 + ctx / self.prefill_ctx_tokens)


@dataclass(frozen=True)
class ReplicaConfig:
    """The rollout replicas of one generation step.

    - ``n_replicas``: R, the number of vLLM engines (DP ranks) serving the step.
    - ``max_num_seqs``: vLLM's ``max_num_seqs``, running sequences per replica.
    - ``kv_budget_tokens``: KV-cache capacity per replica in tokens (None: unlimited). vLLM admits a
      waiting request only when a slot is free and its prompt + already generated tokens fit; when the
      running sequences' growth exhausts it mid-decode, vLLM V1 preempts by recompute the most recently
      admitted running request (``Scheduler.schedule``: ``self.running.pop()``, prepended to the waiting
      queue) and admits nothing new in that step. The simulator does the same (token granularity: blocks
      of ``block_size`` tokens are not modelled).
    - ``lockstep``: all replicas step together (expert parallelism across DP ranks: every rank joins every
      MoE all-to-all, idle ranks run dummy batches), so each iteration costs the max over the ranks.
    - ``prefix_caching``: a group's prompt is prefilled once per replica (vLLM prefix caching; cached
      prompts are assumed never evicted). KV memory is still counted per sequence (pessimistic).
    """

    n_replicas: int
    max_num_seqs: int = 256
    kv_budget_tokens: int | None = None
    lockstep: bool = False
    prefix_caching: bool = True

    def __post_init__(self):
        if not (isinstance(self.n_replicas, int) and self.n_replicas >= 1):
            raise SimError(f"ReplicaConfig.n_replicas={self.n_replicas!r}: must be an int >= 1")
        if not (isinstance(self.max_num_seqs, int) and self.max_num_seqs >= 1):
            raise SimError(f"ReplicaConfig.max_num_seqs={self.max_num_seqs!r}: must be an int >= 1")
        if self.kv_budget_tokens is not None and not self.kv_budget_tokens >= 1:
            raise SimError(f"ReplicaConfig.kv_budget_tokens={self.kv_budget_tokens!r}: must be >= 1 or None")

    @classmethod
    def qwen3_32b_recipe(cls, n_replicas: int = 4) -> ReplicaConfig:
        """Qwen3-32B recipe: 4 replicas of TP8 (32 dies), max_num_seqs 256, ~1.35M KV tokens per replica."""
        return cls(n_replicas=n_replicas, max_num_seqs=256, kv_budget_tokens=1_350_000, lockstep=False)

    @classmethod
    def qwen3_235b_recipe(cls, n_replicas: int = 32) -> ReplicaConfig:
        """Qwen3-235B recipe: TP4 x DP32 with EP128, ranks in lockstep, 256 seqs, ~900K KV tokens per rank."""
        return cls(n_replicas=n_replicas, max_num_seqs=256, kv_budget_tokens=900_000, lockstep=True)


@dataclass
class SimRequest:
    """One rollout request (one sample of one prompt).

    - ``rid``: unique id (any int); ``group``: prompt identity in this step (the n samples of a prompt
      share it; GRPO group); ``prompt_len`` / ``response_len``: tokens (response_len >= 1, the true length
      the request will generate); ``predicted_len``: a length prediction for length-aware routing, or None;
      ``arrival_ms``: when the request reaches the routing (0 = the whole batch at once, as verl does);
      ``prompt_id``: optional dataset identity of the prompt (workloads set it; groups are per step).
    """

    rid: int
    group: int
    prompt_len: int
    response_len: int
    predicted_len: float | None = None
    arrival_ms: float = 0.0
    prompt_id: int | None = None


@dataclass
class SimResult:
    """Outcome of one simulated generation step. Arrays of length N follow the order of the input requests.

    - ``step_ms``: time the last request finished (the step's generation time).
    - ``replica_busy_ms`` (R,): time each replica held at least one running or prefilling sequence.
    - ``replica_work_ms`` (R,): the replica's own step costs (equals busy without lockstep; in lockstep the
      rank's own t(b, kv), not the max over ranks it waited for).
    - ``idle_fraction`` (R,): ``1 - replica_busy_ms / step_ms``.
    - ``rids``, ``replica`` (final replica), ``admit_ms`` (first admission), ``finish_ms``, ``generated``
      (tokens generated; < response_len when truncated), ``tokens_lost`` (response_len - generated),
      ``preemptions`` and ``aborts`` (per request).
    - ``timeline``: per replica ``(times_ms, running)`` arrays, the running count from each time on.
    - ``decode_iterations`` (R,): decode iterations per replica (in lockstep every rank counts the global
      iterations it took part in with running sequences).
    - ``reprefill_tokens``: tokens prefilled again after preemption or abort.
    - ``lower_bound_ms``: :func:`lower_bound` of the input requests.
    """

    step_ms: float
    replica_busy_ms: np.ndarray
    replica_work_ms: np.ndarray
    rids: np.ndarray
    replica: np.ndarray
    admit_ms: np.ndarray
    finish_ms: np.ndarray
    generated: np.ndarray
    tokens_lost: np.ndarray
    preemptions: np.ndarray
    aborts: np.ndarray
    timeline: list[tuple[np.ndarray, np.ndarray]]
    decode_iterations: np.ndarray
    reprefill_tokens: int
    lower_bound_ms: float
    extra: dict = field(default_factory=dict)

    @property
    def idle_fraction(self) -> np.ndarray:
        if self.step_ms <= 0:
            return np.zeros_like(self.replica_busy_ms)
        return 1.0 - self.replica_busy_ms / self.step_ms

    @property
    def ratio_to_lower_bound(self) -> float:
        """``step_ms / lower_bound_ms`` (>= 1 when no request was truncated)."""
        return self.step_ms / self.lower_bound_ms if self.lower_bound_ms > 0 else float("nan")

    @property
    def requests_per_replica(self) -> np.ndarray:
        return np.bincount(self.replica, minlength=len(self.replica_busy_ms))

    @property
    def total_decode_iterations(self) -> int:
        return int(self.decode_iterations.sum())


def _decode_sums(p: np.ndarray, n: np.ndarray) -> np.ndarray:
    """sum_{j=1}^{n-1} (p + j) for arrays p, n (the cached tokens of a sequence's n-1 decode iterations)."""
    k = n - 1
    return k * p + k * (k + 1) / 2.0


def lower_bound(requests: Sequence[SimRequest], cost: CostModel, replica_cfg: ReplicaConfig) -> float:
    """A lower bound (ms) on the step time of :func:`npu_rl.sim.simulate` for any routing.

    ``max(LB1, LB2)`` with, for request i of prompt length P and response length L:

    - LB1 = max_i [ prefill(P) + sum_{j=1}^{L-1} (t0 + t1 + t2*(P+j)) ]: the request decoded alone.
    - LB2 = W / R with W = sum_i sum_{j=1}^{L-1} (t0/B + t1 + t2*(P+j)) + sum of prefill(P) over groups
      (over requests without prefix caching), B = min(max_num_seqs, N).

    Proof (for the model simulated; truncation breaks it: the bound assumes every request completes).
    A request's prompt is prefilled on its replica before its first decode iteration, and that prefill
    (its own, or with prefix caching a group member's on the same replica) costs at least prefill(P).
    After the first prefill the request needs exactly L-1 decode iterations, in which its cached tokens
    are P+1, ..., P+L-1 (a re-admission after preemption or abort re-prefills but does not sample a
    token, so it adds cost and no iteration is saved). These iterations run one after another, and one
    that runs b >= 1 sequences holding kv >= P+j tokens costs t0 + t1*b + t2*kv >= t0 + t1 + t2*(P+j)
    (in lockstep, the max over ranks is at least the own rank's cost): LB1. For LB2, split an
    iteration's cost t0 + t1*b + t2*sum(kv_s) over its b sequences as t0/b + t1 + t2*kv_s each; since
    b <= B, each share is >= t0/B + t1 + t2*kv_s, so the sum over all iterations of all replicas is at
    least the decode part of W; prefills add at least one prefill(P) per group (per request without
    prefix caching). The step lasts at least as long as the busiest replica, which is at least the
    mean busy time >= W / R (in lockstep each iteration and prefill costs the max over ranks, which is
    at least their mean). Hence step_ms >= max(LB1, LB2).
    """
    reqs = list(requests)
    if not reqs:
        return 0.0
    p = np.array([r.prompt_len for r in reqs], dtype=np.float64)
    n = np.array([r.response_len for r in reqs], dtype=np.float64)
    kvsum = _decode_sums(p, n)
    prefill = cost.prefill_per_token * p * (1.0 + p / cost.prefill_ctx_tokens)
    lb1 = float(np.max(prefill + (n - 1) * (cost.t0 + cost.t1) + cost.t2 * kvsum))
    big_b = min(replica_cfg.max_num_seqs, len(reqs))
    work = float(np.sum((n - 1) * (cost.t0 / big_b + cost.t1) + cost.t2 * kvsum))
    if replica_cfg.prefix_caching:
        seen: dict[int, float] = {}
        for r, pf in zip(reqs, prefill, strict=True):
            seen.setdefault(r.group, float(pf))
        work += sum(seen.values())
    else:
        work += float(prefill.sum())
    return max(lb1, work / replica_cfg.n_replicas)
