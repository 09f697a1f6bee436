#!/usr/bin/env bash
# Case 3: 2048-token prompts + 32768-token responses with rollout max_model_len=32768.
exec bash "$(dirname "${BASH_SOURCE[0]}")/base_qwen3_32b.sh" \
    data.max_prompt_length=2048 data.max_response_length=32768 \
    actor_rollout_ref.rollout.max_model_len=32768 "$@"
