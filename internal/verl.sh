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
