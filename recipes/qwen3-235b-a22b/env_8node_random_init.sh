# shellcheck shell=bash
# Qwen3-235B-A22B random-init throughput runs on 8 x 16 dies: the 8-node env plus NPU_RL_RANDOM_INIT=1.
# Feature variables belong here (sourced on every node before Ray starts), not in the train script.
# Only config and tokenizer are needed: python -m npu_rl.models download Qwen/Qwen3-235B-A22B --config-only
# shellcheck source=recipes/qwen3-235b-a22b/env_8node.sh
source "$(dirname "${BASH_SOURCE[0]}")/env_8node.sh"
export NPU_RL_RANDOM_INIT=1
