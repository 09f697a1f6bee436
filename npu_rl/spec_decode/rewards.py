"""The trainer's rewards into SAM's history store (issue 34, item 5): reward-weighted history in a real run.

The engines store every finished response in the cluster-wide history actor
(:class:`npu_rl.spec_decode.history.RayHistory`) before any reward exists. After each step verl's V1
trainer has every response's reward; verl patch ``0012-verl-feature-sam-acceptance-metrics`` hands
the step's rows to :func:`step_rewards`, which sends one :func:`npu_rl.spec_decode.history.rating`
per response (prompt key, length, digest, reward: 36 bytes, no tokens sent again) to the same actor
in one fire-and-forget call. The store ranks a prompt's responses by those rewards: the best rewarded
is the one a draft continues, a wrong one is replaced first (``HistoryStore.rate_many``).

The actor is found by the name the engines gave it (:func:`npu_rl.spec_decode.history.actor_name`
over the resolved ``sam_history_scope``, the model path as verl's rollout server serves it, and the
history budget). Nothing here blocks the trainer on the actor: each step sends, and asks the store
for its counters; the answer to the previous step's question is reported when it has arrived.

Metrics per step (``{}`` when SAM, its history or ``sam_history_rewards`` is off):

- ``npu_rl/sam/history_rewards_sent``: ratings sent this step (0 with SAM's history on: the actor
  was not found, said once in the log; a loud 0, not a missing metric);
- ``npu_rl/sam/history_ratings``, ``history_rated``, ``history_unrated``: the store's counters as of its
  last answer (ratings received, ratings that found their response, responses still unrated).

Cost on the trainer's step: one BLAKE2b pass over each row's prompt and response tokens (about 1 GB/s:
8,192 responses of 8K tokens are ~0.3 s) and one Ray call; counted in ``tests/test_sam_rewards_on_cpu.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from npu_rl.spec_decode import metrics as sam_metrics
from npu_rl.spec_decode.config import KEYS, PREFIX, SamSettings, ray_job_scope, resolve
from npu_rl.spec_decode.history import ACTOR_NAMESPACE, actor_name, rating

__all__ = ["RewardFeed", "jagged_rows", "settings_from_config", "step_rewards"]

OUT = sam_metrics.PREFIX


def settings_from_config(select: Callable[[str], Any]) -> SamSettings | None:
    """The SAM settings of a trainer config (``select(key)``: OmegaConf.select), None when SAM is off.

    Raises:
        ValueError: a SAM key's value (the preflight names it before any run).
    """
    if not sam_metrics.sam_on(select):
        return None
    return resolve(select(f"{PREFIX}.num_speculative_tokens"), *(select(f"{PREFIX}.{key}") for key in KEYS), env={})


def jagged_rows(t: Any, rows) -> list[np.ndarray]:
    """Rows ``rows`` of a tensor as numpy arrays: of a jagged (nested) tensor by its flat values and
    offsets, without copying row by row; of a dense one (rows of equal length), its rows."""
    if getattr(t, "is_nested", False):
        values, offsets = t.values().numpy(), t.offsets().numpy()
        return [values[offsets[i] : offsets[i + 1]] for i in rows]
    dense = t.numpy()
    return [dense[i].reshape(-1) for i in rows]


class RewardFeed:
    """One trainer's link to the history actor named ``name``: :meth:`send` ratings, read counters.

    ``ray``: the ray module (tests pass the real one on a local cluster). The actor is looked up at
    the first send and again after a failure; while it cannot be found, :meth:`send` sends nothing and
    returns 0, and the log says so once.
    """

    def __init__(self, name: str, ray: Any = None):
        if ray is None:
            import ray
        self._ray = ray
        self.name = name
        self._actor = None
        self._stats_ref = None
        self._pending: list = []
        self.stats: dict = {}
        self.warned = False

    def _lookup(self):
        if self._actor is None:
            try:
                self._actor = self._ray.get_actor(self.name, namespace=ACTOR_NAMESPACE)
            except ValueError:  # no such actor (yet): the engines make it when they start
                if not self.warned:
                    self.warned = True
                    from npu_rl import worker_log

                    worker_log(
                        f"warning: SAM history rewards: no history actor {ACTOR_NAMESPACE}/{self.name} in this Ray "
                        "job, so the trainer's rewards do not reach the history (npu_rl/sam/history_rewards_sent is 0)"
                    )
        return self._actor

    def send(self, items: list) -> int:
        """Send ``items`` (:func:`npu_rl.spec_decode.history.rating` tuples) in one call, not waited for;
        ask the store for its counters. Returns how many were sent (0: no actor)."""
        ray = self._ray
        if self._stats_ref is not None and ray.wait([self._stats_ref], timeout=0)[0]:
            try:
                self.stats = ray.get(self._stats_ref)
            except ray.exceptions.RayError:
                self._actor = None  # look it up again: a new engine may have made a new one
            self._stats_ref = None
        self._pending = [r for r in self._pending if not ray.wait([r], timeout=0)[0]]
        actor = self._lookup()
        if actor is None or not items:
            return 0
        self._pending.append(actor.rate_many.remote(items))
        if self._stats_ref is None:
            self._stats_ref = actor.stats.remote()
        return len(items)


_FEEDS: dict[str, RewardFeed] = {}


def _model_path(select: Callable[[str], Any]) -> str:
    """The model path verl's vLLM server serves (``HFModelConfig.local_path``: verl's own copy_to_local)."""
    from verl.utils.fs import copy_to_local

    path = select("actor_rollout_ref.model.path")
    return copy_to_local(path, use_shm=bool(select("actor_rollout_ref.model.use_shm") or False))


def step_rewards(data: Any, keep: np.ndarray, config: Any) -> dict[str, float]:
    """Send a V1 trainer step's rewards to SAM's history store; its metrics (see the module docstring).

    ``data``: the step's TensorDict from TransferQueue as ``_compute_metrics`` reads it, with jagged
    ``prompts`` and ``responses`` (token ids, no padding) and ``rm_scores`` (per response token; a
    response's reward is their sum); ``keep``: bool per row, False for padding rows; ``config``: the
    trainer's OmegaConf config. ``{}`` and nothing read when SAM, its history or its rewards are off.
    """
    from omegaconf import OmegaConf

    select = lambda key: OmegaConf.select(config, key)  # noqa: E731
    if not sam_metrics.sam_on(select) or not select(f"{PREFIX}.sam_history_mb"):
        return {}  # no history: nothing to rank (and no SAM key is judged here: vLLM and the preflight do)
    settings = settings_from_config(select)
    if settings is None or not settings.history_bytes or not settings.history_rewards:
        return {}
    scope = settings.history_scope or ray_job_scope() or ""
    name = actor_name(scope, _model_path(select), settings.history_bytes)
    feed = _FEEDS.get(name) or _FEEDS.setdefault(name, RewardFeed(name))
    rows = np.flatnonzero(np.asarray(keep, dtype=bool))
    items = []
    if rows.size:
        p_rows, r_rows = jagged_rows(data["prompts"], rows), jagged_rows(data["responses"], rows)
        s_rows = jagged_rows(data["rm_scores"].float(), rows)
        items = [rating(p, r, float(s.sum())) for p, r, s in zip(p_rows, r_rows, s_rows, strict=True)]
    sent = feed.send(items)
    out = {OUT + "history_rewards_sent": float(sent)}
    for key in ("ratings", "rated", "unrated"):
        if key in feed.stats:
            out[OUT + "history_" + key] = float(feed.stats[key])
    return out
