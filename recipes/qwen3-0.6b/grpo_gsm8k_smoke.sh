#!/usr/bin/env bash
# Qwen3-0.6B GRPO on GSM8K: the smallest end-to-end check of a node (minutes, a few dies).
#   bash ray_start_npu.sh recipes/qwen3-0.6b/grpo_gsm8k_smoke.sh recipes/qwen3-0.6b/env_1node.sh
set -euo pipefail
# shellcheck source=internal/verl.sh
source "${NPU_RL_ROOT:-$(dirname "${BASH_SOURCE[0]}")/../..}/internal/verl.sh"

NPUS_PER_NODE="${NPUS_PER_NODE:-16}"
MODEL_PATH="${MODEL_PATH:-${MODELS_DIR:-$HOME/models}/Qwen3-0.6B}"
DATA_DIR="${DATA_DIR:-$HOME/data}"

DATA=(
    data.train_files="$DATA_DIR/gsm8k/train.parquet"
    data.val_files="$DATA_DIR/gsm8k/test.parquet"
    data.train_batch_size=64
    data.max_prompt_length=512
    data.max_response_length=1024
)
MODEL=(
    actor_rollout_ref.model.path="$MODEL_PATH"
    actor_rollout_ref.model.use_remove_padding=True
    actor_rollout_ref.model.enable_gradient_checkpointing=True
)
ALGORITHM=(
    algorithm.adv_estimator=grpo
    actor_rollout_ref.actor.use_kl_loss=False
    actor_rollout_ref.actor.optim.lr=1e-6
    actor_rollout_ref.actor.ppo_mini_batch_size=16
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8
)
ROLLOUT=(
    actor_rollout_ref.rollout.name=vllm
    actor_rollout_ref.rollout.n=4
    actor_rollout_ref.rollout.tensor_model_parallel_size=1
    actor_rollout_ref.rollout.gpu_memory_utilization=0.5
    actor_rollout_ref.rollout.max_num_batched_tokens=4096
    actor_rollout_ref.rollout.load_format=auto
)
FEATURES=()
TRAINER=(
    trainer.device=npu
    trainer.nnodes=1
    trainer.n_gpus_per_node="$NPUS_PER_NODE"
    trainer.project_name=npu-rl-smoke
    trainer.experiment_name=qwen3-0.6b-gsm8k
    'trainer.logger=["console","file"]'  # verl's JSONL tracker: RUN_DIR/metrics.jsonl, no account
    trainer.total_epochs=1
    trainer.total_training_steps=20
    # Checkpoints (docs/lifecycle.md): every SAVE_FREQ steps into CKPT_DIR (shared storage: the same path
    # on every node), the last 2 kept; the same command again resumes from the newest (resume_mode auto).
    trainer.save_freq="${SAVE_FREQ:-5}"
    trainer.max_actor_ckpt_to_keep=2
    trainer.default_local_dir="${CKPT_DIR:-$PWD/checkpoints}/\${trainer.project_name}/\${trainer.experiment_name}"
    trainer.test_freq=10
)

# Rollout fast path (docs/fast_path.md): ACL graphs with npugraph_ex (FULL_DECODE_ONLY; FULL when
# SPEC_TOKENS > 0; ROLLOUT_GRAPH_MODE overrides) and a short capture list sized for one rank's decode
# batch (64 prompts x n 4 over 16 replicas of TP 1: 16 per rank).
verl::fast_path $((64 * 4)) $((NPUS_PER_NODE)) 256

run_verl "${DATA[@]}" "${MODEL[@]}" "${ALGORITHM[@]}" "${ROLLOUT[@]}" "${FAST_PATH[@]}" "${FEATURES[@]}" "${TRAINER[@]}" "$@"
