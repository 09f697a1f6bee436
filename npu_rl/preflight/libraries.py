"""The pinned libraries judge the rollout configuration themselves (issue 17).

From the composed Hydra config this module builds, on CPU and without weights, what the real run
builds on its way to a vLLM engine, and lets each library's own validation run:

1. **verl**: ``RolloutConfig`` (``omega_conf_to_dataclass``, as ``vLLMHttpServer._init_config``; its
   ``__post_init__`` rules), the Hugging Face config with ``model.override_config`` applied by verl's
   ``update_model_config`` (as ``HFModelConfig.__post_init__``), and ``vLLMHttpServer``'s own
   ``_validate_configs`` / ``_preprocess_engine_kwargs`` / ``_get_override_generation_config``,
   called on a holder of those two configs (they read nothing else of the Ray actor);
2. **the engine arguments** verl passes: the ``args`` dict of ``vLLMHttpServer.launch_server``
   (mirrored, see :func:`server_args`: it is built inline in an async Ray-actor method), turned into a
   command line by verl's ``build_cli_args_from_config`` and parsed by vLLM's ``vllm serve`` parser into
   ``AsyncEngineArgs``, exactly as ``launch_server`` / ``run_server`` do;
3. **vLLM**: ``AsyncEngineArgs.create_engine_config()`` on the model's ``config.json``: ``ModelConfig``
   (length vs the model, heads vs TP, dtype, ``hf_overrides``), ``CacheConfig``, ``ParallelConfig``,
   ``SpeculativeConfig`` (with the model's config, the draft model's when there is one),
   ``SchedulerConfig``, ``CompilationConfig`` and ``VllmConfig``'s cross checks;
4. **vllm-ascend**: ``NPUPlatform``'s validation steps of ``check_and_update_config`` and its quantization
   list, imported from ``sources/vllm-ascend`` with a stub ``torch_npu`` that exists in ``sys.modules``
   only while they run.

Their exceptions become problems under this project's key names (``actor_rollout_ref.rollout.X``) with
a fix. One problem per key: a later library repeating what an earlier one said adds nothing. Where a
library rule cannot be run on CPU, :func:`check_hand_rules` stands in for it and names the rule.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import io
import json
import logging
import os
import re
import sys
import tempfile
import types
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from npu_rl import REPO_ROOT
from npu_rl.preflight.checks import R, plain, sel
from npu_rl.preflight.model import hub_id
from npu_rl.preflight.report import Report

M = "actor_rollout_ref.model"
VLLM_KW = f"{R}.engine_kwargs.vllm"
ASCEND_SOURCES = REPO_ROOT / "sources" / "vllm-ascend"
# Keys of a HF config that change the model's positions: trainer (override_config) and vLLM must agree.
# (max_position_embeddings alone changes only limits: verl's and vLLM's own length checks judge those.)
POSITION_KEYS = ("rope_scaling", "rope_parameters", "rope_theta")
ROPE_FIX = (
    "give the model rope scaling in its config.json (rope_scaling, e.g. YaRN; verl and vLLM both read that "
    "file) and, when max_model_len exceeds max_position_embeddings, "
    f"+{M}.override_config.max_position_embeddings=<scaled length> (verl compares with that field)"
)
# config.json fields that count a model's MTP layers (DeepSeek style, Qwen3.5 style).
MTP_LAYER_KEYS = ("num_nextn_predict_layers", "mtp_num_hidden_layers")

# vLLM engine argument -> the rollout key verl fills it from (vllm_async_server.py:325-349, 384-435).
ARG_KEYS = {
    "dtype": f"{R}.dtype",
    "load_format": f"{R}.load_format",
    "max_model_len": f"{R}.max_model_len",
    "max_num_seqs": f"{R}.max_num_seqs",
    "enable_chunked_prefill": f"{R}.enable_chunked_prefill",
    "max_num_batched_tokens": f"{R}.max_num_batched_tokens",
    "enable_prefix_caching": f"{R}.enable_prefix_caching",
    "enable_sleep_mode": f"{R}.enable_sleep_mode",
    "logprobs_mode": f"{R}.logprobs_mode",
    "enforce_eager": f"{R}.enforce_eager",
    "gpu_memory_utilization": f"{R}.gpu_memory_utilization",
    "disable_log_stats": f"{R}.disable_log_stats",
    "tensor_parallel_size": f"{R}.tensor_model_parallel_size",
    "data_parallel_size": f"{R}.data_parallel_size",
    "pipeline_parallel_size": f"{R}.pipeline_model_parallel_size",
    "enable_expert_parallel": f"{R}.expert_parallel_size",
    "seed": f"{R}.seed",
    "quantization": f"{R}.quantization",
    "scheduling_policy": f"{R}.scheduling_policy",
    "cudagraph_capture_sizes": f"{R}.cudagraph_capture_sizes",
    "compilation_config": f"{VLLM_KW}.compilation_config",
    "hf_overrides": f"{VLLM_KW}.hf_overrides",
    "speculative_config": f"{VLLM_KW}.speculative_config",
    "trust_remote_code": f"{M}.trust_remote_code",
    "enable_return_routed_experts": f"{R}.enable_rollout_routing_replay",
    "enable_lora": f"{M}.lora_rank",
    "max_lora_rank": f"{M}.lora_rank",
}
# Phrases of vLLM messages that name an argument without its field name.
_PHRASES = {
    "tensor parallel size": "tensor_parallel_size",
    "pipeline parallel size": "pipeline_parallel_size",
    "data parallel size": "data_parallel_size",
    "attention heads": "tensor_parallel_size",
    "speculative": "speculative_config",
    "sleep mode": "enable_sleep_mode",
    "async scheduling": "async_scheduling",
    "quantization": "quantization",
    "partial prefill": "max_num_partial_prefills",
    "cudagraph": "compilation_config",
    "--max-model-len": "max_model_len",
}


@dataclass
class Built:
    """What the libraries built on the way (None where a stage failed): for the other checks and tests."""

    rollout: Any = None  # verl's RolloutConfig
    hf_config: Any = None  # transformers config with verl's override_config applied (the trainer's view)
    args: dict = field(default_factory=dict)  # the engine arguments verl passes (launch_server's args)
    engine_args: Any = None  # vLLM's AsyncEngineArgs parsed from them
    vllm_config: Any = None  # vLLM's VllmConfig
    target: str = "npu"  # the platform the run targets: "npu" (vllm-ascend) or "cpu"
    skipped: list[str] = field(default_factory=list)  # stages that could not run here, with the reason
    remote_draft: bool = False  # the draft model is a hub id: vLLM downloads it at engine start, not here
    fast_path: Any = None  # npu_rl.preflight.fastpath.FastPath: graph mode and npugraph_ex as resolved (NPU)
    parsed_args: Any = None  # AsyncEngineArgs as parsed, before create_engine_config (which changes them)
    model_here: bool = False  # the model's own folder is on this machine (not just its shipped config.json)


class _Findings:
    """Library exceptions as problems: our key, the library's words, a fix; one problem per key."""

    def __init__(self, report: Report, cfg, engine_kwargs: Mapping):
        self.report, self.cfg, self.engine_kwargs, self.keys = report, cfg, dict(engine_kwargs), set()
        if bool(sel(cfg, f"{M}.mtp.enable", False)) and bool(sel(cfg, f"{M}.mtp.enable_rollout", False)):
            self.engine_kwargs.pop("speculative_config", None)  # verl builds it from model.mtp.* (MTP wins)
            self.spec_key = f"{M}.mtp.enable_rollout"
        else:
            self.spec_key = ARG_KEYS["speculative_config"]

    def key_of(self, text: str, default: str) -> str:
        """The key of the first engine argument (or key of a dict argument the recipe set, e.g.
        ``speculative_config.prompt_lookup_min``) that ``text`` names; ``default`` if it names none."""
        names = [text] if re.fullmatch(r"[a-z][a-z0-9_]*", text) else []  # an argument name itself
        names += [m.group(0) for m in re.finditer(r"[a-z][a-z0-9]*(?:_[a-z0-9]+)+", text)]
        names += [a for _, a in sorted((text.lower().find(p), a) for p, a in _PHRASES.items() if p in text.lower())]
        nested = {k: top for top, v in self.engine_kwargs.items() if isinstance(v, Mapping) for k in v}
        for name in names:
            if name in self.engine_kwargs:
                return f"{VLLM_KW}.{name}"
            if name in nested:
                return f"{VLLM_KW}.{nested[name]}.{name}"
            if name == "speculative_config":
                return self.spec_key
            if name in ARG_KEYS:
                return ARG_KEYS[name]
        return default

    def add(self, key: str, message: str, fix: str, error: bool = True) -> None:
        """Report it unless a problem on the same key, or on a key above or below it, is reported already."""
        branch = key not in (R, VLLM_KW)
        if key in self.keys or (branch and any(key.startswith(f"{k}.") or k.startswith(f"{key}.") for k in self.keys)):
            return
        self.keys.add(key)
        (self.report.error if error else self.report.warn)(key, message, fix)


