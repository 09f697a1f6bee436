# shellcheck shell=bash
# Qwen3-235B-A22B on 8 Atlas A3 nodes for the fully-async trainer: env_8node.sh, without the rollout
# progress lines, whose hook is in verl's V1 trainer (its replay buffer), which the fully-async trainer
# does not run (the preflight warns when they are switched on; docs/async.md).
export NPU_RL_ROLLOUT_PROGRESS="${NPU_RL_ROLLOUT_PROGRESS:-0}"
# shellcheck source=recipes/qwen3-235b-a22b/env_8node.sh
source "$(dirname "${BASH_SOURCE[0]}")/env_8node.sh"
