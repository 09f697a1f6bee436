"""No automatic Python GC pauses inside vLLM engine steps; collection at step boundaries, bounded.

Host-bound decode at large batch allocates many small, short-lived objects per step (scheduler
outputs, per-request token lists, output objects, some reference cycles). CPython's automatic
collector fires whenever 700 container allocations outnumber deallocations (3.11's gen-0 threshold):
dozens of times per step, and now and then a full collection over the whole heap, right in the middle
of building the next batch while the NPU waits. The reference recipe turned automatic GC off around each
step of its offline loop. On vLLM 0.23 verl's rollout runs ``AsyncLLM`` with the engine core in its own
process (``EngineCoreProc.run_busy_loop`` -> ``EngineCore._process_engine_step`` in
``vllm/v1/engine/core.py``; the data-parallel loop ``DPEngineCoreProc.run_busy_loop`` calls the same
method). The vllm patch ``vllm-feature-engine-gc`` wraps that step in :func:`engine_step_gc`.

With ``NPU_RL_ENGINE_GC=1``, :class:`StepGC` keeps automatic collection off while the engine steps and
collects at step boundaries only:

- generations 0 and 1 every ``NPU_RL_ENGINE_GC_EVERY`` steps (default 32), or right after a step when
  more than ``NPU_RL_ENGINE_GC_MAX_GEN0`` container objects (default 200000) were allocated since the
  last collection, whichever comes first;
- a full collection at a step boundary once the process's allocated memory blocks
  (``sys.getallocatedblocks()``, O(1)) grew by more than ``NPU_RL_ENGINE_GC_FULL_GROWTH`` (default
  0.25) since the last full collection, so cyclic garbage that survived into the oldest generation is
  freed too. This is CPython's own rule for full collections (pending long-lived objects > 25 % of the
  long-lived total), measured cheaply: a full pass costs time proportional to the whole heap, so a
  fixed cadence would scan a large heap far too often.

Memory stays bounded: at most ``max(MAX_GEN0, one step's allocations)`` uncollected young objects
plus ``FULL_GROWTH`` x the heap after the last full collection.
vLLM freezes its start-up heap (``freeze_gc_heap`` at engine init: weights, KV-cache bookkeeping), so
full collections scan only what serving allocated. We do not ``gc.freeze()`` during serving: frozen
objects are never collected, so freezing request state would break the memory bound.
"""

from __future__ import annotations

import contextlib
import gc
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from npu_rl import settings, worker_log
from npu_rl.errors import NpuRlError

SWITCH = "NPU_RL_ENGINE_GC"
EVERY = "NPU_RL_ENGINE_GC_EVERY"
MAX_GEN0 = "NPU_RL_ENGINE_GC_MAX_GEN0"
FULL_GROWTH = "NPU_RL_ENGINE_GC_FULL_GROWTH"
DEFAULTS: dict[str, float] = {k: settings.setting(k).default for k in (EVERY, MAX_GEN0, FULL_GROWTH)}


