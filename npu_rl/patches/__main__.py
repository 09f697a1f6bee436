"""``python -m npu_rl.patches`` (what apply_all_patches.sh runs)."""

import sys

from npu_rl import signals

signals.install()  # before the heavier imports: a Ctrl-C during start-up is a clean exit, not a traceback
try:
    from npu_rl.patches.cli import main
except KeyboardInterrupt as exc:
    print(f"interrupted ({exc or 'SIGINT'}) while starting: nothing was touched", file=sys.stderr)
    sys.exit(signals.exit_code(exc))
sys.exit(main())
