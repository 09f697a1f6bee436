"""Skip the old-log-prob recompute for exactly on-policy updates (``recompute_old_log_prob=false``).

verl 0.9.1 runs a full forward pass over every trajectory before the update to get ``old_log_probs``
(``PPOTrainer._compute_old_log_prob`` in ``verl/trainer/ppo/v1/trainer_base.py``, and
``RayPPOTrainer.fit`` in ``verl/trainer/ppo/ray_trainer.py``). When the update is one optimizer step
over the whole batch with the weights that the forward pass would use, ``old_log_probs`` equals
``log_probs.detach()`` of the update pass itself, so PPO's ratio ``exp(log_prob - old_log_prob)`` is 1
with gradient ``grad log_prob``: the recompute is a wasted forward pass. The verl patch
``verl-feature-skip-old-log-prob`` adds ``actor_rollout_ref.actor.recompute_old_log_prob`` (default
true, the reference recipe's name); with it false the trainers skip the pass and
``verl.workers.utils.losses.ppo_loss`` uses ``log_prob.detach()``.

The rules here are the single source of truth: the patched ``verl.utils.config.validate_config`` calls
:func:`check_config` and this project's preflight calls :func:`problems`.

Valid only when nothing else reads ``old_log_probs`` and the anchor equals the current policy:

- ``actor_rollout_ref.actor.ppo_epochs == 1`` (a second epoch needs the anchor of the first);
- ``ppo_mini_batch_size`` equals the batch of one update (``data.train_batch_size``): a second
  mini-batch is updated by weights that already moved;
- ``trainer.v1.trainer_mode=sync`` (the async trainers train on trajectories of older weights and
  their decoupled PPO needs the proximal anchor);
- ``algorithm.use_kl_in_reward=false`` (``apply_kl_penalty`` reads ``old_log_probs`` before the update);
- ``algorithm.rollout_correction.rollout_is/rollout_rs`` null and ``bypass_mode`` false (importance
  weights / rejection use ``old_log_probs``; bypass mode replaces them with the rollout's);
- an advantage estimator whose function takes ``old_log_probs`` (in verl 0.9.1
  ``optimal_token_baseline`` and ``tir_optimal_token_baseline``; found by signature, so estimators
  registered later are judged the same way);
- ``distillation.enabled=false`` (the distillation loss reads ``old_log_probs``).
"""

from __future__ import annotations

import inspect
from typing import Any

from npu_rl.errors import NpuRlError

A = "actor_rollout_ref.actor"
KEY = f"{A}.recompute_old_log_prob"
WHY = "recompute_old_log_prob=false is exact only for one on-policy optimizer step per batch"


def _sel(cfg: Any, key: str, default: Any = None) -> Any:
    """``cfg[key]`` for a dotted key on an OmegaConf config or nested dicts; ``default`` if absent."""
    node = cfg
    for part in key.split("."):
        if node is None:
            return default
        try:
            node = node.get(part, None) if hasattr(node, "get") else getattr(node, part, None)
        except Exception:  # noqa: BLE001 - OmegaConf interpolation errors: the key is unusable here
            return default
    return default if node is None else node


def recompute_old_log_prob(config: Any) -> bool:
    """Whether the trainer must run the old-log-prob forward pass (verl's behaviour, the default).

    Args:
        config: the full trainer config (``DictConfig``: reads ``actor_rollout_ref.actor.*``) or an
            actor config (``ActorConfig`` dataclass or its ``DictConfig``: reads ``recompute_old_log_prob``).

    Returns:
        False only when ``recompute_old_log_prob`` is explicitly false.

    Raises:
        NpuRlError: the value is not a boolean.
    """
    actor = _sel(config, A, None)
    node = actor if actor is not None else config
    value = _sel(node, "recompute_old_log_prob", True)
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        value = value.strip().lower() == "true"
    if not isinstance(value, bool):
        raise NpuRlError(f"{KEY}={value!r} is not a boolean: set {KEY}=true or false")
    return value


def estimator_reads_old_log_probs(name: str) -> bool:
    """True when verl's advantage estimator ``name`` takes ``old_log_probs`` (by its signature).

    GAE and GRPO are computed inline by verl (no registry entry needed): they do not read them.

    Raises:
        NpuRlError: ``name`` is neither GAE/GRPO nor registered in ``verl.trainer.ppo.core_algos``.
    """
    from verl.trainer.ppo import core_algos

    if name in ("gae", "grpo"):
        return False
    try:
        fn = core_algos.get_adv_estimator_fn(name)
    except ValueError as e:
        raise NpuRlError(f"algorithm.adv_estimator={name!r} is not a registered advantage estimator: {e}") from e
    return "old_log_probs" in inspect.signature(fn).parameters


