"""Evidence of a fully-async run (verl's ``fully_async_policy`` trainer), read from its run directory:
``python -m npu_rl.e2e check-async RUN_DIR``. The asynchronous sibling of :mod:`npu_rl.e2e`.

What it reads: ``RUN_DIR/train.log`` (the FullyAsyncTrainer's console lines) and the composed Hydra
config of the run, ``RUN_DIR/hydra/.hydra/config.yaml`` (``run_verl`` puts Hydra's output folder
in the run directory), for the schedule: responses per prompt ``n``, prompts per trainer step
(``ppo_mini_batch_size x require_batches``), ``staleness_threshold``, ``trigger_parameter_sync_step``,
``partial_rollout`` and ``rollout_correction.bypass_mode``.

The fully-async trainer prints two kinds of ``step:N`` lines, both with ``N`` = the weight version
just synced: the rollouter's window (``fully_async/rollouter/*``: samples generated since the
previous sync) and the trainer's metrics, aggregated over the sync cycle and printed one cycle late
(they carry ``training/global_step``, which is what the checks key trainer steps by). A prompt
("sample") is one group of ``n`` trajectories; ``fully_async/count/stale_trajectory_processed`` is
the running count of trajectories consumed at least one weight version after the one that
finished them.

The checks (each can fail; tests/test_e2e_async_evidence_on_cpu.py shows how):

- trainer steps, finite losses, reward computed at every trainer step;
- consumed from the rollouter: the trainer pulled every step's prompts from the message queue (its
  ``Loop collection completed`` lines) and every step carries the rollouter's per-sample processing
  times (``fully_async/processing_time/*``);
- weight sync with a live rollouter: a sync after every trainer step (``param_sync`` timing), the
  rollouter generated samples after a sync of weight version >= 1, and the trainer consumed
  trajectories finished with the weights it had synced (a step with fewer stale trajectories than
  trajectories);
- asynchrony and staleness: at least one stale trajectory was consumed (the rollouter really ran
  ahead: a synchronous run has none), no step consumed more stale prompts than the threshold allows
  (``max_required_samples - required_samples x trigger_parameter_sync_step``), and the rollouter's
  own count never passed ``max_required_samples``;
- rollout matches actor: with ``bypass_mode`` (verl's default for this trainer: the rollout's
  log-probs are the old log-probs) and one mini-batch per step, ``actor/ppo_kl`` is the KL between
  the rollout's sampling log-probs and the actor before its update. At a step whose trajectories are
  all fresh it must stay below ``max(--kl-abs, --kl-ratio x movement)``, where the movement is the
  largest ``actor/ppo_kl`` of a step with stale trajectories (one update's KL, measured in the same
  run; it must itself exceed ``--kl-abs``). The rollout starts from dummy weights, so a fresh step
  near 0 shows the checkpoint engine delivered the actor's weights;
- partial rollout: its bookkeeping (``fully_async/partial/*``) at every step; with
  ``--require-partial`` at least one trajectory spans two weight versions (interrupted at a sync and
  resumed). The tiny CPU run cannot show one: its rollouter finishes a step's prompts in ~1 s
  against ~20 s of actor update and is idle at every sync (docs/e2e.md);
- features switched on in ``env.txt`` left their trace (:func:`npu_rl.e2e.check_features`) and said
  they are active in the metrics at every logged step (:func:`npu_rl.e2e.check_active_metrics`; verl
  patch 0010 logs them once per weight-sync cycle under this trainer).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from npu_rl import e2e

STALE = "fully_async/count/stale_trajectory_processed"
PARTIAL = "fully_async/partial/total_partial_num"
PARTIAL_SPAN = "fully_async/partial/max_partial_span"
GENERATED = "fully_async/rollouter/step_generated_samples"
PARAM_SYNC = "timing_s/timing_s/param_sync"  # verl nests marked_timer("timing_s/param_sync") under timing_s/


@dataclass
class Schedule:
    """The run's fully-async schedule, from its composed config."""

    n: int
    required: int  # prompts per trainer step: ppo_mini_batch_size x require_batches
    require_batches: int
    staleness: float
    trigger: int
    partial_rollout: bool
    bypass: bool
    ppo_epochs: int
    entropy_coeff: float = 0.0

    @property
    def max_required(self) -> int:
        """verl's ``max_required_samples`` (fully_async_rollouter.py, set_max_required_samples)."""
        return int(self.required * (self.staleness + 1) * self.trigger)

    @property
    def stale_bound(self) -> int:
        """Most prompts from an older weight version one sync cycle can hand the trainer."""
        return self.max_required - self.required * self.trigger


