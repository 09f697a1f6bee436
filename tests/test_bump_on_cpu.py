"""``apply_all_patches.sh bump``: driven end to end on a small fake upstream.

The fake upstream is a real git repository with tagged releases 1.0-1.3 and an sdist of each,
served by a local HTTP package index (PEP 503 pages with sha256 fragments), so the bump runs the
real download client, git ls-remote, the three-way replay and the switch. Each case starts from a
fresh copy of the project at 1.0 with its two patches applied:

* 1.1 rewrites a context line of patch 0001 (a plain ``git apply`` fails; the merge succeeds);
* 1.2 rewrites the very line 0001 changes (a real conflict);
* 1.3 ships 0001's change itself (upstream contains it; its reverse applies).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys

import pytest

from npu_rl.gittree import Tree, git
from npu_rl.lock import load_lock

# Builds and copies upstream trees: left out of --quick.
pytestmark = pytest.mark.slow

CORE = [f"line {i}" for i in range(1, 31)]
CORE[9] = "VALUE = 1"  # line 10: what patch 0001 changes
RELEASES = {
    "1.0": {},
    "1.1": {7: "line 8, reworded upstream"},  # line 8: inside 0001's context, two lines from its change
    "1.2": {9: "VALUE = 3"},  # the line 0001 changes
    "1.3": {9: "VALUE = 2"},  # 0001's own change
}
P1 = "0001-fake-bugfix-value.patch"
P2 = "0002-fake-feature-extra.patch"
LOCK_HEAD = "# test lock: this comment and the other table must survive the bump byte for byte\nschema = 1\n"
OTHER = '\n[[upstream]]\nname = "other"\nversion = "9.9"\ngit = "none"\nref = "v9.9"\ncommit = "' + "a" * 40 + '"\n'


def _core(version: str) -> str:
    lines = list(CORE)
    for i, text in RELEASES[version].items():
        lines[i] = text
    return "\n".join(lines) + "\n"


def _run(args, env=None, check=True, **kw):
    return subprocess.run(args, capture_output=True, text=True, env=env, check=check, **kw)


@pytest.fixture(scope="module")
def upstream(tmp_path_factory):
    """The fake upstream's git repository (tags v1.0..v1.3) and an sdist of each release."""
    base = tmp_path_factory.mktemp("fake-upstream")
    repo = base / "repo"
    (repo / "fake").mkdir(parents=True)
    git(repo, "init", "--quiet", "--initial-branch=main")
    (repo / "fake" / "other.py").write_text("\n".join(f"other {i}" for i in range(30)) + "\n")
    commits = {}
    for version in RELEASES:
        (repo / "fake" / "core.py").write_text(_core(version))
        (repo / "pyproject.toml").write_text(f'[project]\nname = "fake"\nversion = "{version}"\n')
        git(repo, "add", "--all", ".")
        git(repo, "commit", "--quiet", "-m", f"release {version}")
        git(repo, "tag", "-a", f"v{version}", "-m", f"fake {version}")
        commits[version] = git(repo, "rev-parse", "HEAD")
    files = base / "sdists"
    files.mkdir()
    for version in RELEASES:
        out = files / f"fake-{version}.tar.gz"
        git(repo, "archive", "--format=tar.gz", f"--prefix=fake-{version}/", "-o", str(out), f"v{version}")
    return {"repo": repo, "commits": commits, "files": files}


@pytest.fixture
def index(upstream, local_index):
    """The sdists on a local PEP 503 index (conftest's), with their sha256 published."""
    for sdist in sorted(upstream["files"].iterdir()):
        local_index.add("fake", sdist, publish_sha256=True)
    return {**upstream, "url": local_index.url}


