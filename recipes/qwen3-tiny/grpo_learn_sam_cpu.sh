#!/usr/bin/env bash
# GRPO that learns with SAM speculative decoding on, on CPU (issue 34, item 5): grpo_learn_cpu.sh on
# the repeat variant of the toy task (the answer is the prompt's digit 8 times, "7 7 7 7 7 7 7 7";
# the reward is the mean over those 8 words of 1 for the digit, 0.05 for another digit). As the policy
# learns, a response repeats itself and its prompt's earlier responses, so SAM's drafts (from the
# response's own text, its live siblings, and with history its prompt's responses of the first
# epoch) are accepted more and more: npu_rl/sam/acceptance and rollout/spec_accept_length per step
# (vllm patch 0005, verl patch 0012) show it.
#   bash ray_start_npu.sh recipes/qwen3-tiny/grpo_learn_sam_cpu.sh recipes/qwen3-tiny/env_cpu_learn.sh
# Env: env_cpu_learn.sh
# Evidence: python -m npu_rl.e2e check RUN_DIR --min-steps 20 --learned 0.1 (SAM's check included);
# the report: python -m npu_rl.report RUN_DIR --chance 0.1. Measured (docs/spec_decode.md, "In a
# learning run", 2026-12-07): acceptance 0.03 at step 1 -> 0.22 at step 20, validation 0 -> 1.0, 9 min;
# the history ranked by the trainer's rewards (sam_history_rewards, the default) or by age accepted
# alike. Not in CI (the CPU main job's time budget); k, history and the gate are switches.
# SAM drafts at any batch size here (the gate "always"): every response is 8 tokens and the 512
# requests of a replica run in step, so the default gate (32 running) would draft almost never.
set -euo pipefail
ROOT="${NPU_RL_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}"
REPEAT=8
TOY_SAM_DATA_DIR="${TOY_SAM_DATA_DIR:-${NPU_RL_TINY_DIR:?set by env_cpu.sh}/toy-data-repeat$REPEAT}"
PY="${NPU_RL_TRAIN_PYTHON:-python3}"
if [[ "${NPU_RL_DRY_RUN:-0}" != 1 ]]; then
    # the same 320 + 128 prompts as grpo_learn_cpu.sh's (seed 0), each answer repeated
    PYTHONPATH="$ROOT" "$PY" -P -m npu_rl.data toy --out "$TOY_SAM_DATA_DIR" --train-rows 320 --repeat "$REPEAT"
fi
S=actor_rollout_ref.rollout.engine_kwargs.vllm.speculative_config
SAM=(
    data.train_files="$TOY_SAM_DATA_DIR/toy/train.parquet"
    data.val_files="$TOY_SAM_DATA_DIR/toy/val.parquet"
    data.max_response_length="$REPEAT"
    actor_rollout_ref.rollout.max_model_len=$((20 + REPEAT))
    # 256 running requests x (1 + k) tokens a decode step
    actor_rollout_ref.rollout.max_num_batched_tokens=2048
    "+$S.method=sam"
    "+$S.num_speculative_tokens=${SPEC_TOKENS:-4}"
    "+$S.sam_batch_size_threshold=always"
    "+$S.sam_group_corpus_mb=16"
    "+$S.sam_history_mb=${SAM_HISTORY_MB:-16}"
    trainer.experiment_name=qwen3-toy-grpo-sam
)
exec bash "$(dirname "${BASH_SOURCE[0]}")/grpo_learn_cpu.sh" "${SAM[@]}" "$@"
