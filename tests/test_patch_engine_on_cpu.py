"""The patch engine against the real pinned trees: all-or-nothing, idempotent, refuses bad trees.

Nothing here mocks git or the archives; the trees are the verified upstream archives unpacked.
"""

import shutil
from pathlib import Path

import pytest

from npu_rl.errors import ConflictError, TreeStateError
from npu_rl.gittree import PatchApplyError, Tree, git
from npu_rl.patches import engine, export
from npu_rl.patches.cli import main as patches_main
from npu_rl.patches.series import load_series
from tests.conftest import run_script

# Copies the pinned trees (~263 MB) per test: left out of --quick.
pytestmark = pytest.mark.slow

HCCL = "verl/checkpoint_engine/hccl_checkpoint_engine.py"
MEGATRON = "verl/workers/engine/megatron/transformer_impl.py"  # patch 0002 (random init) hooks it


def tree_hashes(sources: Path) -> dict[str, str]:
    return {p.name: Tree(p).worktree_hash() for p in sorted(sources.iterdir()) if (p / ".git").is_dir()}


def baseline_hashes(sources: Path) -> dict[str, str]:
    return {p.name: Tree(p).baseline_tree() for p in sorted(sources.iterdir()) if (p / ".git").is_dir()}


def cli(*args, sources, patches=None):
    extra = ["--sources", str(sources)] + (["--patches", str(patches)] if patches else [])
    return patches_main([*args, *extra])


def test_every_patch_applies_and_twice_is_identical(sources, patched_upstreams, capsys):
    assert patched_upstreams, "the series has at least the verl backport"
    assert cli("--check", sources=sources) == 0
    assert tree_hashes(sources) == baseline_hashes(sources)  # --check changed nothing
    assert cli(sources=sources) == 0
    first = tree_hashes(sources)
    for name in patched_upstreams:
        assert first[name] != Tree(sources / name).baseline_tree()
    assert "random_init_enabled()" in (sources / "verl" / MEGATRON).read_text()  # patch 0002's hook
    capsys.readouterr()
    assert cli(sources=sources) == 0
    assert "already applied" in capsys.readouterr().out
    assert tree_hashes(sources) == first
    assert cli("--check", sources=sources) == 0


def test_conflicting_patch_changes_nothing_and_names_patch_and_file(sources, series_copy, capsys):
    before = tree_hashes(sources)
    bad = series_copy / "verl" / "0999-verl-bugfix-conflict.patch"
    bad.write_text(
        "Subject: conflicting change\nKind: bugfix\nWhy: test\nSwitch: none\nUpstream: none\n---\n"
        f"diff --git a/{HCCL} b/{HCCL}\n--- a/{HCCL}\n+++ b/{HCCL}\n@@ -14,3 +14,3 @@\n"
        " import asyncio\n-import logging\n+import logging  # changed\n import os\n"
    )
    with open(series_copy / "verl" / "series", "a") as fh:
        fh.write(bad.name + "\n")
    assert cli(sources=sources, patches=series_copy) == 1
    err = capsys.readouterr().err
    assert "0999-verl-bugfix-conflict.patch" in err and HCCL in err
    assert tree_hashes(sources) == before == baseline_hashes(sources)
    for name in before:
        assert git(sources / name, "status", "--porcelain") == ""