def load_schedule(run_dir: Path) -> Schedule:
    """Read the schedule from ``run_dir/hydra/.hydra/config.yaml``.

    Raises:
        FileNotFoundError: the run has no composed config (not started through run_verl).
        ValueError: the config is not a fully-async one (no ``async_training``).
    """
    from omegaconf import OmegaConf

    path = run_dir / "hydra" / ".hydra" / "config.yaml"
    cfg = OmegaConf.load(path)

    def get(key: str, default=None):
        value = OmegaConf.select(cfg, key, default=default)
        if value is None:
            raise ValueError(
                f"{path}: no {key}: not a fully-async run (python -m npu_rl.e2e check is for main_ppo runs)"
            )
        return value

    get("async_training")
    return Schedule(
        n=int(get("actor_rollout_ref.rollout.n")),
        required=int(get("actor_rollout_ref.actor.ppo_mini_batch_size")) * int(get("async_training.require_batches")),
        require_batches=int(get("async_training.require_batches")),
        staleness=float(get("async_training.staleness_threshold")),
        trigger=int(get("async_training.trigger_parameter_sync_step")),
        partial_rollout=bool(get("async_training.partial_rollout")),
        bypass=bool(OmegaConf.select(cfg, "algorithm.rollout_correction.bypass_mode", default=False)),
        ppo_epochs=int(get("actor_rollout_ref.actor.ppo_epochs", 1)),
        entropy_coeff=float(OmegaConf.select(cfg, "actor_rollout_ref.actor.entropy_coeff", default=0.0) or 0.0),
    )


@dataclass
class AsyncEvidence(e2e.Evidence):
    """:class:`npu_rl.e2e.Evidence` with the trainer steps keyed by ``training/global_step`` and the
    rollouter's windows keyed by weight version."""

    rollouter: dict[int, dict[str, float]] = field(default_factory=dict)


def parse_async(text: str) -> tuple[dict[int, dict[str, float]], dict[int, dict[str, float]]]:
    """train.log -> ({trainer global step: metrics}, {weight version: rollouter window metrics})."""
    train: dict[int, dict[str, float]] = {}
    windows: dict[int, dict[str, float]] = {}
    for line in text.splitlines():
        parsed = e2e.parse_metrics([line])
        for version, metrics in parsed.items():
            if "training/global_step" in metrics:
                train.setdefault(int(metrics["training/global_step"]), {}).update(metrics)
            if GENERATED in metrics:
                windows.setdefault(version, {}).update(metrics)
    return train, windows


def load(run_dir: Path) -> AsyncEvidence:
    """Read ``train.log`` and ``env.txt`` of a fully-async run directory.

    Raises:
        FileNotFoundError: ``run_dir/train.log`` does not exist.
    """
    text = (run_dir / "train.log").read_text(encoding="utf-8", errors="replace")
    train, windows = parse_async(text)
    # Validation (the rollouter's, logged by the trainer at the weight version it ran on; version 0
    # is the validation before training): its own console lines, without training/global_step.
    _, val = e2e.split_validation(e2e.parse_metrics(text.splitlines()))
    return AsyncEvidence(
        run_dir, train, e2e.parse_env(run_dir / "env.txt"), e2e._ANSI.sub("", text), val=val, rollouter=windows
    )


def stale_per_step(ev: AsyncEvidence) -> dict[int, float]:
    """Stale trajectories consumed at each trainer step (differences of verl's running count)."""
    out, before = {}, 0.0
    for step, m in sorted(ev.steps.items()):
        if STALE in m:
            out[step] = m[STALE] - before
            before = m[STALE]
    return out


