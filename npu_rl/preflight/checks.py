"""The checks verl does not do: batch arithmetic, parallel layout vs the model, lengths, resources, memory.

Each check reads the composed config through :func:`sel` and adds problems to a :class:`Report`; none
stops at the first finding. Rules follow the code that would fail at run time (cited per check).
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from npu_rl.preflight.model import ModelFacts
from npu_rl.preflight.report import Report

HBM_PER_DIE_GB = 64  # Atlas A3 (910C) die
HBM = f"{HBM_PER_DIE_GB} GiB per die (Atlas A3)"  # what the memory lines compare against
GB = 1024**3
A = "actor_rollout_ref.actor"
R = "actor_rollout_ref.rollout"


def check_values(cfg, report: Report, zero_train_batch: bool = False) -> bool:
    """Every number the other checks use must resolve and be in range; False (with errors) otherwise.

    Runs first so that ``trainer.n_gpus_per_node=auto`` or an unset ``${oc.env:...}`` becomes one
    finding naming the key instead of a crash in the arithmetic. ``zero_train_batch``: the fully-async
    trainer, whose ``data.train_batch_size`` is 0 (verl's own assert judges it).
    """
    from omegaconf import OmegaConf

    strategy = str(sel(cfg, f"{A}.strategy", "fsdp"))
    eng = f"{A}.{strategy}" if strategy in ("megatron", "mindspeed") else None
    positive = [
        "data.train_batch_size", "data.max_prompt_length", "data.max_response_length", "trainer.nnodes",
        "trainer.n_gpus_per_node", f"{R}.n", f"{A}.ppo_mini_batch_size", f"{A}.ppo_epochs",
        f"{R}.tensor_model_parallel_size", f"{R}.data_parallel_size", f"{R}.pipeline_model_parallel_size",
        f"{R}.expert_parallel_size", f"{R}.max_model_len", f"{R}.max_num_batched_tokens", f"{R}.max_num_seqs",
        f"{A}.ppo_micro_batch_size_per_gpu", f"{A}.ppo_max_token_len_per_gpu", f"{A}.ulysses_sequence_parallel_size",
        # 0 epochs trains nothing (verl's loop never starts; on Megatron its lr scheduler asserts
        # lr_decay_steps > 0 after Ray is up and the model placed); total_training_steps may be unset
        "trainer.total_epochs", "trainer.total_training_steps",
    ]  # fmt: skip
    if zero_train_batch:
        positive.remove("data.train_batch_size")
    if eng:
        positive += [
            f"{eng}.{k}_parallel_size"
            for k in (
                "tensor_model",
                "pipeline_model",
                "context",
                "expert_model",
                "expert_tensor",
                "virtual_pipeline_model",
            )
        ]
    ok = True
    for key in positive:
        try:
            value = OmegaConf.select(cfg, key, default=None, throw_on_resolution_failure=True)
        except Exception as e:  # noqa: BLE001 - OmegaConf's resolver errors vary
            report.error(key, f"does not resolve: {e}", "set it to a number (check the ${...} interpolation)")
            ok = False
            continue
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            report.error(key, f"= {value!r}; it must be a whole number >= 1", f"set {key} to a positive integer")
            ok = False
    # The same range as vLLM's CacheConfig (gt=0, le=1): checked here first because the memory estimate
    # needs the number; vLLM's own verdict comes later (npu_rl.preflight.libraries).
    util = sel(cfg, f"{R}.gpu_memory_utilization", 0.5)
    if isinstance(util, bool) or not isinstance(util, int | float) or not 0 < util <= 1:
        report.error(f"{R}.gpu_memory_utilization", f"= {util!r}; it must be a fraction in (0, 1]", "e.g. 0.85")
        ok = False
    return ok


def sel(cfg, key: str, default=None):
    """``cfg[key]`` for a dotted key with interpolations resolved; ``default`` when absent or unresolvable."""
    from omegaconf import OmegaConf

    value = OmegaConf.select(cfg, key, default=default, throw_on_resolution_failure=False)
    return default if value is None else value


def plain(node):
    """A config node as plain Python: an OmegaConf ``DictConfig``/``ListConfig`` resolved to dicts and
    lists, a mapping's values converted likewise, anything else (None, a scalar) as it is."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(node, DictConfig | ListConfig):
        return OmegaConf.to_container(node, resolve=True)
    if isinstance(node, Mapping):
        return {k: plain(v) for k, v in node.items()}
    return node


@dataclass(frozen=True)
class TrainLayout:
    """Training parallelism. ``dp`` = world / (TP·PP·CP) for Megatron engines, world / SP for FSDP."""

    engine: str
    section: str  # dotted prefix of the engine's parallel keys
    tp: int
    pp: int
    cp: int
    ep: int
    etp: int
    vpp: int
    world: int

    @property
    def dp(self) -> int:
        return self.world // (self.tp * self.pp * self.cp)


@dataclass(frozen=True)
class RolloutLayout:
    tp: int
    dp: int
    pp: int
    ep: int

    @property
    def replica(self) -> int:
        """Dies per rollout replica (verl: TP x DP x PP)."""
        return self.tp * self.dp * self.pp


def train_layout(cfg, world: int, role: str = A) -> TrainLayout:
    """The layout of the model trained under ``role`` (the actor's section, or ``critic``) on ``world`` dies."""
    strategy = str(sel(cfg, f"{role}.strategy", "fsdp"))
    if strategy in ("megatron", "mindspeed"):
        s = f"{role}.{strategy}"
        tp = int(sel(cfg, f"{s}.tensor_model_parallel_size", 1))
        return TrainLayout(
            engine=strategy,
            section=s,
            tp=tp,
            pp=int(sel(cfg, f"{s}.pipeline_model_parallel_size", 1)),
            cp=int(sel(cfg, f"{s}.context_parallel_size", 1)),
            ep=int(sel(cfg, f"{s}.expert_model_parallel_size", 1)),
            etp=int(sel(cfg, f"{s}.expert_tensor_parallel_size", tp)),
            vpp=int(sel(cfg, f"{s}.virtual_pipeline_model_parallel_size", 1)),
            world=world,
        )
    sp = int(sel(cfg, f"{role}.ulysses_sequence_parallel_size", 1))
    return TrainLayout(strategy, role, 1, 1, sp, 1, 1, 1, world)


def rollout_layout(cfg) -> RolloutLayout:
    return RolloutLayout(
        tp=int(sel(cfg, f"{R}.tensor_model_parallel_size", 1)),
        dp=int(sel(cfg, f"{R}.data_parallel_size", 1)),
        pp=int(sel(cfg, f"{R}.pipeline_model_parallel_size", 1)),
        ep=int(sel(cfg, f"{R}.expert_parallel_size", 1)),
    )


def check_resources(cfg, env: Mapping[str, str], report: Report) -> int:
    """Nodes x NPUs of the launcher vs ``trainer.nnodes x trainer.n_gpus_per_node``; returns the world size."""
    nnodes, per_node = int(sel(cfg, "trainer.nnodes", 1)), int(sel(cfg, "trainer.n_gpus_per_node", 8))
    world = nnodes * per_node
    env_nodes, env_npus = env.get("NNODES"), env.get("NPUS_PER_NODE")
    if env_nodes and env_npus and (int(env_nodes), int(env_npus)) != (nnodes, per_node):
        report.error(
            "trainer.nnodes, trainer.n_gpus_per_node",
            f"the recipe asks for {nnodes} x {per_node} = {world} dies, the launcher has NNODES={env_nodes} x "
            f"NPUS_PER_NODE={env_npus} = {int(env_nodes) * int(env_npus)}",
            "pass trainer.nnodes=$NNODES trainer.n_gpus_per_node=$NPUS_PER_NODE in the recipe (or fix the env)",
        )
    return world


def check_batches(cfg, lay: TrainLayout, report: Report) -> None:
    """verl 0.9 V1 trainer: mini-batch = ppo_mini_batch_size x n trajectories, split over actor DP
    (``engine_workers.py``: ``mini_batch_size % dp == 0``); micro batches split the per-die mini-batch."""
    tbs = int(sel(cfg, "data.train_batch_size", 0))
    n = int(sel(cfg, f"{R}.n", 1))
    mini = int(sel(cfg, f"{A}.ppo_mini_batch_size", 0))
    for key, v in (("data.train_batch_size", tbs), (f"{R}.n", n), (f"{A}.ppo_mini_batch_size", mini)):
        if v <= 0:
            report.error(key, f"= {v}; it must be > 0", f"set {key} to a positive integer")
    if tbs <= 0 or n <= 0 or mini <= 0:
        return
    if mini > tbs:
        report.error(
            f"{A}.ppo_mini_batch_size",
            f"ppo_mini_batch_size ({mini}) > data.train_batch_size ({tbs})",
            f"set ppo_mini_batch_size to a divisor of {tbs}",
        )
    elif tbs % mini:
        report.error(
            f"{A}.ppo_mini_batch_size",
            f"data.train_batch_size ({tbs}) is not a multiple of ppo_mini_batch_size ({mini}): "
            f"{tbs % mini} prompts per step would never be trained on",
            f"use a divisor of {tbs} for ppo_mini_batch_size",
        )
    how = f"{lay.world} dies / (TP {lay.tp} x PP {lay.pp} x CP {lay.cp})"
    traj = mini * n
    if traj % lay.dp:
        report.error(
            f"{A}.ppo_mini_batch_size",
            f"ppo_mini_batch_size ({mini}) x rollout.n ({n}) = {traj} trajectories per mini-batch do not split "
            f"evenly over actor DP {lay.dp} ({how})" + (": each DP rank would get 0" if traj < lay.dp else ""),
            f"make ppo_mini_batch_size x n a multiple of {lay.dp}{_example_mini(tbs, n, lay.dp)}, or change TP/PP/CP",
        )
        return
    per_die = traj // lay.dp
    if bool(sel(cfg, f"{A}.use_dynamic_bsz", False)):
        longest = int(sel(cfg, "data.max_prompt_length", 0)) + int(sel(cfg, "data.max_response_length", 0))
        keys = [f"{A}.ppo_max_token_len_per_gpu", f"{R}.log_prob_max_token_len_per_gpu"]
        if bool(sel(cfg, f"{A}.use_kl_loss", False)) or bool(sel(cfg, "algorithm.use_kl_in_reward", False)):
            keys.append("actor_rollout_ref.ref.log_prob_max_token_len_per_gpu")
        for key in keys:  # verl seqlen_balancing: max_token_len must hold the longest sequence
            max_tok = int(sel(cfg, key, 0) or 0)
            if max_tok and max_tok < longest:
                report.error(
                    key,
                    f"{max_tok} tokens < the longest trajectory (prompt + response = {longest}): fits no micro-batch",
                    f"set {key} >= {longest}",
                )
        return
    micro = sel(cfg, f"{A}.ppo_micro_batch_size_per_gpu")
    if micro is None:
        report.error(
            f"{A}.ppo_micro_batch_size_per_gpu",
            "not set and use_dynamic_bsz=false: verl cannot size its micro-batches",
            f"set {A}.ppo_micro_batch_size_per_gpu (a divisor of {per_die}) or {A}.use_dynamic_bsz=true",
        )
    elif int(micro) <= 0 or per_die % int(micro):
        report.error(
            f"{A}.ppo_micro_batch_size_per_gpu",
            f"{micro} does not divide the per-die mini-batch {per_die} (= {mini} x {n} / DP {lay.dp})",
            f"use a divisor of {per_die}",
        )


# (dynamic batch switch, the token budget it uses instead, the micro-batch keys it makes verl ignore):
# verl's engine workers size micro-batches by tokens when the switch is on (engine_workers.py:350-358, 404-412).
REF = "actor_rollout_ref.ref"
DYNAMIC_BATCH_KEYS = (
    (
        f"{A}.use_dynamic_bsz",
        f"{A}.ppo_max_token_len_per_gpu",
        ("ppo_micro_batch_size_per_gpu", "ppo_micro_batch_size"),
    ),
    (
        f"{R}.log_prob_use_dynamic_bsz",
        f"{R}.log_prob_max_token_len_per_gpu",
        ("log_prob_micro_batch_size_per_gpu", "log_prob_micro_batch_size"),
    ),
    (
        f"{REF}.log_prob_use_dynamic_bsz",
        f"{REF}.log_prob_max_token_len_per_gpu",
        ("log_prob_micro_batch_size_per_gpu", "log_prob_micro_batch_size"),
    ),
    (
        "critic.use_dynamic_bsz",
        "critic.ppo_max_token_len_per_gpu",
        ("ppo_micro_batch_size_per_gpu", "ppo_micro_batch_size"),
    ),
)


def check_ignored_batch_keys(cfg, report: Report) -> None:
    """Micro-batch sizes set under dynamic batch size are ignored (a warning); and the actor and its
    log-prob pass must agree on the switch."""
    for switch, tokens, leaves in DYNAMIC_BATCH_KEYS:
        if not bool(sel(cfg, switch, False)):
            continue
        for key in (f"{switch.rsplit('.', 1)[0]}.{leaf}" for leaf in leaves):
            if sel(cfg, key) is not None:
                report.warn(
                    key,
                    f"= {sel(cfg, key)} is ignored: {switch}=True sizes micro-batches by tokens ({tokens})",
                    f"drop {key}, or set {switch}=False to use it",
                )
    actor, log_prob = (bool(sel(cfg, k, False)) for k in (f"{A}.use_dynamic_bsz", f"{R}.log_prob_use_dynamic_bsz"))
    if actor != log_prob:
        # Stands in for verl's ActorRolloutRefWorker.init_model assertion (engine_workers.py:616), which runs
        # on the workers once the cluster is up.
        report.error(
            f"{R}.log_prob_use_dynamic_bsz",
            f"= {log_prob} but {A}.use_dynamic_bsz={actor}: verl's actor worker asserts they are equal",
            f"drop {R}.log_prob_use_dynamic_bsz (it follows {A}.use_dynamic_bsz by default)",
        )


def _example_mini(tbs: int, n: int, dp: int) -> str:
    """ " (e.g. ppo_mini_batch_size=M)" for the smallest divisor M of ``tbs`` with M x n a multiple of ``dp``."""
    for m in range(1, tbs + 1):
        if tbs % m == 0 and (m * n) % dp == 0:
            return f" (e.g. ppo_mini_batch_size={m})"
    return ""


def check_layout(
    cfg,
    lay: TrainLayout,
    roll: RolloutLayout,
    model: ModelFacts,
    npus_per_node: int,
    report: Report,
    rollout_world: int | None = None,
):
    """Parallel sizes vs the model and the devices. ``rollout_world``: the dies the rollout replicas tile
    (the rollout pool of a separate-pool trainer; default: the training world, colocated).

    Training (megatron-core): TP divides attention heads and KV heads (num_query_groups), PP (x VPP)
    divides layers unless an uneven split is configured, EP divides experts, TP·PP·CP divides the world
    and EP·ETP divides world/PP. Rollout (vLLM ``qwen3.py`` attention): TP divides attention heads,
    and KV heads are either split (KV % TP == 0) or replicated (TP % KV == 0); TP x DP x PP must tile
    the dies, a replica spanning nodes uses whole nodes, and verl requires EP = TP x DP when EP > 1.
    """
    s = lay.section
    if lay.engine in ("megatron", "mindspeed"):
        if model.heads % lay.tp:
            report.error(
                f"{s}.tensor_model_parallel_size", f"TP {lay.tp} does not divide {model.heads} attention heads"
            )
        if model.kv_heads % lay.tp:
            report.error(
                f"{s}.tensor_model_parallel_size",
                f"training TP {lay.tp} does not divide the {model.kv_heads} KV heads (megatron-core needs "
                "num_query_groups % TP == 0)",
                f"use a training TP that divides {model.kv_heads}",
            )
        uneven = any(
            sel(cfg, f"{s}.override_transformer_config.{k}") is not None
            for k in ("num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage")
        )
        if not uneven and model.layers % (lay.pp * lay.vpp):
            report.error(
                f"{s}.pipeline_model_parallel_size",
                f"PP {lay.pp}"
                + (f" x VPP {lay.vpp}" if lay.vpp > 1 else "")
                + f" does not divide {model.layers} layers",
                "choose a PP that divides the layer count, or set override_transformer_config."
                "num_layers_in_first/last_pipeline_stage",
            )
        elif uneven:
            first = int(sel(cfg, f"{s}.override_transformer_config.num_layers_in_first_pipeline_stage", 0) or 0)
            last = int(sel(cfg, f"{s}.override_transformer_config.num_layers_in_last_pipeline_stage", 0) or 0)
            middle_stages = lay.pp - (first > 0) - (last > 0)
            middle = model.layers - first - last
            if middle < 0 or (middle_stages > 0 and middle % middle_stages) or (middle_stages == 0 and middle):
                report.error(
                    f"{s}.override_transformer_config",
                    f"first {first} + last {last} layers leave {middle} for {middle_stages} middle stages of "
                    f"{model.layers} layers",
                    "make the stage sizes sum to the layer count",
                )
        if lay.world % (lay.tp * lay.pp * lay.cp):
            report.error(
                f"{s}.tensor_model_parallel_size",
                f"TP {lay.tp} x PP {lay.pp} x CP {lay.cp} does not divide {lay.world} dies",
            )
        if model.is_moe:
            if model.experts % lay.ep:
                report.error(f"{s}.expert_model_parallel_size", f"EP {lay.ep} does not divide {model.experts} experts")
            if (lay.world // lay.pp) % (lay.ep * lay.etp):
                report.error(
                    f"{s}.expert_model_parallel_size",
                    f"EP {lay.ep} x ETP {lay.etp} does not divide world/PP = {lay.world // lay.pp}",
                )
        elif lay.ep > 1:
            report.error(f"{s}.expert_model_parallel_size", f"EP {lay.ep} on a dense model (no experts)", "set it to 1")

    rk = f"{R}.tensor_model_parallel_size"
    # Attention heads % TP: vLLM's ModelConfig.verify_with_parallel_config (npu_rl.preflight.libraries).
    # KV heads: stands in for vLLM's Qwen3 attention (vllm/model_executor/models/qwen3.py:83-90), which
    # asserts it when the model is built on the devices.
    if model.kv_heads % roll.tp and roll.tp % model.kv_heads:
        report.error(
            rk,
            f"rollout TP {roll.tp} neither divides nor is a multiple of {model.kv_heads} KV heads (vLLM's Qwen3 "
            "attention asserts one or the other when it builds the model)",
            f"use a TP that divides {model.kv_heads} or is a multiple of it",
        )
    elif roll.tp > model.kv_heads:
        report.warn(
            rk,
            f"rollout TP {roll.tp} > {model.kv_heads} KV heads: vLLM replicates each KV head on "
            f"{roll.tp // model.kv_heads} dies, so every die caches 1 KV head per layer",
            f"TP {model.kv_heads} with data_parallel_size x{roll.tp // model.kv_heads} holds more KV per die",
        )
    # Replica placement: verl's resource pool hands each replica TP x DP x PP consecutive dies, and
    # RolloutReplica.__init__ (verl/workers/rollout/replica.py:114-118) asserts whole nodes per replica.
    rw = lay.world if rollout_world is None else rollout_world
    if roll.replica > rw or rw % roll.replica:
        report.error(
            rk,
            f"a rollout replica is TP {roll.tp} x DP {roll.dp} x PP {roll.pp} = {roll.replica} dies, which does "
            f"not tile {rw} dies"
            + (" (the rollout pool: rollout.nnodes x rollout.n_gpus_per_node)" if rollout_world else ""),
            f"choose TP x DP x PP dividing {rw}",
        )
    elif roll.replica > npus_per_node and roll.replica % npus_per_node:
        report.error(
            rk,
            f"a {roll.replica}-die rollout replica spans nodes of {npus_per_node} dies unevenly",
            "use a replica size that divides a node or is a multiple of it",
        )
    # EP = TP x DP: verl's RolloutConfig.__post_init__ (npu_rl.preflight.libraries).
    if roll.ep > 1:
        if not model.is_moe:
            report.warn(
                f"{R}.expert_parallel_size",
                f"EP {roll.ep} on a dense model: vLLM's expert parallelism has no experts to place here (ignored)",
                "set it to 1",
            )
        elif model.experts % roll.ep:
            report.warn(
                f"{R}.expert_parallel_size",
                f"rollout EP {roll.ep} does not divide {model.experts} experts: ranks hold unequal expert counts",
            )


def check_reshard_settings(cfg, env: Mapping[str, str], report: Report) -> None:
    """The reshard's tuning variables parse as the weight sync will parse them, and nothing in the recipe
    makes the sync drop or mis-send a switched-on reshard: the same rules the weight sync raises on at run
    time (:func:`npu_rl.reshard.hook.sync_problems`, :func:`~npu_rl.reshard.hook.engine_problems`): the
    colocated ``checkpoint_engine.backend=naive``, a vLLM rollout, the Megatron engine with
    ``vanilla_mbridge=True`` (verl's default, Megatron-Bridge, ignores it), no EPLB, redundant experts,
    expert map file or non-linear expert placement (the planner sends vLLM's linear expert map)."""
    from npu_rl.errors import NpuRlError
    from npu_rl.reshard.hook import BUCKET_MB, OVERLAP, engine_problems, reshard_settings, sync_problems

    for key in (BUCKET_MB, OVERLAP):  # one at a time, so that both are reported
        try:
            reshard_settings({key: env[key]} if key in env else {})
        except NpuRlError as e:
            report.error(key, str(e))
    problems = sync_problems(sel(cfg, R, {}) or {})
    strategy = str(sel(cfg, f"{A}.strategy", "fsdp"))
    problems += engine_problems(strategy, bool(sel(cfg, f"{A}.{strategy}.vanilla_mbridge", False)))
    for key, msg, fix in problems:
        report.error(key, f"ALL_TO_ALL_RESHARD is on, but {msg}", fix)


def check_reshard_layout(lay: TrainLayout, roll: RolloutLayout, model: ModelFacts, report: Report) -> None:
    """The all-to-all-v reshard's planner accepts the train and rollout layouts (npu_rl.reshard.plan)."""
    from npu_rl.reshard import plan

    key = "ALL_TO_ALL_RESHARD"
    if not model.is_moe:
        report.error(key, "the reshard moves MoE experts; this model is dense", "unset ALL_TO_ALL_RESHARD")
        return
    if lay.engine not in ("megatron", "mindspeed"):
        return  # check_reshard_settings names the engine (actor_rollout_ref.actor.strategy); no Megatron layout here
    train = plan.TrainLayout(world=lay.world, tp=lay.tp, pp=lay.pp, ep=lay.ep, etp=lay.etp, cp=lay.cp)
    rollout = plan.RolloutLayout(tp=roll.tp, dp=roll.dp, pp=roll.pp, ep=roll.ep)
    for where, msg, fix in plan.layout_problems(train, rollout, model.experts, model.moe_intermediate or None):
        report.error(key, f"{where}: {msg}", fix or "choose layouts the reshard planner accepts (docs/reshard.md)")


def check_lengths(cfg, model: ModelFacts, report: Report) -> dict[str, int]:
    """prompt + response <= rollout max_model_len: no library knows both (verl caps each request's
    max_tokens at ``max_model_len - len(prompt)``, silently cutting responses of long prompts).

    The other length rules are the libraries' own (npu_rl.preflight.libraries): max_model_len vs the
    model (verl's ``vLLMHttpServer._validate_configs``, vLLM's ``ModelConfig``), max_num_batched_tokens
    vs max_model_len without chunked prefill and vs max_num_seqs (vLLM's ``SchedulerConfig``)."""
    p, r = int(sel(cfg, "data.max_prompt_length", 0)), int(sel(cfg, "data.max_response_length", 0))
    mml_set = sel(cfg, f"{R}.max_model_len")
    mml = int(mml_set) if mml_set is not None else model.max_position_embeddings  # verl's default
    mpe = model.max_position_embeddings
    if p + r > mml:
        report.error(
            f"{R}.max_model_len",
            f"data.max_prompt_length ({p}) + data.max_response_length ({r}) = {p + r} > max_model_len ({mml}): "
            "responses to long prompts would be cut short of max_response_length",
            f"set {R}.max_model_len={p + r}" + (f" (<= max_position_embeddings {mpe})" if p + r <= mpe else "")
            if p + r <= mpe
            else f"shorten prompt/response to fit max_position_embeddings {mpe}, or give the model rope scaling "
            "(override_config for the trainer and engine_kwargs.vllm.hf_overrides for vLLM)",
        )
    return {"prompt": p, "response": r, "max_model_len": mml, "max_position_embeddings": mpe}


@dataclass(frozen=True)
class MemoryEstimate:
    """Per-die HBM (GiB) by part. Activations and fragmentation are not modelled; the ACL graph pool is the
    fast path's estimate (:attr:`npu_rl.preflight.fastpath.FastPath.graph_gib`), 0 without graphs."""

    train_weights: float
    train_grads: float
    train_optimizer: float
    resident_in_rollout: float  # training state not offloaded while vLLM runs
    rollout_weights: float
    kv_budget: float
    kv_tokens: int  # tokens of KV cache one rollout replica holds
    resident_keys: tuple[str, ...] = ()  # the offload switches that are off while their state is on the die
    sharded_optimizer: bool = True  # Megatron's distributed optimizer (FSDP always shards)
    graph: float = 0.0  # the rollout's ACL graph pool: outside gpu_memory_utilization, kept through sleep
    critic: TrainState | None = None  # the value model's state on the same dies (GAE, critic.enable)

    @property
    def train_total(self) -> float:
        return self.train_weights + self.train_grads + self.train_optimizer

    @property
    def critic_resident(self) -> float:
        """The critic's state that stays on the die while the actor trains and vLLM runs (GiB)."""
        return self.critic.resident if self.critic else 0.0

    @property
    def resident_keys_all(self) -> tuple[str, ...]:
        """The offload switches, actor's and critic's, that are off while their state is on the die."""
        return self.resident_keys + (self.critic.resident_keys if self.critic else ())

    def training_peak(self) -> tuple[float, str, tuple[str, ...]]:
        """The larger update phase: (GiB per die before activations, what it holds, the offload switches
        that would lower it). Colocated models share the dies: while one updates, the other's state that
        is not offloaded stays beside it."""
        actor = (
            f"weights {self.train_weights:.1f} + grads {self.train_grads:.1f} + optimizer "
            f"{self.train_optimizer:.1f} = {self.train_total:.1f} GiB"
        )
        if self.critic is None:
            return self.train_total, actor, ()
        c = self.critic
        in_actor = self.train_total + c.resident
        in_critic = c.total + self.resident_in_rollout
        if in_critic > in_actor:
            text = (
                f"the critic's update: its weights {c.weights:.1f} + grads {c.grads:.1f} + optimizer "
                f"{c.optimizer:.1f} = {c.total:.1f} GiB + the actor's {self.resident_in_rollout:.1f} GiB left on "
                f"the die = {in_critic:.1f} GiB"
            )
            return in_critic, text, self.resident_keys
        text = f"the actor's update: {actor} + the critic's {c.resident:.1f} GiB left on the die = {in_actor:.1f} GiB"
        return in_actor, text, c.resident_keys


@dataclass(frozen=True)
class TrainState:
    """One trained model's per-die state (GiB): bf16 weights, fp32 gradients, the optimizer's fp32 master
    and moments, and what of it stays on the die between its updates (its offload switches off)."""

    weights: float
    grads: float
    optimizer: float
    resident: float
    resident_keys: tuple[str, ...]
    sharded_optimizer: bool
    layout: TrainLayout | None = None

    @property
    def total(self) -> float:
        return self.weights + self.grads + self.optimizer


def train_state(cfg, lay: TrainLayout, dense: float, expert: float) -> TrainState:
    """Per-die state of a model of ``dense`` + ``expert`` parameters trained in layout ``lay`` (its
    ``section`` is the role's engine section, or the role itself for FSDP): bf16 weights, fp32 gradients,
    fp32 AdamW master + 2 moments (12 B/param, sharded over DP with the distributed optimizer), and the
    offload switches of verl 0.9.1's engine configs (``<role>.fsdp_config`` for the actor,
    ``critic.fsdp`` for the critic, ``<role>.megatron`` for Megatron)."""
    if lay.engine in ("megatron", "mindspeed"):
        on_die = dense / (lay.tp * lay.pp) + expert / (lay.ep * lay.etp * lay.pp)
        expert_dp = max(lay.world // (lay.ep * lay.etp * lay.pp), 1)
        sharded = bool(sel(cfg, f"{lay.section}.use_distributed_optimizer", True))
        opt_params = dense / (lay.tp * lay.pp) / (lay.dp if sharded else 1) + expert / (lay.ep * lay.etp * lay.pp) / (
            expert_dp if sharded else 1
        )
        section, role = lay.section, lay.section.rsplit(".", 1)[0]
    else:  # FSDP shards everything over the world
        on_die = (dense + expert) / lay.world
        opt_params = on_die
        role = lay.section
        sharded, section = True, (f"{A}.fsdp_config" if role == A else f"{role}.fsdp")
    # verl 0.9.1: param_offload releases the gradient buffers too (there is no grad_offload any more)
    switches = {"param": f"{section}.param_offload", "grad": f"{section}.param_offload"}
    switches["optimizer"] = f"{section}.optimizer_offload"
    offload = {part: bool(sel(cfg, key, False)) for part, key in switches.items()}
    w, g, o = on_die * 2 / GB, on_die * 4 / GB, opt_params * 12 / GB
    # megatron-core's HybridDeviceOptimizer (optimizer/__init__.py: optimizer_cpu_offload) keeps the share
    # optimizer_offload_fraction (its default 0.0) of the master weights and moments on the host, and steps there
    host = sel(cfg, f"{role}.optim.override_optimizer_config", None) or {}
    if lay.engine in ("megatron", "mindspeed") and host.get("optimizer_cpu_offload"):
        o *= 1 - min(max(float(host.get("optimizer_offload_fraction", 0.0) or 0.0), 0.0), 1.0)
    resident = (0 if offload["param"] else w) + (0 if offload["grad"] else g) + (0 if offload["optimizer"] else o)
    resident_keys = tuple(dict.fromkeys(key for part, key in switches.items() if not offload[part]))
    return TrainState(w, g, o, resident, resident_keys, sharded, lay)


def value_model_params(model: ModelFacts) -> tuple[int, int]:
    """(dense, expert) parameters of verl's critic built from ``model``: the backbone with a 1-output
    value head in place of the vocabulary head (``AutoModelForTokenClassification``, num_labels=1)."""
    dense, expert = model.params()
    return dense - (0 if model.tied_embeddings else model.vocab * model.hidden) + model.hidden, expert


def estimate_memory(
    cfg,
    lay: TrainLayout,
    roll: RolloutLayout,
    model: ModelFacts,
    graph: float = 0.0,
    critic: tuple[TrainLayout, ModelFacts] | None = None,
) -> MemoryEstimate:
    """Per-die estimate: the actor's state (:func:`train_state`), vLLM weights over rollout TP (experts
    over EP), KV budget = gpu_memory_utilization x HBM - rollout weights; ``graph`` is the rollout's ACL
    graph pool (GiB per die), which vllm-ascend allocates after the KV cache, outside
    gpu_memory_utilization's share, and which sleep mode keeps (its allocator offloads or discards only
    the weights and KV cache). ``critic``: the critic's layout and the model it is built from, trained
    on the same dies (:func:`value_model_params`)."""
    dense, expert = model.params()
    actor = train_state(cfg, lay, dense, expert)
    ep_split = roll.tp * roll.dp if roll.ep > 1 else roll.tp
    rw = (dense / roll.tp + expert / ep_split) * 2 / GB
    util = float(sel(cfg, f"{R}.gpu_memory_utilization", 0.5))
    kv_budget = util * HBM_PER_DIE_GB - rw
    kv_heads_per_die = max(model.kv_heads // roll.tp, 1)
    per_token = 2 * model.layers * kv_heads_per_die * model.head_dim * 2  # K and V, bf16, one die
    kv_tokens = int(max(kv_budget, 0) * GB / per_token) if per_token else 0
    value = train_state(cfg, critic[0], *value_model_params(critic[1])) if critic else None
    return MemoryEstimate(
        actor.weights,
        actor.grads,
        actor.optimizer,
        actor.resident,
        rw,
        kv_budget,
        kv_tokens,
        actor.resident_keys,
        actor.sharded_optimizer,
        graph,
        value,
    )


def check_memory(
    cfg,
    est: MemoryEstimate,
    lengths: Mapping[str, int],
    report: Report,
    lay: TrainLayout | None = None,
    separate_pools: bool = False,
):
    """The per-die estimate against the HBM of an A3 die. A phase the estimate alone puts over the HBM
    fails at run time (an error); training within 10% of it, before activations, is a warning.
    ``separate_pools``: training and rollout dies differ (nothing of training stays beside vLLM, and the
    rollout's ACL graph pool is on the rollout's dies)."""
    hbm = HBM_PER_DIE_GB
    if separate_pools:
        # the training dies hold no graph pool; the rollout dies hold no training state
        report_graph = est.graph
        est = dataclasses.replace(est, graph=0.0)
    peak, train, offload_keys = est.training_peak()
    train += " per die before activations"
    if est.graph:
        train += f" + the rollout's ACL graph pool ~{est.graph:.2f} GiB (kept through sleep)"
    if peak + est.graph > hbm * 0.9:
        # shard the larger of the two states further (a critic left at TP 1 beside a TP 8 actor, say)
        larger = est.critic.layout if est.critic and est.critic.total > est.train_total else lay
        if larger is not None and larger.engine in ("megatron", "mindspeed"):
            fix = f"raise {larger.section}.tensor/pipeline/expert_model_parallel_size"
            if larger is not lay:
                fix += f" (the critic's state is the larger: TP {larger.tp} x PP {larger.pp})"
        else:
            fix = "train on more dies, or with model_engine=megatron (TP/PP/EP shard the model further)"
        if not est.sharded_optimizer:
            fix += f", and turn the distributed optimizer on ({lay.section}.use_distributed_optimizer=True)"
        if offload_keys:  # the other model's state left beside the update
            fix += ", or " + ", ".join(f"set {k}=True" for k in offload_keys)
        if peak + est.graph > hbm:
            report.error(
                "memory (training)",
                f"{train}: {(peak + est.graph) / hbm:.1f}x the {HBM}, the update cannot fit",
                fix,
            )
        else:
            report.warn(
                "memory (training)",
                f"{train}, within 10% of the {HBM}: activations will not fit beside it",
                fix,
            )
    util = float(sel(cfg, f"{R}.gpu_memory_utilization", 0.5))
    key = f"{R}.gpu_memory_utilization"
    if separate_pools:
        est = dataclasses.replace(est, graph=report_graph, resident_in_rollout=0.0, resident_keys=(), critic=None)
    resident = est.resident_in_rollout + est.critic_resident
    if resident + util * hbm + est.graph > hbm:
        room = max(int((hbm - resident - est.graph) / hbm * 100) / 100, 0)
        fixes = [f"set {k}=True" for k in est.resident_keys_all]
        fixes.append(f"lower {key} to {room:g}" if room > 0 else "shard the training state over more dies")
        whose = (
            f" (actor {est.resident_in_rollout:.1f} + critic {est.critic_resident:.1f})" if est.critic_resident else ""
        )
        report.error(
            key,
            f"vLLM asks for {util} x {HBM} = {util * hbm:.1f} GiB while {resident:.1f} GiB of "
            f"training state{whose} stays on the die (not offloaded)"
            + (f" and its ACL graph pool needs ~{est.graph:.2f} GiB beside it" if est.graph else "")
            + ": vLLM refuses to start when less HBM is free than gpu_memory_utilization asks for",
            ", or ".join(fixes),
        )
    if est.kv_budget <= 0:
        report.error(
            key,
            f"vLLM's share {util} x {HBM} cannot hold its weights ({est.rollout_weights:.1f} GiB per die): "
            "no KV cache is left and vLLM will refuse to start",
            "raise rollout TP (or EP for MoE)" + (f" or {key}" if util < 1 else ""),
        )
    elif est.kv_tokens < lengths["max_model_len"]:
        report.error(
            key,
            f"KV budget {est.kv_budget:.1f} GiB per die (= {util} x {HBM} - weights {est.rollout_weights:.1f}) "
            f"holds {est.kv_tokens} tokens, less than one max_model_len ({lengths['max_model_len']}) sequence: "
            "vLLM will refuse to start",
            "raise rollout TP" + (f" or {key}" if util < 1 else "") + f", or lower {R}.max_model_len",
        )


def check_skip_old_log_prob(cfg, report: Report) -> None:
    """``recompute_old_log_prob=false`` is exact only for one on-policy optimizer step per batch; the
    rules are :func:`npu_rl.onpolicy.problems` (the patched ``validate_config`` runs the same ones)."""
    from npu_rl.onpolicy import problems

    for key, message, fix in problems(cfg):
        report.error(key, message, fix)


def check_random_init(cfg, report: Report) -> None:
    """Random init keeps Megatron's initial weights: the rollout must not load a checkpoint either
    (``load_format=dummy``), and rewards mean nothing (throughput runs only)."""
    fmt = str(sel(cfg, f"{R}.load_format", "dummy"))
    if fmt != "dummy":
        report.error(
            "NPU_RL_RANDOM_INIT",
            f"random init is on but {R}.load_format={fmt}: vLLM would load weights the model folder lacks",
            f"set {R}.load_format=dummy (the trainer's weights reach vLLM at the first sync)",
        )
    report.warn("NPU_RL_RANDOM_INIT", "random init: rewards and accuracy are meaningless; measure throughput only")


def registered_reward_managers() -> set[str]:
    """Names registered with ``@register("...")`` in the installed verl's reward managers (read, not imported)."""
    from npu_rl.preflight.compose import verl_package_dir

    root = verl_package_dir()
    names = set()
    for folder in ("experimental/reward_loop/reward_manager", "workers/reward_manager"):
        for py in (root / folder).glob("*.py"):
            names.update(re.findall(r'@register\("([\w-]+)"\)', py.read_text()))
    return names


def check_reward_and_dapo(cfg, report: Report) -> None:
    """Reward manager name exists; DAPO dynamic sampling as verl 0.9.1's V1 trainer reads it
    (``trainer_base.py``: ``data.gen_batch_size`` forced to 1, ``max_num_gen_batches`` ignored,
    ``max_inflight_gen_batches`` bounds the concurrent generation batches, a metric is required)."""
    key = "reward.reward_manager.name"
    if str(sel(cfg, "reward.reward_manager.source", "register")) == "register":
        name, names = str(sel(cfg, key, "naive")), registered_reward_managers()
        if names and name not in names:
            close = difflib.get_close_matches(name, sorted(names), n=1)
            report.error(
                key,
                f"'{name}' is not a registered reward manager ({', '.join(sorted(names))})",
                f"did you mean {close[0]}?" if close else "",
            )
    fg = "algorithm.filter_groups"
    if not bool(sel(cfg, f"{fg}.enable", False)) or not bool(sel(cfg, "trainer.use_v1", True)):
        return
    if not sel(cfg, f"{fg}.metric"):
        report.error(f"{fg}.metric", "group filtering is on but no metric is set", f"set {fg}.metric=acc")
    inflight = sel(cfg, f"{fg}.max_inflight_gen_batches", 1)
    if not isinstance(inflight, int) or inflight < 1:
        report.error(f"{fg}.max_inflight_gen_batches", f"= {inflight!r}; it must be >= 1", "e.g. 2")
    gen = sel(cfg, "data.gen_batch_size")
    if gen not in (None, 1):
        report.warn(
            "data.gen_batch_size", f"= {gen}: verl's V1 trainer overrides it to 1 with group filtering", "drop it"
        )
    if int(sel(cfg, f"{fg}.max_num_gen_batches", 0) or 0) > 0:
        report.warn(
            f"{fg}.max_num_gen_batches",
            "is ignored by verl 0.9.1's V1 trainer",
            f"bound concurrent generation with {fg}.max_inflight_gen_batches",
        )


#: What verl's reward-loop ``DAPORewardManager`` reads below ``reward.reward_kwargs`` (the rule's tests
#: build the pinned manager from a composed config, so a rename upstream fails them).
OVERLONG_READ = (
    "max_resp_len",
    "overlong_buffer_cfg.enable",
    "overlong_buffer_cfg.len",
    "overlong_buffer_cfg.penalty_factor",
    "overlong_buffer_cfg.log",
)


def _flat_keys(d, prefix: str = "") -> list[str]:
    out = []
    for k, v in d.items():
        out += _flat_keys(v, f"{prefix}{k}.") if isinstance(v, dict) and v else [f"{prefix}{k}"]
    return out


def check_poll_interval(cfg, report: Report, trainer: str = "sync") -> None:
    """``trainer.v1.sampler.poll_interval`` (verl patch 0011, ``replay-buffer-poll``): the seconds between
    the V1 replay buffer's polls for finished samples (verl's 2.0 when unset). Only ``main_ppo``'s V1
    trainers build that buffer: with another trainer the key would be silently unread (a warning); a
    value that is not a number above 0 would stop the trainer at start-up (an error here, minutes
    earlier)."""
    key = "trainer.v1.sampler.poll_interval"
    value = sel(cfg, key)
    if value is None:
        return
    if trainer != "sync":
        report.warn(key, f"only main_ppo's V1 trainers read it; the {trainer} trainer never does", "drop it")
        return
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = None
    if seconds is None or isinstance(value, bool) or not seconds > 0:
        report.error(key, f"must be a number of seconds above 0, got {value!r}", f"write {key}=0.2 (verl's own: 2.0)")


# The package each of verl's tracker backends imports when the trainer builds it (verl 0.9.1
# verl/utils/tracking.py, Tracking.__init__ and its adapters); verl itself judges the names
# (Tracking.supported_backend). console and file need nothing beyond verl.
TRACKER_PACKAGES = {
    "wandb": "wandb",
    "tracking": "wandb",  # verl's deprecated alias of wandb
    "mlflow": "mlflow",
    "swanlab": "swanlab",
    "vemlp_wandb": "volcengine_ml_platform",
    "tensorboard": "tensorboard",  # torch.utils.tensorboard.SummaryWriter (_TensorboardAdapter)
    "clearml": "clearml",
    "trackio": "trackio",
    "rl_insight": "rl_insight",
}


def check_trackers(cfg, report: Report) -> str:
    """``trainer.logger``: every backend is one verl's ``Tracking`` knows, and its package is importable
    in this environment (the preflight runs in the job's Python): verl imports it in ``fit()``, after
    the workers have placed and loaded the model, and a missing one stops the run there. Returns the
    plan line."""
    from verl.utils.tracking import Tracking

    key = "trainer.logger"
    value = sel(cfg, key, "console")
    backends = [value] if isinstance(value, str) else [str(b) for b in (plain(value) or [])]
    known = [*Tracking.supported_backend, "tracking"]
    missing = []
    for b in backends:
        if b not in known:
            report.error(key, f"{b!r} is not a tracker verl knows ({', '.join(Tracking.supported_backend)})")
        elif TRACKER_PACKAGES.get(b) and importlib.util.find_spec(TRACKER_PACKAGES[b]) is None:
            missing.append(b)
            default = " (verl's default trainer.logger has it)" if plain(value) == plain(verl_default(key)) else ""
            report.error(
                key,
                f"{b!r}{default} needs the Python package {TRACKER_PACKAGES[b]!r}, which this environment lacks: "
                "verl imports it when training starts, after the model is loaded, and the run stops there",
                f"pip install {TRACKER_PACKAGES[b]} into the job's environment, or log to a tracker that needs "
                'no package and no account: trainer.logger=\'["console","file"]\' (verl\'s JSONL file, '
                "VERL_FILE_LOGGER_PATH)",
            )
    if not backends:
        return "none (trainer.logger is empty: no step metrics are kept)"
    return ", ".join(b + (" (package missing)" if b in missing else "") for b in backends)


def lifecycle_plan(cfg, report: Report) -> list[tuple[str, str]]:
    """Plan lines of what protects and shows the run: checkpoints (frequency, folder, retention, where
    it resumes: :func:`resume_plan`, whose error goes to ``report``) and validation (frequency, before
    training). :func:`check_checkpoint_storage` replaces the checkpoints line when the model's size is known."""
    save = int(sel(cfg, "trainer.save_freq", -1) or -1)
    if save > 0:
        keep = sel(cfg, "trainer.max_actor_ckpt_to_keep", None)
        folder = checkpoint_folder(cfg)
        ckpt = (
            f"every {save} step(s) to {folder}, keeping "
            + (f"the last {keep}" if keep else "all (trainer.max_actor_ckpt_to_keep unset)")
            + f"; {resume_plan(cfg, folder, report)}"
        )
    else:
        ckpt = "never (trainer.save_freq <= 0): a failure loses the run"
    return [("checkpoints", ckpt), ("validation", validation_plan(cfg))]


def validation_plan(cfg) -> str:
    """The plan's validation line: how often verl's ``test_freq`` validates, and before training."""
    test = int(sel(cfg, "trainer.test_freq", -1) or -1)
    before = bool(sel(cfg, "trainer.val_before_train", True))
    if test > 0:
        val = f"every {test} step(s)" + (", and before training" if before else "")
    else:
        val = "before training only" if before else "never (trainer.test_freq <= 0)"
    return val


#: Bytes a checkpoint keeps per actor parameter, by what verl's ``checkpoint.save_contents`` names and
#: the training engine: FSDP saves its sharded fp32 parameters (4) and AdamW's two fp32 moments (8);
#: Megatron's distributed checkpoint saves the bf16 parameters (2) and the optimizer's fp32 main
#: parameters and moments (12); ``hf_model`` adds a bf16 Hugging Face copy (2). ``extra`` (RNG,
#: scheduler, the dataloader) is small. An estimate: the shipped recipes' real sizes were never measured.
CKPT_BYTES = {
    "fsdp": {"model": 4, "optimizer": 8, "hf_model": 2},
    "megatron": {"model": 2, "optimizer": 12, "hf_model": 2},
}


def _existing_parent(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def checkpoint_folder(cfg, cwd: Path | None = None) -> Path:
    """``trainer.default_local_dir`` as verl's trainer will use it: a relative path is relative to the
    recipe's working directory (``cwd``; default this process's)."""
    raw = str(sel(cfg, "trainer.default_local_dir", "checkpoints"))
    return Path(raw) if Path(raw).is_absolute() else (cwd or Path.cwd()) / raw


def resume_plan(cfg, folder: Path, report: Report) -> str:
    """Where the run will start, as verl's ``_load_checkpoint`` will decide it: ``resume_mode auto``
    loads the checkpoint that ``FOLDER/latest_checkpointed_iteration.txt`` names, found by verl's own
    ``find_latest_ckpt_path``; ``resume_path`` loads ``trainer.resume_from_path``; ``disable`` starts over.

    Error: the tracker file exists but verl finds no checkpoint from it: a number that is no
    ``global_step_N`` folder there (verl would print a line, train from step 0 and overwrite the
    folder's checkpoints at its first save), or no number (verl's resume raises after the workers
    started). Nothing is deleted here.
    Returns the plan's words ("resume_mode auto: resumes from global_step_6 (FOLDER/global_step_6)").
    """
    import contextlib
    import io

    mode = str(sel(cfg, "trainer.resume_mode", "auto"))
    if mode == "disable":
        return "resume_mode disable: starts from step 0"
    if mode == "resume_path":
        return f"resume_mode resume_path: resumes from {sel(cfg, 'trainer.resume_from_path', None)}"
    tracker = folder / "latest_checkpointed_iteration.txt"
    if not tracker.is_file():
        return f"resume_mode {mode}: starts from step 0 (no checkpoint in the folder yet)"
    from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path

    found = None
    with contextlib.redirect_stdout(io.StringIO()):
        with contextlib.suppress(ValueError):
            found = find_latest_ckpt_path(str(folder))
    if found is None:
        text = tracker.read_text(errors="replace").strip()[:40]
        what = (
            f"but {folder} holds no global_step_{text} folder: verl would train from step 0 and overwrite this "
            "folder's checkpoints at its first save"
            if text.isdigit()
            else "which is not a step number: verl's resume stops on it after the workers have started"
        )
        report.error(
            "trainer.default_local_dir",
            f"{tracker} names checkpoint {text!r}, {what}",
            "restore that checkpoint folder, write the step of one that exists into the file, or start over on "
            "purpose with trainer.resume_mode=disable (or another trainer.experiment_name)",
        )
        return f"resume_mode {mode}: no checkpoint found from {tracker.name} ({text!r})"
    return f"resume_mode {mode}: resumes from {Path(found).name} ({found})"


def check_checkpoint_storage(
    cfg, engine: str, params: int, report: Report, dry_run: bool = False, cwd: Path | None = None
) -> str | None:
    """The checkpoint folder of a run that saves (``trainer.save_freq`` > 0): where it is, what one
    checkpoint of the actor costs (:data:`CKPT_BYTES` x ``params``), how many verl keeps at most at
    once (``max_actor_ckpt_to_keep``: it removes the oldest before a save when keeping 2 or more, after
    it when keeping 1), and whether the folder's file system can take them.

    ``engine``: the training engine (``fsdp``, ``fsdp2``, ``megatron``, ``mindspeed``); ``params``: the
    actor's parameter count; ``cwd``: what a relative ``trainer.default_local_dir`` is relative to (the
    recipe's working directory; default this process's).

    Errors: the folder (or the nearest folder above it that exists) is not a writable directory; its
    file system has less free space than one checkpoint. Warning: less than the checkpoints kept at once.
    With ``dry_run`` (``ray_start_npu.sh --dry-run``: maybe not on the cluster) the errors are warnings
    that say so: the folder and its space are the head's, judged again before the real run.
    Returns the plan's checkpoints line, or None when the run does not save.
    """
    import os
    import shutil

    save = int(sel(cfg, "trainer.save_freq", -1) or -1)
    if save <= 0:
        return None
    key = "trainer.default_local_dir"
    raw = str(sel(cfg, key, "checkpoints"))
    folder = checkpoint_folder(cfg, cwd)
    contents = plain(sel(cfg, f"{A}.checkpoint.save_contents", ["model", "optimizer", "extra"])) or []
    table = CKPT_BYTES["megatron" if engine in ("megatron", "mindspeed") else "fsdp"]
    size = params * sum(table.get(c, 0) for c in contents)
    keep = sel(cfg, "trainer.max_actor_ckpt_to_keep", None)
    steps = sel(cfg, "trainer.total_training_steps", None)
    saves = int(steps) // save if steps else None
    if keep:
        at_once = max(int(keep), 2) if saves is None else min(max(int(keep), 2), max(saves, 1))
        kept = f"keeping the last {keep} ({at_once} at once while saving)"
    else:
        at_once = saves
        kept = "keeping all (trainer.max_actor_ckpt_to_keep unset)" + (f": {saves} by the last step" if saves else "")
    base = _existing_parent(folder)
    refuse, where = (
        (report.warn, " here (a dry run, maybe not on the head: checked again before the run)")
        if dry_run
        else (report.error, "")
    )
    line = (
        f"every {save} step(s) to {folder}, {kept}; {resume_plan(cfg, folder, report)}; "
        f"~{size / GB:.1f} GiB each ({'+'.join(contents)}, {engine}; estimate)"
    )
    if not base.is_dir() or not os.access(base, os.W_OK | os.X_OK):
        refuse(
            key,
            f"= {raw}: {base} is not a directory this user can write{where}, so the first checkpoint (step {save}) "
            "would fail after that many steps of work",
            "point it at a writable folder on shared storage (the same path on every node)",
        )
        return line
    free = shutil.disk_usage(base).free
    line += f"; {free / GB:.0f} GiB free at {base}"
    if size > free:
        refuse(
            key,
            f"{base} has {free / GB:.1f} GiB free{where}, less than one checkpoint (~{size / GB:.1f} GiB): the save at "
            f"step {save} would fail",
            "free space there, point trainer.default_local_dir at a larger file system, or save fewer contents "
            f"({A}.checkpoint.save_contents)",
        )
    elif at_once and size * at_once > free:
        report.warn(
            key,
            f"{base} has {free / GB:.1f} GiB free, less than the {at_once} checkpoints verl keeps at once "
            f"(~{size * at_once / GB:.1f} GiB)",
            "set trainer.max_actor_ckpt_to_keep lower, or point trainer.default_local_dir at a larger file system",
        )
    return line


def check_overlong(cfg, report: Report, trainer: str = "sync") -> str | None:
    """DAPO's overlong reward shaping (Yu et al. 2025, arXiv 2503.14476, section 3.4; verl's reward-loop
    ``DAPORewardManager``): a response longer than ``max_resp_len - overlong_buffer_cfg.len`` tokens
    loses up to ``penalty_factor`` of its reward, linearly over the buffer.

    - verl reads it from ``reward.reward_kwargs`` (no yaml field: written with '+'). The legacy
      ``reward_model.reward_kwargs`` of verl's own DAPO scripts is moved there only by the fully-async
      trainer (``migrate_legacy_reward_impl``); ``main_ppo`` never reads it: refused there.
    - Only the ``dapo`` reward manager reads it: with another, the shaping would be silently off.
    - The manager judges its own values: it is built from them here (its asserts: ``max_resp_len``
      given, ``len`` > 0 and at most ``max_resp_len``).
    - The penalty must be reachable: ``max_resp_len - len`` below ``data.max_response_length``.

    Returns the plan's line ("a response loses up to 1 of its reward over its last 4096 of 32768
    tokens") when the shaping is on, else None.
    """
    from omegaconf import OmegaConf

    key = "reward.reward_kwargs"
    kw, legacy = plain(sel(cfg, key)), plain(sel(cfg, "reward_model.reward_kwargs"))
    if legacy is not None:
        if trainer == "fully_async":
            kw, key = legacy, "reward_model.reward_kwargs"  # migrate_legacy_reward_impl copies it over
        else:
            report.error(
                "reward_model.reward_kwargs",
                "is the legacy place (verl's own DAPO scripts): only the fully-async trainer moves it to "
                f"reward.reward_kwargs; the {trainer} trainer never reads it, so the overlong shaping would be off",
                "write the same keys under +reward.reward_kwargs (e.g. +reward.reward_kwargs.max_resp_len=...)",
            )
    if not kw:
        return None
    if not isinstance(kw, dict):
        report.error(key, f"= {kw!r}: it must be a dict", "e.g. +reward.reward_kwargs.overlong_buffer_cfg.enable=True")
        return None
    name = str(sel(cfg, "reward.reward_manager.name", "naive"))
    if name != "dapo":
        report.error(
            key,
            f"only verl's dapo reward manager reads it, and reward.reward_manager.name={name}: "
            "the overlong shaping would be silently off",
            "set reward.reward_manager.name=dapo, or drop the keys",
        )
        return None
    for extra in (k for k in _flat_keys(kw) if k not in OVERLONG_READ):
        report.warn(
            f"{key}.{extra}", "verl's DAPO reward manager does not read it", f"it reads {', '.join(OVERLONG_READ)}"
        )
    from verl.experimental.reward_loop.reward_manager.dapo import DAPORewardManager

    try:
        DAPORewardManager(OmegaConf.create({"reward": {"reward_kwargs": kw}}), tokenizer=None, compute_score=None)
    except (AssertionError, AttributeError, TypeError, ValueError) as e:  # its asserts; a missing or odd value
        report.error(
            key,
            f"verl's DAPORewardManager refuses it: {e}",
            "set max_resp_len (= data.max_response_length) and 0 < overlong_buffer_cfg.len <= max_resp_len",
        )
        return None
    buf = kw.get("overlong_buffer_cfg") or {}
    if not buf.get("enable"):
        return None
    max_resp, length, factor = kw["max_resp_len"], buf["len"], buf.get("penalty_factor", 1.0)
    response = sel(cfg, "data.max_response_length")
    if isinstance(response, int) and max_resp - length >= response:
        report.error(
            f"{key}.max_resp_len",
            f"= {max_resp} with overlong_buffer_cfg.len={length}: the penalty starts after {max_resp - length} "
            f"tokens, and no response is longer than data.max_response_length={response}: the shaping never acts",
            f"set {key}.max_resp_len={response} (data.max_response_length, as DAPO's recipes do)",
        )
        return None
    if isinstance(response, int) and max_resp != response:
        report.warn(
            f"{key}.max_resp_len",
            f"= {max_resp}, data.max_response_length = {response}: the penalty ramps up to {factor} at "
            f"{max_resp} tokens, not at the longest response",
            f"set {key}.max_resp_len={response}, as DAPO's recipes do",
        )
    return f"a response loses up to {factor:g} of its reward over its last {length} of {max_resp} tokens" + (
        " (logged: overlong_reward)" if buf.get("log") else ""
    )


def check_algorithm(cfg, report: Report) -> None:
    """What the advantage estimator needs, judged from verl's own code rather than a list of names:

    - its registry (``core_algos.get_adv_estimator_fn``): an unknown name is refused with the
      registered ones;
    - its signature: an estimator that takes ``index`` (the prompt's group id) compares the samples of
      a group, so it needs ``rollout.n >= 2``; with one sample verl's GRPO gives the group mean 0 and
      std 1 and the advantage is the raw reward (REINFORCE without a baseline), RLOO divides by n - 1;
    - ``verl.trainer.ppo.utils.need_critic``: an estimator that trains a critic (GAE) needs
      ``critic.model.path``, which verl's yaml leaves at a placeholder model.
    """
    import inspect
    import warnings

    from verl.trainer.ppo import core_algos
    from verl.trainer.ppo.utils import need_critic

    key = "algorithm.adv_estimator"
    name = str(sel(cfg, key, "gae"))
    try:
        fn = core_algos.get_adv_estimator_fn(name)
    except ValueError:
        names = sorted(core_algos.ADV_ESTIMATOR_REGISTRY)
        close = difflib.get_close_matches(name, names, n=1)
        report.error(
            key,
            f"'{name}' is not an advantage estimator verl registers ({', '.join(names)})",
            f"did you mean {close[0]}?" if close else "grpo for group-relative advantages, gae with a critic",
        )
        return
    n = sel(cfg, f"{R}.n", 1)
    if "index" in inspect.signature(fn).parameters and isinstance(n, int) and n < 2:
        report.error(
            f"{R}.n",
            f"= {n} with {key}={name}: {name} compares the {n} sample(s) of each prompt's group, and a group "
            "of one has nothing to compare with (verl's grpo gives it mean 0 and std 1, so the advantage "
            "is the raw reward: REINFORCE without a baseline)",
            f"set {R}.n >= 2 (the GRPO recipes use 8-16), or {key}=reinforce_plus_plus for one sample per prompt",
        )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # need_critic warns "Disabled critic" for every critic-free estimator
        critic = need_critic(cfg)
    if critic:
        path = str(sel(cfg, "critic.model.path", "") or "")
        if not path or path == verl_default("critic.model.path"):
            report.error(
                "critic.model.path",
                f"{key}={name} trains a critic (verl's need_critic), and critic.model.path is "
                f"{'unset' if not path else f'verl placeholder {path!r}'}",
                "set critic.model.path (a value model, or the actor's path to start the critic from the policy), "
                f"or use a critic-free estimator ({key}=grpo with {R}.n >= 2)",
            )


def verl_default(key: str):
    """``key``'s value in the pinned verl's generated trainer yaml (its defaults, read, not copied)."""
    from omegaconf import OmegaConf

    from npu_rl.preflight.compose import verl_package_dir

    return OmegaConf.select(
        OmegaConf.load(verl_package_dir() / "trainer" / "config" / "_generated_ppo_trainer.yaml"), key, default=None
    )
