"""The launcher's clean-up of leaked shared memory (npu_rl.launch.shm, issue 38): after Ray stops, the
``psm_*`` segments the run's killed processes left in /dev/shm go; anything mapped, older than the
run, too young or another user's stays."""

from __future__ import annotations

import os
from multiprocessing import shared_memory

from npu_rl.launch import shm

T0 = 1_000_000.0  # the run's start


def _segment(d, name, ctime):
    path = d / name
    path.write_bytes(b"\0" * 64)
    os.utime(path, (ctime, ctime))  # mtime; ctime is "now" (after T0) on a fresh file
    return path


def _proc(tmp_path, maps_by_pid):
    proc = tmp_path / "proc"
    for pid, maps in maps_by_pid.items():
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "maps").write_text(maps)
    (proc / "self").mkdir(parents=True, exist_ok=True)  # not a pid: skipped
    return proc


def test_only_unmapped_segments_of_the_run_are_removed(tmp_path):
    d = tmp_path / "shm"
    d.mkdir()
    leaked = _segment(d, "psm_0a1b2c3d", T0 + 5)
    mapped = _segment(d, "psm_99887766", T0 + 5)
    other_name = _segment(d, "vllm_weights_x", T0 + 5)  # not psm_*: not ours to judge
    proc = _proc(
        tmp_path,
        {
            4242: "7f00-7f10 rw-s 00000000 00:1a 123 /dev/shm/psm_99887766\n7f20-7f30 r-xp 0 08:01 9 /usr/lib/x.so\n",
            4243: "7f00-7f10 rw-s 00000000 00:1a 124 /dev/shm/psm_99887766 (deleted)\n",
        },
    )
    removed = shm.sweep(since=0, shm_dir=d, proc=proc, now=T0 + 60)
    assert removed == [leaked]
    assert not leaked.exists() and mapped.exists() and other_name.exists()


def test_the_runs_start_and_the_minimum_age_decide(tmp_path):
    d = tmp_path / "shm"
    d.mkdir()
    young = _segment(d, "psm_00000001", T0 + 55)
    before_run = _segment(d, "psm_00000002", T0 - 100)
    proc = _proc(tmp_path, {})
    # ctime (set by the file system, "now") is after any past 'since', so only 'since' in the future excludes
    assert shm.sweep(since=before_run.stat().st_ctime + 3600, shm_dir=d, proc=proc, now=T0 + 60) == []
    assert shm.sweep(since=0, shm_dir=d, proc=proc, now=T0 + 60) == [before_run]  # mtime T0-100: old enough
    assert young.exists()  # mtime 5 s before 'now': a creator may not have mapped it yet


def test_a_live_shared_memory_segment_is_seen_as_mapped():
    """The real /proc and a real segment of Python's multiprocessing.shared_memory (what vLLM uses)."""
    seg = shared_memory.SharedMemory(create=True, size=4096)
    try:
        assert seg.name.lstrip("/") in shm.mapped_shm_names()
    finally:
        seg.close()
        seg.unlink()


def test_a_missing_shm_folder_is_no_error(tmp_path):
    assert shm.sweep(since=0, shm_dir=tmp_path / "absent", proc=tmp_path) == []
