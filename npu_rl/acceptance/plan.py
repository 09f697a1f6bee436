"""Which runs the acceptance suite starts, and which pairs of them it compares (A/B).

Every run is a shipped one-node recipe (``recipes/qwen3-0.6b``, ``recipes/qwen3-8b``) started through
``ray_start_npu.sh`` with the same smoke settings (a few steps, no validation, a fixed data seed and
``data.train_max_samples``, so both arms of a pair train on the same prompts with verl's default
rollout seed 42) and every feature variable set explicitly, so the user's shell cannot flip an arm.
A pair differs in exactly one switch: the feature off (A) and on (B).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from npu_rl.errors import NpuRlError

R = "actor_rollout_ref.rollout"
SPEC = f"{R}.engine_kwargs.vllm.speculative_config"
NPUGRAPH_EX = f"+{R}.engine_kwargs.vllm.additional_config.ascend_compilation_config.enable_npugraph_ex=False"

# Feature variables of npu_rl.features, set explicitly in every run (the value of the A arm).
FEATURE_ENV_OFF = {
    "NPU_RL_ENGINE_GC": "1",  # on in the suite's runs (off in the env scripts): the GC pair measures it
    "NPU_RL_ROLLOUT_PROGRESS": "1",  # on in every run: the driver log shows where generation stands
    "ROLLOUT_REBALANCE_ENABLE": "0",
    "VLLM_ROLLOUT_EARLY_STOP_ENABLE": "0",
    "ALL_TO_ALL_RESHARD": "0",
    "NPU_RL_RANDOM_INIT": "0",
}


@dataclass(frozen=True)
class Model:
    """A model the suite trains: its shipped recipe and env script, and the batch the recipe uses."""

    name: str  # Qwen3-0.6B
    hub_id: str  # Qwen/Qwen3-0.6B
    recipe: str  # repository-relative
    env_script: str
    train_batch_size: int  # data.train_batch_size of the recipe (prompts per step)


MODELS = {
    "Qwen3-0.6B": Model(
        "Qwen3-0.6B", "Qwen/Qwen3-0.6B", "recipes/qwen3-0.6b/grpo_gsm8k_smoke.sh", "recipes/qwen3-0.6b/env_1node.sh", 64
    ),
    "Qwen3-8B": Model(
        "Qwen3-8B", "Qwen/Qwen3-8B", "recipes/qwen3-8b/grpo_gsm8k.sh", "recipes/qwen3-8b/env_1node.sh", 128
    ),
}


@dataclass(frozen=True)
class Run:
    """One launcher invocation: ``bash ray_start_npu.sh RECIPE [ENV_SCRIPT] OVERRIDES...`` with ``env`` set
    (``env_script`` empty: none).

    ``model`` names the entry of :data:`MODELS` whose files must exist before a real run (None: no
    check, for test recipes).
    """

    name: str
    what: str
    recipe: str
    env_script: str
    overrides: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    model: str | None = None

    def command(self, dry_run: bool = False) -> list[str]:
        """The launcher's argument list (relative to the repository root)."""
        env_script = [self.env_script] if self.env_script else []
        return ["bash", "ray_start_npu.sh", *(["--dry-run"] if dry_run else []), self.recipe, *env_script,
                *self.overrides]  # fmt: skip


@dataclass(frozen=True)
class Pair:
    """An A/B comparison: ``off`` and ``on`` are run names; ``steps`` selects the steps compared
    (``all`` but the first, or ``last-epoch``: the steps of the last epoch, for the resampler)."""

    feature: str
    off: str
    on: str
    switch: str
    steps: str = "after-first"


@dataclass(frozen=True)
class Plan:
    """The runs in order, the pairs, and what is not planned on this node (feature, reason)."""

    runs: tuple[Run, ...]
    pairs: tuple[Pair, ...]
    not_planned: tuple[tuple[str, str], ...] = ()

    def run(self, name: str) -> Run:
        """The run called ``name``; KeyError when the plan has none."""
        for r in self.runs:
            if r.name == name:
                return r
        raise KeyError(name)

    def to_json(self) -> str:
        """The plan as JSON (``plan.json`` in the output folder; :func:`load_plan` reads it back)."""
        return json.dumps(
            {"runs": [asdict(r) for r in self.runs], "pairs": [asdict(p) for p in self.pairs],
             "not_planned": [list(x) for x in self.not_planned]},
            indent=2,
        )  # fmt: skip


def smoke_overrides(name: str, model: Model, steps: int, epochs: int = 1) -> tuple[str, ...]:
    """The settings every run shares: ``steps`` steps per epoch over exactly the prompts they need."""
    return (
        f"trainer.total_epochs={epochs}",
        f"trainer.total_training_steps={steps * epochs}",
        f"data.train_max_samples={model.train_batch_size * steps}",
        "data.seed=1",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        # vLLM's periodic stats lines (SpecDecoding metrics among them) in the log; the same in both arms
        f"{R}.disable_log_stats=False",
        f"trainer.experiment_name=acceptance-{name}",
    )


