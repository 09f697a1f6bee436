"""Fault injection for the set-up tools: all or nothing under the faults of a real cluster.

Every trial runs the real entry points (``bash apply_all_patches.sh``, ``bash download_sources.sh``)
as subprocesses on the real pinned trees, and afterwards checks each tree with plain git, not with
the engine: its working tree must hash to the baseline or to the fully applied series (computed once,
below, by ``git apply`` of every patch on a scratch copy). Scenarios (issue 16):

- concurrent applies (and an apply racing a revert) on one sources folder, as pdsh on every node
  against a shared NFS checkout does;
- one to three signals (SIGINT, SIGTERM, SIGHUP, mixed) 2-80 ms apart at a random moment, sent to
  the whole process group as a terminal's Ctrl-C is (git children included);
- a second fault while rolling back: a stale ``index.lock`` in one tree, a write refused in another;
- a full disk: a real small tmpfs where this machine can mount one, else the same ENOSPC message
  injected at the git boundary;
- entry points run from inside a folder with another ``npu_rl`` package;
- an unreachable package index, leftovers of an interrupted download, a mixed ``--status``.

Faults the kernel would not give root (read-only trees: root ignores permission bits) are injected at
the boundary we control: a ``git`` wrapper (GIT_PYTHON_GIT_EXECUTABLE) that refuses one subcommand in
one tree with git's own message, and otherwise runs the real git.

Trials per scenario: ``NPU_RL_FAULT_TRIALS`` (default 6); seeds are printed with every failure, and
``NPU_RL_FAULT_SEED`` shifts them to explore new ones locally.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import pytest

from npu_rl import REPO_ROOT
from npu_rl.patches.series import PATCHES_DIR

# Runs the entry points against copied trees under injected faults: left out of --quick.
pytestmark = pytest.mark.slow

TRIALS = int(os.environ.get("NPU_RL_FAULT_TRIALS", "6"))
SEED0 = int(os.environ.get("NPU_RL_FAULT_SEED", "0"))
REAL_GIT = shutil.which("git")
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


# --- plain-git view of the trees (independent of the engine) ---------------------------------------
def _git(cwd: Path, *args: str, env: dict | None = None, input: bytes | None = None) -> str:
    out = subprocess.run(
        [REAL_GIT, *args], cwd=cwd, env={**os.environ, **(env or {})}, input=input, capture_output=True, check=True
    )
    return out.stdout.decode().strip()


def tree_hash(path: Path) -> str:
    """Hash of the working tree (untracked files included), through a throw-away index."""
    with tempfile.TemporaryDirectory() as tmp:
        index = Path(tmp) / "index"
        if (path / ".git" / "index").exists():
            shutil.copy2(path / ".git" / "index", index)
        env = {"GIT_INDEX_FILE": str(index)}
        _git(path, "add", "--all", ".", env=env)
        return _git(path, "write-tree", env=env)


def _series(name: str) -> list[Path]:
    d = PATCHES_DIR / name
    if not (d / "series").exists():
        return []
    names = [ln.strip() for ln in (d / "series").read_text().splitlines()]
    return [d / n for n in names if n and not n.startswith("#")]


def reset(sources: Path) -> None:
    """Every tree back to its baseline by plain git (the trial set-up does not trust the engine)."""
    for tree in sorted(p for p in sources.iterdir() if (p / ".git").is_dir()):
        (tree / ".git" / "index.lock").unlink(missing_ok=True)
        _git(tree, "reset", "--quiet", "--hard", "refs/tags/upstream")
        _git(tree, "clean", "--quiet", "-d", "--force")


def apply_by_hand(sources: Path) -> None:
    for tree in sorted(p for p in sources.iterdir() if (p / ".git").is_dir()):
        for patch in _series(tree.name):
            _git(tree, "apply", "--whitespace=nowarn", "-", input=patch.read_bytes())


@pytest.fixture(scope="module")
def trees(tmp_path_factory, pristine_sources, lock):
    """(sources folder, {name: (baseline hash, applied hash)}) for the patched trees, in lock order
    (the order the engine goes through them)."""
    sources = tmp_path_factory.mktemp("fault-sources") / "sources"
    shutil.copytree(pristine_sources, sources, symlinks=True)
    names = [n for n in lock.upstreams if (sources / n / ".git").is_dir() and _series(n)]
    base = {n: _git(sources / n, "rev-parse", "refs/tags/upstream^{tree}") for n in names}
    apply_by_hand(sources)
    applied = {n: tree_hash(sources / n) for n in names}
    reset(sources)
    assert all(base[n] != applied[n] for n in names)
    return sources, {n: (base[n], applied[n]) for n in names}


def states(sources: Path, expect: dict) -> dict[str, str]:
    out = {}
    for name, (base, applied) in expect.items():
        h = tree_hash(sources / name)
        out[name] = "baseline" if h == base else "applied" if h == applied else f"MIXED({h[:10]})"
    return out


def _env(extra: dict | None = None) -> dict:
    env = {**os.environ, "NPU_RL_PYTHON": sys.executable, **(extra or {})}
    env.pop("PYTHONPATH", None)
    return env


def start(script: str, *args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.Popen:
    """The entry point in a process group of its own (a terminal's foreground job)."""
    return subprocess.Popen(
        ["bash", str(REPO_ROOT / script), *args],
        cwd=cwd or REPO_ROOT,
        env=_env(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def finish(proc: subprocess.Popen, timeout: float = 300) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def run(script: str, *args: str, env: dict | None = None, cwd: Path | None = None) -> tuple[int, str, str]:
    return finish(start(script, *args, env=env, cwd=cwd))


def send_signals(proc: subprocess.Popen, rng: random.Random) -> list[str]:
    """One to three of SIGINT/SIGTERM/SIGHUP, 2-80 ms apart, to ``proc``'s whole process group (as a
    terminal's Ctrl-C reaches every process of the foreground job); returns the names sent."""
    sent = []
    for _ in range(rng.choice((1, 2, 3))):
        sig = rng.choice(SIGNALS)
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        sent.append(sig.name)
        time.sleep(rng.uniform(0.002, 0.080))
    return sent


def fault_git(tmp_path: Path, rules: list[tuple[str, str, str, int]], write_delay: float = 0.0) -> dict:
    """Environment whose PATH puts a git wrapper in front of the real git. Each rule (tree folder
    name, space-separated git subcommands, message, writes allowed) makes those subcommands fail in
    that tree with git's message and exit 128 once the tree has seen more than the allowed number
    of writing git calls (``apply`` without ``--cached``, ``reset``, ``clean``, ``checkout``): 0 =
    from the start, N = after the N patches of the apply went in (the rollback's writes fail).
    ``write_delay``: seconds each writing call sleeps first (a slow network file system), which
    widens the window in which a signal finds trees half-way through the series."""
    bindir = tmp_path / "fault-bin"
    state = tmp_path / "fault-state"
    bindir.mkdir(exist_ok=True)
    state.mkdir(exist_ok=True)
    lines = [
        "#!/usr/bin/env bash",
        'sub=""; cached=0; write=0; n=0',
        'for a in "$@"; do [[ "$a" == --cached ]] && cached=1; done',
        'for a in "$@"; do case "$a" in -*) ;; *) sub="$a"; break ;; esac; done',
        'tree="$(basename "$PWD")"',
        'case "$sub" in reset | clean | checkout) write=1 ;; apply) ((cached)) || write=1 ;; esac',
        f'count="{state}/$tree"',
        'if ((write)); then n=$(( $(cat "$count" 2>/dev/null || echo 0) + 1 )); echo "$n" > "$count"; fi',
    ]
    for tree, subs, message, allowed in rules:
        lines.append(
            f'if [[ "$tree" == {tree!r} && " {subs} " == *" $sub "* ]] && (( write && n > {allowed} )); then '
            f"printf '%s\\n' {message!r} >&2; exit 128; fi"
        )
    if write_delay:
        lines.append(f"if ((write)); then sleep {write_delay}; fi")
    lines.append(f'exec {REAL_GIT} "$@"')
    wrapper = bindir / "git"
    wrapper.write_text("\n".join(lines) + "\n")
    wrapper.chmod(0o755)
    return {"PATH": f"{bindir}:{os.environ['PATH']}"}


def _no_traceback(err: str, context: str) -> None:
    assert "Traceback" not in err, f"{context}: a raw traceback\n{err[-3000:]}"


# --- 1. concurrency ------------------------------------------------------------------------------
@pytest.mark.parametrize("trial", range(TRIALS))
def test_concurrent_applies_end_fully_applied_and_claims_hold(trees, trial):
    sources, expect = trees
    rng = random.Random(SEED0 * 1000 + trial)
    reset(sources)
    procs = []
    for _ in range(rng.choice((2, 3))):
        procs.append(start("apply_all_patches.sh", "--sources", str(sources)))
        time.sleep(rng.uniform(0, 0.3))
    results = [finish(p) for p in procs]
    got = states(sources, expect)
    ctx = f"seed {SEED0 * 1000 + trial}: exit codes {[r[0] for r in results]}, trees {got}"
    for rc, _, err in results:
        _no_traceback(err, ctx)
        assert rc == 0, f"{ctx}\n{err[-2000:]}"
    assert set(got.values()) == {"applied"}, ctx
    rc, out, err = run("apply_all_patches.sh", "--status", "--sources", str(sources))
    assert rc == 0, f"{ctx}: --status exit {rc}\n{out}{err}"


@pytest.mark.parametrize("trial", range(max(2, TRIALS // 2)))
def test_apply_racing_a_revert_ends_all_baseline_or_all_applied(trees, trial):
    sources, expect = trees
    rng = random.Random(SEED0 * 1000 + 500 + trial)
    reset(sources)
    if rng.random() < 0.5:
        apply_by_hand(sources)
    first, second = rng.sample([["--revert"], []], 2)
    a = start("apply_all_patches.sh", *first, "--sources", str(sources))
    time.sleep(rng.uniform(0, 0.3))
    b = start("apply_all_patches.sh", *second, "--sources", str(sources))
    ra, rb = finish(a), finish(b)
    got = states(sources, expect)
    ctx = f"seed {SEED0 * 1000 + 500 + trial}: {first or ['apply']} then {second or ['apply']}: {ra[0]}, {rb[0]}; {got}"
    assert ra[0] == 0 and rb[0] == 0, f"{ctx}\n{ra[2][-1500:]}\n{rb[2][-1500:]}"
    assert len(set(got.values())) == 1 and next(iter(got.values())) in ("baseline", "applied"), ctx


# --- 2. signals ----------------------------------------------------------------------------------
@pytest.mark.parametrize("trial", range(TRIALS * 2))
def test_signals_at_random_points_leave_all_baseline_or_all_applied(trees, tmp_path, trial):
    sources, expect = trees
    seed = SEED0 * 1000 + 100 + trial
    rng = random.Random(seed)
    reset(sources)
    # each patch written takes 0.1 s (a slow NFS): the apply phase spans about 1.5 s
    proc = start("apply_all_patches.sh", "--sources", str(sources), env=fault_git(tmp_path, [], write_delay=0.1))
    # a quarter of the trials hit the start-up (bash, Python's imports), the rest the apply itself
    time.sleep(rng.uniform(0.0, 0.4) if trial % 4 == 0 else rng.uniform(0.8, 2.6))
    sent = send_signals(proc, rng)
    rc, out, err = finish(proc)
    got = states(sources, expect)
    ctx = f"seed {seed}: sent {sent}, exit {rc}, trees {got}"
    _no_traceback(err, ctx)
    values = set(got.values())
    if rc == 0:
        assert values == {"applied"}, f"{ctx}\n{err[-2000:]}"
    elif rc < 0:  # killed before Python ran (bash choosing the interpreter): nothing may have changed
        assert values == {"baseline"}, f"{ctx}\n{err[-2000:]}"
    else:
        assert rc in (128 + signal.SIGINT, 128 + signal.SIGTERM, 128 + signal.SIGHUP), f"{ctx}\n{err[-2000:]}"
        assert values == {"baseline"}, f"{ctx}\n{out[-1000:]}{err[-2000:]}"


@pytest.mark.parametrize("trial", range(max(2, TRIALS // 2)))
def test_signals_during_revert_leave_each_tree_whole_and_a_rerun_finishes(trees, trial):
    sources, expect = trees
    seed = SEED0 * 1000 + 300 + trial
    rng = random.Random(seed)
    reset(sources)
    apply_by_hand(sources)
    proc = start("apply_all_patches.sh", "--revert", "--sources", str(sources))
    time.sleep(rng.uniform(0.2, 2.5))
    sent = send_signals(proc, rng)
    rc, _, err = finish(proc)
    got = states(sources, expect)
    ctx = f"seed {seed}: sent {sent}, exit {rc}, trees {got}"
    _no_traceback(err, ctx)
    assert all(v in ("baseline", "applied") for v in got.values()), f"{ctx}\n{err[-2000:]}"
    rc, _, err = run("apply_all_patches.sh", "--revert", "--sources", str(sources))
    assert rc == 0 and set(states(sources, expect).values()) == {"baseline"}, f"{ctx}; rerun: {rc}\n{err[-2000:]}"


# --- 3. a second fault during rollback -------------------------------------------------------------
STALE = "fatal: Unable to create '{tree}/.git/index.lock': File exists."
READ_ONLY = "error: unable to unlink old 'x.py': Read-only file system"


@pytest.mark.parametrize("trial", range(max(2, TRIALS // 2)))
def test_rollback_tries_every_tree_and_names_the_fix_for_the_rest(trees, tmp_path, trial):
    sources, expect = trees
    seed = SEED0 * 1000 + 200 + trial
    rng = random.Random(seed)
    reset(sources)
    names = list(expect)  # lock order
    failing = rng.choice(names[1:])  # its apply fails: every tree before it must be rolled back
    earlier = names[: names.index(failing)]
    rules = [(failing, "apply", "error: unable to create file x.py: Read-only file system", 0)]
    # another git takes the index lock of one tree while we run: its rollback cannot 'git reset'
    stale = rng.choice(earlier)
    rules.append((stale, "reset", STALE.format(tree=sources / stale), len(_series(stale))))
    # and, in some trials, another tree turns read-only after it was patched: nothing restores it
    others = [n for n in earlier if n != stale]
    readonly = rng.choice(others) if others and rng.random() < 0.7 else None
    if readonly:
        rules.append((readonly, "apply reset clean checkout", READ_ONLY, len(_series(readonly))))
    rc, out, err = run("apply_all_patches.sh", "--sources", str(sources), env=fault_git(tmp_path, rules))
    got = states(sources, expect)
    ctx = f"seed {seed}: apply fails in {failing}, index lock taken in {stale}, read-only {readonly}; exit {rc}, {got}"
    _no_traceback(err, ctx)
    for name in names:
        want = "applied" if name == readonly else "baseline"
        assert got[name] == want, f"{ctx}\n{err[-3000:]}"
    if readonly:
        assert rc == 5, f"{ctx}\n{err[-3000:]}"
        assert f"--revert --only {readonly}" in err and "Read-only file system" in err, f"{ctx}\n{err[-3000:]}"
    else:
        assert rc == 7, f"{ctx}\n{err[-3000:]}"  # the apply's own I/O error; the rollback succeeded
    rc, _, err = run("apply_all_patches.sh", "--revert", "--sources", str(sources))
    assert rc == 0 and set(states(sources, expect).values()) == {"baseline"}, err[-2000:]


def test_io_errors_are_one_line_errors_with_their_own_exit_code_not_conflicts(trees, tmp_path):
    sources, expect = trees
    names = list(expect)
    for name, message, word in (
        (names[-1], "error: failed to write to 'x.py': No space left on device", "disk full"),
        (names[0], "error: unable to create file x.py: Read-only file system", "read-only"),
        (names[1], "error: unable to create file x.py: Permission denied", "permission"),
    ):
        reset(sources)
        rc, out, err = run(
            "apply_all_patches.sh", "--sources", str(sources), env=fault_git(tmp_path, [(name, "apply", message, 0)])
        )
        ctx = f"apply in {name} fails with {message!r}: exit {rc}"
        _no_traceback(err, ctx)
        assert rc == 7, f"{ctx}\n{err[-2000:]}"
        assert "Refresh the patch" not in err and "does not apply" not in err, f"{ctx}\n{err}"
        assert word in err.lower() and str(sources / name) in err, f"{ctx}\n{err}"
        assert set(states(sources, expect).values()) == {"baseline"}, ctx
    # a real stale index.lock found before anything is touched: refused, with the fix
    reset(sources)
    (sources / names[1] / ".git" / "index.lock").write_text("")
    rc, _, err = run("apply_all_patches.sh", "--sources", str(sources))
    _no_traceback(err, "apply with a stale index.lock")
    assert rc == 7 and "index.lock" in err and str(sources / names[1]) in err, err[-2000:]
    assert set(states(sources, expect).values()) == {"baseline"}
    apply_by_hand(sources)
    rc, _, err = run("apply_all_patches.sh", "--revert", "--sources", str(sources))
    _no_traceback(err, "revert with a stale index.lock")
    assert rc == 7 and "index.lock" in err and f"--revert --only {names[1]}" in err, err[-2000:]
    assert set(states(sources, expect).values()) == {"applied"}  # refused before touching any tree
    (sources / names[1] / ".git" / "index.lock").unlink()


# --- 4. a real full disk -----------------------------------------------------------------------------
def _tiny_upstream(tmp_path: Path, big_bytes: int) -> tuple[Path, Path]:
    """A lock with one small upstream (an archive on a local path's cache) and a series whose one
    patch adds ``big_bytes`` of text."""
    import hashlib

    src = tmp_path / "tiny-0.1"
    (src / "tiny").mkdir(parents=True)
    (src / "tiny" / "__init__.py").write_text("VALUE = 1\n")
    archive = tmp_path / "cache" / "archives" / "tiny-0.1.tar.gz"
    archive.parent.mkdir(parents=True)
    with tarfile.open(archive, "w:gz") as tf:
        tf.add(src, arcname="tiny-0.1")
    sha = hashlib.sha256(archive.read_bytes()).hexdigest()
    lock = tmp_path / "sources.lock"
    lock.write_text(
        'schema = 1\n[[upstream]]\nname = "tiny"\nversion = "0.1"\ngit = "https://example.invalid/tiny"\n'
        f'ref = "v0.1"\ncommit = "{"a" * 40}"\npatch_root = "."\nnote = "test upstream"\n'
        f'[upstream.pypi]\nproject = "tiny"\nfilename = "tiny-0.1.tar.gz"\nsha256 = "{sha}"\n'
    )
    patches = tmp_path / "patches" / "tiny"
    patches.mkdir(parents=True)
    lines = [f"{i:08d} {'x' * 60}" for i in range(big_bytes // 70)]
    body = "".join(f"+{ln}\n" for ln in lines)
    (patches / "0001-tiny-feature-big.patch").write_text(
        "Subject: a big new file\nKind: feature\nWhy: test\nSwitch: none\nUpstream: none\nTests: none\n---\n"
        "diff --git a/tiny/big.txt b/tiny/big.txt\nnew file mode 100644\n--- /dev/null\n+++ b/tiny/big.txt\n"
        f"@@ -0,0 +1,{len(lines)} @@\n{body}"
    )
    (patches / "series").write_text("0001-tiny-feature-big.patch\n")
    return lock, tmp_path / "patches"


@pytest.mark.serial  # mounts a tmpfs
def test_full_disk_is_reported_as_such_and_rolled_back(tmp_path, trees):
    mnt = tmp_path / "small-disk"
    mnt.mkdir()
    mounted = (
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=600k", "tmpfs", str(mnt)], capture_output=True).returncode
        == 0
    )
    try:
        if mounted:
            lock, patches = _tiny_upstream(tmp_path, big_bytes=1_500_000)
            env = {"NPU_RL_CACHE": str(tmp_path / "cache")}
            rc, out, err = run("download_sources.sh", "--lock", str(lock), "--dest", str(mnt / "sources"), env=env)
            assert rc == 0, out + err
            tiny = mnt / "sources" / "tiny"
            before = tree_hash(tiny)
            rc, out, err = run(
                "apply_all_patches.sh",
                "--lock",
                str(lock),
                "--patches",
                str(patches),
                "--sources",
                str(mnt / "sources"),
            )
            what = "a real 600 KiB tmpfs"
        else:  # no mount here: the same ENOSPC message from git, injected at the git boundary
            sources, expect = trees
            reset(sources)
            name = list(expect)[-1]
            tiny = sources / name
            before = tree_hash(tiny)
            rules = [(name, "apply", "error: failed to write to 'x.py': No space left on device", 0)]
            rc, out, err = run("apply_all_patches.sh", "--sources", str(sources), env=fault_git(tmp_path, rules))
            what = "an injected ENOSPC"
        print(f"full disk simulated with {what}")
        _no_traceback(err, what)
        assert rc == 7, f"{what}: exit {rc}\n{out}{err}"
        assert "disk full" in err.lower() and "Refresh the patch" not in err, err
        assert tree_hash(tiny) == before, f"{what}: the tree was not rolled back"
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(mnt)], check=False)


# --- 5. a foreign working directory ---------------------------------------------------------------
def test_entry_points_use_the_projects_own_package_from_any_cwd(tmp_path, trees):
    sources, _ = trees
    reset(sources)
    other = tmp_path / "other-checkout"
    for mod in ("npu_rl", "npu_rl/patches", "npu_rl/sources"):
        (other / mod).mkdir(parents=True, exist_ok=True)
        (other / mod / "__init__.py").write_text(
            "import sys\nprint('FOREIGN PACKAGE', file=sys.stderr)\nsys.exit(99)\n"
        )
    (other / "npu_rl" / "patches" / "__main__.py").write_text("import sys\nprint('FOREIGN PACKAGE')\nsys.exit(0)\n")
    (other / "sources.lock").write_text("schema = 1\n")
    rc, out, err = run("apply_all_patches.sh", "--status", "--sources", str(sources), cwd=other)
    assert "FOREIGN" not in out + err and rc == 0 and "verl" in out, f"exit {rc}\n{out}{err}"
    rc, out, err = run("download_sources.sh", "--help", cwd=other)
    assert "FOREIGN" not in out + err and rc == 0 and "--from" in out, f"exit {rc}\n{out}{err}"
    rc, out, err = run("ray_start_npu.sh", "--help", cwd=other)
    assert "FOREIGN" not in out + err and rc == 0, f"exit {rc}\n{out}{err}"


# --- 6. silent success ---------------------------------------------------------------------------
def test_unreachable_index_fails_the_download(tmp_path):
    env = {
        "NPU_RL_CACHE": str(tmp_path / "empty-cache"),
        "PIP_INDEX_URL": "http://127.0.0.1:9/simple/",
        "PIP_CONFIG_FILE": os.devnull,
    }
    rc, out, err = run("download_sources.sh", "--no-git", "--dest", str(tmp_path / "src"), env=env)
    _no_traceback(err, "unreachable index")
    assert rc != 0, f"an unreachable index exited 0\n{out}{err}"
    assert "verl" in err and "SKIPPED verl" not in out, out + err
    assert "mindspeed" not in err, "the optional git-only upstream under --no-git is not a failure"


def test_leftovers_of_an_interrupted_download_are_cleaned(tmp_path, archive, lock):
    dest = tmp_path / "src"
    dest.mkdir()
    archive("mbridge")  # warm cache
    leftover = dest / ".vllm.tmp-k3j2l1"
    (leftover / "x").mkdir(parents=True)
    (leftover / "x" / "big.bin").write_bytes(b"\0" * 1000)
    trash = dest / ".verl.old-12345"
    trash.mkdir()
    rc, out, err = run("download_sources.sh", "--only", "mbridge", "--dest", str(dest))
    assert rc == 0, out + err
    assert not leftover.exists() and not trash.exists(), sorted(p.name for p in dest.iterdir())
    assert (dest / "mbridge" / ".git").is_dir()


def test_status_of_a_mixed_set_of_trees_exits_nonzero(trees):
    sources, expect = trees
    reset(sources)
    apply_by_hand(sources)
    first = list(expect)[0]
    _git(sources / first, "reset", "--quiet", "--hard", "refs/tags/upstream")
    _git(sources / first, "clean", "--quiet", "-d", "--force")
    rc, out, err = run("apply_all_patches.sh", "--status", "--sources", str(sources))
    assert rc == 3, f"--status of a mixed set exited {rc}\n{out}{err}"
    assert "mixed" in (out + err).lower() and first in out + err, out + err
    reset(sources)
    rc, out, err = run("apply_all_patches.sh", "--status", "--sources", str(sources))
    assert rc == 0, out + err  # all at baseline: consistent
    # .ci/run compares two --status outputs around a no-op apply: nothing in them may vary (a
    # "done in 0.5 s" line did, and failed a CI run)
    assert run("apply_all_patches.sh", "--status", "--sources", str(sources))[1] == out
    assert "done in" not in out


def test_a_held_sources_folder_names_its_holder_and_times_out(tmp_path, trees):
    """The lock a second node waits on: the message names pid and host; past NPU_RL_LOCK_TIMEOUT it
    gives up with exit 8 and touches nothing."""
    import socket

    from npu_rl import srclock

    sources, expect = trees
    reset(sources)
    with srclock.exclusive(sources, "apply_all_patches.sh (a test holding the lock)"):
        t0 = time.monotonic()
        rc, out, err = run("apply_all_patches.sh", "--sources", str(sources), env={"NPU_RL_LOCK_TIMEOUT": "2"})
        waited = time.monotonic() - t0
    assert rc == 8, f"exit {rc}\n{out}{err}"
    assert f"pid {os.getpid()} on {socket.gethostname()}" in err and "a test holding the lock" in err, err
    assert waited >= 2, waited
    assert set(states(sources, expect).values()) == {"baseline"}
    rc, out, err = run("apply_all_patches.sh", "--sources", str(sources))  # released: goes through
    assert rc == 0 and set(states(sources, expect).values()) == {"applied"}, out + err


@pytest.mark.parametrize("trial", range(2))
def test_nodes_sharing_one_archive_cache_download_concurrently(tmp_path, local_index, archive, lock, trial):
    """Nodes with their own sources folders but one cache (an NFS home): the downloads of the same
    archive must not take each other's .part file for a leftover."""
    up = lock.get("vllm-ascend")
    local_index.add(up.pypi.project, archive("vllm-ascend"))
    env = {
        "NPU_RL_CACHE": str(tmp_path / "shared-cache"),
        "PIP_INDEX_URL": local_index.url,
        "PIP_CONFIG_FILE": os.devnull,
    }
    procs = [
        start("download_sources.sh", "--only", "vllm-ascend", "--dest", str(tmp_path / f"node{i}"), env=env)
        for i in range(3)
    ]
    results = [finish(p) for p in procs]
    for i, (rc, out, err) in enumerate(results):
        _no_traceback(err, f"node {i}")
        assert rc == 0, f"trial {trial}, node {i}: exit {rc}\n{out}{err}"
        assert _git(tmp_path / f"node{i}" / "vllm-ascend", "rev-parse", "refs/tags/upstream^{tree}")
    assert not list((tmp_path / "shared-cache" / "archives").glob("*.part"))
