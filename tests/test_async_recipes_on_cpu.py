"""The trainer choice of the recipe contract (``run_verl --trainer``), against the pinned verl's entry points.

Part 1: ``run_verl`` runs verl's module for the chosen trainer (the command line it builds, with
``NPU_RL_TRAIN_PYTHON`` set to a program that prints it), refuses a wrong choice, and the entry points
and Hydra configs it names exist in the pinned tree and compose from any working directory.
"""

from __future__ import annotations

import ast
import os
import re
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


# --- Part 2: the preflight of the separate-pool trainers --------------------------------------------------
# The composed configs come from the pinned verl's own Hydra files (no stand-ins); the rule functions of
# npu_rl.preflight.async_checks run on copies of them, and a few cases go through run_preflight end to end.

ENV_2X16 = {"NNODES": "2", "NPUS_PER_NODE": "16", "NPU_RL_DRY_RUN": "1"}
A = "actor_rollout_ref.actor"
R = "actor_rollout_ref.rollout"

# A valid fully-async Qwen3-32B command line on 2 x 16 dies (the shipped recipe, minus the fast path).
FULLY_ASYNC = [
    SEARCHPATH,
    "--config-name=fully_async_ppo_megatron_trainer",
    "actor_rollout_ref.model.path=/nonexistent/Qwen3-32B",
    "data.train_batch_size=0",
    "data.max_prompt_length=2048",
    "data.max_response_length=8192",
    "algorithm.adv_estimator=grpo",
    f"{A}.megatron.tensor_model_parallel_size=8",
    f"{A}.megatron.pipeline_model_parallel_size=2",
    f"{A}.ppo_mini_batch_size=16",
    f"{A}.ppo_micro_batch_size_per_gpu=1",
    f"{R}.log_prob_micro_batch_size_per_gpu=1",
    "actor_rollout_ref.hybrid_engine=False",
    f"{R}.name=vllm",
    f"{R}.n=8",
    f"{R}.tensor_model_parallel_size=4",
    f"{R}.gpu_memory_utilization=0.8",
    f"{R}.max_model_len=10240",
    f"{R}.checkpoint_engine.backend=nccl",
    "trainer.nnodes=1",
    "trainer.n_gpus_per_node=16",
    "rollout.nnodes=1",
    "rollout.n_gpus_per_node=16",
    "rollout.total_rollout_steps=6400",
    "async_training.staleness_threshold=0.5",
    "async_training.trigger_parameter_sync_step=4",
    "async_training.partial_rollout=True",
]


def _compose(args: list[str], trainer: str = "fully_async"):
    from npu_rl.preflight import async_checks
    from npu_rl.preflight.compose import check_overrides, compose_config, split_cli
    from npu_rl.preflight.report import Report

    cli = split_cli(args, trainer)
    report = Report()
    cfg = compose_config(cli, check_overrides(cli, report))
    assert not report.errors, [p.render() for p in report.errors]
    async_checks.mirror_entry_point(cfg)
    return cfg


@pytest.fixture(scope="module")
def fully_async_cfg():
    return _compose(FULLY_ASYNC)


def _with(cfg, **values):
    """A copy of ``cfg`` with dotted keys (``__`` for ``.``) set."""
    from omegaconf import OmegaConf, open_dict

    out = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
    with open_dict(out):
        for k, v in values.items():
            OmegaConf.update(out, k.replace("__", "."), v, force_add=True)
    return out


def _report():
    from npu_rl.preflight.report import Report

    return Report()


def _errors(report):
    return {p.key: p for p in report.errors}


def test_the_composed_fully_async_config_passes_verls_asserts(fully_async_cfg):
    from npu_rl.preflight.async_checks import check_verl_asserts

    r = _report()
    assert check_verl_asserts(fully_async_cfg, verl_package_dir(), "fully_async", r) >= 6
    assert not r.errors, [p.render() for p in r.errors]


