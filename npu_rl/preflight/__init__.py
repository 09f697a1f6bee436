"""Reject a bad recipe before the cluster starts.

:func:`run_preflight` composes a recipe's overrides with the pinned verl's Hydra config, runs verl's
``validate_config``, lets verl, vLLM and vllm-ascend validate the rollout they would build
(:mod:`npu_rl.preflight.libraries`), adds this project's checks (keys, batch arithmetic, layout vs model,
lengths, resources, memory, feature switches), collects every problem, and returns them with a compact plan.
Recipes reach it through ``run_verl`` in plan mode (``ray_start_npu.sh --dry-run``, and the head
before it starts Ray); ``python -m npu_rl.preflight RECIPE [ENV]`` is the same dry run.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from npu_rl import settings as feature_settings
from npu_rl.preflight import async_checks, checks, fastpath
from npu_rl.preflight import memo as memo_mod
from npu_rl.preflight.compose import Cli, check_overrides, compose_config, split_cli, verl_package_dir
from npu_rl.preflight.libraries import check_hand_rules, check_libraries
from npu_rl.preflight.model import (
    MODELS_DIR,
    ModelFacts,
    find_model_config,
    hub_id,
    load_model_facts,
    shipped_models,
)
from npu_rl.preflight.rebalance import check_rollout_rebalance
from npu_rl.preflight.report import Report
from npu_rl.preflight.sampler import check_sampler
from npu_rl.preflight.spec_decode import check_spec_decode
from npu_rl.table import format_table


@dataclass
class Result:
    """What a preflight run found: the report, and the plan when the config composed."""

    report: Report
    plan: list[tuple[str, str]] = field(default_factory=list)
    facts: dict = field(default_factory=dict)  # machine-readable summary (the README's recipe table)

    @property
    def ok(self) -> bool:
        return not self.report.errors

    def render(self) -> str:
        out = []
        if self.plan:
            out.append("plan:")
            out.append(format_table(("", ""), self.plan).split("\n", 1)[1])
        out.extend(p.render() for p in self.report.warnings)
        out.extend(p.render() for p in self.report.errors)
        n_err, n_warn = len(self.report.errors), len(self.report.warnings)
        out.append(
            f"preflight: {'REJECTED' if n_err else 'ok'} ({n_err} error{'s' * (n_err != 1)}, "
            f"{n_warn} warning{'s' * (n_warn != 1)})"
        )
        return "\n".join(out)


def run_preflight(args: list[str], env: Mapping[str, str], trainer: str = "sync") -> Result:
    """Check the command line ``args`` (Hydra flags + overrides) of ``trainer``'s entry point (``sync``:
    ``main_ppo``; ``fully_async``, ``one_step_off``: :mod:`npu_rl.preflight.async_trainers`) for the job
    in ``env``.

    ``env`` supplies NNODES / NPUS_PER_NODE (the launcher's topology) and the feature switches.
    Never raises for a bad recipe: every problem is in ``Result.report``.
    """
    report = Report()
    try:
        cli = split_cli(args, trainer)
    except (ValueError, StopIteration) as e:
        report.error("command line", str(e) or "a Hydra flag is missing its value")
        return Result(report)
    overrides = check_overrides(cli, report)
    try:
        cfg = compose_config(cli, overrides)
    except Exception as e:  # noqa: BLE001 - any Hydra/OmegaConf failure is a finding
        report.error("composition", f"verl's config did not compose: {e}")
        return Result(report)
    facts: dict = {}
    if cli.trainer != "sync":
        async_checks.mirror_entry_point(cfg)
    plan = _check_composed(cli, cfg, env, report, facts)
    return Result(report, plan, facts)


def check_command(
    args: list[str], env: Mapping[str, str], trainer: str = "sync", recipe: str = ""
) -> tuple[int, str, dict]:
    """What ``run_verl`` gets in plan mode: the preflight of the command line ``args`` (Hydra flags and
    overrides) of ``trainer``'s entry point in the job environment ``env``, plus the launcher's contract
    that the recipe passes on the overrides given to the launcher (``NPU_RL_CLI_OVERRIDES``).

    Returns (exit code: 0 accepted, 65 rejected; the text printed; the facts written to
    ``NPU_RL_PLAN_JSON``: ``recipe``, ``ok`` and :attr:`Result.facts`). Never raises for a bad recipe.
    """
    result = run_preflight(args, env, trainer)
    cli = [o for o in env.get("NPU_RL_CLI_OVERRIDES", "").split("\n") if o]
    dropped = [o for o in cli if o not in args]
    if dropped:
        result.report.error(
            "command line",
            f"the recipe dropped the overrides given to the launcher: {' '.join(dropped)}",
            'end the recipe with run_verl "${ARGS[@]}" "$@" so that command-line overrides reach verl',
        )
    text = f"preflight of {recipe or 'the command line'}\n{result.render()}"
    return (0 if result.ok else 65), text, {"recipe": recipe, "ok": result.ok, **result.facts}


def _check_composed(cli: Cli, cfg, env: Mapping[str, str], report: Report, facts: dict) -> list[tuple[str, str]]:
    sel = checks.sel
    separate = cli.trainer != "sync"  # trainer and rollout on separate pools (npu_rl.preflight.async_checks)
    if separate:
        # verl's own asserts of the trainer first: they name the values its arithmetic below needs
        async_checks.check_verl_asserts(cfg, verl_package_dir(), cli.trainer, report)
    if not checks.check_values(cfg, report, zero_train_batch=cli.trainer == "fully_async"):
        return [("checks", "stopped: fix the values above first (every other check does arithmetic on them)")]
    model_path = str(sel(cfg, "actor_rollout_ref.model.path", ""))
    override = sel(cfg, "actor_rollout_ref.model.override_config", {}) or {}
    model, config_json = _model_facts(model_path, env, report, checks.plain(override))
    _check_files(cfg, model_path, env, report, config_only=feature_settings.is_on("NPU_RL_RANDOM_INIT", env))
    critic, critic_stand_in = _check_critic(cfg, env, report, config_json)
    pools = async_checks.check_pools(cfg, env, report) if separate else None
    world = pools.trainer_dies if pools else checks.check_resources(cfg, env, report)
    rollout_world = pools.rollout_dies if pools else world
    lay = checks.train_layout(cfg, world)
    roll = checks.rollout_layout(cfg)
    npus_per_node = int(env.get("NPUS_PER_NODE") or sel(cfg, "trainer.n_gpus_per_node", 8))
    # The fully-async trainer's step batch is required_samples = ppo_mini_batch_size x require_batches
    # prompts from the queue (data.train_batch_size is 0 there): verl's rules and ours judge that batch.
    step_cfg = _fully_async_step_config(cfg) if cli.trainer == "fully_async" else cfg
    checks.check_batches(step_cfg, lay, report)
    checks.check_ignored_batch_keys(cfg, report)
    checks.check_reward_and_dapo(cfg, report)
    overlong = checks.check_overlong(cfg, report, cli.trainer)
    checks.check_poll_interval(cfg, report, cli.trainer)
    trackers = checks.check_trackers(cfg, report)
    checks.check_algorithm(cfg, report)
    memo = _open_memo(cfg, cli.injected, env, config_json, report)
    with memo.stage("verl validate_config", report) as run:
        if run:
            with _config_folder(critic_stand_in) as folder:
                _verl_validate(_with_critic_path(step_cfg, folder), report, cli.injected)
    node_env = json.loads(env["NPU_RL_NODE_FEATURE_ENV"]) if env.get("NPU_RL_NODE_FEATURE_ENV") else None
    feats = feature_settings.check(env, lambda k: sel(cfg, k), node_env)
    check_sampler(cfg, env, report)
    for key, msg, fix in feats.errors:
        report.error(key, msg, fix)
    for key, msg, fix in feats.warnings:
        report.warn(key, msg, fix)
    if any(f.config and f.config[0] == f"{checks.A}.recompute_old_log_prob" for f in feats.on):
        checks.check_skip_old_log_prob(cfg, report)
    no_rewards = (
        f"the {cli.trainer} trainer does not send them (only verl's V1 trainer does, verl patch 0012)"
        if separate
        else ""
        if sel(cfg, "trainer.use_v1", True)
        else "the legacy trainer (trainer.use_v1=false) does not send them (only verl's V1 trainer does)"
    )
    sam_plan = check_spec_decode(cfg, env, report, no_rewards)  # "SAM k=..., drafts while ..., history ..." when on
    check_rollout_rebalance(cfg, env, report)
    with memo.stage("libraries", report) as run:
        if run:
            built = check_libraries(cfg, env, report, model_path, config_json, cli.injected)
            memo.put("fast_path", fastpath.as_json(built.fast_path))
    memo.save()
    fast = fastpath.FastPath.from_json(memo.get("fast_path"))
    check_hand_rules(cfg, env, report)
    if separate:
        kind = {"fully_async": "fully-async", "one_step_off": "one-step-off-policy"}[cli.trainer]
        plan = [
            ("config", f"{cli.config_name} ({cli.config_dir})"),
            (
                "cluster",
                f"{pools.total} dies = trainer pool {pools.trainer_nodes} node(s) x {pools.trainer_per_node} dies = "
                f"{pools.trainer_dies} + rollout pool {pools.rollout_nodes} node(s) x {pools.rollout_per_node} dies = "
                f"{pools.rollout_dies}",
            ),
            ("trainer", f"{kind} ({cli.trainer}), {sel(cfg, 'algorithm.adv_estimator')}"),
            ("library checks", memo.status),
            ("weight sync", async_checks.check_checkpoint_engine(cfg, env, report)),
        ]
        if cli.trainer == "fully_async":
            replicas = pools.rollout_dies // roll.replica if roll.replica else 0
            plan += async_checks.check_queue(cfg, report, replicas)
            plan.append(("partial rollout", async_checks.check_partial_rollout(cfg, verl_package_dir(), report)))
        else:
            plan.append(("staleness", "one step: the rollout generates step k+1's batch while step k trains"))
        async_checks.check_features(cfg, cli.trainer, feats.on, report)
    else:
        plan = [
            ("config", f"{cli.config_name} ({cli.config_dir})"),
            ("cluster", f"{sel(cfg, 'trainer.nnodes')} node(s) x {sel(cfg, 'trainer.n_gpus_per_node')} dies = {world}"),
            (
                "trainer",
                f"{'V1' if sel(cfg, 'trainer.use_v1', True) else 'legacy'}, {sel(cfg, 'algorithm.adv_estimator')}",
            ),  # noqa: E501
            ("library checks", memo.status),
        ]
    if checks.sel(cfg, "trainer.device", "npu") != "cpu" and env.get("VERL_PLATFORM") != "cpu":
        plan.append(("rollout graphs", fastpath.plan_value(fast)))
    if sam_plan:
        plan.append(("spec decode", sam_plan))
    if overlong:
        plan.append(("overlong shaping", overlong))
    if critic:
        plan.append(("critic", critic))
    plan += [*checks.lifecycle_plan(cfg, report), ("trackers", trackers)]
    if model is None:
        return plan
    lengths = checks.check_lengths(cfg, model, report)
    checks.check_layout(cfg, lay, roll, model, npus_per_node, report, rollout_world=rollout_world)
    if any(f.env == "ALL_TO_ALL_RESHARD" for f in feats.on):
        checks.check_reshard_settings(cfg, env, report)
        checks.check_reshard_layout(lay, roll, model, report)
    if any(f.env == "NPU_RL_RANDOM_INIT" for f in feats.on):
        checks.check_random_init(cfg, report)
    critic_facts = _critic_facts(cfg, model, report) if critic not in (None, _CRITIC_UNSET) else None
    critic_memory = (checks.train_layout(cfg, world, "critic"), critic_facts[0]) if critic_facts else None
    est = checks.estimate_memory(
        cfg, lay, roll, model, graph=fast.graph_gib if fast is not None else 0.0, critic=critic_memory
    )
    checks.check_memory(cfg, est, lengths, report, lay, separate_pools=separate)
    dense, expert = model.params()
    ckpt = checks.check_checkpoint_storage(
        cfg, lay.engine, dense + expert, report, dry_run=env.get("NPU_RL_DRY_RUN") == "1"
    )
    if ckpt:
        plan = [("checkpoints", ckpt) if name == "checkpoints" else (name, v) for name, v in plan]
    tbs, n = sel(cfg, "data.train_batch_size"), sel(cfg, "actor_rollout_ref.rollout.n")
    dapo = sel(cfg, "reward.reward_manager.name") == "dapo" or bool(sel(cfg, "algorithm.filter_groups.enable", False))
    facts.update(
        model=Path(model_path.rstrip("/")).name,
        algorithm="DAPO" if dapo else str(sel(cfg, "algorithm.adv_estimator")).upper(),
        # the cluster: separate pools may share a node (1 + 1 dies on one node of 2)
        nodes=int(env.get("NNODES") or 0) or int(sel(cfg, "trainer.nnodes")) + (pools.rollout_nodes if pools else 0)
        if pools
        else int(sel(cfg, "trainer.nnodes")),
        dies_per_node=int(env.get("NPUS_PER_NODE") or 0) or int(sel(cfg, "trainer.n_gpus_per_node"))
        if pools
        else int(sel(cfg, "trainer.n_gpus_per_node")),
        trainer=cli.trainer,
        pools=f"{pools.trainer_dies} train + {pools.rollout_dies} rollout" if pools else "",
        prompt=lengths["prompt"],
        response=lengths["response"],
        # fully-async: prompts per weight sync (trainer step batch x trigger_parameter_sync_step)
        gbs=int(sel(step_cfg, "data.train_batch_size")) * int(sel(cfg, "async_training.trigger_parameter_sync_step"))
        if cli.trainer == "fully_async"
        else int(tbs),
        n=int(n),
        train=f"{lay.engine} TP{lay.tp} PP{lay.pp} EP{lay.ep} DP{lay.dp}"
        if lay.engine in ("megatron", "mindspeed")
        else f"{lay.engine} DP{lay.dp}",
        rollout=f"vLLM TP{roll.tp} DP{roll.dp}"
        + (f" EP{roll.ep}" if roll.ep > 1 else "")
        + f" x{rollout_world // roll.replica}"
        + (f", {fast.summary}" if fast is not None else ""),
        fast_path=fastpath.as_json(fast),
    )
    mini = sel(cfg, "actor_rollout_ref.actor.ppo_mini_batch_size")
    plan += [
        (
            "model",
            f"{model_path} ({(dense + expert) / 1e9:.1f} B params"
            + (f", {model.experts} experts top-{model.experts_per_token}" if model.is_moe else "")
            + f"; facts from {model.source})",
        ),
        (
            "train layout",
            f"{lay.engine}: TP {lay.tp} PP {lay.pp} CP {lay.cp} EP {lay.ep} ETP {lay.etp} -> DP {lay.dp}"
            if lay.engine in ("megatron", "mindspeed")
            else f"{lay.engine}: Ulysses SP {lay.cp} -> DP {lay.dp}",
        ),
        (
            "rollout layout",
            f"TP {roll.tp} DP {roll.dp} PP {roll.pp} EP {roll.ep}: "
            f"{rollout_world // roll.replica if roll.replica else 0} replica(s) of {roll.replica} dies"
            + (f" on the rollout pool's {rollout_world}" if separate else ""),
        ),
        (
            "batch",
            f"{tbs} prompts x n {n} = {int(tbs) * int(n)} trajectories/step; mini-batch {mini} prompts "
            f"({int(mini) * int(n) / max(lay.dp, 1):g} trajectories per DP rank)"
            if cli.trainer != "fully_async"
            else f"streamed: data.train_batch_size 0, n {n}; mini-batch {mini} prompts "
            f"({int(mini) * int(n) / max(lay.dp, 1):g} trajectories per DP rank), see async queue",
        ),
        (
            "lengths",
            f"prompt {lengths['prompt']} + response {lengths['response']} "
            f"{_cmp(lengths['prompt'] + lengths['response'], lengths['max_model_len'])} max_model_len "
            f"{lengths['max_model_len']} {_cmp(lengths['max_model_len'], lengths['max_position_embeddings'])} "
            f"max_position_embeddings {lengths['max_position_embeddings']}",
        ),
        (
            "memory/die",
            f"train {est.train_total:.1f} GiB (w {est.train_weights:.1f} g {est.train_grads:.1f} "
            f"opt {est.train_optimizer:.1f}) + activations; rollout weights {est.rollout_weights:.1f} GiB, "
            f"KV {est.kv_budget:.1f} GiB = {est.kv_tokens} tokens"
            + (
                f"; ACL graph pool ~{est.graph:.2f} GiB ("
                + ("on the rollout pool's dies" if separate else "held while training")
                + ")"
                if est.graph
                else ""
            )
            + (
                f"; critic {est.critic.total:.1f} GiB (w {est.critic.weights:.1f} g {est.critic.grads:.1f} "
                f"opt {est.critic.optimizer:.1f}; value head for the LM head, {critic_facts[1]}), "
                f"{est.critic.resident:.1f} GiB of it kept on the die beside the actor and vLLM"
                if est.critic is not None
                else ""
            )
            + f"; against {checks.HBM}",
        ),
        ("features on", ", ".join(f.name for f in feats.on) or "none"),
    ]
    return plan


def _fully_async_step_config(cfg):
    """A copy of ``cfg`` whose ``data.train_batch_size`` is the fully-async trainer's step batch,
    ``ppo_mini_batch_size x async_training.require_batches`` prompts (``fully_async_trainer.py``
    ``required_samples``), for the batch rules written for ``main_ppo``'s batch."""
    from omegaconf import OmegaConf, open_dict

    step = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
    mini = checks.sel(cfg, f"{checks.A}.ppo_mini_batch_size", 0)
    rb = checks.sel(cfg, "async_training.require_batches", 1)
    if isinstance(mini, int) and isinstance(rb, int) and not isinstance(rb, bool) and mini > 0 and rb > 0:
        with open_dict(step):
            step.data.train_batch_size = mini * rb
    return step


_CRITIC_UNSET = "not set (see the error)"  # the plan's critic line when critic.model.path was never set


def _check_critic(
    cfg, env: Mapping[str, str], report: Report, actor_config: Path | None
) -> tuple[str | None, Path | None]:
    """The critic's model folder, when verl's own ``need_critic`` says the run trains one (``gae``, or
    ``critic.enable``): an absent ``critic.model.path`` gets what the actor's gets (a warning in a dry
    run, an error on the head). A path never set is ``checks.check_algorithm``'s error.

    Returns the plan's line (None without a critic) and, when the path cannot be read here, the
    config.json that stands in for it in verl's ``validate_config`` (the actor's), else None: verl
    would otherwise stop there on a Hugging Face "Repo id must be in the form ..." for ``critic.model``.
    """
    from verl.trainer.ppo.utils import need_critic

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Disabled critic" for every critic-free estimator
        if not need_critic(cfg):
            return None, None
    key = "critic.model.path"
    path = str(checks.sel(cfg, key, "") or "")
    estimator = str(checks.sel(cfg, "algorithm.adv_estimator", ""))
    why = f"{estimator} trains a value model" if estimator == "gae" else "critic.enable=True"
    stand_in = actor_config
    if not path or path == checks.verl_default(key):
        return _CRITIC_UNSET, stand_in
    if "://" not in path and not Path(os.path.expanduser(path)).is_dir():
        flag, where = _absent_here(env, report)
        flag(
            key,
            f"{path} does not exist {where}"
            + ("; verl's config checks ran with the actor's config.json in its place" if stand_in else ""),
            f"python -m npu_rl.models download {hub_id(path)} --dest {path} (or point {key} at the critic's folder)",
        )
        return f"{path} ({why}; not on this machine)", stand_in
    return f"{path} ({why})", None


def _critic_facts(cfg, model: ModelFacts, report: Report) -> tuple[ModelFacts, str]:
    """The shape the critic is built from, for the memory estimate: its own config.json (with
    ``critic.model.override_config``) when this machine has it, else the actor's, and what they came from."""
    path = Path(os.path.expanduser(str(checks.sel(cfg, "critic.model.path", "") or ""))) / "config.json"
    if path.is_file():
        override = checks.plain(checks.sel(cfg, "critic.model.override_config", {}) or {})
        try:
            return load_model_facts(path, override), str(path)
        except (OSError, ValueError, KeyError) as e:
            report.warn("critic.model.path", f"cannot read model facts from {path}: {e!r}; the actor's stand in")
    return model, "the actor's shape: critic.model.path is not on this machine"


@contextlib.contextmanager
def _config_folder(config_json: Path | None):
    """A folder holding ``config_json`` as its config.json (its own folder when so named, else a
    temporary one, removed afterwards); None for None."""
    if config_json is None:
        yield None
        return
    import tempfile

    from npu_rl.preflight.libraries import _config_dir

    with tempfile.TemporaryDirectory(prefix="npu-rl-critic-") as tmp:
        yield str(_config_dir(config_json, Path(tmp)))


def _with_critic_path(cfg, path: str | None):
    """``cfg`` with ``critic.model.path`` set to ``path`` (a copy), or ``cfg`` itself when ``path`` is None."""
    if path is None:
        return cfg
    from omegaconf import OmegaConf

    cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
    OmegaConf.update(cfg, "critic.model.path", path)
    return cfg


def _absent_here(env: Mapping[str, str], report: Report):
    """How to report a file the run reads that this machine lacks: (report.warn, "here (...)") in a dry
    run, which may run on a machine that has neither; (report.error, "on the head node") before a real run."""
    if env.get("NPU_RL_DRY_RUN") == "1":
        return report.warn, "here (fine for a dry run on another machine)"
    return report.error, "on the head node"


def _check_files(cfg, model_path: str, env: Mapping[str, str], report: Report, config_only: bool = False) -> None:
    """The model and data files the run reads: errors on the head before a real run, warnings in a
    dry run (which may run on a machine that has neither)."""
    from npu_rl.models import missing_files

    flag, where = _absent_here(env, report)
    model_dir = Path(os.path.expanduser(model_path))
    only = " --config-only" if config_only else ""
    if model_dir.is_dir():
        missing = missing_files(model_dir, config_only)
        if missing:
            report.error(
                "actor_rollout_ref.model.path",
                f"{model_dir} is incomplete; missing: {', '.join(missing)}",
                f"finish the download: python -m npu_rl.models download {hub_id(model_path)}{only} --dest {model_dir}",
            )
    elif _made_locally(model_path, env):
        kind = "toy" if "toy" in model_dir.name.lower() else "tiny"
        flag(
            "actor_rollout_ref.model.path",
            f"{model_path} does not exist {where}",
            f"the recipe writes it on its first real run (a dry run writes nothing): python -m npu_rl.models {kind} "
            f"{model_path} with the recipe's --layers/--hidden/--seed; no hub has it",
        )
    else:
        flag(
            "actor_rollout_ref.model.path",
            f"{model_path} does not exist {where}",
            f"python -m npu_rl.models download {hub_id(model_path)}{only} --dest {model_path} "
            "(ModelScope; --hub hf for the Hugging Face hub)",
        )
    for key in ("data.train_files", "data.val_files"):
        value = checks.sel(cfg, key)
        files = [value] if isinstance(value, str) else list(value or [])
        for f in files:
            f = str(f)
            if "://" in f or Path(os.path.expanduser(f)).exists():
                continue
            fix = _data_fix(f)
            if _made_locally(f, env):
                fix = f"the recipe writes it on its first real run (a dry run writes nothing); by hand: {fix}"
            flag(key, f"{f} does not exist {where}", fix)


def _made_locally(path: str, env: Mapping[str, str]) -> bool:
    """``path`` lies under ``NPU_RL_TINY_DIR`` (the CPU recipes' env scripts set it), where the CPU recipes
    write their models and data themselves (``npu_rl.models tiny|toy``, ``npu_rl.data``) on a real run."""
    root = env.get("NPU_RL_TINY_DIR")
    if not root:
        return False
    return Path(os.path.expanduser(path)).resolve().is_relative_to(Path(os.path.expanduser(root)).resolve())


def _data_fix(path: str) -> str:
    """The ``npu_rl.data`` command that writes ``path`` (``<out>/<dataset>/<split>.parquet``)."""
    from npu_rl.data import SPECS

    p = Path(path)
    dataset, out = p.parent.name, p.parent.parent
    if dataset == "toy" and p.suffix == ".parquet":
        return f"python -m npu_rl.data toy --out {out} --train-rows N (the recipe's TOY_TRAIN_ROWS)"
    if dataset not in SPECS or p.suffix != ".parquet":
        return (
            f"write it with python -m npu_rl.data DATASET --hub modelscope --out DIR (DATASET one of "
            f"{', '.join(sorted(SPECS))}; it writes DIR/DATASET/<split>.parquet), or point {path!r} at your file"
        )
    return (
        f"python -m npu_rl.data {dataset} --hub modelscope --split {p.stem} --out {out} "
        "(or --input FILE for a local copy)"
    )


def _cmp(a: int, b: int) -> str:
    return "<=" if a <= b else ">"


def _model_facts(
    model_path: str, env: Mapping[str, str], report: Report, override: dict
) -> tuple[ModelFacts | None, Path | None]:
    """Facts from the model's config.json (or shipped metadata), with ``model.override_config`` applied
    (verl applies it to the HF config, e.g. ``max_position_embeddings``), and the file they came from."""
    key = "actor_rollout_ref.model.path"
    path = find_model_config(model_path, dict(env))
    if path is None:
        report.error(
            key,
            f"{model_path!r} has no config.json here and matches no shipped metadata ({', '.join(shipped_models())}); "
            "the layout, length and memory checks need it and were skipped",
            f"python -m npu_rl.models download {hub_id(model_path)} --config-only --dest {model_path} (its "
            "config.json and tokenizer), or set NPU_RL_MODEL_META=<shipped name or config path>",
        )
        return None, None
    base = Path(model_path.rstrip("/")).name
    if path.parent == MODELS_DIR and not env.get("NPU_RL_MODEL_META") and base.lower() != path.stem.lower():
        report.warn(
            key,
            f"no config.json at {model_path}; using the shipped {path.stem} facts for '{base}'",
            "if it is another variant (e.g. a *-2507 model with a longer context), point NPU_RL_MODEL_META at its "
            "config.json",
        )
    try:
        return load_model_facts(path, override), path
    except (OSError, ValueError, KeyError) as e:
        report.error(key, f"cannot read model facts from {path}: {e!r}", "point NPU_RL_MODEL_META at a config.json")
        return None, None


def _open_memo(cfg, injected, env: Mapping[str, str], config_json, report: Report) -> memo_mod.Memo:
    """The reuse of the library stages' verdicts (:mod:`npu_rl.preflight.memo`); a bad switch is an error."""
    try:
        return memo_mod.open_memo(cfg, injected, env, config_json)
    except ValueError as e:
        report.error(memo_mod.SWITCH, str(e), f"unset {memo_mod.SWITCH} or write 0 or 1")
        return memo_mod.open_memo(cfg, injected, {**env, memo_mod.SWITCH: "0"}, config_json)


def _verl_validate(cfg, report: Report, injected: list[str]) -> None:
    """verl's own ``validate_config`` (what ``main_ppo`` runs first), its output captured; keys of
    features this verl does not have yet are removed first (its dataclasses would reject them)."""
    from omegaconf import OmegaConf, open_dict
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    if injected:
        cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
        with open_dict(cfg):
            for key in injected:
                parent, _, leaf = key.rpartition(".")
                node = OmegaConf.select(cfg, parent) if parent else cfg
                if node is not None and leaf in node:
                    del node[leaf]

    if OmegaConf.select(cfg, f"{checks.A}.recompute_old_log_prob") is False:
        # the patched validate_config raises on an invalid on-policy shortcut and stops there;
        # check_skip_old_log_prob reports those rules, so let verl's other checks run
        cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
        OmegaConf.update(cfg, f"{checks.A}.recompute_old_log_prob", True)

    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. "Disabled critic": expected for GRPO, not a finding
            validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    except Exception as e:  # noqa: BLE001 - verl raises assert/ValueError/TypeError alike
        msg = str(e) or type(e).__name__
        if isinstance(e, TypeError) and "NoneType" in msg:
            msg += " (a batch size left at null: set the *_micro_batch_size_per_gpu keys or use_dynamic_bsz=true)"
        report.error("verl validate_config", msg)
