"""Measure the set-up steps the README quotes, as a user runs them, in one run, on this machine.

    python tools/measure_setup.py [--repeat N]
    python tools/measure_setup.py --preflight [--repeat N] [RECIPE ENV_SCRIPT]

Each step is the real entry point (``bash download_sources.sh ...``, ``bash apply_all_patches.sh
...``), Python start-up, the sources lock and the tree hashing included, into a fresh temporary
sources folder per repetition: download + unpack of every index-backed upstream from a warm archive
cache (no network: the script refuses a cold cache), ``--check``, apply, a second (no-op) apply,
``--status`` and ``--revert``. Prints a Markdown table (median, min, max seconds) for the README's
"Measured" section.

``--preflight`` times ``ray_start_npu.sh --dry-run`` of a recipe (default: the 32B GRPO recipe on two
nodes) with the libraries' checks run (``NPU_RL_PREFLIGHT_CACHE=0``) and with their verdict reused (a
cache folder of its own, filled by one run first), interleaved, and prints both and their ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from npu_rl.lock import load_lock  # noqa: E402
from npu_rl.sources import cache_dir, sha256_of  # noqa: E402


def _timed(args: list[str], **extra: str) -> float:
    env = {**os.environ, "NPU_RL_PYTHON": os.environ.get("NPU_RL_PYTHON", sys.executable), **extra}
    t = time.perf_counter()
    done = subprocess.run(["bash", *args], cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - t
    if done.returncode != 0:
        sys.exit(f"{' '.join(args)} exited {done.returncode}:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--preflight", action="store_true", help="time dry runs instead of the set-up steps")
    parser.add_argument("scripts", nargs="*", metavar="RECIPE ENV_SCRIPT")
    args = parser.parse_args()
    if args.preflight:
        return _preflight(
            args.repeat, args.scripts or ["recipes/qwen3-32b/grpo_32die.sh", "recipes/qwen3-32b/env_2node.sh"]
        )
    lock = load_lock()
    ups = [u for u in lock.upstreams.values() if u.pypi]
    cache = cache_dir()
    for up in ups:
        path = cache / "archives" / up.pypi.filename
        if not path.exists() or sha256_of(path) != up.pypi.sha256:
            print(f"cache is not warm for {up.name} ({path}); run download_sources.sh first", file=sys.stderr)
            return 1
    names = [u.name for u in ups]
    steps: dict[str, list[float]] = {}
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory() as tmp:
            src = str(Path(tmp) / "sources")
            for label, cmd in (
                (
                    f"`download_sources.sh` of the {len(names)} index archives (warm cache, new folder)",
                    ["download_sources.sh", "--dest", src, "--only", *names],
                ),
                ("`apply_all_patches.sh --check`", ["apply_all_patches.sh", "--sources", src, "--check"]),
                ("`apply_all_patches.sh` (apply)", ["apply_all_patches.sh", "--sources", src]),
                ("`apply_all_patches.sh` again (no-op)", ["apply_all_patches.sh", "--sources", src]),
                ("`apply_all_patches.sh --status`", ["apply_all_patches.sh", "--sources", src, "--status"]),
                ("`apply_all_patches.sh --revert`", ["apply_all_patches.sh", "--sources", src, "--revert"]),
            ):
                steps.setdefault(label, []).append(_timed(cmd))
    print(f"upstreams: {', '.join(names)}; repetitions: {args.repeat}; cache: {cache}; {os.cpu_count()} CPUs\n")
    print("| step | median s | min | max |\n|---|---|---|---|")
    for label, values in steps.items():
        print(f"| {label} | {statistics.median(values):.2f} | {min(values):.2f} | {max(values):.2f} |")
    return 0


def _preflight(repeat: int, scripts: list[str]) -> int:
    """Dry runs with the libraries' checks run and with their verdict reused; a table and the ratio."""
    cmd = ["ray_start_npu.sh", "--dry-run", *scripts]
    runs: dict[str, list[float]] = {"checks run (`NPU_RL_PREFLIGHT_CACHE=0`)": [], "verdict reused": []}
    with tempfile.TemporaryDirectory() as cache:
        _timed(cmd, NPU_RL_CACHE=cache)  # fills the cache (and vLLM's model-class cache)
        for _ in range(repeat):
            for label, extra in zip(runs, ({"NPU_RL_PREFLIGHT_CACHE": "0"}, {}), strict=True):
                runs[label].append(_timed(cmd, NPU_RL_CACHE=cache, **extra))
    print(f"`bash {' '.join(cmd)}`; repetitions: {repeat}; {os.cpu_count()} CPUs\n")
    print("| dry run | median s | min | max |\n|---|---|---|---|")
    for label, values in runs.items():
        print(f"| {label} | {statistics.median(values):.2f} | {min(values):.2f} | {max(values):.2f} |")
    cold, warm = (statistics.median(v) for v in runs.values())
    print(f"\nreused / run: {warm / cold:.2f} of the time (median)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
