#!/usr/bin/env bash
# Qwen3-235B-A22B fully-async GRPO with partial rollout on DeepScaleR, 2K prompts / 32K responses, 8 nodes x 16 dies (A3).
#   bash ray_start_npu.sh recipes/qwen3-235b-a22b/grpo_128die_fully_async.sh recipes/qwen3-235b-a22b/env_8node_async.sh
# Env: env_8node_async.sh
# verl 0.9.1's fully-async trainer (run_verl --trainer fully_async; docs/async.md), after verl's own
# Qwen3-235B Megatron NPU script (verl/experimental/fully_async_policy/shell/grpo_qwen3_235b_megatron_npu.sh:
# 8 + 8 nodes, partial_rollout=True, staleness 0.5), on half its nodes.
# Resource split, 64 + 64 dies (4 nodes each):
#   trainer pool  nodes 1-4, 64 dies: Megatron (MindSpeed on NPU) TP 4 x PP 8 (first/last stage 11
#                 layers) x EP 8, DP 2. 64 dies cannot hold the AdamW state of 235 B params (12 B each,
#                 ~41 GiB per die here), so megatron-core's HybridDeviceOptimizer keeps all of it on the
#                 host and steps there (optimizer_cpu_offload, fraction 1.0, as verl's fully-async
#                 Qwen3-30B Megatron script does): 12-16 B per parameter on the host, 0.7-0.9 TB per
#                 trainer node. Not yet run on NPU (MindSpeed with megatron-core's CPU optimizer is
#                 unmeasured here).
#   rollout pool  nodes 5-8, 64 dies: vLLM TP 4 x DP 16 with expert parallel 64, one replica;
#                 256 prompt groups in flight x n 16 = 4096 requests = 16 DP ranks x max_num_seqs 256
# Schedule (the synchronous grpo_128die.sh's batch): a trainer step takes 64 prompts x n 16 from the
# queue, the weights go to the rollouter (HCCL) every 8 steps = 512 prompts (grpo_128die.sh's
# train_batch_size); staleness 0.5 lets the rollouter run 256 prompts ahead.
set -euo pipefail
# shellcheck source=internal/verl.sh
source "${NPU_RL_ROOT:-$(dirname "${BASH_SOURCE[0]}")/../..}/internal/verl.sh"

NNODES="${NNODES:-8}"
NPUS_PER_NODE="${NPUS_PER_NODE:-16}"
TRAIN_NODES="${TRAIN_NODES:-4}"
ROLLOUT_NODES="$((NNODES - TRAIN_NODES))"
MODEL_PATH="${MODEL_PATH:-${MODELS_DIR:-$HOME/models}/Qwen3-235B-A22B}"
DATA_DIR="${DATA_DIR:-$HOME/data}"
PROMPT_LEN=2048
RESPONSE_LEN=32768
ROLLOUT_TP=4
ROLLOUT_DIES=$((ROLLOUT_NODES * NPUS_PER_NODE))
ENGINE=actor_rollout_ref.actor.megatron
OPTIM=actor_rollout_ref.actor.optim.override_optimizer_config

DATA=(
    data.train_files="$DATA_DIR/deepscaler/train.parquet"
    data.val_files="$DATA_DIR/aime2024/test.parquet"
    data.train_batch_size=0
    data.gen_batch_size=1
    data.max_prompt_length="$PROMPT_LEN"
    data.max_response_length="$RESPONSE_LEN"
    data.filter_overlong_prompts=True
)
MODEL=(
    actor_rollout_ref.model.path="$MODEL_PATH"
    "$ENGINE.use_mbridge=True"
    "$ENGINE.vanilla_mbridge=True"
)
TRAIN_PARALLEL=(
    "$ENGINE.tensor_model_parallel_size=4"
    "$ENGINE.pipeline_model_parallel_size=8"
    "$ENGINE.expert_model_parallel_size=8"
    "$ENGINE.expert_tensor_parallel_size=1"
    "$ENGINE.context_parallel_size=1"
    "+$ENGINE.override_transformer_config.num_layers_in_first_pipeline_stage=11"
    "+$ENGINE.override_transformer_config.num_layers_in_last_pipeline_stage=11"
    "$ENGINE.override_transformer_config.recompute_granularity=full"
    "$ENGINE.override_transformer_config.recompute_method=uniform"
    "$ENGINE.override_transformer_config.recompute_num_layers=1"
    "$ENGINE.param_offload=False"
    "$ENGINE.optimizer_offload=False"
    "+$OPTIM.optimizer_cpu_offload=True"
    "+$OPTIM.optimizer_offload_fraction=1.0"
    "+$OPTIM.overlap_cpu_optimizer_d2h_h2d=True"
    "+$OPTIM.use_precision_aware_optimizer=True"
)
ALGORITHM=(
    algorithm.adv_estimator=grpo
    algorithm.use_kl_in_reward=False
    actor_rollout_ref.actor.use_kl_loss=False
    actor_rollout_ref.actor.optim.lr=1e-6
    actor_rollout_ref.actor.ppo_mini_batch_size=64
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
    actor_rollout_ref.rollout.data_parallel_size=$((ROLLOUT_DIES / ROLLOUT_TP))
    actor_rollout_ref.rollout.expert_parallel_size="$ROLLOUT_DIES"
    actor_rollout_ref.rollout.gpu_memory_utilization=0.85
    actor_rollout_ref.rollout.max_model_len=$((PROMPT_LEN + RESPONSE_LEN))
    actor_rollout_ref.rollout.max_num_batched_tokens=8192
    actor_rollout_ref.rollout.max_num_seqs=256
    actor_rollout_ref.rollout.enable_prefix_caching=True
    actor_rollout_ref.rollout.load_format=auto
    actor_rollout_ref.rollout.checkpoint_engine.backend=nccl
)
ASYNC=(
    rollout.nnodes="$ROLLOUT_NODES"
    rollout.n_gpus_per_node="$NPUS_PER_NODE"
    rollout.total_rollout_steps=$((512 * 100))
    async_training.staleness_threshold=0.5
    async_training.trigger_parameter_sync_step=8
    async_training.require_batches=1
    async_training.partial_rollout=True
    async_training.concurrent_samples_per_replica=256
)
TRAINER=(
    trainer.device=npu
    trainer.nnodes="$TRAIN_NODES"
    trainer.n_gpus_per_node="$NPUS_PER_NODE"
    trainer.project_name=npu-rl-qwen3-235b
    trainer.experiment_name=grpo-128die-fully-async
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

# Rollout fast path (docs/fast_path.md), sized for the rollout pool: 256 prompt groups x n 16 over
# 16 DP ranks of TP 4 = 256 per rank = max_num_seqs.
verl::fast_path $((256 * 16)) $((ROLLOUT_DIES / ROLLOUT_TP)) 256

run_verl --trainer fully_async --config-name=fully_async_ppo_megatron_trainer \
    "${DATA[@]}" "${MODEL[@]}" "${TRAIN_PARALLEL[@]}" "${ALGORITHM[@]}" "${ROLLOUT[@]}" "${FAST_PATH[@]}" \
    "${ASYNC[@]}" "${TRAINER[@]}" "$@"
