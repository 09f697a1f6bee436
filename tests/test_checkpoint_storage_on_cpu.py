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


# --- where the run starts (issue 37, item 2: "the plan says from which step") -----------------------------
def _saved(folder, steps, tracker):
    """A checkpoint folder as verl's _save_checkpoint leaves it: global_step_N/ per save, then the tracker."""
    for n in steps:
        (folder / f"global_step_{n}" / "actor").mkdir(parents=True)
    (folder / "latest_checkpointed_iteration.txt").write_text(str(tracker))


def test_a_folder_without_a_checkpoint_starts_from_step_0(tmp_path):
    line = check_checkpoint_storage(_cfg(tmp_path / "ckpt"), "fsdp", 1000, Report())
    assert "resume_mode auto: starts from step 0 (no checkpoint in the folder yet)" in line


def test_the_plan_names_the_checkpoint_verl_will_resume_from(tmp_path):
    _saved(tmp_path, [5, 10], 10)
    report = Report()
    line = check_checkpoint_storage(_cfg(tmp_path), "fsdp", 1000, report)
    assert f"resume_mode auto: resumes from global_step_10 ({tmp_path / 'global_step_10'})" in line
    assert report.problems == []


@pytest.mark.parametrize("tracker", ["15", "garbage"])
def test_a_tracker_naming_no_checkpoint_is_refused_and_nothing_is_deleted(tmp_path, tracker):
    # verl's find_latest_ckpt_path returns None for a step with no folder (and raises on garbage):
    # _load_checkpoint would then print "Training from scratch" and overwrite the folder at its first save.
    _saved(tmp_path, [5, 10], tracker)
    report = Report()
    check_checkpoint_storage(_cfg(tmp_path), "fsdp", 1000, report)
    (err,) = report.errors
    assert err.key == KEY and f"names checkpoint '{tracker}'" in err.message
    assert ("train from step 0" if tracker.isdigit() else "not a step number") in err.message
    assert "resume_mode=disable" in err.fix
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "global_step_10",
        "global_step_5",
        "latest_checkpointed_iteration.txt",
    ]


def test_resume_mode_disable_and_resume_path_say_what_they_do(tmp_path):
    _saved(tmp_path, [5], 5)
    cfg = _cfg(tmp_path)
    cfg.trainer.resume_mode = "disable"
    assert "resume_mode disable: starts from step 0" in check_checkpoint_storage(cfg, "fsdp", 1000, Report())
    cfg.trainer.resume_mode = "resume_path"
    cfg.trainer.resume_from_path = str(tmp_path / "global_step_5")
    line = check_checkpoint_storage(cfg, "fsdp", 1000, Report())
    assert f"resume_mode resume_path: resumes from {tmp_path / 'global_step_5'}" in line
