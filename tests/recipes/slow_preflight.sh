#!/usr/bin/env bash
# Integration: in plan mode a Python child that sleeps stands in for a slow preflight (the real one is
# Python too); PREFLIGHT_MARKER names it so that the tests can find a leftover.
set -euo pipefail
if [[ "${NPU_RL_MODE:-run}" == plan ]]; then
    "${NPU_RL_TRAIN_PYTHON:-python3}" -c 'import sys, time; print("preflight running", flush=True); time.sleep(120)' \
        "${PREFLIGHT_MARKER:-slow-preflight}"
    echo ok >"$NPU_RL_PLAN_MARK"
    exit 0
fi
echo "training (the tests never get here)"
