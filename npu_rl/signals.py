"""SIGINT, SIGTERM and SIGHUP for the set-up tools: one interrupt, then a clean stop.

A cluster interrupts the set-up line in three ways: a user's Ctrl-C (often pressed several times), a
scheduler's or ``timeout``'s or ``docker stop``'s SIGTERM, and a closed ssh/pdsh session's SIGHUP.
All three mean the same here: stop, put back what was changed, exit ``128 + signal``.

- :func:`install` (first thing in every entry point) turns the first of them into
  :class:`Interrupted` (a ``KeyboardInterrupt``), raised where the program is, outside a
  :func:`deferred` section; later ones print one line and are otherwise ignored, so a rollback
  that is running finishes.
- Inside :func:`deferred` (any code that changes trees) the first signal is only recorded; the code
  calls :func:`check` at points where stopping is safe (between two patches, two trees), which
  raises :class:`Interrupted` there. A rollback runs inside the same section and never calls
  :func:`check`: no signal can cut it short.
- :func:`settle` (the command's work is complete): a later signal prints one line and changes nothing;
  :func:`ignore_at_exit` (the entry point, on its way out) sets ``SIG_IGN``, which survives the
  interpreter's shutdown: that shutdown resets Python's handlers to the default, and a Ctrl-C pressed
  several times would otherwise kill the finished process by signal (exit -15 for a job whose trees
  are complete).
- git children run in a session of their own (:func:`npu_rl.gittree.git`), so a terminal's Ctrl-C,
  sent to the whole foreground process group, reaches only us, never a half-written ``git apply``
  (a child that the signal caught between fork and its ``setsid`` died before running git, and
  :func:`npu_rl.gittree.git` runs it again).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterator

HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupted(KeyboardInterrupt):
    """A handled signal ended the command; ``exit_code`` is ``128 + signum`` (130 for Ctrl-C)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.exit_code = 128 + signum


class _State:
    def __init__(self) -> None:
        self.received: list[int] = []
        self.depth = 0  # deferred sections entered
        self.doing = "stopping"
        self.settled = False  # the command's work is complete


_STATE = _State()


def _say(text: str) -> None:
    # os.write: safe from a signal handler (no buffered stream re-entered mid-write)
    with contextlib.suppress(OSError):
        os.write(sys.stderr.fileno(), f"[npu-rl] {text}\n".encode())


def _handler(signum: int, _frame) -> None:
    name = signal.Signals(signum).name
    _STATE.received.append(signum)
    if _STATE.settled:
        _say(f"{name} ignored: the command has finished its work")
        return
    if len(_STATE.received) > 1:
        _say(f"{name} ignored: {_STATE.doing}; it ends by itself")
        return
    if _STATE.depth:
        _STATE.doing = "finishing the current step, then putting every tree back"
        _say(f"{name}: stopping after the current step and putting every tree back (further signals are ignored)")
        return
    raise Interrupted(signum)


def install() -> None:
    """Handle SIGINT, SIGTERM and SIGHUP as described above (idempotent; main thread only)."""
    for sig in HANDLED:
        signal.signal(sig, _handler)


def settle() -> None:
    """The command's work is complete: from now on a signal prints one line and is otherwise ignored
    (raising now would report an interrupted command whose work is done)."""
    _STATE.settled = True


def ignore_at_exit() -> None:
    """``SIG_IGN`` for the handled signals, as the process leaves (see the module docstring)."""
    for sig in HANDLED:
        signal.signal(sig, signal.SIG_IGN)


def interrupted() -> int | None:
    """The first handled signal received so far, or None."""
    return _STATE.received[0] if _STATE.received else None


def received() -> tuple[int, ...]:
    """Every handled signal received so far (numbers, in order)."""
    return tuple(_STATE.received)


def check() -> None:
    """Raise :class:`Interrupted` if a signal arrived; call it only where stopping is safe."""
    if _STATE.received:
        raise Interrupted(_STATE.received[0])


@contextlib.contextmanager
def deferred(doing: str = "putting every tree back") -> Iterator[None]:
    """Inside: a signal is recorded, not raised (see :func:`check`). ``doing`` is what the message
    for an ignored further signal says is going on."""
    _STATE.depth += 1
    _STATE.doing = doing
    try:
        yield
    finally:
        _STATE.depth -= 1


def exit_code(exc: BaseException) -> int:
    """``128 + signum`` for :class:`Interrupted`, 130 for a plain KeyboardInterrupt."""
    return getattr(exc, "exit_code", 128 + signal.SIGINT)


def _reset_for_tests() -> None:
    _STATE.received.clear()
    _STATE.depth = 0
    _STATE.settled = False
