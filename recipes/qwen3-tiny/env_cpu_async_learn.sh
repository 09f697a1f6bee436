# shellcheck shell=bash
# The node environment of the fully-async CPU learning recipe (grpo_learn_cpu_fully_async.sh):
# env_cpu_async.sh (48 Ray CPUs; the guard, rollout progress and rollout rebalance off, it says why),
# with the preflight's facts of the toy model (recipes/qwen3-tiny/toy_config.json, as
# python -m npu_rl.models toy writes its config.json; the model itself is made on first use).
#   bash ray_start_npu.sh recipes/qwen3-tiny/grpo_learn_cpu_fully_async.sh recipes/qwen3-tiny/env_cpu_async_learn.sh
export NPU_RL_MODEL_META="${NPU_RL_MODEL_META:-$NPU_RL_ROOT/recipes/qwen3-tiny/toy_config.json}"
# shellcheck source=recipes/qwen3-tiny/env_cpu_async.sh
source "${NPU_RL_ROOT:?set by the launcher}/recipes/qwen3-tiny/env_cpu_async.sh"
