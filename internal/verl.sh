# shellcheck shell=bash
# The recipe contract. A recipe sources this file, builds arrays of Hydra overrides and ends with
#     run_verl [--trainer sync|fully_async|one_step_off] "${ARGS[@]}" "$@"
# which trains with verl's entry point for that trainer or, when the launcher runs the recipe in plan
# mode (NPU_RL_MODE=plan: --dry-run, and the head before it starts Ray), runs the preflight on the
# same overrides instead. No PATH shims: the same function, one branch. A recipe outside the
# repository finds this file through NPU_RL_ROOT, which the launcher exports:
#     source "${NPU_RL_ROOT:-$(dirname "${BASH_SOURCE[0]}")/../..}/internal/verl.sh"
# Trainers (docs/async.md), each a Hydra app of the pinned verl with its own config folder:
#   sync          python -m verl.trainer.main_ppo (config ppo_trainer; default)
#   fully_async   python -m verl.experimental.fully_async_policy.fully_async_main
#                 (config fully_async_ppo_trainer; Megatron: --config-name=fully_async_ppo_megatron_trainer)
#   one_step_off  python -m verl.experimental.one_step_off_policy.main_ppo
#                 (config one_step_off_ppo_trainer; Megatron: --config-name=one_step_off_ppo_megatron_trainer)
# The experimental configs (all but fully_async_ppo_trainer) find verl's base config through the
# searchpath file://verl/trainer/config, which Hydra resolves against the working directory (verl's
# own scripts run from its checkout): run_verl passes hydra.searchpath=[pkg://verl.trainer.config]
# (what fully_async_ppo_trainer.yaml itself says) so that they compose from any directory.

NPU_RL_ROOT="${NPU_RL_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"

# The module verl runs for trainer $1 (NPU_RL_TRAINERS lists them); 2 for another name.
verl::trainer_module() {
    case "$1" in
        sync) printf '%s\n' verl.trainer.main_ppo ;;
        fully_async) printf '%s\n' verl.experimental.fully_async_policy.fully_async_main ;;
        one_step_off) printf '%s\n' verl.experimental.one_step_off_policy.main_ppo ;;
        *) return 2 ;;
    esac
}
NPU_RL_TRAINERS="sync fully_async one_step_off"

run_verl() {
    local py="${NPU_RL_TRAIN_PYTHON:-python3}" trainer=sync module a
    local -a extra=()
    if [[ -n "${NPU_RL_SOURCING_ENV:-}" ]]; then
        # Reached while the launcher sources its ENV_SCRIPT: that script is a train script.
        printf '[npu-rl] error: %s\n' "run_verl was reached while the launcher sourced ENV_SCRIPT $NPU_RL_SOURCING_ENV (${BASH_SOURCE[1]:-?}:${BASH_LINENO[0]}): it is a train script, not a node environment; nothing was trained. The train script comes first: bash ray_start_npu.sh [--dry-run] TRAIN_SCRIPT ENV_SCRIPT" >&2
        _NRL_REFUSED=1
        exit 2
    fi
    case "${1:-}" in
        --trainer)
            trainer="${2:-}"
            shift $(($# < 2 ? $# : 2))
            ;;
        --trainer=*)
            trainer="${1#--trainer=}"
            shift
            ;;
    esac
    if ! module="$(verl::trainer_module "$trainer")"; then
        printf '[npu-rl] error: run_verl --trainer %q (%s:%s): no such trainer; choose one of: %s (docs/async.md)\n' \
            "$trainer" "${BASH_SOURCE[1]:-?}" "${BASH_LINENO[0]}" "${NPU_RL_TRAINERS// /, }" >&2
        _NRL_REFUSED=1
        exit 2
    fi
    for a in "$@"; do
        if [[ "$a" == --trainer || "$a" == --trainer=* ]]; then
            printf '[npu-rl] error: run_verl got %s after the overrides (%s:%s): --trainer must be the first argument, before the overrides: run_verl --trainer %s OVERRIDES...\n' \
                "$a" "${BASH_SOURCE[1]:-?}" "${BASH_LINENO[0]}" "${NPU_RL_TRAINERS// /|}" >&2
            _NRL_REFUSED=1
            exit 2
        fi
    done
    if [[ "$trainer" != sync ]]; then
        extra=("hydra.searchpath=[pkg://verl.trainer.config]")
    fi
    # Plan mode is the launcher's NPU_RL_MODE=plan or its preflight mark: a recipe that resets one
    # still gets the preflight, never main_ppo.
    if [[ "${NPU_RL_MODE:-run}" == plan || -n "${NPU_RL_PLAN_MARK:-}" ]]; then
        PYTHONPATH="$NPU_RL_ROOT${PYTHONPATH:+:$PYTHONPATH}" \
            "$py" -P -m npu_rl.preflight check --trainer "$trainer" --recipe "${NPU_RL_RECIPE:-$0}" -- "${extra[@]}" "$@"
    elif [[ -n "${NPU_RL_RUN_DIR:-}" ]]; then
        # Under the launcher, Hydra's output folder goes into the run's log directory.
        "$py" -P -m "$module" "hydra.run.dir=$NPU_RL_RUN_DIR/hydra" "${extra[@]}" "$@"
    else
        "$py" -P -m "$module" "${extra[@]}" "$@"
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
