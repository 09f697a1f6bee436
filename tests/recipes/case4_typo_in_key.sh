#!/usr/bin/env bash
# Case 4: a typo in a Megatron key (expert_paralel_size).
exec bash "$(dirname "${BASH_SOURCE[0]}")/base_qwen3_32b.sh" \
    actor_rollout_ref.actor.megatron.expert_paralel_size=8 "$@"
