"""verl 0.9.1 glue: the load-balancer actor and the client mixin that put the dispatcher in the path.

Request path (verl 0.9.1): agent loop -> ``LLMServerClient.generate`` -> ``acquire_server`` on the
shared ``GlobalRequestLoadBalancer`` actor -> ``vLLMHttpServer.generate`` -> ``release_server``.

:class:`RebalanceLoadBalancer` subclasses verl's balancer; its ``acquire_server`` is *async*: it
returns when :class:`~npu_rl.rebalance.dispatcher.Dispatcher` releases the request (pull-based,
longest-predicted-first). The server id it returns is ``"<target>|<ticket>"`` (target ``replica<i>`` or
``replica<i>#dp<r>``); verl's client hands it back unchanged to ``release_server``, so even an
unpatched client releases the right slot.

:class:`RebalanceClientMixin` (mixed into verl's client class by the hook) sends what the balancer
needs and verl's client does not: the prompt key (hash of the prompt token ids: the same for the n
samples of a group and across epochs), the prompt length, the response length on release, and, for a
target that is one DP rank of a multi-rank replica, ``data_parallel_rank`` to vLLM (the verl patch
lets ``vLLMHttpServer.generate`` pass it to ``AsyncLLM.generate``). It retries a request whose
replica died (Ray actor errors) on another target, up to ``ROLLOUT_REBALANCE_MAX_ATTEMPTS``.

Replicas and DP ranks in verl 0.9.1 (``LLMServerManager._initialize_llm_servers``): one replica spans
``TP x DP x PP`` devices and the number of replicas is ``world / (TP x DP x PP)``. With
``rollout.data_parallel_size > 1`` each replica starts one ``vLLMHttpServer`` per node, node 0 runs
vLLM's API server with ``data_parallel_size`` engines (the other nodes run headless), and only node
0's server handle reaches the balancer. So the Qwen3-235B recipe (TP4 x DP32 on 128 dies) has ONE
replica; vLLM balances its 32 DP ranks by request count (``DPLBAsyncMPClient``: waiting * 4 +
running). With ``ROLLOUT_REBALANCE_DP_RANKS`` on (default) each DP rank is a dispatcher target of
``max_num_seqs`` slots and the rank is chosen here.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import json
import logging
import time
from typing import Any

import ray
from ray.exceptions import RayActorError
from verl.workers.rollout.router import DEFAULT_ROUTING_CACHE_SIZE, GlobalRequestLoadBalancer

from npu_rl.rebalance.dispatcher import Dispatcher
from npu_rl.rebalance.predictor import EMALengthPredictor, NoPredictor, prompt_key
from npu_rl.rebalance.settings import RebalanceSettings

logger = logging.getLogger(__name__)

SEP = "|"
DP = "#dp"


def split_server_id(server_id: str) -> tuple[str, str, int | None]:
    """``"<server>[#dp<r>]|<ticket>"`` -> (target, ticket, dp_rank or None)."""
    target, _, ticket = server_id.rpartition(SEP)
    if not target:
        return server_id, "", None
    base, dp, rank = target.rpartition(DP)
    return target, ticket, int(rank) if dp and rank.isdigit() else None


class RebalanceLoadBalancer(GlobalRequestLoadBalancer):
    """verl's load balancer with pull-based, length-aware dispatch (async ``acquire_server``).

    The hook binds ``rebalance_settings`` on a subclass (see :func:`npu_rl.rebalance.verl_hook.
    load_balancer_cls`); the constructor signature is verl's.
    """

    rebalance_settings: RebalanceSettings = RebalanceSettings()

    def __init__(
        self,
        servers: dict[str, Any],
        max_cache_size: int = DEFAULT_ROUTING_CACHE_SIZE,
        full_determinism: bool = False,
    ):
        super().__init__(servers, max_cache_size=max_cache_size, full_determinism=False)
        s = self.rebalance_settings
        predictor = (
            EMALengthPredictor(decay=s.ema_decay, prior_len=s.prior_len) if s.predict else NoPredictor(s.prior_len)
        )
        self.dispatcher = Dispatcher(
            {}, predictor=predictor, order=s.order, keep_groups=s.keep_groups, gather_s=s.gather_s
        )
        self._tickets = itertools.count()
        self._target_server: dict[str, str] = {}
        self._replica_index: dict[str, int] = {}  # server address -> stable replica number (metric names)
        self._pending_metrics: list[dict[str, float]] = []
        self._add_targets(list(servers))
        logger.warning(
            "rollout rebalance on: %d target(s) x %d slots (%s, keep_groups=%s, predict=%s)",
            len(self._target_server),
            s.slots(),
            s.order,
            s.keep_groups,
            s.predict,
        )

    def _targets_of(self, server_id: str) -> list[str]:
        """Target names of a server: ``replica<i>`` or ``replica<i>#dp<r>`` (``i`` in registration
        order, stable across runs unlike the server's address; used in the metric names)."""
        i = self._replica_index.setdefault(server_id, len(self._replica_index))
        k = self.rebalance_settings.dp_targets()
        return [f"replica{i}"] if k == 1 else [f"replica{i}{DP}{r}" for r in range(k)]

    def _add_targets(self, server_ids: list[str]) -> None:
        for sid in server_ids:
            for t in self._targets_of(sid):
                self._target_server[t] = sid
                self.dispatcher.add_target(t, self.rebalance_settings.slots())

    async def acquire_server(
        self, request_id: str, prompt_key: str | None = None, prompt_len: int = 0
    ) -> tuple[str, ray.actor.ActorHandle]:
        """Wait until the dispatcher releases this request; returns ``("<target>|<ticket>", handle)``.

        A later turn of the same ``request_id`` (verl's sticky session) waits for its earlier target.

        Raises:
            RuntimeError: no server is registered (verl's message, which its clients retry on).
        """
        if not self._servers:
            raise RuntimeError("No available servers in load balancer")
        affinity = self._request_id_to_server.get(request_id)
        ticket = f"{request_id}:{next(self._tickets)}"
        target = await self.dispatcher.acquire(
            ticket, group=prompt_key or request_id, prompt_len=int(prompt_len), affinity=affinity
        )
        sid = self._target_server[target]
        self._request_id_to_server[request_id] = target
        self._inflight_requests[sid] = self._inflight_requests.get(sid, 0) + 1
        return f"{target}{SEP}{ticket}", self._servers[sid]

    def release_server(
        self, server_id: str, request_id: str | None = None, response_len: int | None = None, failed: bool = False
    ) -> None:
        """Free the slot of ``server_id`` (as returned by :meth:`acquire_server`).

        ``response_len`` feeds the length predictor; ``failed`` counts a replica failure;
        ``request_id`` is verl's (0.9.1) and not needed: the ticket is in ``server_id``.
        """
        target, ticket, _ = split_server_id(server_id)
        sid = self._target_server.get(target)
        if sid is not None and self._inflight_requests.get(sid, 0) > 0:
            self._inflight_requests[sid] -= 1
        if not ticket:
            return
        try:
            if failed:
                self.dispatcher.fail(ticket)
            else:
                self.dispatcher.release(ticket, response_len=response_len)
        except Exception as e:  # noqa: BLE001 - a stale release must never kill the balancer actor
            logger.warning("rollout rebalance: release of %s ignored: %s", server_id, e)
        self._write_metrics()

    def add_servers(self, servers: dict[str, Any]) -> None:
        super().add_servers(servers)
        self._add_targets(list(servers))

    def remove_servers(self, server_ids: list[str]) -> None:
        super().remove_servers(server_ids)
        for sid in server_ids:
            for t in self._targets_of(sid):
                self.dispatcher.remove_target(t)

    async def get_rebalance_metrics(self, wait_idle_s: float = 0.0) -> list[dict[str, float]]:
        """Per-step metrics (see :meth:`StepStats.metrics`) of the steps finished since the last call.

        ``wait_idle_s``: first wait up to this long for the step in progress to end (the last
        releases are fire-and-forget calls and may trail the trainer by milliseconds).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_idle_s
        while not self.dispatcher.policy.idle() and loop.time() < deadline:
            await asyncio.sleep(0.02)
        self._write_metrics()
        out, self._pending_metrics = self._pending_metrics, []
        return out

    def _write_metrics(self) -> None:
        new = self.dispatcher.step_metrics()
        if not new:
            return
        self._pending_metrics = (self._pending_metrics + new)[-64:]
        path = self.rebalance_settings.metrics_file
        if path:
            with open(path, "a") as f:
                for m in new:
                    f.write(json.dumps({"time": time.time(), **m}) + "\n")


class _RankedHandle:
    """A server handle whose ``generate.remote(...)`` adds ``data_parallel_rank``."""

    def __init__(self, handle: Any, rank: int):
        self._handle, self._rank = handle, rank
        self.generate = self

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        return self._handle.generate.remote(*args, data_parallel_rank=self._rank, **kwargs)


_CALL: contextvars.ContextVar[dict | None] = contextvars.ContextVar("npu_rl_rebalance_call", default=None)


class RebalanceClientMixin:
    """Mixed in front of verl's ``LLMServerClient`` (or a subclass) by the hook."""

    rebalance_max_attempts: int = 3

    async def generate(self, request_id, *, prompt_ids, **kwargs):  # noqa: ANN001 - verl's signature
        key, plen = prompt_key(prompt_ids), len(prompt_ids)
        for attempt in range(1, self.rebalance_max_attempts + 1):
            call = {"key": key, "len": plen, "server_id": None}
            token = _CALL.set(call)
            try:
                out = await super().generate(request_id, prompt_ids=prompt_ids, **kwargs)
            except RayActorError:
                self._rebalance_release(call, failed=True)
                if attempt == self.rebalance_max_attempts:
                    raise
                logger.warning("rollout rebalance: replica of %s died, retrying (attempt %d)", request_id, attempt)
                continue
            except BaseException:
                self._rebalance_release(call)
                raise
            finally:
                _CALL.reset(token)
            self._rebalance_release(call, response_len=len(out.token_ids) if out.token_ids is not None else None)
            return out
        raise AssertionError("unreachable")

    async def _acquire_server(self, request_id: str, **extra):  # noqa: ANN201 - verl's signature
        call = _CALL.get()
        if call is None:  # not through generate (a subclass calling us directly): plain routing
            return await self._load_balancer.acquire_server.remote(request_id=request_id)
        if call["server_id"] is not None:  # partial-rollout resume: the previous attempt's slot
            self._rebalance_release(call)
        while True:
            try:
                server_id, handle = await self._load_balancer.acquire_server.remote(
                    request_id=request_id, prompt_key=call["key"], prompt_len=call["len"]
                )
                break
            except RuntimeError as e:  # verl's hybrid-only mode: replicas come back after weight sync
                if "No available servers" in str(e) and getattr(self, "_only_hybrid", False):
                    await asyncio.sleep(1)
                    continue
                raise
        call["server_id"] = server_id
        rank = split_server_id(server_id)[2]
        return server_id, handle if rank is None else _RankedHandle(handle, rank)

    def _release_server(self, server_id: str, request_id: str | None = None) -> None:
        call = _CALL.get()
        if call is not None and call["server_id"] == server_id:
            return  # released by generate with the response length (or as failed)
        self._load_balancer.release_server.remote(server_id=server_id)

    def _rebalance_release(self, call: dict, *, response_len: int | None = None, failed: bool = False) -> None:
        sid, call["server_id"] = call["server_id"], None
        if sid is not None:
            self._load_balancer.release_server.remote(server_id=sid, response_len=response_len, failed=failed)
