#!/usr/bin/env bash
# Integration: prints a line and exits with $TRAIN_EXIT (plan mode: the preflight stand-in passes).
set -euo pipefail
if [[ "${NPU_RL_MODE:-run}" == plan ]]; then
    echo "plan mode: nothing to check"
    exit 0
fi
echo "training on ${RAY_ADDRESS:-?} with ${NNODES:-?} x ${NPUS_PER_NODE:-?} NPU"
if [[ -n "${TRAIN_SLEEP:-}" ]]; then
    echo "sleeping ${TRAIN_SLEEP}s"
    sleep "$TRAIN_SLEEP"
fi
exit "${TRAIN_EXIT:-0}"
