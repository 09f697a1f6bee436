"""npu-rl-recipes: patches, recipes and tools for veRL RL post-training on Ascend NPU clusters.

The package is device-agnostic: everything here imports and is tested on CPU. NPU-only glue
lives in the thin patches under ``patches/`` and calls into this package.
"""

import os
import sys
from pathlib import Path

__version__ = "0.1.0"

#: Root of the npu-rl-recipes checkout (holds sources.lock, patches/, recipes/).
REPO_ROOT = Path(__file__).resolve().parent.parent


def cache_dir() -> Path:
    """``$NPU_RL_CACHE``, else ``$XDG_CACHE_HOME/npu-rl-recipes``, else ``~/.cache/npu-rl-recipes``: the
    archive cache of ``download_sources.sh`` and the preflight's reused verdicts (``preflight/``)."""
    if os.environ.get("NPU_RL_CACHE"):
        return Path(os.environ["NPU_RL_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "npu-rl-recipes"


def worker_log(line: str) -> None:
    """Print one ``[npu-rl] LINE (pid N)`` line on stderr, flushed. For code that runs inside vLLM's
    engine-core and worker processes, which leave this package's logger without a handler (an INFO
    record would vanish): the engine GC guard and the SAM proposer report through it."""
    print(f"[npu-rl] {line} (pid {os.getpid()})", file=sys.stderr, flush=True)
