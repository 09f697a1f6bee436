# shellcheck shell=bash
# Qwen3-32B on 2 Atlas A3 nodes for the separate-pool trainers (fully-async, one-step-off-policy):
# env_2node.sh, without the rollout progress lines, whose hook is in verl's V1 trainer (its replay
# buffer), which these trainers do not run (the preflight warns when they are switched on; docs/async.md).
export NPU_RL_ROLLOUT_PROGRESS="${NPU_RL_ROLLOUT_PROGRESS:-0}"
# shellcheck source=recipes/qwen3-32b/env_2node.sh
source "$(dirname "${BASH_SOURCE[0]}")/env_2node.sh"
