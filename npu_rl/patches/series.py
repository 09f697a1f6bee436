"""Patch series: ``patches/<upstream>/series`` lists that upstream's patches in order.

File names follow ``NNNN-<upstream>-<feature|bugfix>-<name>.patch``; numbers increase strictly
along the series; every ``*.patch`` in the folder is in the series and every series entry
exists. A patch file starts with a header of ``Key: value`` fields (continuation lines start
with a space), then ``---``, then a git diff::

    Subject: One line saying what the patch does
    Kind: bugfix
    Why: The reason, the upstream PR it backports, when it can be dropped.
    Switch: Which config key or env var turns it on ("always on" for a bug fix).
    Upstream: Link to the upstream PR or commit, or "none".
    Tests: Upstream test files (relative to the tree) that cover the patched code.
    ---
    diff --git a/... b/...

Patches saved with CRLF line endings (an editor or a Windows checkout) are read as LF.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

from npu_rl import REPO_ROOT
from npu_rl.errors import SeriesError

PATCHES_DIR = REPO_ROOT / "patches"
REQUIRED_FIELDS = ("Subject", "Kind", "Why", "Switch", "Upstream")
KNOWN_FIELDS = (*REQUIRED_FIELDS, "Tests", "Drop-when")
KINDS = ("feature", "bugfix")
_DIFF_RE = re.compile(rb"^diff --git a/(\S+) b/(\S+)$", re.M)


@dataclass(frozen=True)
class Patch:
    """One patch file of a series.

    ``data`` is the whole file with LF line endings (what ``git apply`` is fed);
    ``meta`` the header fields; ``files`` the paths its diff touches (b/ side).
    """

    path: Path
    upstream: str
    number: int
    kind: str
    slug: str
    data: bytes
    meta: dict[str, str] = field(default_factory=dict)
    files: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def tests(self) -> tuple[str, ...]:
        """Upstream test paths named in the ``Tests:`` field (whitespace separated)."""
        return tuple(self.meta.get("Tests", "").split())


@dataclass(frozen=True)
class Series:
    """The ordered patches of one upstream."""

    upstream: str
    patches: tuple[Patch, ...]

    @property
    def digest(self) -> str:
        """sha256 over the patches' names and LF-normalised contents, in order (hex, 16 chars)."""
        h = hashlib.sha256()
        for p in self.patches:
            h.update(p.name.encode() + b"\0" + p.data + b"\0")
        return h.hexdigest()[:16]


def normalize_newlines(raw: bytes) -> bytes:
    """Return ``raw`` with CRLF turned into LF when the file as a whole was saved with CRLF.

    The whole file counts as CRLF when its ``diff --git`` lines end in CRLF; a LF patch that
    carries CRLF content lines (an upstream file with CRLF endings) is left untouched.
    """
    first = raw.find(b"diff --git ")
    if first < 0:
        return raw
    eol = raw.find(b"\n", first)
    if eol > 0 and raw[eol - 1 : eol] == b"\r":
        return raw.replace(b"\r\n", b"\n")
    return raw


def parse_header(text: str, where: str) -> dict[str, str]:
    """Parse the ``Key: value`` header above ``---``; SeriesError naming ``where`` if malformed."""
    head, sep, _ = text.partition("\n---\n")
    if not sep:
        raise SeriesError(f"{where}: no '---' line between the header and the diff")
    meta: dict[str, str] = {}
    last = None
    for n, line in enumerate(head.splitlines(), 1):
        if not line.strip():
            continue
        if line[0] in " \t" and last:
            meta[last] += "\n" + line.strip()
            continue
        key, colon, value = line.partition(":")
        if not colon or key not in KNOWN_FIELDS:
            raise SeriesError(f"{where}: header line {n} {line!r} is not one of the fields {', '.join(KNOWN_FIELDS)}")
        if key in meta:
            raise SeriesError(f"{where}: header field {key!r} given twice")
        meta[key] = value.strip()
        last = key
    missing = [k for k in REQUIRED_FIELDS if not meta.get(k)]
    if missing:
        raise SeriesError(f"{where}: header is missing {', '.join(missing)} (see patches/README.md)")
    return meta


def parse_name(filename: str, upstream: str) -> tuple[int, str, str]:
    """Split ``NNNN-<upstream>-<kind>-<name>.patch``; SeriesError with the expected form otherwise."""
    pattern = re.compile(
        rf"^(\d{{4}})-{re.escape(upstream)}-({'|'.join(KINDS)})-([a-z0-9](?:[a-z0-9-]*[a-z0-9])?)\.patch$"
    )
    m = pattern.match(filename)
    if not m:
        raise SeriesError(
            f"patches/{upstream}/{filename}: name must be NNNN-{upstream}-<feature|bugfix>-<name>.patch "
            "(four digits, lower-case name with '-')"
        )
    return int(m.group(1)), m.group(2), m.group(3)


def load_patch(path: Path, upstream: str) -> Patch:
    """Read and validate one patch file (name, header, a diff with at least one file)."""
    number, kind, slug = parse_name(path.name, upstream)
    data = normalize_newlines(path.read_bytes())
    where = f"patches/{upstream}/{path.name}"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SeriesError(f"{where}: not UTF-8 ({exc})") from None
    meta = parse_header(text, where)
    if meta["Kind"] != kind:
        raise SeriesError(f"{where}: header says Kind: {meta['Kind']} but the file name says {kind}")
    files = tuple(m.group(2).decode() for m in _DIFF_RE.finditer(data))
    if not files:
        raise SeriesError(f"{where}: contains no 'diff --git' section")
    return Patch(path=path, upstream=upstream, number=number, kind=kind, slug=slug, data=data, meta=meta, files=files)


def load_series(upstream: str, patches_dir: Path | None = None) -> Series:
    """Load ``<patches_dir>/<upstream>/series`` (default ``patches/``) strictly.

    An upstream with no folder has an empty series.

    Raises:
        SeriesError: listed file missing, file not listed, duplicate, numbers not increasing,
            bad name or header. The message names the file.
    """
    base = (patches_dir or PATCHES_DIR) / upstream
    if not base.is_dir():
        return Series(upstream, ())
    series_file = base / "series"
    if not series_file.is_file():
        raise SeriesError(f"{base}: has no 'series' file listing the patches in order")
    names = []
    for raw in series_file.read_text(encoding="utf-8").splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            names.append(line)
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise SeriesError(f"{series_file}: lists {', '.join(dup)} more than once")
    on_disk = {p.name for p in base.glob("*.patch")}
    unlisted = sorted(on_disk - set(names))
    if unlisted:
        raise SeriesError(f"{series_file}: does not list {', '.join(unlisted)}; add it to the series or delete it")
    missing = [n for n in names if n not in on_disk]
    if missing:
        raise SeriesError(f"{series_file}: lists {', '.join(missing)}, which does not exist in {base}")
    patches = tuple(load_patch(base / n, upstream) for n in names)
    for prev, cur in zip(patches, patches[1:], strict=False):
        if cur.number <= prev.number:
            raise SeriesError(f"{series_file}: {cur.name} comes after {prev.name}; numbers must increase")
    return Series(upstream, patches)


def series_upstreams(patches_dir: Path | None = None) -> list[str]:
    """Names of the upstream folders under ``patches/`` (sorted)."""
    base = patches_dir or PATCHES_DIR
    return sorted(p.name for p in base.iterdir() if p.is_dir()) if base.is_dir() else []
