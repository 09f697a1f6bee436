# shellcheck shell=bash
# The environment every node of a job starts from, in order:
#   1. defaults below (each only if unset, so the shell can override them),
#   2. CANN's set_env.sh files that exist (ASCEND_SET_ENV_FILES, colon-separated),
#   3. the ENV_SCRIPT, which can override anything.
# The launcher (python -m npu_rl.launch) then derives the topology values (socket interfaces, RAY_ADDRESS).
#   launch::load_env ENV_SCRIPT   export all of the above into this shell
#   launch::python                print the training environment's python (needs ray)

launch::defaults() {
    # HCCL: generous timeouts (first compiles and weight loads are slow), port ranges that let the
    # trainer and the colocated vLLM ranks of one die open HCCL sockets side by side.
    export HCCL_CONNECT_TIMEOUT="${HCCL_CONNECT_TIMEOUT:-1800}"
    export HCCL_EXEC_TIMEOUT="${HCCL_EXEC_TIMEOUT:-3600}"
    export HCCL_HOST_SOCKET_PORT_RANGE="${HCCL_HOST_SOCKET_PORT_RANGE:-60000-60050}"
    export HCCL_NPU_SOCKET_PORT_RANGE="${HCCL_NPU_SOCKET_PORT_RANGE:-61000-61050}"
    # verl sets ASCEND_RT_VISIBLE_DEVICES per worker itself; Ray must not narrow it first.
    export RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES="${RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES:-1}"
    # torch_npu allocator and host-side dispatch settings used by verl's Ascend examples.
    export PYTORCH_NPU_ALLOC_CONF="${PYTORCH_NPU_ALLOC_CONF:-garbage_collection_threshold:0.8}"
    export TASK_QUEUE_ENABLE="${TASK_QUEUE_ENABLE:-1}"
    export CPU_AFFINITY_CONF="${CPU_AFFINITY_CONF:-1}"
    export ASCEND_SET_ENV_FILES="${ASCEND_SET_ENV_FILES:-/usr/local/Ascend/ascend-toolkit/set_env.sh:/usr/local/Ascend/nnal/atb/set_env.sh}"
}

# CANN's scripts are not written for `set -u`; source them without it.
launch::_source_loose() {
    set +u
    # shellcheck source=/dev/null
    source "$1"
    local rc=$?
    set -u
    return "$rc"
}

launch::load_env() {
    local env_script="${1:-}" file sourced=()
    launch::defaults
    local IFS=:
    for file in $ASCEND_SET_ENV_FILES; do
        if [[ -f "$file" ]]; then
            launch::_source_loose "$file" || common::die "sourcing $file failed"
            sourced+=("$file")
        fi
    done
    unset IFS
    NPU_RL_SOURCED="$(IFS=:; echo "${sourced[*]}")"
    export NPU_RL_SOURCED
    if [[ -n "$env_script" ]]; then
        if [[ ! -f "$env_script" ]]; then
            common::log "error: ENV_SCRIPT $env_script is not a file (usage: bash ray_start_npu.sh [--dry-run] TRAIN_SCRIPT [ENV_SCRIPT] [K=V ...])"
            exit 2
        fi
        launch::_source_loose "$env_script" || common::die "sourcing ENV_SCRIPT $env_script failed (exit $?)"
    fi
}

launch::python() {
    local py
    for py in "${NPU_RL_TRAIN_PYTHON:-}" "$NPU_RL_ROOT/.venv/bin/python" "$(command -v python3 || true)"; do
        if [[ -n "$py" && -x "$py" ]] && "$py" -c 'import ray' >/dev/null 2>&1; then
            printf '%s\n' "$py"
            return 0
        fi
    done
    common::die "no Python with ray found: activate the training environment, run install_stack.sh, or set NPU_RL_TRAIN_PYTHON"
}
