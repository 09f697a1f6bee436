"""The pinned libraries judge the rollout themselves (issue 17): verl's RolloutConfig and vLLMHttpServer
hooks, vLLM's engine config (ModelConfig, SchedulerConfig, SpeculativeConfig, CompilationConfig,
VllmConfig) on the model's config.json, vllm-ascend's platform checks with a stub torch_npu.

Each rejected case asserts the key and the fix; each accepted neighbour asserts no false alarm. Inputs
are the real recipes (dry runs through the launcher) and the real model configs under recipes/models.
"""

from __future__ import annotations

import dataclasses
import json
import sys

import pytest

from npu_rl import REPO_ROOT
from npu_rl.preflight import run_preflight
from npu_rl.preflight.model import MODELS_DIR
from tests.dryrun import plan as dry_run
from tests.test_preflight_on_cpu import BASE, ENV_2X16

pytest.importorskip("verl")
pytest.importorskip("vllm")

R = "actor_rollout_ref.rollout"
M = "actor_rollout_ref.model"
VLLM_KW = f"{R}.engine_kwargs.vllm"
SPEC = f"{VLLM_KW}.speculative_config"
RECIPE_32B = (REPO_ROOT / "recipes/qwen3-32b/grpo_32die.sh", REPO_ROOT / "recipes/qwen3-32b/env_2node.sh")


def check(*extra, env=ENV_2X16, base=BASE):
    return run_preflight([*base, *extra], env)


def errors(result):
    return {p.key: p for p in result.report.errors}


def warnings_of(result):
    return {p.key: p for p in result.report.warnings}


def model_dir(tmp_path, name="Qwen3-32B", **changes):
    """A model folder with a shipped config.json (changed by ``changes``): real facts, no weights."""
    cfg = json.loads((MODELS_DIR / f"{name}.json").read_text())
    cfg.update(changes)
    d = tmp_path / name
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(cfg))
    return d


# --------------------------------------------------------------------------------------------------------
# 1. the libraries' own rules: vLLM SchedulerConfig / ModelConfig, verl RolloutConfig / vLLMHttpServer
# --------------------------------------------------------------------------------------------------------


def test_chunked_prefill_off_needs_max_num_batched_tokens_of_max_model_len_in_the_real_recipe():
    # recipes/qwen3-32b: max_model_len 34816, max_num_batched_tokens 8192 >= the 2048-token prompts.
    rc, out, _ = dry_run(*RECIPE_32B, f"{R}.enable_chunked_prefill=False")
    assert rc == 65, out
    assert f"error: {R}.max_num_batched_tokens: 8192 < max_model_len (34816) with enable_chunked_prefill=False" in out
    assert f"fix: set {R}.max_num_batched_tokens=34816 (or more), or {R}.enable_chunked_prefill=True" in out
    rc, out, _ = dry_run(*RECIPE_32B, f"{R}.enable_chunked_prefill=False", f"{R}.max_num_batched_tokens=34816")
    assert rc == 0, out


@pytest.mark.parametrize(("mnbt", "ok"), [(4096, False), (10239, False), (10240, True), (16384, True)])
def test_chunked_prefill_off_boundary_is_max_model_len_not_the_prompt(mnbt, ok):
    # BASE: prompts of 2048, max_model_len 10240; 4096 >= the prompt length was accepted before.
    r = check(f"{R}.enable_chunked_prefill=False", f"{R}.max_num_batched_tokens={mnbt}")
    key = f"{R}.max_num_batched_tokens"
    assert (key not in errors(r)) is ok, r.render()
    if not ok:
        assert f"set {key}=10240 (or more)" in errors(r)[key].fix


def test_chunked_prefill_on_accepts_a_token_budget_below_the_prompt():
    r = check(f"{R}.max_num_batched_tokens=1024", f"{R}.max_num_seqs=256")
    assert r.ok, r.render()


def test_max_num_batched_tokens_below_max_num_seqs_is_vllms_scheduler_rule():
    r = check(f"{R}.max_num_batched_tokens=128", f"{R}.max_num_seqs=256")
    p = errors(r)[f"{R}.max_num_batched_tokens"]
    assert "vLLM's engine config refuses it" in p.message and "max_num_seqs (256)" in p.message
    assert p.fix == f"set {R}.max_num_batched_tokens >= 256, or lower {R}.max_num_seqs"


