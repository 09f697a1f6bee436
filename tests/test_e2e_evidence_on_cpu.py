"""npu_rl.e2e: the evidence checker of the CPU main job, on logs in verl's real console format."""

from __future__ import annotations

from pathlib import Path

import pytest

from npu_rl import e2e

# One metrics line as verl's console logger prints it inside a Ray actor (colour codes, np wrappers).
REAL_LINE = (
    "\x1b[36m(TaskRunnerV1 pid=16548)\x1b[0m step:1 - actor/entropy:4.09375 - actor/pg_loss:0.0 - "
    "actor/loss:-0.041 - actor/grad_norm:0.0166 - actor/ppo_kl:0.0196 - rollout_corr/kl:1e-05 - "
    "critic/score/mean:0.0 - timing_s/update_weights:2.72 - training/num_turns/mean:np.float64(2.0) - "
    "training/num_turns/max:np.int64(2)"
)


def _step(n: int, **metrics: float) -> str:
    base = {
        "actor/pg_loss": 0.0,
        "actor/loss": -0.04,
        "actor/entropy": 4.0,
        "actor/grad_norm": 0.02,
        "actor/ppo_kl": 0.02,
        "rollout_corr/kl": 1e-5,
        "critic/score/mean": 0.0,
        "timing_s/update_weights": 2.5,
    }
    base.update({k.replace("__", "/"): v for k, v in metrics.items()})
    return f"(TaskRunnerV1 pid=1) step:{n} - " + " - ".join(f"{k}:{v}" for k, v in base.items())


def _run_dir(tmp_path: Path, lines: list[str], env: dict[str, str] | None = None) -> Path:
    (tmp_path / "train.log").write_text("\n".join(lines) + "\n")
    (tmp_path / "env.txt").write_text("".join(f"{k:<40}  {v}\n" for k, v in (env or {}).items()))
    return tmp_path


def test_parse_metrics_reads_verl_console_line():
    steps = e2e.parse_metrics([REAL_LINE])
    assert list(steps) == [1]
    m = steps[1]
    assert m["actor/entropy"] == 4.09375
    assert m["rollout_corr/kl"] == 1e-05
    assert m["training/num_turns/mean"] == 2.0  # np.float64(...) unwrapped
    assert m["training/num_turns/max"] == 2.0


def test_good_run_passes(tmp_path, capsys):
    run = _run_dir(tmp_path, [_step(i) for i in range(1, 5)])
    assert e2e.main(["check", str(run)]) == 0
    out = capsys.readouterr().out
    assert "MISSING" not in out
    assert out.strip().splitlines()[-1] == "9 passed, 0 failed"


def test_too_few_steps_fail(tmp_path, capsys):
    run = _run_dir(tmp_path, [_step(i) for i in range(1, 4)])
    assert e2e.main(["check", str(run), "--min-steps", "4"]) == 1
    assert "MISSING steps: 3 step(s) logged" in capsys.readouterr().out


def test_nan_loss_fails(tmp_path, capsys):
    run = _run_dir(tmp_path, [_step(1), _step(2, actor__loss=float("nan")), _step(3), _step(4)])
    assert e2e.main(["check", str(run)]) == 1
    assert "MISSING finite actor/loss" in capsys.readouterr().out


def test_stale_rollout_fails(tmp_path, capsys):
    # A rollout one update behind: its KL to the actor is that of one update (ppo_kl).
    lines = [_step(1), _step(2, rollout_corr__kl=0.015), _step(3), _step(4)]
    assert e2e.main(["check", str(_run_dir(tmp_path, lines))]) == 1
    assert "MISSING rollout matches actor" in capsys.readouterr().out


def test_policy_that_never_moves_cannot_prove_a_sync(tmp_path, capsys):
    lines = [_step(i, actor__ppo_kl=0.0) for i in range(1, 5)]
    assert e2e.main(["check", str(_run_dir(tmp_path, lines))]) == 1
    assert "MISSING policy moves between syncs" in capsys.readouterr().out


