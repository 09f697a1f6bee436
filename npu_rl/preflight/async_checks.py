"""Preflight rules of the separate-pool trainers (``run_verl --trainer fully_async|one_step_off``).

Everything here is read from the pinned verl 0.9.1 (paths below ``verl/``; docs/async.md has the why):

- verl's own rules: the ``assert`` statements at the top level of the trainer's and rollouter's
  constructors and config methods are read from the pinned source and evaluated on the composed
  config (:func:`check_verl_asserts`): the library judges its keys, and a verl that changes a rule
  changes the preflight with it. ``fully_async_main`` does not run ``validate_config`` (its
  ``data.train_batch_size`` is 0); ``one_step_off_policy/main_ppo`` does, as ``main_ppo``.
- the pools (:func:`check_pools`): ``trainer.nnodes x trainer.n_gpus_per_node`` dies train,
  ``rollout.nnodes x rollout.n_gpus_per_node`` dies generate (``separation/utils.py``
  ``create_resource_pool_manager``; the entry points copy ``rollout.*`` into
  ``actor_rollout_ref.rollout.*``); together they must be the launcher's cluster.
- the queue (:func:`check_queue`): ``required_samples = ppo_mini_batch_size x require_batches`` prompts
  per trainer step, ``max_required_samples = int(required x (1 + staleness_threshold) x
  trigger_parameter_sync_step)`` per weight version, ``total_train_steps = int(total_rollout_steps /
  (required x trigger))`` (``fully_async_rollouter.py`` ``set_max_required_samples``).
- partial rollout (:func:`check_partial_rollout`): ``LLMServerClient.generate`` resumes a request the
  server aborted at a weight sync with ``prompt + tokens so far`` (``workers/rollout/llm_server.py``);
  the server class of the rollout backend must implement ``abort_all_requests`` and ``resume_generation``.
- the weight sync (:func:`check_checkpoint_engine`): separate pools sync through
  ``CheckpointEngineManager`` with ``rollout.checkpoint_engine.backend``; the names the pinned
  registry knows, and which of them import on Ascend, are in :data:`BACKENDS`.
- our features (:func:`check_features`): each one's hook, and whether these trainers reach it.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from npu_rl.preflight.report import Report

A = "actor_rollout_ref.actor"
R = "actor_rollout_ref.rollout"
AT = "async_training"

# --- verl's own asserts -------------------------------------------------------------------------------

#: (file below verl/, class, methods) whose top-level asserts are verl's rules for each trainer.
ASSERT_SITES = {
    "fully_async": (
        (
            "experimental/fully_async_policy/fully_async_rollouter.py",
            "FullyAsyncRollouter",
            ("__init__", "_validate_config", "_init_async_rollout_manager"),
        ),
        ("experimental/fully_async_policy/fully_async_trainer.py", "FullyAsyncTrainer", ("__init__",)),
    ),
    "one_step_off": (
        (
            "experimental/one_step_off_policy/ray_trainer.py",
            "OneStepOffRayTrainer",
            ("__init__", "_init_async_rollout_manager"),
        ),
    ),
}

#: The fix for a failed verl assert, by the key it tests.
ASSERT_FIXES = {
    "actor_rollout_ref.hybrid_engine": "set actor_rollout_ref.hybrid_engine=False (trainer and rollout run on "
    "separate pools)",
    "data.train_batch_size": "set data.train_batch_size=0: the fully-async trainer takes ppo_mini_batch_size x "
    "async_training.require_batches prompts per step from the queue",
    "data.gen_batch_size": "set data.gen_batch_size=1 (the rollouter feeds one prompt at a time)",
    f"{AT}.staleness_threshold": "set async_training.staleness_threshold >= 0 (0: every sample from the current "
    "weights; verl's Qwen3-235B NPU script uses 0.5)",
    f"{AT}.trigger_parameter_sync_step": "set async_training.trigger_parameter_sync_step >= 1",
    f"{R}.calculate_log_probs": f"set {R}.calculate_log_probs=True (the trainer uses the rollout's log-probs)",
    f"{R}.mode": f"set {R}.mode=async",
}


class _Self:
    """The ``self`` a verl method's asserts see: its config, and what earlier lines assigned from it."""


