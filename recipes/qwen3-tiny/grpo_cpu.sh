#!/usr/bin/env bash
# GRPO on a tiny random Qwen3 (2 layers, hidden 128, the real tokenizer) on CPU: the project's main
# job, which runs on any Linux x86-64 machine (CI included) through the real launcher, verl's
# main_ppo, the patched vLLM's CPU engine, verl's GSM8K reward, FSDP updates and weight syncs.
#   bash ray_start_npu.sh recipes/qwen3-tiny/grpo_cpu.sh recipes/qwen3-tiny/env_cpu.sh
# Env: env_cpu.sh
# The model (python -m npu_rl.models tiny) and the data (python -m npu_rl.data gsm8k, 20 GSM8K
# questions shipped in tests/data) are made on first use under $NPU_RL_TINY_DIR.
set -euo pipefail
# shellcheck source=internal/verl.sh
source "${NPU_RL_ROOT:-$(dirname "${BASH_SOURCE[0]}")/../..}/internal/verl.sh"

if [[ "${VERL_PLATFORM:-}" != cpu ]]; then
    echo "error: recipes/qwen3-tiny/grpo_cpu.sh runs on verl's CPU platform only; start it with its env script:" \
        "bash ray_start_npu.sh recipes/qwen3-tiny/grpo_cpu.sh recipes/qwen3-tiny/env_cpu.sh" >&2
    exit 65
fi
NPUS_PER_NODE="${NPUS_PER_NODE:-2}"
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

DATA=(
    data.train_files="$DATA_DIR/gsm8k/train.parquet"
    data.val_files="$DATA_DIR/gsm8k/train.parquet"
    data.train_batch_size=10
    data.max_prompt_length=256
    data.max_response_length=48
    data.dataloader_num_workers=0
)
MODEL=(
    actor_rollout_ref.model.path="$MODEL_PATH"
    actor_rollout_ref.model.use_remove_padding=False
    +actor_rollout_ref.model.override_config.attn_implementation=sdpa
)
ALGORITHM=(
    algorithm.adv_estimator=grpo
    actor_rollout_ref.actor.use_kl_loss=False
    # A random model earns no GSM8K reward (all advantages 0): the entropy bonus makes every update
    # move the weights, so the weight sync is visible in the rollout's log-probabilities.
    actor_rollout_ref.actor.entropy_coeff=0.01
    actor_rollout_ref.actor.optim.lr=1e-3
    # Two optimizer steps per training step: the second mini-batch's actor/ppo_kl measures how far
    # one update moves the policy, the scale the rollout-vs-actor KL is judged against.
    actor_rollout_ref.actor.ppo_mini_batch_size=5
    # Micro-batches of 2: the logits of one sequence are 304 x 151,669 floats (184 MB).
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2
    actor_rollout_ref.actor.strategy=fsdp2
    actor_rollout_ref.actor.fsdp_config.param_offload=False
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=False
    # fp32 end to end (vLLM runs the model in fp32 too): rollout and actor log-probs then differ only
    # by kernels, and the rollout-vs-actor KL says whether the weights arrived.
    '+actor_rollout_ref.actor.fsdp_config.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}'
)
ROLLOUT=(
    actor_rollout_ref.rollout.name=vllm
    actor_rollout_ref.rollout.n=4
    actor_rollout_ref.rollout.tensor_model_parallel_size=1
    actor_rollout_ref.rollout.dtype=float32
    # On CPU this is the share of host memory each vLLM replica reserves (its KV cache).
    actor_rollout_ref.rollout.gpu_memory_utilization=0.03
    actor_rollout_ref.rollout.max_num_batched_tokens=1024
    actor_rollout_ref.rollout.max_model_len=304
    actor_rollout_ref.rollout.max_num_seqs=64
    actor_rollout_ref.rollout.enforce_eager=True
    actor_rollout_ref.rollout.free_cache_engine=False
    +actor_rollout_ref.rollout.enable_sleep_mode=False
    actor_rollout_ref.rollout.checkpoint_engine.backend=naive
    # Each bucket is a shared-memory segment of this size (verl's default 2,048 MB would need a
    # /dev/shm that big); the tiny model's largest tensor, the embedding, is 78 MB.
    actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=256
    actor_rollout_ref.rollout.calculate_log_probs=True
)
# verl's helper processes (each imports torch and verl: ~0.3-0.6 GB): a handful, not 8 of each.
HELPERS=(
    actor_rollout_ref.rollout.agent.num_workers=2
    reward.num_workers=1
    transfer_queue.backend.SimpleStorage.num_data_storage_units=1
)
# Every feature that runs on CPU, switched as users switch them (the variables are in env_cpu.sh).
# Buckets of 8 tokens: responses here are 1-48 tokens, the default 1024-token bucket would be one.
FEATURES=(
    data.sampler.class_name=LengthAwareEpochSampler
    +data.sampler.bucket_size=8
    +data.sampler.shuffle_batch_blocks=False
)
TRAINER=(
    trainer.device=cpu
    trainer.nnodes=1
    trainer.n_gpus_per_node="$NPUS_PER_NODE"
    trainer.project_name=npu-rl-cpu
    trainer.experiment_name=qwen3-tiny-grpo
    'trainer.logger=["console"]'
    trainer.val_before_train=False
    trainer.total_epochs=2
    trainer.save_freq=-1
    trainer.test_freq=-1
)

run_verl "${DATA[@]}" "${MODEL[@]}" "${ALGORITHM[@]}" "${ROLLOUT[@]}" "${HELPERS[@]}" "${FEATURES[@]}" "${TRAINER[@]}" "$@"