def test_switched_on_feature_without_trace_fails(tmp_path, capsys):
    env = {"NPU_RL_ENGINE_GC": "1", "NPU_RL_ROLLOUT_PROGRESS": "1"}
    lines = [_step(i) for i in range(1, 5)]
    lines.append("(TaskRunnerV1 pid=1) rollout train: 40/40 responses, 10/10 groups, 261 tok/s, longest 48 tok")
    assert e2e.main(["check", str(_run_dir(tmp_path, lines, env))]) == 1
    out = capsys.readouterr().out
    assert "ok      rollout progress: 1 progress line(s)" in out
    assert "MISSING engine GC: guard announced by 0 engine core(s)" in out


def test_required_feature_that_is_off_fails(tmp_path, capsys):
    run = _run_dir(tmp_path, [_step(i) for i in range(1, 5)])
    assert e2e.main(["check", str(run), "--require", "long-tail guard"]) == 1
    assert "MISSING long-tail guard: required, but not switched on" in capsys.readouterr().out


ACTIVE_RB = {"npu_rl/rollout_rebalance/active": 1.0}


def test_rebalance_needs_requests_on_two_targets_every_step(tmp_path, capsys):
    env = {"ROLLOUT_REBALANCE_ENABLE": "1"}
    both = [
        _step(i, rollout_rebalance__replica0__requests=20.0, rollout_rebalance__replica1__requests=20.0, **ACTIVE_RB)
        for i in range(1, 5)
    ]
    assert e2e.main(["check", str(_run_dir(tmp_path, both, env))]) == 0
    capsys.readouterr()
    dp = [
        _step(
            i,
            **{"rollout_rebalance/replica0#dp0/requests": 10.0, "rollout_rebalance/replica0#dp1/requests": 30.0},
            **ACTIVE_RB,
        )
        for i in range(1, 5)
    ]
    assert e2e.main(["check", str(_run_dir(tmp_path, dp, env))]) == 0  # DP-rank targets count as targets
    capsys.readouterr()
    one = list(both)
    one[2] = _step(3, rollout_rebalance__replica0__requests=40.0, rollout_rebalance__replica1__requests=0.0)
    assert e2e.main(["check", str(_run_dir(tmp_path, one, env))]) == 1
    assert "(40, 1)" in capsys.readouterr().out


def test_switched_on_feature_without_a_known_trace_fails(tmp_path, capsys):
    run = _run_dir(tmp_path, [_step(i) for i in range(1, 5)], {"NPU_RL_RANDOM_INIT": "1"})
    assert e2e.main(["check", str(run)]) == 1
    assert "MISSING NPU_RL_RANDOM_INIT: switched on, but this checker knows no trace of it" in capsys.readouterr().out


def test_unknown_required_check_is_a_usage_error(tmp_path, capsys):
    run = _run_dir(tmp_path, [_step(i) for i in range(1, 5)])
    assert e2e.main(["check", str(run), "--require", "long tail guard"]) == 2
    assert "no such check; known: skip old-log-prob, length-aware resampler" in capsys.readouterr().err


def test_missing_train_log_is_an_error(tmp_path, capsys):
    assert e2e.main(["check", str(tmp_path)]) == 1
    assert "did not reach its recipe" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["1", "true", "on"])
def test_env_txt_parsing(tmp_path, value):
    run = _run_dir(tmp_path, [_step(1)], {"NPU_RL_ENGINE_GC": value, "RAY_AUTH_TOKEN": "<set, hidden>"})
    env = e2e.parse_env(run / "env.txt")
    assert env["NPU_RL_ENGINE_GC"] == value
    assert env["RAY_AUTH_TOKEN"] == "<set, hidden>"