def check_libraries(
    cfg,
    env: Mapping[str, str],
    report: Report,
    model_path: str,
    config_json: Path | None,
    injected: list[str] | tuple[str, ...] = (),
) -> Built:
    """Run verl's, vLLM's and vllm-ascend's own validation of the rollout in ``cfg``; problems go to ``report``.

    ``config_json`` is the model's config.json (or shipped metadata) the facts came from; ``injected``
    are feature keys this verl lacks (removed before its dataclasses see the config).
    """
    built = Built(target=target_platform(cfg, env))
    engine_kwargs = plain(sel(cfg, VLLM_KW, {}) or {})
    found = _Findings(report, cfg, engine_kwargs)
    _import_libraries()
    with _quiet(), _offline():
        built.rollout = _verl_rollout(cfg, injected, found)
        if config_json is not None:
            built.hf_config = _verl_hf_config(cfg, config_json, found)
        check_model_features(cfg, env, config_json, built, found)
        if str(sel(cfg, f"{R}.name", "vllm")) != "vllm" or built.rollout is None or built.hf_config is None:
            return built  # another rollout engine, or verl already refused what vLLM would be built from
        rollout = _verl_server_checks(built, found)
        with tempfile.TemporaryDirectory() as tmp:  # the model folder vLLM reads, while the stages run
            if rollout is not None:
                _build_vllm(cfg, env, rollout, model_path, config_json, built, found, Path(tmp))
            if built.vllm_config is not None and built.target == "npu" and not _platform_is_npu():
                _ascend_checks(env, built, found)  # on an NPU machine create_engine_config ran them for real
            if built.engine_args is not None and built.target == "npu":
                _fast_path(cfg, env, built, found)
    for reason in built.skipped:
        report.warn("preflight (libraries)", f"not checked here: {reason}")
    return built


def target_platform(cfg, env: Mapping[str, str]) -> str:
    """``cpu`` for verl's CPU platform (recipes/qwen3-tiny), else ``npu``."""
    if env.get("VERL_PLATFORM") == "cpu" or str(sel(cfg, "trainer.device", "npu")) == "cpu":
        return "cpu"
    return "npu"


# ----------------------------------------------------------------------------------------------------------
# 1. verl
# ----------------------------------------------------------------------------------------------------------


def _verl_rollout(cfg, injected, found: _Findings):
    """verl's RolloutConfig of the composed config (its ``__post_init__`` rules), as the rollout builds it."""
    from omegaconf import OmegaConf, open_dict
    from verl.utils.config import omega_conf_to_dataclass

    rollout_cfg = cfg
    if injected:
        rollout_cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
        with open_dict(rollout_cfg):
            for key in injected:
                parent, _, leaf = key.rpartition(".")
                node = OmegaConf.select(rollout_cfg, parent) if parent else rollout_cfg
                if node is not None and leaf in node:
                    del node[leaf]
    try:
        return omega_conf_to_dataclass(OmegaConf.select(rollout_cfg, R))
    except Exception as e:  # noqa: BLE001 - hydra wraps the dataclass's assert/ValueError in its own errors
        cause = _root_cause(e)
        text = str(cause) or type(cause).__name__
        key = found.key_of(text, R)
        tp, dp = int(sel(cfg, f"{R}.tensor_model_parallel_size", 1)), int(sel(cfg, f"{R}.data_parallel_size", 1))
        if "expert_parallel_size must be equal" in text:
            key = f"{R}.expert_parallel_size"
            fix = f"set {key}={tp * dp} (= TP {tp} x DP {dp}) or 1"
        elif "pipeline_model_parallel_size > 1" in text:
            key = f"{R}.pipeline_model_parallel_size"
            fix = f"set {key}=1 (verl's vLLM rollout has no pipeline parallelism); use TP/DP instead"
        else:
            fix = f"change {key} (verl's RolloutConfig refuses it)"
        found.add(key, f"verl's RolloutConfig refuses it: {text}", fix)
        return None


