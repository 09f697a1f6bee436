"""What the verl patch calls: the Megatron engine's weight export with the expert reshard switched in.

verl 0.9.1's colocated weight sync (``ActorRolloutRefWorker.update_weights``, mode ``naive``) asks the
engine for ``get_per_tensor_param``; with ``vanilla_mbridge=True`` that is mbridge's
``Bridge.export_weights``, which all-gathers every expert over EP (and ETP). The patch passes
:func:`reshard_kwargs` from ``update_weights`` and calls :func:`export_weights` in place of
``bridge.export_weights``: with the switch off it returns exactly mbridge's generator; with it on the
non-expert parameters still come from mbridge (told to skip the experts: the mbridge patch adds that
argument) and the experts from :func:`~npu_rl.reshard.exchange.exchange_experts`.

No silent no-op: :func:`reshard_kwargs` raises when the switch is on but the sync would drop or mis-send
it (:func:`sync_problems`, :func:`engine_problems`; the preflight runs the same rules), and
:func:`sync_metrics`, after the sync, raises when the export did not run it and otherwise gives the step
metric :data:`ACTIVE_METRIC`.

Switch: ``actor_rollout_ref.rollout.checkpoint_engine.expert_reshard=True`` or ``ALL_TO_ALL_RESHARD=1``
(the reference recipe's name). Tuning: ``ALL_TO_ALL_RESHARD_BUCKET_MB`` (bytes each rank sends and
receives per collective; default one expert per rank per collective, the least memory),
``USE_ALLTOALL_OVERLAP=1`` (start the next collective before handing over the current one).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from functools import lru_cache
from typing import Any

from npu_rl.errors import NpuRlError
from npu_rl.reshard.plan import (
    MoeShape,
    ReshardPlan,
    RolloutLayout,
    TrainLayout,
    build_plan,
    is_expert_param,
)

SWITCH = "ALL_TO_ALL_RESHARD"
CONFIG_KEY = "actor_rollout_ref.rollout.checkpoint_engine.expert_reshard"
OVERLAP = "USE_ALLTOALL_OVERLAP"
BUCKET_MB = "ALL_TO_ALL_RESHARD_BUCKET_MB"
KWARG = "npu_rl_reshard"
ACTIVE_METRIC = "npu_rl/reshard/active"  # 1.0 in a step's metrics when the sync resharded the experts


def _flag(env: Mapping[str, str], key: str) -> bool:
    from npu_rl import settings

    return settings.get(key, env)


def reshard_enabled(config_value: Any = False, env: Mapping[str, str] | None = None) -> bool:
    """True when the config key or ``ALL_TO_ALL_RESHARD`` turns the reshard on.

    Raises:
        NpuRlError: the variable is not a boolean word.
    """
    env = os.environ if env is None else env
    return bool(config_value) or _flag(env, SWITCH)


def reshard_kwargs(
    rollout_config: Any, env: Mapping[str, str] | None = None, engine: Any = None, backend: str | None = None
) -> dict[str, Any]:
    """Keyword arguments ``update_weights`` adds to ``get_per_tensor_param``: ``{}`` when off, else the
    rollout layout under :data:`KWARG`. ``rollout_config`` is verl's rollout section (DictConfig or
    ``RolloutConfig``): ``tensor_model_parallel_size``, ``data_parallel_size``,
    ``pipeline_model_parallel_size``, ``expert_parallel_size``, ``checkpoint_engine.expert_reshard``,
    ``name``, ``engine_kwargs.vllm``. ``engine`` is the training engine whose ``get_per_tensor_param``
    gets the kwargs, ``backend`` the sync mode ``update_weights`` resolved (default: the config's).

    Raises:
        NpuRlError: the switch is on but the sync would not honour it (:func:`sync_problems`,
            :func:`engine_problems`): a switched-on reshard never silently falls back to the all-gather.
    """
    env = os.environ if env is None else env
    ckpt = _get(rollout_config, "checkpoint_engine", None)
    if not reshard_enabled(_get(ckpt, "expert_reshard", False) if ckpt is not None else False, env):
        return {}
    problems = sync_problems(rollout_config, backend)
    if engine is not None:
        problems += engine_problems(*engine_kind(engine))
    if problems:
        raise NpuRlError(
            f"{SWITCH} / {CONFIG_KEY} is on but this weight sync would not do it: "
            + "; ".join(f"{k}: {m} ({f})" for k, m, f in problems)
        )
    layout = RolloutLayout(
        tp=int(_get(rollout_config, "tensor_model_parallel_size", 1)),
        dp=int(_get(rollout_config, "data_parallel_size", 1)),
        pp=int(_get(rollout_config, "pipeline_model_parallel_size", 1)),
        ep=int(_get(rollout_config, "expert_parallel_size", 1)),
    )
    bucket, overlap = reshard_settings(env)
    return {KWARG: {"rollout": layout, "bucket_bytes": bucket, "overlap": overlap}}


def reshard_settings(env: Mapping[str, str]) -> tuple[int | None, bool]:
    """(bucket size in bytes or None for the planner's default, overlap on?) from
    ``ALL_TO_ALL_RESHARD_BUCKET_MB`` and ``USE_ALLTOALL_OVERLAP``; the preflight calls it too.

    Raises:
        SettingsError: the bucket size is not a positive number of MiB, or the overlap flag not a boolean.
    """
    from npu_rl import settings

    mib = settings.get(BUCKET_MB, env)  # declared in npu_rl.settings: a positive number of MiB, or unset
    return (int(mib * (1 << 20)) if mib is not None else None), _flag(env, OVERLAP)


# vLLM / vllm-ascend 0.23 settings that move experts off vLLM's linear expert map (``determine_expert_map``,
# which the planner assumes): a rank would be sent experts its loader skips (``FusedMoE.weight_loader``
# returns False for a non-local id) while the ones it holds keep their stale weights.
_OFF_LINEAR = "the planner sends each rank the experts of vLLM's linear expert map"


def sync_problems(rollout_config: Any, backend: str | None = None) -> list[tuple[str, str, str]]:
    """Every reason the rollout side would drop or mis-send a switched-on reshard, as (key, message, fix).

    ``rollout_config`` is verl's rollout section; ``backend`` the sync mode (default: its
    ``checkpoint_engine.backend``). Read by the preflight (``check_reshard_settings``) and at run time by
    :func:`reshard_kwargs`: the colocated ``naive`` sync is the only one the patch hooks; vLLM is the only
    rollout whose loader skips non-local experts as the reshard needs; EPLB (vLLM's ``enable_eplb`` and
    ``eplb_config.num_redundant_experts``, vllm-ascend's ``additional_config.eplb_config``:
    ``dynamic_eplb``, ``expert_map_path``, ``expert_map_record_path``, ``num_redundant_experts``), a
    non-linear ``expert_placement_strategy`` and vllm-ascend's ``mix_placement`` all change which experts a
    rank holds (vllm-ascend 0.23.0.post1 ``eplb_utils.init_eplb_config`` builds the linear map only without
    them, and ignores ``expert_placement_strategy``: forwarding round-robin to the planner would be wrong).
    """
    r = "actor_rollout_ref.rollout"
    ckpt = _get(rollout_config, "checkpoint_engine", None)
    backend = str(backend if backend is not None else _get(ckpt, "backend", "naive"))
    p: list[tuple[str, str, str]] = []
    if backend != "naive":
        p.append(
            (
                f"{r}.checkpoint_engine.backend",
                f"the reshard hooks the colocated weight sync (backend=naive), but the sync uses backend={backend}: "
                "it would never run",
                f"set {r}.checkpoint_engine.backend=naive, or unset {SWITCH}",
            )
        )
    name = str(_get(rollout_config, "name", "vllm"))
    if name != "vllm":
        p.append(
            (
                f"{r}.name",
                f"rollout {name!r}: the reshard relies on vLLM's loader skipping non-local experts",
                f"set {r}.name=vllm, or unset {SWITCH}",
            )
        )
    kw = _mapping(_get(_get(rollout_config, "engine_kwargs", None), "vllm", None))
    vk = f"{r}.engine_kwargs.vllm"
    if kw.get("enable_eplb"):
        p.append(
            (
                f"{vk}.enable_eplb",
                f"vLLM's EPLB moves experts between ranks; {_OFF_LINEAR}",
                f"drop it, or unset {SWITCH}",
            )
        )
    if int(_mapping(kw.get("eplb_config")).get("num_redundant_experts") or 0):
        p.append(
            (
                f"{vk}.eplb_config.num_redundant_experts",
                f"redundant experts add physical expert slots; {_OFF_LINEAR}",
                f"set it to 0, or unset {SWITCH}",
            )
        )
    placement = kw.get("expert_placement_strategy")
    if placement not in (None, "linear"):
        p.append(
            (
                f"{vk}.expert_placement_strategy",
                f"{placement!r}: {_OFF_LINEAR} (vllm-ascend builds the linear map whatever this says, upstream vLLM "
                "only sometimes)",
                f"drop it (linear is the default), or unset {SWITCH}",
            )
        )
    extra = _mapping(kw.get("additional_config"))
    ascend = _mapping(extra.get("eplb_config"))
    ak = f"{vk}.additional_config.eplb_config"
    for key, why in (
        ("dynamic_eplb", "vllm-ascend's dynamic EPLB moves experts between ranks"),
        ("expert_map_path", "an expert map file places experts (and redundant copies) off the linear map"),
        ("expert_map_record_path", "recording an expert map turns vllm-ascend's dynamic EPLB on"),
        ("num_redundant_experts", "redundant experts add physical expert slots"),
    ):
        if ascend.get(key):
            p.append((f"{ak}.{key}", f"{why}; {_OFF_LINEAR}", f"drop it, or unset {SWITCH}"))
    if extra.get("mix_placement"):
        p.append(
            (
                f"{vk}.additional_config.mix_placement",
                f"vllm-ascend places shared experts among the routed ones; {_OFF_LINEAR}",
                f"drop it, or unset {SWITCH}",
            )
        )
    return p


def engine_problems(strategy: str, vanilla_mbridge: bool) -> list[tuple[str, str, str]]:
    """Why the training engine would drop the reshard's kwargs, as (key, message, fix).

    Only verl 0.9.1's ``MegatronEngine.get_per_tensor_param`` (also MindSpeed's, inherited) with
    ``vanilla_mbridge=True`` calls :func:`export_weights`; with Megatron-Bridge (verl's default,
    ``vanilla_mbridge=False``) it exports through ``export_hf_weights`` and ignores them, and FSDP,
    TorchTitan, VeOmni and AutoModel take ``**kwargs`` and ignore them too.
    """
    a = "actor_rollout_ref.actor"
    if strategy not in ("megatron", "mindspeed"):
        return [
            (
                f"{a}.strategy",
                f"the {strategy} engine's get_per_tensor_param ignores the reshard: only the Megatron engine's "
                "vanilla-mbridge export does it",
                f"train with {a}.strategy=megatron and {a}.megatron.vanilla_mbridge=True, or unset {SWITCH}",
            )
        ]
    if not vanilla_mbridge:
        return [
            (
                f"{a}.{strategy}.vanilla_mbridge",
                "False (verl's default: Megatron-Bridge's export_hf_weights), which ignores the reshard: only the "
                "vanilla mbridge export does it",
                f"set {a}.{strategy}.vanilla_mbridge=True, or unset {SWITCH}",
            )
        ]
    return []


def engine_kind(engine: Any) -> tuple[str, bool]:
    """(strategy, vanilla mbridge?) of a verl training engine object, from its class and its
    ``vanilla_bridge`` attribute (what ``MegatronEngine.get_per_tensor_param`` branches on)."""
    names = {c.__name__ for c in type(engine).__mro__}
    if any(n.startswith("Mindspeed") for n in names):
        strategy = "mindspeed"
    elif "MegatronEngine" in names:
        strategy = "megatron"
    else:
        strategy = type(engine).__name__
    return strategy, getattr(engine, "vanilla_bridge", False) is True


def _mapping(value: Any) -> Mapping:
    """A config node as a mapping: ``{}`` for None, a JSON string parsed (vLLM takes dict options as JSON)."""
    if value is None:
        return {}
    if isinstance(value, str):
        import json

        try:
            value = json.loads(value)
        except ValueError:
            return {}
    if isinstance(value, Mapping):
        return value
    if hasattr(value, "items"):
        return dict(value.items())
    return {}


def _get(node: Any, key: str, default: Any) -> Any:
    if node is None:
        return default
    if isinstance(node, Mapping) or hasattr(node, "get"):
        value = node.get(key, default)
    else:
        value = getattr(node, key, default)
    return default if value is None else value


def export_weights(bridge: Any, models: list, npu_rl_reshard: Mapping[str, Any] | None = None, **_: Any) -> Iterator:
    """The engine's weight export: mbridge's own generator when the reshard is off (``npu_rl_reshard``
    None), else mbridge's export of the non-expert parameters followed by the resharded experts.

    Every rank must iterate the result to the end (both parts run collectives)."""
    if npu_rl_reshard is None:
        return bridge.export_weights(models)
    return _export_resharded(bridge, models, npu_rl_reshard)


def _export_resharded(bridge: Any, models: list, opts: Mapping[str, Any]) -> Iterator:
    from npu_rl.reshard.exchange import exchange_experts

    yield from bridge.export_weights(models, skip=is_expert_param)
    plan, local = local_expert_shards(bridge, models, opts["rollout"], opts.get("bucket_bytes"))
    received = 0
    for item in exchange_experts(plan, local, overlap=bool(opts.get("overlap"))):
        received += 1
        yield item
    if isinstance(opts, dict):  # the kwargs update_weights holds: sync_metrics reads that the reshard ran
        opts["received"] = received


def sync_metrics(kwargs: Mapping[str, Any]) -> dict[str, float]:
    """After the colocated sync, what ``update_weights`` returns for the step's metrics: ``{}`` when the
    reshard is off (``kwargs`` from :func:`reshard_kwargs` empty), ``{ACTIVE_METRIC: 1.0}`` when the
    engine's export ran the exchange to the end.

    Raises:
        NpuRlError: the reshard was on but the export never ran it (an engine that took the kwargs and
            ignored them): the experts came from the all-gather path or not at all.
    """
    opts = kwargs.get(KWARG)
    if opts is None:
        return {}
    if "received" not in opts:
        raise NpuRlError(
            f"{SWITCH} / {CONFIG_KEY} is on but the training engine's get_per_tensor_param did not run the "
            "reshard (npu_rl.reshard.hook.export_weights): only verl's Megatron engine with vanilla_mbridge=True "
            f"does; switch to it, or unset {SWITCH}"
        )
    return {ACTIVE_METRIC: 1.0}


def local_expert_shards(
    bridge: Any, models: list, rollout: RolloutLayout, bucket_bytes: int | None = None
) -> tuple[ReshardPlan, dict]:
    """This rank's expert shards keyed ``(global layer, family, global expert)``, and the plan.

    Reads Megatron's parallel state (sizes, this rank's EP/ETP/PP coordinates), each local parameter
    named ``decoder.layers.{l}.mlp.experts.linear_fc{1,2}.weight{k}`` (mbridge 0.15.1's expert naming,
    TEGroupedMLP), its global layer (mbridge's ``_weight_name_mapping_mcore_local_to_global``) and
    global expert ``ep_rank * E/EP + k``; the stage of every layer is gathered from all ranks.

    Raises:
        NpuRlError: Megatron's rank order is not the planner's, or a parameter is not of that form.
    """
    import torch.distributed as dist
    from mbridge.core.util import unwrap_model
    from megatron.core import parallel_state as mpu

    world, rank = dist.get_world_size(), dist.get_rank()
    train = TrainLayout(
        world=world,
        tp=mpu.get_tensor_model_parallel_world_size(),
        pp=mpu.get_pipeline_model_parallel_world_size(),
        ep=mpu.get_expert_model_parallel_world_size(),
        etp=mpu.get_expert_tensor_parallel_world_size(),
        cp=mpu.get_context_parallel_world_size(),
    )
    mine = {
        "etp": mpu.get_expert_tensor_parallel_rank(),
        "ep": mpu.get_expert_model_parallel_rank(),
        "pp": mpu.get_pipeline_model_parallel_rank(),
    }
    planned = train.coords(rank)
    if any(planned[k] != v for k, v in mine.items()):
        raise NpuRlError(
            f"rank {rank}: Megatron puts it at {mine} but the reshard planner (order {train.order}) at {planned}; "
            f"unset {SWITCH} (the planner only knows Megatron's default rank order)"
        )
    per_rank = bridge.config.num_moe_experts // train.ep
    local, layers, moe = {}, set(), set()
    for model in models:
        model = unwrap_model(model)
        to_global = bridge._weight_name_mapping_mcore_local_to_global(model, consider_ep=False)
        for name, param in model.named_parameters():
            global_name = to_global.get(name, name)
            if "decoder.layers." in global_name:
                layers.add(int(global_name.split("decoder.layers.")[1].split(".")[0]))
            if not is_expert_param(name):
                continue
            prefix, _, k = global_name.rpartition(".weight")
            if not k.isdigit() or prefix.rsplit(".", 1)[-1] not in ("linear_fc1", "linear_fc2"):
                raise NpuRlError(f"{name}: not an expert weight of the form ...linear_fc{{1,2}}.weight<k>; {SWITCH}=0")
            layer = int(global_name.split("decoder.layers.")[1].split(".")[0])
            family = "fc1" if prefix.endswith("linear_fc1") else "fc2"
            local[(layer, family, mine["ep"] * per_rank + int(k))] = param.data
            moe.add(layer)
    gathered: list = [None] * world
    dist.all_gather_object(gathered, (mine["pp"], sorted(layers), sorted(moe)))
    stage_of: dict[int, int] = {}
    moe_layers: set[int] = set()
    for pp_rank, ls, ms in gathered:
        stage_of.update(dict.fromkeys(ls, pp_rank))
        moe_layers.update(ms)
    if sorted(stage_of) != list(range(len(stage_of))):
        raise NpuRlError(f"the decoder layers found on the ranks are not 0..n-1: {sorted(stage_of)}; {SWITCH}=0")
    stages = tuple(stage_of[i] for i in range(len(stage_of)))
    some = next(iter(local.values()))
    shape = MoeShape(
        experts=bridge.config.num_moe_experts,
        layers=len(stages),
        hidden=bridge.config.hidden_size,
        ffn=bridge.config.moe_ffn_hidden_size,
        dtype_bytes=some.element_size(),
    )
    return _plan(train, rollout, shape, stages, bucket_bytes, tuple(sorted(moe_layers))), local


@lru_cache(maxsize=4)
def _plan(train, rollout, shape, stages, bucket_bytes, moe_layers) -> ReshardPlan:
    return build_plan(train, rollout, shape, stages, bucket_bytes, moe_layers)
