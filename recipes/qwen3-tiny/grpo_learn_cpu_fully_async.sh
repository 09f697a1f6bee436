#!/usr/bin/env bash
# Fully-async GRPO that learns, on CPU (issue 34): the toy model and task of grpo_learn_cpu.sh on verl
# 0.9.1's fully-async trainer (verl/experimental/fully_async_policy) as grpo_cpu_fully_async.sh runs
# it: separate pools (1 logical die for the trainer, FSDP2; 1 for the rollouter, one vLLM server), a
# message queue between them, a staleness threshold of 0.5 (the rollouter may run 4 prompts ahead of
# the trainer, so every step after the first trains on samples of the previous weights), partial
# rollout on, and the weights sent through our gloo checkpoint engine after every step.
#   bash ray_start_npu.sh recipes/qwen3-tiny/grpo_learn_cpu_fully_async.sh recipes/qwen3-tiny/env_cpu_async_learn.sh
# Env: env_cpu_async_learn.sh
# Schedule: the sync learning run's 80 optimizer steps of 8 prompts x 32 responses at lr 3e-3, one per
# trainer step (ppo_mini_batch_size 8, require_batches 1: the shape under which actor/ppo_kl is the
# rollout-vs-actor KL the evidence checks), 640 prompts = 80 weight versions, validation before
# training and every 20 versions. Answers are one token, so no request is ever in flight long
# enough for a weight sync to interrupt it: partial rollout is on but has nothing to resume
# (docs/e2e.md says why no CPU run can show one).
# Measured (docs/e2e.md, "Learning runs"): with 64 versions, validation 0 / 0.64 / 1.0 / 1.0 / 1.0 at
# versions 0/16/32/48/64 in 3 min 51 s; verl's trainer logs one step fewer than weight versions.
# (and 0.866 from version 40 to 80 in the clean-clone CI at e284f23: the plateau of groups of 16, later).
# Evidence: python -m npu_rl.e2e check-async RUN_DIR --min-steps 79 --learned 0.1 --final-val 0.8
set -euo pipefail
# shellcheck source=internal/verl.sh
source "${NPU_RL_ROOT:-$(dirname "${BASH_SOURCE[0]}")/../..}/internal/verl.sh"

START="bash ray_start_npu.sh recipes/qwen3-tiny/grpo_learn_cpu_fully_async.sh recipes/qwen3-tiny/env_cpu_async_learn.sh"
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
TOY_MODEL_PATH="${TOY_MODEL_PATH:-${NPU_RL_TINY_DIR:?set by env_cpu.sh}/Qwen3-toy}"
TOY_TRAIN_ROWS=320
TOY_DATA_DIR="${TOY_DATA_DIR:-$NPU_RL_TINY_DIR/toy-data}"
PY="${NPU_RL_TRAIN_PYTHON:-python3}"

# Make what the run reads, as grpo_learn_cpu.sh does (not in a --dry-run, which must not write anything).
if [[ "${NPU_RL_DRY_RUN:-0}" != 1 ]]; then
    PYTHONPATH="$NPU_RL_ROOT" "$PY" -P -m npu_rl.models toy "$TOY_MODEL_PATH" --layers 1 --hidden 128 --seed 2
    PYTHONPATH="$NPU_RL_ROOT" "$PY" -P -m npu_rl.data toy --out "$TOY_DATA_DIR" --train-rows "$TOY_TRAIN_ROWS"
fi

DATA=(
    data.train_files="$TOY_DATA_DIR/toy/train.parquet"
    data.val_files="$TOY_DATA_DIR/toy/val.parquet"
    data.train_batch_size=0
    data.gen_batch_size=1
    data.max_prompt_length=20
    data.max_response_length=1
    data.dataloader_num_workers=0
)
MODEL=(
    actor_rollout_ref.model.path="$TOY_MODEL_PATH"
    actor_rollout_ref.model.use_remove_padding=False
    +actor_rollout_ref.model.override_config.attn_implementation=sdpa
)
# As grpo_cpu.sh: no reward for a random model, the entropy bonus moves the policy every update,
# fp32 on both sides so rollout and actor log-probs differ only by kernels.
# The task's reward, through verl's own custom reward function mechanism.
REWARD=(
    reward.custom_reward_function.path="$NPU_RL_ROOT/npu_rl/toy.py"
    reward.custom_reward_function.name=compute_score
)
ALGORITHM=(
    algorithm.adv_estimator=grpo
    actor_rollout_ref.actor.use_kl_loss=False
    # Groups of 32 and an entropy bonus of 0.02, as the sync run: with groups of 16 the policy turned
    # deterministic while a tenth of the validation prompts were still wrong (0.807 from version 40 to
    # 80 without a bonus, 0.673 in a CI run with 0.01): every answer in their groups alike, so no advantage.
    actor_rollout_ref.actor.entropy_coeff=0.02
    actor_rollout_ref.actor.optim.lr=3e-3
    actor_rollout_ref.actor.ppo_mini_batch_size=8
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=64
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=64
    actor_rollout_ref.actor.strategy=fsdp2
    actor_rollout_ref.actor.fsdp_config.param_offload=False
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=False
    '+actor_rollout_ref.actor.fsdp_config.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}'
)
ROLLOUT=(
    actor_rollout_ref.hybrid_engine=False
    actor_rollout_ref.rollout.name=vllm
    actor_rollout_ref.rollout.n=32
    rollout.n=32
    actor_rollout_ref.rollout.tensor_model_parallel_size=1
    actor_rollout_ref.rollout.dtype=float32
    actor_rollout_ref.rollout.gpu_memory_utilization=0.03
    actor_rollout_ref.rollout.max_num_batched_tokens=1024
    actor_rollout_ref.rollout.max_model_len=21
    actor_rollout_ref.rollout.max_num_seqs=256
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
    rollout.total_rollout_steps=640
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
    trainer.experiment_name=qwen3-toy-grpo-fully-async
    'trainer.logger=["console","file"]'
    trainer.val_before_train=True
    trainer.total_epochs=2
    trainer.save_freq=-1
    # Not -1: the fully-async trainer logs a step's metrics one step late and flushes the last step
    # only when current_param_version % test_freq != 0 (fully_async_trainer.py, fit), and x % -1 is
    # always 0 in Python. 1000 never validates here (it would at version 1000) and logs the last step.
    trainer.test_freq=20
)

run_verl --trainer fully_async "${DATA[@]}" "${MODEL[@]}" "${REWARD[@]}" "${ALGORITHM[@]}" "${ROLLOUT[@]}" "${ASYNC[@]}" \
    "${HELPERS[@]}" "${TRAINER[@]}" "$@"
