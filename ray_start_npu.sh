#!/usr/bin/env bash
# One launcher for every node of a job:
#   bash ray_start_npu.sh [--dry-run] [--no-preflight] TRAIN_SCRIPT [ENV_SCRIPT] [OVERRIDE ...]
# The head (the node whose address is MASTER_ADDR) checks the recipe, starts Ray with an NPU resource,
# waits for every node's NPUs (NODE_WAIT_TIMEOUT), runs TRAIN_SCRIPT with logs in logs/<time>-<recipe>/
# and exits with its code; workers join and stay until the head goes away. --help lists the
# environment variables and exit codes.
set -euo pipefail

main() {
    # shellcheck source=internal/common.sh
    source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/internal/common.sh" # a symlink to this script works too
    # shellcheck source=internal/launch.sh
    source "$NPU_RL_ROOT/internal/launch.sh"
    local arg positional=()
    for arg in "$@"; do
        case "$arg" in
            -h | --help) positional=() && break ;;
            -*) ;;
            *) positional+=("$arg") ;;
        esac
    done
    # The second positional argument is the ENV_SCRIPT unless it is an override (key=value).
    local env_script=""
    if [[ ${#positional[@]} -ge 2 && "${positional[1]}" != *=* ]]; then
        env_script="${positional[1]}"
    fi
    launch::check_scripts "${positional[0]:-}" "$env_script" "$@"
    launch::load_env "$env_script"
    local py
    py="$(launch::python)"
    PYTHONPATH="$NPU_RL_ROOT${PYTHONPATH:+:$PYTHONPATH}" exec "$py" -P -m npu_rl.launch "$@"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    main "$@"
fi
