"""download_sources.sh / npu_rl.sources with real archives served by a local package index.

The index is a PEP 503 page on 127.0.0.1 (PIP_INDEX_URL points at it, as for a user's mirror);
the files it serves are the real, verified upstream archives, or deliberately damaged copies.
"""

import dataclasses
import os
import subprocess
from pathlib import Path

import pytest

from npu_rl import REPO_ROOT
from npu_rl.errors import DigestError, SourceUnreachable, TreeStateError
from npu_rl.gittree import Tree, git
from npu_rl.lock import load_lock
from npu_rl.sources import Downloader, build_from_git, sha256_of
from npu_rl.sources import main as sources_main


@pytest.fixture
def env(tmp_path, monkeypatch, local_index):
    cache = tmp_path / "cache"
    monkeypatch.setenv("NPU_RL_CACHE", str(cache))
    monkeypatch.setenv("PIP_INDEX_URL", local_index.url)
    return cache


def download(*args, dest):
    return sources_main(["--only", *args, "--dest", str(dest)])


def file_requests(index):
    return [r for r in index.requests if r.startswith("/files/")]


def test_download_twice_second_run_downloads_nothing(env, tmp_path, local_index, archive, lock, capsys):
    for name in ("mbridge", "verl"):
        local_index.add(lock.get(name).pypi.project, archive(name))
    dest = tmp_path / "sources"
    assert download("mbridge", "verl", dest=dest) == 0
    out = capsys.readouterr().out
    assert out.count("downloaded, unpacked") == 2
    assert len(file_requests(local_index)) == 2
    for name in ("mbridge", "verl"):
        tree = Tree(dest / name)
        assert tree.identity() == lock.get(name).identity
        assert tree.worktree_hash() == tree.baseline_tree()
    served = len(local_index.requests)
    assert download("mbridge", "verl", dest=dest) == 0
    out = capsys.readouterr().out
    assert out.count("up to date") == 2 and "downloaded" not in out
    assert len(local_index.requests) == served  # not even the index page was read
    # a new destination from the warm cache: unpacked, still nothing fetched
    assert download("mbridge", dest=tmp_path / "other") == 0
    assert "cached, unpacked" in capsys.readouterr().out
    assert len(local_index.requests) == served