def test_skip_old_log_prob_run(tmp_path, capsys):
    # The shortcut's run: no old-log-prob pass, the rollout-vs-actor diff comes from the update pass.
    config_dump = "(TaskRunnerV1 pid=1)   'actor': {'recompute_old_log_prob': False,"
    lines = [config_dump]
    for i in range(1, 3):
        line = _step(
            i,
            actor__training__rollout_probs_diff_mean=1e-6,
            actor__training__rollout_probs_diff_max=2e-5,
            npu_rl__skip_old_log_prob__active=1.0,
        )
        lines.append(line.replace(" - rollout_corr/kl:1e-05", ""))
    run = _run_dir(tmp_path, lines)
    assert e2e.main(["check", str(run), "--min-steps", "2", "--require", "skip old-log-prob"]) == 0
    out = capsys.readouterr().out
    assert "ok      skip old-log-prob: steps without an old-log-prob pass (timing_s/old_log_prob < 0.5 s) 2/2" in out
    # verl times the skipped branch (4 ms in the real run): still a skip
    lines[1] += " - timing_s/old_log_prob:0.004"
    assert e2e.main(["check", str(_run_dir(tmp_path, lines)), "--min-steps", "2"]) == 0
    capsys.readouterr()
    # an old-log-prob pass at step 2 (12 s in the real run): the shortcut did not act
    lines[2] += " - timing_s/old_log_prob:12.0"
    assert e2e.main(["check", str(_run_dir(tmp_path, lines)), "--min-steps", "2"]) == 1
    assert "< 0.5 s) 1/2" in capsys.readouterr().out


def test_resampler_evidence_from_epoch_lines(tmp_path, capsys):
    import numpy as np

    from npu_rl.sampler import epoch_line
    from npu_rl.sampler.core import OrderParams

    params = OrderParams(batch_size=2, bucket_size=8, shuffle_batch_blocks=False)
    unknown = np.full(4, np.nan)
    learned = np.array([30.0, 3.0, 20.0, 5.0])
    dump = "(TaskRunnerV1 pid=1) 'sampler': {'class_name': 'LengthAwareEpochSampler',"
    epoch0 = epoch_line(0, np.array([0, 1, 2, 3]), unknown, 0, params)
    good = epoch_line(1, np.array([1, 3, 2, 0]), learned, 0, params)  # buckets [0, 0], [2, 3]
    bad = epoch_line(1, np.array([0, 1, 2, 3]), learned, 0, params)  # same order, buckets [3, 0], [2, 0]
    steps = [_step(i, sampler__table_coverage=1.0, npu_rl__resampler__active=1.0) for i in range(1, 5)]
    assert e2e.main(["check", str(_run_dir(tmp_path, [dump, epoch0, good, *steps]))]) == 0
    assert "ascending: True" in capsys.readouterr().out
    assert e2e.main(["check", str(_run_dir(tmp_path, [dump, epoch0, bad, *steps]))]) == 1
    assert "MISSING length-aware resampler: epoch 1 order differs from epoch 0: False" in capsys.readouterr().out
    # shuffled batches (the sampler's default): each batch narrower than the epoch, in any order
    shuffled = OrderParams(batch_size=2, bucket_size=8, shuffle_batch_blocks=True)
    narrow = epoch_line(1, np.array([2, 0, 1, 3]), learned, 0, shuffled)  # buckets [2, 3], [0, 0]
    assert e2e.main(["check", str(_run_dir(tmp_path, [dump, epoch0, narrow, *steps]))]) == 0
    assert "narrower than the epoch: True" in capsys.readouterr().out
    two = np.array([30.0, 3.0, 30.0, 3.0])
    wide = epoch_line(1, np.array([1, 0, 3, 2]), two, 0, shuffled)  # buckets [0, 3], [0, 3]: every batch spans all
    assert e2e.main(["check", str(_run_dir(tmp_path, [dump, epoch0, wide, *steps]))]) == 1
    assert "narrower than the epoch: False" in capsys.readouterr().out


