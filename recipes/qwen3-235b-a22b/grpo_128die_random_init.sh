#!/usr/bin/env bash
# Qwen3-235B-A22B GRPO with random init: throughput work without the 470 GB checkpoint, 8 nodes x 16 dies.
#   bash ray_start_npu.sh recipes/qwen3-235b-a22b/grpo_128die_random_init.sh recipes/qwen3-235b-a22b/env_8node_random_init.sh
# Env: env_8node_random_init.sh
# grpo_128die.sh with vLLM starting from dummy weights (the trainer's reach it at the first sync);
# NPU_RL_RANDOM_INIT=1 comes from the env script (every node). Rewards are meaningless: read throughput.
set -euo pipefail
RANDOM_INIT=(
    actor_rollout_ref.rollout.load_format=dummy
    trainer.experiment_name=grpo-128die-random-init
)
exec bash "$(dirname "${BASH_SOURCE[0]}")/grpo_128die.sh" "${RANDOM_INIT[@]}" "$@"
