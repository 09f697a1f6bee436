# shellcheck shell=bash
# The recipe contract. A recipe builds arrays of Hydra overrides and ends with
#     run_verl "${ARGS[@]}" "$@"
# which trains (python -m verl.trainer.main_ppo) or, when the launcher runs the recipe in plan mode
# (NPU_RL_MODE=plan: --dry-run, and the head before it starts Ray), runs the preflight on the same
# overrides instead. No PATH shims: the same function, one branch.

NPU_RL_ROOT="${NPU_RL_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"

run_verl() {
    local py="${NPU_RL_TRAIN_PYTHON:-python3}"
    if [[ "${NPU_RL_MODE:-run}" == plan ]]; then
        PYTHONPATH="$NPU_RL_ROOT${PYTHONPATH:+:$PYTHONPATH}" \
            "$py" -P -m npu_rl.preflight check --recipe "${NPU_RL_RECIPE:-$0}" -- "$@"
    elif [[ -n "${NPU_RL_RUN_DIR:-}" ]]; then
        # Under the launcher, Hydra's output folder goes into the run's log directory.
        "$py" -P -m verl.trainer.main_ppo "hydra.run.dir=$NPU_RL_RUN_DIR/hydra" "$@"
    else
        "$py" -P -m verl.trainer.main_ppo "$@"
    fi
}