def test_max_model_len_over_the_model_is_refused_by_verl_with_the_models_limit():
    r = check("data.max_response_length=60000", f"{R}.max_model_len=65536")
    p = errors(r)[f"{R}.max_model_len"]
    assert "max_model_len (65536) should be less than or equal to max_position_embeddings (40960)" in p.message
    assert p.fix.startswith(f"set {R}.max_model_len <= 40960")


def test_rollout_tp_that_does_not_divide_the_heads_is_vllms_model_config_rule(tmp_path):
    d = model_dir(tmp_path, num_attention_heads=40, num_key_value_heads=8)
    r = check(f"{M}.path={d}", f"{R}.tensor_model_parallel_size=16")
    p = errors(r)[f"{R}.tensor_model_parallel_size"]
    assert "attention heads (40) must be divisible by tensor parallel size (16)" in p.message
    assert p.fix == "use a rollout TP that divides 40"


def test_rollout_ep_and_pp_are_verls_rollout_config_rules():
    # Qwen3-30B-A3B: 4 KV heads, 128 experts; rollout replicas of TP 4 x DP 2
    moe = [
        a.replace("Qwen3-32B", "Qwen3-30B-A3B").replace(
            "megatron.tensor_model_parallel_size=8", "megatron.tensor_model_parallel_size=4"
        )
        for a in BASE
    ]
    layout = (f"{R}.tensor_model_parallel_size=4", f"{R}.data_parallel_size=2")
    r = check(*layout, f"{R}.expert_parallel_size=4", base=moe)
    p = errors(r)[f"{R}.expert_parallel_size"]
    assert "verl's RolloutConfig refuses it" in p.message
    assert "expert_parallel_size must be equal to tensor_model_parallel_size * data_parallel_size" in p.message
    assert p.fix == f"set {R}.expert_parallel_size=8 (= TP 4 x DP 2) or 1"
    r = check(*layout, f"{R}.expert_parallel_size=8", base=moe)
    assert r.ok, r.render()
    r = check(f"{R}.pipeline_model_parallel_size=2", f"{R}.tensor_model_parallel_size=4")
    assert f"set {R}.pipeline_model_parallel_size=1" in errors(r)[f"{R}.pipeline_model_parallel_size"].fix


def test_async_scheduling_with_sam_is_vllms_rule():
    r = check(f"+{SPEC}.method=sam", f"+{SPEC}.num_speculative_tokens=3", f"+{VLLM_KW}.async_scheduling=true")
    p = errors(r)[f"{VLLM_KW}.async_scheduling"]
    assert "async scheduling is only supported with" in p.message and p.fix.startswith(
        f"drop {VLLM_KW}.async_scheduling"
    )
    assert check(f"+{SPEC}.method=sam", f"+{SPEC}.num_speculative_tokens=3").ok


def test_bad_values_inside_vllm_dicts_are_judged_by_vllms_classes():
    r = check(f"+{SPEC}.method=ngram", f"+{SPEC}.num_speculative_tokens=3", f"+{SPEC}.prompt_lookup_min=5",
              f"+{SPEC}.prompt_lookup_max=2")  # fmt: skip
    (p,) = [p for p in r.report.errors if p.key.startswith(SPEC)]
    assert "prompt_lookup_min=5 must be <= prompt_lookup_max=2" in p.message
    r = check(f"+{VLLM_KW}.compilation_config.cudagraph_mode=FULL_AND_PIECEWISEE")
    (p,) = [p for p in r.report.errors if p.key.startswith(f"{VLLM_KW}.compilation_config")]
    assert "FULL_AND_PIECEWISEE" in p.message
    assert check(f"+{VLLM_KW}.compilation_config.cudagraph_mode=PIECEWISE").ok