@pytest.fixture
def project(index, tmp_path):
    """A project at fake 1.0 with a two-patch series, downloaded and applied by our own tools."""
    env = {
        **os.environ,
        "PIP_INDEX_URL": index["url"],
        "NPU_RL_CACHE": str(tmp_path / "cache"),
        "PIP_CONFIG_FILE": os.devnull,
    }
    env.pop(KILL, None)
    lock = tmp_path / "proj" / "sources.lock"
    lock.parent.mkdir()
    sha = hashlib.sha256((index["files"] / "fake-1.0.tar.gz").read_bytes()).hexdigest()
    lock.write_text(
        LOCK_HEAD
        + f'\n[[upstream]]\nname = "fake"\nversion = "1.0"\ngit = "{index["repo"]}"\nref = "v1.0"\n'
        + f'commit = "{index["commits"]["1.0"]}"\nnote = """Why we pin fake 1.0."""\n\n'
        + f'[upstream.pypi]\nproject = "fake"\nfilename = "fake-1.0.tar.gz"\nsha256 = "{sha}"\n'
        + OTHER
    )
    (lock.parent / "README.md").write_text(
        "# proj\n\n<!-- stack-table:begin -->\nstale\n<!-- stack-table:end -->\nend\n"
    )
    patches = tmp_path / "proj" / "patches"
    sources = tmp_path / "proj" / "sources"
    # The series is written by our own maintainer loop: commits on the pristine 1.0 tree, exported.
    _run([sys.executable, "-m", "npu_rl.sources", "--lock", str(lock), "--dest", str(sources), "--only", "fake"], env)
    tree = sources / "fake"
    core = tree / "fake" / "core.py"
    core.write_text(core.read_text().replace("VALUE = 1", "VALUE = 2"))
    git(
        tree,
        "commit",
        "--quiet",
        "-am",
        "Set VALUE to 2\n\nKind: bugfix\nName: value\nWhy: test\nSwitch: always on\nUpstream: none\n",
    )
    (tree / "fake" / "extra.py").write_text("EXTRA = True\n")
    other = tree / "fake" / "other.py"
    other.write_text(other.read_text().replace("other 25", "other 25 (ours)"))
    git(tree, "add", "--all", ".")
    git(
        tree,
        "commit",
        "--quiet",
        "-m",
        "Add extra\n\nKind: feature\nName: extra\nWhy: test\nSwitch: FAKE_EXTRA=1\nUpstream: none\n",
    )
    cli = [sys.executable, "-m", "npu_rl.patches"]
    common = ["--sources", str(sources), "--patches", str(patches), "--lock", str(lock)]
    _run([*cli, "export", "fake", *common], env)
    _run([*cli, "--revert", "--force", "--only", "fake", *common], env)
    _run([*cli, "--only", "fake", *common], env)
    assert sorted(p.name for p in (patches / "fake").glob("*.patch")) == [P1, P2]
    return {"env": env, "lock": lock, "patches": patches, "sources": sources, "cli": cli, "common": common, **index}


KILL = "NPU_RL_TEST_KILL_AT"


def bump(project, version, *extra, kill=None, check=False):
    env = dict(project["env"])
    if kill:
        env[KILL] = kill
    return _run([*project["cli"], "bump", "fake", version, *extra, *project["common"]], env, check=check)


def snapshot(project):
    """Everything that makes up the pin: lock and README bytes, series files, tree hash and identity."""
    t = Tree(project["sources"] / "fake")
    series = {p.name: p.read_bytes() for p in sorted((project["patches"] / "fake").iterdir())}
    return (
        project["lock"].read_bytes(),
        (project["lock"].parent / "README.md").read_bytes(),
        series,
        t.worktree_hash(),
        t.identity(),
    )


def check_cmd(project):
    return _run([*project["cli"], "--check", "--only", "fake", *project["common"]], project["env"], check=False)


def test_clean_bump_then_second_run_is_a_noop(project, tmp_path):
    import tarfile

    old_p1 = snapshot(project)[2][P1]
    with tarfile.open(project["files"] / "fake-1.1.tar.gz") as tf:
        tf.extractall(tmp_path / "x", filter="data")
    plain = _run(["git", "apply", "--check", "-"], check=False, cwd=tmp_path / "x" / "fake-1.1", input=old_p1.decode())
    assert plain.returncode != 0, "1.1 must need the three-way merge: the old 0001 must not apply as it is"
    r = bump(project, "1.1")
    assert r.returncode == 0, r.stderr + r.stdout
    lock = load_lock(project["lock"])
    fake = lock.get("fake")
    sha = hashlib.sha256((project["files"] / "fake-1.1.tar.gz").read_bytes()).hexdigest()
    assert (fake.version, fake.ref, fake.commit) == ("1.1", "v1.1", project["commits"]["1.1"])
    assert fake.pypi.filename == "fake-1.1.tar.gz" and fake.pypi.sha256 == sha
    assert fake.note.startswith("Why we pin fake 1.0.\nBumped from 1.0 on ")
    text = project["lock"].read_text()
    assert text.startswith(LOCK_HEAD) and text.endswith(OTHER)
    assert lock.get("other").version == "9.9"
    tree = Tree(project["sources"] / "fake")
    assert tree.identity() == fake.identity and tree.head() == tree.baseline_commit()
    # The tree was applied before, so it is applied after: the new series' full result.
    assert (tree.path / "fake" / "extra.py").read_text() == "EXTRA = True\n"
    core = (tree.path / "fake" / "core.py").read_text()
    assert "VALUE = 2" in core and "line 8, reworded upstream" in core
    assert "already applied 2 patch(es)" in check_cmd(project).stdout
    # Numbers kept; 0001 now carries the new context line (the old one did not apply by itself).
    series = {p.name: p.read_text() for p in (project["patches"] / "fake").glob("*.patch")}
    assert sorted(series) == [P1, P2]
    assert "line 8, reworded upstream" in series[P1] and "reworded" not in old_p1.decode()
    readme = (project["lock"].parent / "README.md").read_text()
    assert "| fake | 1.1 | `v1.1` |" in readme and "stale" not in readme
    assert not list((project["sources"] / ".bump").glob("fake-*"))
    after = snapshot(project)
    again = bump(project, "1.1")
    assert again.returncode == 0 and "nothing to do" in again.stdout
    now = snapshot(project)
    assert now == after, Tree(project["sources"] / "fake").changed_files(after[3], now[3])


