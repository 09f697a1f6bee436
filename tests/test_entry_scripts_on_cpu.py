"""The README's entry scripts work when reached through a symlink (issue 38: ``~/bin/apply_all_patches.sh``
failed with a raw bash error, because each found internal/common.sh next to the link, not the script)."""

from __future__ import annotations

import subprocess

import pytest

from npu_rl import REPO_ROOT

# Each entry script and what its --help says first (all answer --help without touching anything).
ENTRY_SCRIPTS = {
    "download_sources.sh": "usage:",
    "apply_all_patches.sh": "usage:",
    "install_stack.sh": "install_stack.sh",
    "ray_start_npu.sh": "usage: ray_start_npu.sh",
}


@pytest.mark.parametrize("name", sorted(ENTRY_SCRIPTS))
def test_an_entry_script_runs_through_a_symlink_from_anywhere(tmp_path, name):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / name).symlink_to(REPO_ROOT / name)
    elsewhere = tmp_path / "work"
    elsewhere.mkdir()
    for cmd in ([str(bindir / name), "--help"], ["bash", str(bindir / name), "--help"]):
        r = subprocess.run(cmd, cwd=elsewhere, capture_output=True, text=True, timeout=120, check=False)
        assert r.returncode == 0, r.stderr[-2000:]
        assert ENTRY_SCRIPTS[name] in r.stdout + r.stderr
        assert "No such file or directory" not in r.stderr, r.stderr
