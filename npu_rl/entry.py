"""``python -P -m npu_rl.entry MODULE ARGS...``: how the bash entry points start a Python module.

Handles SIGINT, SIGTERM and SIGHUP (:mod:`npu_rl.signals`) before the module's own imports run, so
an interrupt during start-up exits with ``128 + signal`` and one line, never a traceback; then runs
MODULE as ``__main__`` (``runpy``, as ``python -m MODULE`` would). ``-P`` (the bash side) keeps the
current directory off ``sys.path``: only this checkout's package is imported.
"""

import runpy
import sys

from npu_rl import signals


def main() -> int:
    signals.install()
    if len(sys.argv) < 2:
        print("usage: python -P -m npu_rl.entry MODULE [ARGS...]", file=sys.stderr)
        return 2
    module = sys.argv[1]
    sys.argv = [module, *sys.argv[2:]]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except KeyboardInterrupt as exc:  # before the module's own handling took over
        print(f"interrupted ({exc or 'SIGINT'}) while starting {module}: nothing was touched", file=sys.stderr)
        return signals.exit_code(exc)
    finally:
        signals.ignore_at_exit()  # the module's verdict stands: no late signal turns it into a kill
    return 0


if __name__ == "__main__":
    sys.exit(main())
