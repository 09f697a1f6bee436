# shellcheck shell=bash
# The node environment of the fully-async CPU recipe (grpo_cpu_fully_async.sh): env_cpu.sh, with
# what the fully-async trainer needs instead (docs/e2e.md, "The fully-async run"):
#   bash ray_start_npu.sh recipes/qwen3-tiny/grpo_cpu_fully_async.sh recipes/qwen3-tiny/env_cpu_async.sh
# - Ray logical CPUs: verl's fully-async controllers ask for 23 (FullyAsyncTrainer 10,
#   FullyAsyncRollouter 10, MessageQueue 2, the task runner 1; fully_async_*.py, message_queue.py)
#   before the pools' placement groups (3 each) and the helper actors (1 each); with env_cpu.sh's 16
#   the rollouter would wait for CPUs forever. 48 is what the measured runs used; the recipe refuses
#   fewer. If you set RAY_START_ARGS yourself, keep --num-cpus=48 (or more) in it.
# - Features the preflight refuses or finds without effect under this trainer are off: the long-tail
#   guard (refused with partial rollout: no step waits for a response), rollout progress (the V1
#   trainer's lines; the rollouter logs its own) and rollout rebalance (one rollout replica here,
#   and its metrics are the V1 trainer's). The engine GC guard stays on (it runs in the vLLM engine).
export RAY_START_ARGS="${RAY_START_ARGS:---num-cpus=48}"
export VLLM_ROLLOUT_EARLY_STOP_ENABLE="${VLLM_ROLLOUT_EARLY_STOP_ENABLE:-0}"
export NPU_RL_ROLLOUT_PROGRESS="${NPU_RL_ROLLOUT_PROGRESS:-0}"
export ROLLOUT_REBALANCE_ENABLE="${ROLLOUT_REBALANCE_ENABLE:-0}"
# shellcheck source=recipes/qwen3-tiny/env_cpu.sh
source "${NPU_RL_ROOT:?set by the launcher}/recipes/qwen3-tiny/env_cpu.sh"
# env_cpu.sh tunes the guard and the progress lines; with them off here, their settings would only
# draw "set but has no effect" warnings.
if [[ "$VLLM_ROLLOUT_EARLY_STOP_ENABLE" == 0 ]]; then
    unset VLLM_ROLLOUT_EARLY_STOP_FACTOR VLLM_ROLLOUT_EARLY_STOP_MIN_TOKENS VLLM_ROLLOUT_EARLY_STOP_FINISHED_FRACTION
fi
if [[ "$NPU_RL_ROLLOUT_PROGRESS" == 0 ]]; then
    unset NPU_RL_ROLLOUT_PROGRESS_INTERVAL
fi
