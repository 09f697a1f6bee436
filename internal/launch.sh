# shellcheck shell=bash
# The environment every node of a job starts from, in order:
#   1. defaults below (each only if unset, so the shell can override them),
#   2. CANN's set_env.sh files that exist (ASCEND_SET_ENV_FILES, colon-separated),
#   3. the ENV_SCRIPT, which can override anything.
# The launcher (python -m npu_rl.launch) then derives the topology values (socket interfaces, RAY_ADDRESS).
#   launch::check_scripts TRAIN ENV CMD...   refuse an ENV_SCRIPT that is a train script (e.g. the two swapped)
#   launch::load_env ENV_SCRIPT   export all of the above into this shell
#   launch::python                print the training environment's python (needs ray)

LAUNCH_USAGE='bash ray_start_npu.sh [--dry-run] TRAIN_SCRIPT [ENV_SCRIPT] [K=V ...]'

launch::defaults() {
    # HCCL: generous timeouts (first compiles and weight loads are slow), port ranges that let the
    # trainer and the colocated vLLM ranks of one die open HCCL sockets side by side.
    export HCCL_CONNECT_TIMEOUT="${HCCL_CONNECT_TIMEOUT:-1800}"
    export HCCL_EXEC_TIMEOUT="${HCCL_EXEC_TIMEOUT:-3600}"
    export HCCL_HOST_SOCKET_PORT_RANGE="${HCCL_HOST_SOCKET_PORT_RANGE:-60000-60050}"
    export HCCL_NPU_SOCKET_PORT_RANGE="${HCCL_NPU_SOCKET_PORT_RANGE:-61000-61050}"
    # HCCL expands collectives on the AI Vector cores: vllm-ascend's Qwen3 configs set it, and the
    # reference recipe set it after all-gather timeouts in the weight sync (docs/fast_path.md).
    export HCCL_OP_EXPANSION_MODE="${HCCL_OP_EXPANSION_MODE:-AIV}"
    # verl sets ASCEND_RT_VISIBLE_DEVICES per worker itself; Ray must not narrow it first.
    export RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES="${RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES:-1}"
    # torch_npu allocator and host-side dispatch settings used by verl's Ascend examples.
    export PYTORCH_NPU_ALLOC_CONF="${PYTORCH_NPU_ALLOC_CONF:-garbage_collection_threshold:0.8}"
    export TASK_QUEUE_ENABLE="${TASK_QUEUE_ENABLE:-1}"
    export CPU_AFFINITY_CONF="${CPU_AFFINITY_CONF:-1}"
    export ASCEND_SET_ENV_FILES="${ASCEND_SET_ENV_FILES:-/usr/local/Ascend/ascend-toolkit/set_env.sh:/usr/local/Ascend/nnal/atb/set_env.sh}"
}

# The rule that tells the two scripts apart, read from the file (nothing is run): a train script
# (recipe) trains: it calls run_verl, runs main_ppo, sources internal/verl.sh, or execs another recipe.
# An ENV_SCRIPT only sets variables: it is sourced into the launcher's own shell on every node.
# Prints the first such line ("LINE:TEXT", comments skipped, in that order of evidence) and succeeds;
# fails when there is none.
launch::recipe_evidence() {
    local pattern
    for pattern in '(^|[^[:alnum:]_])run_verl([^[:alnum:]_]|$)' 'main_ppo' 'internal/verl\.sh' \
        '(^|[;&|({[:space:]])exec[[:space:]]+[^0-9<>&[:space:]]'; do
        grep -nE -m1 "^[^#]*$pattern" "$1" 2>/dev/null && return 0
    done
    return 1
}

