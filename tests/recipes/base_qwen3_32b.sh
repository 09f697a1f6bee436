#!/usr/bin/env bash
# A valid Qwen3-32B GRPO recipe on 2 x 16 dies (Megatron engine); the case recipes add one fault each.
set -euo pipefail
# shellcheck source=internal/verl.sh
source "${NPU_RL_ROOT:-$(dirname "${BASH_SOURCE[0]}")/../..}/internal/verl.sh"
ARGS=(
    model_engine=megatron
    actor_rollout_ref.model.path="${MODEL_PATH:-/nonexistent/Qwen3-32B}"
    data.train_batch_size=64
    data.max_prompt_length=2048
    data.max_response_length=8192
    algorithm.adv_estimator=grpo
    actor_rollout_ref.actor.megatron.tensor_model_parallel_size=8
    actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2
    actor_rollout_ref.actor.megatron.param_offload=True
    actor_rollout_ref.actor.megatron.optimizer_offload=True
    actor_rollout_ref.actor.ppo_mini_batch_size=16
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1
    actor_rollout_ref.rollout.name=vllm
    actor_rollout_ref.rollout.n=8
    actor_rollout_ref.rollout.tensor_model_parallel_size=8
    actor_rollout_ref.rollout.gpu_memory_utilization=0.8
    actor_rollout_ref.rollout.max_model_len=10240
    trainer.nnodes="${NNODES:-2}"
    trainer.n_gpus_per_node="${NPUS_PER_NODE:-16}"
    'trainer.logger=["console"]'
)
run_verl "${ARGS[@]}" "$@"