@pytest.mark.parametrize(
    ("key", "value", "line"),
    [
        ("data.train_batch_size", 64, "fully_async_rollouter.py:351"),
        ("data.gen_batch_size", 2, "fully_async_rollouter.py:352"),
        ("actor_rollout_ref.hybrid_engine", True, "fully_async_rollouter.py:350"),
        ("async_training.staleness_threshold", -0.5, "fully_async_rollouter.py:353"),
        ("async_training.trigger_parameter_sync_step", 0, "fully_async_rollouter.py:354"),
        (f"{R}.calculate_log_probs", False, "fully_async_rollouter.py:733"),
    ],
)
def test_verls_own_fully_async_rules_are_read_from_its_source(fully_async_cfg, key, value, line):
    from npu_rl.preflight.async_checks import check_verl_asserts

    r = _report()
    check_verl_asserts(_with(fully_async_cfg, **{key.replace(".", "__"): value}), verl_package_dir(), "fully_async", r)
    err = _errors(r)[key]
    assert line in err.message and err.fix, err.render()


def test_one_step_off_rules_are_verls_too():
    from npu_rl.preflight.async_checks import check_verl_asserts

    args = [
        a for a in FULLY_ASYNC if not a.startswith(("--config-name", "async_training", "rollout.total", "data.train"))
    ]
    cfg = _compose(
        [*args, "--config-name=one_step_off_ppo_megatron_trainer", "data.train_batch_size=64"], "one_step_off"
    )
    r = _report()
    assert check_verl_asserts(cfg, verl_package_dir(), "one_step_off", r) >= 1 and not r.errors
    check_verl_asserts(_with(cfg, actor_rollout_ref__hybrid_engine=True), verl_package_dir(), "one_step_off", r)
    assert "one_step_off_policy/ray_trainer.py:88" in _errors(r)["actor_rollout_ref.hybrid_engine"].message


@pytest.mark.parametrize(
    ("values", "key", "says"),
    [
        (
            {"trainer__nnodes": 2},
            "trainer.nnodes, rollout.nnodes",
            "= 48, the launcher has NNODES=2 x NPUS_PER_NODE=16",
        ),
        ({"rollout__n_gpus_per_node": 8}, "trainer.nnodes, rollout.nnodes", "(dies left idle)"),
        (
            {"trainer__n_gpus_per_node": 12, "rollout__n_gpus_per_node": 10, "rollout__nnodes": 2},
            "trainer.n_gpus_per_node, rollout.n_gpus_per_node",
            "do not fit on 2 nodes of 16 dies",
        ),
        ({"rollout__nnodes": 0}, "rollout.nnodes", "no dies"),
    ],
    ids=["too-many", "idle-dies", "does-not-pack", "no-rollout-pool"],
)
def test_pools_that_do_not_tile_the_cluster_are_refused(fully_async_cfg, values, key, says):
    from npu_rl.preflight.async_checks import check_pools

    r = _report()
    check_pools(_with(fully_async_cfg, **values), ENV_2X16, r)
    err = _errors(r)[key]
    assert says in err.message and err.fix, err.render()


def test_a_good_split_tiles_and_returns_both_pools(fully_async_cfg):
    from npu_rl.preflight.async_checks import check_pools

    r = _report()
    p = check_pools(fully_async_cfg, ENV_2X16, r)
    assert not r.errors and (p.trainer_dies, p.rollout_dies) == (16, 16)
    one_node = _with(fully_async_cfg, trainer__n_gpus_per_node=8, rollout__n_gpus_per_node=8)
    p = check_pools(one_node, {"NNODES": "1", "NPUS_PER_NODE": "16"}, r)  # 8 + 8 on one node, as verl's 4_4 scripts
    assert not r.errors and p.total == 16


@pytest.mark.parametrize(
    ("values", "key", "says", "fix"),
    [
        (
            {"async_training__staleness_threshold": 0.01},
            "async_training.staleness_threshold",
            "int(16 x (1 + 0.01) x 4) = 64 = the 64 prompts of one weight version",
            "at least 0.0156",
        ),
        (
            {"rollout__total_rollout_steps": 32},
            "rollout.total_rollout_steps",
            "fewer than one weight version (16 x 4 = 64)",
            "a multiple of 64",
        ),
        ({"async_training__require_batches": 0}, "async_training.require_batches", "= 0", "positive integer"),
    ],
    ids=["staleness-rounds-to-nothing", "no-trainer-step", "require-batches-0"],
)
def test_staleness_and_steps_the_batch_sizes_cannot_meet_are_refused(fully_async_cfg, values, key, says, fix):
    from npu_rl.preflight.async_checks import check_queue

    r = _report()
    check_queue(_with(fully_async_cfg, **values), r, rollout_replicas=4)
    err = _errors(r)[key]
    assert says in err.message and fix in err.fix, err.render()