def test_a_conflict_stops_names_the_patch_and_keeps_the_old_pin(project):
    before = snapshot(project)
    r = bump(project, "1.2")
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"{P1} conflicts with fake 1.2" in r.stderr
    assert "fake/core.py: conflict markers at line(s) " in r.stderr
    assert "patch failed: fake/core.py:" in r.stderr  # git apply names the hunk that no longer fits
    assert snapshot(project) == before
    assert "already applied 2 patch(es)" in check_cmd(project).stdout
    status = _run([*project["cli"], "--status", *project["common"]], project["env"], check=False)
    assert status.returncode == 0 and "bump: fake 1.0 -> 1.2 staged in" in status.stdout
    assert f"stopped at a conflict in {P1}" in status.stdout
    # Running it again before resolving: refused, still nothing changed.
    again = bump(project, "1.2")
    assert again.returncode == 3 and "a cherry-pick is in progress" in again.stderr
    assert snapshot(project) == before
    # The maintainer resolves in the staged tree with git, then runs the same command again.
    stage = project["sources"] / ".bump" / "fake-1.2" / "tree" / "fake"
    core = stage / "fake" / "core.py"
    core.write_text(_core("1.2").replace("VALUE = 3", "VALUE = 2"))
    git(stage, "add", "fake/core.py")
    git(stage, "-c", "core.editor=true", "cherry-pick", "--continue", env={"GIT_EDITOR": "true"})
    done = bump(project, "1.2")
    assert done.returncode == 0, done.stdout + done.stderr
    fake = load_lock(project["lock"]).get("fake")
    assert fake.version == "1.2" and f"refreshed by hand: {P1}" in fake.note.replace("\n", " ")
    assert "already applied 2 patch(es)" in check_cmd(project).stdout


def test_a_patch_upstream_contains_is_proposed_for_dropping(project):
    before = snapshot(project)
    r = bump(project, "1.3")
    assert r.returncode == 6, r.stdout + r.stderr
    assert "upstream already contains these patches" in r.stderr and P1 in r.stderr
    assert snapshot(project) == before
    wrong = bump(project, "1.3", "--drop", "0009-fake-feature-ghost.patch")
    assert wrong.returncode == 2 and "not a patch of the fake series" in wrong.stderr
    assert f"Confirm with: bash apply_all_patches.sh bump fake 1.3 --drop {P1}" in r.stderr
    done = bump(project, "1.3", "--drop", P1)
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.name for p in (project["patches"] / "fake").glob("*.patch")) == [P2]  # number kept
    fake = load_lock(project["lock"]).get("fake")
    assert f"dropped (upstream contains them): {P1}" in fake.note.replace("\n", " ")
    assert "already applied 1 patch(es)" in check_cmd(project).stdout


BEFORE_SWITCH = ("after-resolve", "after-baseline", "mid-pick", "during-replay", "in-prepare")
DURING_SWITCH = ("after-journal", "after-patches", "between-trees", "after-lock")


