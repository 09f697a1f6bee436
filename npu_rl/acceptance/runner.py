"""Runs the plan through ``ray_start_npu.sh``, one run at a time, and leaves nothing running.

Each launcher runs in a session of its own with ``LOG_DIR=OUT/runs/<name>`` and a marker variable
(``NPU_RL_ACCEPTANCE_ID``) that every process it starts inherits: the recipe, ``ray start`` and so
Ray's raylet, workers and the vLLM servers and engine cores they spawn. The launcher stops its
recipe and Ray itself (its rules); after every run, and whatever ended it (success, failure, time
limit, Ctrl-C), this module looks for processes that still carry the marker, stops them (SIGTERM,
then SIGKILL) and records them in ``result.json``: a leftover is a bug the report shows.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from npu_rl import REPO_ROOT
from npu_rl.acceptance.plan import Run

MARKER = "NPU_RL_ACCEPTANCE_ID"
STOP_GRACE_S = 90.0  # the launcher's own grace for the recipe is 60 s (NPU_RL_STOP_GRACE), then Ray's stop


class Interrupted(BaseException):
    """SIGINT/SIGTERM/SIGHUP reached the suite; raised in the main thread so cleanup runs."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


@dataclass
class RunResult:
    """What one launcher invocation did (``runs/<name>/result.json``)."""

    name: str
    exit_code: int
    wall_s: float
    leftovers: list[str] = field(default_factory=list)
    timed_out: bool = False
    interrupted: int | None = None  # the signal that stopped the suite during this run

    def save(self, folder: Path) -> None:
        """Write ``folder/result.json``."""
        (folder / "result.json").write_text(json.dumps(self.__dict__, indent=2) + "\n")


def marked_processes(marker: str) -> list[psutil.Process]:
    """This user's live processes whose environment holds ``NPU_RL_ACCEPTANCE_ID=marker``."""
    me = os.getuid()
    found = []
    for p in psutil.process_iter(["pid", "uids", "status"]):
        try:
            if p.pid == os.getpid() or p.info["uids"].real != me or p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if p.environ().get(MARKER) == marker:
                found.append(p)
        except (psutil.Error, OSError):
            continue
    return found


def stop_leftovers(marker: str, log: Callable[[str], None], grace: float = 10.0) -> list[str]:
    """Stop every process that carries ``marker`` (SIGTERM, SIGKILL after ``grace`` seconds); returns
    ``"pid N: command"`` for each one found."""
    procs = marked_processes(marker)
    described = []
    for p in procs:
        try:
            described.append(f"pid {p.pid}: {' '.join(p.cmdline())[:200]}")
            p.terminate()
        except psutil.Error:
            continue
    if procs:
        log(f"stopping {len(procs)} process(es) the run left behind: " + "; ".join(described))
        _, alive = psutil.wait_procs(procs, timeout=grace)
        for p in alive:
            try:
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(alive, timeout=grace)
    return described


class Signals:
    """The first SIGINT/SIGTERM/SIGHUP raises :class:`Interrupted`; later ones are only reported."""

    def __init__(self, log: Callable[[str], None]):
        self.log = log
        self.got: int | None = None

    def __enter__(self):
        sigs = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        self.saved = {s: signal.signal(s, self._handle) for s in sigs}
        return self

    def _handle(self, signum, _frame):
        if self.got is None:
            self.got = signum
            raise Interrupted(signum)
        self.log(f"{signal.Signals(signum).name} again: still stopping the run")

    def __exit__(self, *exc):
        for s, h in self.saved.items():
            signal.signal(s, h)
        return False


def _stop_launcher(proc: subprocess.Popen, log: Callable[[str], None], grace: float, sink=None) -> None:
    """SIGTERM to the launcher (it stops its recipe and Ray; its output still goes to ``sink``), then
    SIGKILL to its whole session after ``grace`` seconds."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    if sink is not None and _pump(proc, sink, time.monotonic() + grace) != 124:
        return
    try:
        proc.wait(timeout=0 if sink is not None else grace)
    except subprocess.TimeoutExpired:
        log(f"the launcher (pid {proc.pid}) did not stop within {grace:g} s: killing its process group")
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def run_one(
    run: Run,
    out: Path,
    base_env: Mapping[str, str],
    log: Callable[[str], None],
    timeout_s: float,
    grace_s: float = STOP_GRACE_S,
) -> RunResult:
    """Run ``run`` through the launcher with its output in ``out/runs/<name>/``; never leaves a process.

    The launcher's output goes to ``launcher.out`` and to this process's stdout. On ``timeout_s`` the
    launcher is stopped (exit code 124 recorded). On SIGINT/SIGTERM/SIGHUP the launcher is stopped,
    leftovers are cleaned, the result is saved and :class:`Interrupted` is raised on.
    """
    folder = out / "runs" / run.name
    folder.mkdir(parents=True, exist_ok=True)
    marker = f"{uuid.uuid4().hex[:12]}-{run.name}"
    env = {**base_env, **run.env, "LOG_DIR": str(folder), MARKER: marker}
    cmd = [*run.command()[:1], str(REPO_ROOT / "ray_start_npu.sh"), *run.command()[2:]]
    log(f"run {run.name}: {' '.join(run.command())}  (logs: {folder})")
    started = time.monotonic()
    result = RunResult(run.name, exit_code=-1, wall_s=0.0)
    with open(folder / "launcher.out", "wb") as sink, Signals(log):
        proc = None
        try:
            proc = subprocess.Popen(
                cmd, cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
            result.exit_code = _pump(proc, sink, started + timeout_s)
            if result.exit_code == 124 and proc.returncode is None:
                result.timed_out = True
                log(f"run {run.name} ran past {timeout_s:g} s: stopping it")
                _stop_launcher(proc, log, grace_s, sink)
        except Interrupted as e:
            result.interrupted = e.signum
            result.exit_code = 128 + e.signum
            log(f"{signal.Signals(e.signum).name}: stopping run {run.name} (the launcher stops its recipe and Ray)")
            if proc is not None:
                _stop_launcher(proc, log, grace_s, sink)
            raise
        finally:
            if proc is not None and proc.poll() is None:
                _stop_launcher(proc, log, grace_s, sink)
            result.leftovers = stop_leftovers(marker, log)
            result.wall_s = round(time.monotonic() - started, 1)
            result.save(folder)
    return result


def _pump(proc: subprocess.Popen, sink, deadline: float) -> int:
    """Copy the launcher's output until it exits (its code) or ``deadline`` passes (124)."""
    import selectors

    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    sel = selectors.DefaultSelector()
    sel.register(fd, selectors.EVENT_READ)
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return 124
            if sel.select(timeout=min(left, 1.0)):
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                sink.write(chunk)
                sink.flush()
                sys.stdout.buffer.write(chunk)
                sys.stdout.buffer.flush()
        return proc.wait()
    finally:
        sel.close()