def problems(config: Any) -> list[tuple[str, str, str]]:
    """Every reason the config may not skip the recompute, as ``(key, message, fix)``; [] when valid
    or when the recompute is on.

    ``config`` is the composed trainer config (``DictConfig`` or nested dicts); values are read
    unresolved-safe (a key that does not resolve counts as absent).
    """
    if recompute_old_log_prob(config):
        return []
    out: list[tuple[str, str, str]] = []
    fix_tail = f"or set {KEY}=true"
    epochs = int(_sel(config, f"{A}.ppo_epochs", 1))
    if epochs != 1:
        out.append((KEY, f"{WHY}, but {A}.ppo_epochs={epochs}", f"set {A}.ppo_epochs=1 {fix_tail}"))
    tbs = int(_sel(config, "data.train_batch_size", 0))
    mini = int(_sel(config, f"{A}.ppo_mini_batch_size", 0))
    v1 = bool(_sel(config, "trainer.use_v1", True))
    mode = str(_sel(config, "trainer.v1.trainer_mode", "sync")) if v1 else "legacy"
    if v1 and mode != "sync":
        out.append(
            (
                KEY,
                f"{WHY}, but trainer.v1.trainer_mode={mode} trains on trajectories of older weights "
                "(decoupled PPO needs the recomputed anchor)",
                f"set trainer.v1.trainer_mode=sync {fix_tail}",
            )
        )
    if mini != tbs:
        steps = f"{tbs / mini:g}" if mini > 0 else "?"
        out.append(
            (
                KEY,
                f"{WHY}, but {A}.ppo_mini_batch_size={mini} != data.train_batch_size={tbs} "
                f"({steps} optimizer steps per batch)",
                f"set {A}.ppo_mini_batch_size={tbs} {fix_tail}",
            )
        )
    if bool(_sel(config, "algorithm.use_kl_in_reward", False)):
        out.append(
            (
                KEY,
                f"{WHY}; algorithm.use_kl_in_reward=true reads the old log-probs (KL penalty in the reward)",
                f"set algorithm.use_kl_in_reward=false (use {A}.use_kl_loss=true for a KL term) {fix_tail}",
            )
        )
    rc = "algorithm.rollout_correction"
    for k in ("rollout_is", "rollout_rs"):
        v = _sel(config, f"{rc}.{k}")
        if v not in (None, "", "null", "None"):
            out.append(
                (
                    KEY,
                    f"{WHY}; {rc}.{k}={v} corrects with the old log-probs",
                    f"set {rc}.{k}=null {fix_tail}",
                )
            )
    if bool(_sel(config, f"{rc}.bypass_mode", False)):
        out.append(
            (
                KEY,
                f"{WHY}; {rc}.bypass_mode=true already replaces old_log_probs by the rollout's log-probs "
                "(a different estimator): the two switches contradict each other",
                f"choose one: {rc}.bypass_mode=false, or {KEY}=true",
            )
        )
    est = str(_sel(config, "algorithm.adv_estimator", "gae"))
    try:
        if estimator_reads_old_log_probs(est):
            out.append(
                (
                    KEY,
                    f"{WHY}; algorithm.adv_estimator={est} reads the old log-probs",
                    f"use an estimator that does not (grpo, rloo, gae, ...) {fix_tail}",
                )
            )
    except NpuRlError as e:
        out.append(("algorithm.adv_estimator", str(e), "use one of verl's estimators (grpo, gae, rloo, ...)"))
    if bool(_sel(config, "distillation.enabled", False)):
        out.append(
            (KEY, f"{WHY}; distillation.enabled=true reads the old log-probs", f"turn distillation off {fix_tail}")
        )
    return out


def check_config(config: Any) -> None:
    """Raise when ``config`` skips the recompute in a combination where that changes the update.

    Called by the patched ``verl.utils.config.validate_config`` (so ``main_ppo`` refuses before any
    worker starts).

    Raises:
        ValueError: every problem, one per line, each naming the key and the fix.
    """
    found = problems(config)
    if found:
        lines = [f"{key}: {msg} (fix: {fix})" for key, msg, fix in found]
        raise ValueError("invalid on-policy shortcut:\n  " + "\n  ".join(lines))


def rollout_mismatch_metrics(log_prob, rollout_log_probs, response_mask) -> dict[str, float]:
    """Train-vs-rollout probability mismatch from the update pass (the recompute pass is gone).

    verl reports ``training/rollout_probs_diff_*`` from the recomputed ``old_log_probs``
    (``verl/utils/debug/metrics.py``); with the shortcut the update pass's ``log_prob`` is the same
    quantity at the single on-policy step. Returns the mean and max of ``|exp(lp) - exp(rollout_lp)|``
    over response tokens of this micro-batch (the trainer averages micro-batches).

    Args:
        log_prob: (batch, response_len) float tensor, the actor's log-probs (graph is not used).
        rollout_log_probs: same shape, the rollout's log-probs (padded).
        response_mask: same shape, bool or 0/1.

    Returns:
        ``{"training/rollout_probs_diff_mean": float, "training/rollout_probs_diff_max": float}``;
        {} when the mask is empty.
    """
    import torch

    mask = response_mask.bool()
    if not bool(mask.any()):
        return {}
    with torch.no_grad():
        diff = (log_prob.detach().float().exp() - rollout_log_probs.float().exp()).abs()[mask]
    return {
        "training/rollout_probs_diff_mean": diff.mean().item(),
        "training/rollout_probs_diff_max": diff.max().item(),
    }