def _names_ok(node: ast.AST, assigned: set[str]) -> bool:
    """True when ``node`` reads only ``config`` / ``self.config`` / earlier ``self.x = <config...>``
    values, through attributes, ``.get`` calls, comparisons and constants."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and sub.id not in ("self", "config"):
            return False
        if isinstance(sub, ast.Call) and not (isinstance(sub.func, ast.Attribute) and sub.func.attr == "get"):
            return False
        if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id == "self":
            if sub.attr != "config" and sub.attr not in assigned:
                return False
        if isinstance(sub, ast.Await | ast.Lambda | ast.NamedExpr | ast.Starred):
            return False
    return True


def _config_key(node: ast.AST, aliases: Mapping[str, str]) -> str | None:
    """The dotted config key an assert tests (the first ``config.a.b`` / ``self.config.a.b`` chain)."""
    for sub in ast.walk(node):
        parts: list[str] = []
        cur = sub
        while isinstance(cur, ast.Attribute):
            parts.append(cur.attr)
            cur = cur.value
        if not isinstance(cur, ast.Name) or not parts:
            continue
        parts.reverse()
        if cur.id == "self" and parts[0] == "config":
            parts = parts[1:]
        elif cur.id == "self" and parts[0] in aliases:
            return aliases[parts[0]]
        elif cur.id != "config":
            continue
        if parts:
            return ".".join(parts)
    return None


@dataclasses.dataclass(frozen=True)
class VerlAssert:
    """One of verl's asserts, as evaluated on a config."""

    site: str  # file:line below verl/
    where: str  # Class.method
    source: str  # the assert's test, as written
    message: str  # its message ("" if none)
    key: str | None


def verl_asserts(verl_dir: Path, trainer: str) -> list[tuple[VerlAssert, list[ast.stmt]]]:
    """The asserts of ``trainer``'s :data:`ASSERT_SITES` with the statements before each one that set
    ``self.x`` from the config (what the assert may read). Read from the source, never imported."""
    out = []
    for rel, cls_name, methods in ASSERT_SITES.get(trainer, ()):
        tree = ast.parse((verl_dir / rel).read_text())
        cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls_name)
        for fn in cls.body:
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) or fn.name not in methods:
                continue
            before: list[ast.stmt] = []
            for stmt in fn.body:
                if isinstance(stmt, ast.Assign):
                    before.append(stmt)
                elif isinstance(stmt, ast.Assert):
                    aliases = {
                        t.attr: k
                        for s in before
                        for t in s.targets
                        if isinstance(t, ast.Attribute) and (k := _config_key(s.value, {}))
                    }
                    msg = ast.literal_eval(stmt.msg) if isinstance(stmt.msg, ast.Constant) else ""
                    out.append(
                        (
                            VerlAssert(
                                f"verl/{rel}:{stmt.lineno}",
                                f"{cls_name}.{fn.name}",
                                ast.unparse(stmt.test),
                                str(msg),
                                _config_key(stmt.test, aliases),
                            ),
                            [*before, stmt],
                        )
                    )
    return out


