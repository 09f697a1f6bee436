"""What a node runs, as Ray node labels: every node of a job must run the same stack (issue 36).

A node whose ``sources.lock``, patch series, ``npu_rl`` or recipe differs from the head's is found
today only when a collective hangs or a weight sync mismatches. Each launcher starts its Ray node with
these labels (``ray start --labels``); a worker compares them with the head's before it joins, and the
head compares every node that joins. Both name the differing item and both values.

A label value is the first 12 hex digits of a sha256 over the item's files (path and bytes, sorted):
Ray's label values allow at most 63 characters of ``[A-Za-z0-9_.-]``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

PREFIX = "npu-rl-"
ITEMS = {
    "lock": "sources.lock",
    "patches": "the patch series (patches/)",
    "code": "npu_rl (its *.py files)",
    "recipe": "the TRAIN_SCRIPT, ENV_SCRIPT and overrides",
}


def _digest(root: Path, files: Iterable[Path], extra: Sequence[str] = ()) -> str:
    h = hashlib.sha256()
    for f in sorted(set(files)):
        try:
            data = f.read_bytes()
        except OSError:
            data = b"<unreadable>"
        name = str(f.relative_to(root)) if f.is_relative_to(root) else f.name
        h.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    for e in extra:
        h.update(b"\1" + e.encode())
    return h.hexdigest()[:12]


def stack_labels(root: Path, train: Path, env_script: Path | None, overrides: Sequence[str] = ()) -> dict[str, str]:
    """The labels ``{"npu-rl-lock": hex12, "npu-rl-patches": ..., "npu-rl-code": ..., "npu-rl-recipe": ...}``.

    ``root``: the repository; the recipe's files are hashed by name and content, so the same recipe
    in the same clone path or another gives the same label.
    """
    lock = [root / "sources.lock"] if (root / "sources.lock").is_file() else []
    patches = [p for p in (root / "patches").rglob("*") if p.is_file()] if (root / "patches").is_dir() else []
    code = [p for p in (root / "npu_rl").rglob("*.py") if "__pycache__" not in p.parts]
    recipe = [train, *([env_script] if env_script else [])]
    return {
        PREFIX + "lock": _digest(root, lock),
        PREFIX + "patches": _digest(root, patches),
        PREFIX + "code": _digest(root, code),
        PREFIX + "recipe": _digest(root, recipe, overrides),
    }


def ray_labels_arg(labels: Mapping[str, str]) -> str:
    """The ``ray start`` argument that sets them."""
    return "--labels=" + json.dumps(dict(labels), sort_keys=True)


def differences(mine: Mapping[str, str], theirs: Mapping[str, str], me: str, them: str) -> list[str]:
    """One line per item that differs: ``"sources.lock: <me> a1b2.., <them> c3d4.."``.

    A node without our labels (started by another tool or an older launcher) differs in every item,
    its value shown as "none".
    """
    out = []
    for key, what in ITEMS.items():
        a, b = mine.get(PREFIX + key), theirs.get(PREFIX + key)
        if a != b:
            out.append(f"{what}: {me} {a or 'none'}, {them} {b or 'none'}")
    return out


def mismatch_message(diffs: Sequence[str], me: str, them: str) -> str:
    """The refusal, with the fix: the same clone, sources and recipe on every node."""
    return (
        f"{them} does not run the same stack as {me}: "
        + "; ".join(diffs)
        + ". Every node must run the same commit of npu-rl-recipes with the same sources (bash download_sources.sh "
        "&& bash apply_all_patches.sh) and the same recipe, env script and overrides: a shared checkout, or `git "
        "status` and `bash apply_all_patches.sh --status` compared on each node"
    )