def _verl_hf_config(cfg, config_json: Path, found: _Findings):
    """The model's HF config as verl's ``HFModelConfig.__post_init__`` builds it (model.py:185-220):
    ``AutoConfig`` from the config dir, then ``update_model_config`` with ``model.override_config``."""
    from transformers import AutoConfig
    from verl.utils.model import update_model_config

    override = plain(sel(cfg, f"{M}.override_config", {}) or {})
    attn = override.get("attn_implementation", "flash_attention_2")
    with tempfile.TemporaryDirectory() as tmp:
        path = _config_dir(config_json, Path(tmp))
        try:
            hf_config = AutoConfig.from_pretrained(str(path), trust_remote_code=False, attn_implementation=attn)
        except Exception as e:  # noqa: BLE001 - transformers raises OSError/ValueError/KeyError alike
            found.add(
                f"{M}.path",
                f"transformers cannot read {config_json}: {e}",
                "point NPU_RL_MODEL_META at the model's config.json",
            )
            return None
    overrides = override.get("model_config", override)  # verl: megatron nests it under model_config
    try:
        update_model_config(hf_config, override_config_kwargs=dict(overrides))
    except Exception as e:  # noqa: BLE001 - setattr on a missing/None sub-config raises AttributeError
        dicts = [k for k, v in overrides.items() if isinstance(v, Mapping)]
        found.add(
            f"{M}.override_config",
            f"verl's update_model_config cannot apply {', '.join(dicts) or 'it'} to {config_json.name} "
            f"({type(e).__name__}: {e}): verl sets each key of a dict value on the config's current value, "
            "and the trainer's workers would die with this",
            ROPE_FIX if any(k in POSITION_KEYS for k in dicts) else "set scalar keys only (key=value)",
        )
        return None
    return hf_config


class _Server:
    """The two attributes of verl's ``vLLMHttpServer`` that its config hooks read (``config``,
    ``model_config.hf_config``): those hooks run unchanged, without the Ray actor around them."""

    def __init__(self, rollout, hf_config):
        self.config = rollout
        self.model_config = types.SimpleNamespace(hf_config=hf_config, lora={}, lora_rank=0)


def _verl_server_checks(built: Built, found: _Findings):
    """``vLLMHttpServer._validate_configs`` (max_model_len vs max_position_embeddings, chunked prefill):
    returns the RolloutConfig as the server goes on with it, None if verl refuses."""
    from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer

    rollout = copy.deepcopy(built.rollout)
    server = _Server(rollout, built.hf_config)
    try:
        vLLMHttpServer._validate_configs(server)
    except dataclasses.FrozenInstanceError as e:
        # verl raises max_num_batched_tokens to max_model_len for a run without chunked prefill, on a
        # frozen dataclass field: the rollout server dies with this before vLLM sees anything.
        mml = rollout.max_model_len
        key = f"{R}.max_num_batched_tokens"
        found.add(
            key,
            f"{rollout.max_num_batched_tokens} < max_model_len ({mml}) with enable_chunked_prefill=False: verl's "
            f"vLLMHttpServer._validate_configs tries to raise it to {mml} and fails ({e}); vLLM's "
            "SchedulerConfig needs max_num_batched_tokens >= max_model_len without chunked prefill as well",
            f"set {key}={mml} (or more), or {R}.enable_chunked_prefill=True",
        )
        return None
    except ValueError as e:
        text = str(e)
        m = re.search(
            r"max_model_len \((\d+)\) should be less than or equal to max_position_embeddings \((\d+)\)", text
        )
        key = f"{R}.max_model_len"
        if m:
            mpe = int(m.group(2))
            fix = f"set {key} <= {mpe}, or {ROPE_FIX}"
        else:
            fix = f"change {key}"
        found.add(key, f"verl's vLLMHttpServer._validate_configs refuses it: {text}", fix)
        return None
    return rollout


# ----------------------------------------------------------------------------------------------------------
# 2. the engine arguments verl passes
# ----------------------------------------------------------------------------------------------------------


