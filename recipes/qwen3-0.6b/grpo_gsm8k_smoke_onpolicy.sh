#!/usr/bin/env bash
# Qwen3-0.6B GRPO on GSM8K, on-policy variant: one optimizer step per batch, no old-log-prob pass.
#   bash ray_start_npu.sh recipes/qwen3-0.6b/grpo_gsm8k_smoke_onpolicy.sh recipes/qwen3-0.6b/env_1node.sh
# grpo_gsm8k_smoke.sh with ppo_mini_batch_size = train_batch_size (64 prompts: 1 optimizer step per
# batch instead of 4, a different update rule) so that old_log_probs == log_prob.detach() and the
# recompute forward pass is skipped (actor_rollout_ref.actor.recompute_old_log_prob=false). The
# shortcut is valid only in that setting; the preflight refuses it otherwise. See docs/onpolicy.md.
set -euo pipefail
ONPOLICY=(
    actor_rollout_ref.actor.ppo_mini_batch_size=64
    actor_rollout_ref.actor.recompute_old_log_prob=false
    trainer.experiment_name=qwen3-0.6b-gsm8k-onpolicy
)
exec bash "$(dirname "${BASH_SOURCE[0]}")/grpo_gsm8k_smoke.sh" "${ONPOLICY[@]}" "$@"
