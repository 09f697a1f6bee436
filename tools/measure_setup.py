"""Measure the set-up steps the README quotes, in one run, on this machine.

    python tools/measure_setup.py [--repeat N]

From a warm archive cache ($NPU_RL_CACHE), into a fresh temporary folder: download+unpack of every
index-backed upstream (no network: the cache must be warm, the script refuses otherwise), then
`apply_all_patches.sh --check`, apply, and a second (no-op) apply. Prints seconds per step (median
of N runs) so the README figures can be refreshed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from npu_rl.lock import load_lock  # noqa: E402
from npu_rl.patches import engine  # noqa: E402
from npu_rl.sources import Downloader, build_from_archive, cache_dir, sha256_of  # noqa: E402


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
    downloader = Downloader(cache, log=lambda m: None)
    timings: dict[str, list[float]] = {
        "download+unpack (warm cache)": [],
        "apply --check": [],
        "apply": [],
        "apply again (no-op)": [],
    }
    quiet = lambda *a, **k: None  # noqa: E731
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory() as tmp:
            dest = Path(tmp)
            t = time.perf_counter()
            for up in ups:
                archive, _ = downloader.fetch(up)
                build_from_archive(up, archive, dest, force=False)
            timings["download+unpack (warm cache)"].append(time.perf_counter() - t)
            for label, fn in (
                ("apply --check", engine.check),
                ("apply", engine.apply),
                ("apply again (no-op)", engine.apply),
            ):
                t = time.perf_counter()
                fn(lock, dest, log=quiet)
                timings[label].append(time.perf_counter() - t)
    names = ", ".join(u.name for u in ups)
    print(f"upstreams: {names}; runs: {args.repeat}; cache: {cache}")
    for label, values in timings.items():
        print(f"{label:30} median {statistics.median(values):6.2f} s  (min {min(values):.2f}, max {max(values):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
