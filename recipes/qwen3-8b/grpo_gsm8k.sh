#!/usr/bin/env bash
# Qwen3-8B (dense) GRPO on GSM8K, 1K prompts / 4K responses, 1 node (A3: 16 dies).
#   bash ray_start_npu.sh recipes/qwen3-8b/grpo_gsm8k.sh recipes/qwen3-8b/env_1node.sh
# Training: FSDP over every die. Rollout: vLLM TP 2 (4 KV heads per die), one replica per 2 dies.
set -euo pipefail
# shellcheck source=internal/verl.sh
source "${NPU_RL_ROOT:-$(dirname "${BASH_SOURCE[0]}")/../..}/internal/verl.sh"

NPUS_PER_NODE="${NPUS_PER_NODE:-16}"
MODEL_PATH="${MODEL_PATH:-${MODELS_DIR:-$HOME/models}/Qwen3-8B}"
DATA_DIR="${DATA_DIR:-$HOME/data}"

DATA=(
    data.train_files="$DATA_DIR/gsm8k/train.parquet"
    data.val_files="$DATA_DIR/gsm8k/test.parquet"
    data.train_batch_size=128
    data.max_prompt_length=1024
    data.max_response_length=4096
)
MODEL=(
    actor_rollout_ref.model.path="$MODEL_PATH"
    actor_rollout_ref.model.use_remove_padding=True
    actor_rollout_ref.model.enable_gradient_checkpointing=True
    actor_rollout_ref.actor.fsdp_config.param_offload=True
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=True
)
ALGORITHM=(
    algorithm.adv_estimator=grpo
    actor_rollout_ref.actor.use_kl_loss=False
    actor_rollout_ref.actor.optim.lr=1e-6
    actor_rollout_ref.actor.ppo_mini_batch_size=32
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8
)
ROLLOUT=(
    actor_rollout_ref.rollout.name=vllm
    actor_rollout_ref.rollout.n=8
    actor_rollout_ref.rollout.tensor_model_parallel_size=2
    actor_rollout_ref.rollout.gpu_memory_utilization=0.7
    actor_rollout_ref.rollout.max_num_batched_tokens=8192
    actor_rollout_ref.rollout.enable_prefix_caching=True
    actor_rollout_ref.rollout.load_format=auto
)
# Features of this project (each rejected until its release carries it; README "Features"):
#   data.sampler.class_name=LengthAwareEpochSampler   ROLLOUT_REBALANCE_ENABLE=1
FEATURES=()
TRAINER=(
    trainer.device=npu
    trainer.nnodes=1
    trainer.n_gpus_per_node="$NPUS_PER_NODE"
    trainer.project_name=npu-rl-qwen3-8b
    trainer.experiment_name=grpo-gsm8k
    'trainer.logger=["console","file"]'  # verl's JSONL tracker: RUN_DIR/metrics.jsonl, no account
    trainer.total_epochs=2
    # Checkpoints (docs/lifecycle.md): every SAVE_FREQ steps into CKPT_DIR (shared storage: the same path
    # on every node), the last 2 kept; the same command again resumes from the newest (resume_mode auto).
    trainer.save_freq="${SAVE_FREQ:-5}"
    trainer.max_actor_ckpt_to_keep=2
    trainer.default_local_dir="${CKPT_DIR:-$PWD/checkpoints}/\${trainer.project_name}/\${trainer.experiment_name}"
    trainer.test_freq=20
)

# Rollout fast path (docs/fast_path.md): ACL graphs with npugraph_ex (FULL_DECODE_ONLY; FULL when
# SPEC_TOKENS > 0; ROLLOUT_GRAPH_MODE overrides) and a short capture list sized for one rank's decode
# batch (128 prompts x n 8 over 8 replicas of TP 2: 128 per rank).
verl::fast_path $((128 * 8)) $((NPUS_PER_NODE / 2)) 256

run_verl "${DATA[@]}" "${MODEL[@]}" "${ALGORITHM[@]}" "${ROLLOUT[@]}" "${FAST_PATH[@]}" "${FEATURES[@]}" "${TRAINER[@]}" "$@"