# Refuse an ENV_SCRIPT that is a train script before anything is sourced: sourced, it would run the
# training in the launcher's shell (for real, even under --dry-run). CMD... is the launcher's command
# line, printed back with the two scripts in the right order.
launch::check_scripts() {
    local train="$1" env_script="$2" hit line text arg fixed=""
    shift 2
    [[ -n "$env_script" && -f "$env_script" ]] || return 0
    hit="$(launch::recipe_evidence "$env_script")" || return 0
    line="${hit%%:*}"
    text="${hit#*:}"
    text="${text#"${text%%[![:space:]]*}"}"
    ((${#text} <= 72)) || text="${text:0:72}..."
    if [[ -f "$train" ]] && ! launch::recipe_evidence "$train" >/dev/null; then
        for arg in "$@"; do
            if [[ "$arg" == "$train" ]]; then
                arg="$env_script"
            elif [[ "$arg" == "$env_script" ]]; then
                arg="$train"
            fi
            fixed+=" $(printf '%q' "$arg")"
        done
        common::log "error: TRAIN_SCRIPT and ENV_SCRIPT are swapped: $env_script is the train script (line $line: $text) and $train has no such line (run_verl, main_ppo, internal/verl.sh, exec). Nothing was sourced or started. The train script comes first:"
        common::log "    bash ray_start_npu.sh$fixed"
    else
        common::log "error: ENV_SCRIPT $env_script is a train script (line $line: $text): sourced as the node environment it would run the training itself. Give the recipe first and, second, a script that only exports variables (recipes/<model>/env_*.sh): $LAUNCH_USAGE"
    fi
    exit 2
}

# Source a file into this shell with guards: CANN's scripts are not written for `set -u` (sourced
# without it); `exit` in the file (which would end the launcher, silently with exit 0) and `exec` of
# a command (which would replace it) are errors naming the file and line, exit 2.
launch::_source_loose() {
    _NRL_SOURCING="${2:-$1}"
    _NRL_STOPPED_AT=""
    _NRL_STOP_CMD=""
    trap 'launch::_sourced_file_ended' EXIT
    # A plain command as the trap: bash parses the trap's text at every command, and after a
    # malformed `[[ ... ]` in the sourced file a `[[` there failed to parse ("debug trap: syntax error").
    trap 'launch::_watch_sourced "${BASH_SOURCE[0]:-?}" "$LINENO" "$BASH_COMMAND"' DEBUG
    set +u -T
    # shellcheck source=/dev/null
    source "$1"
    _NRL_RC=$?
    set +T
    trap - DEBUG
    trap - EXIT
    set -u
    return "$_NRL_RC"
}

launch::_watch_sourced() {
    # BASH_SUBSHELL: an `exit` inside $(...) or ( ... ) ends only that subshell.
    [[ $BASH_SUBSHELL == 0 ]] || return 0
    case "$3" in
        exit | "exit "*)
            _NRL_STOPPED_AT="$1:$2"
            _NRL_STOP_CMD="$3"
            ;;
        exec*)
            local command_re='^exec[[:space:]]+[^0-9<>&[:space:]]' # `exec >log` only redirects: allowed
            if [[ "$3" =~ $command_re ]]; then
                _NRL_STOPPED_AT="$1:$2"
                _NRL_STOP_CMD="$3"
                exit 2
            fi
            ;;
    esac
}

launch::_sourced_file_ended() {
    local rc=$?
    trap - DEBUG
    if [[ -n "${_NRL_REFUSED:-}" ]]; then
        exit 2 # run_verl refused and said why
    fi
    case "$_NRL_STOP_CMD" in
        exec*)
            common::log "error: $_NRL_SOURCING runs \`${_NRL_STOP_CMD:0:80}\` at $_NRL_STOPPED_AT: exec would replace the launcher with that command. A node environment script only sets variables; a script that runs something is a TRAIN_SCRIPT ($LAUNCH_USAGE)"
            ;;
        exit*)
            common::log "error: $_NRL_SOURCING calls \`$_NRL_STOP_CMD\` at $_NRL_STOPPED_AT (exit $rc): it is sourced into the launcher, so exit would end the launcher before anything ran. Remove it, or use \`return\` to leave the script early"
            ;;
        *)
            common::log "error: sourcing $_NRL_SOURCING ended the launcher (exit $rc; bash's message is above)"
            ;;
    esac
    exit 2
}

# Who set what, for the launcher's summary: the exported variables a step adds or changes.
declare -gA _NRL_SNAP=()
launch::_snapshot() {
    local n
    _NRL_SNAP=()
    for n in $(compgen -e); do
        _NRL_SNAP[$n]="${!n-}"
    done
}
launch::_changed() {
    local n out=()
    for n in $(compgen -e); do
        if [[ -z "${_NRL_SNAP[$n]+set}" || "${_NRL_SNAP[$n]}" != "${!n-}" ]]; then
            out+=("$n")
        fi
    done
    printf '%s' "${out[*]}"
}

