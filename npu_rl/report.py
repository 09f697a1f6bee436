"""``python -m npu_rl.report RUN_DIR``: the run report (:mod:`npu_rl.evidence.report` holds the code)."""

import sys

from npu_rl.evidence.report import main

if __name__ == "__main__":
    sys.exit(main())
