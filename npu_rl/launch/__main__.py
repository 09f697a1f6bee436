import sys

from npu_rl.launch.cli import main

sys.exit(main())