# Values the user's shell had that the ENV_SCRIPT replaced (not extended: PATH=$PATH:... keeps the
# old value inside the new one), one warning each: `NNODES=2 bash ray_start_npu.sh ...` with an env
# script that hard-sets NNODES=1 would otherwise run one node without a word.
launch::_warn_replaced() {
    local env_script="$1" n
    for n in "${!_NRL_SHELL[@]}"; do
        [[ -n "${_NRL_SHELL[$n]}" ]] || continue
        if [[ -n "${!n+set}" && "${!n}" != *"${_NRL_SHELL[$n]}"* ]]; then
            common::log "warning: ENV_SCRIPT $env_script replaced $n=${_NRL_SHELL[$n]:0:80} (set in your shell) with ${!n:0:80}; the env script's value is used. To keep yours, the env script must default it: export $n=\"\${$n:-...}\""
        fi
    done
}

launch::load_env() {
    local env_script="${1:-}" file sourced=() n
    NPU_RL_FROM_SHELL="$(compgen -e | grep -vx NPU_RL_ROOT | tr '\n' ' ')" # NPU_RL_ROOT: common.sh's
    declare -gA _NRL_SHELL=()
    for n in $NPU_RL_FROM_SHELL; do
        _NRL_SHELL[$n]="${!n-}"
    done
    launch::_snapshot
    launch::defaults
    NPU_RL_FROM_DEFAULTS="$(launch::_changed)"
    launch::_snapshot
    local IFS=:
    for file in $ASCEND_SET_ENV_FILES; do
        if [[ -f "$file" ]]; then
            launch::_source_loose "$file" "CANN script $file" || common::die "sourcing $file failed"
            sourced+=("$file")
        fi
    done
    unset IFS
    NPU_RL_FROM_CANN="$(launch::_changed)"
    NPU_RL_SOURCED="$(IFS=:; echo "${sourced[*]}")"
    export NPU_RL_SOURCED NPU_RL_FROM_SHELL NPU_RL_FROM_DEFAULTS NPU_RL_FROM_CANN
    launch::_snapshot
    if [[ -n "$env_script" ]]; then
        if [[ ! -f "$env_script" ]]; then
            common::log "error: ENV_SCRIPT $env_script is not a file (usage: $LAUNCH_USAGE)"
            exit 2
        fi
        # Parse it before sourcing anything of it: a syntax error found halfway would have run the
        # lines above it (and bash reports it from inside the launcher's own traps).
        local syntax
        if ! syntax="$(bash -n "$env_script" 2>&1)"; then
            common::log "error: ENV_SCRIPT $env_script has a syntax error (bash -n); nothing was sourced or started:"
            printf '%s\n' "$syntax" >&2
            exit 2
        fi
        # While the ENV_SCRIPT is sourced nothing may train: run_verl refuses, and so does any Python
        # that would run main_ppo or start Ray (npu_rl/launch/guard/sitecustomize.py on PYTHONPATH).
        local guard="$NPU_RL_ROOT/npu_rl/launch/guard"
        export NPU_RL_SOURCING_ENV="$env_script"
        export PYTHONPATH="$guard${PYTHONPATH:+:$PYTHONPATH}"
        local rc=0
        launch::_source_loose "$env_script" "ENV_SCRIPT $env_script" || rc=$?
        if ((rc != 0)); then
            common::log "error: sourcing ENV_SCRIPT $env_script failed (its last command returned $rc; bash's message, if any, is above); nothing was started"
            exit 2
        fi
        unset NPU_RL_SOURCING_ENV
        launch::_warn_replaced "$env_script"
        PYTHONPATH=":$PYTHONPATH:"
        PYTHONPATH="${PYTHONPATH//:$guard:/:}"
        PYTHONPATH="${PYTHONPATH#:}"
        PYTHONPATH="${PYTHONPATH%:}"
        [[ -n "$PYTHONPATH" ]] || unset PYTHONPATH
    fi
    NPU_RL_FROM_ENV_SCRIPT="$(launch::_changed)"
    export NPU_RL_FROM_ENV_SCRIPT
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