@pytest.mark.slow  # several library checks
def test_enable_sleep_mode_is_a_key_verl_reads_and_no_dataclass_field_is_refused():
    import typing

    from omegaconf import OmegaConf

    from npu_rl.preflight.compose import Cli, _dataclass_of, check_overrides, compose_config, split_cli
    from npu_rl.preflight.report import Report

    r = check(f"+{R}.enable_sleep_mode=False")
    assert r.ok, r.render()
    assert check(f"+{R}.enable_sleep_mode=True", f"+{R}.server.timeout=30").ok  # a section the yaml leaves out

    def fields(cls, prefix, seen=()):  # a dataclass's fields, and those of its dataclass-typed fields
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            sub = [t for t in (hints[f.name], *typing.get_args(hints[f.name])) if dataclasses.is_dataclass(t)]
            if f.name.startswith("_"):
                continue
            if sub and sub[0] not in seen:
                yield from fields(sub[0], f"{prefix}.{f.name}", (*seen, sub[0]))
            else:
                yield f"{prefix}.{f.name}"

    def sections(node, prefix=""):  # every section of the composed config that builds a verl dataclass
        if isinstance(node, dict):
            if (cls := _dataclass_of(node)) is not None:
                yield prefix, cls
            for k, v in node.items():
                yield from sections(v, f"{prefix}.{k}" if prefix else k)

    cli = split_cli(BASE)
    tree = OmegaConf.to_container(compose_config(cli, cli.overrides))
    keys = sorted({key for prefix, cls in sections(tree) for key in fields(cls, prefix)})
    absent = []
    for key in keys:
        node = tree
        for part in key.split("."):
            node = node.get(part, KeyError) if isinstance(node, dict) else KeyError
        if node is KeyError:
            absent.append(key)
    assert f"{R}.enable_sleep_mode" in absent and len(absent) > 100
    report = Report()
    check_overrides(Cli(cli.config_name, cli.config_dir, [*BASE, *(f"+{k}=null" for k in absent)]), report)
    # none refused; keys below an interpolated section (rollout.mtp -> model.mtp), which Hydra cannot
    # set, are pointed at their source
    assert all("follows" in p.message for p in report.errors), "\n".join(p.render() for p in report.errors)
    for p in report.errors:
        assert p.key.startswith(f"{R}.mtp.") and p.fix.startswith(f"set {M}.mtp.{p.key.rsplit('.', 1)[1]}=null")


# --------------------------------------------------------------------------------------------------------
# vllm-ascend: the platform's own checks (stub torch_npu) and the allocator rule that needs CANN
# --------------------------------------------------------------------------------------------------------


def test_expandable_segments_with_sleep_mode_is_refused_with_both_ways_out():
    env = {**ENV_2X16, "PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True"}
    p = errors(check(env=env))["PYTORCH_NPU_ALLOC_CONF"]
    assert "sleep mode on" in p.message and "CaMemAllocator" in p.message
    assert f"+{R}.enable_sleep_mode=False" in p.fix and "drop expandable_segments:True" in p.fix
    # the same variable set for the Ray actors through the config
    r = check("+ray_kwargs.ray_init.runtime_env.env_vars.PYTORCH_NPU_ALLOC_CONF=expandable_segments:True")
    assert "PYTORCH_NPU_ALLOC_CONF" in errors(r)


@pytest.mark.parametrize(
    ("conf", "extra"),
    [
        ("expandable_segments:True", (f"+{R}.enable_sleep_mode=False",)),  # vllm-ascend sets it itself then
        ("garbage_collection_threshold:0.8", ()),  # the launcher's default
        ("expandable_segments:False", ()),
    ],
)
def test_allocator_settings_that_work_are_accepted(conf, extra):
    r = check(*extra, env={**ENV_2X16, "PYTORCH_NPU_ALLOC_CONF": conf})
    assert "PYTORCH_NPU_ALLOC_CONF" not in errors(r), r.render()


def test_launch_blocking_with_graphs_is_refused_and_eager_is_accepted():
    env = {**ENV_2X16, "ASCEND_LAUNCH_BLOCKING": "1"}
    p = errors(check(env=env))["ASCEND_LAUNCH_BLOCKING"]
    assert "ACL graph is incompatible with ASCEND_LAUNCH_BLOCKING=1" in p.message
    assert f"{R}.enforce_eager=True" in p.fix
    assert "ASCEND_LAUNCH_BLOCKING" not in errors(check(f"{R}.enforce_eager=True", env=env))


def test_vllm_ascend_platform_rules_run_with_a_stub_torch_npu_that_is_gone_afterwards():
    r = check(f"+{VLLM_KW}.additional_config.layer_sharding=[o_proj]")
    (p,) = [p for p in r.report.errors if "vllm-ascend" in p.message]
    assert "layer_sharding can only be enabled in PD-disaggregated's P node" in p.message
    assert p.key == f"{VLLM_KW}.additional_config"
    assert "torch_npu" not in sys.modules and not any(m.startswith("vllm_ascend") for m in sys.modules)
    r = check(f"{R}.quantization=ascend")  # vllm-ascend's own quantization method: known to its platform
    assert r.ok, r.render()