def build_plan(quick: bool = False, nnodes: int = 1) -> Plan:
    """The suite's runs: Qwen3-0.6B for every feature, Qwen3-8B for the headline numbers (not ``quick``).

    ``quick`` runs 2 steps per run (4 otherwise), leaves out Qwen3-8B and the npugraph_ex arm.
    ``nnodes`` is the job's node count; the all-to-all-v reshard needs 2 nodes and an MoE model and
    is listed as not planned on one node.
    """
    steps = 2 if quick else 4
    m06 = MODELS["Qwen3-0.6B"]
    runs: list[Run] = []
    pairs: list[Pair] = []

    def add(model: Model, name: str, what: str, extra=(), env=None, epochs=1, per_epoch=steps) -> str:
        runs.append(
            Run(
                name=name,
                what=what,
                recipe=model.recipe,
                env_script=model.env_script,
                overrides=(*smoke_overrides(name, model, per_epoch, epochs), *extra),
                env={**FEATURE_ENV_OFF, "NNODES": "1", **(env or {})},
                model=model.name,
            )
        )
        return name

    base = add(m06, "0.6b-base", "the shipped recipe (ACL graphs with npugraph_ex) with engine GC on")
    eager = add(m06, "0.6b-eager", "eager rollout (no ACL graphs)", (f"{R}.enforce_eager=True",))
    pairs.append(Pair("graph mode (ACL graphs)", eager, base, f"{R}.enforce_eager=False (verl's default)"))
    if not quick:
        nge = add(m06, "0.6b-no-npugraph-ex", "ACL graphs without the npugraph_ex backend", (NPUGRAPH_EX,))
        switch = "ascend_compilation_config.enable_npugraph_ex=True (vllm-ascend's default)"
        pairs.append(Pair("npugraph_ex", nge, base, switch))
    sam = add(
        m06, "0.6b-sam", "SAM speculative decoding, 3 draft tokens",
        (f"+{SPEC}.method=sam", f"+{SPEC}.num_speculative_tokens=3"),
    )  # fmt: skip
    pairs.append(Pair("SAM speculative decoding", base, sam, f"{SPEC}.method=sam"))
    reb = add(m06, "0.6b-rebalance", "rollout rebalance", env={"ROLLOUT_REBALANCE_ENABLE": "1"})
    pairs.append(Pair("rollout rebalance", base, reb, "ROLLOUT_REBALANCE_ENABLE=1"))
    gc_off = add(m06, "0.6b-gc-off", "engine GC guard off", env={"NPU_RL_ENGINE_GC": "0"})
    pairs.append(Pair("engine GC guard", gc_off, base, "NPU_RL_ENGINE_GC=1"))
    per_epoch = max(steps // 2, 1)
    # The resampler learns from the last step: no worker processes prefetching batches (the preflight
    # refuses them with it); both arms alike.
    no_workers = ("data.dataloader_num_workers=0",)
    ep_a = add(m06, "0.6b-2ep", "two short epochs, verl's sampler", no_workers, epochs=2, per_epoch=per_epoch)
    ep_b = add(
        m06, "0.6b-2ep-resampler", "two short epochs, length-aware resampler",
        (*no_workers, "data.sampler.class_name=LengthAwareEpochSampler"), epochs=2, per_epoch=per_epoch,
    )  # fmt: skip
    pairs.append(Pair("length-aware resampler", ep_a, ep_b, "data.sampler.class_name=LengthAwareEpochSampler",
                      steps="last-epoch"))  # fmt: skip
    onp = (f"actor_rollout_ref.actor.ppo_mini_batch_size={m06.train_batch_size}",)
    op_a = add(m06, "0.6b-onpolicy", "one optimizer step per batch, old log-probs recomputed", onp)
    op_b = add(
        m06, "0.6b-onpolicy-skip", "one optimizer step per batch, old log-prob pass skipped",
        (*onp, "actor_rollout_ref.actor.recompute_old_log_prob=false"),
    )  # fmt: skip
    pairs.append(Pair("skip old-log-prob", op_a, op_b, "actor_rollout_ref.actor.recompute_old_log_prob=false"))
    if not quick:
        m8 = MODELS["Qwen3-8B"]
        b8 = add(m8, "8b-base", "the shipped Qwen3-8B recipe")
        e8 = add(m8, "8b-eager", "Qwen3-8B, eager rollout", (f"{R}.enforce_eager=True",))
        pairs.append(Pair("graph mode (ACL graphs), Qwen3-8B", e8, b8, f"{R}.enforce_eager=False"))
    not_planned = []
    if nnodes < 2:
        not_planned.append(
            ("all-to-all-v MoE reshard", "needs 2 nodes and an MoE model with expert parallelism (ALL_TO_ALL_RESHARD=1"
             "; docs/reshard.md); this suite runs on one node")
        )  # fmt: skip
    return Plan(tuple(runs), tuple(pairs), tuple(not_planned))


def load_plan(path: Path) -> Plan:
    """Read a plan written by :meth:`Plan.to_json` (``OUT/plan.json``, or a hand-written one).

    Raises:
        NpuRlError: the file is missing, not JSON, or a run/pair lacks a field (named with the file).
    """
    try:
        data = json.loads(path.read_text())
        runs = tuple(Run(**{**r, "overrides": tuple(r.get("overrides", ()))}) for r in data["runs"])
        pairs = tuple(Pair(**p) for p in data.get("pairs", ()))
        not_planned = tuple((str(a), str(b)) for a, b in data.get("not_planned", ()))
    except FileNotFoundError:
        raise NpuRlError(f"{path}: no such plan file") from None
    except (ValueError, KeyError, TypeError) as e:
        raise NpuRlError(f"{path}: not a plan written by the acceptance suite ({type(e).__name__}: {e})") from None
    names = [r.name for r in runs]
    if len(set(names)) != len(names):
        raise NpuRlError(f"{path}: run names must be unique, got {names}")
    for p in pairs:
        for side in (p.off, p.on):
            if side not in names:
                raise NpuRlError(f"{path}: pair {p.feature!r} names run {side!r}, which the plan does not have")
    return Plan(runs, pairs, not_planned)