def test_failure_while_applying_rolls_back_trees_already_patched(sources, series_copy, monkeypatch, capsys):
    # Two upstreams with patches: verl (real) and mbridge (a real, valid patch). The second tree's
    # working-tree apply fails after the first tree was really patched: both must end at baseline.
    d = series_copy / "mbridge"
    shutil.rmtree(d, ignore_errors=True)  # replace mbridge's own series (if any) by the marker patch
    d.mkdir()
    mb = sources / "mbridge"
    (mb / "mbridge" / "__init__.py").write_text((mb / "mbridge" / "__init__.py").read_text() + "# npu_rl test\n")
    diff = git(mb, "diff", strip=False)
    git(mb, "checkout", "--", ".")
    (d / "0001-mbridge-feature-marker.patch").write_text(
        "Subject: marker\nKind: feature\nWhy: test\nSwitch: none\nUpstream: none\n---\n" + diff
    )
    (d / "series").write_text("0001-mbridge-feature-marker.patch\n")
    real_apply = Tree.apply

    def failing_apply(self, label, data):
        if self.path.name == "mbridge":
            raise PatchApplyError(label, "error: simulated failure while writing the working tree")
        return real_apply(self, label, data)

    monkeypatch.setattr(Tree, "apply", failing_apply)
    assert cli(sources=sources, patches=series_copy) == 1
    captured = capsys.readouterr()
    assert "rolled back" in captured.out + captured.err
    assert tree_hashes(sources) == baseline_hashes(sources)
    monkeypatch.setattr(Tree, "apply", real_apply)
    assert cli(sources=sources, patches=series_copy) == 0  # and the same series then applies cleanly
    assert "# npu_rl test" in (mb / "mbridge" / "__init__.py").read_text()


def test_interrupt_during_apply_rolls_back(sources, monkeypatch):
    real_apply = Tree.apply

    def interrupted(self, label, data):
        real_apply(self, label, data)
        raise KeyboardInterrupt

    monkeypatch.setattr(Tree, "apply", interrupted)
    assert cli(sources=sources) == 130
    assert tree_hashes(sources) == baseline_hashes(sources)


def test_hand_modified_tree_is_refused_untouched_and_revert_restores(sources, capsys):
    target = sources / "verl" / HCCL
    target.write_text(target.read_text() + "\n# local experiment\n")
    (sources / "verl" / "scratch.txt").write_text("notes\n")
    before = tree_hashes(sources)
    assert cli(sources=sources) == 3
    err = capsys.readouterr().err
    assert HCCL in err and "scratch.txt" in err and "modified" in err
    assert tree_hashes(sources) == before
    assert "# local experiment" in target.read_text()
    assert cli("--revert", sources=sources) == 0
    out = capsys.readouterr().out
    assert tree_hashes(sources) == baseline_hashes(sources)
    backups = list((sources / ".backup").glob("verl-*.diff"))
    assert len(backups) == 1 and "# local experiment" in backups[0].read_text() and "verl" in out
    # the backup restores the local changes with plain git apply
    git(sources / "verl", "apply", str(backups[0]))
    assert "# local experiment" in target.read_text()


def test_a_hand_edit_on_the_applied_series_is_named_file_by_file_and_comes_back_on_top_of_it(sources, capsys):
    """Issue 38: a hand edit of a file the series patches, on the applied tree, was reported as "all the
    series' files (cut at 20)", and --revert saved a diff from the baseline that no longer applied once
    the series was back. Now the edited files alone are named, and the saved diff applies on the series."""
    patched = "verl/trainer/ppo/v1/trainer_base.py"
    assert cli(sources=sources) == 0
    capsys.readouterr()
    target = sources / "verl" / patched
    target.write_text(target.read_text() + "\n# my local experiment\n")
    (sources / "verl" / "notes.txt").write_text("notes\n")
    assert cli(sources=sources) == 3
    err = capsys.readouterr().err
    listed = [line.strip() for line in err.splitlines() if line.startswith("      ")]
    assert "differ from what the series produces" in err
    assert sorted(listed) == ["A notes.txt", f"M {patched}"], err
    assert cli("--revert", sources=sources) == 0
    out = capsys.readouterr().out
    assert tree_hashes(sources) == baseline_hashes(sources)
    assert "saved your changes to 2 file(s) (against what the series produces)" in out and patched in out
    (backup,) = (sources / ".backup").glob("verl-*.diff")
    assert cli(sources=sources) == 0  # the series again, then the hand edit on top of it
    git(sources / "verl", "apply", str(backup))
    assert target.read_text().endswith("# my local experiment\n") and (sources / "verl" / "notes.txt").exists()


