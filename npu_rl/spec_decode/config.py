"""The SAM drafter's settings: ``speculative_config`` keys, their defaults, the batch-size gate.

Users switch SAM on with ``speculative_config.method=sam`` and ``num_speculative_tokens=N`` (verl:
``actor_rollout_ref.rollout.engine_kwargs.vllm.speculative_config.*``). Our vLLM patch adds six
``SpeculativeConfig`` fields, all optional:

- ``sam_batch_size_threshold``: draft only while the running batch (requests in the engine's input
  batch) is at most this; ``"always"`` drafts at any batch size, ``"never"`` never drafts (the
  automata still catch up, so switching back is instant). Default
  :data:`DEFAULT_BATCH_SIZE_THRESHOLD`. The reference recipe's env variable
  ``VLLM_SPECULATIVE_BATCH_SIZE_THRE`` is read as an alias when the key is not set.
- ``sam_group_corpus_mb``: byte budget (MiB) of the group corpus (other responses to the same
  prompt); 0 turns it off. Default :data:`DEFAULT_GROUP_CORPUS_MB`.
- ``sam_min_match``: the shortest suffix match (tokens) that yields a draft. Default 1.
- ``sam_adaptive_k``: per-request draft length from its recent acceptance (grows by one after a
  fully accepted draft, halves after a miss, within [1, num_speculative_tokens]). Default off.
- ``sam_history_mb``: MiB for the history corpus (earlier rounds' responses of the same prompt,
  :mod:`npu_rl.spec_decode.history`); 0 (default) turns it off. Needs the group corpus.
- ``sam_history_rewards``: rank each prompt's history by the rewards the trainer gives its responses
  (verl patch 0012 sends them after each step; :mod:`npu_rl.spec_decode.rewards`): the best
  rewarded response is the one a draft continues, and a wrong one is dropped first. Default true
  when the history is on; false ranks by age only (the newest first).
- ``sam_history_scope``: engines with the same scope (and model and ``sam_history_mb``) share one
  history store. Unset: the Ray job of the process that builds the engine's config (verl's rollout
  server, :func:`configure_speculative_config` fills it in), so concurrent jobs on one Ray cluster
  keep apart stores. Where the config is built outside Ray (``vllm serve`` with ``RAY_ADDRESS``
  set), nothing is filled in and every such engine of that model and budget shares one store.
  Several trainings in one Ray job (e.g. Ray Tune trials) share unless each sets its own scope;
  set the same string in two jobs to share their history.

This module imports neither vllm nor torch: the preflight checks recipes with it.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass

from npu_rl import settings

# Why 32: a draft of k tokens makes every decode step verify (k + 1) tokens per request. Decode on
# an A3 die stays bound by reading weights and KV while a step carries up to ~128 tokens, so with
# the recipes' k = 3 drafting is free up to a running batch of 128 / (3 + 1) = 32 and costs compute
# beyond it. Tune per model with the key (measure timing_s/generate_sequences).
DEFAULT_BATCH_SIZE_THRESHOLD = 32
DEFAULT_GROUP_CORPUS_MB = 256
ENV_ALIAS = "VLLM_SPECULATIVE_BATCH_SIZE_THRE"
PREFIX = "actor_rollout_ref.rollout.engine_kwargs.vllm.speculative_config"
KEYS = (
    "sam_batch_size_threshold",
    "sam_group_corpus_mb",
    "sam_min_match",
    "sam_adaptive_k",
    "sam_history_mb",
    "sam_history_scope",
    "sam_history_rewards",
)
NO_LIMIT = 1 << 62
MAX_SCOPE_CHARS = 128


@dataclass(frozen=True)
class SamSettings:
    """Resolved settings. ``max_batch``: largest running batch that drafts (0: never; NO_LIMIT: always)."""

    k: int
    max_batch: int
    group_corpus_bytes: int
    min_match: int
    adaptive_k: bool = False
    history_bytes: int = 0
    history_scope: str = ""
    history_rewards: bool = False


def parse_threshold(value: object, key: str = "sam_batch_size_threshold") -> int:
    """``"always"`` -> NO_LIMIT, ``"never"`` -> 0, an integer >= 1 -> itself. ValueError naming ``key``."""
    if isinstance(value, str):
        word = value.strip().lower()
        if word == "always":
            return NO_LIMIT
        if word == "never":
            return 0
        try:
            value = int(word)
        except ValueError:
            raise ValueError(
                f"{key}={value!r} is not a batch size: use an integer >= 1 (draft while the running batch is at "
                "most that), 'always' or 'never'"
            ) from None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"{key}={value!r} is not a batch size: use an integer >= 1 (draft while the running batch is at most "
            "that), 'always' or 'never'"
        )
    return value


def resolve(
    num_speculative_tokens: object,
    threshold: object = None,
    group_corpus_mb: object = None,
    min_match: object = None,
    adaptive_k: object = None,
    history_mb: object = None,
    history_scope: object = None,
    history_rewards: object = None,
    env: Mapping[str, str] | None = None,
) -> SamSettings:
    """Check and resolve the SAM keys (None = not set). Raises ValueError naming the offending key
    (:class:`~npu_rl.settings.SettingsError`, a ValueError, for the env alias)."""
    k = num_speculative_tokens
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"num_speculative_tokens={k!r}: method 'sam' needs the draft length, an integer >= 1 (e.g. 3)")
    alias = settings.get(ENV_ALIAS, env)  # an integer >= 1, "always", "never", or None when unset
    if threshold is None:
        max_batch = parse_threshold(alias, ENV_ALIAS) if alias is not None else DEFAULT_BATCH_SIZE_THRESHOLD
    else:
        max_batch = parse_threshold(threshold)
        if alias is not None and parse_threshold(alias, ENV_ALIAS) != max_batch:
            raise ValueError(
                f"{ENV_ALIAS}={alias} disagrees with speculative_config.sam_batch_size_threshold={threshold}: "
                f"keep one ({ENV_ALIAS} is the reference recipe's name for the same setting)"
            )
    mb = DEFAULT_GROUP_CORPUS_MB if group_corpus_mb is None else group_corpus_mb
    if isinstance(mb, bool) or not isinstance(mb, int | float) or mb < 0:
        raise ValueError(f"sam_group_corpus_mb={mb!r} must be a number of MiB >= 0 (0 turns the group corpus off)")
    mm = 1 if min_match is None else min_match
    if isinstance(mm, bool) or not isinstance(mm, int) or mm < 1:
        raise ValueError(f"sam_min_match={mm!r} must be an integer >= 1 (tokens of suffix match needed to draft)")
    ak = False if adaptive_k is None else adaptive_k
    if isinstance(ak, str) and ak.strip().lower() in ("true", "false"):
        ak = ak.strip().lower() == "true"
    if not isinstance(ak, bool):
        raise ValueError(f"sam_adaptive_k={ak!r} must be true or false (adapt each request's draft length)")
    hmb = 0 if history_mb is None else history_mb
    if isinstance(hmb, bool) or not isinstance(hmb, int | float) or hmb < 0:
        raise ValueError(f"sam_history_mb={hmb!r} must be a number of MiB >= 0 (0 turns the history corpus off)")
    if hmb > 0 and mb == 0:
        raise ValueError(
            f"sam_history_mb={hmb} needs the group corpus, but sam_group_corpus_mb=0: history is drafted from "
            "through the group automaton (set sam_group_corpus_mb > 0, or sam_history_mb=0)"
        )
    scope = "" if history_scope is None else history_scope
    if history_scope is not None and not (isinstance(scope, str) and 0 < len(scope) <= MAX_SCOPE_CHARS):
        raise ValueError(
            f"sam_history_scope={scope!r} must be a non-empty string of at most {MAX_SCOPE_CHARS} characters (engines "
            "with the same scope share a history store); leave it unset for one store per Ray job"
        )
    hr = hmb > 0 if history_rewards is None else history_rewards
    if isinstance(hr, str) and hr.strip().lower() in ("true", "false"):
        hr = hr.strip().lower() == "true"
    if not isinstance(hr, bool):
        raise ValueError(
            f"sam_history_rewards={hr!r} must be true or false (rank the history by the trainer's rewards)"
        )
    return SamSettings(
        k=k,
        max_batch=max_batch,
        group_corpus_bytes=int(mb * (1 << 20)),
        min_match=mm,
        adaptive_k=ak,
        history_bytes=int(hmb * (1 << 20)),
        history_scope=scope,
        history_rewards=hr and hmb > 0,
    )


def from_speculative_config(cfg: object, env: Mapping[str, str] | None = None) -> SamSettings:
    """:func:`resolve` on a vLLM ``SpeculativeConfig`` (or any object with those attributes)."""
    return resolve(
        getattr(cfg, "num_speculative_tokens", None),
        getattr(cfg, "sam_batch_size_threshold", None),
        getattr(cfg, "sam_group_corpus_mb", None),
        getattr(cfg, "sam_min_match", None),
        getattr(cfg, "sam_adaptive_k", None),
        getattr(cfg, "sam_history_mb", None),
        getattr(cfg, "sam_history_scope", None),
        getattr(cfg, "sam_history_rewards", None),
        env=env,
    )


def configure_speculative_config(cfg) -> None:
    """The ``method == "sam"`` branch of vLLM's ``SpeculativeConfig.__post_init__`` (called by our patch).

    Validates the SAM keys and sets what a model-free method needs: no draft model (the target's
    model and parallel configs stand in, as for ngram) and no n-gram lookup window. With history on
    and ``sam_history_scope`` unset, it names this process's Ray job there (:func:`ray_job_scope`):
    the config is built in verl's rollout server, a Ray actor of the job, and reaches the engine's
    workers pickled, while the workers themselves are not Ray actors and cannot tell the job.
    """
    settings = from_speculative_config(cfg)
    if settings.history_bytes and getattr(cfg, "sam_history_scope", None) is None:
        cfg.sam_history_scope = ray_job_scope()
    cfg.model = "sam"
    cfg.prompt_lookup_max = 0
    cfg.prompt_lookup_min = 0
    cfg.draft_model_config = cfg.target_model_config
    cfg.draft_parallel_config = cfg.target_parallel_config


def ray_job_scope() -> str | None:
    """``"ray-job-<id>"`` for the Ray job this process belongs to; None when Ray is not initialized
    here (Ray is not imported for the asking)."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    return f"ray-job-{ray.get_runtime_context().get_job_id()}"