@pytest.mark.parametrize("point", BEFORE_SWITCH + DURING_SWITCH)
def test_an_interrupted_bump_keeps_the_old_pin_or_is_finished_by_the_next_run(project, point):
    before = snapshot(project)
    r = bump(project, "1.1", kill=point)
    assert r.returncode == -9, r.stdout + r.stderr  # SIGKILL: no handler, no cleanup ran
    if point in BEFORE_SWITCH:
        assert snapshot(project) == before
        assert "already applied 2 patch(es)" in check_cmd(project).stdout
    else:
        refused = check_cmd(project)
        assert refused.returncode == 3 and "bump fake 1.1" in refused.stderr
    done = bump(project, "1.1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert load_lock(project["lock"]).get("fake").version == "1.1"
    assert "already applied 2 patch(es)" in check_cmd(project).stdout
    assert Tree(project["sources"] / "fake").identity() == load_lock(project["lock"]).get("fake").identity
    assert "nothing to do" in bump(project, "1.1").stdout


def test_a_second_bump_at_the_same_time_is_refused(project):
    import fcntl

    lockfile = project["sources"] / ".bump" / ".fake.lock"
    lockfile.parent.mkdir(parents=True, exist_ok=True)
    with open(lockfile, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        fh.write("4242")
        fh.flush()
        r = bump(project, "1.1")
    assert r.returncode == 3 and "another bump of fake is running (pid 4242)" in r.stderr


def test_unresolvable_commit_needs_a_decision(project, tmp_path):
    before = snapshot(project)
    gone = ["--git-url", str(tmp_path / "no-such-repo")]
    r = bump(project, "1.1", *gone)
    assert r.returncode == 1 and "--no-commit" in r.stderr and "--git-url" in r.stderr
    assert snapshot(project) == before
    shutil.rmtree(project["sources"] / ".bump")
    ok = bump(project, "1.1", *gone, "--no-commit")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    fake = load_lock(project["lock"]).get("fake")
    assert fake.commit == "" and fake.identity.startswith("fake 1.1 sha256:")
    assert "commit not resolved (" in fake.note.replace("\n", " ") and "unreachable" in fake.note


def test_a_git_only_upstream_is_bumped_from_its_repository(project):
    # Drop the index archive from the lock: the tree then comes from git at the resolved commit.
    text = project["lock"].read_text()
    start = text.index("[upstream.pypi]")
    project["lock"].write_text(text[:start] + text[text.index("\n[[upstream]]", start) + 1 :])
    shutil.rmtree(project["sources"] / "fake")
    env = project["env"]
    _run(
        [
            sys.executable,
            "-m",
            "npu_rl.sources",
            "--lock",
            str(project["lock"]),
            "--dest",
            str(project["sources"]),
            "--only",
            "fake",
        ],
        env,
    )
    _run([*project["cli"], "--only", "fake", *project["common"]], env)
    r = bump(project, "1.1")
    assert r.returncode == 0, r.stdout + r.stderr
    fake = load_lock(project["lock"]).get("fake")
    assert fake.pypi is None and fake.commit == project["commits"]["1.1"]
    assert Tree(project["sources"] / "fake").identity() == fake.identity
    assert "already applied 2 patch(es)" in check_cmd(project).stdout


def test_bad_requests_are_refused_before_anything_is_staged(project):
    before = snapshot(project)
    for args, message in (
        (["v1.1"], "write '1.1'"),
        (["latest"], "is not a PEP 440 version"),
        (["0.9"], "older than the pinned 1.0; pass --downgrade"),
        (["1.1", "--commit", "abc123"], "must be a full 40-hex-digit SHA"),
        (["1.1", "--drop", "0042-fake-feature-nope.patch"], "not a patch of the fake series"),
        (["9.9"], "does not list fake-9.9.tar.gz"),  # the index is asked first, before any git host
    ):
        r = _run([*project["cli"], "bump", "fake", *args, *project["common"]], project["env"], check=False)
        assert r.returncode in (1, 2) and message in r.stderr, (args, r.stderr)
        assert not list((project["sources"] / ".bump").glob("fake-*")), args  # nothing left to block the next run
    assert snapshot(project) == before
    assert bump(project, "1.0.0").returncode == 0  # the pinned version spelled another way: a no-op
    assert snapshot(project) == before
    unknown = _run([*project["cli"], "bump", "nosuch", "1.0", *project["common"]], project["env"], check=False)
    assert unknown.returncode == 2 and not (project["sources"] / ".bump" / ".nosuch.lock").exists()
    assert "nothing to abort" in bump(project, "1.1", "--abort").stdout