def test_resampler_evidence_matches_the_sampler_at_bucket_edges(tmp_path, capsys):
    """The CI run of 2026-12-01 16:33: predictions just below a bucket edge (7.6, 15.7 with 8-token
    buckets) were printed rounded to nearest, so the checker put them one bucket up and called the
    sampler's own, correctly sorted order "not ascending". The order the sampler makes must pass."""
    import numpy as np

    from npu_rl.sampler import epoch_line
    from npu_rl.sampler.core import OrderParams, epoch_order

    params = OrderParams(batch_size=10, bucket_size=8, shuffle_batch_blocks=False)
    # epoch 1 of that run, as the table held it: 7 prompts in [0, 8), 3 at the 8 and 16 edges, ...
    predicted = np.array([5.2, 4.1, 4.4, 3.0, 6.3, 7.6, 2.2, 15.7, 14.0, 7.9, 13.1, 15.2, 10.4, 14.3, 13.0,
                          15.6, 21.0, 20.2, 27.4, 26.1])  # fmt: skip
    order, tail = epoch_order(predicted, params, seed=0, epoch=1)
    buckets = np.floor(predicted[order] / 8).reshape(2, 10)
    assert buckets[0].max() <= buckets[1].min()  # the sampler's order is ascending by bucket
    dump = "(TaskRunnerV1 pid=1) 'sampler': {'class_name': 'LengthAwareEpochSampler',"
    epoch0 = epoch_line(0, np.arange(20), np.full(20, np.nan), 0, params)
    epoch1 = epoch_line(1, order, predicted, tail, params)
    steps = [_step(i, sampler__table_coverage=1.0, npu_rl__resampler__active=1.0) for i in range(1, 5)]
    assert e2e.main(["check", str(_run_dir(tmp_path, [dump, epoch0, epoch1, *steps]))]) == 0
    assert "ascending: True" in capsys.readouterr().out


GUARD_ON = {"VLLM_ROLLOUT_EARLY_STOP_ENABLE": "1"}


def _guard_step(n: int, cuts: float, responses: float = 40.0) -> str:
    g = "npu_rl/long_tail_guard/"
    return _step(n, **{g + "active": 1.0, g + "cuts": cuts, g + "responses": responses, g + "cut_fraction": 0.1})


def test_long_tail_guard_metrics_are_the_evidence(tmp_path, capsys):
    run = _run_dir(
        tmp_path, [_guard_step(1, 4.0), _guard_step(2, 0.0), _guard_step(3, 2.0), _guard_step(4, 1.0)], GUARD_ON
    )
    assert e2e.main(["check", str(run), "--require", "long-tail guard"]) == 0
    assert "ok      long-tail guard: npu_rl/long_tail_guard/active at 4/4 steps" in capsys.readouterr().out


@pytest.mark.parametrize(
    "lines, why",
    [
        ([_guard_step(i, 0.0) for i in range(1, 5)], "no cut in the run"),
        ([_guard_step(1, 3.0), _guard_step(2, 0.0, responses=0.0), _guard_step(3, 1.0), _guard_step(4, 1.0)], "lost"),
        ([_guard_step(1, 3.0), _step(2), _guard_step(3, 1.0), _guard_step(4, 1.0)], "a step without the metrics"),
    ],
)
def test_long_tail_guard_metrics_that_show_no_work_fail(tmp_path, capsys, lines, why):
    assert e2e.main(["check", str(_run_dir(tmp_path, lines, GUARD_ON))]) == 1, why
    assert "MISSING long-tail guard: npu_rl/long_tail_guard/active" in capsys.readouterr().out


# verl's config dump, as the run's log prints it with SAM switched on
SAM_CONFIG = "(TaskRunnerV1 pid=1) {'engine_kwargs': {'vllm': {'speculative_config': {'method': 'sam'}}}}"


def _sam_step(n: int, drafted: float, accepted: float, responses: float = 64.0, active: float = 1.0) -> str:
    s = "npu_rl/sam/"
    acceptance = accepted / drafted if drafted else 0.0
    return _step(
        n, **{s + "active": active, s + "responses": responses, s + "drafted": drafted, s + "acceptance": acceptance}
    )


