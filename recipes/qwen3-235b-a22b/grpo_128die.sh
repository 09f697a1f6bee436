#!/usr/bin/env bash
# Qwen3-235B-A22B GRPO on DeepScaleR with real weights, 2K prompts / 32K responses, 8 nodes x 16 dies (A3).
#   bash ray_start_npu.sh recipes/qwen3-235b-a22b/grpo_128die.sh recipes/qwen3-235b-a22b/env_8node.sh
# Training: Megatron (run through MindSpeed on NPU) TP 4 x PP 8 (first/last stage 11 layers, 6 x 12 between) x EP 16, DP 4;
# everything offloaded while vLLM runs. Rollout: vLLM TP 4 x DP 32 with expert parallel 128 (one
# replica over all dies), prefix caching on. GBS 512 x n 16 as in the reference.
set -euo pipefail
# shellcheck source=internal/verl.sh
source "${NPU_RL_ROOT:-$(dirname "${BASH_SOURCE[0]}")/../..}/internal/verl.sh"

NNODES="${NNODES:-8}"
NPUS_PER_NODE="${NPUS_PER_NODE:-16}"
MODEL_PATH="${MODEL_PATH:-${MODELS_DIR:-$HOME/models}/Qwen3-235B-A22B}"
DATA_DIR="${DATA_DIR:-$HOME/data}"
PROMPT_LEN=2048
RESPONSE_LEN=32768
ENGINE=actor_rollout_ref.actor.megatron

DATA=(
    data.train_files="$DATA_DIR/deepscaler/train.parquet"
    data.val_files="$DATA_DIR/aime2024/test.parquet"
    data.train_batch_size=512
    data.max_prompt_length="$PROMPT_LEN"
    data.max_response_length="$RESPONSE_LEN"
    data.filter_overlong_prompts=True
)
MODEL=(
    model_engine=megatron
    actor_rollout_ref.model.path="$MODEL_PATH"
    "$ENGINE.use_mbridge=True"
    "$ENGINE.vanilla_mbridge=True"
)
TRAIN_PARALLEL=(
    "$ENGINE.tensor_model_parallel_size=4"
    "$ENGINE.pipeline_model_parallel_size=8"
    "$ENGINE.expert_model_parallel_size=16"
    "$ENGINE.expert_tensor_parallel_size=1"
    "$ENGINE.context_parallel_size=1"
    "+$ENGINE.override_transformer_config.num_layers_in_first_pipeline_stage=11"
    "+$ENGINE.override_transformer_config.num_layers_in_last_pipeline_stage=11"
    "$ENGINE.override_transformer_config.recompute_granularity=full"
    "$ENGINE.override_transformer_config.recompute_method=uniform"
    "$ENGINE.override_transformer_config.recompute_num_layers=1"
    "$ENGINE.param_offload=True"
    "$ENGINE.optimizer_offload=True"
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
    actor_rollout_ref.rollout.name=vllm
    actor_rollout_ref.rollout.n=16
    actor_rollout_ref.rollout.tensor_model_parallel_size=4
    actor_rollout_ref.rollout.data_parallel_size=32
    actor_rollout_ref.rollout.expert_parallel_size=128
    actor_rollout_ref.rollout.gpu_memory_utilization=0.85
    actor_rollout_ref.rollout.max_model_len=$((PROMPT_LEN + RESPONSE_LEN))
    actor_rollout_ref.rollout.max_num_batched_tokens=8192
    actor_rollout_ref.rollout.max_num_seqs=256
    actor_rollout_ref.rollout.enable_prefix_caching=True
    actor_rollout_ref.rollout.load_format=auto
)
# MoE routing replay (verl 0.9.1: under the Megatron engine's config; vime's "R3"): ROUTER_REPLAY=R3 replays the rollout's expert routing
# in training to cut the train/rollout mismatch (watch the rollout-vs-actor log-prob metrics).
ROUTER_REPLAY="${ROUTER_REPLAY:-disabled}"
MOE=(
    "$ENGINE.router_replay.mode=$ROUTER_REPLAY"
    actor_rollout_ref.rollout.enable_rollout_routing_replay="$([[ "$ROUTER_REPLAY" == R3 ]] && echo True || echo False)"
)
# Features of this project (each rejected until its release carries it; README "Features"):
#   data.sampler.class_name=LengthAwareEpochSampler   ALL_TO_ALL_RESHARD=1   ROLLOUT_REBALANCE_ENABLE=1
#   +actor_rollout_ref.rollout.engine_kwargs.vllm.speculative_config.method=sam
FEATURES=()
TRAINER=(
    trainer.device=npu
    trainer.nnodes="$NNODES"
    trainer.n_gpus_per_node="$NPUS_PER_NODE"
    trainer.project_name=npu-rl-qwen3-235b
    trainer.experiment_name=grpo-128die
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
# batch (512 prompts x n 16 over 32 DP ranks of TP 4: 256 per rank = max_num_seqs).
verl::fast_path $((512 * 16)) $((NNODES * NPUS_PER_NODE / 4)) 256

run_verl "${DATA[@]}" "${MODEL[@]}" "${TRAIN_PARALLEL[@]}" "${ALGORITHM[@]}" "${ROLLOUT[@]}" "${FAST_PATH[@]}" \
    "${MOE[@]}" "${FEATURES[@]}" "${TRAINER[@]}" "$@"
