#!/usr/bin/env bash
# Fully-async GRPO on the tiny random Qwen3 on CPU: the asynchronous half of the CPU main job. verl
# 0.9.1's fully-async trainer (verl/experimental/fully_async_policy) with separate pools, 1 logical
# die for the trainer (FSDP2) and 1 for the rollouter (one vLLM server), a message queue between
# them, partial rollout (requests in flight at a weight sync are aborted and resumed) and a staleness
# threshold of 0.5; the weights go from trainer to rollouter through our gloo checkpoint engine
# (npu_rl.cpu.checkpoint_engine: verl's disaggregated engines need CUDA, torch_npu or RDMA).
#   bash ray_start_npu.sh recipes/qwen3-tiny/grpo_cpu_fully_async.sh recipes/qwen3-tiny/env_cpu_async.sh
# Env: env_cpu_async.sh
# (env_cpu.sh with 48 Ray CPUs and the features this trainer refuses or cannot use switched off; it
# says why). Same model and data as grpo_cpu.sh (made on first use).
# Schedule: 4 prompts (16 responses) per trainer step, one weight sync after every step, 16
# prompts in all = 4 steps; the rollouter may run up to 0.5 x 4 = 2 prompts ahead of the trainer.
# Evidence: python -m npu_rl.e2e check-async RUN_DIR (docs/e2e.md).
set -euo pipefail
# shellcheck source=internal/verl.sh
source "${NPU_RL_ROOT:-$(dirname "${BASH_SOURCE[0]}")/../..}/internal/verl.sh"

START="bash ray_start_npu.sh recipes/qwen3-tiny/grpo_cpu_fully_async.sh recipes/qwen3-tiny/env_cpu_async.sh"
if [[ "${VERL_PLATFORM:-}" != cpu ]]; then
    echo "error: recipes/qwen3-tiny/grpo_cpu_fully_async.sh runs on verl's CPU platform only; start it with its env script: $START" >&2
    exit 65
fi
# Ray's logical CPUs: verl's fully-async controllers alone ask for 23 (env_cpu_async.sh says which),
# each pool's placement-group bundle for 3 more (ResourcePoolManager's max_colocate_count) and the
# helper actors (agent loop, reward, TransferQueue) for 1 each. Too few and an actor waits for CPUs
# forever, so refuse it here; 48 is the value the measured runs used (not a measured minimum).
RAY_CPUS_NEEDED=48
if [[ " ${RAY_START_ARGS:-} " =~ [[:space:]]--num-cpus[=[:space:]]+([0-9]+)[[:space:]] ]]; then
    ray_cpus="${BASH_REMATCH[1]}"
else
    ray_cpus=0
fi
if ((ray_cpus < RAY_CPUS_NEEDED)); then
    echo "error: RAY_START_ARGS='${RAY_START_ARGS:-}' gives Ray ${ray_cpus} logical CPUs (0: no --num-cpus); verl's" \
        "fully-async trainer needs ${RAY_CPUS_NEEDED} (FullyAsyncTrainer 10, FullyAsyncRollouter 10, MessageQueue 2, task" \
        "runner 1, 3 per pool, 1 per helper actor; with too few an actor waits forever). Start it with its env script" \
        "($START), or put --num-cpus=${RAY_CPUS_NEEDED} in RAY_START_ARGS" >&2
    exit 65
fi
NPUS_PER_NODE="${NPUS_PER_NODE:-2}"
TRAINER_DIES="${TRAINER_DIES:-1}"
ROLLOUT_DIES="$((NPUS_PER_NODE - TRAINER_DIES))"
MODEL_PATH="${MODEL_PATH:?set by env_cpu.sh}"
DATA_DIR="${DATA_DIR:?set by env_cpu.sh}"
GSM8K_INPUT="${GSM8K_INPUT:-$NPU_RL_ROOT/tests/data/gsm8k_train_head20.jsonl}"
PY="${NPU_RL_TRAIN_PYTHON:-python3}"

# Make what the run reads (not in a --dry-run, which must not write anything).
if [[ "${NPU_RL_DRY_RUN:-0}" != 1 ]]; then
    PYTHONPATH="$NPU_RL_ROOT" "$PY" -P -m npu_rl.models tiny "$MODEL_PATH" --seed 0  # no-op when up to date
    [[ -f "$DATA_DIR/gsm8k/train.parquet" ]] ||
        PYTHONPATH="$NPU_RL_ROOT" "$PY" -P -m npu_rl.data gsm8k --input "$GSM8K_INPUT" --out "$DATA_DIR"
