import sys

from npu_rl.acceptance.cli import main

sys.exit(main())