def test_partial_series_is_refused(sources, one_patch_series, capsys):
    # a two-patch series where only the first is applied (an older checkout's series)
    series_copy = one_patch_series
    d = series_copy / "verl"
    assert cli(sources=sources, patches=series_copy) == 0  # applies the one-patch series
    first = load_series("verl", series_copy).patches[0]
    extra = d / f"{first.number + 1:04d}-verl-feature-second.patch"
    extra.write_text(
        "Subject: second\nKind: feature\nWhy: test\nSwitch: none\nUpstream: none\n---\n"
        "diff --git a/verl/npu_rl_marker.py b/verl/npu_rl_marker.py\nnew file mode 100644\n"
        "--- /dev/null\n+++ b/verl/npu_rl_marker.py\n@@ -0,0 +1 @@\n+MARKER = 1\n"
    )
    with open(d / "series", "a") as fh:
        fh.write(extra.name + "\n")
    before = tree_hashes(sources)
    assert cli(sources=sources, patches=series_copy) == 3
    assert "patches 1..1 of 2 applied" in capsys.readouterr().err
    assert tree_hashes(sources) == before
    assert cli("--revert", sources=sources, patches=series_copy) == 0
    assert cli(sources=sources, patches=series_copy) == 0
    assert (sources / "verl" / "verl" / "npu_rl_marker.py").read_text() == "MARKER = 1\n"
    assert cli("--revert", sources=sources, patches=series_copy) == 0
    assert not (sources / "verl" / "verl" / "npu_rl_marker.py").exists()
    assert tree_hashes(sources) == baseline_hashes(sources)


def test_crlf_patch_applies_to_the_same_tree(sources, tmp_path, series_copy):
    assert cli(sources=sources) == 0
    lf_result = tree_hashes(sources)
    assert cli("--revert", sources=sources) == 0
    for p in (series_copy / "verl").glob("*.patch"):
        p.write_bytes(p.read_bytes().replace(b"\n", b"\r\n"))
    assert b"\r\n" in next((series_copy / "verl").glob("*.patch")).read_bytes()
    assert cli(sources=sources, patches=series_copy) == 0
    assert tree_hashes(sources) == lf_result


@pytest.mark.parametrize("where", ["tmp", "inside-tree"])
def test_same_result_from_any_working_directory(sources, tmp_path, where):
    # Running from inside a tree's sub-folder is the classic trap where plain `git apply` skips files.
    cwd = tmp_path if where == "tmp" else sources / "verl" / "verl" / "utils"
    r = run_script("apply_all_patches.sh", "--sources", str(sources), cwd=cwd)
    assert r.returncode == 0, r.stderr
    assert "random_init_enabled()" in (sources / "verl" / MEGATRON).read_text()  # no file skipped
    r2 = run_script("apply_all_patches.sh", "--status", "--sources", str(sources), cwd=cwd)
    assert r2.returncode == 0, r2.stderr
    verl_row = next(line for line in r2.stdout.splitlines() if line.startswith("verl "))
    n = len(load_series("verl").patches)
    assert f"{n}/{n}" in verl_row and load_series("verl").digest in verl_row


def test_status_reports_each_upstream(sources, lock, capsys):
    assert cli("--status", sources=sources) == 0
    out = capsys.readouterr().out
    for name in lock.upstreams:
        assert any(line.split()[0] == name for line in out.splitlines()[1:]), name
    assert "not downloaded" in next(line for line in out.splitlines() if line.startswith("mindspeed"))
    n = len(load_series("verl").patches)
    assert f"0/{n}" in next(line for line in out.splitlines() if line.startswith("verl "))


def test_wrong_pin_is_refused(sources, lock):
    tree = sources / "verl"
    git(tree, "tag", "-d", "upstream")
    git(tree, "commit", "--allow-empty", "-q", "-m", "other\n\nNpu-Rl-Baseline: verl 0.8.0 " + "0" * 40)
    git(tree, "tag", "upstream")
    with pytest.raises(TreeStateError, match=f"sources.lock pins '{lock.get('verl').identity}'"):
        engine.apply(lock, sources)


