"""Rewrite the generated tables in README.md (stack, features, settings, recipes) between their markers.

The tests compare each block with its generator (``npu_rl.lock.stack_table``,
``npu_rl.features.features_table``, ``npu_rl.settings.settings_table``,
``npu_rl.recipes.recipes_table``); this tool writes them so a
maintainer never pastes by hand. The recipe table dry-runs every shipped recipe (about a minute).

    python tools/update_readme_tables.py [--only stack features settings recipes] [--check]

Exit status: 0 written (or, with --check, already current), 1 with --check when a block is stale,
2 when README.md lacks a marker pair (the message names it).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from npu_rl import REPO_ROOT
from npu_rl.table import splice_table as splice


def _stack() -> str:
    from npu_rl.lock import load_lock, stack_table

    return stack_table(load_lock())


def _features() -> str:
    from npu_rl.features import features_table

    return features_table()


def _settings() -> str:
    from npu_rl.settings import settings_table

    return settings_table()


def _recipes() -> str:
    from npu_rl.recipes import discover, dry_run, recipes_table

    rows = []
    for recipe, env in discover():
        rc, out, facts = dry_run(recipe, env)
        if rc != 0 or not facts:
            raise KeyError(f"{recipe.relative_to(REPO_ROOT)}: the dry run failed (exit {rc}); fix it first:\n{out}")
        rows.append((recipe, env, facts))
    return recipes_table(rows)


TABLES: dict[str, Callable[[], str]] = {
    "stack": _stack,
    "features": _features,
    "settings": _settings,
    "recipes": _recipes,
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="+", choices=sorted(TABLES), default=sorted(TABLES))
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 when a table is stale")
    args = p.parse_args(argv)
    readme = REPO_ROOT / "README.md"
    text = new = readme.read_text()
    try:
        for name in args.only:
            new = splice(new, name, TABLES[name]())
    except KeyError as exc:
        print(f"error: {exc.args[0]}", file=sys.stderr)
        return 2
    if new == text:
        print("README.md tables are current")
        return 0
    if args.check:
        print("README.md tables are stale: run python tools/update_readme_tables.py", file=sys.stderr)
        return 1
    fd, tmp = tempfile.mkstemp(dir=readme.parent, prefix=".README.", suffix=".tmp")
    with os.fdopen(fd, "w") as fh:
        fh.write(new)
    Path(tmp).replace(readme)
    print(f"README.md: rewrote {', '.join(args.only)} table(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