def check_verl_asserts(cfg, verl_dir: Path, trainer: str, report: Report) -> int:
    """Evaluate verl's asserts for ``trainer`` on ``cfg``; each failure is an error naming verl's line.
    Returns how many asserts were evaluated."""
    evaluated, seen = 0, set()
    for va, stmts in verl_asserts(verl_dir, trainer):
        me = _Self()
        me.config = cfg
        env = {"__builtins__": {}, "self": me, "config": cfg}
        assigned: set[str] = set()
        verdict = None
        for stmt in stmts:
            if isinstance(stmt, ast.Assign):
                targets = [t for t in stmt.targets if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)]
                if len(targets) != len(stmt.targets) or not _names_ok(stmt.value, assigned):
                    continue
                try:
                    value = eval(compile(ast.Expression(stmt.value), va.site, "eval"), env)  # noqa: S307
                except Exception:  # noqa: BLE001,S112 - a line that needs more than the config: not followed
                    continue
                for t in targets:
                    setattr(me, t.attr, value)
                    assigned.add(t.attr)
            elif _names_ok(stmt.test, assigned):
                try:
                    verdict = bool(eval(compile(ast.Expression(stmt.test), va.site, "eval"), env))  # noqa: S307
                except Exception:  # noqa: BLE001 - a key the config lacks: verl would raise there too
                    verdict = None
        if verdict is None:
            continue
        evaluated += 1
        if not verdict and (va.key, va.source) not in seen:  # trainer and rollouter assert some alike
            seen.add((va.key, va.source))
            key = va.key or va.where
            report.error(
                key,
                f"verl's {va.where} asserts `{va.source}` ({va.site})" + (f": {va.message}" if va.message else ""),
                ASSERT_FIXES.get(key, f"set {key} as the assertion requires"),
            )
    return evaluated


# --- the pools -----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Pools:
    """The trainer's and the rollout's dies (``trainer.*`` and ``rollout.*`` of the separate-pool configs)."""

    trainer_nodes: int
    trainer_per_node: int
    rollout_nodes: int
    rollout_per_node: int

    @property
    def trainer_dies(self) -> int:
        return self.trainer_nodes * self.trainer_per_node

    @property
    def rollout_dies(self) -> int:
        return self.rollout_nodes * self.rollout_per_node

    @property
    def total(self) -> int:
        return self.trainer_dies + self.rollout_dies


def pools(cfg) -> Pools:
    """The two pools of a composed separate-pool config."""
    from npu_rl.preflight.checks import sel

    return Pools(
        int(sel(cfg, "trainer.nnodes", 1)),
        int(sel(cfg, "trainer.n_gpus_per_node", 8)),
        int(sel(cfg, "rollout.nnodes", 1)),
        int(sel(cfg, "rollout.n_gpus_per_node", 8)),
    )


def mirror_entry_point(cfg) -> None:
    """What ``fully_async_main.main`` / ``one_step_off_policy.main_ppo.main`` do to the config before
    anything reads it: ``actor_rollout_ref.rollout.nnodes / n_gpus_per_node`` = ``rollout.*``."""
    from omegaconf import open_dict

    with open_dict(cfg):
        cfg.actor_rollout_ref.rollout.nnodes = cfg.rollout.nnodes
        cfg.actor_rollout_ref.rollout.n_gpus_per_node = cfg.rollout.n_gpus_per_node


def _packs(sizes: Iterable[int], nodes: int, per_node: int) -> bool:
    """First-fit decreasing of the pools' per-node bundles into ``nodes`` nodes of ``per_node`` dies."""
    free = [per_node] * nodes
    for s in sorted(sizes, reverse=True):
        for i, f in enumerate(free):
            if f >= s:
                free[i] -= s
                break
        else:
            return False
    return True


