"""The preflight composes verl's config once: the value overrides applied to check_overrides' own
composition (Hydra's ConfigLoaderImpl._apply_overrides_to_config) must give exactly what a second,
full Hydra compose gives, for group choices, plain values, '+' adds, '++' force-adds and '~' deletes."""

import pytest
from omegaconf import OmegaConf

from npu_rl.preflight.compose import check_overrides, compose_config, split_cli, verl_config_dir
from npu_rl.preflight.report import Report

CASES = [
    ["data.train_batch_size=16", "actor_rollout_ref.rollout.n=4", "trainer.total_epochs=2"],
    [
        "model_engine=megatron",
        "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4",
        "+actor_rollout_ref.rollout.engine_kwargs.vllm.enable_prefix_caching=true",
        "++trainer.val_before_train=false",
        "~trainer.logger",
    ],
    ["--config-name=ppo_megatron_trainer", "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.max_num_seqs=64"],
]


def _full(cli, overrides):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(cli.config_dir), version_base=None):
        return compose(cli.config_name, overrides=overrides)


@pytest.mark.parametrize("args", CASES, ids=["values", "groups-add-delete", "megatron-config"])
def test_composing_once_gives_what_a_full_compose_gives(args):
    cli = split_cli(args)
    report = Report()
    kept = check_overrides(cli, report)
    assert not report.errors, [p.render() for p in report.errors]
    assert cli.base is not None  # the one composition check_overrides made is reused
    once = compose_config(cli, kept)
    full = _full(cli, kept)
    assert OmegaConf.to_container(once, resolve=False) == OmegaConf.to_container(full, resolve=False)
    assert OmegaConf.is_struct(once) == OmegaConf.is_struct(full)


def test_a_value_override_hydra_rejects_is_rejected_the_same_way():
    cli = split_cli(["data.train_batch_size=16"])
    check_overrides(cli, Report())
    bad = ["data.train_batch_size=16", "data.no_such_key_here=1"]  # no '+': Hydra refuses
    with pytest.raises(Exception) as once:
        compose_config(cli, bad)
    with pytest.raises(Exception) as full:
        _full(cli, bad)
    assert type(once.value) is type(full.value) and "no_such_key_here" in str(once.value)


def test_config_dir_is_found_without_importing_verl():
    import subprocess
    import sys

    code = (
        "import sys; from npu_rl.preflight.compose import verl_config_dir; d = verl_config_dir(); "
        "assert (d / 'ppo_trainer.yaml').is_file(), d; assert 'verl' not in sys.modules; "
        "assert 'torch' not in sys.modules; print(d)"
    )
    out = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(verl_config_dir())