def test_the_allocator_rule_still_stands_for_vllm_ascends_assertion():
    # The rule stands in for CaMemAllocator.__init__, which needs CANN to import: it must still be there.
    src = (REPO_ROOT / "sources/vllm-ascend/vllm_ascend/device_allocator/camem.py").read_text()
    assert 'assert "expandable_segments:True" not in conf' in src


# --------------------------------------------------------------------------------------------------------
# 2. model features the rollout needs
# --------------------------------------------------------------------------------------------------------


def test_mtp_drafting_needs_mtp_layers_in_the_model():
    r = check(f"{M}.mtp.enable=True", f"{M}.mtp.enable_rollout=True")
    p = errors(r)[f"{M}.mtp.enable_rollout"]
    assert "Qwen3-32B's config.json has none" in p.message and "num_nextn_predict_layers" in p.message
    assert f"+{SPEC}.method=sam" in p.fix
    p = errors(check(f"+{SPEC}.method=mtp", f"+{SPEC}.num_speculative_tokens=1"))[f"{SPEC}.method"]
    assert "MTP layers" in p.message
    # MTP trained but not used for drafting: nothing to refuse
    assert f"{M}.mtp.enable_rollout" not in errors(check(f"{M}.mtp.enable=True"))


def test_mtp_rollout_without_mtp_is_a_warning_that_it_is_ignored():
    r = check(f"{M}.mtp.enable_rollout=True")
    assert f"{M}.mtp.enable_rollout" not in errors(r)
    assert "is ignored" in warnings_of(r)[f"{M}.mtp.enable_rollout"].message


@pytest.mark.slow  # vLLM's engine config twice
def test_a_missing_draft_model_is_named_and_an_existing_one_is_checked_by_vllm(tmp_path):
    draft = [f"+{SPEC}.method=draft_model", f"+{SPEC}.num_speculative_tokens=3"]
    target = model_dir(tmp_path / "models")
    missing = tmp_path / "models" / "Qwen3-0.6B"
    p = errors(check(f"{M}.path={target}", *draft, f"+{SPEC}.model={missing}"))[f"{SPEC}.model"]
    assert f"the draft model {missing} does not exist here" in p.message and f"--dest {missing}" in p.fix
    real = {k: v for k, v in ENV_2X16.items() if k != "NPU_RL_DRY_RUN"}
    assert f"{SPEC}.model" in errors(check(*draft, f"+{SPEC}.model={missing}", env=real))
    d = model_dir(tmp_path / "drafts", "Qwen3-0.6B")
    r = check(f"{M}.path={target}", *draft, f"+{SPEC}.model={d}")
    assert not [p for p in r.report.errors if p.key.startswith(SPEC)], r.render()


YARN = "{rope_type:yarn,factor:4.0,original_max_position_embeddings:32768}"
LONG = ("data.max_response_length=60000", f"{R}.max_model_len=65536")


def test_rope_scaling_in_override_config_kills_verls_workers_and_the_fix_is_the_config_json():
    # verl's update_model_config sets each key of a dict value on the current value: a dict (transformers 5)
    p = errors(check(f"+{M}.override_config.rope_scaling={YARN}"))[f"{M}.override_config"]
    assert "update_model_config cannot apply rope_scaling" in p.message and "AttributeError" in p.message
    assert "rope scaling in its config.json" in p.fix and f"+{M}.override_config.max_position_embeddings" in p.fix


def test_override_config_does_not_reach_vllm_so_a_rope_change_there_needs_hf_overrides():
    p = errors(check(f"+{M}.override_config.rope_theta=5000000"))[f"{M}.override_config"]
    assert "verl does not pass override_config to vLLM" in p.message and "rope_theta changes" in p.message
    assert p.fix == f"pass the same to vLLM: '+{VLLM_KW}.hf_overrides={{rope_theta:5000000}}'"
    r = check(f"+{M}.override_config.rope_theta=5000000", f"+{VLLM_KW}.hf_overrides.rope_theta=5000000")
    assert r.ok, r.render()