def server_args(cfg, rollout, hf_config, model_dir: str, gpus_per_node: int) -> dict:
    """The engine arguments of replica 0, node 0: the ``args`` dict of verl's ``vLLMHttpServer.launch_server``
    (verl/workers/rollout/vllm_rollout/vllm_async_server.py:287-454), mirrored step by step because it is
    built inline in an async method of a Ray actor. The hooks it calls run as verl's own code. Left out:
    the profiler arguments (only on a profiled replica), LoRA adapters beyond the rank, PD disaggregation.
    """
    from verl.workers.rollout.vllm_rollout.utils import build_mtp_speculative_config
    from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer

    server = _Server(rollout, hf_config)
    # :287-295 engine kwargs, None values dropped, image limit, verl's preprocessing
    engine_kwargs = rollout.get("engine_kwargs", {}).get("vllm", {}) or {}
    engine_kwargs = {key: val for key, val in plain(engine_kwargs).items() if val is not None}
    if rollout.get("limit_images", None):
        engine_kwargs["limit_mm_per_prompt"] = {"image": rollout.get("limit_images")}
    vLLMHttpServer._preprocess_engine_kwargs(server, engine_kwargs)
    override_generation_config = vLLMHttpServer._get_override_generation_config(server)
    # :305 verl's _apply_quantization, where it only reads the config; its fp8 and QAT branches patch vLLM
    # in this process, so there the outcome is taken as configured (hf_overrides carry their quant config)
    model_quant = getattr(hf_config, "quantization_config", None) or {}
    model_fp8 = (model_quant.get("quant_method") if isinstance(model_quant, Mapping) else None) == "fp8"
    if rollout.quantization != "fp8" and not (rollout.qat or {}).get("enable", False) and not model_fp8:
        quantization, hf_overrides = vLLMHttpServer._apply_quantization(server)
    else:
        quantization, hf_overrides = rollout.quantization, {}
    # :307-323 compilation config
    compilation_config = engine_kwargs.pop("compilation_config", None) or {}
    if isinstance(compilation_config, str):
        compilation_config = json.loads(compilation_config)
    compilation_config.setdefault("cudagraph_mode", "FULL_AND_PIECEWISE")
    dcp_size = engine_kwargs.get("decode_context_parallel_size", 1) or 1
    if dcp_size > 1 and compilation_config["cudagraph_mode"] == "FULL_AND_PIECEWISE":
        compilation_config["cudagraph_mode"] = "PIECEWISE"
    if rollout.cudagraph_capture_sizes:
        compilation_config["cudagraph_capture_sizes"] = rollout.cudagraph_capture_sizes
    # :325-349
    args = {
        "dtype": rollout.dtype,
        "load_format": rollout.load_format,
        "skip_tokenizer_init": False,
        "distributed_executor_backend": "mp",
        "worker_extension_cls": vLLMHttpServer._get_worker_extension_cls(server),
        "trust_remote_code": bool(sel(cfg, f"{M}.trust_remote_code", False)),
        "max_model_len": rollout.max_model_len,
        "max_num_seqs": rollout.max_num_seqs,
        "enable_chunked_prefill": rollout.enable_chunked_prefill,
        "max_num_batched_tokens": rollout.max_num_batched_tokens,
        "enable_prefix_caching": rollout.enable_prefix_caching,
        "enable_sleep_mode": rollout.enable_sleep_mode,
        "logprobs_mode": rollout.logprobs_mode,
        "enforce_eager": rollout.enforce_eager,
        "gpu_memory_utilization": rollout.gpu_memory_utilization,
        "disable_log_stats": rollout.disable_log_stats,
        "tensor_parallel_size": rollout.tensor_model_parallel_size,
        "seed": rollout.seed,  # + replica rank 0
        "override_generation_config": json.dumps(override_generation_config),
        "quantization": quantization,
        "hf_overrides": hf_overrides,
        "scheduling_policy": rollout.scheduling_policy,
        "compilation_config": json.dumps(compilation_config),
        **engine_kwargs,
    }
    # :368-375 served model name, :377-382 MTP
    if rollout.prometheus.enable and rollout.prometheus.served_model_name:
        args["served_model_name"] = rollout.prometheus.served_model_name.split("/")[-1]
    if rollout.mtp is not None and rollout.mtp.enable and rollout.mtp.enable_rollout:
        args["speculative_config"] = build_mtp_speculative_config(
            rollout.mtp.method, rollout.mtp.num_speculative_tokens, args.get("speculative_config")
        )
    # :384-403 data parallel (the replica's nodes: RolloutReplica.__init__, replica.py:108-118)
    world = rollout.tensor_model_parallel_size * rollout.data_parallel_size * rollout.pipeline_model_parallel_size
    per_node = min(gpus_per_node, world)
    nnodes = max(world // per_node, 1)
    if rollout.data_parallel_size > 1:
        args.update(
            data_parallel_size=rollout.data_parallel_size,
            data_parallel_size_local=per_node // rollout.tensor_model_parallel_size,
            data_parallel_start_rank=0,
            data_parallel_address="127.0.0.1",
            data_parallel_rpc_port=29550,
        )
    args["enable_expert_parallel"] = rollout.expert_parallel_size > 1
    if nnodes > 1:  # :405-416
        args.update(
            master_addr="127.0.0.1",
            master_port=29500,
            node_rank=0,
            nnodes=nnodes,
            data_parallel_address="127.0.0.1",
            data_parallel_rpc_port=29550,
        )
    lora = plain(sel(cfg, f"{M}.lora", {}) or {})  # :418-435
    lora_rank = int(lora.get("rank", 0) or 0) or int(sel(cfg, f"{M}.lora_rank", 0) or 0)
    if lora.get("merge", False):
        lora_rank = 0
    if lora_rank > 0:
        from verl.workers.rollout.vllm_rollout.utils import get_vllm_max_lora_rank

        args.update(enable_lora=True, max_loras=1, max_lora_rank=get_vllm_max_lora_rank(lora_rank))
    if rollout.enable_rollout_routing_replay:  # :437-454 (the pinned vLLM is >= 0.22)
        args["enable_return_routed_experts"] = True
    args["model"] = model_dir
    return args


def _parse_engine_args(args: dict, target: str, found: _Findings):
    """verl's ``build_cli_args_from_config`` and vLLM's ``vllm serve`` parser, as ``launch_server`` and
    ``run_server`` use them (vllm_async_server.py:456-470, 482-484): ``AsyncEngineArgs`` or None."""
    from verl.workers.rollout.vllm_rollout.utils import build_cli_args_from_config
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.openai.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    args = dict(args)
    model = args.pop("model")
    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve", exit_on_error=False))
    if target == "npu":
        # vllm-ascend's pre_register_and_update adds its quantization method to the parser (platform.py:194-197)
        quant = parser._option_string_actions.get("--quantization")
        if quant is not None and quant.choices and "ascend" not in quant.choices:
            quant.choices.append("ascend")
    cli = [model, *build_cli_args_from_config(args)]
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            ns = parser.parse_args(cli)
        ns.model = ns.model_tag
        validate_parsed_serve_args(ns)
    except (SystemExit, Exception) as e:  # noqa: BLE001 - argparse exits; vLLM's type parsers raise anything
        last = err.getvalue().strip().splitlines()[-1:]
        text = " ".join(last) if isinstance(e, SystemExit) else f"{type(_root_cause(e)).__name__}: {_error_text(e)}"
        flag = re.search(r"--([a-z0-9-]+)", text)
        key = found.key_of(flag.group(1).replace("-", "_"), VLLM_KW) if flag else _key_holding(args, text, found)
        choices = re.search(r"invalid choice: .*\(choose from (.*)\)", text)
        fix = (
            f"set {key} to one of {choices.group(1)}"
            if choices
            else f"fix {key}: vLLM {_vllm_version()} does not know it"
        )
        found.add(key, f"vLLM's `vllm serve` parser refuses the engine arguments verl passes: {text}", fix)
        return None
    return AsyncEngineArgs.from_cli_args(ns)


def _key_holding(args: dict, text: str, found: _Findings) -> str:
    """The key whose value holds the quoted word of ``text`` (vLLM's dict parsers name the value, not the
    argument: "KeyError: 'FULL_AND_PIECEWISEE'")."""
    words = re.findall(r"'([^']+)'", text)
    for name, value in args.items():
        value = json.loads(value) if isinstance(value, str) and value.startswith("{") else value
        items = value.items() if isinstance(value, Mapping) else [(None, value)]
        for sub, v in items:
            if any(w == str(v) for w in words):
                key = found.key_of(name, f"{VLLM_KW}.{name}")
                return f"{key}.{sub}" if sub else key
    return VLLM_KW


# ----------------------------------------------------------------------------------------------------------
# 3. vLLM
# ----------------------------------------------------------------------------------------------------------


def _build_vllm(
    cfg, env, rollout, model_path: str, config_json: Path | None, built: Built, found: _Findings, tmp: Path
) -> None:
    """Engine arguments -> ``AsyncEngineArgs.create_engine_config()`` on a directory with the model's config
    (the model's own, else one written under ``tmp``, which must outlive the later stages)."""
    gpus_per_node = int(env.get("NPUS_PER_NODE") or sel(cfg, "trainer.n_gpus_per_node", 8))
    local = Path(os.path.expanduser(model_path))
    built.model_here = (local / "config.json").is_file()
    model_dir = local if built.model_here else _config_dir(config_json, tmp / "model")
    try:
        built.args = server_args(cfg, rollout, built.hf_config, str(model_dir), gpus_per_node)
    except (AssertionError, ValueError, TypeError, NotImplementedError) as e:
        key = found.key_of(str(e), R)
        found.add(key, f"verl's vLLMHttpServer.launch_server refuses it: {e}", f"change {key}")
        return
    if built.remote_draft:
        built.args.pop("speculative_config", None)
    engine_args = _parse_engine_args(built.args, built.target, found)
    if engine_args is None:
        return
    built.engine_args = engine_args
    built.parsed_args = copy.deepcopy(engine_args)
    sleep, quantization = engine_args.enable_sleep_mode, engine_args.quantization
    stand_in = built.target == "npu" and not _platform_is_npu()  # this machine's vLLM platform is not the run's
    if stand_in and quantization and quantization not in _vllm_quantization_methods():
        # A method only vllm-ascend registers (e.g. "ascend", when its platform loads): judged by
        # NPUPlatform.verify_quantization below, not by the CPU build's registry.
        engine_args.quantization = None
    if stand_in:
        # Sleep mode is a platform capability: vLLM's CPU platform has none (ModelConfig refuses it
        # here), vllm-ascend's NPUPlatform.is_sleep_mode_available() is True. Build without it and put
        # the value back for vllm-ascend's checks.
        engine_args.enable_sleep_mode = False
    from vllm.usage.usage_lib import UsageContext

    try:
        vllm_config = engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
    except Exception as e:  # noqa: BLE001 - vLLM raises ValueError/AssertionError/pydantic errors alike
        _vllm_problem(e, engine_args, rollout, found)
        return
    vllm_config.model_config.enable_sleep_mode = sleep
    engine_args.quantization = quantization
    built.vllm_config = vllm_config


def _platform_is_npu() -> bool:
    """vLLM's platform on this machine is vllm-ascend's (the head node of a real run), not the CPU build's."""
    from vllm.platforms import current_platform

    return current_platform.device_type == "npu"


def _vllm_quantization_methods() -> set[str]:
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS

    return set(QUANTIZATION_METHODS)


def _vllm_problem(e: Exception, engine_args, rollout, found: _Findings) -> None:
    text = _error_text(e)
    key = found.key_of(text, R)
    fix = f"change {key} (vLLM {_vllm_version()} refuses it when the engine starts)"
    if m := re.search(r"max_num_batched_tokens \((\d+)\) is smaller than max_model_len \((\d+)\)", text):
        key = f"{R}.max_num_batched_tokens"
        fix = f"set {key}={m.group(2)} (or more), or {R}.enable_chunked_prefill=True"
    elif m := re.search(
        r"max_num_batched_tokens \((\d+)\) must be greater than or equal to max_num_seqs \((\d+)\)", text
    ):
        key = found.key_of("max_num_batched_tokens", f"{R}.max_num_batched_tokens")
        fix = f"set {key} >= {m.group(2)}, or lower {found.key_of('max_num_seqs', f'{R}.max_num_seqs')}"
    elif m := re.search(
        r"User-specified max_model_len \((\d+)\) is greater than the derived max_model_len \((\w+)=([\d.]+)", text
    ):
        key = f"{R}.max_model_len"
        derived = int(float(m.group(3)))
        fix = f"set {key} <= {derived}, or {ROPE_FIX}; verl's override_config does not reach vLLM"
        text = text.split(" To allow overriding", 1)[0]
    elif m := re.search(r"attention heads \((\d+)\) must be divisible by tensor parallel size \((\d+)\)", text):
        key = f"{R}.tensor_model_parallel_size"
        fix = f"use a rollout TP that divides {m.group(1)}"
    elif "async scheduling is only supported with" in text:
        key = found.key_of("async_scheduling", f"{VLLM_KW}.async_scheduling")
        fix = f"drop {key} (vLLM turns async scheduling off by itself for drafters it cannot overlap)"
    elif "ASCEND_LAUNCH_BLOCKING" in text:  # vllm-ascend's platform on an NPU head (platform.py:645-657)
        key = "ASCEND_LAUNCH_BLOCKING"
        fix = f"unset ASCEND_LAUNCH_BLOCKING (or 0), or set {R}.enforce_eager=True while debugging"
    elif "Sleep mode is not supported on current platform" in text:
        key = f"{R}.enable_sleep_mode"
        fix = (
            f"set {key}=False ('+{key}=False' where the recipe does not set it; vLLM's CPU platform has no sleep mode)"
        )
    found.add(key, f"vLLM's engine config refuses it: {text}", fix)


# ----------------------------------------------------------------------------------------------------------
# 4. vllm-ascend
# ----------------------------------------------------------------------------------------------------------


# vllm-ascend's modules between two uses of :func:`stub_torch_npu`: out of ``sys.modules``, kept for the next
# use, because importing them again registers their torch custom ops a second time, which torch refuses.
_ASCEND_KEPT: dict[str, types.ModuleType] = {}
# Module-level caches of vllm-ascend that hold one engine's answers (its AscendConfig, "is this a MoE
# model", the device type): reset at every use, so each configuration is judged as a fresh process would.
_ASCEND_CACHES = {
    "vllm_ascend.ascend_config": ("_ASCEND_CONFIG",),
    "vllm_ascend.utils": (
        "_ascend_device_type",
        "_IS_MOE_MODEL",
        "_IS_DRAFTER_MOE_MODEL",
        "_IS_VL_MODEL",
        "_ENABLE_SP",
        "_HAS_LAYER_IDX",
        "_HAS_ROPE",
        "_IS_RC_DEVICE",
        "_CUSTOM_OP_ENABLED",
        "_potential_max_tokens",
    ),
}


# vLLM's process-wide registries that importing vllm-ascend fills (its quantization configs, "fp8"
# among them, and its custom ops): vLLM's own view is restored after each block, vllm-ascend's is
# put back at the start of the next one (its modules are kept, so they do not register again).
_VLLM_REGISTRIES = (
    ("vllm.model_executor.layers.quantization", "QUANTIZATION_METHODS"),
    ("vllm.model_executor.layers.quantization", "_CUSTOMIZED_METHOD_TO_QUANT_CONFIG"),
    ("vllm.model_executor.custom_op", "op_registry"),
    ("vllm.model_executor.custom_op", "op_registry_oot"),
)
_ASCEND_REGISTRIES: dict[tuple[str, str], Any] = {}


def _registries_snapshot() -> dict[tuple[str, str], Any]:
    import importlib

    return {(m, a): copy.copy(getattr(importlib.import_module(m), a)) for m, a in _VLLM_REGISTRIES}


def _registries_set(state: Mapping[tuple[str, str], Any]) -> None:
    import importlib

    for (m, a), content in state.items():
        registry = getattr(importlib.import_module(m), a)  # changed in place: modules hold references
        registry.clear()
        (registry.extend if isinstance(registry, list) else registry.update)(content)


@contextlib.contextmanager
def stub_torch_npu() -> Iterator[types.ModuleType]:
    """A ``torch_npu`` module in ``sys.modules`` for as long as the block runs, and vllm-ascend importable
    from ``sources/vllm-ascend``; afterwards the stub, every ``vllm_ascend`` module, the path entry, the
    environment and the attributes vllm-ascend set on ``vllm.envs`` are gone again. vllm-ascend's modules
    are kept aside for the next block (:data:`_ASCEND_KEPT`), their per-engine caches reset
    (:data:`_ASCEND_CACHES`), and vLLM's registries they fill swapped in and out (:data:`_VLLM_REGISTRIES`)."""
    import vllm.envs as vllm_envs

    if "torch_npu" in sys.modules:
        raise RuntimeError("a torch_npu module is already imported: not stubbing over it")
    stub = _ASCEND_KEPT.get("torch_npu") or types.ModuleType(
        "torch_npu", "npu-rl preflight stub: vllm-ascend imports torch_npu; its checks call nothing"
    )
    stub.__spec__ = None
    saved_env, saved_path, envs_attrs = dict(os.environ), list(sys.path), set(vars(vllm_envs))
    vllm_registries = _registries_snapshot()
    _registries_set(_ASCEND_REGISTRIES)
    sys.modules.update(_ASCEND_KEPT)
    sys.modules["torch_npu"] = stub
    for name, attrs in _ASCEND_CACHES.items():
        module = sys.modules.get(name)
        for attr in attrs if module is not None else ():
            if hasattr(module, attr):
                setattr(module, attr, None)
    sys.path.insert(0, str(ASCEND_SOURCES))
    try:
        yield stub
    finally:
        for name in [n for n in sys.modules if n == "torch_npu" or n.split(".")[0] == "vllm_ascend"]:
            _ASCEND_KEPT[name] = sys.modules.pop(name)
        _ASCEND_REGISTRIES.update(_registries_snapshot())
        _registries_set(vllm_registries)
        sys.path[:] = saved_path
        os.environ.clear()
        os.environ.update(saved_env)
        for attr in set(vars(vllm_envs)) - envs_attrs:
            delattr(vllm_envs, attr)


def _ascend_checks(env: Mapping[str, str], built: Built, found: _Findings) -> None:
    """vllm-ascend's own rules of ``NPUPlatform.check_and_update_config`` (platform.py:450-800) that a CPU
    can run: its ``_validate_*`` steps (platform.py:338-447, 903-910) and the quantization methods it
    supports, with the job's ``VLLM_ASCEND_*`` / ``ASCEND_*`` variables set. The rest of that method,
    ``AscendConfig`` included, asks the device for its type (``get_ascend_device_type``) and needs an NPU."""
    if not (ASCEND_SOURCES / "vllm_ascend" / "platform.py").is_file():
        built.skipped.append(f"vllm-ascend's sources are not at {ASCEND_SOURCES} (bash download_sources.sh)")
        return
    vc = built.vllm_config
    job_env = {k: v for k, v in env.items() if k.startswith(("VLLM_ASCEND_", "ASCEND_", "PYTORCH_NPU_"))}
    job_env["VLLM_ASCEND_AUTO_DETECT_QUANTIZATION"] = "0"  # verl's NPU platform sets it (platform_npu.py:153)
    try:
        with stub_torch_npu():
            os.environ.update(job_env)
            try:
                from vllm_ascend.platform import NPUPlatform
            except Exception as e:  # noqa: BLE001 - an import failure says nothing about the recipe
                built.skipped.append(f"vllm-ascend did not import with a stub torch_npu: {type(e).__name__}: {e}")
                return
            steps = [
                ("_validate_layer_sharding_config", lambda: NPUPlatform._validate_layer_sharding_config(vc)),
                (
                    "_validate_draft_decode_context_parallel_config",
                    lambda: NPUPlatform._validate_draft_decode_context_parallel_config(vc),
                ),
                ("_validate_parallel_config", lambda: NPUPlatform._validate_parallel_config(vc)),
                ("_validate_pd_pp_mtp_config", lambda: NPUPlatform._validate_pd_pp_mtp_config(vc)),
                ("_validate_kv_load_failure_policy", lambda: NPUPlatform._validate_kv_load_failure_policy(vc)),
            ]
            quant = built.engine_args.quantization
            if quant:
                steps.append(("verify_quantization", lambda: NPUPlatform.verify_quantization(quant)))
            for name, step in steps:
                try:
                    step()
                except (ValueError, AssertionError, NotImplementedError, TypeError) as e:
                    text = _error_text(e)
                    key = found.key_of(text, R)
                    found.add(key, f"vllm-ascend's NPUPlatform ({name}) refuses it: {text}", f"change {key}")
    except RuntimeError as e:
        built.skipped.append(f"vllm-ascend's checks: {e}")


def _fast_path(cfg, env: Mapping[str, str], built: Built, found: _Findings) -> None:
    """Graph mode, npugraph_ex and capture sizes as verl, vLLM and vllm-ascend resolve them
    (:mod:`npu_rl.preflight.fastpath`), and the findings on them."""
    from npu_rl.preflight import fastpath

    device = fastpath.device_type(env)
    if _platform_is_npu() and built.vllm_config is not None:  # the head of a real run: built for real
        from vllm_ascend.ascend_config import get_ascend_config

        start = fastpath.start(built, fastpath.rollout_environment(cfg, env), device)
        fast = fastpath.read(built.vllm_config, start, get_ascend_config().weight_nz_mode)
    elif _platform_is_npu():
        return  # vLLM refused the engine config on the NPU itself: reported already
    else:
        try:
            fast = fastpath.resolve(built, cfg, env, device)
        except RuntimeError as e:
            built.skipped.append(f"the rollout's graph mode and npugraph_ex: {e}")
            return
    built.fast_path = fast
    fastpath.judge(fast, cfg, found)
    fastpath.check_weight_nz(fast, cfg, found)


# ----------------------------------------------------------------------------------------------------------
# Model features the rollout needs, and library rules that cannot run on CPU
# ----------------------------------------------------------------------------------------------------------


def check_model_features(cfg, env: Mapping[str, str], config_json: Path | None, built: Built, found: _Findings):
    """What the rollout needs from the model, read from its config.json: MTP layers for MTP drafting, a
    draft model that exists, and length keys of ``model.override_config`` that vLLM sees too."""
    model_cfg = json.loads(config_json.read_text()) if config_json is not None and config_json.is_file() else None
    spec = plain(sel(cfg, f"{VLLM_KW}.speculative_config", {}) or {})
    mtp_on = bool(sel(cfg, f"{M}.mtp.enable", False))
    mtp_rollout = bool(sel(cfg, f"{M}.mtp.enable_rollout", False))
    if mtp_rollout and not mtp_on:
        found.add(
            f"{M}.mtp.enable_rollout",
            "is ignored: verl drafts with MTP only when actor_rollout_ref.model.mtp.enable=True too "
            "(vllm_async_server.py:377)",
            f"set {M}.mtp.enable=True, or drop enable_rollout",
            error=False,
        )
    method, key = None, None
    if mtp_on and mtp_rollout:
        method, key = str(sel(cfg, f"{M}.mtp.method", "mtp")), f"{M}.mtp.enable_rollout"
    elif spec.get("method"):
        method, key = str(spec["method"]), f"{VLLM_KW}.speculative_config.method"
    if method is not None and "mtp" in method.lower() and model_cfg is not None:
        text = model_cfg.get("text_config", model_cfg)
        layers = max(int(text.get(k) or model_cfg.get(k) or 0) for k in MTP_LAYER_KEYS)
        if layers <= 0:
            name = Path(str(sel(cfg, f"{M}.path", ""))).name or config_json.name
            found.add(
                key,
                f"MTP drafting needs the model's MTP layers, but {name}'s config.json has none "
                f"({' / '.join(MTP_LAYER_KEYS)} absent or 0; {config_json}): vLLM would refuse it or load no "
                "draft weights",
                "use a model with MTP layers, or another drafter (e.g. "
                f"+{VLLM_KW}.speculative_config.method=sam), or turn MTP rollout off",
            )
    draft = spec.get("model")
    if draft and spec.get("method") not in ("ngram", "sam", "suffix", "mtp", "custom_class"):
        _check_draft(str(draft), cfg, env, built, found)
    _check_position_override(cfg, found)


def _check_draft(draft: str, cfg, env: Mapping[str, str], built: Built, found: _Findings) -> None:
    """A draft model given as a local path must exist (vLLM would take a missing one for a hub id and fail)."""
    key = f"{VLLM_KW}.speculative_config.model"
    local = draft.startswith(("/", "./", "../", "~")) or Path(os.path.expanduser(draft)).exists()
    if not local:
        built.remote_draft = True
        built.skipped.append(f"the draft model {draft} is a hub id: vLLM downloads it when the engine starts")
        return
    path = Path(os.path.expanduser(draft))
    if (path / "config.json").is_file():
        return
    dry = env.get("NPU_RL_DRY_RUN") == "1"
    model_here = Path(os.path.expanduser(str(sel(cfg, f"{M}.path", "")))).is_dir()
    what = "has no config.json" if path.is_dir() else "does not exist"
    where = "here" if dry else "on the head node"
    # A dry run on a machine without the models (the target model is missing too) only notes it.
    found.add(
        key,
        f"the draft model {draft} {what} {where}: vLLM's SpeculativeConfig cannot build its ModelConfig",
        f"python -m npu_rl.models download {hub_id(draft)} --dest {draft}, or point {key} at the draft's folder",
        error=not dry or model_here,
    )


def _position_override(cfg) -> dict:
    """The keys of ``model.override_config`` that change the trainer's positions (RoPE)."""
    override = plain(sel(cfg, f"{M}.override_config", {}) or {})
    override = override.get("model_config", override)
    return {k: override[k] for k in POSITION_KEYS if k in override}


def _check_position_override(cfg, found: _Findings) -> None:
    """verl applies ``model.override_config`` to the trainer's HF config only: ``launch_server`` passes vLLM
    the model directory and ``hf_overrides`` from quantization alone (vllm_async_server.py:305, 346),
    so YaRN rope scaling set there does not reach the rollout. ``engine_kwargs.vllm.hf_overrides`` does."""
    keys = _position_override(cfg)
    if not keys:
        return
    hf_overrides = plain(sel(cfg, f"{VLLM_KW}.hf_overrides", {}) or {})
    missing = {k: v for k, v in keys.items() if hf_overrides.get(k) != v}
    if not missing:
        return
    flat = ",".join(f"{k}:{_hydra_value(v)}" for k, v in missing.items())
    found.add(
        f"{M}.override_config",
        f"{', '.join(missing)} {'changes' if len(missing) == 1 else 'change'} the positions the trainer uses, but "
        "verl does not pass override_config to vLLM (its hf_overrides carry quantization only): the rollout "
        "would run the model with the RoPE of its config.json",
        f"pass the same to vLLM: '+{VLLM_KW}.hf_overrides={{{flat}}}'",
    )


def check_hand_rules(cfg, env: Mapping[str, str], report: Report) -> None:
    """Library rules that cannot run on CPU, written out here; each names the rule it stands in for."""
    if target_platform(cfg, env) != "npu" or str(sel(cfg, f"{R}.name", "vllm")) != "vllm":
        return
    sleep = bool(sel(cfg, f"{R}.enable_sleep_mode", True))
    conf = effective_env(cfg, env, "PYTORCH_NPU_ALLOC_CONF")
    if sleep and "expandable_segments:True" in conf:
        # Stands in for the assertion in vllm-ascend's CaMemAllocator.__init__ (device_allocator/camem.py:152-157),
        # the sleep-mode allocator: that module imports CANN's acl and vllm_ascend_C, which a CPU lacks.
        report.error(
            "PYTORCH_NPU_ALLOC_CONF",
            f"= {conf!r} with sleep mode on ({R}.enable_sleep_mode, verl's default True): vllm-ascend's sleep-mode "
            "allocator (CaMemAllocator) asserts 'Expandable segments are not compatible with memory pool' when "
            "the rollout starts",
            "drop expandable_segments:True from PYTORCH_NPU_ALLOC_CONF (the launcher's default is "
            f"garbage_collection_threshold:0.8), or set +{R}.enable_sleep_mode=False (vllm-ascend then turns "
            "expandable segments on itself; without the '+' where the recipe sets the key already)",
        )


def effective_env(cfg, env: Mapping[str, str], name: str) -> str:
    """A variable as the rollout's processes see it: the job's environment, overridden by
    ``ray_kwargs.ray_init.runtime_env.env_vars`` (main_ppo merges those into every actor's runtime env)."""
    value = sel(cfg, f"ray_kwargs.ray_init.runtime_env.env_vars.{name}")
    return str(value) if value is not None else str(env.get(name, ""))


# ----------------------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------------------


def _config_dir(config_json: Path, dest: Path) -> Path:
    """A directory holding ``config_json`` as config.json (and its tokenizer/generation configs if present)."""
    if config_json.name == "config.json":
        return config_json.parent
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "config.json").write_text(config_json.read_text())
    return dest


