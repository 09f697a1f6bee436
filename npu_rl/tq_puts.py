"""Fewer TransferQueue calls from verl's agent-loop workers: concurrent puts go out as one batch.

verl 0.9.1's V1 agent loop (``AgentLoopWorkerTQ``) writes every trajectory to TransferQueue with its
own ``async_kv_batch_put`` call, and every prompt's status (``running``, then ``finished``) with its
own ``async_kv_put``. TransferQueue 0.1.8 opens a new ZMQ context and socket for each call, and a
second one for the storage unit's notice to the controller (``transfer_queue.utils.zmq_utils.
with_zmq_socket``), so the cost is per call, not per byte: in the CPU learning run (1,024 one-token
responses a step, 2 agent-loop workers on 2 cores) py-spy put 80% of the workers' time in those
calls and generation took 22-31 s a step.

:class:`PutCoalescer` is a group commit: a put waits while an earlier call of the same kind is on
the wire, and everything that arrived meanwhile goes out in the next single call. An idle worker
sends at once (no timer, no added latency); a busy one sends larger batches. Each caller still
returns only once its own data is stored, so verl's order holds (a prompt's trajectories are in
TransferQueue before its ``finished`` status is written), and a failed call fails every put in it.
verl patch ``0013-verl-feature-coalesced-trajectory-puts`` routes the worker's puts through one
coalescer per worker.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from npu_rl import worker_log

#: ``put(keys, fields, tags, partition_id)``: one TransferQueue call; ``fields`` None writes tags only.
PutFn = Callable[[list[str], "list[dict[str, Any]] | None", list[dict[str, Any]], str], Awaitable[None]]


@dataclass
class _Pending:
    keys: list[str]
    fields: list[dict[str, Any]] | None
    tags: list[dict[str, Any]]
    done: asyncio.Future = field(repr=False)


@dataclass
class PutStats:
    """What a coalescer did: ``puts`` (calls of :meth:`PutCoalescer.put`), ``calls`` (TransferQueue
    calls made), ``keys`` (keys written)."""

    puts: int = 0
    calls: int = 0
    keys: int = 0

    def line(self) -> str:
        per = self.puts / self.calls if self.calls else 0.0
        return f"{self.puts} puts ({self.keys} keys) in {self.calls} TransferQueue calls, {per:.1f} puts a call"


class PutCoalescer:
    """Group commit of TransferQueue puts within one event loop.

    ``put`` is the real call (see :data:`PutFn`); ``max_keys`` bounds the keys of one call (a put
    larger than that goes alone); ``report`` receives :meth:`PutStats.line` at most every
    ``report_every_s`` seconds (0: never; default: a ``[npu-rl]`` line on stderr). Puts are batched
    only with puts of the same kind: the same partition and either tags only or fields with the same
    names (verl's ``list_of_dict_to_tensordict`` needs one set of names).
    """

    def __init__(
        self,
        put: PutFn,
        *,
        max_keys: int = 1024,
        report_every_s: float = 300.0,
        report: Callable[[str], None] = worker_log,
    ) -> None:
        if max_keys < 1:
            raise ValueError(f"max_keys must be >= 1 (got {max_keys})")
        self._put = put
        self._max_keys = max_keys
        self._pending: dict[tuple, deque[_Pending]] = {}
        self._busy: set[tuple] = set()
        self._tasks: set[asyncio.Task] = set()
        self._report_every_s = report_every_s
        self._reported = time.monotonic()
        self._report = report
        self.stats = PutStats()

    async def put(
        self,
        keys: Sequence[str],
        fields: Sequence[dict[str, Any]] | None,
        tags: Sequence[dict[str, Any]],
        partition_id: str,
    ) -> None:
        """Write ``keys`` with their ``fields`` (one dict per key, or None for tags only) and ``tags``
        (one per key) to ``partition_id``; returns once the call that carried them succeeded.

        Raises:
            ValueError: ``fields`` or ``tags`` not one per key, or the fields of one put with
                different names.
            Exception: whatever the TransferQueue call raised, in every put that call carried.
        """
        keys, tags = list(keys), list(tags)
        fields = None if fields is None else list(fields)
        if len(tags) != len(keys) or (fields is not None and len(fields) != len(keys)):
            raise ValueError(
                f"put of {len(keys)} key(s) with {len(tags)} tag(s) and "
                f"{'no' if fields is None else len(fields)} field dict(s): one of each per key"
            )
        if not keys:
            return
        kind = _kind(partition_id, fields)
        self.stats.puts += 1
        done = asyncio.get_running_loop().create_future()
        self._pending.setdefault(kind, deque()).append(_Pending(keys, fields, tags, done))
        if kind not in self._busy:
            self._send_next(kind)
        await done

    def _send_next(self, kind: tuple) -> None:
        queue = self._pending.get(kind)
        if not queue:
            self._pending.pop(kind, None)
            return
        batch, n = [], 0
        while queue and (not batch or n + len(queue[0].keys) <= self._max_keys):
            item = queue.popleft()
            batch.append(item)
            n += len(item.keys)
        if not queue:
            del self._pending[kind]
        self._busy.add(kind)
        task = asyncio.ensure_future(self._send(kind, batch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, kind: tuple, batch: list[_Pending]) -> None:
        try:
            keys = [k for item in batch for k in item.keys]
            tags = [t for item in batch for t in item.tags]
            fields = None if kind[1] is None else [f for item in batch for f in item.fields]  # type: ignore[union-attr]
            self.stats.calls += 1
            self.stats.keys += len(keys)
            await self._put(keys, fields, tags, kind[0])
        except BaseException as exc:  # every put in the call fails with it (CancelledError included)
            for item in batch:
                if not item.done.done():
                    item.done.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
        else:
            for item in batch:
                if not item.done.done():
                    item.done.set_result(None)
        finally:
            self._busy.discard(kind)
            self._send_next(kind)
            self._maybe_report()

    def _maybe_report(self) -> None:
        if self._report_every_s <= 0 or time.monotonic() - self._reported < self._report_every_s:
            return
        self._reported = time.monotonic()
        self._report(f"agent-loop puts so far: {self.stats.line()}")


def _kind(partition_id: str, fields: list[dict[str, Any]] | None) -> tuple:
    if fields is None:
        return (partition_id, None)
    names = tuple(sorted(fields[0]))
    for f in fields[1:]:
        if tuple(sorted(f)) != names:
            raise ValueError(
                f"put to {partition_id!r}: field dicts with different names ({names} and {tuple(sorted(f))})"
            )
    return (partition_id, names)


def for_worker(worker: Any) -> PutCoalescer:
    """The coalescer of one verl ``AgentLoopWorkerTQ`` (made on its first put, kept on the worker as
    ``_npu_rl_puts``), whose calls are verl's own: ``tq.async_kv_batch_put`` with the field dicts
    joined by ``verl.utils.tensordict_utils.list_of_dict_to_tensordict``."""
    coalescer = getattr(worker, "_npu_rl_puts", None)
    if coalescer is None:
        coalescer = PutCoalescer(verl_put)
        worker._npu_rl_puts = coalescer
        worker_log("agent-loop puts coalesced (verl patch 0013): one TransferQueue call per batch of concurrent puts")
    return coalescer


async def verl_put(
    keys: list[str], fields: list[dict[str, Any]] | None, tags: list[dict[str, Any]], partition_id: str
) -> None:
    """One ``transfer_queue.async_kv_batch_put`` as verl's agent loop makes it (see :data:`PutFn`)."""
    import transfer_queue as tq
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    await tq.async_kv_batch_put(
        keys=keys,
        partition_id=partition_id,
        fields=None if fields is None else list_of_dict_to_tensordict(fields),
        tags=tags,
    )
