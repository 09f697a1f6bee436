"""verl patch 0011 (replay-buffer-poll): ``trainer.v1.sampler.poll_interval`` reaches the V1 trainer's
built-in replay buffer, through verl's own ``PPOTrainer._build_replay_buffer`` (the trainer object is a
namespace with only what that method reads; the buffer is verl's)."""

import inspect
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

trainer_base = pytest.importorskip(
    "verl.trainer.ppo.v1.trainer_base", reason="needs the patched verl (install_stack.sh)"
)
replay_buffer = pytest.importorskip(
    "verl.trainer.ppo.v1.replay_buffer", reason="needs the patched verl (install_stack.sh)"
)


def _build(mode: str = "sync", **sampler):
    cfg = OmegaConf.create(
        {
            "trainer": {
                "v1": {
                    "sampler": {
                        "max_off_policy_threshold": 8,
                        "max_off_policy_strategy": "drop",
                        "sync_refill_failed_groups": False,
                        "custom_sampler": {"path": None, "name": None},
                        "sampler_kwargs": {},
                        **sampler,
                    }
                }
            },
            "algorithm": {},
            "data": {"train_batch_size": 32},
        }
    )
    trainer = SimpleNamespace(config=cfg, trainer_mode=mode, _add_prompts_to_generate=lambda n: None)
    trainer._resolve_filter_groups_metric = lambda: trainer_base.PPOTrainer._resolve_filter_groups_metric(trainer)
    return trainer_base.PPOTrainer._build_replay_buffer(trainer)


@pytest.mark.parametrize("mode", ["sync", "separate_async"])
def test_the_setting_reaches_the_built_in_buffer(mode):
    buf = _build(mode, poll_interval=0.25)
    assert isinstance(buf, replay_buffer.ReplayBuffer)
    assert buf.poll_interval == 0.25


def test_unset_keeps_verls_own_default():
    default = inspect.signature(replay_buffer.ReplayBuffer.__init__).parameters["poll_interval"].default
    assert default == 2.0  # the upstream value the patch header cites
    assert _build().poll_interval == default


@pytest.mark.parametrize("bad", [0, -1])
def test_a_non_positive_interval_is_refused_by_name(bad):
    with pytest.raises(ValueError, match=r"trainer\.v1\.sampler\.poll_interval must be > 0 seconds, got"):
        _build(poll_interval=bad)


# The preflight's rule for the key (npu_rl.preflight.checks.check_poll_interval), on a whole recipe.
KEY = "trainer.v1.sampler.poll_interval"


@pytest.mark.parametrize(("value", "ok"), [("0.2", True), ("3", True), ("0", False), ("-1", False), ("soon", False)])
def test_the_preflight_judges_the_value_before_ray_starts(value, ok):
    from tests.test_preflight_on_cpu import check

    result = check(f"+{KEY}={value}")
    problems = {p.key: p for p in [*result.report.errors, *result.report.warnings]}
    if ok:
        assert KEY not in problems, result.render()  # neither "nothing checks it" nor an error
    else:
        assert KEY in {p.key for p in result.report.errors}, result.render()
        assert "above 0" in problems[KEY].message and value in problems[KEY].message


def test_the_preflight_warns_that_a_separate_pool_trainer_never_reads_it():
    from npu_rl.preflight.checks import check_poll_interval
    from npu_rl.preflight.report import Report

    report, cfg = Report(), OmegaConf.create({"trainer": {"v1": {"sampler": {"poll_interval": 0.2}}}})
    check_poll_interval(cfg, report, "fully_async")
    assert [p.key for p in report.warnings] == [KEY] and not report.errors
    assert "never" in report.warnings[0].message
