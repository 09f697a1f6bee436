"""The maintainer loop: series -> commits in ``sources/<upstream>`` -> series.

``edit NAME`` turns the series into one commit per patch on top of the baseline (the header
becomes the commit message), so a developer changes upstream code with ordinary git (amend,
``rebase -i``, new commits). ``export NAME`` writes the commits ``upstream..HEAD`` back to
``patches/<NAME>/`` as ``NNNN-<NAME>-<kind>-<name>.patch`` plus ``series``. A round trip with
no edits reproduces the patch files byte for byte. A patch keeps its number while its kind and
name stay and the order allows it (dropping patch 0001 leaves 0002 as 0002, so the names other
files cite stay valid); new or reordered patches are numbered after the one before them.

A commit message is the patch header without the ``Subject:`` prefix::

    Fix HCCL error when updating weights on NPU      <- Subject
                                                     <- blank line
    Kind: bugfix
    Name: hccl-weight-update                         <- optional: file name slug
    Why: ...
    Switch: always on
    Upstream: https://...
    Tests: tests/checkpoint_engine/
"""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path

from npu_rl.errors import SeriesError, TreeStateError
from npu_rl.gittree import BASELINE_TAG, FIXED_DATE, git
from npu_rl.lock import Upstream
from npu_rl.patches.engine import PRISTINE, inspect
from npu_rl.patches.series import PATCHES_DIR, load_patch, load_series, parse_header


def slugify(text: str) -> str:
    """Lower-case ``text`` and keep ``[a-z0-9-]`` (a file-name slug), at most 48 characters."""
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return slug[:48].strip("-") or "change"


def header_to_message(data: bytes) -> str:
    """Patch header -> commit message (subject line, blank line, the other fields)."""
    head = data.decode("utf-8").partition("\n---\n")[0]
    lines = head.splitlines()
    subject = lines[0].partition(":")[2].strip()
    return subject + "\n\n" + "\n".join(lines[1:]).strip("\n") + "\n"


def patch_message(p) -> str:
    """The commit message of patch ``p`` (a :class:`~npu_rl.patches.series.Patch`): its header as
    :func:`header_to_message` writes it, plus ``Name:`` when the subject would not give its slug
    back, so ``export`` reproduces the file name."""
    msg = header_to_message(p.data)
    if "Name:" not in msg and slugify(p.meta["Subject"]) != p.slug:
        msg = msg.rstrip("\n") + f"\nName: {p.slug}\n"
    return msg


def install_series(staged: Path, out_dir: Path) -> None:
    """Make ``out_dir`` hold the series in ``staged`` (a validated folder of ``*.patch`` + ``series``):
    every staged file copied over, every other ``*.patch`` removed. Idempotent."""
    out_dir.mkdir(parents=True, exist_ok=True)
    names = {f.name for f in staged.iterdir()}
    for old in out_dir.glob("*.patch"):
        if old.name not in names:
            old.unlink()
    for name in sorted(names):
        shutil.copyfile(staged / name, out_dir / name)


def message_to_header(message: str, name_hint: str) -> tuple[str, str, str]:
    """Commit message -> (header text, kind, slug). The optional ``Name:`` field picks the slug."""
    subject, _, body = message.strip("\n").partition("\n")
    body_lines = [ln for ln in body.strip("\n").splitlines()]
    name = None
    kept = []
    for ln in body_lines:
        if ln.startswith("Name:"):
            name = ln.partition(":")[2].strip()
        else:
            kept.append(ln)
    header = "Subject: " + subject.strip() + "\n" + "\n".join(kept).rstrip("\n") + "\n"
    meta = parse_header(header + "---\n", name_hint)
    return header, meta["Kind"], slugify(name or subject)