@dataclass
class StepGC:
    """Context manager for one engine step: automatic GC off inside, bounded collection on exit.

    Args:
        every: collect generations 0-1 after this many steps (>= 1).
        max_gen0: ... or as soon as more container objects than this were allocated since the last
            collection (``gc.get_count()[0]``, allocations minus deallocations; >= 1).
        full_growth: a full collection once allocated blocks grew by this fraction since the last
            full one (> 0).
        blocks: the memory measure, ``sys.getallocatedblocks`` (tests pass a fake).
        clock: seconds, monotonic (tests pass a fake).

    Attributes:
        steps, young, full: counts of steps and collections so far; ``collect_s``: seconds spent in
        the collections this class triggered (a list, one entry per collection).

    Raises:
        NpuRlError: ``every`` or ``max_gen0`` below 1, ``full_growth`` not above 0.
    """

    every: int = int(DEFAULTS[EVERY])
    max_gen0: int = int(DEFAULTS[MAX_GEN0])
    full_growth: float = DEFAULTS[FULL_GROWTH]
    blocks: Callable[[], int] = sys.getallocatedblocks
    clock: Callable[[], float] = time.perf_counter
    steps: int = 0
    young: int = 0
    full: int = 0
    collect_s: list[float] = field(default_factory=list)
    report: Callable[[str], None] | None = None
    report_every: int = 16
    _since: int = 0
    _blocks_after_full: int | None = None

    def __post_init__(self) -> None:
        for name, value in (("every", self.every), ("max_gen0", self.max_gen0)):
            if int(value) < 1:
                raise NpuRlError(f"engine GC: {name}={value} must be >= 1")
        if not self.full_growth > 0:
            raise NpuRlError(f"engine GC: full_growth={self.full_growth} must be > 0")

    def __enter__(self) -> StepGC:
        # Stays off between steps too: the engine core loop steps back to back, and a collector
        # re-enabled in the microseconds of input handling would fire there at every step boundary
        # (3.11's gen-0 threshold is 700) and defeat the cadence. From the first guarded step on, this
        # guard is the process's collector; :meth:`close` hands collection back to CPython.
        gc.disable()
        if self._blocks_after_full is None:
            self._blocks_after_full = self.blocks()
        return self

    def __exit__(self, *exc) -> None:
        self.steps += 1
        self._since += 1
        if self._since >= self.every or gc.get_count()[0] > self.max_gen0:
            self.collect()

    def close(self) -> None:
        """Collect everything and re-enable automatic GC (engine shutdown, tests)."""
        gc.collect()
        gc.enable()

    def collect(self) -> None:
        """One bounded collection now: young (generations 0-1), then full if the heap still grew past the bound."""
        t0 = self.clock()
        base = self._blocks_after_full if self._blocks_after_full is not None else self.blocks()
        gc.collect(1)
        self.young += 1
        # what survived the young collection is headed for the oldest generation: a full pass when
        # it grew the heap past the bound
        if self.blocks() > base * (1 + self.full_growth):
            gc.collect(2)
            self.full += 1
            self._blocks_after_full = self.blocks()
        self._since = 0
        self.collect_s.append(self.clock() - t0)
        if self.report is not None and self.young % self.report_every == 0:
            self.report(self.summary())

    def summary(self) -> str:
        """One line: steps guarded, collections run and the longest one (what the step waited for)."""
        longest = max(self.collect_s, default=0.0) * 1e3
        return (
            f"engine GC: {self.steps} steps, {self.young} young + {self.full} full collections at step "
            f"boundaries, longest {longest:.1f} ms"
        )


_GUARD: contextlib.AbstractContextManager | None = None


def from_env(env: Mapping[str, str] | None = None) -> contextlib.AbstractContextManager:
    """The step guard ``env`` asks for: a :class:`StepGC`, or a no-op context when the switch is off.

    Raises:
        SettingsError: a non-boolean switch or a bad parameter (names the variable and the allowed values).
    """
    v = settings.values("no GC pauses in decode steps", env)
    if not v[SWITCH]:
        return contextlib.nullcontext()
    return StepGC(every=v[EVERY], max_gen0=v[MAX_GEN0], full_growth=v[FULL_GROWTH])


def engine_step_gc() -> contextlib.AbstractContextManager:
    """The process-wide guard for one engine step (built from the environment on first use).

    The vLLM patch calls ``with engine_step_gc(): outputs, executed = self.step_fn()``.
    """
    global _GUARD
    if _GUARD is None:
        _GUARD = from_env()
        if isinstance(_GUARD, StepGC):
            # No silent no-op: the engine core's log says the guard is on, then how it collects.
            _GUARD.report = worker_log
            worker_log(
                f"engine GC guard on ({SWITCH}=1): automatic GC off inside engine steps; collections every "
                f"{_GUARD.every} steps or past {_GUARD.max_gen0} young objects, "
                f"full past +{_GUARD.full_growth:.0%} heap"
            )
    return _GUARD
