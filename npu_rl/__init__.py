"""npu-rl-recipes: patches, recipes and tools for veRL RL post-training on Ascend NPU clusters.

The package is device-agnostic: everything here imports and is tested on CPU. NPU-only glue
lives in the thin patches under ``patches/`` and calls into this package.
"""

from pathlib import Path

__version__ = "0.1.0"

#: Root of the npu-rl-recipes checkout (holds sources.lock, patches/, recipes/).
REPO_ROOT = Path(__file__).resolve().parent.parent
