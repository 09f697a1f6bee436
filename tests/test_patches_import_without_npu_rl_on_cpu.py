"""The patched upstreams import without ``npu_rl``: every patch imports our package lazily, inside the
function that needs it, never at module level.

Two checks over every patch of every series: (1) statically, no file the series leaves behind
(the tree the series gives, computed in a throw-away index like ``--check``, whatever the working
tree holds) imports ``npu_rl`` where the import runs at import time (module level or a class body);
(2) for real, each Python module the verl, vLLM and mbridge patches touch imports in a fresh
interpreter in which ``import npu_rl`` fails (a ``sys.meta_path`` blocker), and the file it imports
is the one the series gives. vllm-ascend cannot be imported on CPU (it needs torch_npu): the static
check covers it.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from npu_rl import REPO_ROOT
from npu_rl.gittree import Tree, git
from npu_rl.patches.series import load_series, series_upstreams

# Imports the patched modules in fresh processes: left out of --quick.
pytestmark = pytest.mark.slow

SOURCES = Path(os.environ.get("NPU_RL_SOURCES", REPO_ROOT / "sources"))
NOT_IMPORTABLE_ON_CPU = {"vllm-ascend"}  # torch_npu
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)

# A fresh interpreter: npu_rl cannot be imported, then every module named on the command line is.
_PROBE = textwrap.dedent(
    """
    import importlib, json, sys

    class NoNpuRl:
        def find_spec(self, name, path=None, target=None):
            if name == "npu_rl" or name.startswith("npu_rl."):
                raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)", name=name)
            return None

    sys.meta_path.insert(0, NoNpuRl())
    try:
        import npu_rl  # noqa: F401
        sys.exit("the blocker did not block npu_rl")
    except ModuleNotFoundError:
        pass
    files = {m: importlib.import_module(m).__file__ for m in sys.argv[1:]}
    loaded = sorted(k for k in sys.modules if k == "npu_rl" or k.startswith("npu_rl."))
    print("RESULT " + json.dumps({"files": files, "npu_rl_loaded": loaded}))
    """
)


def import_time_npu_rl_imports(source: str) -> list[int]:
    """Line numbers of ``import npu_rl...`` / ``from npu_rl... import`` that run when the module is
    imported: anywhere but inside a function (a class body runs at import time)."""
    lines: list[int] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        if isinstance(node, ast.Import) and not in_function:
            lines.extend(node.lineno for a in node.names if a.name.split(".")[0] == "npu_rl")
        elif isinstance(node, ast.ImportFrom) and not in_function and node.level == 0:
            if (node.module or "").split(".")[0] == "npu_rl":
                lines.append(node.lineno)
        for child in ast.iter_child_nodes(node):
            visit(child, in_function or isinstance(node, _SCOPES))

    visit(ast.parse(source), False)
    return lines


def test_import_time_detector_sees_module_level_and_class_bodies():
    src = textwrap.dedent(
        """
        import os
        from npu_rl.rebalance import verl_hook
        import npu_rl.sampler as s
        class A:
            from npu_rl import errors
            def f(self):
                from npu_rl.sampler import guard
        def g():
            import npu_rl
        h = lambda: __import__("npu_rl")
        from npu_rlx import y
        """
    )
    assert import_time_npu_rl_imports(src) == [3, 4, 6]


def _patched_python_files() -> dict[str, dict[str, str]]:
    """``{upstream: {path: patched text}}`` for every .py file a patch of the series touches."""
    out: dict[str, dict[str, str]] = {}
    for name in series_upstreams():
        series = load_series(name)
        paths = sorted({f for p in series.patches for f in p.files if f.endswith(".py")})
        if not paths:
            continue
        tree = Tree(SOURCES / name)
        assert tree.exists(), f"sources/{name} is not downloaded: run 'bash download_sources.sh' first"
        final = tree.expected_trees([(p.name, p.data) for p in series.patches])[-1]
        out[name] = {path: git(tree.path, "cat-file", "blob", f"{final}:{path}", strip=False) for path in paths}
    return out


@pytest.fixture(scope="module")
def patched_files():
    return _patched_python_files()


def test_no_patch_imports_npu_rl_at_import_time(patched_files):
    assert {"verl", "vllm", "vllm-ascend", "mbridge"} <= set(patched_files)
    offenders = [
        f"{name}: {path}:{line}"
        for name, files in patched_files.items()
        for path, text in files.items()
        for line in import_time_npu_rl_imports(text)
    ]
    assert not offenders, "npu_rl imported at module level (import it inside the hook function):\n" + "\n".join(
        offenders
    )
    # not vacuous: the hooks do import npu_rl (inside functions), in every patched upstream but mbridge
    for name in ("verl", "vllm", "vllm-ascend"):
        assert any("from npu_rl" in text for text in patched_files[name].values()), name


def _module(path: str) -> str:
    parts = path[: -len(".py")].split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_patched_modules_import_without_npu_rl(patched_files, tmp_path):
    wanted = {
        _module(path): (name, path)
        for name, files in patched_files.items()
        if name not in NOT_IMPORTABLE_ON_CPU
        for path in files
    }
    # the patches that made verl need npu_rl at import time touched these (the rebalance hooks)
    assert {"verl.workers.rollout.llm_server", "verl.workers.rollout.replica", "verl.trainer.ppo.v1.trainer_base"} <= (
        set(wanted)
    )
    env = {**os.environ, "PYTHONPATH": ""}
    proc = subprocess.run(
        [sys.executable, "-P", "-c", _PROBE, *sorted(wanted)],
        cwd=tmp_path,  # not the repository root: npu_rl must not be found as a folder either
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"a patched module needs npu_rl at import time:\n{proc.stderr[-4000:]}"
    result = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert result["npu_rl_loaded"] == []
    for module, (name, path) in wanted.items():
        # the module imported is the patched file of sources/<name> (the editable install of the tree)
        imported = Path(result["files"][module]).resolve()
        assert imported == (SOURCES / name / path).resolve(), (module, imported)
        assert imported.read_text() == patched_files[name][path], f"sources/{name}/{path}: not as the series leaves it"