def check_pools(cfg, env: Mapping[str, str], report: Report) -> Pools:
    """The two pools must be the launcher's cluster: every die in one pool, each pool's bundles on nodes."""
    p = pools(cfg)
    keys = "trainer.nnodes, rollout.nnodes"
    sides = (("trainer", p.trainer_nodes, p.trainer_per_node), ("rollout", p.rollout_nodes, p.rollout_per_node))
    for name, nodes, per in sides:
        if nodes < 1 or per < 1:
            report.error(
                f"{name}.nnodes",
                f"the {name} pool is {name}.nnodes {nodes} x {name}.n_gpus_per_node {per}: no dies",
                f"give the {name} pool at least one node ({name}.nnodes >= 1, {name}.n_gpus_per_node >= 1)",
            )
            return p
    env_nodes, env_npus = env.get("NNODES"), env.get("NPUS_PER_NODE")
    if not (env_nodes and env_npus):
        return p
    n, c = int(env_nodes), int(env_npus)
    split = (
        f"trainer {p.trainer_nodes} x {p.trainer_per_node} = {p.trainer_dies} dies + rollout {p.rollout_nodes} x "
        f"{p.rollout_per_node} = {p.rollout_dies} dies = {p.total}"
    )
    even = f"e.g. trainer.nnodes={n // 2} rollout.nnodes={n - n // 2} with trainer.n_gpus_per_node={c} " + (
        f"rollout.n_gpus_per_node={c}"
        if n > 1
        else f"(one node: trainer.n_gpus_per_node={c // 2} rollout.n_gpus_per_node={c - c // 2}, nnodes 1 each)"
    )
    if p.total != n * c:
        report.error(
            keys,
            f"the pools do not tile the cluster: {split}, the launcher has NNODES={n} x NPUS_PER_NODE={c} = {n * c}"
            + (" (dies left idle)" if p.total < n * c else " (more than exist: Ray waits for them forever)"),
            f"split the {n * c} dies between the pools, {even}",
        )
    elif max(p.trainer_per_node, p.rollout_per_node) > c or not _packs(
        [p.trainer_per_node] * p.trainer_nodes + [p.rollout_per_node] * p.rollout_nodes, n, c
    ):
        report.error(
            "trainer.n_gpus_per_node, rollout.n_gpus_per_node",
            f"{split}: Ray places each pool as {{nnodes}} bundles of n_gpus_per_node dies, which do not fit "
            f"on {n} nodes of {c} dies",
            f"use whole nodes per pool ({even})",
        )
    return p


# --- the queue: staleness, require_batches, steps -----------------------------------------------------


