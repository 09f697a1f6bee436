#!/usr/bin/env bash
# Qwen3-32B GRPO with SAM speculative decoding: grpo_32die.sh plus the suffix-automaton drafter.
#   bash ray_start_npu.sh recipes/qwen3-32b/grpo_32die_sam.sh recipes/qwen3-32b/env_2node.sh
# Each vLLM engine drafts k = 3 tokens from the longest suffix match in the response's own text or its
# live and finished siblings (256 MiB group corpus per engine), only while its running batch is at
# most 32 requests (the long tail); vLLM's rejection sampler verifies the drafts, so sampling and
# log-probs are unchanged. History (earlier rounds' responses of a prompt) is off: this recipe trains
# one epoch, so no prompt comes back; with total_epochs >= 2 add +$S.sam_history_mb=N (sizing in
# docs/spec_decode.md, "History"). The gate is the default (32); change it with
# VLLM_SPECULATIVE_BATCH_SIZE_THRE in the ENV script, or with +$S.sam_batch_size_threshold=N on the
# launcher's command line. See docs/spec_decode.md.
# Graph mode FULL, not FULL_DECODE_ONLY: SAM's drafts are often short or empty, and FULL_DECODE_ONLY
# replays graphs only for uniform decode batches (every request 1 + k tokens); the capture list grows
# to 256 requests x 4 tokens (capped at 512). docs/fast_path.md.
set -euo pipefail
S=actor_rollout_ref.rollout.engine_kwargs.vllm.speculative_config
export SPEC_TOKENS="${SPEC_TOKENS:-3}"
SAM=(
    "+$S.method=sam"
    "+$S.num_speculative_tokens=$SPEC_TOKENS"
    "+$S.sam_group_corpus_mb=256"
    trainer.experiment_name=grpo-32die-sam
)
exec bash "$(dirname "${BASH_SOURCE[0]}")/grpo_32die.sh" "${SAM[@]}" "$@"
