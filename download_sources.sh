#!/usr/bin/env bash
# Download the pinned upstream trees (sources.lock) into sources/ as baseline git trees.
#   bash download_sources.sh [--from auto|pypi|git] [--dest DIR] [--only NAME ...] [--force]
# Run with --help for every option and the exit codes.
set -euo pipefail

main() {
    # shellcheck source=internal/common.sh
    source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/internal/common.sh" # a symlink to this script works too
    common::run_module npu_rl.sources "$@"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    main "$@"
fi