def test_edit_then_export_round_trips_byte_for_byte(sources, lock, series_copy, capsys):
    up = lock.get("verl")
    n = export.edit(up, sources, series_copy)
    assert n == len(load_series("verl").patches)
    assert cli(sources=sources, patches=series_copy) == 3  # maintainer mode is refused by apply
    original = {p.name: p.read_bytes() for p in (series_copy / "verl").iterdir()}
    for p in (series_copy / "verl").glob("*.patch"):
        p.write_bytes(p.read_bytes().replace(b"\n---\n", b"\nDrop-when: junk to be overwritten\n---\n", 1))
    export.export(up, sources, series_copy)  # over the old series: its numbers are kept
    assert {p.name: p.read_bytes() for p in (series_copy / "verl").iterdir()} == original
    assert cli("--revert", sources=sources, patches=series_copy) == 3  # commits on top need --force
    assert cli("--revert", "--force", sources=sources, patches=series_copy) == 0
    assert tree_hashes(sources)["verl"] == Tree(sources / "verl").baseline_tree()


def test_missing_tree_is_refused(tmp_path, lock):
    with pytest.raises(TreeStateError, match="does not exist; run download_sources.sh"):
        engine.apply(lock, tmp_path)


def test_check_reports_conflict_without_touching(sources, lock, series_copy):
    first = load_series("verl").patches[0]
    (sources / "verl" / first.files[0]).write_text("replaced\n")
    up = lock.get("verl")  # pretend upstream moved under the pin: same identity, other content
    git(sources / "verl", "commit", "-qa", "-m", f"moved\n\nNpu-Rl-Baseline: {up.identity}\n")
    git(sources / "verl", "tag", "-f", "upstream")
    with pytest.raises(ConflictError, match=f"{first.name} does not apply"):
        engine.check(lock, sources, series_copy)


def test_usage_errors_exit_2(sources, capsys):
    assert cli("--only", "nosuch", sources=sources) == 2
    assert "no upstream named 'nosuch'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        cli("--force", sources=sources)
    assert exc.value.code == 2


def test_named_upstream_without_patches_says_so(sources, series_copy, capsys):
    shutil.rmtree(series_copy / "mbridge", ignore_errors=True)  # a small tree; the real series may patch it
    assert cli("--only", "mbridge", sources=sources, patches=series_copy) == 0
    out = capsys.readouterr().out
    assert "mbridge" in out and "no patches in the series" in out


def test_a_git_that_a_received_signal_killed_before_it_ran_is_run_again(tmp_path, monkeypatch):
    """A group signal can reach a git child between fork and its setsid, where it dies before exec
    (seen in CI: ``git write-tree`` exit -1 after SIGHUP during --revert). Such a git never ran, so
    gittree.git runs it once more; a git killed by a signal this process never received, or one that
    failed on its own, is not retried."""
    import signal as sig

    import git as gitpython

    from npu_rl import signals

    git(tmp_path, "init", "-q")
    real = gitpython.Git.execute
    calls, kill = [], []

    def execute(self, command, *a, **kw):
        calls.append(command[1])
        if kill:
            raise gitpython.GitCommandError(command, -kill.pop(), b"", b"")
        return real(self, command, *a, **kw)

    monkeypatch.setattr(gitpython.Git, "execute", execute)
    signals._reset_for_tests()
    kill.append(sig.SIGHUP)
    with pytest.raises(gitpython.GitCommandError):  # SIGHUP was never received here: a real failure
        git(tmp_path, "write-tree")
    assert calls == ["write-tree"]
    calls.clear()
    monkeypatch.setattr(signals._STATE, "received", [sig.SIGHUP])
    kill.append(sig.SIGHUP)
    assert len(git(tmp_path, "write-tree")) == 40  # the empty tree's id, from the second run
    assert calls == ["write-tree", "write-tree"]
    calls.clear()
    kill.append(sig.SIGTERM)  # killed by a signal we did not receive: not ours to retry
    with pytest.raises(gitpython.GitCommandError):
        git(tmp_path, "write-tree")
    assert calls == ["write-tree"]
    calls.clear()
    with pytest.raises(gitpython.GitCommandError):
        git(tmp_path, "no-such-command")  # git's own failure (exit 1): not retried
    assert calls == ["no-such-command"]
