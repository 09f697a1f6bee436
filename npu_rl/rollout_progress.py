"""Rollout progress from the trainer process: a progress bar on a terminal, a periodic line in logs.

On a two-hour rollout nothing tells a slow step from a hang. verl 0.9.1's V1 trainer waits for
generation in ``ReplayBuffer.sample`` (``verl/trainer/ppo/v1/replay_buffer.py``), which re-reads the
TransferQueue tags every ``poll_interval`` (2 s) through ``_sync_metadata_from_transfer_queue``: prompt
groups with status pending/running/finished/failure and one tag per finished trajectory (with
``response_len``). The verl patch ``verl-feature-rollout-progress`` calls :func:`on_sync` at the end
of that method, in the trainer process; nothing runs in the rollout workers.

With ``NPU_RL_ROLLOUT_PROGRESS=1`` each partition (``train``, ``val``) that has prompts in flight is
shown as

    rollout train: 412/512 responses, 98/128 groups, 1534 tok/s, longest 8123 tok, 30 groups running for 0:12:34

- a tqdm bar (responses done / total) when stderr is a terminal, else one line every
  ``NPU_RL_ROLLOUT_PROGRESS_INTERVAL`` seconds (default 60) and a final line when nothing is in flight;
- responses: sessions (``{uid}_{session}``) whose outputs reached TransferQueue; their total is groups x n, with n
  learned from finished groups (distinct sessions per group) and shown as "?" before the first one;
- tok/s: response tokens of finished trajectories per second since this partition's rollout started
  (first seen in flight; the poll interval bounds the error);
- longest: the longest finished response. The trainer sees a response only when it finishes, so a
  running response's length is unknown here; "running for" is the age of the oldest unfinished group,
  which is what tells a hang (it keeps growing while nothing finishes).

One hang it names: a group whose n responses are all in TransferQueue while its status stays
``running`` and no response has arrived for :data:`STUCK_AFTER_S` seconds. verl's agent loop writes the
group's terminal status after its sessions settle (``agent_loop_tq.py``, ``_run_prompt``); if that write
never lands, ``ReplayBuffer.sample`` waits forever with no error (verl issue 7155 for the same wait in
``main_ppo_sync``; seen once in a CPU DAPO run here). A warning naming the group is printed then, and
again every interval, whatever the terminal: the run does not stop by itself.
"""

from __future__ import annotations

import datetime
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TextIO

from npu_rl import settings
from npu_rl.errors import NpuRlError

SWITCH = "NPU_RL_ROLLOUT_PROGRESS"
INTERVAL = "NPU_RL_ROLLOUT_PROGRESS_INTERVAL"
DEFAULT_INTERVAL_S: float = settings.setting(INTERVAL).default
#: seconds without a new response after which a group with all its responses but still ``running`` is named
STUCK_AFTER_S: float = 120.0


@dataclass(frozen=True)
class Snapshot:
    """One partition's state at a poll.

    Attributes:
        pending, running, finished: prompt-group uids by status (``failure`` counts as finished).
        trajectories: trajectory key ``{uid}_{session}_{index}`` -> its tag (``response_len`` used).
    """

    pending: frozenset[str]
    running: frozenset[str]
    finished: frozenset[str]
    trajectories: Mapping[str, Mapping[str, Any]]

    @property
    def groups_total(self) -> int:
        return len(self.pending) + len(self.running) + len(self.finished)

    @property
    def in_flight(self) -> int:
        return len(self.pending) + len(self.running)


@dataclass
class _Rollout:
    start: float
    first_seen_inflight: dict[str, float] = field(default_factory=dict)
    last_line: float = float("-inf")
    bar: Any = None
    n: int | None = None
    text: str = ""
    responses: int = -1  # sessions delivered at the last poll, and since when that count stands
    responses_since: float = 0.0
    stuck_warned: float = float("-inf")


