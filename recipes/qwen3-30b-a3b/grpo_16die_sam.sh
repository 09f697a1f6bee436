#!/usr/bin/env bash
# Qwen3-30B-A3B GRPO with SAM speculative decoding: grpo_16die.sh plus the suffix-automaton drafter.
#   bash ray_start_npu.sh recipes/qwen3-30b-a3b/grpo_16die_sam.sh recipes/qwen3-30b-a3b/env_1node.sh
# The settings of the reference's History Tree run (16 dies, 16K responses, n 8, 4 draft tokens,
# drafting at every batch size). Each vLLM engine drafts k = 4 tokens from the longest suffix match
# in the response's own text or its live and finished siblings (256 MiB per engine); vLLM's
# rejection sampler verifies the drafts, so sampling and log-probs are unchanged.
# Gate "always", not the default 32: with 3B active parameters a decode step stays bound by reading
# KV and expert weights at the full batch, so verifying 5 tokens per request costs little; the
# reference's History Tree drafts at every batch size (-12.8% generate time, published), and our
# simulator predicts -34% [-35%, -11%] at these settings with SAM's own-text acceptance and 0% /
# -4.3% with gates 8 / 32 (docs/sim.md). If timing_s/generate_sequences grows, set the gate back
# (no "+": the key is this recipe's):
#   actor_rollout_ref.rollout.engine_kwargs.vllm.speculative_config.sam_batch_size_threshold=32
# (VLLM_SPECULATIVE_BATCH_SIZE_THRE in the ENV script would disagree with this recipe's key: refused.)
# History (earlier rounds' responses of a prompt) is off: this recipe trains one epoch, so no prompt
# comes back. With total_epochs >= 2, add +...speculative_config.sam_history_mb=N, N >= prompts per
# epoch x n x mean response tokens x 4 B / 2^20 (docs/spec_decode.md, "History").
# Graph mode FULL (SAM's drafts vary in length); docs/spec_decode.md, docs/fast_path.md.
set -euo pipefail
S=actor_rollout_ref.rollout.engine_kwargs.vllm.speculative_config
export SPEC_TOKENS="${SPEC_TOKENS:-4}"
SAM=(
    "+$S.method=sam"
    "+$S.num_speculative_tokens=$SPEC_TOKENS"
    "+$S.sam_group_corpus_mb=256"
    "+$S.sam_batch_size_threshold=always"
    trainer.experiment_name=grpo-16die-sam
)
exec bash "$(dirname "${BASH_SOURCE[0]}")/grpo_16die.sh" "${SAM[@]}" "$@"
