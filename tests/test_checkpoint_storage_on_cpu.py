"""The preflight's checkpoint-folder check (issue 37, item 1): what one checkpoint costs, how many verl
keeps at once, and whether the folder can take them (npu_rl.preflight.checks.check_checkpoint_storage)."""

from __future__ import annotations

import shutil

import pytest
from omegaconf import OmegaConf

from npu_rl.preflight.checks import check_checkpoint_storage
from npu_rl.preflight.report import Report

KEY = "trainer.default_local_dir"


def _cfg(folder, save_freq=5, keep=2, steps=100, contents=("model", "optimizer", "extra")):
    return OmegaConf.create(
        {
            "trainer": {
                "save_freq": save_freq,
                "default_local_dir": str(folder),
                "max_actor_ckpt_to_keep": keep,
                "total_training_steps": steps,
            },
            "actor_rollout_ref": {"actor": {"checkpoint": {"save_contents": list(contents)}}},
        }
    )


def test_a_run_that_never_saves_has_no_line_and_no_finding(tmp_path):
    report = Report()
    assert check_checkpoint_storage(_cfg(tmp_path, save_freq=-1), "fsdp", 10**9, report) is None
    assert report.problems == []


@pytest.mark.parametrize(
    ("engine", "contents", "gib"),
    [
        ("fsdp", ("model", "optimizer", "extra"), "11.2"),  # 1e9 x (4 + 8) B = 11.18 GiB
        ("fsdp2", ("model",), "3.7"),  # 1e9 x 4 B
        ("megatron", ("model", "optimizer", "extra"), "13.0"),  # 1e9 x (2 + 12) B = 13.04 GiB
        ("mindspeed", ("model", "optimizer", "hf_model"), "14.9"),  # 1e9 x 16 B
    ],
)
def test_the_line_names_the_folder_the_cadence_the_size_and_the_free_space(tmp_path, engine, contents, gib):
    report = Report()
    line = check_checkpoint_storage(_cfg(tmp_path / "ckpt", contents=contents), engine, 10**9, report)
    assert f"every 5 step(s) to {tmp_path / 'ckpt'}" in line
    assert "keeping the last 2 (2 at once while saving)" in line
    assert f"~{gib} GiB each ({'+'.join(contents)}, {engine}; estimate)" in line
    assert f"GiB free at {tmp_path}" in line  # the folder does not exist yet: its parent's file system
    assert report.errors == []


def test_a_relative_folder_is_the_recipes_working_directory(tmp_path):
    line = check_checkpoint_storage(_cfg("checkpoints/p/e"), "fsdp", 1000, Report(), cwd=tmp_path)
    assert f"to {tmp_path / 'checkpoints/p/e'}," in line


def test_keeping_all_counts_the_saves_of_the_run(tmp_path):
    line = check_checkpoint_storage(_cfg(tmp_path, save_freq=10, keep=None, steps=95), "fsdp", 1000, Report())
    assert "keeping all (trainer.max_actor_ckpt_to_keep unset): 9 by the last step" in line


def test_a_folder_under_a_file_is_refused_before_any_step_runs(tmp_path):
    (tmp_path / "f").write_text("not a folder")
    report = Report()
    check_checkpoint_storage(_cfg(tmp_path / "f" / "ckpt"), "fsdp", 1000, report)
    (err,) = report.errors
    assert err.key == KEY and "is not a directory this user can write" in err.message
    assert "the first checkpoint (step 5) would fail" in err.message
    assert (tmp_path / "f").read_text() == "not a folder"  # nothing touched


def test_less_room_than_one_checkpoint_is_an_error_and_a_dry_run_only_warns(tmp_path):
    free = shutil.disk_usage(tmp_path).free
    params = int(free / 12 * 1.05)  # one fsdp checkpoint (12 B a parameter) 5 % over the free space
    report = Report()
    check_checkpoint_storage(_cfg(tmp_path), "fsdp", params, report)
    (err,) = report.errors
    assert err.key == KEY and "less than one checkpoint" in err.message and "the save at step 5" in err.message
    dry = Report()
    check_checkpoint_storage(_cfg(tmp_path), "fsdp", params, dry, dry_run=True)
    assert dry.errors == [] and len(dry.warnings) == 1
    assert "a dry run, maybe not on the head" in dry.warnings[0].message


def test_room_for_one_but_not_for_those_kept_at_once_is_a_warning(tmp_path):
    free = shutil.disk_usage(tmp_path).free
    params = int(free / 12 * 0.6)  # one checkpoint fits; the 3 kept at once do not
    report = Report()
    check_checkpoint_storage(_cfg(tmp_path, keep=3), "fsdp", params, report)
    assert report.errors == []
    (warn,) = report.warnings
    assert "less than the 3 checkpoints verl keeps at once" in warn.message
    assert "max_actor_ckpt_to_keep" in warn.fix
