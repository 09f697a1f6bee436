"""The preflight understands SAM's recipe keys (issue 6): accepted with the patched vLLM, bad values named."""

from __future__ import annotations

import pytest

from npu_rl import REPO_ROOT
from npu_rl.preflight import run_preflight
from npu_rl.preflight.spec_decode import check_spec_decode
from tests.dryrun import plan as dry_run
from tests.test_preflight_on_cpu import BASE, ENV_2X16

pytest.importorskip("verl")

S = "actor_rollout_ref.rollout.engine_kwargs.vllm.speculative_config"
SAM = [f"+{S}.method=sam", f"+{S}.num_speculative_tokens=3"]


def errors(*extra, env=ENV_2X16):
    r = run_preflight([*BASE, *extra], env)
    return r, {p.key: p for p in r.report.errors}


def test_sam_recipe_keys_are_accepted_and_planned():
    r, e = errors(*SAM, f"+{S}.sam_batch_size_threshold=always", f"+{S}.sam_group_corpus_mb=64")
    assert not e, r.render()
    assert "SAM speculative decoding" in dict(r.plan)["features on"]
    from omegaconf import OmegaConf

    cfg = OmegaConf.create(
        {
            "actor_rollout_ref": {
                "rollout": {
                    "name": "vllm",
                    "engine_kwargs": {
                        "vllm": {
                            "speculative_config": {
                                "method": "sam",
                                "num_speculative_tokens": 5,
                                "sam_batch_size_threshold": 16,
                            }
                        }
                    },
                }
            }
        }
    )
    from npu_rl.preflight.report import Report

    assert (
        check_spec_decode(cfg, {}, Report())
        == "SAM k=5, drafts while running batch <= 16, group corpus 256 MiB, min match 1, adaptive k off, history off"
    )


def test_issue20_keys_are_accepted_planned_and_checked():
    r, e = errors(*SAM, f"+{S}.sam_adaptive_k=true", f"+{S}.sam_history_mb=512")
    assert not e, r.render()
    _, e = errors(*SAM, f"+{S}.sam_history_mb=64", f"+{S}.sam_group_corpus_mb=0")
    assert "needs the group corpus" in e[f"{S}.sam_history_mb"].message
    _, e = errors(*SAM, f"+{S}.sam_adaptive_k=sometimes")  # the patched vLLM's field type judges it
    assert "valid boolean" in e[f"{S}.sam_adaptive_k"].message


def test_history_rewards_are_planned_and_a_trainer_that_sends_none_is_named():
    r, e = errors(*SAM, f"+{S}.sam_history_mb=64")
    assert not e, r.render()
    assert "history 64 MiB, ranked by the trainer's rewards" in dict(r.plan)["spec decode"]
    r, e = errors(*SAM, f"+{S}.sam_history_mb=64", f"+{S}.sam_history_rewards=false")
    assert not e and "ranked by age (sam_history_rewards=false)" in dict(r.plan)["spec decode"], r.render()
    _, e = errors(*SAM, f"+{S}.sam_history_mb=64", f"+{S}.sam_history_rewards=maybe")  # vLLM's field type
    assert "valid boolean" in e[f"{S}.sam_history_rewards"].message
    r, _ = errors(*SAM, f"+{S}.sam_history_mb=64", "trainer.use_v1=false")
    w = {p.key: p for p in r.report.warnings}[f"{S}.sam_history_rewards"]
    assert "legacy trainer" in w.message and w.fix == f"set {S}.sam_history_rewards=false"
    assert "ranked by age" in dict(r.plan)["spec decode"]


def test_bad_sam_values_name_the_key():
    _, e = errors(*SAM, f"+{S}.sam_batch_size_threshold=sometimes", f"+{S}.sam_group_corpus_mb=-1")
    assert "'always' or 'never'" in e[f"{S}.sam_batch_size_threshold"].message
    assert "always" in e[f"{S}.sam_batch_size_threshold"].fix
    assert "must be a number of MiB >= 0" in e[f"{S}.sam_group_corpus_mb"].message
    _, e = errors(f"+{S}.method=sam")
    assert "needs the draft length" in e[f"{S}.num_speculative_tokens"].message
    _, e = errors(*SAM, f"+{S}.sam_draft_len=3")
    assert "not a field of vLLM's SpeculativeConfig" in e[f"{S}.sam_draft_len"].message
    _, e = errors(*SAM, "+actor_rollout_ref.rollout.engine_kwargs.vllm.async_scheduling=true")  # vLLM's VllmConfig
    assert (
        "async scheduling is only supported with EAGLE/MTP/Draft Model/NGram GPU"
        in e["actor_rollout_ref.rollout.engine_kwargs.vllm.async_scheduling"].message
    )


def test_reference_env_name_is_an_alias_of_the_gate():
    r, e = errors(*SAM, env={**ENV_2X16, "VLLM_SPECULATIVE_BATCH_SIZE_THRE": "8"})
    assert not e, r.render()
    _, e = errors(*SAM, f"+{S}.sam_batch_size_threshold=16", env={**ENV_2X16, "VLLM_SPECULATIVE_BATCH_SIZE_THRE": "8"})
    assert "disagrees" in e["VLLM_SPECULATIVE_BATCH_SIZE_THRE"].message
    r, e = errors(env={**ENV_2X16, "VLLM_SPECULATIVE_BATCH_SIZE_THRE": "8"})
    assert not e and any("SAM speculative decoding is off" in w.message for w in r.report.warnings)


def test_the_sam_recipe_variant_passes_its_dry_run():
    rc, out, facts = dry_run(
        REPO_ROOT / "recipes/qwen3-32b/grpo_32die_sam.sh", REPO_ROOT / "recipes/qwen3-32b/env_2node.sh"
    )
    assert rc == 0, out
    on = next(line for line in out.splitlines() if line.startswith("features on"))
    assert "SAM speculative decoding" in on.split(None, 2)[2].split(", "), on


def test_the_30b_sam_recipe_drafts_at_every_batch_size_and_says_so():
    rc, out, facts = dry_run(
        REPO_ROOT / "recipes/qwen3-30b-a3b/grpo_16die_sam.sh", REPO_ROOT / "recipes/qwen3-30b-a3b/env_1node.sh"
    )
    assert rc == 0, out
    line = next(x for x in out.splitlines() if x.startswith("spec decode"))
    assert line.split(None, 2)[2] == (
        "SAM k=4, drafts at every batch size, group corpus 256 MiB, min match 1, adaptive k off, history off"
    )
    rc, out, _ = dry_run(
        REPO_ROOT / "recipes/qwen3-30b-a3b/grpo_16die.sh", REPO_ROOT / "recipes/qwen3-30b-a3b/env_1node.sh"
    )
    assert rc == 0 and "spec decode" not in out  # SAM off: no line
