"""Response-length predictions for rollout dispatch.

The dispatcher orders requests by *predicted work*. Predictions come from a :class:`LengthPredictor`:
:class:`EMALengthPredictor` (``ROLLOUT_REBALANCE_PREDICT=1``, the default) learns a per-prompt EMA of
the response lengths the balancer sees, keyed by a hash of the prompt token ids (so it survives epochs
and needs no dataset index); :class:`NoPredictor` otherwise. It does not read the resampler's table:
that one lives in the trainer driver, keyed by dataset index, while the balancer is a Ray actor of its
own that sees only prompt token ids; both learn from the same responses. Prompts never seen fall back
to the global mean response length; the work formula then ranks them by prompt length.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from npu_rl.errors import NpuRlError

# Decode cost per generated token grows with the cached context: t(b, kv) = t0 + t1*b + t2*kv
# (REFERENCE §7). Per sequence, t1 per token plus t2 per cached token; KV_RATIO = t2 / t1.
# Qwen3-32B TP8: 1e-4 / 0.05; Qwen3-235B per DP rank: 1.8e-4 / 0.1. Both give 0.002 / 0.0018.
DEFAULT_KV_RATIO = 0.002


def prompt_key(prompt_ids: Sequence[int]) -> str:
    """A stable identity of a prompt: the first 16 hex digits of the BLAKE2b hash of its token ids.

    The n samples of a GRPO group share their prompt token ids, so they share this key; the same
    prompt in a later epoch gets the same key (the chat template is deterministic).
    """
    h = hashlib.blake2b(digest_size=8)
    h.update(",".join(str(int(t)) for t in prompt_ids).encode())
    return h.hexdigest()


def predicted_work(response_len: float, prompt_len: float, kv_ratio: float = DEFAULT_KV_RATIO) -> float:
    """Decode work of one request in units of 'one token at empty context' (dimensionless).

    Generating ``response_len`` tokens after a ``prompt_len``-token prompt costs
    ``sum_{i<L} (1 + kv_ratio * (P + i)) = L * (1 + kv_ratio * (P + L/2))``: long responses weigh
    quadratically, which is what makes one replica with several of them the straggler.
    """
    if response_len < 0 or prompt_len < 0:
        raise NpuRlError(f"predicted_work: lengths must be >= 0, got response {response_len}, prompt {prompt_len}")
    return response_len * (1.0 + kv_ratio * (prompt_len + response_len / 2.0))


@runtime_checkable
class LengthPredictor(Protocol):
    """What the dispatcher needs from a length model.

    ``predict`` returns the expected response length in tokens, or None when the prompt is unknown
    (the dispatcher then uses ``prior()``); ``observe`` is called once per finished response.
    """

    def predict(self, key: str, prompt_len: int) -> float | None: ...

    def observe(self, key: str, prompt_len: int, response_len: int) -> None: ...

    def prior(self) -> float: ...


class EMALengthPredictor:
    """Per-prompt exponential moving average of response lengths, with a global-mean fallback.

    ``decay`` weighs the old value: ``ema <- decay * ema + (1 - decay) * observed`` (the first
    observation initialises it). ``prior_len`` is returned by :meth:`prior` until a response has been
    observed, then the running mean of every observed response. At most ``max_keys`` prompts are
    kept (least recently updated dropped first).

    Raises:
        NpuRlError: decay outside [0, 1), prior_len <= 0 or max_keys < 1.
    """

    def __init__(self, decay: float = 0.5, prior_len: float = 4096.0, max_keys: int = 1_000_000):
        if not 0.0 <= decay < 1.0:
            raise NpuRlError(f"EMA decay must be in [0, 1), got {decay} (ROLLOUT_REBALANCE_EMA_DECAY)")
        if prior_len <= 0:
            raise NpuRlError(f"prior response length must be > 0, got {prior_len} (ROLLOUT_REBALANCE_PRIOR_LEN)")
        if max_keys < 1:
            raise NpuRlError(f"max_keys must be >= 1, got {max_keys}")
        self.decay = decay
        self.prior_len = float(prior_len)
        self.max_keys = max_keys
        self._ema: OrderedDict[str, float] = OrderedDict()
        self._sum = 0.0
        self._count = 0

    def predict(self, key: str, prompt_len: int) -> float | None:
        return self._ema.get(key)

    def observe(self, key: str, prompt_len: int, response_len: int) -> None:
        x = float(response_len)
        old = self._ema.pop(key, None)
        self._ema[key] = x if old is None else self.decay * old + (1.0 - self.decay) * x
        if len(self._ema) > self.max_keys:
            self._ema.popitem(last=False)
        self._sum += x
        self._count += 1

    def prior(self) -> float:
        return self._sum / self._count if self._count else self.prior_len

    def __len__(self) -> int:
        return len(self._ema)


class NoPredictor:
    """Predicts nothing: every request gets the same length, so work ranks by prompt length only."""

    def __init__(self, prior_len: float = 4096.0):
        self.prior_len = float(prior_len)

    def predict(self, key: str, prompt_len: int) -> float | None:
        return None

    def observe(self, key: str, prompt_len: int, response_len: int) -> None:
        return None

    def prior(self) -> float:
        return self.prior_len