def test_the_queue_plan_is_verls_arithmetic(fully_async_cfg):
    from npu_rl.preflight.async_checks import check_queue

    r = _report()
    rows = dict(check_queue(fully_async_cfg, r, rollout_replicas=4))
    assert not r.errors
    # required 16 x 1; per version 16 x 4 = 64; max_required = int(16 x 1.5 x 4) = 96
    assert "= 16 prompts (128 trajectories); weights sync every 4 step(s) = 64 prompts" in rows["async queue"]
    assert "lets 32 more be generated per version (max_required_samples 96)" in rows["async queue"]
    assert rows["rollouter"] == "4 replica(s) x concurrent_samples_per_replica 16 = 64 prompts at once, capped at 96"


@pytest.mark.parametrize(
    ("backend", "refused", "fix"),
    [("nccl", None, None), ("hccl", "no checkpoint engine registers the name 'hccl'", "=nccl"),
     ("naive", "separate pools have none", "=nccl"), ("nixl", "needs cupy", "=nccl"),
     ("gloo_typo", "is not a checkpoint engine of this verl", "=nccl")],
)  # fmt: skip
def test_the_weight_sync_backend_must_exist_on_npu(fully_async_cfg, backend, refused, fix):
    from npu_rl.preflight.async_checks import check_checkpoint_engine

    r = _report()
    check_checkpoint_engine(
        _with(fully_async_cfg, **{f"{R}.checkpoint_engine.backend".replace(".", "__"): backend}), {}, r
    )
    key = f"{R}.checkpoint_engine.backend"
    if refused is None:
        assert not r.errors
    else:
        assert refused in _errors(r)[key].message and fix in _errors(r)[key].fix


def test_the_backend_table_matches_the_pinned_registry():
    """Every name in BACKENDS is registered by a module of verl/checkpoint_engine, and no other name is."""
    from npu_rl.preflight.async_checks import BACKENDS

    registered = set()
    for path in (verl_package_dir() / "checkpoint_engine").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("CheckpointEngineRegistry.register"):
                registered.add(ast.literal_eval(node.args[0]))
    assert registered == set(BACKENDS)


def test_partial_rollout_needs_a_rollout_that_pauses_and_resumes(fully_async_cfg):
    from npu_rl.preflight.async_checks import SERVERS, check_partial_rollout, resumable

    for name in SERVERS:  # every backend of the pinned verl has both methods on its server class
        ok, why = resumable(verl_package_dir(), name)
        assert ok, why
    r = _report()
    assert "resume with their tokens so far" in check_partial_rollout(fully_async_cfg, verl_package_dir(), r)
    check_partial_rollout(_with(fully_async_cfg, **{f"{R}.name".replace(".", "__"): "hf"}), verl_package_dir(), r)
    err = _errors(r)["async_training.partial_rollout"]
    assert "rollout backend 'hf' has no server class" in err.message and "partial_rollout=False" in err.fix
    off = _report()
    assert "cut short" in check_partial_rollout(_with(fully_async_cfg, async_training__partial_rollout=False),
                                                verl_package_dir(), off)  # fmt: skip
    assert "llm_server.py:339-343" in off.warnings[0].message and not off.errors


def _feature(name):
    from npu_rl.features import FEATURES

    return next(f for f in FEATURES if f.name == name)


@pytest.mark.parametrize(
    ("feature", "trainer", "partial", "severity", "says"),
    [
        ("skip old-log-prob recompute", "fully_async", True, "error", "older weights"),
        ("skip old-log-prob recompute", "one_step_off", False, "error", "older weights"),
        ("length-aware resampler", "fully_async", True, "error", "fully_async_trainer.py:498"),
        ("length-aware resampler", "one_step_off", False, "error", "one_step_off_policy/ray_trainer.py:265"),
        ("all-to-all-v MoE reshard", "fully_async", True, "error", "would never run"),
        ("long-tail guard", "fully_async", True, "error", "only cut samples"),
        ("long-tail guard", "fully_async", False, "warning", "v1/trainer_base.py:1943"),
        ("rollout rebalance", "fully_async", True, "warning", "llm_server.py:388"),
        ("rollout progress", "one_step_off", False, "warning", "v1/replay_buffer.py:237"),
    ],
)
def test_our_features_under_the_separate_pool_trainers(fully_async_cfg, feature, trainer, partial, severity, says):
    from npu_rl.preflight.async_checks import check_features

    cfg = _with(fully_async_cfg, async_training__partial_rollout=partial)
    r = _report()
    check_features(cfg, trainer, [_feature(feature)], r)
    found = r.errors if severity == "error" else r.warnings
    assert len(found) == 1 and says in found[0].message and found[0].fix, [p.render() for p in found]
    assert not (r.warnings if severity == "error" else r.errors)


