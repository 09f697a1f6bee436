#!/usr/bin/env bash
# Start the npu-rl-recipes image on an Ascend host with the devices and driver files it has.
#   bash docker/run_container.sh [--name NAME] [--image IMAGE] [-- COMMAND ...]
# Mounts every /dev/davinci<N> found plus the manager devices, the driver, npu-smi and the install
# info that exist (no hard-coded device list), host networking (Ray, HCCL), $MODELS_DIR and $DATA_DIR.
#   IMAGE       default npu-rl-recipes:a3           MODELS_DIR  default $HOME/models
#   DATA_DIR    default $HOME/data                  LOG_DIR     default ./logs (run logs survive --rm)
#   DOCKER_ARGS extra `docker run` arguments, e.g. "-v $HOME/.ray:/root/.ray:ro" for the Ray token
#   NPU_RL_DEV_ROOT / NPU_RL_HOST_ROOT  where devices and driver files are looked for (tests only)
set -euo pipefail

run::usage() {
    sed -n '2,9p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}

run::value() {
    [[ $# -ge 2 && -n "$2" && "$2" != -* ]] || {
        run::usage >&2
        echo "error: $1 needs a value" >&2
        exit 2
    }
}

main() {
    local name="npu-rl-${USER:-user}" image="${IMAGE:-npu-rl-recipes:a3}"
    local dev_root="${NPU_RL_DEV_ROOT:-/dev}" host_root="${NPU_RL_HOST_ROOT:-}"
    local cmd=(bash)
    while (($#)); do
        case "$1" in
            --name) run::value "$@" && name="$2" && shift 2 ;;
            --image) run::value "$@" && image="$2" && shift 2 ;;
            --) shift && cmd=("$@") && break ;;
            -h | --help) run::usage && return 0 ;;
            *) run::usage >&2 && echo "unknown argument: $1" >&2 && return 2 ;;
        esac
    done

    local args=(--rm --name "$name" --network host --ipc host --shm-size 64g) dev found=0
    # -t only with a terminal: pdsh/ssh without -t would make `docker run -t` refuse to start.
    if [[ -t 0 ]]; then args+=(-it); else args+=(-i); fi
    for dev in "$dev_root"/davinci[0-9]*; do
        [[ -e "$dev" ]] || continue
        args+=(--device "$dev:/dev/${dev##*/}")
        found=$((found + 1))
    done
    if ((found == 0)); then
        echo "no $dev_root/davinci<N> device on this host: is the Ascend driver installed and loaded?" >&2
        return 1
    fi
    for dev in davinci_manager devmm_svm hisi_hdc; do
        [[ -e "$dev_root/$dev" ]] && args+=(--device "$dev_root/$dev:/dev/$dev")
    done
    local path
    for path in /usr/local/Ascend/driver /usr/local/dcmi /usr/local/bin/npu-smi /etc/ascend_install.info \
        /usr/local/Ascend/add-ons; do
        [[ -e "$host_root$path" ]] && args+=(-v "$host_root$path:$path:ro")
    done
    local models="${MODELS_DIR:-$HOME/models}" data="${DATA_DIR:-$HOME/data}"
    [[ -d "$models" ]] && args+=(-v "$models:$models" -e "MODELS_DIR=$models")
    [[ -d "$data" ]] && args+=(-v "$data:$data" -e "DATA_DIR=$data")
    local logs="${LOG_DIR:-$PWD/logs}"
    mkdir -p "$logs"
    args+=(-v "$logs:/opt/npu-rl-recipes/logs" -e LOG_DIR=/opt/npu-rl-recipes/logs)
    local extra=()
    # DOCKER_ARGS is split on whitespace on purpose (several arguments in one variable).
    read -r -a extra <<<"${DOCKER_ARGS:-}"
    args+=("${extra[@]}")
    echo "starting $image with $found NPU die(s)" >&2
    exec docker run "${args[@]}" "$image" "${cmd[@]}"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    main "$@"
fi
