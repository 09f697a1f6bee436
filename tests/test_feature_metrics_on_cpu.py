"""Every switched-on feature reports ``npu_rl/<slug>/active`` (issue 18, item 2): the metric module with
the real settings table, the real verl config composition and the real sampler built by the patched
``create_rl_sampler``; the patched trainers' call is checked in the patched verl source and, end to
end, by the CPU main job's evidence (npu_rl.e2e)."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from npu_rl import REPO_ROOT, feature_metrics, settings
from tests.test_sampler_on_cpu import SAMPLER_ON, _dataset, _verl_config, gsm8k_parquet  # noqa: F401

pytest.importorskip("verl")

R = "actor_rollout_ref.rollout"


def _select(*overrides: str):
    cfg = _verl_config(*overrides)
    return lambda key: OmegaConf.select(cfg, key)


def test_every_feature_of_the_settings_table_has_a_metric():
    assert {f.name for f in settings.FEATURES} == set(feature_metrics.SLUGS)
    names = [feature_metrics.metric(f.name) for f in settings.FEATURES]
    assert len(set(names)) == len(names) and all(n.startswith("npu_rl/") and n.endswith("/active") for n in names)


def test_nothing_switched_on_reports_nothing():
    assert feature_metrics.active_metrics(_select(), {}, env={}) == {}


def test_engine_side_switches_report_active_and_self_reported_ones_are_left_to_their_paths():
    env = {"NPU_RL_ENGINE_GC": "1", "NPU_RL_RANDOM_INIT": "1", "ALL_TO_ALL_RESHARD": "1",
           "VLLM_ROLLOUT_EARLY_STOP_ENABLE": "1"}  # fmt: skip
    select = _select(
        f"+{R}.engine_kwargs.vllm.speculative_config.method=sam", "actor_rollout_ref.actor.recompute_old_log_prob=false"
    )
    got = feature_metrics.active_metrics(select, {}, env=env)
    assert got == {
        "npu_rl/engine_gc/active": 1.0,
        "npu_rl/random_init/active": 1.0,
        "npu_rl/sam/active": 1.0,
        "npu_rl/skip_old_log_prob/active": 1.0,
    }  # the reshard and the guard put their own metrics through the weight sync and the rollout servers


def test_sams_own_step_metric_is_never_overwritten():
    # the V1 trainer logs npu_rl/sam/active from the responses' draft counts (verl patch 0012) before
    # this runs; a 0 there (counts lost) must stay 0, not be covered by "switched on and accepted"
    select = _select(f"+{R}.engine_kwargs.vllm.speculative_config.method=sam")
    assert feature_metrics.active_metrics(select, {"npu_rl/sam/active": 0.0}, env={}) == {}
    assert feature_metrics.active_metrics(select, {}, env={}) == {"npu_rl/sam/active": 1.0}  # other trainers


def test_rebalance_is_active_only_when_its_dispatcher_reported_the_step():
    env = {"ROLLOUT_REBALANCE_ENABLE": "1"}
    assert feature_metrics.active_metrics(_select(), {}, env=env) == {"npu_rl/rollout_rebalance/active": 0.0}
    step = {"rollout_rebalance/replica0/requests": 12.0, "timing_s/gen": 3.0}
    assert feature_metrics.active_metrics(_select(), step, env=env) == {"npu_rl/rollout_rebalance/active": 1.0}


def test_resampler_is_active_only_when_the_dataloader_samples_with_it(gsm8k_parquet, tok):  # noqa: F811
    from torch.utils.data import RandomSampler
    from verl.trainer.ppo.utils import create_rl_sampler

    cfg = _verl_config(*SAMPLER_ON, "data.train_batch_size=4")
    ours = create_rl_sampler(cfg.data, _dataset(gsm8k_parquet, tok))
    select = lambda key: OmegaConf.select(cfg, key)  # noqa: E731
    assert feature_metrics.active_metrics(select, {}, env={}, sampler=ours) == {"npu_rl/resampler/active": 1.0}
    plain = RandomSampler(range(4))
    assert feature_metrics.active_metrics(select, {}, env={}, sampler=plain) == {"npu_rl/resampler/active": 0.0}


def test_the_patched_trainers_call_it_after_their_step_metrics():
    v1 = (REPO_ROOT / "sources/verl/verl/trainer/ppo/v1/trainer_base.py").read_text()
    legacy = (REPO_ROOT / "sources/verl/verl/trainer/ppo/ray_trainer.py").read_text()
    for src in (v1, legacy):
        assert "from npu_rl.feature_metrics import trainer_metrics" in src
        call = src.index("trainer_metrics(self, metrics)")
        assert call < src.index("log(data=metrics, step=self.global_steps)", call)