def check_queue(cfg, report: Report, rollout_replicas: int) -> list[tuple[str, str]]:
    """The fully-async queue arithmetic (``fully_async_rollouter.py`` ``set_max_required_samples``):
    values the batch sizes cannot meet are errors. Returns the plan rows."""
    from npu_rl.preflight.checks import sel

    mini = int(sel(cfg, f"{A}.ppo_mini_batch_size", 0))
    n = int(sel(cfg, f"{R}.n", 1))
    rb = sel(cfg, f"{AT}.require_batches", 1)
    trig = sel(cfg, f"{AT}.trigger_parameter_sync_step", 1)
    stale = sel(cfg, f"{AT}.staleness_threshold", 0)
    per_replica = sel(cfg, f"{AT}.concurrent_samples_per_replica", 16)
    total = sel(cfg, "rollout.total_rollout_steps")
    bad = False
    for key, v in ((f"{AT}.require_batches", rb), (f"{AT}.concurrent_samples_per_replica", per_replica)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            report.error(key, f"= {v!r}; it must be a whole number >= 1", f"set {key} to a positive integer")
            bad = True
    if (
        isinstance(stale, bool)
        or not isinstance(stale, int | float)
        or isinstance(trig, bool)
        or not isinstance(trig, int)
    ):
        return []  # verl's own asserts (check_verl_asserts) report these
    if bad or mini < 1 or trig < 1 or stale < 0:
        return []
    required = mini * rb
    per_version = required * trig
    max_required = int(required * (stale + 1) * trig)
    rows = [
        (
            "async queue",
            f"trainer step = ppo_mini_batch_size {mini} x require_batches {rb} = {required} prompts ({required * n} "
            f"trajectories); weights sync every {trig} step(s) = {per_version} prompts; staleness {stale:g} lets "
            f"{max_required - per_version} more be generated per version (max_required_samples {max_required})",
        ),
        (
            "rollouter",
            f"{rollout_replicas} replica(s) x concurrent_samples_per_replica {per_replica} = "
            f"{rollout_replicas * per_replica} prompts at once, capped at {max_required}",
        ),
    ]
    if stale > 0 and max_required == per_version:
        need = 1 / per_version
        report.error(
            f"{AT}.staleness_threshold",
            f"staleness_threshold {stale:g} cannot be met by these batch sizes: int({required} x (1 + {stale:g}) x "
            f"{trig}) = {max_required} = the {per_version} prompts of one weight version, so no sample may ever be "
            "stale and the value does nothing (fully_async_rollouter.py set_max_required_samples)",
            f"raise it to at least {need:.3g} (one prompt), or set 0 for strictly on-policy batches",
        )
    if total is not None:
        if isinstance(total, bool) or not isinstance(total, int) or total < per_version:
            report.error(
                "rollout.total_rollout_steps",
                f"= {total!r} prompts, fewer than one weight version ({required} x {trig} = {per_version}): "
                f"total_train_steps = int({total!r} / {per_version}) = 0 and the trainer never takes a step",
                f"set rollout.total_rollout_steps to a multiple of {per_version} (prompts to generate in all)",
            )
        else:
            rows.append(
                ("run length", f"{total} prompts = {total // per_version} weight versions x {trig} trainer step(s)")
            )
    return rows


# --- partial rollout ---------------------------------------------------------------------------------

#: Rollout backend -> (server file below verl/, server class): the class whose abort_all_requests and
#: resume_generation pause and resume generation at a weight sync.
SERVERS = {
    "vllm": ("workers/rollout/vllm_rollout/vllm_async_server.py", "vLLMHttpServer"),
    "sglang": ("workers/rollout/sglang_rollout/async_sglang_server.py", "SGLangHttpServer"),
    "trtllm": ("workers/rollout/trtllm_rollout/trtllm_async_server.py", "TRTLLMHttpServer"),
}
RESUME_METHODS = ("abort_all_requests", "resume_generation")


def resumable(verl_dir: Path, name: str) -> tuple[bool, str]:
    """(whether rollout backend ``name`` can resume an aborted request, the evidence)."""
    if name not in SERVERS:
        return False, f"rollout backend {name!r} has no server class known to pause and resume ({', '.join(SERVERS)})"
    rel, cls_name = SERVERS[name]
    path = verl_dir / rel
    if not path.is_file():
        return False, f"verl/{rel} does not exist in this verl"
    tree = ast.parse(path.read_text())
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls_name), None)
    if cls is None:
        return False, f"verl/{rel} has no class {cls_name}"
    have = {f.name: f.lineno for f in cls.body if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)}
    missing = [m for m in RESUME_METHODS if m not in have]
    if missing:
        return False, f"{cls_name} (verl/{rel}) lacks {', '.join(missing)}"
    return True, f"{cls_name}.{'/'.join(RESUME_METHODS)} (verl/{rel}:{have[RESUME_METHODS[0]]})"


def check_partial_rollout(cfg, verl_dir: Path, report: Report) -> str:
    """``async_training.partial_rollout=True`` only with a rollout that pauses and resumes; returns the plan text."""
    from npu_rl.preflight.checks import sel

    if not sel(cfg, f"{AT}.partial_rollout", False):
        report.warn(
            f"{AT}.partial_rollout",
            "is off: a response still running at a weight sync is aborted and not resumed (llm_server.py:339-343 "
            "stops retrying; nothing in the pinned verl drops it, despite the comment there), so it reaches the "
            "trainer cut short at the sync",
            f"set {AT}.partial_rollout=True (verl's default for this trainer)",
        )
        return "off: responses running at a weight sync end there, cut short"
    name = str(sel(cfg, f"{R}.name", ""))
    ok, why = resumable(verl_dir, name)
    if not ok:
        report.error(
            f"{AT}.partial_rollout",
            f"partial rollout pauses running requests at a weight sync and resumes them, but {why}",
            f"set {AT}.partial_rollout=False, or use {R}.name=vllm",
        )
        return "on, but the rollout cannot resume"
    return f"on: requests running at a weight sync resume with their tokens so far ({why})"


