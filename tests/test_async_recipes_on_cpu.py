"""The trainer choice of the recipe contract (``run_verl --trainer``), against the pinned verl's entry points.

Part 1: ``run_verl`` runs verl's module for the chosen trainer (the command line it builds, with
``NPU_RL_TRAIN_PYTHON`` set to a program that prints it), refuses a wrong choice, and the entry points
and Hydra configs it names exist in the pinned tree and compose from any working directory.
"""

from __future__ import annotations

import ast
import os
import subprocess
from pathlib import Path

import pytest

from npu_rl import REPO_ROOT
from npu_rl.preflight.async_trainers import SEARCHPATH, TRAINERS
from npu_rl.preflight.compose import verl_package_dir

pytest.importorskip("verl")

VERL_SH = REPO_ROOT / "internal" / "verl.sh"


def _run_verl(tmp_path: Path, args: str, **env: str) -> subprocess.CompletedProcess:
    """``run_verl ARGS`` in a bash that sourced internal/verl.sh, with a "python" that prints its argv."""
    printer = tmp_path / "print_argv"
    printer.write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@"\n')
    printer.chmod(0o755)
    full = {k: v for k, v in os.environ.items() if not k.startswith("NPU_RL_")}
    full.update(NPU_RL_TRAIN_PYTHON=str(printer), **env)
    script = f'set -euo pipefail\nsource "{VERL_SH}"\nrun_verl {args}\n'
    return subprocess.run(["bash", "-c", script], env=full, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize(
    ("choice", "module"),
    [
        ("", "verl.trainer.main_ppo"),
        ("--trainer sync", "verl.trainer.main_ppo"),
        ("--trainer fully_async", "verl.experimental.fully_async_policy.fully_async_main"),
        ("--trainer=one_step_off", "verl.experimental.one_step_off_policy.main_ppo"),
    ],
)
def test_run_verl_runs_the_entry_point_of_the_chosen_trainer(tmp_path, choice, module):
    r = _run_verl(tmp_path, f"{choice} a.b=1 c=2", NPU_RL_RUN_DIR=str(tmp_path / "run"))
    assert r.returncode == 0, r.stderr
    argv = r.stdout.splitlines()
    assert argv[:3] == ["-P", "-m", module]
    assert argv[3] == f"hydra.run.dir={tmp_path / 'run'}/hydra"
    searchpath = [SEARCHPATH] if module != "verl.trainer.main_ppo" else []
    assert argv[4:] == [*searchpath, "a.b=1", "c=2"]


def test_run_verl_in_plan_mode_passes_the_trainer_to_the_preflight(tmp_path):
    r = _run_verl(tmp_path, "--trainer fully_async x=1", NPU_RL_MODE="plan", NPU_RL_RECIPE="r.sh")
    assert r.returncode == 0, r.stderr
    argv = r.stdout.splitlines()
    assert argv == ["-P", "-m", "npu_rl.preflight", "check", "--trainer", "fully_async", "--recipe", "r.sh", "--"] + [
        SEARCHPATH,
        "x=1",
    ]
    sync = _run_verl(tmp_path, "x=1", NPU_RL_MODE="plan", NPU_RL_RECIPE="r.sh").stdout.splitlines()
    assert sync[4:] == ["--trainer", "sync", "--recipe", "r.sh", "--", "x=1"]


@pytest.mark.parametrize("args", ["--trainer async x=1", "--trainer", "--trainer= x=1"])
def test_an_unknown_trainer_is_refused_naming_the_choices(tmp_path, args):
    r = _run_verl(tmp_path, args)
    assert r.returncode == 2 and r.stdout == ""
    assert "no such trainer; choose one of: sync, fully_async, one_step_off" in r.stderr, r.stderr


def test_the_trainer_option_must_come_first(tmp_path):
    r = _run_verl(tmp_path, "x=1 --trainer fully_async")
    assert r.returncode == 2 and r.stdout == ""
    assert "--trainer must be the first argument, before the overrides" in r.stderr, r.stderr


def test_the_preflight_cli_refuses_an_unknown_trainer():
    r = subprocess.run(
        [".venv/bin/python", "-m", "npu_rl.preflight", "check", "--trainer", "async", "--", "x=1"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 2 and "invalid choice: 'async'" in r.stderr, r.stderr


@pytest.mark.parametrize("name", sorted(TRAINERS))
def test_each_entry_point_is_the_hydra_app_the_table_names(name):
    """The module exists in the pinned verl and its ``@hydra.main`` uses config_path="config" and the
    default config name of :data:`TRAINERS`; the Megatron config sits next to it."""
    t = TRAINERS[name]
    path = verl_package_dir().parent / (t.module.replace(".", "/") + ".py")
    tree = ast.parse(path.read_text())
    hydra_main = [
        d
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef)
        for d in node.decorator_list
        if isinstance(d, ast.Call) and ast.unparse(d.func) == "hydra.main"
    ]
    assert len(hydra_main) == 1, path
    kw = {k.arg: ast.literal_eval(k.value) for k in hydra_main[0].keywords}
    assert kw["config_path"] == "config" and kw["config_name"] == t.config_name
    assert (t.config_dir(verl_package_dir()) / f"{t.megatron_config}.yaml").is_file()


@pytest.mark.parametrize(
    ("name", "megatron"),
    [("fully_async", False), ("fully_async", True), ("one_step_off", False), ("one_step_off", True)],
)
def test_the_experimental_configs_compose_anywhere_only_with_the_searchpath(tmp_path, name, megatron):
    """verl's experimental yamls (all but fully_async_ppo_trainer) search file://verl/trainer/config,
    relative to the working directory: outside verl's checkout they compose only with run_verl's
    hydra.searchpath override. Composed with Hydra in a fresh process started in an empty folder."""
    t = TRAINERS[name]
    config = t.megatron_config if megatron else t.config_name
    code = (
        "import sys\nfrom hydra import compose, initialize_config_dir\n"
        f"with initialize_config_dir(config_dir={str(t.config_dir(verl_package_dir()))!r}, version_base=None):\n"
        f"    cfg = compose({config!r}, overrides=sys.argv[1:])\n"
        "print(cfg.actor_rollout_ref.actor.strategy, cfg.rollout.n_gpus_per_node)\n"
    )
    py = str(REPO_ROOT / ".venv" / "bin" / "python")
    plain = subprocess.run([py, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False)
    fixed = subprocess.run(
        [py, "-c", code, SEARCHPATH], cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False
    )
    assert fixed.returncode == 0, fixed.stderr
    assert fixed.stdout.split() == ["megatron" if megatron else "fsdp", "8"]
    if (name, megatron) == ("fully_async", False):
        assert plain.returncode == 0  # its yaml says pkg://verl.trainer.config itself
    else:
        assert plain.returncode != 0 and "file://verl/trainer/config" in plain.stderr