def test_sam_metrics_are_the_evidence(tmp_path, capsys):
    steps = [_sam_step(1, 0.0, 0.0), _sam_step(2, 40.0, 10.0), _sam_step(3, 50.0, 45.0), _sam_step(4, 20.0, 19.0)]
    assert e2e.main(["check", str(_run_dir(tmp_path, [SAM_CONFIG, *steps]))]) == 0
    out = capsys.readouterr().out
    assert "ok      SAM: npu_rl/sam/active at 4/4 steps; draft tokens per step [0, 40, 50, 20]" in out
    assert "acceptance per step [0, 0.25, 0.9, 0.95]" in out


@pytest.mark.parametrize(
    "lines, why",
    [
        ([SAM_CONFIG, *[_sam_step(i, 0.0, 0.0) for i in range(1, 5)]], "never drafted"),
        ([SAM_CONFIG, *[_sam_step(i, 9.0, 3.0) for i in range(1, 4)], _sam_step(4, 0.0, 0.0, 0.0, 0.0)], "lost"),
        ([SAM_CONFIG, *[_sam_step(i, 9.0, 3.0) for i in range(1, 4)], _step(4)], "a step without the metrics"),
        ([SAM_CONFIG, *[_step(i) for i in range(1, 5)]], "a run from before the metrics"),
    ],
)
def test_sam_without_drafts_or_counts_fails(tmp_path, capsys, lines, why):
    assert e2e.main(["check", str(_run_dir(tmp_path, lines))]) == 1, why
    assert "MISSING SAM: npu_rl/sam/active" in capsys.readouterr().out


def _rated_step(n: int, sent: float, rated: float | None) -> str:
    s = "npu_rl/sam/"
    extra = {s + "history_rewards_sent": sent} | ({} if rated is None else {s + "history_rated": rated})
    base = {s + "active": 1.0, s + "responses": 64.0, s + "drafted": 40.0, s + "acceptance": 0.5}
    return _step(n, **base, **extra)


@pytest.mark.parametrize(
    "steps, ok",
    [
        ([(1, 64, None), (2, 64, 64), (3, 64, 128), (4, 64, 192)], True),  # the store's count lags a step
        ([(1, 64, None), (2, 0, 64), (3, 64, 128), (4, 64, 192)], False),  # a step sent nothing (no actor)
        ([(1, 64, None), (2, 64, None), (3, 64, None), (4, 64, None)], False),  # the store never answered
        ([(1, 64, None), (2, 64, 0), (3, 64, 0), (4, 64, 0)], False),  # no rating found its response
    ],
)
def test_sam_history_rewards_must_reach_the_store_at_every_step(tmp_path, capsys, steps, ok):
    lines = [SAM_CONFIG, *(_rated_step(*s) for s in steps)]
    assert e2e.main(["check", str(_run_dir(tmp_path, lines))]) == (0 if ok else 1)
    out = capsys.readouterr().out
    assert ("ok      SAM history rewards: ratings sent per step" if ok else "MISSING SAM history rewards") in out


def test_long_tail_guard_without_metrics_falls_back_to_the_server_lines(tmp_path, capsys):
    lines = [_step(i) for i in range(1, 5)]
    assert e2e.main(["check", str(_run_dir(tmp_path, lines, GUARD_ON))]) == 1
    assert "MISSING long-tail guard: responses cut (server log lines" in capsys.readouterr().out
    lines.append(
        "(vLLMHttpServer pid=7) [npu-rl] long-tail guard, step 2: {'guard/cut_count': 3.0, 'guard/cut_fraction': 0.1}"
    )
    # the server lines still count as the guard's cuts, but a run whose trainer never logged
    # npu_rl/long_tail_guard/active (a verl without patch 0007's metrics) fails the active check
    assert e2e.main(["check", str(_run_dir(tmp_path, lines, GUARD_ON))]) == 1
    out = capsys.readouterr().out
    assert "ok      long-tail guard: responses cut (server log lines" in out
    assert "MISSING active metrics: npu_rl/<feature>/active = 1 at: long_tail_guard 0/4" in out


