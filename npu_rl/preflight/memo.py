"""Reuse of the pinned libraries' verdicts between dry runs of an unchanged recipe (issue 17, part 6).

verl's ``validate_config`` and the vLLM / vllm-ascend engine checks (:mod:`npu_rl.preflight.libraries`)
need verl, vLLM and torch imported: about 10 s of a dry run on a 2-core machine, against well under a
second for everything else. Their verdict is a function of what they read, so it is kept and reused
while all of that is unchanged:

- **the inputs**, in the key: the composed config (unresolved, so interpolations count as written), the
  feature keys injected for this verl, the whole environment except :data:`VOLATILE_ENV` (the job's
  and the process's: the libraries read ``os.environ`` themselves, ``VLLM_*``, ``PYTORCH_NPU_ALLOC_CONF``,
  ...), the working directory, the interpreter, the model facts file (content), and for every path the
  config names its state (a file's size and mtime, a directory's listing, or absent);
- **what the checks read**, recorded while they run with an audit hook (PEP 578): every file opened
  for reading (modules, configs, ``config.json``) and every directory listed (import path scans, so a
  ``pip install`` into site-packages counts), plus the file of every imported module. An entry is used
  only if each of these still has the same size and mtime (files) or the same names (directories).

An entry stores the problems each stage added to the report, in order, and the values a stage kept for
the plan (:meth:`Memo.put`); it is replayed in place of the stage. ``NPU_RL_PREFLIGHT_CACHE=0`` runs the
stages (and records their fresh verdict); the plan says which happened. Entries live in
``<cache>/preflight/`` (:func:`npu_rl.cache_dir`), written atomically, the newest
:data:`MAX_ENTRIES` kept. An unreadable or foreign entry is a miss, never an error.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from npu_rl import cache_dir
from npu_rl.preflight.report import Problem, Report

FORMAT = 2  # 2: entries keep the stages' values (the rollout's resolved graph settings)
MAX_ENTRIES = 200
SWITCH = "NPU_RL_PREFLIGHT_CACHE"
# Set per launcher invocation (temporary paths) or by the shell itself; read by none of the libraries;
# SWITCH too: reuse on or off judges the same configuration.
VOLATILE_ENV = frozenset({"NPU_RL_PLAN_MARK", "NPU_RL_PLAN_JSON", "OLDPWD", "SHLVL", "_", SWITCH})
# The launcher's notes of where each variable came from (its environment table): names, not settings.
_LAUNCHER_BOOKS = "NPU_RL_FROM_"
_SKIP_PREFIXES = ("/proc/", "/sys/", "/dev/")
_STDLIB = tuple({sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"]})


def enabled(env: Mapping[str, str]) -> bool:
    """Reuse is on unless ``NPU_RL_PREFLIGHT_CACHE`` is 0/false/no/off.

    Raises:
        ValueError: the value is not a boolean word (names the variable and the accepted words).
    """
    raw = env.get(SWITCH, "1").strip().lower()
    if raw in ("1", "true", "yes", "on", ""):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{SWITCH}={env.get(SWITCH)!r}: write 1 (reuse the libraries' verdicts) or 0 (always run them)")


def _path_state(raw: str, cwd: str) -> Any:
    p = Path(os.path.expanduser(raw))
    if not p.is_absolute():
        p = Path(cwd) / p
    try:
        if p.is_dir():
            names = sorted(os.listdir(p))
            return ["dir", [(n, *_stat(p / n)) for n in names[:2000]], len(names)]
        st = p.stat()
        return ["file", st.st_size, st.st_mtime_ns]
    except OSError:
        return ["absent"]


def _stat(p: Path) -> tuple[int, int]:
    try:
        st = p.stat()
        return st.st_size, st.st_mtime_ns
    except OSError:
        return -1, -1


def _path_leaves(node: Any) -> Iterator[str]:
    if isinstance(node, Mapping):
        for v in node.values():
            yield from _path_leaves(v)
    elif isinstance(node, list | tuple):
        for v in node:
            yield from _path_leaves(v)
    elif isinstance(node, str) and node.startswith(("/", "~", "./", "../")) and "\n" not in node and len(node) < 4096:
        yield node


def _env_items(env: Mapping[str, str]) -> list[tuple[str, str]]:
    return sorted((k, v) for k, v in env.items() if k not in VOLATILE_ENV and not k.startswith(_LAUNCHER_BOOKS))


def key_of(cfg, injected, env: Mapping[str, str], config_json: Path | None) -> str:
    """The sha256 of everything the library stages take as input (see the module docstring)."""
    from omegaconf import OmegaConf

    cwd = os.getcwd()
    plain = OmegaConf.to_container(cfg, resolve=False)
    facts = None
    if config_json is not None:
        try:
            facts = [str(config_json), hashlib.sha256(Path(config_json).read_bytes()).hexdigest()]
        except OSError:
            facts = [str(config_json), "unreadable"]
    parts = {
        "format": FORMAT,
        "python": [sys.executable, sys.version],
        "cwd": cwd,
        "config": OmegaConf.to_yaml(cfg),
        "injected": sorted(injected),
        "env": _env_items(env),
        # the libraries read the process environment, which differs from ``env`` when called in-process
        "os.environ": None if env is os.environ else _env_items(os.environ),
        "facts": facts,
        "paths": sorted({p: _path_state(p, cwd) for p in _path_leaves(plain)}.items()),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


class _Recorder:
    """Files opened for reading and directories listed while recording is on (an audit hook cannot be
    removed once added, so one hook serves every recording of the process)."""

    active: _Recorder | None = None
    installed = False

    def __init__(self):
        self.files: set[str] = set()
        self.dirs: set[str] = set()

    @classmethod
    def _hook(cls, event: str, args: tuple) -> None:
        rec = cls.active
        if rec is None:
            return
        if event == "open":
            path, mode = args[0], args[1]
            reading = mode is None or not any(c in mode for c in "wax+")
            if reading and isinstance(path, str | bytes | os.PathLike):
                rec.files.add(os.fsdecode(path))
        elif event in ("os.listdir", "os.scandir") and args and isinstance(args[0], str | bytes | os.PathLike):
            rec.dirs.add(os.fsdecode(args[0]))

    def __enter__(self) -> _Recorder:
        if not _Recorder.installed:
            sys.addaudithook(_Recorder._hook)
            _Recorder.installed = True
        self._outer, _Recorder.active = _Recorder.active, self
        return self

    def __exit__(self, *exc) -> None:
        _Recorder.active = self._outer
        if self._outer is not None:  # what an inner recording read, the outer one read too
            self._outer.files |= self.files
            self._outer.dirs |= self.dirs


def _dependencies(rec: _Recorder) -> dict[str, list]:
    """{path: state} of what the stages read, with stdlib, /proc & co and vanished temporaries left out."""
    files = set(rec.files)
    for mod in list(sys.modules.values()):
        f = getattr(mod, "__file__", None)
        if isinstance(f, str):
            files.add(f)
    deps: dict[str, list] = {}
    for raw in files:
        path = os.path.abspath(raw)
        if path.startswith(_SKIP_PREFIXES) or path.startswith(_STDLIB) or "/__pycache__/" in path:
            continue
        try:
            st = os.stat(path)
        except OSError:
            continue  # a temporary the stage made and removed (e.g. the copied config.json)
        if os.path.isfile(path):
            deps[path] = ["file", st.st_size, st.st_mtime_ns]
    for raw in rec.dirs:
        path = os.path.abspath(raw or ".")
        if path.startswith(_SKIP_PREFIXES) or path.startswith(_STDLIB):
            continue
        try:
            deps[path] = ["dir", hashlib.sha256("\0".join(sorted(os.listdir(path))).encode()).hexdigest()]
        except OSError:
            continue
    return deps


def _changed(deps: Mapping[str, list]) -> str | None:
    """The first dependency that no longer matches (its path), or None."""
    for path, state in deps.items():
        try:
            if state[0] == "file":
                st = os.stat(path)
                if [st.st_size, st.st_mtime_ns] != state[1:]:
                    return path
            elif hashlib.sha256("\0".join(sorted(os.listdir(path))).encode()).hexdigest() != state[1]:
                return path
        except OSError:
            return path
    return None


class Memo:
    """The verdicts of one preflight's library stages: replayed from an entry, or recorded for one.

    Use: ``with memo.stage("name", report) as run: if run: <the stage>``, for each stage in the same
    order every time; then :meth:`save`. ``status`` is the plan's line.
    """

    def __init__(self, key: str, directory: Path | None, reuse: bool = True):
        self.key, self.directory = key, directory
        self.entry: dict | None = None
        self.stages: dict[str, list[dict]] = {}
        self.values: dict[str, Any] = {}
        self.reason = ""
        self.started = time.monotonic()
        self._rec = _Recorder()
        if not reuse:
            self.reason = f"{SWITCH}=0"  # run, and record the fresh verdict for the next run
        elif directory is not None:
            self.entry = self._load()

    @property
    def path(self) -> Path | None:
        return None if self.directory is None else self.directory / f"{self.key}.json"

    def _load(self) -> dict | None:
        try:
            entry = json.loads(self.path.read_text())
        except FileNotFoundError:
            self.reason = "first run of this configuration"
            return None
        except (OSError, ValueError) as e:
            self.reason = f"cached entry unreadable ({e.__class__.__name__})"
            return None
        if not isinstance(entry, dict) or entry.get("format") != FORMAT or entry.get("key") != self.key:
            self.reason = "cached entry of another format"
            return None
        changed = _changed(entry.get("deps", {}))
        if changed:
            self.reason = f"{changed} changed since the cached verdict"
            return None
        return entry

    @property
    def hit(self) -> bool:
        return self.entry is not None

    @contextlib.contextmanager
    def stage(self, name: str, report: Report) -> Iterator[bool]:
        """Yield False after replaying the stage's stored problems into ``report`` (a hit), else True and
        record what the stage adds to ``report``."""
        if self.entry is not None:
            report.problems.extend(Problem(**p) for p in self.entry["stages"][name])
            yield False
            return
        start = len(report.problems)
        with self._rec:
            yield True
        self.stages[name] = [dataclasses.asdict(p) for p in report.problems[start:]]

    def put(self, name: str, value: Any) -> None:
        """Keep a JSON-able value a stage computed (for the plan), replayed by :meth:`get` on a hit."""
        self.values[name] = value

    def get(self, name: str, default: Any = None) -> Any:
        """The value :meth:`put` kept under ``name``: this run's, or the reused entry's."""
        if self.entry is not None:
            return self.entry.get("values", {}).get(name, default)
        return self.values.get(name, default)

    def save(self) -> None:
        """Write the entry (atomically; a failure to write only costs the next run its reuse)."""
        if self.entry is not None or self.directory is None:
            return
        took = time.monotonic() - self.started
        entry = {
            "format": FORMAT,
            "key": self.key,
            "created": time.strftime("%Y-%m-%d %H:%M:%S"),
            "seconds": round(took, 2),
            "stages": self.stages,
            "values": self.values,
            "deps": _dependencies(self._rec),
        }
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".entry-", suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                json.dump(entry, f)
            os.replace(tmp, self.path)
            self._prune()
        except OSError as e:
            self.reason += f"; not cached: {e}"
            with contextlib.suppress(OSError, UnboundLocalError):
                os.unlink(tmp)

    def _prune(self) -> None:
        entries = sorted(self.directory.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
        for old in entries[MAX_ENTRIES:]:
            with contextlib.suppress(OSError):
                old.unlink()

    @property
    def status(self) -> str:
        """One line for the plan: reused (when, how long it had taken) or run now (and why)."""
        if self.entry is not None:
            return (
                f"verl / vLLM / vllm-ascend verdicts reused from {self.entry['created']} (same config, environment, "
                f"model files and library code; they took {self.entry['seconds']:g} s); {SWITCH}=0 re-runs them"
            )
        return f"verl / vLLM / vllm-ascend checks run now ({self.reason})"


def remember(name: str, args: Any, fn: Callable[[], Any]) -> Any:
    """``fn()``, or its earlier result while nothing it read has changed (the rule of :class:`Memo`, for
    one call: e.g. the field list of a library dataclass, which costs the import of torch).

    ``name`` and ``args`` (JSON-able) key the call; the result must survive a JSON round trip unchanged
    (lists, strings, numbers, None), else it is returned but not kept. ``NPU_RL_PREFLIGHT_CACHE=0``
    calls ``fn`` and keeps the fresh result; an invalid value of it is reported by the preflight (here
    it means reuse).
    """
    try:
        reuse = enabled(os.environ)
    except ValueError:
        reuse = True
    key = hashlib.sha256(json.dumps([FORMAT, name, args, sys.executable, sys.version], default=str).encode())
    path = cache_dir() / "preflight" / "calls" / f"{key.hexdigest()}.json"
    if reuse:
        try:
            entry = json.loads(path.read_text())
            if entry.get("format") == FORMAT and entry.get("name") == name and not _changed(entry["deps"]):
                return entry["value"]
        except (OSError, ValueError, KeyError, AttributeError, TypeError):
            pass
    rec = _Recorder()
    with rec:
        value = fn()
    if json.loads(json.dumps(value)) != value:
        return value
    entry = {"format": FORMAT, "name": name, "value": value, "deps": _dependencies(rec)}
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".entry-", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(entry, f)
        os.replace(tmp, path)
    return value


def open_memo(cfg, injected, env: Mapping[str, str], config_json: Path | None) -> Memo:
    """The :class:`Memo` of this preflight (no reuse when ``NPU_RL_PREFLIGHT_CACHE=0``).

    Raises:
        ValueError: ``NPU_RL_PREFLIGHT_CACHE`` is not a boolean word.
    """
    return Memo(key_of(cfg, injected, env, config_json), cache_dir() / "preflight", reuse=enabled(env))
