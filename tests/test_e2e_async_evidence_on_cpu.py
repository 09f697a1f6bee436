"""npu_rl.e2e check-async: the evidence checker of the fully-async CPU run, on a recorded run.

tests/data/e2e_async/ holds what a real run of recipes/qwen3-tiny/grpo_cpu_fully_async.sh left
(README.md there says which run and how it was cut): the FullyAsyncTrainer's step lines, verbatim,
the engine core's GC line, env.txt and the composed Hydra config. Each test below changes the
recorded numbers the way a broken run would show them and expects the check that catches it.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from npu_rl import e2e, e2e_async

RECORDED = Path(__file__).parent / "data" / "e2e_async"


def _run(tmp_path: Path, edit=None, config_edit=None) -> Path:
    """A copy of the recorded run; ``edit(lines) -> lines`` changes train.log, ``config_edit(text) -> text``
    the composed config."""
    run = tmp_path / "run"
    shutil.copytree(RECORDED, run)
    if edit:
        log = run / "train.log"
        log.write_text("\n".join(edit(log.read_text().splitlines())) + "\n")
    if config_edit:
        cfg = run / "hydra" / ".hydra" / "config.yaml"
        cfg.write_text(config_edit(cfg.read_text()))
    return run


def _set(lines: list[str], global_step: int, key: str, value: float) -> list[str]:
    """Set ``key`` to ``value`` in the trainer line of ``training/global_step`` = global_step."""
    out, hit = [], False
    for line in lines:
        if f"training/global_step:{float(global_step)} " in line:
            line, n = re.subn(rf"(?<= - ){re.escape(key)}:[^ ]+", f"{key}:{value}", line)
            assert n == 1, (key, line[:120])
            hit = True
        out.append(line)
    assert hit, global_step
    return out


def _set_window(lines: list[str], version: int, generated: float) -> list[str]:
    """Set the rollouter's samples generated in the window reported at step ``version``."""
    key = e2e_async.GENERATED
    return [
        re.sub(rf"(?<= - ){re.escape(key)}:[^ ]+", f"{key}:{generated}", line)
        if re.search(rf"step:{version} - fully_async/rollouter/", line)
        else line
        for line in lines
    ]


def _stale(lines: list[str], per_step: list[float]) -> list[str]:
    """Rewrite the running stale-trajectory count from per-step values."""
    total = 0.0
    for step, v in enumerate(per_step, 1):
        total += v
        lines = _set(lines, step, e2e_async.STALE, total)
    return lines


def _check(run: Path, *args: str) -> tuple[int, str]:
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = e2e.main(["check-async", str(run), *args])
    return rc, buf.getvalue()


def test_recorded_run_passes():
    rc, out = _check(RECORDED)
    assert rc == 0, out
    assert "MISSING" not in out
    assert re.search(r"^ok      trainer steps: training/global_step \[1, 2, 3, 4\]", out, re.M)
    assert "ok      engine GC" in out
    assert "ok      active metrics: npu_rl/<feature>/active = 1 at: engine_gc 4/4" in out
    assert out.strip().splitlines()[-1] == "15 passed, 0 failed"


def test_parse_async_keys_trainer_steps_by_global_step():
    ev = e2e_async.load(RECORDED)
    assert sorted(ev.steps) == [1, 2, 3, 4]
    # the trainer's line of global step g is printed at step:g+1 (verl logs a cycle late)
    assert all(m["fully_async/count/current_param_version"] == g - 1 for g, m in ev.steps.items())
    assert sorted(ev.rollouter) == [0, 1, 2, 3, 4]
    assert e2e_async.load_schedule(RECORDED).stale_bound == 2


def test_too_few_steps_and_nan_loss_fail(tmp_path):
    rc, out = _check(RECORDED, "--min-steps", "5")
    assert rc == 1 and "MISSING trainer steps" in out
    rc, out = _check(_run(tmp_path, lambda ls: _set(ls, 2, "actor/loss", float("nan"))))
    assert rc == 1 and "MISSING finite actor/loss" in out


