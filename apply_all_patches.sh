#!/usr/bin/env bash
# Apply the patch series (patches/<upstream>/series) to the trees in sources/, all or nothing.
#   bash apply_all_patches.sh [--check | --status | --revert] [--sources DIR] [--only NAME ...]
# Idempotent: a second run reports "already applied" and changes nothing. --help lists exit codes.
set -euo pipefail

main() {
    # shellcheck source=internal/common.sh
    source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/internal/common.sh" # a symlink to this script works too
    common::run_module npu_rl.patches "$@"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    main "$@"
fi
