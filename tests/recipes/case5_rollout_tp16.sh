#!/usr/bin/env bash
# Case 5: rollout TP 16 on 16-die nodes. Qwen3-32B has 64 heads and 8 KV heads: accepted, each KV head
# replicated on 2 dies. The tests point MODEL_PATH at other head counts for the rejected side.
exec bash "$(dirname "${BASH_SOURCE[0]}")/base_qwen3_32b.sh" \
    actor_rollout_ref.rollout.tensor_model_parallel_size=16 "$@"
