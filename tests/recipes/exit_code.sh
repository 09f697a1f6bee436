#!/usr/bin/env bash
# Integration: prints a line and exits with $TRAIN_EXIT (plan mode: the preflight stand-in passes).
set -euo pipefail
if [[ "${NPU_RL_MODE:-run}" == plan ]]; then
    # Stands in for run_verl's preflight (this recipe has no verl config): it leaves the same mark.
    # PLAN_EXIT: a rejection, as the preflight reports one.
    echo ok >"$NPU_RL_PLAN_MARK"
    if [[ -n "${PLAN_EXIT:-}" ]]; then
        echo "[npu-rl] error: the stand-in preflight rejects this recipe (PLAN_EXIT=$PLAN_EXIT)"
        exit "$PLAN_EXIT"
    fi
    echo "plan mode: nothing to check"
    exit 0
fi
echo "training on ${RAY_ADDRESS:-?} with ${NNODES:-?} x ${NPUS_PER_NODE:-?} NPU"
if [[ -n "${TRAIN_SLEEP:-}" ]]; then
    echo "sleeping ${TRAIN_SLEEP}s"
    sleep "$TRAIN_SLEEP"
fi
exit "${TRAIN_EXIT:-0}"
