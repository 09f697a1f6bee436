#!/usr/bin/env bash
# Qwen3-32B GRPO on DeepScaleR, 2K prompts / 32K responses, 2 nodes x 16 dies (A3).
#   bash ray_start_npu.sh recipes/qwen3-32b/grpo_32die.sh recipes/qwen3-32b/env_2node.sh [override ...]
# Training: Megatron (run through MindSpeed on NPU) TP 8 x PP 2 (DP 2), weights/grads/optimizer offloaded while vLLM runs.
# Rollout: vLLM TP 8 (one KV head per die), 4 replicas, prefix caching on (a group shares its prompt).
set -euo pipefail
# shellcheck source=internal/verl.sh
source "${NPU_RL_ROOT:-$(dirname "${BASH_SOURCE[0]}")/../..}/internal/verl.sh"

NNODES="${NNODES:-2}"
NPUS_PER_NODE="${NPUS_PER_NODE:-16}"
MODEL_PATH="${MODEL_PATH:-${MODELS_DIR:-$HOME/models}/Qwen3-32B}"
DATA_DIR="${DATA_DIR:-$HOME/data}"
PROMPT_LEN=2048
RESPONSE_LEN=32768

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
    model_engine=megatron
    actor_rollout_ref.model.path="$MODEL_PATH"
    actor_rollout_ref.actor.megatron.use_mbridge=True
    actor_rollout_ref.actor.megatron.vanilla_mbridge=True
)
TRAIN_PARALLEL=(
    actor_rollout_ref.actor.megatron.tensor_model_parallel_size=8
    actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2
    actor_rollout_ref.actor.megatron.context_parallel_size=1
    actor_rollout_ref.actor.megatron.param_offload=True
    actor_rollout_ref.actor.megatron.optimizer_offload=True
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
    actor_rollout_ref.rollout.name=vllm
    actor_rollout_ref.rollout.n=16
    actor_rollout_ref.rollout.tensor_model_parallel_size=8
    actor_rollout_ref.rollout.gpu_memory_utilization=0.85
    actor_rollout_ref.rollout.max_model_len=$((PROMPT_LEN + RESPONSE_LEN))
    actor_rollout_ref.rollout.max_num_batched_tokens=8192
    actor_rollout_ref.rollout.max_num_seqs=256
    actor_rollout_ref.rollout.enable_prefix_caching=True
    actor_rollout_ref.rollout.enable_chunked_prefill=True
    actor_rollout_ref.rollout.load_format=auto
)
# Features of this project (each off until its release carries it; see README "Features"):
#   length-aware resampler   data.sampler.class_name=LengthAwareEpochSampler (on below; docs/resampler.md)
#   SAM speculative decoding +actor_rollout_ref.rollout.engine_kwargs.vllm.speculative_config.method=sam
#   skip old-log-prob        actor_rollout_ref.actor.recompute_old_log_prob=false (needs ppo_mini_batch_size=train_batch_size)
#   env: VLLM_ROLLOUT_EARLY_STOP_ENABLE, ROLLOUT_REBALANCE_ENABLE
# The resampler learns each prompt's response length in the first epoch and groups prompts of similar
# length into the same generation batch from the second on (raise trainer.total_epochs to benefit).
FEATURES=(
    data.sampler.class_name=LengthAwareEpochSampler
    +data.sampler.bucket_size=1024
    +data.sampler.ema_decay=0.7
    +data.sampler.shuffle_batch_blocks=True
    data.dataloader_num_workers=0
)
TRAINER=(
    trainer.device=npu
    trainer.nnodes="$NNODES"
    trainer.n_gpus_per_node="$NPUS_PER_NODE"
    trainer.project_name=npu-rl-qwen3-32b
    trainer.experiment_name=grpo-32die
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

# Rollout fast path (docs/fast_path.md): ACL graphs with npugraph_ex (FULL_DECODE_ONLY; FULL when
# SPEC_TOKENS > 0; ROLLOUT_GRAPH_MODE overrides) and a short capture list sized for one rank's decode
# batch (64 prompts x n 16 over 4 replicas of TP 8: 256 per rank = max_num_seqs).
verl::fast_path $((64 * 16)) $((NNODES * NPUS_PER_NODE / 8)) 256

run_verl "${DATA[@]}" "${MODEL[@]}" "${TRAIN_PARALLEL[@]}" "${ALGORITHM[@]}" "${ROLLOUT[@]}" "${FAST_PATH[@]}" \
    "${FEATURES[@]}" "${TRAINER[@]}" "$@"
