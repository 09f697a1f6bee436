import sys

from npu_rl.patches.cli import main

sys.exit(main())