def test_every_switched_on_feature_must_say_it_is_active(tmp_path, capsys):
    env = {"NPU_RL_ROLLOUT_PROGRESS": "1", "NPU_RL_ENGINE_GC": "1"}
    progress = "(TaskRunnerV1 pid=1) rollout train: 40/40 responses"
    gc = "(EngineCore pid=3) [npu-rl] engine GC guard on (NPU_RL_ENGINE_GC=1): ..."
    both = {"npu_rl/rollout_progress/active": 1.0, "npu_rl/engine_gc/active": 1.0}
    lines = [progress, gc, *[_step(i, **both) for i in range(1, 5)]]
    assert e2e.main(["check", str(_run_dir(tmp_path, lines, env))]) == 0
    assert "ok      active metrics: npu_rl/<feature>/active = 1 at: engine_gc 4/4, rollout_progress 4/4" in (
        capsys.readouterr().out
    )
    # one step without the engine GC metric: the feature did not say it was active there
    lines[3] = _step(2, **{"npu_rl/rollout_progress/active": 1.0})
    assert e2e.main(["check", str(_run_dir(tmp_path, lines, env))]) == 1
    assert "MISSING active metrics: npu_rl/<feature>/active = 1 at: engine_gc 3/4" in capsys.readouterr().out
    # a feature that reports itself inactive fails even when not required
    lines[3] = _step(2, **both, **{"npu_rl/rollout_rebalance/active": 0.0})
    assert e2e.main(["check", str(_run_dir(tmp_path, lines, env))]) == 1
    assert "0 at: ['npu_rl/rollout_rebalance/active']" in capsys.readouterr().out


# --- learning runs (issue 34): the task starts at chance, validation ends solved, the gradient ran ---
VAL = "val-core/npu_rl/toy_find_digit/reward/mean@1"


def _learning_log(scores, val, adv=(-1.2, 2.5), pg=0.03, ppo_kl=0.02):
    lines = [f"(TaskRunnerV1 pid=1) step:0 - {VAL}:{val[0]}"]  # validation before training: no training step
    for i, s in enumerate(scores, 1):
        extra = {"critic__advantages__min": adv[0], "critic__advantages__max": adv[1], "actor__pg_loss": pg}
        extra["actor__ppo_kl"] = ppo_kl
        line = _step(i, critic__score__mean=s, **extra)
        if i % 10 == 0:
            line += f" - {VAL}:{val[i // 10]}"
        lines.append(line)
    return lines


def test_a_learning_run_passes_and_its_validation_step_is_not_a_training_step(tmp_path, capsys):
    scores = [0.11, 0.13, *[0.2 + 0.03 * i for i in range(28)]]
    run = _run_dir(tmp_path, _learning_log(scores, [0.12, 0.4, 0.8, 0.95]))
    ev = e2e.load(run)
    assert sorted(ev.steps) == list(range(1, 31)) and sorted(ev.val) == [0, 10, 20, 30]
    assert e2e.val_scores(ev) == [(0, 0.12), (10, 0.4), (20, 0.8), (30, 0.95)]
    assert e2e.main(["check", str(run), "--min-steps", "30", "--learned", "0.12"]) == 0, capsys.readouterr().out