def _hydra_value(v) -> str:
    if isinstance(v, Mapping):
        return "{" + ",".join(f"{k}:{_hydra_value(x)}" for k, x in v.items()) + "}"
    return json.dumps(v) if isinstance(v, str) and not re.fullmatch(r"[\w.]+", v) else str(v)


def _root_cause(e: BaseException) -> BaseException:
    while e.__cause__ is not None or (e.__context__ is not None and not e.__suppress_context__):
        e = e.__cause__ or e.__context__
    return e


def _error_text(e: BaseException) -> str:
    e = _root_cause(e)
    errors = getattr(e, "errors", None)
    if callable(errors):  # pydantic: the class, the field and the message
        try:
            parts = []
            for err in errors():
                loc = ".".join(map(str, err.get("loc", ())))
                msg = str(err.get("msg", "")).removeprefix("Value error, ").removeprefix("Assertion failed, ")
                parts.append(f"{loc}: {msg}" if loc else msg)
            return f"{getattr(e, 'title', type(e).__name__)}: " + "; ".join(parts)
        except Exception:  # noqa: BLE001,S110 - fall back to the plain text
            pass
    return " ".join((str(e) or type(e).__name__).split())


def _vllm_version() -> str:
    import vllm

    return vllm.__version__.split("+")[0]


