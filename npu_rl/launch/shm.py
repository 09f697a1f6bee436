"""Shared-memory segments a run leaves in ``/dev/shm`` (issue 38): found and removed when Ray stops.

vLLM's ``MessageQueue`` ring buffers (``shm_broadcast.py``: 160-240 MiB each on the CPU recipes) are
``multiprocessing.shared_memory`` segments with Python's default names, ``psm_<8 hex>``. Their creator
unlinks them when it shuts down cleanly; a Ray node stopped at the end of a run kills the engine
processes first, so every run left a few behind (110 on this project's CI machine after a day), each
holding whatever pages were written until the machine reboots.

A segment is removed only when all of these hold, so nothing another process can still use goes:

- its name is ``psm_*`` and this user owns it (another user's segments are not ours to judge);
- it was created at or after the run started (an older one belongs to something else);
- it is at least :data:`MIN_AGE_S` old (a creator maps its segment right after creating it);
- no process of this user maps it (``/proc/<pid>/maps``); a segment is mode 0600, so no other user's
  process can have opened it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

SHM_DIR = Path("/dev/shm")
PREFIX = "psm_"
MIN_AGE_S = 10.0


def mapped_shm_names(proc: Path = Path("/proc")) -> set[str]:
    """Names (``psm_...``) of ``/dev/shm`` files mapped by any process whose maps this user can read."""
    names: set[str] = set()
    for pid_dir in proc.iterdir():
        if not pid_dir.name.isdigit():
            continue
        try:
            text = (pid_dir / "maps").read_text(errors="replace")
        except OSError:  # gone, or another user's process
            continue
        for line in text.splitlines():
            i = line.find("/dev/shm/")
            if i >= 0:
                names.add(line[i + len("/dev/shm/") :].split(" ", 1)[0])
    return names


def sweep(since: float, shm_dir: Path = SHM_DIR, proc: Path = Path("/proc"), now: float | None = None) -> list[Path]:
    """Remove the leaked segments of a run that started at ``since`` (epoch seconds); returns what was removed.

    See the module docstring for the rules. Errors removing one segment (already gone, a read-only
    mount) are skipped: this is clean-up after the run, never a reason to fail it.
    """
    now = time.time() if now is None else now
    uid = os.getuid()
    try:
        candidates = [p for p in shm_dir.iterdir() if p.name.startswith(PREFIX)]
    except OSError:
        return []
    old_enough = []
    for path in candidates:
        try:
            st = path.stat()
        except OSError:
            continue
        if st.st_uid == uid and st.st_ctime >= since and now - st.st_mtime >= MIN_AGE_S:
            old_enough.append(path)
    if not old_enough:
        return []
    in_use = mapped_shm_names(proc)
    removed = []
    for path in old_enough:
        if path.name in in_use:
            continue
        try:
            path.unlink()
        except OSError:
            continue
        removed.append(path)
    return removed