@pytest.mark.parametrize(
    ("scores", "val", "adv", "pg", "failed"),
    [
        ([0.3, 0.3, 0.9], [0.1, 0.95], (-1, 1), 0.1, "starts near chance"),  # solved before it learned
        ([0.1, 0.1, 0.5], [0.1, 0.85], (-1, 1), 0.1, "validation solved"),  # not solved at the end
        ([0.1, 0.1, 0.9], [0.1], (-1, 1), 0.1, "validation solved"),  # no validation after training
        ([0.1, 0.1, 0.9], [0.1, 0.95], (0.0, 0.0), 0.1, "policy gradient ran"),  # advantages all 0
        ([0.1, 0.1, 0.9], [0.1, 0.95], (-1, 1), 0.0, "policy gradient ran"),  # a zero pg loss
    ],
)
def test_learning_evidence_fails_on_each_missing_piece(tmp_path, capsys, scores, val, adv, pg, failed):
    lines = _learning_log(scores, [val[0]], adv, pg)
    if len(val) > 1:
        lines[-1] += f" - {VAL}:{val[1]}"
    run = _run_dir(tmp_path, lines)
    assert e2e.main(["check", str(run), "--min-steps", "3", "--learned", "0.12"]) == 1
    out = capsys.readouterr().out
    assert [ln.split(":")[0] for ln in out.splitlines() if ln.startswith("MISSING")] == [f"MISSING {failed}"], out


@pytest.mark.parametrize(("pg", "grad", "ok"), [(-2.8e-9, 3.5, True), (-2.8e-9, 0.0, False)])
def test_an_on_policy_learning_runs_gradient_shows_in_its_grad_norm(tmp_path, capsys, pg, grad, ok):
    """On-policy (recompute_old_log_prob=false) the loss value is the zero-mean advantages' mean, ~1e-9 in
    the real run: the gradient is judged by actor/grad_norm there, not by a value that is 0 by construction."""
    log = _learning_log([0.11, 0.13, 0.5], [0.12, 0.95], pg=pg)
    lines = ["(TaskRunnerV1 pid=1)   'actor': {'recompute_old_log_prob': False,"]
    lines += [line.replace("actor/grad_norm:0.02", f"actor/grad_norm:{grad}") for line in log]
    e2e.main(["check", str(_run_dir(tmp_path, lines)), "--min-steps", "3", "--learned", "0.12"])
    out = capsys.readouterr().out
    assert ("ok      policy gradient ran" in out) == ok and "actor/grad_norm [" in out, out


def test_the_negative_control_must_stay_at_chance_with_a_still_policy(tmp_path, capsys):
    """lr 0: the rewards stay within 2 x chance, the policy never moves (actor/ppo_kl ~ 0) and the
    rollout still matches the actor; a control that learned, or whose policy moved, fails."""

    def control(name, scores, ppo_kl=0.0):
        (tmp_path / name).mkdir()
        run = _run_dir(tmp_path / name, _learning_log(scores, [0.11], ppo_kl=ppo_kl))
        rc = e2e.main(["check", str(run), "--min-steps", "3", "--at-chance", "0.12"])
        out = capsys.readouterr().out
        return rc, [ln.split(":")[0] for ln in out.splitlines() if ln.startswith("MISSING")], out

    rc, missing, out = control("flat", [0.12, 0.1, 0.14])
    assert (rc, missing) == (0, []), out
    assert "ok      policy still (control): actor/ppo_kl per step [0, 0, 0]" in out
    assert control("rises", [0.12, 0.1, 0.3])[:2] == (1, ["MISSING stays at chance"])
    assert control("moved", [0.12, 0.1, 0.14], ppo_kl=0.02)[:2] == (1, ["MISSING policy still (control)"])