def test_sam_under_partial_rollout_passes_without_a_finding(fully_async_cfg):
    # A request resumed after a weight sync rejoins its group by prompt prefix
    # (tests/test_spec_decode_history_on_cpu.py::test_a_request_resumed_as_prompt_plus_output_rejoins_its_group).
    from npu_rl.preflight.async_checks import check_features

    r = _report()
    cfg = _with(fully_async_cfg, async_training__partial_rollout=True)
    check_features(cfg, "fully_async", [_feature("SAM speculative decoding")], r)
    assert not r.errors and not r.warnings, [p.render() for p in r.errors + r.warnings]


def test_rebalance_with_dynamic_resource_scheduling_is_refused(fully_async_cfg):
    from npu_rl.preflight.async_checks import check_features

    r = _report()
    cfg = _with(fully_async_cfg, async_training__use_dynamic_resource_scheduling=True)
    check_features(cfg, "fully_async", [_feature("rollout rebalance")], r)
    assert "ROLLOUT_REBALANCE_ENABLE" in _errors(r)


def test_a_wrong_split_and_a_forbidden_feature_end_to_end():
    """run_preflight with the trainer: every finding at once, with key and fix."""
    from npu_rl.preflight import run_preflight

    args = [*FULLY_ASYNC, "trainer.nnodes=2", f"{A}.recompute_old_log_prob=false"]
    r = run_preflight(args, ENV_2X16, "fully_async")
    errs = _errors(r.report)
    assert "the pools do not tile the cluster" in errs["trainer.nnodes, rollout.nnodes"].message
    assert "older weights" in errs[f"{A}.recompute_old_log_prob"].message


SHIPPED = [
    ("recipes/qwen3-32b/grpo_32die_fully_async.sh", "recipes/qwen3-32b/env_2node_async.sh", "16", "16"),
    ("recipes/qwen3-235b-a22b/grpo_128die_fully_async.sh", "recipes/qwen3-235b-a22b/env_8node_async.sh", "64", "64"),
    ("recipes/qwen3-32b/grpo_32die_one_step_off.sh", "recipes/qwen3-32b/env_2node_async.sh", "16", "16"),
]


@pytest.mark.parametrize(("recipe", "env", "train", "rollout"), SHIPPED, ids=[Path(s[0]).stem for s in SHIPPED])
def test_the_async_recipes_pass_their_dry_runs_with_both_pools(recipe, env, train, rollout):
    from tests.dryrun import plan

    rc, out, facts = plan(REPO_ROOT / recipe, REPO_ROOT / env)
    assert rc == 0, out[-4000:]
    # the model and data files absent here, nothing else (and, where this file system lacks room for the
    # recipe's checkpoints, trainer.default_local_dir: a dry run only warns about the head's storage)
    keys = [ln.split(":", 2)[1].strip() for ln in out.splitlines() if ln.startswith("warning: ")]
    assert sorted(k for k in keys if k != "trainer.default_local_dir") == [
        "actor_rollout_ref.model.path", "data.train_files", "data.val_files"
    ], out[-3000:]  # fmt: skip
    assert re.search(r"preflight: ok \(0 errors, [34] warnings\)", out), out[-3000:]
    cluster = next(line for line in out.splitlines() if line.startswith("cluster "))
    assert f"= {train} + rollout pool" in cluster and cluster.endswith(f"= {rollout}"), cluster
    assert "weight sync      nccl" in out or "weight sync     nccl" in out
    assert (
        facts["trainer"] in ("fully_async", "one_step_off") and facts["pools"] == f"{train} train + {rollout} rollout"
    )


def test_config_groups_of_verls_base_config_work_with_the_experimental_configs():
    """model_engine=megatron on fully_async_ppo_trainer: a group found on the searchpath, not in the
    entry point's own config folder, is composed as Hydra would (not reported as an unknown key)."""
    cfg = _compose([SEARCHPATH, "model_engine=megatron", "actor_rollout_ref.model.path=/x"])
    assert cfg.actor_rollout_ref.actor.strategy == "megatron" and cfg.async_training.partial_rollout is True
