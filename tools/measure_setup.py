"""Measure the set-up steps the README quotes, as a user runs them, in one run, on this machine.

    python tools/measure_setup.py [--repeat N]

Each step is the real entry point (``bash download_sources.sh ...``, ``bash apply_all_patches.sh
...``), Python start-up, the sources lock and the tree hashing included, into a fresh temporary
sources folder per repetition: download + unpack of every index-backed upstream from a warm archive
cache (no network: the script refuses a cold cache), ``--check``, apply, a second (no-op) apply,
``--status`` and ``--revert``. Prints a Markdown table (median, min, max seconds) for the README's
"Measured" section.
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


def _timed(args: list[str]) -> float:
    env = {**os.environ, "NPU_RL_PYTHON": os.environ.get("NPU_RL_PYTHON", sys.executable)}
    t = time.perf_counter()
    done = subprocess.run(["bash", *args], cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - t
    if done.returncode != 0:
        sys.exit(f"{' '.join(args)} exited {done.returncode}:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
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


if __name__ == "__main__":
    sys.exit(main())