def check_training(ev: AsyncEvidence, min_steps: int, entropy: bool = True) -> None:
    """Trainer steps 1..k, every loss finite, the reward computed; ``actor/entropy_loss`` only with
    ``entropy`` (verl computes and logs it only for a non-zero ``actor.entropy_coeff``)."""
    n = len(ev.steps)
    ev.add(
        "trainer steps",
        n >= min_steps and sorted(ev.steps) == list(range(1, n + 1)),
        f"training/global_step {sorted(ev.steps)} (need 1..k, k >= {min_steps})",
    )
    keys = ("actor/pg_loss", "actor/loss", *(("actor/entropy_loss",) if entropy else ()), "actor/grad_norm")
    for key in (*keys, "critic/score/mean"):
        vals = ev.series(key)
        ev.add(
            "reward computed" if key.startswith("critic") else f"finite {key}",
            n > 0 and len(vals) == n and all(math.isfinite(v) for v in vals),
            f"{key} at {len(vals)}/{n} steps: {e2e._fmt(vals)}",
        )


def check_consumed(ev: AsyncEvidence, sched: Schedule) -> None:
    """Every trainer step's batch came from the rollouter through the message queue: the trainer's
    own collection lines (``Loop collection completed: k/k samples``) add up to what the steps
    consumed, and every step carries the rollouter's per-sample processing times."""
    n = len(ev.steps)
    via_queue = len(ev.series("fully_async/processing_time/avg"))
    pulls = [(int(a), int(b)) for a, b in re.findall(r"Loop collection completed: (\d+)/(\d+) samples", ev.log)]
    pulled = sum(a for a, b in pulls if a == b)
    consumed = n * sched.required * sched.trigger
    ev.add(
        "consumed from the rollouter",
        n > 0 and via_queue == n and pulled >= consumed,
        f"prompts the trainer pulled from the message queue {pulled} (complete pulls {sum(a == b for a, b in pulls)}) "
        f">= consumed {consumed} ({n} steps x {sched.required * sched.trigger}); steps with the rollouter's "
        f"per-sample processing times {via_queue}/{n}",
    )


def check_live_sync(ev: AsyncEvidence, sched: Schedule) -> None:
    """Weights were synced while the rollouter ran, and the trainer used what it generated with them."""
    n = len(ev.steps)
    syncs = ev.series(PARAM_SYNC)
    after = {v: m[GENERATED] for v, m in sorted(ev.rollouter.items()) if v >= 2}
    per_step = sched.required * sched.trigger * sched.n
    fresh = {s: per_step - d for s, d in stale_per_step(ev).items() if s >= 2}
    ev.add(
        "weight sync with a live rollouter",
        n > 0 and len(syncs) == n and any(g > 0 for g in after.values()) and any(f > 0 for f in fresh.values()),
        f"param_sync after {len(syncs)}/{n} steps ({e2e._fmt(syncs)} s); prompts the rollouter generated after "
        f"the sync of version 1, 2, ...: {[int(g) for g in after.values()]}; trajectories of steps >= 2 finished "
        f"with the synced weights (of {per_step}): {[int(f) for f in fresh.values()]}",
    )


def check_staleness(ev: AsyncEvidence, sched: Schedule) -> None:
    """The run was asynchronous (stale trajectories consumed) and within its staleness threshold."""
    stale = stale_per_step(ev)
    prompts = {s: d / sched.n for s, d in stale.items()}
    counts = ev.series("fully_async/count/staleness_samples")
    dropped = max(ev.series("fully_async/count/dropped_stale_samples"), default=0.0)
    ev.add(
        "asynchronous (stale trajectories used)",
        sum(stale.values()) > 0,
        f"stale trajectories per step {[int(v) for v in stale.values()]} (staleness_threshold {sched.staleness:g}; "
        "0 everywhere means the rollouter never ran ahead of the trainer)",
    )
    ev.add(
        "staleness within threshold",
        bool(stale)
        and len(stale) == len(ev.steps)
        and all(p <= sched.stale_bound for p in prompts.values())
        and all(c <= sched.max_required for c in counts),
        f"stale prompts per step {[round(p, 2) for p in prompts.values()]} <= {sched.stale_bound} "
        f"(max_required_samples {sched.max_required} - {sched.required * sched.trigger} per sync); the rollouter's "
        f"staleness_samples {e2e._fmt(counts)} <= {sched.max_required}; dropped stale samples {dropped:g}",
    )