def test_corrupted_archive_is_refused_and_removed(env, tmp_path, local_index, archive, lock, capsys):
    up = lock.get("mbridge")
    bad = tmp_path / "bad.tar.gz"
    data = bytearray(archive("mbridge").read_bytes())
    data[len(data) // 2] ^= 0xFF
    bad.write_bytes(bytes(data))
    local_index.add(up.pypi.project, bad, served_name=up.pypi.filename)
    dest = tmp_path / "sources"
    assert download("mbridge", dest=dest) == 1
    err = capsys.readouterr().err
    assert up.pypi.sha256 in err and "deleted" in err and local_index.url in err
    # neither the file nor a .part is kept (the per-archive lock file stays: unlinking a flock file
    # on release would let a waiter and a newcomer hold two different locks)
    assert not [p.name for p in (env / "archives").iterdir() if not p.name.endswith(".lock")]
    assert not (dest / "mbridge").exists()


def test_truncated_cached_archive_is_fetched_again(env, tmp_path, local_index, archive, lock, capsys):
    up = lock.get("mbridge")
    local_index.add(up.pypi.project, archive("mbridge"))
    (env / "archives").mkdir(parents=True)
    full = archive("mbridge").read_bytes()
    (env / "archives" / up.pypi.filename).write_bytes(full[: len(full) // 3])
    assert download("mbridge", dest=tmp_path / "sources") == 0
    captured = capsys.readouterr()
    assert "the cached copy was damaged, replaced" in captured.err and "re-downloaded, unpacked" in captured.out
    assert sha256_of(env / "archives" / up.pypi.filename) == up.pypi.sha256


def _one_digit_off(up):
    """``up`` with one hex digit of its locked sha256 changed (a typo in sources.lock)."""
    wrong = up.pypi.sha256[:-1] + ("0" if up.pypi.sha256[-1] != "0" else "1")
    return dataclasses.replace(up, pypi=dataclasses.replace(up.pypi, sha256=wrong))


@pytest.mark.parametrize("publish", [True, False], ids=["index-publishes-sha256", "fresh-download"])
def test_a_typo_in_the_lock_blames_the_lock_and_keeps_the_valid_cached_archive(
    env, tmp_path, local_index, archive, lock, publish
):
    """Found by a user: one wrong hex digit in sources.lock made the tool call the valid cached archive
    "truncated or corrupt", blame the mirror and delete the archive (on an air-gapped cluster the only
    copy). When the cache and the index agree, the lock is the suspect and nothing is deleted."""
    up = lock.get("mbridge")
    local_index.add(up.pypi.project, archive("mbridge"), publish_sha256=publish)
    cached = env / "archives" / up.pypi.filename
    cached.parent.mkdir(parents=True)
    cached.write_bytes(archive("mbridge").read_bytes())
    before = cached.stat().st_mtime_ns
    with pytest.raises(DigestError) as err:
        Downloader(env, log=lambda m: None).fetch(_one_digit_off(up))
    msg = str(err.value)
    assert "sources.lock is the likely culprit" in msg and "Nothing was deleted" in msg
    assert ("the index's published sha256" if publish else "a fresh download from") in msg
    assert "truncated" not in msg and "fix the mirror" not in msg
    assert cached.stat().st_mtime_ns == before and sha256_of(cached) == up.pypi.sha256
    assert not [p.name for p in cached.parent.iterdir() if p.name.endswith(".part")]
    assert len(file_requests(local_index)) == (0 if publish else 1)  # the published digest is enough


def test_a_tree_made_from_another_archive_digest_is_never_up_to_date(env, tmp_path, local_index, archive, lock):
    """Issue 38: a tree records the sha256 of the archive it was unpacked from; once sources.lock pins
    another digest for that archive (here one wrong hex digit), the tree is not "up to date" even at
    the same commit, and the message points at the lock."""
    from npu_rl.sources import process, tree_state

    up = lock.get("mbridge")
    local_index.add(up.pypi.project, archive("mbridge"))
    dest = tmp_path / "sources"
    dest.mkdir()
    downloader = Downloader(env, log=lambda m: None)
    assert process(up, "pypi", dest, downloader, force=False).state.endswith("unpacked")
    assert tree_state(up, dest) == "ok"
    typo = _one_digit_off(up)
    state = tree_state(typo, dest)
    assert state.startswith(f"unpacked from {up.pypi.filename} with sha256 {up.pypi.sha256}, but sources.lock pins")
    assert typo.pypi.sha256 in state and "typo in sources.lock" in state
    with pytest.raises(TreeStateError, match="typo in sources.lock.*--force"):
        process(typo, "pypi", dest, downloader, force=False)
    with pytest.raises(DigestError, match="sources.lock is the likely culprit"):  # --force: the lock, still
        process(typo, "pypi", dest, downloader, force=True)
    assert tree_state(up, dest) == "ok"  # the valid tree was not replaced


def test_a_cache_that_disagrees_with_the_lock_is_kept_when_the_index_is_unreachable(env, archive, lock, monkeypatch):
    up = lock.get("mbridge")
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple/")  # nothing listens on the discard port
    cached = env / "archives" / up.pypi.filename
    cached.parent.mkdir(parents=True)
    cached.write_bytes(archive("mbridge").read_bytes())
    with pytest.raises(SourceUnreachable, match="was kept.*which one is wrong is unknown"):
        Downloader(env, log=lambda m: None).fetch(_one_digit_off(up))
    assert sha256_of(cached) == up.pypi.sha256


def test_a_mirror_serving_another_file_keeps_the_cached_archive(env, tmp_path, local_index, archive, lock):
    """Three different digests (cache, index, lock): the download is deleted, the cached file kept."""
    up = lock.get("mbridge")
    bad = tmp_path / "bad.tar.gz"
    data = bytearray(archive("mbridge").read_bytes())
    data[len(data) // 2] ^= 0xFF
    bad.write_bytes(bytes(data))
    local_index.add(up.pypi.project, bad, served_name=up.pypi.filename)
    cached = env / "archives" / up.pypi.filename
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"an older, different file")
    with pytest.raises(DigestError, match="The download was deleted. The cached .* was kept"):
        Downloader(env, log=lambda m: None).fetch(up)
    assert cached.read_bytes() == b"an older, different file"


@pytest.mark.parametrize("git_allowed", [True, False])
def test_the_mirror_message_suggests_git_only_where_allowed(env, tmp_path, local_index, archive, lock, git_allowed):
    """Issue 38: under --no-git (or for an upstream with no pinned commit) "use --from git" is no way out."""
    import dataclasses

    up = lock.get("mbridge")
    up = dataclasses.replace(up, commit=up.commit or "0" * 40)  # pinned to a commit: git could serve it
    bad = tmp_path / "bad.tar.gz"
    data = bytearray(archive("mbridge").read_bytes())
    data[len(data) // 2] ^= 0xFF
    bad.write_bytes(bytes(data))
    local_index.add(up.pypi.project, bad, served_name=up.pypi.filename)
    with pytest.raises(DigestError) as e:
        Downloader(env, log=lambda m: None, git_allowed=git_allowed).fetch(up)
    assert ("--from git" in str(e.value)) is git_allowed
    assert "fix the mirror" in str(e.value)


def test_interrupted_download_part_file_is_discarded(env, tmp_path, local_index, archive, lock, capsys):
    up = lock.get("mbridge")
    local_index.add(up.pypi.project, archive("mbridge"))
    (env / "archives").mkdir(parents=True)
    (env / "archives" / (up.pypi.filename + ".part")).write_bytes(b"half")
    path, state = Downloader(env, log=print).fetch(up)
    assert state == "re-downloaded" and sha256_of(path) == up.pypi.sha256
    assert not (env / "archives" / (up.pypi.filename + ".part")).exists()
    assert "interrupted download" in capsys.readouterr().out


def test_tree_at_other_baseline_is_refused_then_force_replaces(env, tmp_path, local_index, archive, lock, capsys):
    up = lock.get("mbridge")
    local_index.add(up.pypi.project, archive("mbridge"))
    dest = tmp_path / "sources"
    (dest / "mbridge").mkdir(parents=True)
    (dest / "mbridge" / "mine.txt").write_text("not an upstream tree\n")
    assert download("mbridge", dest=dest) == 3
    assert "--force" in capsys.readouterr().err
    assert (dest / "mbridge" / "mine.txt").exists()  # untouched
    assert sources_main(["--only", "mbridge", "--dest", str(dest), "--force"]) == 0
    assert Tree(dest / "mbridge").identity() == up.identity
    assert not (dest / "mbridge" / "mine.txt").exists()


# --- git sources ----------------------------------------------------------------------------------
@pytest.fixture
def git_upstream(tmp_path):
    """A real git repository standing in for an upstream host (file path URL), with a submodule-free
    tree and a commit, and a lock entry pinning it."""
    repo = tmp_path / "remote"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "__init__.py").write_text("VALUE = 1\n")
    (repo / "README.md").write_text("demo\n")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "one")
    git(repo, "config", "uploadpack.allowAnySHA1InWant", "true")
    commit = git(repo, "rev-parse", "HEAD")
    lock_file = tmp_path / "sources.lock"
    lock_file.write_text(
        f'schema = 1\n[[upstream]]\nname = "demo"\nversion = "1.0"\ngit = "file://{repo}"\nref = "main"\n'
        f'commit = "{commit}"\n'
    )
    return load_lock(lock_file).get("demo"), lock_file


def test_git_source_builds_verified_tree(tmp_path, git_upstream):
    up, _ = git_upstream
    dest = tmp_path / "sources"
    dest.mkdir()
    build_from_git(up, dest, force=False)
    tree = Tree(dest / "demo")
    assert tree.identity() == up.identity
    assert (dest / "demo" / "pkg" / "__init__.py").read_text() == "VALUE = 1\n"
    assert tree.worktree_hash() == tree.baseline_tree()


def test_git_source_with_unknown_commit_is_refused(tmp_path, git_upstream):
    up, _ = git_upstream
    dest = tmp_path / "sources"
    dest.mkdir()
    with pytest.raises(DigestError, match="has no commit"):
        build_from_git(dataclasses.replace(up, commit="1" * 40), dest, force=False)
    assert list(dest.iterdir()) == []  # nothing half-built left behind


def test_unreachable_git_host_fails_unless_optional_or_no_git(tmp_path, git_upstream, capsys):
    up, lock_file = git_upstream
    text = lock_file.read_text().replace(up.git, f"file://{tmp_path}/does-not-exist")
    lock_file.write_text(text)
    dest = tmp_path / "sources"
    # a required upstream that cannot be fetched is a failure, named, not a SKIPPED line and exit 0
    assert sources_main(["--dest", str(dest), "--lock", str(lock_file)]) == 1
    captured = capsys.readouterr()
    assert "SKIPPED" not in captured.out and "error: demo: cannot reach" in captured.err
    # the user said not to contact git hosts: skipped, as asked
    assert sources_main(["--dest", str(dest), "--lock", str(lock_file), "--no-git"]) == 0
    assert "SKIPPED demo: git sources disabled by --no-git" in capsys.readouterr().out
    # marked optional in the lock (the NPU-only MindSpeed): skipped with the reason
    lock_file.write_text(text.replace('ref = "main"', 'ref = "main"\noptional = true'))
    assert sources_main(["--dest", str(dest), "--lock", str(lock_file)]) == 0
    out = capsys.readouterr().out
    assert "SKIPPED demo: cannot reach" in out and "optional in sources.lock" in out
    # ... but never when asked for by name
    assert sources_main(["--dest", str(dest), "--lock", str(lock_file), "--only", "demo"]) == 1
    with pytest.raises(SourceUnreachable):
        build_from_git(load_lock(lock_file).get("demo"), dest, force=False)
    assert sorted(p.name for p in dest.iterdir()) == [".npu-rl.lock"]  # nothing half-built left behind


def test_optional_is_only_for_git_only_upstreams(tmp_path, lock):
    from npu_rl.errors import LockError

    text = (REPO_ROOT / "sources.lock").read_text().replace('name = "verl"\n', 'name = "verl"\noptional = true\n')
    bad = tmp_path / "sources.lock"
    bad.write_text(text)
    with pytest.raises(LockError, match="optional = true is for git-only upstreams"):
        load_lock(bad)
    assert lock.get("mindspeed").optional and not lock.get("verl").optional


def test_download_script_end_to_end_from_the_index(env, tmp_path, local_index, archive, lock):
    # The bash entry point, through pip's configured index (PIP_INDEX_URL), from another cwd.
    up = lock.get("mbridge")
    local_index.add(up.pypi.project, archive("mbridge"))
    from tests.conftest import run_script

    dest = tmp_path / "sources"
    r = run_script(
        "download_sources.sh",
        "--only",
        "mbridge",
        "--dest",
        str(dest),
        cwd=tmp_path,
        env={"NPU_RL_CACHE": str(env), "PIP_INDEX_URL": local_index.url},
    )
    assert r.returncode == 0, r.stderr
    assert "mbridge" in r.stdout and "downloaded, unpacked" in r.stdout
    assert subprocess.run(
        ["git", "-C", str(dest / "mbridge"), "tag"],
        capture_output=True,
        text=True,
        env={**os.environ, "GIT_CONFIG_NOSYSTEM": "1"},
    ).stdout.split() == ["upstream"]
    assert Path(dest / "mbridge" / "mbridge" / "__init__.py").exists()
