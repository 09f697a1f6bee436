# shellcheck shell=bash
# The node environment of the CPU learning recipe (grpo_learn_cpu.sh): env_cpu.sh, with the one
# feature that cannot act on its task off:
#   bash ray_start_npu.sh recipes/qwen3-tiny/grpo_learn_cpu.sh recipes/qwen3-tiny/env_cpu_learn.sh
# - the long-tail guard: the toy task's answers are one token (data.max_response_length=1), so no
#   response is ever longer than another and the guard has nothing to cut (with it on, the preflight
#   warns that VLLM_ROLLOUT_EARLY_STOP_MIN_TOKENS is not below data.max_response_length and the run's
#   evidence finds no cut). Its cuts are proven by the GSM8K recipes (grpo_cpu.sh) and the guard's tests.
# Every other CPU feature stays on: the length-aware resampler (the recipe), rollout rebalance,
# rollout progress and the engine GC guard.
export VLLM_ROLLOUT_EARLY_STOP_ENABLE="${VLLM_ROLLOUT_EARLY_STOP_ENABLE:-0}"
# The preflight's model facts (layers, heads, vocabulary, max_position_embeddings 128): the toy
# model's config.json as python -m npu_rl.models toy writes it (the model itself is made on first use).
export NPU_RL_MODEL_META="${NPU_RL_MODEL_META:-$NPU_RL_ROOT/recipes/qwen3-tiny/toy_config.json}"
# shellcheck source=recipes/qwen3-tiny/env_cpu.sh
source "${NPU_RL_ROOT:?set by the launcher}/recipes/qwen3-tiny/env_cpu.sh"
# env_cpu.sh tunes the guard; with it off here, its settings would only draw "set but has no effect" warnings.
if [[ "$VLLM_ROLLOUT_EARLY_STOP_ENABLE" == 0 ]]; then
    unset VLLM_ROLLOUT_EARLY_STOP_FACTOR VLLM_ROLLOUT_EARLY_STOP_MIN_TOKENS VLLM_ROLLOUT_EARLY_STOP_FINISHED_FRACTION
fi
