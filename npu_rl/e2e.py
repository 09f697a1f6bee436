"""Evidence of a training run, read from its run directory: did every step, the weight sync and each
switched-on feature really happen? (``python -m npu_rl.e2e check RUN_DIR``; a run of verl's
fully-async trainer: ``python -m npu_rl.e2e check-async RUN_DIR``, :mod:`npu_rl.e2e_async`)

The launcher writes ``RUN_DIR/train.log`` (the recipe's output: verl's console metrics, one
``step:N - key:value - ...`` line per step, and what verl's Ray actors print) and ``RUN_DIR/env.txt``
(the node environment the run started with). This module parses both and checks (written for the
CPU main job, usable on any run of verl's V1 trainer):

- the run trained at least ``--min-steps`` steps, every loss is finite and the reward was computed;
- the weights reached the rollout: verl's rollout-vs-actor metrics (``rollout_corr/*``, computed on
  the same trajectories from vLLM's sampling log-probabilities and the actor's recompute) stay far
  below what a rollout one update behind would show (the next section says why);
- every feature switched on in ``env.txt`` or in verl's config dump left its trace (a metric or a
  log line); a feature that is on and silent is a failure, not a skip, and so is a feature that is
  on but has no trace this checker knows (:data:`UNCHECKED_SWITCHES`).

Why the weight-sync rule works: verl starts the rollout from ``load_format=dummy`` (random values in
[-1e-3, 1e-3]: almost uniform next-token distributions), so step 1's rollout-vs-actor KL is near
zero only if the first sync delivered the actor's weights; after that the actor changes every step,
and a rollout left one update behind would show a KL of the order of the policy's movement per
update. verl reports ``actor/ppo_kl`` per step as the mean over the step's micro-batches of the KL
between the policy being updated and the step's anchor: 0 on the first mini-batch, one update's KL
on the second, so with two mini-batches it is about half of one update's KL (an underestimate,
which makes the rule stricter). The rule is ``rollout_corr/kl <= max(--kl-abs, --kl-ratio *
movement)`` at every step, with the movement taken as the largest ``actor/ppo_kl`` of the run (see
docs/e2e.md for the measured values).
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_STEP = re.compile(r"(?:^|\s)step:(\d+) - (.*)$")
_NUMBER = re.compile(r"^(?:np\.\w+\()?(-?[0-9.eE+-]+|nan|inf|-inf)\)?$")


def parse_metrics(lines: Iterable[str]) -> dict[int, dict[str, float]]:
    """verl's console lines ``step:N - key:value - ...`` -> {N: {key: value}} (later lines win).

    Values verl prints as ``np.float64(2.0)`` are unwrapped; non-numeric values are skipped.
    """
    steps: dict[int, dict[str, float]] = {}
    for raw in lines:
        m = _STEP.search(_ANSI.sub("", raw.rstrip("\n")))
        if not m:
            continue
        metrics = steps.setdefault(int(m.group(1)), {})
        for item in m.group(2).split(" - "):
            key, sep, value = item.rpartition(":")
            num = _NUMBER.match(value.strip()) if sep else None
            if num:
                try:
                    metrics[key.strip()] = float(num.group(1))
                except ValueError:
                    continue
    return steps


def parse_env(path: Path) -> dict[str, str]:
    """``env.txt`` (``NAME  value`` per line, as the launcher prints it) -> {NAME: value}."""
    env: dict[str, str] = {}
    if path.is_file():
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            name, _, value = line.strip().partition(" ")
            if name and re.fullmatch(r"[A-Z_][A-Z0-9_]*", name):
                env[name] = value.strip()
    return env


@dataclass
class Check:
    """One piece of evidence: its name, whether it holds and what was seen."""

    name: str
    ok: bool
    detail: str


@dataclass
class Evidence:
    """Everything read from a run directory and the checks made on it."""

    run_dir: Path
    steps: dict[int, dict[str, float]]
    env: dict[str, str]
    log: str
    checks: list[Check] = field(default_factory=list)
    #: verl's validation metrics (``val-core/*``, ``val-aux/*``) per step; step 0 is the validation
    #: before training (``trainer.val_before_train``). They are not training steps.
    val: dict[int, dict[str, float]] = field(default_factory=dict)

    def add(self, name: str, ok: bool, detail: str) -> None:
        self.checks.append(Check(name, bool(ok), detail))

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    def series(self, key: str) -> list[float]:
        """The metric ``key`` at every step that has it, in step order."""
        return [m[key] for _, m in sorted(self.steps.items()) if key in m]


def load(run_dir: Path) -> Evidence:
    """Read ``train.log`` and ``env.txt`` of a run directory.

    Raises:
        FileNotFoundError: ``run_dir/train.log`` does not exist (the run never started its recipe).
    """
    log_path = run_dir / "train.log"
    text = log_path.read_text(encoding="utf-8", errors="replace")
    steps, val = split_validation(parse_metrics(text.splitlines()))
    return Evidence(run_dir, steps, parse_env(run_dir / "env.txt"), _ANSI.sub("", text), val=val)


def split_validation(
    metrics: dict[int, dict[str, float]],
) -> tuple[dict[int, dict[str, float]], dict[int, dict[str, float]]]:
    """(training steps, validation metrics per step): verl logs ``val-*`` keys on the step they were
    measured at, and the validation before training alone as step 0, which is no training step."""
    steps: dict[int, dict[str, float]] = {}
    val: dict[int, dict[str, float]] = {}
    for step, m in metrics.items():
        v = {k: x for k, x in m.items() if k.startswith("val-")}
        t = {k: x for k, x in m.items() if not k.startswith("val-")}
        if v:
            val[step] = v
        if t:
            steps[step] = t
    return steps, val


def _on(env: dict[str, str], name: str) -> bool:
    from npu_rl import settings  # the project's one reading of a feature switch

    return settings.is_on(name, env)


def check_training(ev: Evidence, min_steps: int) -> None:
    """Steps, finite losses, computed rewards."""
    n = len(ev.steps)
    ev.add("steps", n >= min_steps, f"{n} step(s) logged (need >= {min_steps})")
    for key in ("actor/pg_loss", "actor/loss", "actor/entropy", "actor/grad_norm"):
        vals = ev.series(key)
        ev.add(
            f"finite {key}",
            len(vals) == n and n > 0 and all(math.isfinite(v) for v in vals),
            f"{len(vals)}/{n} steps, values {_fmt(vals)}",
        )
    scores = ev.series("critic/score/mean")
    ev.add(
        "reward computed",
        len(scores) == n and n > 0 and all(math.isfinite(v) for v in scores),
        f"critic/score/mean at {len(scores)}/{n} steps: {_fmt(scores)}",
    )


def skips_old_log_prob(ev: Evidence) -> bool:
    """Whether the run used ``actor_rollout_ref.actor.recompute_old_log_prob=false`` (the on-policy
    shortcut; verl's config dump in the log shows the key)."""
    return "'recompute_old_log_prob': False" in ev.log


#: The smallest |actor/pg_loss| of a step that counts as a policy gradient off-policy (the learning runs'
#: first steps: 0.0486 with four mini-batches; a fully on-policy update's value is rounding noise, ~1e-8).
PG_LOSS_MIN = 1e-6

#: A still policy's ``actor/entropy`` drift from its first step (nats/token) in the on-policy shortcut,
#: where ``actor/ppo_kl`` is 0 by construction: the lr-0 control drifted 0.003 over 6 steps (sampling
#: noise of 1,024 samples), the learning run's entropy fell 0.107 in its first update.
ENTROPY_STILL = 0.02


def check_weight_sync(
    ev: Evidence,
    kl_abs: float,
    kl_ratio: float,
    probs_diff_max: float,
    control: bool = False,
    entropy_abs: float = ENTROPY_STILL,
) -> None:
    """Weights reach the rollout at every step (module docstring: the rule and why). ``control``: a
    negative control whose learning is switched off (lr 0): its policy must not move (every
    ``actor/ppo_kl`` within ``kl_abs``; with the on-policy shortcut, where that KL is 0 by
    construction, every ``actor/entropy`` within ``entropy_abs`` of the first step's), and the rollout
    must still match the actor within ``kl_abs``."""
    n = len(ev.steps)
    sync = ev.series("timing_s/update_weights")
    ev.add(
        "weight sync ran", len(sync) == n and n > 0, f"timing_s/update_weights at {len(sync)}/{n} steps: {_fmt(sync)}"
    )
    if skips_old_log_prob(ev):
        # No old-log-prob pass, so no rollout_corr/*: the shortcut reports |p_actor - p_rollout| of
        # the update pass instead (before its optimizer step, i.e. with the weights just synced).
        diff = ev.series("actor/training/rollout_probs_diff_max")
        ev.add(
            "rollout matches actor",
            len(diff) == n and n > 0 and all(v <= probs_diff_max for v in diff),
            f"actor/training/rollout_probs_diff_max per step {_fmt(diff)} <= {probs_diff_max:g}",
        )
        if control:
            ent = ev.series("actor/entropy")
            ev.add(
                "policy still (control)",
                len(ent) == n and n > 0 and all(abs(v - ent[0]) <= entropy_abs for v in ent),
                f"actor/entropy per step {_fmt(ent)}: all within {entropy_abs:g} of the first (learning switched "
                "off; the on-policy shortcut's actor/ppo_kl is 0 by construction)",
            )
        return
    kl = ev.series("rollout_corr/kl")
    movement = max(ev.series("actor/ppo_kl"), default=0.0)
    bound = max(kl_abs, kl_ratio * movement)
    if control:
        moves = ev.series("actor/ppo_kl")
        ev.add(
            "policy still (control)",
            len(moves) == n and n > 0 and all(abs(v) <= kl_abs for v in moves),
            f"actor/ppo_kl per step {_fmt(moves)}: all within {kl_abs:g} (learning switched off)",
        )
        ev.add(
            "rollout matches actor",
            len(kl) == n and n > 0 and all(abs(v) <= kl_abs for v in kl),
            f"rollout_corr/kl per step {_fmt(kl)} <= {kl_abs:g}",
        )
        return
    ev.add(
        "policy moves between syncs",
        movement > kl_abs,
        f"largest actor/ppo_kl {movement:.3g} (one update's KL; must exceed {kl_abs:g} for the sync "
        "check to mean anything)",
    )
    ev.add(
        "rollout matches actor",
        len(kl) == n and n > 0 and all(abs(v) <= bound for v in kl),
        f"rollout_corr/kl per step {_fmt(kl)} <= {bound:.3g} (max({kl_abs:g}, {kl_ratio:g} x {movement:.3g}))",
    )


_VAL_SCORE = re.compile(r"val-core/(.+)/(?:reward|acc)/mean@(\d+)")


def val_scores(ev: Evidence) -> list[tuple[int, float]]:
    """(step, validation score) of a run's evidence: :func:`val_scores_of` its ``val`` metrics."""
    return val_scores_of(ev.val)


def val_scores_of(val: dict[int, dict[str, float]]) -> list[tuple[int, float]]:
    """(step, validation score) in step order from validation metrics per step (as
    :func:`split_validation` returns them): verl's ``val-core/<data source>/reward/mean@N`` (or
    ``acc``), averaged over the data sources when there are several; steps without one are left out."""
    out = []
    for step, m in sorted(val.items()):
        vals = [v for k, v in m.items() if _VAL_SCORE.fullmatch(k)]
        if vals:
            out.append((step, sum(vals) / len(vals)))
    return out


def check_learning(ev: Evidence, chance: float, final_min: float) -> None:
    """The policy learned the task (docs/e2e.md, "Learning runs"): the mean reward of the first two
    steps is at most 2 x ``chance`` (the task starts unsolved), the last validation score is at least
    ``final_min``, and the policy gradient ran (advantages of both signs and a non-zero
    ``actor/pg_loss`` at the first step, when every group has something to learn)."""
    scores = ev.series("critic/score/mean")
    first = scores[:2]
    val = val_scores(ev)
    # The validation before training too, where there is one: a shaped reward (DAPO's overlong
    # penalty) can push the training score below chance whatever the policy knows.
    before = [v for s, v in val if s == 0]
    ev.add(
        "starts near chance",
        len(first) == 2 and sum(first) / 2 <= 2 * chance and all(v <= 2 * chance for v in before),
        f"critic/score/mean of steps 1-2 {_fmt(first)}, mean <= 2 x chance ({2 * chance:g})"
        + (f"; validation before training {before[0]:.3g} <= {2 * chance:g}" if before else ""),
    )
    ev.add(
        "validation solved",
        bool(val) and val[-1][1] >= final_min,
        f"validation score per step {[(s, round(v, 3)) for s, v in val]}; the last must be >= {final_min:g}",
    )
    steps = sorted(ev.steps)
    head = ev.steps[steps[0]] if steps else {}
    adv = (head.get("critic/advantages/min", 0.0), head.get("critic/advantages/max", 0.0))
    pg = ev.series("actor/pg_loss")
    if skips_old_log_prob(ev):
        # On-policy the ratio is 1, so the loss's value is minus the mean advantage: 0 up to rounding
        # (GRPO's advantages are zero-mean per group; measured -2.8e-9). Its gradient is not 0.
        grad = ev.series("actor/grad_norm")
        ev.add(
            "policy gradient ran",
            adv[0] < 0 < adv[1] and any(v > 0 for v in grad[:1]),
            f"step {steps[0] if steps else '-'}: critic/advantages min/max {adv[0]:.3g}/{adv[1]:.3g}, "
            f"actor/grad_norm {_fmt(grad[:1])} (both must be non-zero; on-policy actor/pg_loss "
            f"{_fmt(pg[:1])} is the advantages' mean, 0 by construction)",
        )
        return
    moved = [v for v in pg if abs(v) > PG_LOSS_MIN]
    ev.add(
        "policy gradient ran",
        adv[0] < 0 < adv[1] and bool(moved),
        f"step {steps[0] if steps else '-'}: critic/advantages min/max {adv[0]:.3g}/{adv[1]:.3g} (must be "
        f"non-zero); actor/pg_loss {_fmt(pg[:3])}: {len(moved)}/{len(pg)} steps with |pg_loss| > {PG_LOSS_MIN:g} "
        "(an on-policy update's loss value is the advantages' mean, 0 up to rounding)",
    )


_OVERLONG = re.compile(r"val-aux/(.+)/overlong/mean@(\d+)")


def check_dapo(ev: Evidence) -> None:
    """DAPO's two run-time mechanisms acted (docs/e2e.md, "Learning runs"):

    - dynamic sampling: verl's V1 replay buffer dropped groups whose responses all scored the same
      (``training/filter_groups/evicted_samples`` > 0 at some step) and refilled the batch;
    - the overlong reward shaping: the dapo reward manager logged it (``val-aux/<source>/overlong/mean@N``,
      the share of validation responses inside the overlong buffer, with ``overlong_buffer_cfg.log``),
      and that share fell from the first validation to the last (the policy learned to stop in time).
    """
    evicted = ev.series("training/filter_groups/evicted_samples")
    ev.add(
        "dynamic sampling dropped groups",
        sum(evicted) > 0,
        f"training/filter_groups/evicted_samples at {len(evicted)} step(s), {sum(evicted):g} in all (must be > 0)",
    )
    share = []
    for step, m in sorted(ev.val.items()):
        vals = [v for k, v in m.items() if _OVERLONG.fullmatch(k)]
        if vals:
            share.append((step, sum(vals) / len(vals)))
    ev.add(
        "overlong shaping acted",
        len(share) >= 2 and share[-1][1] < share[0][1],
        f"share of overlong validation responses per step {[(s, round(v, 3)) for s, v in share]}; "
        "the last must be below the first (overlong_buffer_cfg.log=True logs it)",
    )


def check_no_learning(ev: Evidence, chance: float) -> None:
    """The negative control (learning switched off): every step's mean reward and every validation
    score stay at most 2 x ``chance``."""
    scores = ev.series("critic/score/mean")
    val = [v for _, v in val_scores(ev)]
    ev.add(
        "stays at chance",
        bool(scores) and all(v <= 2 * chance for v in scores + val),
        f"critic/score/mean {_fmt(scores, 40)} and validation {_fmt(val)} all <= 2 x chance ({2 * chance:g})",
    )


# Features whose switch this checker sees but whose metrics the CPU job cannot produce (see UNCHECKED_SWITCHES).
UNCHECKED_FEATURES = ("random init", "all-to-all-v MoE reshard")

# Feature variables whose work leaves no trace this checker can read (they are not for the CPU job).
UNCHECKED_SWITCHES = {
    "NPU_RL_RANDOM_INIT": "it acts on the Megatron engine only (verl patch 0002); nothing to see with FSDP",
    "ALL_TO_ALL_RESHARD": "it needs an MoE model with expert parallelism",
}

OLD_LOG_PROB_SKIPPED_S = 0.5  # a recompute pass over even one small batch takes longer

FEATURE_CHECKS = (
    "skip old-log-prob",
    "length-aware resampler",
    "long-tail guard",
    "rollout rebalance",
    "rollout progress",
    "engine GC",
)


def check_features(ev: Evidence) -> None:
    """Each feature switched on in env.txt or the logged overrides left its trace."""
    env, log = ev.env, ev.log
    if skips_old_log_prob(ev):
        n = len(ev.steps)
        # verl's V1 trainer times the (skipped) branch anyway: ~4 ms here against 12-15 s for the pass.
        skipped = sum(m.get("timing_s/old_log_prob", 0.0) < OLD_LOG_PROB_SKIPPED_S for m in ev.steps.values())
        aliased = len(ev.series("actor/training/rollout_probs_diff_mean"))
        entropy = len(ev.series("actor/entropy"))
        ev.add(
            "skip old-log-prob",
            n > 0 and skipped == n and aliased == n and entropy == n,
            f"steps without an old-log-prob pass (timing_s/old_log_prob < {OLD_LOG_PROB_SKIPPED_S:g} s) {skipped}/{n}; "
            "rollout-vs-actor diff from the update pass "
            f"(actor/training/rollout_probs_diff_mean) at {aliased}/{n}; actor/entropy at {entropy}/{n}",
        )
    if "'class_name': 'LengthAwareEpochSampler'" in log:  # verl's config dump: data.sampler.class_name
        check_resampler(ev)
    if _on(env, "VLLM_ROLLOUT_EARLY_STOP_ENABLE"):
        check_long_tail_guard(ev)
    if _on(env, "ROLLOUT_REBALANCE_ENABLE"):
        # targets are replica<i> or replica<i>#dp<r> (npu_rl.rebalance.verl_lb)
        target = re.compile(r"rollout_rebalance/(replica\d+(?:#dp\d+)?)/requests")
        per_step = []
        for _, m in sorted(ev.steps.items()):
            used = {t.group(1): v for k, v in m.items() if (t := target.fullmatch(k))}
            per_step.append((sum(used.values()), sum(v > 0 for v in used.values())))
        ev.add(
            "rollout rebalance",
            bool(per_step) and all(total > 0 and busy >= 2 for total, busy in per_step),
            f"requests dispatched / targets used per step {[(int(t), b) for t, b in per_step]} (need >= 2 targets)",
        )
    if _on(env, "NPU_RL_ROLLOUT_PROGRESS"):
        lines = re.findall(r"rollout (?:train|val): \d+/\S+ responses", log)
        ev.add("rollout progress", bool(lines), f"{len(lines)} progress line(s)")
    for name, why in UNCHECKED_SWITCHES.items():
        if _on(env, name):
            ev.add(name, False, f"switched on, but this checker knows no trace of it: {why}")
    if "'method': 'sam'" in log:
        check_sam(ev)
    if _on(env, "NPU_RL_ENGINE_GC"):
        on = len(re.findall(r"engine GC guard on", log))
        ev.add("engine GC", on > 0, f"guard announced by {on} engine core(s)")


GUARD_METRICS = "npu_rl/long_tail_guard/"
SAM_METRICS = "npu_rl/sam/"


def _reported_every_step(ev: Evidence, prefix: str) -> bool:
    """A feature whose runtime reports per step (``<prefix>active``, ``<prefix>responses``): ``active`` 1
    at every step and every step's responses carrying the feature's verdicts (none lost on the way)."""
    n = len(ev.steps)
    active, responses = ev.series(prefix + "active"), ev.series(prefix + "responses")
    return len(active) == n and all(a == 1.0 for a in active) and len(responses) == n and all(r > 0 for r in responses)


def check_sam(ev: Evidence) -> None:
    """SAM drafted and its drafts were verified: its step metrics (``npu_rl/sam/*``, from each
    response's draft counts: vllm patch 0005, verl patch 0012, :mod:`npu_rl.spec_decode.metrics`)
    are at every step with ``active`` 1 and every step's responses carrying counts, and SAM drafted
    tokens over the run (``drafted`` > 0: a drafter that never proposes is a silent no-op)."""
    n = len(ev.steps)
    active = ev.series(SAM_METRICS + "active")
    drafted, acceptance = ev.series(SAM_METRICS + "drafted"), ev.series(SAM_METRICS + "acceptance")
    per_forward = ev.series(SAM_METRICS + "tokens_per_forward")
    ev.add(
        "SAM",
        n > 0 and _reported_every_step(ev, SAM_METRICS) and sum(drafted) > 0,
        f"{SAM_METRICS}active at {len(active)}/{n} steps; draft tokens per step {_fmt(drafted)}; "
        f"acceptance per step {_fmt(acceptance)}; tokens per forward {_fmt(per_forward)}",
    )
    sent = ev.series(SAM_METRICS + "history_rewards_sent")
    if sent:  # the history ranked by the trainer's rewards (sam_history_rewards; npu_rl.spec_decode.rewards)
        rated = ev.series(SAM_METRICS + "history_rated")
        ev.add(
            "SAM history rewards",
            len(sent) == n and all(x > 0 for x in sent) and bool(rated) and rated[-1] > 0,
            f"ratings sent per step {_fmt(sent)}; ratings that found their response (the store's count) "
            f"{_fmt(rated) if rated else 'never reported'}",
        )


def check_long_tail_guard(ev: Evidence) -> None:
    """The long-tail guard cut responses. When the run logged the guard's step metrics
    (``npu_rl/long_tail_guard/*``: verl patch 0007 carries each response's verdict to the V1
    trainer), they are the evidence: ``active`` at every step, every step's responses carrying a
    verdict (``responses`` > 0: the verdicts were not lost on the way) and ``cuts`` > 0 over the run.
    A run without them (from before the metrics): the per-step lines the vLLM servers print."""
    n = len(ev.steps)
    active = ev.series(GUARD_METRICS + "active")
    if active:
        responses, cuts = ev.series(GUARD_METRICS + "responses"), ev.series(GUARD_METRICS + "cuts")
        ev.add(
            "long-tail guard",
            _reported_every_step(ev, GUARD_METRICS) and sum(cuts) > 0,
            f"{GUARD_METRICS}active at {len(active)}/{n} steps; responses with a verdict per step "
            f"{_fmt(responses)}; cuts per step {_fmt(cuts)}",
        )
        return
    pattern = r"long-tail guard, step \S+: \{[^}]*'guard/cut_count': ([0-9.]+)"
    cuts = sum(float(c) for c in re.findall(pattern, ev.log))
    ev.add("long-tail guard", cuts > 0, f"responses cut (server log lines; no {GUARD_METRICS}* metrics): {cuts:g}")


def check_active_metrics(ev: Evidence) -> None:
    """Every switched-on feature said it is active in the step metrics (``npu_rl/<feature>/active`` = 1 at
    every step: verl patch 0010 and the features' own paths, :mod:`npu_rl.feature_metrics`), and no
    ``active`` metric reads 0."""
    from npu_rl import feature_metrics, settings

    expected = {f.name for f in settings.FEATURES if f.env is not None and _on(ev.env, f.env)}
    if "'class_name': 'LengthAwareEpochSampler'" in ev.log:
        expected.add("length-aware resampler")
    if skips_old_log_prob(ev):
        expected.add("skip old-log-prob recompute")
    expected -= set(UNCHECKED_FEATURES)
    if not expected:
        return
    n = len(ev.steps)
    counts = {}
    for name in sorted(expected):
        vals = ev.series(feature_metrics.metric(name))
        counts[feature_metrics.SLUGS[name]] = (sum(v == 1.0 for v in vals), len(vals))
    zero = sorted(k for _, m in ev.steps.items() for k, v in m.items() if k.endswith("/active") and v == 0.0)
    ok = n > 0 and all(ones == n for ones, _ in counts.values()) and not zero
    shown = ", ".join(f"{slug} {ones}/{n}" for slug, (ones, _) in counts.items())
    ev.add("active metrics", ok, f"npu_rl/<feature>/active = 1 at: {shown}" + (f"; 0 at: {zero}" if zero else ""))


def check_resampler(ev: Evidence) -> None:
    """The length-aware resampler learned and used the lengths: ``sampler/*`` metrics at every step,
    and from the second epoch on an order that differs from the first and whose generation batches
    follow the predicted lengths (each batch's length buckets no lower than the previous batch's
    when ``shuffle_batch_blocks=False``, the CPU recipe's setting; otherwise every batch spans fewer
    buckets than the whole epoch)."""
    import numpy as np

    from npu_rl.sampler import parse_epoch_lines

    n = len(ev.steps)
    cov = ev.series("sampler/table_coverage")
    ev.add("resampler metrics", len(cov) == n and n > 0, f"sampler/table_coverage at {len(cov)}/{n} steps: {_fmt(cov)}")
    epochs = parse_epoch_lines(ev.log)
    if 0 not in epochs or not any(e >= 1 for e in epochs):
        ev.add(
            "length-aware resampler", False, f"epoch order lines for epochs {sorted(epochs)} (need 0 and a later one)"
        )
        return
    first = epochs[0][0]
    later = min(e for e in epochs if e >= 1)
    order, pred, batch, bucket, shuffled = epochs[later]
    known = all(np.isfinite(pred))
    buckets = [int(p // bucket) for p in pred] if known else []
    cut = len(order) - len(order) % batch
    blocks = [buckets[i : i + batch] for i in range(0, cut, batch)]
    if shuffled:
        # batches in random order: each one must still be narrower than the whole epoch
        rule = "narrower than the epoch"
        follows = bool(blocks) and all(len(set(b)) < len(set(buckets[:cut])) for b in blocks)
    else:
        rule = "ascending"
        follows = all(max(a) <= min(b) for a, b in zip(blocks, blocks[1:], strict=False))
    ev.add(
        "length-aware resampler",
        order != first and known and len(blocks) >= 2 and follows,
        f"epoch {later} order differs from epoch 0: {order != first}; every prompt predicted: {known}; "
        f"buckets per generation batch {[sorted(set(b)) for b in blocks]} ({rule}: {follows})",
    )


def _fmt(vals: list[float], limit: int = 8) -> str:
    shown = ", ".join(f"{v:.3g}" for v in vals[:limit])
    return f"[{shown}{', ...' if len(vals) > limit else ''}]"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m npu_rl.e2e", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check", help="check a run directory's evidence; exit 1 when any is missing")
    c.add_argument("run_dir", type=Path)
    c.add_argument("--min-steps", type=int, default=4)
    c.add_argument("--kl-abs", type=float, default=1e-3, help="rollout-vs-actor KL always accepted (nats/token)")
    c.add_argument("--kl-ratio", type=float, default=0.1, help="... or this share of one update's KL")
    c.add_argument(
        "--probs-diff-max",
        type=float,
        default=1e-3,
        help="with recompute_old_log_prob=false: largest |p_actor - p_rollout| accepted per step",
    )
    c.add_argument(
        "--entropy-abs",
        type=float,
        default=ENTROPY_STILL,
        help="with --at-chance and recompute_old_log_prob=false: largest drift of actor/entropy from the first step",
    )
    c.add_argument("--require", nargs="*", default=[], help="features that must be on (names as printed)")
    c.add_argument(
        "--learned",
        type=float,
        metavar="CHANCE",
        help="a learning run: starts within 2 x CHANCE (the task's chance reward) and ends with a validation "
        "score >= --final-val",
    )
    c.add_argument("--final-val", type=float, default=0.9, help="with --learned: the last validation score needed")
    c.add_argument(
        "--dapo",
        action="store_true",
        help="a DAPO run: dynamic sampling dropped groups and the overlong shaping shortened the responses",
    )
    c.add_argument(
        "--at-chance",
        type=float,
        metavar="CHANCE",
        help="a negative control: every step's reward and validation score stay within 2 x CHANCE",
    )
    ca = sub.add_parser(
        "check-async",
        help="check a fully-async run's evidence (npu_rl.e2e_async: queue, live weight sync, staleness, partial "
        "rollout); exit 1 when any is missing",
    )
    ca.add_argument("run_dir", type=Path)
    ca.add_argument("--min-steps", type=int, default=4, help="trainer steps (training/global_step) needed")
    ca.add_argument("--kl-abs", type=float, default=1e-3, help="rollout-vs-actor KL always accepted (nats/token)")
    ca.add_argument("--kl-ratio", type=float, default=0.1, help="... or this share of one update's KL")
    ca.add_argument(
        "--require-partial",
        action="store_true",
        help="fail unless a trajectory was interrupted at a weight sync and resumed",
    )
    ca.add_argument(
        "--learned",
        type=float,
        metavar="CHANCE",
        help="a learning run: starts within 2 x CHANCE and ends with a validation score >= --final-val",
    )
    ca.add_argument("--final-val", type=float, default=0.9, help="with --learned: the last validation score needed")
    a = p.parse_args(argv)
    if a.cmd == "check-async":
        return _main_async(a)
    try:
        ev = load(a.run_dir)
    except FileNotFoundError as e:
        print(f"error: {e}: the run did not reach its recipe", file=sys.stderr)
        return 1
    check_training(ev, a.min_steps)
    check_weight_sync(
        ev, a.kl_abs, a.kl_ratio, a.probs_diff_max, control=a.at_chance is not None, entropy_abs=a.entropy_abs
    )
    if a.learned is not None:
        check_learning(ev, a.learned, a.final_val)
    if a.at_chance is not None:
        check_no_learning(ev, a.at_chance)
    if a.dapo:
        check_dapo(ev)
    check_features(ev)
    check_active_metrics(ev)
    unknown = sorted(set(a.require) - set(FEATURE_CHECKS))
    if unknown:
        print(
            f"error: --require {', '.join(unknown)}: no such check; known: {', '.join(FEATURE_CHECKS)}", file=sys.stderr
        )
        return 2
    seen = {c.name for c in ev.checks}
    for name in a.require:
        if name not in seen:
            ev.add(name, False, "required, but not switched on in this run (nothing to check)")
    return _report(ev)


def _report(ev: Evidence) -> int:
    for chk in ev.checks:
        print(f"{'ok     ' if chk.ok else 'MISSING'} {chk.name}: {chk.detail}")
    failed = sum(not c.ok for c in ev.checks)
    print(f"{len(ev.checks) - failed} passed, {failed} failed")
    return 0 if ev.ok else 1


def _main_async(a: argparse.Namespace) -> int:
    from npu_rl import e2e_async

    try:
        ev = e2e_async.check(
            a.run_dir, a.min_steps, a.kl_abs, a.kl_ratio, a.require_partial, learned=a.learned, final_val=a.final_val
        )
    except FileNotFoundError as e:
        print(f"error: {e}: the run did not reach its recipe through run_verl", file=sys.stderr)
        return 1
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return _report(ev)


if __name__ == "__main__":
    sys.exit(main())