@contextlib.contextmanager
def environ(values: Mapping[str, str]) -> Iterator[None]:
    """``os.environ`` with ``values`` set for the block; the whole environment restored afterwards."""
    saved = dict(os.environ)
    os.environ.update(values)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _offline() -> contextlib.AbstractContextManager:
    """No hub access while the libraries read configs (a dry run reads local files only); env restored."""
    return environ({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})


def _import_libraries() -> None:
    """Import vLLM (and verl's server module, which imports it) before the checks run, with vLLM's logger
    at ERROR while it configures itself, then back at the level it would have had: vLLM binds its log
    handler to the ``sys.stdout`` of that moment, so this must not happen inside :func:`_quiet`."""
    if "verl.workers.rollout.vllm_rollout.vllm_async_server" in sys.modules:
        return
    saved = os.environ.get("VLLM_LOGGING_LEVEL")
    os.environ["VLLM_LOGGING_LEVEL"] = "ERROR"
    noisy = {n: logging.getLogger(n).level for n in ("torch", "transformers")}  # CUDA_HOME, deprecations
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for n in noisy:
                logging.getLogger(n).setLevel(logging.ERROR)
            import verl.workers.rollout.vllm_rollout.vllm_async_server  # noqa: F401
            import vllm.engine.arg_utils  # noqa: F401
            import vllm.entrypoints.openai.cli_args  # noqa: F401
    finally:
        for n, level in noisy.items():
            logging.getLogger(n).setLevel(level)
        if saved is None:
            os.environ.pop("VLLM_LOGGING_LEVEL", None)
        else:
            os.environ["VLLM_LOGGING_LEVEL"] = saved
        logging.getLogger("vllm").setLevel((saved or "INFO").upper())


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The libraries' info logs, warnings and prints stay out of the preflight's report."""
    names = ("vllm", "vllm_ascend", "transformers", "verl", "hydra")
    levels = {n: logging.getLogger(n).level for n in names}
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            for n in names:
                logging.getLogger(n).setLevel(logging.ERROR)
            yield
    finally:
        for n, level in levels.items():
            logging.getLogger(n).setLevel(level)
