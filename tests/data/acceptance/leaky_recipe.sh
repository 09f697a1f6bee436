#!/usr/bin/env bash
# Test recipe of tests/test_npu_acceptance_on_cpu.py: in plan mode it leaves the preflight's mark
# (like tests/recipes/exit_code.sh); in a real run it leaves a process behind in a session of its
# own, as a vLLM engine core orphaned by a crash would be (outside the recipe's process group, so the
# launcher's stop does not reach it), then "trains" for $TRAIN_SLEEP seconds and exits $TRAIN_EXIT.
set -euo pipefail
if [[ "${NPU_RL_MODE:-run}" == plan ]]; then
    echo "plan mode: nothing to check"
    echo ok >"$NPU_RL_PLAN_MARK"
    exit 0
fi
setsid bash -c 'exec -a VLLM::EngineCore sleep 600' </dev/null >/dev/null 2>&1 &
echo "training on ${RAY_ADDRESS:-?}; left behind: pid $!"
sleep "${TRAIN_SLEEP:-0}"
exit "${TRAIN_EXIT:-0}"