# --- the weight sync -----------------------------------------------------------------------------------

#: ``rollout.checkpoint_engine.backend`` names the pinned registry knows (``CheckpointEngineRegistry.register``
#: in verl/checkpoint_engine/), and whether each imports on Ascend (``checkpoint_engine/__init__.py``
#: imports each engine optionally).
BACKENDS = {
    "nccl": (True, "on Ascend the name 'nccl' is HCCLCheckpointEngine (hccl_checkpoint_engine.py:103, needs "
             "torch_npu); NCCLCheckpointEngine needs cupy"),
    "naive": (False, "ColocatedCheckpointEngine (base.py:246) updates a rollout on the trainer's own dies; "
              "separate pools have none"),
    "kimi_ckpt_engine": (None, "KIMICheckpointEngine (kimi_checkpoint_engine.py:222) needs the "
                         "checkpoint_engine package"),
    "mooncake": (None, "MooncakeCheckpointEngine (mooncake_checkpoint_engine.py:38) needs mooncake's TransferEngine"),
    "nixl": (False, "NIXLCheckpointEngine needs cupy (CUDA only)"),
    "delta_sharded": (False, "DeltaShardedCheckpointEngine needs cupy (CUDA only)"),
}  # fmt: skip
#: The package each optional backend imports (checked in the training Python when the value is None).
BACKEND_PACKAGES = {"kimi_ckpt_engine": "checkpoint_engine", "mooncake": "mooncake"}


def check_checkpoint_engine(cfg, env: Mapping[str, str], report: Report) -> str:
    """A weight-sync backend that exists on Ascend and works between separate pools; returns the plan text."""
    import importlib.util

    from npu_rl.preflight.checks import sel

    key = f"{R}.checkpoint_engine.backend"
    backend = str(sel(cfg, key, "naive"))
    if sel(cfg, f"{R}.checkpoint_engine.custom_backend_module"):
        return f"{backend} (custom_backend_module: registered by that module, not checked here)"
    on_npu = str(sel(cfg, "trainer.device", "npu")) != "cpu" and env.get("VERL_PLATFORM") != "cpu"
    if backend == "hccl":
        report.error(
            key,
            "no checkpoint engine registers the name 'hccl' in this verl (its CheckpointEngineConfig comment lists "
            "it, the registry does not): CheckpointEngineRegistry.get would raise when the trainer starts",
            f"write {key}=nccl: {BACKENDS['nccl'][1]}",
        )
        return backend
    if backend not in BACKENDS:
        report.error(
            key,
            f"{backend!r} is not a checkpoint engine of this verl (registered names: {', '.join(BACKENDS)})",
            f"use {key}=nccl (HCCL on Ascend)",
        )
        return backend
    ok, why = BACKENDS[backend]
    if ok is None and on_npu:
        package = BACKEND_PACKAGES[backend]
        ok = importlib.util.find_spec(package) is not None
        why += f" ({package} {'is' if ok else 'is not'} installed in this Python)"
    if ok is False and (on_npu or backend == "naive"):
        report.error(
            key,
            f"{backend!r} cannot sync the rollout pool's weights here: {why}",
            f"use {key}=nccl (HCCL on Ascend)",
        )
    return f"{backend}: {why}"


# --- our features --------------------------------------------------------------------------------------


