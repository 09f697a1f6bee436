"""Asyncio front of the dispatch policy: callers await a slot, run their request, release it.

:class:`Dispatcher` is what the verl load balancer actor holds (one per rollout, shared by every
agent-loop worker): ``target = await acquire(...)`` returns when the policy releases the request to a
target; ``release(...)`` frees the slot and feeds the length predictor; ``fail(...)`` frees it and
counts a failure against the target. :meth:`Dispatcher.run` wraps the three with retries, and
:func:`dispatch_batch` runs a whole batch and returns the outputs in input order.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

from npu_rl.errors import NpuRlError
from npu_rl.rebalance.policy import DispatchPolicy, StepStats
from npu_rl.rebalance.predictor import DEFAULT_KV_RATIO, EMALengthPredictor, LengthPredictor

logger = logging.getLogger(__name__)
T = TypeVar("T")


class Dispatcher:
    """Pull-based, longest-predicted-first release of requests to rollout targets.

    Args:
        targets: target name -> slots (``max_num_seqs`` of the replica / DP rank).
        predictor: response-length model (default: :class:`EMALengthPredictor`).
        order, keep_groups, kv_ratio, max_target_failures: see :class:`DispatchPolicy`.
        gather_s: when a request arrives at an idle dispatcher, hold releases this long (seconds) so
            the whole batch is sorted before the first slot is handed out. The agent-loop workers
            submit a batch within well under a second; a step lasts minutes.
        clock: time source in seconds (tests pass a fake).
    """

    def __init__(
        self,
        targets: Mapping[str, int],
        *,
        predictor: LengthPredictor | None = None,
        order: str = "longest",
        keep_groups: bool = False,
        kv_ratio: float = DEFAULT_KV_RATIO,
        gather_s: float = 0.0,
        max_target_failures: int = 3,
        clock: Callable[[], float] = time.monotonic,
    ):
        if gather_s < 0:
            raise NpuRlError(f"gather window must be >= 0 s, got {gather_s} (ROLLOUT_REBALANCE_GATHER_S)")
        self.policy = DispatchPolicy(
            targets, order=order, keep_groups=keep_groups, kv_ratio=kv_ratio, max_target_failures=max_target_failures
        )
        self.predictor: LengthPredictor = predictor if predictor is not None else EMALengthPredictor()
        self.gather_s = gather_s
        self.clock = clock
        self._futures: dict[str, asyncio.Future[str]] = {}
        self._removed: set[str] = set()  # taken out on purpose (they come back): requests wait for them
        self._gate: asyncio.TimerHandle | None = None
        self._metrics: list[dict[str, float]] = []

    # ----- the three calls a request makes
    async def acquire(
        self, request_id: str, *, group: str | None = None, prompt_len: int = 0, affinity: str | None = None
    ) -> str:
        """Wait for a slot; returns the target name.

        Raises:
            NpuRlError: the same request id is already waiting or in flight; every target has failed.
        """
        if self._all_failed():
            raise NpuRlError("no healthy rollout target left in the dispatcher (every replica failed)")
        group = group if group is not None else request_id
        predicted = self.predictor.predict(group, prompt_len)
        if predicted is None:
            predicted = self.predictor.prior()
        req = self.policy.make_request(
            request_id, group=group, prompt_len=prompt_len, predicted_len=predicted, affinity=affinity
        )
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[str] = loop.create_future()
        was_idle = self.policy.idle()
        self.policy.submit(req, self.clock())
        self._futures[request_id] = fut
        if was_idle and self.gather_s > 0:
            self._gate = loop.call_later(self.gather_s, self._open_gate)
        self._pump()
        try:
            return await fut
        except asyncio.CancelledError:
            self._futures.pop(request_id, None)
            if self.policy.cancel(request_id, self.clock()) is None and fut.done() and not fut.cancelled():
                self.policy.finish(request_id, self.clock())  # assigned, then its caller went away
            self._after_change()
            raise

    def release(self, request_id: str, *, response_len: int | None = None) -> None:
        """The request finished on its target (``response_len`` generated tokens, if known)."""
        req = self.policy.finish(request_id, self.clock(), response_len)
        if response_len is not None:
            self.predictor.observe(req.group, req.prompt_len, int(response_len))
        self._after_change()

    def fail(self, request_id: str) -> None:
        """The request failed on its target: its slot is freed and the failure counted there."""
        self.policy.fail(request_id, self.clock(), requeue=False)
        self._after_change()

    async def run(
        self,
        request_id: str,
        call: Callable[[str], Awaitable[T]],
        *,
        group: str | None = None,
        prompt_len: int = 0,
        max_attempts: int = 3,
        response_len: Callable[[T], int] | None = None,
    ) -> T:
        """acquire -> ``await call(target)`` -> release, retrying on another target after an exception.

        Raises:
            the last exception of ``call`` after ``max_attempts`` attempts.
        """
        for attempt in range(1, max_attempts + 1):
            target = await self.acquire(request_id, group=group, prompt_len=prompt_len)
            try:
                out = await call(target)
            except Exception:
                self.fail(request_id)
                if attempt == max_attempts:
                    raise
                logger.warning("rollout request %s failed on %s (attempt %d), requeued", request_id, target, attempt)
                continue
            self.release(request_id, response_len=response_len(out) if response_len else None)
            return out
        raise AssertionError("unreachable")

    # ----- targets and metrics
    def add_target(self, name: str, capacity: int) -> None:
        """Register a target, or bring back one that was removed or had failed."""
        self._removed.discard(name)
        self.policy.add_target(name, capacity)
        self._pump()

    def remove_target(self, name: str) -> None:
        """Take a target out of rotation on purpose (verl removes servers during weight sync in
        hybrid mode): waiting requests keep waiting for it, they do not fail."""
        self._removed.add(name)
        self.policy.remove_target(name)
        self._after_change()

    def _all_failed(self) -> bool:
        return not self.policy.healthy_targets() and not self._removed

    def step_metrics(self) -> list[dict[str, float]]:
        """Metrics of the steps finished since the last call (oldest first), then forgets them."""
        out, self._metrics = self._metrics, []
        return out

    @property
    def last_step(self) -> StepStats | None:
        return self.policy.finished_steps[-1] if self.policy.finished_steps else None

    # ----- internals
    def _open_gate(self) -> None:
        self._gate = None
        self._pump()

    def _after_change(self) -> None:
        self._collect_steps()
        if self._all_failed():
            err = NpuRlError("no healthy rollout target left in the dispatcher (every replica failed)")
            for rid, fut in list(self._futures.items()):
                if not fut.done():
                    self.policy.cancel(rid, self.clock())
                    fut.set_exception(err)
                    self._futures.pop(rid)
            return
        self._pump()

    def _pump(self) -> None:
        if self._gate is not None:
            return
        for req in self.policy.assign(self.clock()):
            fut = self._futures.pop(req.request_id, None)
            if fut is None or fut.done():  # caller vanished between submit and release
                self.policy.finish(req.request_id, self.clock())
                continue
            fut.set_result(req.target)
        self._collect_steps()

    def _collect_steps(self) -> None:
        for st in self.policy.drain_steps():
            m = st.metrics()
            self._metrics.append(m)
            logger.info(
                "rollout rebalance step: %.1f s, idle mean %.2f max %.2f, retries %d",
                m["rollout_rebalance/step_s"],
                m.get("rollout_rebalance/idle_fraction/mean", 0.0),
                m.get("rollout_rebalance/idle_fraction/max", 0.0),
                st.retries,
            )
        del self._metrics[:-64]


async def dispatch_batch(
    dispatcher: Dispatcher,
    requests: Sequence[Any],
    call: Callable[[Any, str], Awaitable[T]],
    *,
    group_of: Callable[[Any], str],
    prompt_len_of: Callable[[Any], int] = lambda r: 0,
    response_len: Callable[[T], int] | None = None,
    max_attempts: int = 3,
) -> list[T]:
    """Run every request through ``dispatcher`` concurrently; the outputs come back in INPUT order.

    ``call(request, target)`` runs one request on a target. Whatever order requests finish in,
    output ``i`` belongs to ``requests[i]``: :func:`restore_order` checks it.

    Raises:
        NpuRlError: an output is missing or duplicated (never expected; a guard for the trainer).
    """
    done: list[tuple[int, T]] = []

    async def one(i: int, r: Any) -> None:
        out = await dispatcher.run(
            f"batch-{id(requests)}-{i}",
            lambda target: call(r, target),
            group=group_of(r),
            prompt_len=prompt_len_of(r),
            max_attempts=max_attempts,
            response_len=response_len,
        )
        done.append((i, out))

    await asyncio.gather(*(one(i, r) for i, r in enumerate(requests)))
    return restore_order(done, len(requests))


def restore_order(finished: Sequence[tuple[int, T]], n: int) -> list[T]:
    """Outputs tagged with their input position, in completion order -> outputs in input order.

    Raises:
        NpuRlError: a position is missing, repeated or outside ``range(n)``.
    """
    slots: list[Any] = [None] * n
    seen = [False] * n
    for i, out in finished:
        if not 0 <= i < n:
            raise NpuRlError(f"rollout output for position {i} outside the batch of {n}")
        if seen[i]:
            raise NpuRlError(f"rollout output for position {i} returned twice")
        seen[i] = True
        slots[i] = out
    missing = [i for i, s in enumerate(seen) if not s]
    if missing:
        raise NpuRlError(f"rollout outputs missing for {len(missing)} position(s), first {missing[:5]}")
    return slots
