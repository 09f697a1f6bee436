#!/usr/bin/env bash
# Case 2: 2 nodes x 16 dies, TP=PP=CP=1 (actor DP 32), ppo_mini_batch_size=16, n=1: 16 trajectories over 32 ranks.
exec bash "$(dirname "${BASH_SOURCE[0]}")/base_qwen3_32b.sh" \
    actor_rollout_ref.actor.megatron.tensor_model_parallel_size=1 \
    actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=1 \
    actor_rollout_ref.actor.ppo_mini_batch_size=16 actor_rollout_ref.rollout.n=1 "$@"
