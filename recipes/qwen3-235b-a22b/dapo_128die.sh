#!/usr/bin/env bash
# Qwen3-235B-A22B DAPO on DAPO-Math-17k (AIME 2024 validation), 8 nodes x 16 dies: grpo_128die.sh with DAPO's algorithm and data.
#   bash ray_start_npu.sh recipes/qwen3-235b-a22b/dapo_128die.sh recipes/qwen3-235b-a22b/env_8node.sh
# DAPO as verl 0.9.1's V1 trainer implements it: clip-higher 0.2 / 0.28, token-mean loss, dynamic
# sampling (groups whose responses all score the same are dropped and refilled; 2 generation batches in
# flight), the dapo reward manager (math_dapo's acc), no KL, and DAPO's overlong reward shaping: a
# response loses up to 1.0 of its reward over the last 4096 of its 32768 tokens (the paper's 4096-token
# buffer; verl reads it from reward.reward_kwargs, which its yaml does not list, hence the '+'; the
# preflight checks it with verl's own DAPORewardManager). max_resp_len must stay grpo_128die.sh's
# RESPONSE_LEN (data.max_response_length): the preflight says so when it does not.
set -euo pipefail
DATA_DIR="${DATA_DIR:-$HOME/data}"
DAPO=(
    data.train_files="$DATA_DIR/dapo-math-17k/train.parquet"
    data.val_files="$DATA_DIR/aime2024/test.parquet"
    algorithm.filter_groups.enable=True
    algorithm.filter_groups.metric=acc
    algorithm.filter_groups.max_inflight_gen_batches=2
    reward.reward_manager.name=dapo
    +reward.reward_kwargs.overlong_buffer_cfg.enable=True
    +reward.reward_kwargs.overlong_buffer_cfg.len=4096
    +reward.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0
    +reward.reward_kwargs.overlong_buffer_cfg.log=True
    +reward.reward_kwargs.max_resp_len=32768
    actor_rollout_ref.actor.clip_ratio_low=0.2
    actor_rollout_ref.actor.clip_ratio_high=0.28
    actor_rollout_ref.actor.loss_agg_mode=token-mean
    trainer.experiment_name=dapo-128die
    trainer.test_freq=10
)
exec bash "$(dirname "${BASH_SOURCE[0]}")/grpo_128die.sh" "${DAPO[@]}" "$@"