class RolloutProgress:
    """Turns snapshots into a bar (``tty=True``) or periodic lines; pure apart from ``stream``.

    Args:
        interval_s: seconds between lines when not a terminal (> 0).
        stream: where to write (default ``sys.stderr``).
        tty: force bar (True) or lines (False); default ``stream.isatty()``.
        clock: monotonic seconds (tests pass a fake).

    Raises:
        NpuRlError: ``interval_s`` not above 0.
    """

    def __init__(
        self,
        interval_s: float = DEFAULT_INTERVAL_S,
        stream: TextIO | None = None,
        tty: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        if not interval_s > 0:
            raise NpuRlError(f"{INTERVAL}={interval_s} must be > 0 seconds")
        self.interval_s = interval_s
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)()) if tty is None else tty
        self.clock = clock
        self._active: dict[str, _Rollout] = {}

    def observe(self, partition: str, snap: Snapshot) -> str | None:
        """Record one poll of ``partition``; returns the status text (None when idle)."""
        now = self.clock()
        ro = self._active.get(partition)
        if ro is None:
            if snap.in_flight == 0:
                return None
            ro = self._active[partition] = _Rollout(start=now)
        for uid in snap.pending | snap.running:
            ro.first_seen_inflight.setdefault(uid, now)
        n = _sessions_per_group(snap.finished, snap.trajectories.keys())
        if n is not None:
            ro.n = max(ro.n or 0, n)
        # sessions, not outputs: a multi-turn agent loop may emit several outputs per session
        done = len({key.rpartition("_")[0] for key in snap.trajectories})
        lens = [int(t.get("response_len", 0) or 0) for t in snap.trajectories.values()]
        tokens, longest = sum(lens), max(lens, default=0)
        elapsed = max(now - ro.start, 1e-9)
        total = snap.groups_total * ro.n if ro.n else None
        oldest = min((ro.first_seen_inflight[u] for u in snap.pending | snap.running), default=now)
        running = snap.in_flight
        ro.text = (
            f"rollout {partition}: {done}/{total if total is not None else '?'} responses, "
            f"{len(snap.finished)}/{snap.groups_total} groups, {tokens / elapsed:.0f} tok/s, longest {longest} tok"
            + (f", {running} groups running for {_hms(now - oldest)}" if running else f", done in {_hms(elapsed)}")
        )
        if done != ro.responses:
            ro.responses, ro.responses_since = done, now
        stuck = _complete_but_running(snap, ro.n) if ro.n and now - ro.responses_since >= STUCK_AFTER_S else []
        if stuck and now - ro.stuck_warned >= self.interval_s:
            print(
                f"warning: rollout {partition}: group(s) {', '.join(stuck[:4])}{' ...' if len(stuck) > 4 else ''} "
                f"have all {ro.n} responses in TransferQueue, but their status has stayed 'running' and no "
                f"response arrived for {_hms(now - ro.responses_since)}: the agent loop's status write "
                "(after its sessions settle) never reached the TransferQueue controller, and verl's "
                "ReplayBuffer.sample waits for it forever. Stop the run and resume it from its last checkpoint.",
                file=self.stream,
                flush=True,
            )
            ro.stuck_warned = now
        finished = running == 0
        if self.tty:
            self._draw_bar(ro, partition, done, total, tokens / elapsed, longest, running, now - oldest)
            if finished:
                ro.bar.close()
        elif finished or now - ro.last_line >= self.interval_s:
            print(ro.text, file=self.stream, flush=True)
            ro.last_line = now
        if finished:
            del self._active[partition]
        return ro.text

    def _draw_bar(self, ro, partition, done, total, rate, longest, running, age) -> None:
        from tqdm import tqdm

        if ro.bar is None:
            ro.bar = tqdm(total=total, desc=f"rollout {partition}", unit="resp", file=self.stream, leave=True)
        if total is not None and ro.bar.total != total:
            ro.bar.total = total
        ro.bar.n = done
        ro.bar.set_postfix_str(
            f"{rate:.0f} tok/s, longest {longest} tok" + (f", {running} groups running {_hms(age)}" if running else ""),
            refresh=False,
        )
        ro.bar.refresh()


def _sessions_by_group(keys: Iterable[str], groups: Iterable[str]) -> dict[str, set[str]]:
    """uid -> its delivered sessions, for the uids in ``groups``, from trajectory keys ``{uid}_{session}_{index}``."""
    wanted = set(groups)
    sessions: dict[str, set[str]] = {}
    for key in keys:
        uid, _, rest = key.partition("_")
        if uid in wanted:
            sessions.setdefault(uid, set()).add(rest.rpartition("_")[0] or rest)
    return sessions


def _sessions_per_group(finished: Iterable[str], keys: Iterable[str]) -> int | None:
    """n (sessions per prompt group) as seen in finished groups: distinct ``{uid}_{session}`` per uid."""
    return max((len(s) for s in _sessions_by_group(keys, finished).values()), default=None)


def _complete_but_running(snap: Snapshot, n: int) -> list[str]:
    """Running group uids (sorted) with at least ``n`` sessions delivered (``{uid}_{session}_{index}`` keys)."""
    return sorted(uid for uid, s in _sessions_by_group(snap.trajectories, snap.running).items() if len(s) >= n)


def _hms(seconds: float) -> str:
    return str(datetime.timedelta(seconds=int(max(seconds, 0))))


def from_env(env: Mapping[str, str] | None = None) -> RolloutProgress | None:
    """The reporter the environment asks for, or None when ``NPU_RL_ROLLOUT_PROGRESS`` is off.

    Raises:
        SettingsError: a non-boolean switch or a bad interval (names the variable and the allowed values).
    """
    v = settings.values("rollout progress", env)
    return RolloutProgress(interval_s=v[INTERVAL]) if v[SWITCH] else None


_REPORTER: RolloutProgress | None = None
_READ_ENV = False


def on_sync(replay_buffer: Any) -> None:
    """Hook for ``ReplayBuffer._sync_metadata_from_transfer_queue`` (after it rebuilt its snapshot).

    Reads ``pending_keys``, ``running_keys``, ``finished_keys``, ``failure_keys`` (partition -> set of
    prompt uids) and ``partitions`` (partition -> trajectory key -> tag) of verl's replay buffer.
    A no-op unless ``NPU_RL_ROLLOUT_PROGRESS`` is on.
    """
    global _REPORTER, _READ_ENV
    if not _READ_ENV:
        _REPORTER, _READ_ENV = from_env(), True
    if _REPORTER is None:
        return
    rb = replay_buffer
    names = set(rb.pending_keys) | set(rb.running_keys) | set(rb.finished_keys) | set(rb.failure_keys)
    for partition in sorted(names | set(_REPORTER._active)):
        snap = Snapshot(
            pending=frozenset(rb.pending_keys.get(partition, ())),
            running=frozenset(rb.running_keys.get(partition, ())),
            finished=frozenset(rb.finished_keys.get(partition, ())) | frozenset(rb.failure_keys.get(partition, ())),
            trajectories=dict(rb.partitions.get(partition, {})),
        )
        _REPORTER.observe(partition, snap)