def test_long_context_needs_the_trainer_verl_and_vllm_to_agree(tmp_path):
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    meta = {**ENV_2X16, "NPU_RL_MODEL_META": str(model_dir(tmp_path, rope_scaling=yarn) / "config.json")}
    longer = f"+{M}.override_config.max_position_embeddings=131072"
    assert check(*LONG, longer, env=meta).ok  # YaRN in config.json (verl and vLLM), the field for verl
    p = errors(check(*LONG, env=meta))[f"{R}.max_model_len"]  # verl compares with the field itself
    assert "max_model_len (65536) should be less than or equal to max_position_embeddings (40960)" in p.message
    assert "rope scaling in its config.json" in p.fix
    p = errors(check(*LONG, longer))[f"{R}.max_model_len"]  # no rope scaling: vLLM derives 40960
    assert "vLLM's engine config refuses it" in p.message and "User-specified max_model_len (65536)" in p.message
    assert p.fix.startswith(f"set {R}.max_model_len <= 40960, or give the model rope scaling")


# --------------------------------------------------------------------------------------------------------
# 3. severity and fix texts that match the configuration
# --------------------------------------------------------------------------------------------------------


def test_micro_batch_sizes_under_dynamic_batching_are_ignored_warnings():
    r = check("actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=10240",
              f"{R}.log_prob_max_token_len_per_gpu=10240")  # fmt: skip
    assert r.ok, r.render()
    w = warnings_of(r)
    assert (
        "is ignored: actor_rollout_ref.actor.use_dynamic_bsz=True"
        in w["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"].message
    )
    assert f"{R}.log_prob_micro_batch_size_per_gpu" in w
    assert not [k for k in warnings_of(check()) if "micro_batch" in k]  # static batching reads them
    r = check(f"{R}.log_prob_use_dynamic_bsz=true", f"{R}.log_prob_max_token_len_per_gpu=10240")
    assert "verl's actor worker asserts they are equal" in errors(r)[f"{R}.log_prob_use_dynamic_bsz"].message


def test_a_predicted_memory_failure_is_an_error_naming_the_hbm():
    big = [a.replace("Qwen3-32B", "Qwen3-235B-A22B") for a in BASE]
    r = check("actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=1", base=big)
    p = errors(r)["memory (training)"]
    assert "the 64 GiB per die (Atlas A3)" in p.message and "x the" in p.message
    assert "offload" not in p.fix and "pipeline" in p.fix


def test_rollout_memory_fix_names_only_the_offloads_that_are_off():
    megatron = "actor_rollout_ref.actor.megatron"
    r = check(f"{megatron}.optimizer_offload=False", f"{R}.gpu_memory_utilization=0.9")
    p = errors(r)[f"{R}.gpu_memory_utilization"]
    assert "0.9 x 64 GiB per die (Atlas A3)" in p.message and "vLLM refuses to start" in p.message
    # (64 - 11.4 GiB of optimizer state - 0.44 GiB of ACL graph pool, which vLLM allocates beside its share) / 64
    assert p.fix == f"set {megatron}.optimizer_offload=True, or lower {R}.gpu_memory_utilization to 0.81"
    assert f"{R}.gpu_memory_utilization" not in errors(check(f"{megatron}.optimizer_offload=False"))  # 0.8 fits


def test_a_kv_cache_too_small_for_one_sequence_is_an_error_naming_the_hbm():
    # Qwen3-32B on rollout TP 2: 30.5 GiB of weights per die
    p = errors(check(f"{R}.tensor_model_parallel_size=2", f"{R}.gpu_memory_utilization=0.49"))[
        f"{R}.gpu_memory_utilization"
    ]
    assert "less than one max_model_len (10240) sequence: vLLM will refuse to start" in p.message
    assert "0.49 x 64 GiB per die (Atlas A3)" in p.message
    p = errors(check(f"{R}.tensor_model_parallel_size=2", f"{R}.gpu_memory_utilization=0.4"))[
        f"{R}.gpu_memory_utilization"
    ]
    assert "cannot hold its weights" in p.message
    assert f"{R}.gpu_memory_utilization" not in errors(check(f"{R}.tensor_model_parallel_size=2"))  # 0.8: fits


def test_missing_files_name_the_model_and_the_dataset():
    r = check("data.train_files=/data/deepscaler/train.parquet", "data.val_files=/data/aime2024/test.parquet")
    w = warnings_of(r)
    assert "python -m npu_rl.models download Qwen/Qwen3-32B --dest /nonexistent/Qwen3-32B" in w[f"{M}.path"].fix
    assert w["data.train_files"].fix.startswith(
        "python -m npu_rl.data deepscaler --hub modelscope --split train --out /data"
    )
    assert w["data.val_files"].fix.startswith("python -m npu_rl.data aime2024 --hub modelscope --split test")
