"""Long-tail guard: decide which straggling responses of a rollout step to abort (opt-in, truncates).

Switch ``VLLM_ROLLOUT_EARLY_STOP_ENABLE=1`` (the reference recipe's names); tuning
``VLLM_ROLLOUT_EARLY_STOP_FACTOR`` (default 2.0), ``VLLM_ROLLOUT_EARLY_STOP_MIN_TOKENS`` (default
10000) and ``VLLM_ROLLOUT_EARLY_STOP_FINISHED_FRACTION`` (default 0.9, ours). Rule: once at least
``finished_fraction`` of the step's responses are finished, every running response already longer
than ``max(factor * median(finished lengths), min_tokens)`` is aborted.

Aborting truncates samples and so changes the sampled distribution (long reasoning is cut, its reward
is typically that of a wrong answer, and GRPO's group baseline shifts): it is off by default,
counted in metrics (``guard/*``), and a cut response must be treated as truncated, like a response
that hit ``max_response_length``. This module is the decision core and the per-replica bookkeeping;
see ``docs/resampler.md`` for what is wired into verl.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from npu_rl import settings

__all__ = ["ENV", "GuardParams", "LongTailGuard", "ServerGuard", "server_guard", "stragglers_to_abort"]

ENV = {
    "enable": "VLLM_ROLLOUT_EARLY_STOP_ENABLE",
    "factor": "VLLM_ROLLOUT_EARLY_STOP_FACTOR",
    "min_tokens": "VLLM_ROLLOUT_EARLY_STOP_MIN_TOKENS",
    "finished_fraction": "VLLM_ROLLOUT_EARLY_STOP_FINISHED_FRACTION",
}


@dataclass(frozen=True)
class GuardParams:
    """``factor`` >= 1 (times the finished median), ``min_tokens`` >= 0, ``finished_fraction`` in (0, 1]."""

    factor: float = 2.0
    min_tokens: int = 10000
    finished_fraction: float = 0.9

    def __post_init__(self) -> None:
        if not self.factor >= 1.0:
            raise ValueError(f"{ENV['factor']}={self.factor!r}: must be >= 1 (a multiple of the finished median)")
        if self.min_tokens < 0:
            raise ValueError(f"{ENV['min_tokens']}={self.min_tokens!r}: must be >= 0 tokens")
        if not 0.0 < self.finished_fraction <= 1.0:
            raise ValueError(f"{ENV['finished_fraction']}={self.finished_fraction!r}: must be in (0, 1]")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> GuardParams | None:
        """The guard's parameters when ``VLLM_ROLLOUT_EARLY_STOP_ENABLE`` is on, else None.

        Every variable is read even when the guard is off, so a bad value is named before it matters.

        Raises:
            SettingsError (a ValueError): a value that is not a boolean / number / in range, naming the
                variable and the allowed values.
        """
        v = settings.values("long-tail guard", env)
        params = cls(**{field: v[name] for field, name in ENV.items() if field != "enable"})
        return params if v[ENV["enable"]] else None


def stragglers_to_abort(finished: np.ndarray, running: np.ndarray, params: GuardParams) -> np.ndarray:
    """Which running responses to abort now.

    ``finished``: (F,) response lengths (tokens) of the step's finished responses; ``running``: (R,)
    current lengths of the still-running ones. Returns a (R,) bool mask. Nothing is aborted while
    fewer than ``finished_fraction`` of the F + R responses are finished; then a running response is
    aborted when its length exceeds ``max(factor * median(finished), min_tokens)``.
    """
    finished = np.asarray(finished, dtype=np.float64)
    running = np.asarray(running, dtype=np.float64)
    total = len(finished) + len(running)
    if len(running) == 0 or len(finished) == 0 or len(finished) < params.finished_fraction * total:
        return np.zeros(len(running), dtype=bool)
    threshold = max(params.factor * float(np.median(finished)), float(params.min_tokens))
    return running > threshold


class LongTailGuard:
    """Per-replica bookkeeping of one step's responses, and the abort decision on it.

    ``start(request_id)``, ``progress(request_id, length)`` (current response length, tokens),
    ``finish(request_id, length, aborted)``; :meth:`decide` returns the request ids to abort (each at
    most once). :meth:`new_step` clears the state and returns the last step's metrics:
    ``guard/cut_count``, ``guard/cut_fraction``, ``guard/cut_len_mean`` (length when cut) and
    ``guard/threshold``.
    """

    def __init__(self, params: GuardParams) -> None:
        self.params = params
        self.new_step()

    def new_step(self) -> dict[str, float]:
        metrics = {}
        if getattr(self, "_finished", None) is not None:
            n = len(self._finished) + len(self._running) + sum(r not in self._running for r in self._cut)
            metrics = {
                "guard/cut_count": float(len(self._cut)),
                "guard/cut_fraction": len(self._cut) / n if n else 0.0,
                "guard/cut_len_mean": float(np.mean(list(self._cut.values()))) if self._cut else 0.0,
                "guard/threshold": self._threshold,
            }
        self._finished: dict[str, int] = {}
        self._running: dict[str, int] = {}
        self._cut: dict[str, int] = {}
        self._threshold = 0.0
        return metrics

    def start(self, request_id: str) -> None:
        self._running[request_id] = 0

    def progress(self, request_id: str, length: int) -> None:
        if request_id in self._running:
            self._running[request_id] = int(length)

    def finish(self, request_id: str, length: int, aborted: bool = False) -> None:
        self._running.pop(request_id, None)
        if request_id in self._cut and not aborted:
            del self._cut[request_id]  # the abort came too late: the response ended on its own, whole
        if request_id in self._cut:
            self._cut[request_id] = int(length)
        elif not aborted:
            self._finished[request_id] = int(length)

    def was_cut(self, request_id: str) -> bool:
        """True when this guard aborted the request (mark its response as truncated)."""
        return request_id in self._cut

    def decide(self) -> list[str]:
        ids = [r for r in self._running if r not in self._cut]
        if not ids:
            return []
        mask = stragglers_to_abort(
            np.fromiter(self._finished.values(), dtype=np.float64, count=len(self._finished)),
            np.array([self._running[r] for r in ids], dtype=np.float64),
            self.params,
        )
        chosen = [r for r, m in zip(ids, mask, strict=True) if m]
        if chosen:
            self._threshold = max(
                self.params.factor * float(np.median(list(self._finished.values()))), self.params.min_tokens
            )
        for r in chosen:
            self._cut[r] = self._running[r]
        return chosen


class ServerGuard:
    """The guard of one vLLM server (one rollout replica), driven from ``vLLMHttpServer.generate``.

    verl patch ``*-verl-feature-long-tail-guard`` calls :func:`server_guard` once per request,
    :meth:`observe` on every streamed (cumulative) vLLM output and :meth:`end` when the request
    returns. A new step starts when the server's ``global_steps`` changes (verl sets it at every
    weight sync); the finished step's ``guard/*`` metrics are logged then and kept in
    :attr:`last_metrics`. ``abort`` is vLLM's ``AsyncLLM.abort`` (tokens so far come back with finish
    reason "abort"); :meth:`decide` runs at most every ``interval_s`` seconds (it is O(running)).
    """

    def __init__(self, params: GuardParams, interval_s: float = 1.0, clock=None) -> None:
        import time

        self.guard = LongTailGuard(params)
        self.interval_s = interval_s
        self.clock = clock or time.monotonic
        self.step = None
        self.last_metrics: dict[str, float] = {}
        self._next_decision = 0.0

    def begin(self, step, request_id: str) -> None:
        """A request of training step ``step`` starts."""
        if step != self.step:
            if self.step is not None:
                self.last_metrics = self.guard.new_step()
                if self.last_metrics.get("guard/cut_count"):
                    # print, not logging: the server actor's root logger may have no handler, and a
                    # guard that cuts must say so in the run's log
                    print(
                        f"[npu-rl] long-tail guard, step {self.step}: {self.last_metrics}", file=sys.stderr, flush=True
                    )
            self.step = step
        self.guard.start(request_id)

    async def observe(self, request_id: str, n_tokens: int, abort) -> None:
        """Record ``n_tokens`` generated so far; every ``interval_s`` abort the stragglers via ``abort(rid)``."""
        self.guard.progress(request_id, n_tokens)
        now = self.clock()
        if now < self._next_decision:
            return
        self._next_decision = now + self.interval_s
        for rid in self.guard.decide():
            await abort(rid)

    def end(self, request_id: str, n_tokens: int, aborted: bool) -> bool:
        """The request returned with ``n_tokens``; True when the guard cut it (report it as truncated:
        ``stop_reason="length"``, so verl's client does not resume it as a paused partial rollout).
        A request the guard chose that still ended on its own (not ``aborted``: too late) is no cut."""
        self.guard.finish(request_id, n_tokens, aborted=aborted)
        return self.guard.was_cut(request_id)


def server_guard(server, request_id: str) -> ServerGuard | None:
    """The :class:`ServerGuard` of a verl vLLM server (created on first use), with ``request_id`` begun;
    None when ``VLLM_ROLLOUT_EARLY_STOP_ENABLE`` is off (the environment is read once per server)."""
    guard = getattr(server, "_npu_rl_long_tail_guard", "unset")
    if guard == "unset":
        params = GuardParams.from_env()
        guard = ServerGuard(params) if params is not None else None
        server._npu_rl_long_tail_guard = guard
    if guard is not None:
        guard.begin(getattr(server, "global_steps", None), request_id)
    return guard
