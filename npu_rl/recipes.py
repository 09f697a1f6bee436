"""The shipped recipes: find them, dry-run each, and render the README's recipe table from the plans.

``python -m npu_rl.recipes`` prints the table; a test compares it with README.md, so the table is
always what the recipes really compose to (it is built from the preflight's plan, not from parsing).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from npu_rl import REPO_ROOT

RECIPES_DIR = REPO_ROOT / "recipes"


def discover(root: Path = RECIPES_DIR) -> list[tuple[Path, Path | None]]:
    """(train script, its env script) for every recipe: ``recipes/<model>/*.sh`` except ``env_*.sh``.

    The env script is the one a ``# Env: <file>`` header line of the recipe names, else the first
    ``env_*.sh`` of the same folder.
    """
    pairs = []
    for recipe in sorted(root.glob("*/*.sh")):
        if recipe.name.startswith("env_"):
            continue
        named = re.search(r"^# Env: (\S+)$", recipe.read_text(), re.M)
        envs = [recipe.parent / named.group(1)] if named else sorted(recipe.parent.glob("env_*.sh"))
        pairs.append((recipe, envs[0] if envs else None))
    return pairs


#: The calling shell's topology variables, which a dry run of a shipped recipe must not inherit (the
#: recipe's env script sets them; a developer's shell may hold another job's).
SHELL_TOPOLOGY_VARS = ("NNODES", "NPUS_PER_NODE", "MASTER_ADDR")


def dry_run(
    recipe: Path, env_script: Path | None = None, *extra: str, python: str = sys.executable
) -> tuple[int, str, dict]:
    """``ray_start_npu.sh --dry-run RECIPE [ENV_SCRIPT] [EXTRA ...]`` with the topology variables of the
    calling shell removed: (exit code, stdout + stderr, the preflight's facts; empty if it did not run)."""
    with tempfile.TemporaryDirectory() as tmp:
        facts_path = Path(tmp) / "facts.json"
        env = {k: v for k, v in os.environ.items() if k not in SHELL_TOPOLOGY_VARS}
        env.update(NPU_RL_TRAIN_PYTHON=python, NPU_RL_PLAN_JSON=str(facts_path))
        cmd = ["bash", str(REPO_ROOT / "ray_start_npu.sh"), "--dry-run", str(recipe)]
        cmd += [str(env_script)] if env_script else []
        r = subprocess.run([*cmd, *extra], env=env, capture_output=True, text=True, timeout=600, check=False)
        facts = json.loads(facts_path.read_text()) if facts_path.exists() else {}
    return r.returncode, r.stdout + r.stderr, facts


#: The README's name of each ``run_verl --trainer`` choice (docs/async.md).
TRAINER_NAMES = {"sync": "sync", "fully_async": "fully-async", "one_step_off": "one-step-off"}


def recipes_table(rows: list[tuple[Path, Path | None, dict]]) -> str:
    """Markdown table: recipe, env, model, algorithm, trainer (with its pools), nodes x dies,
    prompt/response, GBS (fully-async: prompts per weight sync), n, layouts."""
    out = [
        "| recipe | env | model | algorithm | trainer | nodes × dies | prompt / response | GBS | n | train layout "
        "| rollout |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for recipe, env, f in rows:
        rel = recipe.relative_to(REPO_ROOT)
        trainer = f.get("trainer", "sync")
        kind = TRAINER_NAMES.get(trainer, trainer) + (f" ({f['pools']} dies)" if f.get("pools") else "")
        gbs = f"{f['gbs']} per weight sync" if trainer == "fully_async" else f"{f['gbs']}"
        out.append(
            f"| `{rel}` | `{env.name if env else '-'}` | {f['model']} | {f['algorithm']} | {kind} | "
            f"{f['nodes']} × {f['dies_per_node']} | {f['prompt']} / {f['response']} | {gbs} | {f['n']} | "
            f"{f['train']} | {f['rollout']} |"
        )
    return "\n".join(out)


def main() -> int:
    rows = []
    for recipe, env in discover():
        rc, out, facts = dry_run(recipe, env)
        if rc != 0 or not facts:
            print(out, file=sys.stderr)
            print(f"{recipe}: the dry run failed (exit {rc})", file=sys.stderr)
            return 1
        rows.append((recipe, env, facts))
    print(recipes_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