def test_sync_that_did_not_deliver_weights_fails(tmp_path):
    # The rollout still on its dummy weights at the fresh step: KL of several nats to the actor.
    rc, out = _check(_run(tmp_path, lambda ls: _set(ls, 1, "actor/ppo_kl", 2.5)))
    assert rc == 1
    assert "MISSING rollout matches actor" in out


def test_no_fresh_step_cannot_prove_the_sync(tmp_path):
    rc, out = _check(_run(tmp_path, lambda ls: _stale(ls, [16, 8, 8, 8])))
    assert rc == 1
    assert "MISSING rollout matches actor: actor/ppo_kl (rollout vs actor, bypass mode)" in out
    assert "at the steps with only fresh trajectories {}" in out


def test_synchronous_run_fails_the_asynchrony_check(tmp_path):
    rc, out = _check(_run(tmp_path, lambda ls: _stale(ls, [0, 0, 0, 0])))
    assert rc == 1
    assert "MISSING asynchronous (stale trajectories used)" in out


def test_staleness_beyond_threshold_fails(tmp_path):
    # 3 stale prompts (12 trajectories) in one step: more than max_required_samples 6 - 4 allows.
    rc, out = _check(_run(tmp_path, lambda ls: _stale(ls, [0, 8, 12, 8])))
    assert rc == 1
    assert "MISSING staleness within threshold" in out


def test_rollouter_dead_after_the_first_sync_fails(tmp_path):
    def dead(lines):
        for version in (2, 3, 4):
            lines = _set_window(lines, version, 0.0)
        return _stale(lines, [0, 16, 16, 16])

    rc, out = _check(_run(tmp_path, dead))
    assert rc == 1
    assert "MISSING weight sync with a live rollouter" in out


def test_partial_rollout_is_reported_and_can_be_required(tmp_path):
    rc, out = _check(RECORDED, "--require-partial")
    assert rc == 1
    assert "MISSING partial rollout" in out and "none in flight at a sync" in out

    def resumed(lines):
        lines = _set(lines, 3, e2e_async.PARTIAL, 2.0)
        return _set(lines, 3, e2e_async.PARTIAL_SPAN, 1.0)

    rc, out = _check(_run(tmp_path, resumed), "--require-partial")
    assert rc == 0, out
    assert "trajectories resumed across a weight sync 2 (longest span 1 versions)" in out


def test_without_bypass_mode_the_kl_rule_cannot_be_judged(tmp_path):
    run = _run(tmp_path, config_edit=lambda t: t.replace("bypass_mode: true", "bypass_mode: false"))
    rc, out = _check(run)
    assert rc == 1
    assert "MISSING rollout matches actor: cannot be judged" in out


def test_switched_on_feature_without_trace_fails(tmp_path):
    run = _run(tmp_path)
    (run / "env.txt").write_text((run / "env.txt").read_text() + "NPU_RL_ROLLOUT_PROGRESS  1\n")
    rc, out = _check(run)
    assert rc == 1
    assert "MISSING rollout progress: 0 progress line(s)" in out


def test_an_active_metric_missing_or_zero_at_a_step_fails(tmp_path):
    # verl patch 0010 logs npu_rl/<feature>/active once per weight-sync cycle under this trainer.
    run = _run(tmp_path, lambda lines: _set(lines, 3, "npu_rl/engine_gc/active", 0.0))
    rc, out = _check(run)
    assert rc == 1
    assert "MISSING active metrics: npu_rl/<feature>/active = 1 at: engine_gc 3/4" in out
    assert "0 at: ['npu_rl/engine_gc/active']" in out


def test_a_main_ppo_run_is_refused(tmp_path, capsys):
    run = _run(tmp_path, config_edit=lambda t: re.sub(r"(?ms)^async_training:.*?(?=^\S)", "", t))
    assert e2e.main(["check-async", str(run)]) == 1
    assert "not a fully-async run" in capsys.readouterr().err


def test_missing_run_is_an_error(tmp_path, capsys):
    assert e2e.main(["check-async", str(tmp_path)]) == 1
    assert "did not reach its recipe" in capsys.readouterr().err