def edit(up: Upstream, sources_dir: Path, patches_dir: Path | None = None, log=print) -> int:
    """Commit the series onto a pristine tree, one commit per patch. Returns the commit count."""
    plan = inspect(up, sources_dir, patches_dir)
    if plan.state != PRISTINE:
        raise TreeStateError(
            f"{plan.tree.path} must be at its pristine baseline to edit the series "
            f"(it is {plan.state}); run apply_all_patches.sh --revert --only {up.name} first"
        )
    dates = {"GIT_AUTHOR_DATE": FIXED_DATE, "GIT_COMMITTER_DATE": FIXED_DATE}
    for p in plan.series.patches:
        plan.tree.apply(p.name, p.data)
        git(plan.tree.path, "add", "--all", ".")
        git(plan.tree.path, "commit", "--quiet", "--no-verify", "-m", patch_message(p), env=dates)
        log(f"committed {p.name}")
    log(
        f"{plan.tree.path}: {plan.n} commit(s) on top of '{BASELINE_TAG}'. Edit with git, then run "
        f"'bash apply_all_patches.sh export {up.name}'."
    )
    return plan.n


def number_patches(keys: list[tuple[str, str]], known: dict[tuple[str, str], int]) -> list[int]:
    """Numbers for patches ``keys`` = [(kind, slug), ...] in series order.

    A patch whose (kind, slug) has a number in ``known`` keeps it if that is above the number
    before it and not taken; otherwise it gets the previous number + 1. Result strictly increases.
    """
    numbers: list[int] = []
    for key in keys:
        last = numbers[-1] if numbers else 0
        want = known.get(key)
        numbers.append(want if want is not None and want > last else last + 1)
    return numbers


def export(
    up: Upstream,
    sources_dir: Path,
    patches_dir: Path | None = None,
    log=print,
    numbers_from: Path | None = None,
) -> list[Path]:
    """Write ``upstream..HEAD`` of ``sources/<name>`` as the series of ``patches/<name>/``.

    Patch numbers are kept from the series in ``numbers_from`` (default: the one being replaced,
    see :func:`number_patches`).

    The new files are written to a temporary folder and validated (names, headers, a series
    that applies to the baseline) before the old series is replaced.

    Raises:
        TreeStateError: no commits on top of the baseline, or uncommitted changes.
        SeriesError: a commit message lacks a required header field (named).
    """
    tree = sources_dir / up.name
    if git(tree, "status", "--porcelain", "--untracked-files=normal"):
        raise TreeStateError(f"{tree} has uncommitted changes; commit or stash them before exporting")
    commits = git(tree, "rev-list", "--reverse", f"refs/tags/{BASELINE_TAG}..HEAD").split()
    if not commits:
        raise TreeStateError(f"{tree} has no commits on top of '{BASELINE_TAG}': nothing to export")
    out_dir = (patches_dir or PATCHES_DIR) / up.name
    known: dict[tuple[str, str], int] = {}
    try:
        old = load_series(up.name, numbers_from or out_dir.parent)
        known = {(p.kind, p.slug): p.number for p in old.patches}
    except SeriesError:
        pass  # a broken old series only costs its numbers
    parsed = []
    for sha in commits:
        message = git(tree, "log", "-1", "--format=%B", sha, strip=False)
        parsed.append((sha, *message_to_header(message, f"commit {sha[:12]} of {tree}")))
    numbers = number_patches([(kind, slug) for _, _, kind, slug in parsed], known)
    with tempfile.TemporaryDirectory(prefix="npu_rl-export-") as tmp:
        staging = Path(tmp) / up.name
        staging.mkdir()
        names = []
        for number, (sha, header, kind, slug) in zip(numbers, parsed, strict=True):
            diff = git(
                tree,
                "-c",
                "diff.noprefix=false",
                "diff",
                "--binary",
                "--no-color",
                "--no-ext-diff",
                "--no-renames",
                f"{sha}^",
                sha,
                strip=False,
            )
            name = f"{number:04d}-{up.name}-{kind}-{slug}.patch"
            (staging / name).write_text(header + "---\n" + diff, encoding="utf-8")
            load_patch(staging / name, up.name)  # validates what we wrote
            names.append(name)
        (staging / "series").write_text(
            f"# Patch series for {up.name}, applied in this order. Written by "
            "'python -m npu_rl.patches export'.\n" + "\n".join(names) + "\n",
            encoding="utf-8",
        )
        series = load_series(up.name, Path(tmp))
        install_series(staging, out_dir)
    log(f"exported {len(series.patches)} patch(es) to {out_dir} (series {series.digest})")
    return [out_dir / n for n in names]


__all__ = ["edit", "export", "install_series", "patch_message", "slugify", "SeriesError"]
