#!/usr/bin/env bash
# The NPU acceptance suite (docs/npu_acceptance.md): on one Ascend node, real recipes through
# ray_start_npu.sh, every feature off and on (A/B), and a report to attach to an issue or a PR.
#   bash tools/npu_acceptance.sh [--dry-run] [--quick] [--out DIR] [--only RUN,...] [--plan FILE]
#   bash tools/npu_acceptance.sh report OUT        # rebuild the report of an output folder
# --help lists the options and exit codes. Runs with the training environment's Python (the one
# ray_start_npu.sh uses: NPU_RL_TRAIN_PYTHON, .venv, python3 with ray).
set -euo pipefail

main() {
    # shellcheck source=internal/common.sh
    source "$(dirname "${BASH_SOURCE[0]}")/../internal/common.sh"
    local py=""
    local candidate
    for candidate in "${NPU_RL_TRAIN_PYTHON:-}" "$NPU_RL_ROOT/.venv/bin/python" "$(command -v python3 || true)"; do
        if [[ -n "$candidate" && -x "$candidate" ]] && "$candidate" -c 'import ray, psutil' >/dev/null 2>&1; then
            py="$candidate"
            break
        fi
    done
    [[ -n "$py" ]] || common::die "no Python with ray found: run install_stack.sh, activate the training environment, or set NPU_RL_TRAIN_PYTHON"
    PYTHONPATH="$NPU_RL_ROOT${PYTHONPATH:+:$PYTHONPATH}" exec "$py" -P -m npu_rl.acceptance "$@"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    main "$@"
fi