fi

# The fully-async trainer reads prompts one at a time (gen_batch_size=1, train_batch_size=0: its
# own rules); a trainer step takes ppo_mini_batch_size x require_batches prompts from the queue.
DATA=(
    data.train_files="$DATA_DIR/gsm8k/train.parquet"
    data.val_files="$DATA_DIR/gsm8k/train.parquet"
    data.train_batch_size=0
    data.gen_batch_size=1
    data.max_prompt_length=256
    data.max_response_length=48
    data.dataloader_num_workers=0
)
MODEL=(
    actor_rollout_ref.model.path="$MODEL_PATH"
    actor_rollout_ref.model.use_remove_padding=False
    +actor_rollout_ref.model.override_config.attn_implementation=sdpa
)
# As grpo_cpu.sh: no reward for a random model, the entropy bonus moves the policy every update,
# fp32 on both sides so rollout and actor log-probs differ only by kernels.
ALGORITHM=(
    algorithm.adv_estimator=grpo
    actor_rollout_ref.actor.use_kl_loss=False
    actor_rollout_ref.actor.entropy_coeff=0.01
    actor_rollout_ref.actor.optim.lr=1e-3
    actor_rollout_ref.actor.ppo_mini_batch_size=4
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2
    actor_rollout_ref.actor.strategy=fsdp2
    actor_rollout_ref.actor.fsdp_config.param_offload=False
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=False
    '+actor_rollout_ref.actor.fsdp_config.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}'
)
ROLLOUT=(
    actor_rollout_ref.hybrid_engine=False
    actor_rollout_ref.rollout.name=vllm
    actor_rollout_ref.rollout.n=4
    rollout.n=4
    actor_rollout_ref.rollout.tensor_model_parallel_size=1
    actor_rollout_ref.rollout.dtype=float32
    actor_rollout_ref.rollout.gpu_memory_utilization=0.03
    actor_rollout_ref.rollout.max_num_batched_tokens=1024
    actor_rollout_ref.rollout.max_model_len=304
    actor_rollout_ref.rollout.max_num_seqs=64
    actor_rollout_ref.rollout.enforce_eager=True
    actor_rollout_ref.rollout.free_cache_engine=False
    +actor_rollout_ref.rollout.enable_sleep_mode=False
    actor_rollout_ref.rollout.calculate_log_probs=True
    # Separate pools: the weights cross processes through our gloo engine (bucket = one broadcast).
    actor_rollout_ref.rollout.checkpoint_engine.backend=gloo
    actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=npu_rl.cpu.checkpoint_engine
    actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=256
)
ASYNC=(
    trainer.nnodes=1
    trainer.n_gpus_per_node="$TRAINER_DIES"
    rollout.nnodes=1
    rollout.n_gpus_per_node="$ROLLOUT_DIES"
    rollout.total_rollout_steps=16
    async_training.partial_rollout=True
    async_training.staleness_threshold=0.5
    async_training.trigger_parameter_sync_step=1
    async_training.require_batches=1
)
HELPERS=(
    actor_rollout_ref.rollout.agent.num_workers=2
    reward.num_workers=1
    transfer_queue.backend.SimpleStorage.num_data_storage_units=1
)
TRAINER=(
    trainer.device=cpu
    trainer.project_name=npu-rl-cpu
    trainer.experiment_name=qwen3-tiny-grpo-fully-async
    'trainer.logger=["console"]'
    trainer.val_before_train=False
    trainer.total_epochs=1
    trainer.save_freq=-1
    # Not -1: the fully-async trainer logs a step's metrics one step late and flushes the last step
    # only when current_param_version % test_freq != 0 (fully_async_trainer.py, fit), and x % -1 is
    # always 0 in Python. 1000 never validates here (it would at version 1000) and logs the last step.
    trainer.test_freq=1000
)

run_verl --trainer fully_async "${DATA[@]}" "${MODEL[@]}" "${ALGORITHM[@]}" "${ROLLOUT[@]}" "${ASYNC[@]}" \
    "${HELPERS[@]}" "${TRAINER[@]}" "$@"