def check_features(cfg, trainer: str, on: Iterable[Any], report: Report) -> None:
    """Each switched-on feature of this project under a separate-pool trainer: refused where its hook is
    never reached or its premise fails, warned where it works in part (docs/async.md has the matrix)."""
    from npu_rl.preflight.checks import sel

    partial = trainer == "fully_async" and bool(sel(cfg, f"{AT}.partial_rollout", False))
    dynamic = trainer == "fully_async" and bool(sel(cfg, f"{AT}.use_dynamic_resource_scheduling", False))
    name = {"fully_async": "the fully-async trainer", "one_step_off": "the one-step-off-policy trainer"}[trainer]
    for f in on:
        switch = f.config[0] if f.config else f.env
        if f.config and f.config[0] == f"{A}.recompute_old_log_prob":
            report.error(
                switch,
                f"skip-old-log-prob uses the current weights' log-probs as the old policy's, exact only for one "
                f"on-policy update per batch; {name} trains on samples generated by older weights (the "
                "behaviour policy is the rollout's: actor.use_rollout_log_probs=True)",
                f"remove {switch}=false (the default recompute is the right one off-policy)",
            )
        elif f.config and f.config[0] == "data.sampler.class_name":
            report.error(
                switch,
                "the length-aware resampler learns response lengths in the trainer's fit loop "
                "(verl/trainer/ppo/ray_trainer.py:1554, v1/trainer_base.py:482), which "
                f"{name} replaces with its own ("
                + (
                    "fully_async_trainer.py:498; the dataloader lives in the rollouter)"
                    if trainer == "fully_async"
                    else "one_step_off_policy/ray_trainer.py:265)"
                )
                + ": it would never learn a length and order prompts at random",
                f"remove {switch} (and its +data.sampler.* keys) for this trainer",
            )
        elif f.env == "ALL_TO_ALL_RESHARD":
            report.error(
                switch,
                "the all-to-all-v reshard replaces the colocated (naive) weight sync (verl/workers/engine_workers.py:"
                f"756, checkpoint_engine/base.py:518); {name} syncs separate pools through the checkpoint engine "
                f"({R}.checkpoint_engine.backend), so the reshard would never run",
                "unset ALL_TO_ALL_RESHARD / checkpoint_engine.expert_reshard for this trainer",
            )
        elif f.env == "VLLM_ROLLOUT_EARLY_STOP_ENABLE" and partial:
            report.error(
                switch,
                "the long-tail guard truncates the step's longest responses so that a synchronous step stops "
                "waiting for them; with partial rollout no step waits for a response (it streams into the queue and "
                "resumes across weight syncs), so the guard would only cut samples, for nothing",
                f"unset {switch} (or set {AT}.partial_rollout=False)",
            )
        elif f.env == "VLLM_ROLLOUT_EARLY_STOP_ENABLE":
            report.warn(
                switch,
                "the long-tail guard cuts responses in the vLLM server (reached), but its cut metrics are reported "
                f"by the V1 trainer (v1/trainer_base.py:1943), which {name} does not run",
                "watch the server's own log lines for its cuts",
            )
        elif f.env == "ROLLOUT_REBALANCE_ENABLE" and dynamic:
            report.error(
                switch,
                "rollout rebalance replaces the rollout's load balancer (llm_server.py:388, 510), but dynamic resource "
                "scheduling adds and removes hybrid replicas in verl's own balancer at run time, which ours does "
                "not follow",
                f"unset {switch}, or set {AT}.use_dynamic_resource_scheduling=False",
            )
        elif f.env == "ROLLOUT_REBALANCE_ENABLE":
            report.warn(
                switch,
                "rollout rebalance routes the rollout's requests (reached: LLMServerManager.__init__, "
                "llm_server.py:388), "
                f"but its step metrics are read by the V1 trainer (v1/trainer_base.py:585), which {name} does not run"
                + (
                    "; the rollouter submits one prompt group at a time (data.gen_batch_size=1), so longest-first "
                    "ordering sees only the groups in flight"
                    if trainer == "fully_async"
                    else ""
                ),
                "judge it by the rollout's time per step, not by rollout_rebalance/* metrics",
            )
        elif f.env == "NPU_RL_ROLLOUT_PROGRESS":
            report.warn(
                switch,
                "rollout progress lines come from the V1 trainer's replay buffer (v1/replay_buffer.py:237), which "
                f"{name} does not run: no progress lines will be printed",
                f"set {switch}=0 in the ENV_SCRIPT for this trainer (the rollouter logs its own progress)",
            )
