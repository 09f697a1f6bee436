# shellcheck shell=bash
# Shared helpers for the npu-rl-recipes entry points. Source it; it defines functions only.
#   common::log MSG...   message to stderr (coloured only on a terminal)
#   common::die MSG...   message to stderr, exit 1
#   common::python       print the path of a Python >= 3.11 that has the package's tool deps,
#                        bootstrapping a small virtual environment (.venv-tools) when none has.

NPU_RL_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export NPU_RL_ROOT

common::log() {
    if [[ -t 2 ]]; then
        printf '\033[1;34m[npu-rl]\033[0m %s\n' "$*" >&2
    else
        printf '[npu-rl] %s\n' "$*" >&2
    fi
}

common::die() {
    if [[ -t 2 ]]; then
        printf '\033[1;31m[npu-rl] error:\033[0m %s\n' "$*" >&2
    else
        printf '[npu-rl] error: %s\n' "$*" >&2
    fi
    exit 1
}

# True if $1 is a Python >= 3.11 that has the tool dependencies of npu_rl. find_spec locates them
# without importing them (importing GitPython & co. here cost 0.4 s on every entry-point call); a
# broken install still fails, loudly, at the real import.
common::_python_ok() {
    "$1" -P - <<'PY' >/dev/null 2>&1
import sys
from importlib.util import find_spec
assert sys.version_info >= (3, 11)
assert all(find_spec(m) for m in ("filelock", "git", "pypi_simple", "tqdm"))
PY
}

common::python() {
    local candidate candidates=()
    if [[ -n "${NPU_RL_PYTHON:-}" ]]; then
        # An explicit choice is honoured: used as is, or as the base of .venv-tools if it lacks the deps.
        candidates=("$NPU_RL_PYTHON" "$NPU_RL_ROOT/.venv-tools/bin/python")
        common::_python_ok "$NPU_RL_PYTHON" ||
            common::log "NPU_RL_PYTHON=$NPU_RL_PYTHON lacks GitPython/pypi-simple/tqdm/filelock: using .venv-tools built from it"
    else
        candidates=("$NPU_RL_ROOT/.venv/bin/python" "$NPU_RL_ROOT/.venv-tools/bin/python" "$(command -v python3 || true)")
    fi
    for candidate in "${candidates[@]}"; do
        if [[ -n "$candidate" && -x "$candidate" ]] && common::_python_ok "$candidate"; then
            printf '%s\n' "$candidate"
            return 0
        fi
    done
    local base="${NPU_RL_PYTHON:-$(command -v python3.11 || command -v python3 || true)}"
    [[ -n "$base" ]] || common::die "no python3 found; install Python 3.11 (or set NPU_RL_PYTHON)"
    "$base" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
        common::die "$base is Python $("$base" -c 'import sys; print(sys.version.split()[0])'); Python >= 3.11 is needed (set NPU_RL_PYTHON)"
    common::log "bootstrapping tool environment $NPU_RL_ROOT/.venv-tools (GitPython, pypi-simple, tqdm, filelock)"
    "$base" -m venv "$NPU_RL_ROOT/.venv-tools" >&2 || common::die "cannot create $NPU_RL_ROOT/.venv-tools"
    "$NPU_RL_ROOT/.venv-tools/bin/python" -m pip install --quiet -r "$NPU_RL_ROOT/constraints/tools.txt" >&2 ||
        common::die "installing the tool dependencies failed (see pip's message above)"
    printf '%s\n' "$NPU_RL_ROOT/.venv-tools/bin/python"
}

# Run "python -m MODULE ARGS..." from the repository root's package, whatever the caller's cwd:
# -P (safe path, Python >= 3.11) keeps the current directory off sys.path, so a folder holding
# another npu_rl/ (another checkout) is never imported; npu_rl.entry handles SIGINT/SIGTERM/SIGHUP
# from the first line on.
common::run_module() {
    local py
    py="$(common::python)"
    # A signal while the interpreter itself starts (site, .pth files: before npu_rl.entry's first
    # line) would end it with CPython's raw KeyboardInterrupt traceback: ignored for those
    # milliseconds; npu_rl.entry installs its handlers first thing (a second Ctrl-C acts).
    trap '' INT TERM HUP
    PYTHONPATH="$NPU_RL_ROOT${PYTHONPATH:+:$PYTHONPATH}" exec "$py" -P -m npu_rl.entry "$@"
}
