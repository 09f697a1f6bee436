#!/usr/bin/env bash
# The project's test command (README, third line; .ci/run calls it after the set-up):
# our pytest suite, ruff, shellcheck on every *.sh, hadolint on docker/, and the upstream
# projects' own CPU tests that cover the files our patches touch, run in the patched trees.
# Needs the set-up of the README's first line (sources downloaded and patched, .venv installed).
#   bash tools/run_tests.sh [PYTEST_ARGS...]
set -euo pipefail

# shellcheck source=internal/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../internal/common.sh"

VENV="${NPU_RL_VENV:-$NPU_RL_ROOT/.venv}"
PY="$VENV/bin/python"
[[ -x "$PY" ]] || common::die "$PY not found: run the set-up first (bash install_stack.sh --cpu)"

tests::stage() {
    local name="$1" started=$SECONDS
    shift
    common::log "stage: $name"
    "$@"
    common::log "stage: $name passed in $((SECONDS - started)) s"
}

tests::pytest() {
    (cd "$NPU_RL_ROOT" && "$PY" -m pytest -q -p no:cacheprovider "$@")
}

tests::ruff() {
    (cd "$NPU_RL_ROOT" && "$VENV/bin/ruff" check . && "$VENV/bin/ruff" format --check .)
}

tests::shellcheck() {
    local files=()
    mapfile -t files < <(cd "$NPU_RL_ROOT" && git ls-files --cached --others --exclude-standard -- '*.sh' '.ci/run')
    ((${#files[@]})) || common::die "no shell scripts found to check"
    (cd "$NPU_RL_ROOT" && "$VENV/bin/shellcheck" -x "${files[@]}")
    common::log "shellcheck: ${#files[@]} file(s) clean"
}

tests::hadolint() {
    local files=()
    if [[ -d "$NPU_RL_ROOT/docker" ]]; then
        mapfile -t files < <(find "$NPU_RL_ROOT/docker" -name 'Dockerfile*' -type f | sort)
    fi
    if ((${#files[@]} == 0)); then
        common::die "no Dockerfile under docker/: the A3 image must be linted"
    fi
    "$VENV/bin/hadolint" "${files[@]}"
    common::log "hadolint: ${#files[@]} Dockerfile(s) clean"
}

tests::upstream() {
    # "NAME PATH" lines from the Tests: fields of the patch series.
    local lines=() line name path count=0
    mapfile -t lines < <(cd "$NPU_RL_ROOT" && "$PY" -m npu_rl.patches tests)
    declare -A per_tree=()
    for line in "${lines[@]}"; do
        name="${line%% *}"
        path="${line#* }"
        per_tree[$name]+="$path "
    done
    for name in "${!per_tree[@]}"; do
        local tree="$NPU_RL_ROOT/sources/$name" args=()
        read -r -a args <<<"${per_tree[$name]}"
        common::log "upstream tests of $name (patched tree): ${args[*]}"
        (cd "$tree" && "$PY" -m pytest -q -p no:cacheprovider "${args[@]}")
        count=$((count + ${#args[@]}))
    done
    common::log "upstream tests: $count path(s) in ${#per_tree[@]} tree(s)"
}

main() {
    local started=$SECONDS
    tests::stage "pytest (npu_rl)" tests::pytest "$@"
    tests::stage "upstream CPU tests on the patched trees" tests::upstream
    tests::stage "ruff" tests::ruff
    tests::stage "shellcheck" tests::shellcheck
    tests::stage "hadolint" tests::hadolint
    common::log "all test stages passed in $((SECONDS - started)) s"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    main "$@"
fi