@pytest.mark.parametrize("required, staleness, trigger, bound", [(4, 0.5, 1, 2), (4, 0.0, 1, 0), (8, 0.5, 2, 8)])
def test_stale_bound_follows_verl_max_required_samples(required, staleness, trigger, bound):
    sched = e2e_async.Schedule(4, required, 1, staleness, trigger, True, True, 1)
    assert sched.stale_bound == bound


# --- a fully-async learning run (issue 34): the rollouter's validation lines are the evidence ---------------
LEARNED = Path(__file__).parent / "data" / "e2e_async_learn"
LEARN_ARGS = ("--min-steps", "79", "--learned", "0.1", "--final-val", "0.8")


def _set_val(lines: list[str], version: int, value: float) -> list[str]:
    """Set the validation score the trainer logged for weight ``version`` (its own line, no global step)."""
    key = "val-core/npu_rl/toy_find_digit/acc/mean@1"
    out = [
        re.sub(rf"(?<= - ){re.escape(key)}:np\.float64\([^)]*\)", f"{key}:{value}", ln)
        if re.search(rf"step:{version} - rollouter/validate_time", ln)
        else ln
        for ln in lines
    ]
    assert out != lines, version
    return out


def test_the_recorded_learning_run_passes_and_reads_the_rollouters_validation():
    ev = e2e_async.load(LEARNED)
    assert [(s, round(v, 3)) for s, v in e2e.val_scores(ev)] == [
        (0, 0.0),
        (20, 0.383),
        (40, 0.852),
        (60, 0.926),
        (80, 0.926),
    ]
    rc, out = _check(LEARNED, *LEARN_ARGS)
    assert rc == 0 and "MISSING" not in out, out
    # entropy_coeff 0.01 in this recipe: verl logs actor/entropy_loss, and the check requires it
    assert "ok      finite actor/entropy_loss: actor/entropy_loss at 79/79 steps" in out
    assert "ok      validation solved" in out and "ok      policy gradient ran" in out


@pytest.mark.parametrize(
    ("edit", "failed"),
    [
        (lambda lines: _set_val(lines, 80, 0.7), "validation solved"),  # not solved at the end
        (lambda lines: _set_val(lines, 0, 0.9), "starts near chance"),  # solved before it trained
        # the rollouter's validation lines missing altogether: nothing shows it learned
        (lambda lines: [ln for ln in lines if "rollouter/validate_time" not in ln], "validation solved"),
    ],
    ids=["unsolved", "solved-before", "no-validation"],
)
def test_learning_evidence_of_a_fully_async_run_fails_on_each_missing_piece(tmp_path, edit, failed):
    run = tmp_path / "run"
    shutil.copytree(LEARNED, run)
    log = run / "train.log"
    log.write_text("\n".join(edit(log.read_text().splitlines())) + "\n")
    rc, out = _check(run, *LEARN_ARGS)
    assert rc == 1
    assert [ln.split(":")[0] for ln in out.splitlines() if ln.startswith("MISSING")] == [f"MISSING {failed}"], out


def test_entropy_loss_is_required_only_when_the_recipe_trains_with_an_entropy_bonus(tmp_path):
    """verl computes actor/entropy_loss only for a non-zero entropy_coeff: a run without the bonus does
    not fail for its absence, one with the bonus does."""
    run = tmp_path / "run"
    shutil.copytree(LEARNED, run)
    log = run / "train.log"
    log.write_text(re.sub(r" - actor/entropy_loss:[^ ]+", "", log.read_text()))
    rc, out = _check(run, *LEARN_ARGS)
    assert rc == 1 and "MISSING finite actor/entropy_loss: actor/entropy_loss at 0/79 steps" in out
    cfg = run / "hydra" / ".hydra" / "config.yaml"
    cfg.write_text(cfg.read_text().replace("entropy_coeff: 0.01", "entropy_coeff: 0"))
    rc, out = _check(run, *LEARN_ARGS)
    assert rc == 0 and "entropy_loss" not in out, out