def test_the_on_policy_control_shows_its_still_policy_by_its_entropy(tmp_path, capsys):
    """With recompute_old_log_prob=false the update's old log-prob is log_prob.detach(), so actor/ppo_kl
    is 0 whether the policy moves or not: the control's still policy shows in actor/entropy instead
    (the real lr-0 control: 2.9727-2.9760 over 6 steps; the learning run: 2.974 -> 2.866 in one update)."""

    def control(name, entropies):
        (tmp_path / name).mkdir()
        lines = ["(TaskRunnerV1 pid=1)   'actor': {'recompute_old_log_prob': False,"]
        for i, line in enumerate(_learning_log([0.12, 0.1, 0.14], [0.11], ppo_kl=0.0)):
            if i:
                line = line.replace(" - rollout_corr/kl:1e-05", "").replace(
                    "actor/entropy:4.0", f"actor/entropy:{entropies[i - 1]}"
                )
                line += " - actor/training/rollout_probs_diff_max:2e-05 - actor/training/rollout_probs_diff_mean:1e-06"
                line += " - npu_rl/skip_old_log_prob/active:1.0"
            lines.append(line)
        run = _run_dir(tmp_path / name, lines)
        rc = e2e.main(["check", str(run), "--min-steps", "3", "--at-chance", "0.12"])
        out = capsys.readouterr().out
        return rc, [ln.split(":")[0] for ln in out.splitlines() if ln.startswith("MISSING")], out

    rc, missing, out = control("still", [2.9739, 2.9749, 2.9727])
    assert (rc, missing) == (0, []), out
    assert "ok      policy still (control): actor/entropy per step [2.97, 2.97, 2.97]: all within 0.02" in out
    assert control("moved", [2.974, 2.866, 2.694])[:2] == (1, ["MISSING policy still (control)"])


# --- DAPO runs (issue 34): dynamic sampling and the overlong shaping must both leave their trace ---
ACC = "val-core/npu_rl/toy_find_digit/acc/mean@1"
OVERLONG_SHARE = "val-aux/npu_rl/toy_find_digit/overlong/mean@1"


def _dapo_log(val_before=0.0, overlong=(1.0, 0.0), evicted=(0.0, 3.0, 5.0)):
    """A DAPO learning run's console lines as verl's dapo reward manager and V1 replay buffer log them:
    the shaped training score starts below 0 (the overlong penalty), validation logs acc and the
    overlong share, the replay buffer the groups it dropped."""
    lines = [f"(TaskRunnerV1 pid=1) step:0 - {ACC}:{val_before} - {OVERLONG_SHARE}:{overlong[0]}"]
    for i, (score, drop) in enumerate(zip((-0.85, -0.4, 0.9), evicted, strict=True), 1):
        extra = {"critic__advantages__min": -1.0, "critic__advantages__max": 3.0, "actor__pg_loss": 0.08}
        line = _step(i, critic__score__mean=score, **extra)
        if drop:
            line += f" - training/filter_groups/evicted_samples:{drop}"
        lines.append(line)
    lines[-1] += f" - {ACC}:0.95 - {OVERLONG_SHARE}:{overlong[1]}"
    return lines


@pytest.mark.parametrize(
    ("kwargs", "failed"),
    [
        ({}, []),
        ({"overlong": (1.0, 1.0)}, ["overlong shaping acted"]),  # the responses never got shorter
        ({"overlong": (None, None)}, ["overlong shaping acted"]),  # not logged: nothing shows it acted
        ({"evicted": (0.0, 0.0, 0.0)}, ["dynamic sampling dropped groups"]),
        # the penalty pushes the training score below chance: the validation before training must not be solved
        ({"val_before": 0.9}, ["starts near chance"]),
    ],
    ids=["passes", "never-shorter", "not-logged", "nothing-dropped", "solved-before"],
)
def test_a_dapo_run_needs_dropped_groups_shorter_responses_and_an_unsolved_start(tmp_path, capsys, kwargs, failed):
    lines = _dapo_log(**kwargs)
    if kwargs.get("overlong") == (None, None):
        lines = [ln.replace(f" - {OVERLONG_SHARE}:None", "") for ln in lines]
    run = _run_dir(tmp_path, lines)
    rc = e2e.main(["check", str(run), "--min-steps", "3", "--learned", "0.1", "--dapo"])
    out = capsys.readouterr().out
    assert [ln.split(":")[0].removeprefix("MISSING ") for ln in out.splitlines() if ln.startswith("MISSING")] == failed
    assert rc == (1 if failed else 0), out
