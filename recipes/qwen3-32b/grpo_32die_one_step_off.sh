#!/usr/bin/env bash
# Qwen3-32B one-step-off-policy GRPO on DeepScaleR, 2K prompts / 32K responses, 2 nodes x 16 dies (A3).
#   bash ray_start_npu.sh recipes/qwen3-32b/grpo_32die_one_step_off.sh recipes/qwen3-32b/env_2node_async.sh
# Env: env_2node_async.sh
# verl 0.9.1's one-step-off-policy trainer (run_verl --trainer one_step_off; docs/async.md): the
# rollout generates step k+1's batch while the trainer trains on step k's, on separate pools; every
# sample is exactly one weight version old. The step still waits for its longest response (no
# partial rollout), but that wait overlaps the training of the previous step.
# Resource split, 16 + 16 dies (one node each):
#   trainer pool  node 1, 16 dies: Megatron (MindSpeed on NPU) TP 8 x PP 2, DP 1; nothing shares its
#                 dies, so nothing is offloaded (~34 GiB of training state per die in the plan)
#   rollout pool  node 2, 16 dies: vLLM TP 4 x 4 replicas (2 KV heads per die)
# Batch: grpo_32die.sh's, 64 prompts x n 16 per step in 4 mini-batches of 16; the weights go to the
# rollout through HCCL (checkpoint_engine.backend=nccl is verl's HCCL engine on Ascend) after each step.
set -euo pipefail
# shellcheck source=internal/verl.sh
source "${NPU_RL_ROOT:-$(dirname "${BASH_SOURCE[0]}")/../..}/internal/verl.sh"

NNODES="${NNODES:-2}"
NPUS_PER_NODE="${NPUS_PER_NODE:-16}"
TRAIN_NODES="${TRAIN_NODES:-1}"
ROLLOUT_NODES="$((NNODES - TRAIN_NODES))"
MODEL_PATH="${MODEL_PATH:-${MODELS_DIR:-$HOME/models}/Qwen3-32B}"
DATA_DIR="${DATA_DIR:-$HOME/data}"
PROMPT_LEN=2048
RESPONSE_LEN=32768
ROLLOUT_TP=4

DATA=(
    data.train_files="$DATA_DIR/deepscaler/train.parquet"
    data.val_files="$DATA_DIR/aime2024/test.parquet"
    data.train_batch_size=64
    data.max_prompt_length="$PROMPT_LEN"
    data.max_response_length="$RESPONSE_LEN"
    data.filter_overlong_prompts=True
    data.truncation=error
)
MODEL=(
    actor_rollout_ref.model.path="$MODEL_PATH"
    actor_rollout_ref.actor.megatron.use_mbridge=True
    actor_rollout_ref.actor.megatron.vanilla_mbridge=True
)
TRAIN_PARALLEL=(
    actor_rollout_ref.actor.megatron.tensor_model_parallel_size=8
    actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2
    actor_rollout_ref.actor.megatron.context_parallel_size=1
    actor_rollout_ref.actor.megatron.param_offload=False
    actor_rollout_ref.actor.megatron.optimizer_offload=False
    actor_rollout_ref.actor.megatron.override_transformer_config.recompute_granularity=full
    actor_rollout_ref.actor.megatron.override_transformer_config.recompute_method=uniform
    actor_rollout_ref.actor.megatron.override_transformer_config.recompute_num_layers=1
)
ALGORITHM=(
    algorithm.adv_estimator=grpo
    algorithm.use_kl_in_reward=False
    actor_rollout_ref.actor.use_kl_loss=False
    actor_rollout_ref.actor.entropy_coeff=0
    actor_rollout_ref.actor.optim.lr=1e-6
    actor_rollout_ref.actor.ppo_mini_batch_size=16
    actor_rollout_ref.actor.use_dynamic_bsz=True
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=$((PROMPT_LEN + RESPONSE_LEN))
    actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=$((PROMPT_LEN + RESPONSE_LEN))
)
ROLLOUT=(
    actor_rollout_ref.hybrid_engine=False
    actor_rollout_ref.rollout.name=vllm
    actor_rollout_ref.rollout.mode=async
    actor_rollout_ref.rollout.n=16
    actor_rollout_ref.rollout.tensor_model_parallel_size="$ROLLOUT_TP"
    actor_rollout_ref.rollout.gpu_memory_utilization=0.85
    actor_rollout_ref.rollout.max_model_len=$((PROMPT_LEN + RESPONSE_LEN))
    actor_rollout_ref.rollout.max_num_batched_tokens=8192
    actor_rollout_ref.rollout.max_num_seqs=256
    actor_rollout_ref.rollout.enable_prefix_caching=True
    actor_rollout_ref.rollout.enable_chunked_prefill=True
    actor_rollout_ref.rollout.load_format=auto
    actor_rollout_ref.rollout.checkpoint_engine.backend=nccl
    rollout.nnodes="$ROLLOUT_NODES"
    rollout.n_gpus_per_node="$NPUS_PER_NODE"
)
TRAINER=(
    trainer.device=npu
    trainer.nnodes="$TRAIN_NODES"
    trainer.n_gpus_per_node="$NPUS_PER_NODE"
    trainer.project_name=npu-rl-qwen3-32b
    trainer.experiment_name=grpo-32die-one-step-off
    'trainer.logger=["console","file"]'  # verl's JSONL tracker: RUN_DIR/metrics.jsonl, no account
    trainer.total_epochs=1
    # Checkpoints (docs/lifecycle.md): every SAVE_FREQ steps into CKPT_DIR (shared storage: the same path
    # on every node), the last 2 kept; the same command again resumes from the newest (resume_mode auto).
    trainer.save_freq="${SAVE_FREQ:-5}"
    trainer.max_actor_ckpt_to_keep=2
    trainer.default_local_dir="${CKPT_DIR:-$PWD/checkpoints}/\${trainer.project_name}/\${trainer.experiment_name}"
    trainer.test_freq="${TEST_FREQ:-10}"
    trainer.val_before_train=True
)

# Rollout fast path (docs/fast_path.md), sized for the rollout pool: 64 prompts x n 16 over 4 DP
# ranks of TP 4 = 256 per rank = max_num_seqs.
verl::fast_path $((64 * 16)) $((ROLLOUT_NODES * NPUS_PER_NODE / ROLLOUT_TP)) 256

run_verl --trainer one_step_off --config-name=one_step_off_ppo_megatron_trainer \
    "${DATA[@]}" "${MODEL[@]}" "${TRAIN_PARALLEL[@]}" "${ALGORITHM[@]}" "${ROLLOUT[@]}" "${FAST_PATH[@]}" \
    "${TRAINER[@]}" "$@"