def check_rollout_matches_actor(ev: AsyncEvidence, sched: Schedule, kl_abs: float, kl_ratio: float) -> None:
    """At steps of fresh trajectories the rollout's log-probs are the actor's (module docstring)."""
    if not (sched.bypass and sched.require_batches == 1 and sched.trigger >= 1 and sched.ppo_epochs == 1):
        ev.add(
            "rollout matches actor",
            False,
            f"cannot be judged: actor/ppo_kl is the rollout-vs-actor KL only with rollout_correction.bypass_mode=True, "
            f"require_batches=1 and ppo_epochs=1 (got {sched.bypass}, {sched.require_batches}, {sched.ppo_epochs})",
        )
        return
    stale = stale_per_step(ev)
    kl = {s: m["actor/ppo_kl"] for s, m in sorted(ev.steps.items()) if "actor/ppo_kl" in m}
    fresh = {s: v for s, v in kl.items() if stale.get(s) == 0}
    moved = [v for s, v in kl.items() if stale.get(s, 0) > 0]
    movement = max(moved, default=0.0)
    bound = max(kl_abs, kl_ratio * movement)
    ev.add(
        "policy moves between syncs",
        movement > kl_abs,
        f"largest actor/ppo_kl of a step with stale trajectories {movement:.3g} (must exceed {kl_abs:g} for the "
        "rule below to mean anything)",
    )
    ev.add(
        "rollout matches actor",
        bool(fresh) and all(abs(v) <= bound for v in fresh.values()),
        f"actor/ppo_kl (rollout vs actor, bypass mode) at the steps with only fresh trajectories "
        f"{ {s: float(f'{v:.3g}') for s, v in fresh.items()} } <= {bound:.3g} (max({kl_abs:g}, {kl_ratio:g} x "
        f"{movement:.3g})); all steps {e2e._fmt(list(kl.values()))}",
    )


def check_partial(ev: AsyncEvidence, sched: Schedule, require: bool) -> None:
    """Partial rollout's bookkeeping at every step; with ``require``, one trajectory resumed across a sync."""
    n = len(ev.steps)
    partial = ev.series(PARTIAL)
    span = max(ev.series(PARTIAL_SPAN), default=0.0)
    idle = [m.get("fully_async/rollouter/idle_ratio") for _, m in sorted(ev.rollouter.items())]
    seen = n > 0 and len(partial) == n
    resumed = sum(partial) > 0 and span >= 1
    ok = sched.partial_rollout and seen and (resumed or not require)
    ev.add(
        "partial rollout",
        ok,
        f"partial_rollout={sched.partial_rollout}; fully_async/partial/* at {len(partial)}/{n} steps; trajectories "
        f"resumed across a weight sync {sum(partial):g} (longest span {span:g} versions)"
        + ("" if resumed else f"; none in flight at a sync (rollouter idle ratio per window {e2e._fmt(idle)})")
        + (" — required" if require else ""),
    )


def check(
    run_dir: Path,
    min_steps: int,
    kl_abs: float,
    kl_ratio: float,
    require_partial: bool,
    learned: float | None = None,
    final_val: float = 0.9,
) -> AsyncEvidence:
    """Every check above on one run directory (raises like :func:`load` and :func:`load_schedule`);
    with ``learned`` (the task's chance score) also :func:`npu_rl.e2e.check_learning`."""
    ev = load(run_dir)
    sched = load_schedule(run_dir)
    check_training(ev, min_steps, entropy=sched.entropy_coeff != 0)
    check_consumed(ev, sched)
    check_live_sync(ev, sched)
    check_staleness(ev, sched)
    check_rollout_matches_actor(ev, sched, kl_abs, kl_ratio)
    check_partial(ev, sched, require_partial)
    if learned is not None:
        e2e.check_learning(ev, learned, final_val)
    e2e.check_features(ev)
    e2e.check_active_metrics(ev)
    return ev
