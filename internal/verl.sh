# shellcheck shell=bash
# The recipe contract. A recipe sources this file, builds arrays of Hydra overrides and ends with
#     run_verl "${ARGS[@]}" "$@"
# which trains (python -m verl.trainer.main_ppo) or, when the launcher runs the recipe in plan mode
# (NPU_RL_MODE=plan: --dry-run, and the head before it starts Ray), runs the preflight on the same
# overrides instead. No PATH shims: the same function, one branch. A recipe outside the repository
# finds this file through NPU_RL_ROOT, which the launcher exports:
#     source "${NPU_RL_ROOT:-$(dirname "${BASH_SOURCE[0]}")/../..}/internal/verl.sh"

NPU_RL_ROOT="${NPU_RL_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"

run_verl() {
    local py="${NPU_RL_TRAIN_PYTHON:-python3}"
    if [[ -n "${NPU_RL_SOURCING_ENV:-}" ]]; then
        # Reached while the launcher sources its ENV_SCRIPT: that script is a train script.
        printf '[npu-rl] error: %s\n' "run_verl was reached while the launcher sourced ENV_SCRIPT $NPU_RL_SOURCING_ENV (${BASH_SOURCE[1]:-?}:${BASH_LINENO[0]}): it is a train script, not a node environment; nothing was trained. The train script comes first: bash ray_start_npu.sh [--dry-run] TRAIN_SCRIPT ENV_SCRIPT" >&2
        _NRL_REFUSED=1
        exit 2
    fi
    # Plan mode is the launcher's NPU_RL_MODE=plan or its preflight mark: a recipe that resets one
    # still gets the preflight, never main_ppo.
    if [[ "${NPU_RL_MODE:-run}" == plan || -n "${NPU_RL_PLAN_MARK:-}" ]]; then
        PYTHONPATH="$NPU_RL_ROOT${PYTHONPATH:+:$PYTHONPATH}" \
            "$py" -P -m npu_rl.preflight check --recipe "${NPU_RL_RECIPE:-$0}" -- "$@"
    elif [[ -n "${NPU_RL_RUN_DIR:-}" ]]; then
        # Under the launcher, Hydra's output folder goes into the run's log directory.
        "$py" -P -m verl.trainer.main_ppo "hydra.run.dir=$NPU_RL_RUN_DIR/hydra" "$@"
    else
        "$py" -P -m verl.trainer.main_ppo "$@"
    fi
}

# The rollout's fast path (docs/fast_path.md), as Hydra overrides in the array FAST_PATH:
#   verl::fast_path TRAJECTORIES RANKS MAX_NUM_SEQS
# TRAJECTORIES: responses one step generates (train_batch_size x n); RANKS: the rollout's vLLM DP
# ranks over the whole job (dies / rollout TP); MAX_NUM_SEQS: rollout.max_num_seqs.
# - graph mode ROLLOUT_GRAPH_MODE, default FULL_DECODE_ONLY, or FULL when SPEC_TOKENS > 0: vllm-ascend
#   keeps npugraph_ex only in FULL and FULL_DECODE_ONLY (verl's default FULL_AND_PIECEWISE turns it off),
#   and FULL_DECODE_ONLY replays only uniform decode batches, which a drafter with short drafts (SAM,
#   n-gram) breaks;
# - capture sizes up to the requests one rank decodes at once (min(MAX_NUM_SEQS, TRAJECTORIES / RANKS)
#   x (1 + SPEC_TOKENS) tokens, at most 512): 14 graphs where vLLM's default list has 35.
verl::fast_path() {
    local trajectories="${1:-}" ranks="${2:-}" max_seqs="${3:-}" spec="${SPEC_TOKENS:-0}" mode seqs sizes
    local n
    for n in "$trajectories" "$ranks" "$max_seqs" "$spec"; do
        if ! [[ "$n" =~ ^[0-9]+$ ]]; then
            printf '[npu-rl] error: verl::fast_path TRAJECTORIES RANKS MAX_NUM_SEQS (and SPEC_TOKENS) take whole numbers, got %q %q %q (SPEC_TOKENS=%q)\n' "$trajectories" "$ranks" "$max_seqs" "$spec" >&2
            return 2
        fi
    done
    if ((ranks < 1 || max_seqs < 1)); then
        printf '[npu-rl] error: verl::fast_path needs RANKS >= 1 and MAX_NUM_SEQS >= 1, got %s and %s\n' "$ranks" "$max_seqs" >&2
        return 2
    fi
    mode="${ROLLOUT_GRAPH_MODE:-}"
    if [[ -z "$mode" ]]; then
        mode=FULL_DECODE_ONLY
        ((spec == 0)) || mode=FULL
    fi
    seqs=$(((trajectories + ranks - 1) / ranks))
    ((seqs <= max_seqs)) || seqs="$max_seqs"
    ((seqs >= 1)) || seqs=1
    sizes="$(verl::capture_sizes "$seqs" $((1 + spec)))"
    # shellcheck disable=SC2034 # FAST_PATH is the result: the recipe that called this passes it to run_verl
    FAST_PATH=(
        "+actor_rollout_ref.rollout.engine_kwargs.vllm.compilation_config.cudagraph_mode=$mode"
        "actor_rollout_ref.rollout.cudagraph_capture_sizes=$sizes"
    )
}

# A short ACL graph capture list for one vLLM DP rank, as a Hydra list (npu_rl.preflight.fastpath.capture_sizes
# is the same rule): 1 2 4 8 16 24 32 48 64 96 128 160 192 256 320 384 512 below SEQS x DECODE_LEN
# tokens (at most 512, vllm-ascend's own default cap), then that limit itself.
#   verl::capture_sizes SEQS DECODE_LEN
verl::capture_sizes() {
    local top=$(($1 * $2)) out="" s
    ((top <= 512)) || top=512
    for s in 1 2 4 8 16 24 32 48 64 96 128 160 192 256 320 384 512; do
        if ((s < top)); then
            out+="$s,"
        fi
    done
    printf '[%s%d]\n' "$out" "$top"
}
