"""Command line of the patch engine (``apply_all_patches.sh`` runs ``python -m npu_rl.patches``)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

from npu_rl import REPO_ROOT, signals, srclock
from npu_rl.errors import IOFailure, NpuRlError
from npu_rl.lock import load_lock
from npu_rl.patches import engine, export
from npu_rl.patches.series import load_series
from npu_rl.table import format_table

EXIT_CODES = """exit codes:
  0  done: applied, already applied (nothing changed), check passed, reverted, status consistent
  1  a patch does not apply; the message names the patch, file and hunk; no tree was changed
  2  usage error (including an unknown --only name)
  3  a tree is missing, at another pin, modified by hand or partially patched: refused, untouched
  4  the series or sources.lock is malformed (naming, order, header, missing file)
  5  a tree did not reach the expected state after apply/revert (rolled back where possible)
  6  bump: upstream already contains some patches; rerun with --drop NAME... to confirm dropping them
  7  the file system or git refused a write (disk full, read-only, permission, a held .git/index.lock):
     the message names the path and the fix; every tree is as it was, or the message lists those that are not
  8  another set-up command holds the sources folder (its pid and host are named) past NPU_RL_LOCK_TIMEOUT
     (seconds, default 600)
  129/130/143  SIGHUP / SIGINT (Ctrl-C) / SIGTERM: stopped; every tree changed was put back first
environment: NPU_RL_SOURCES (default sources folder), NPU_RL_LOCK_TIMEOUT (seconds to wait for another run)
"""


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--sources",
        type=Path,
        default=None,
        help="folder holding the upstream trees (default: $NPU_RL_SOURCES or <repo>/sources)",
    )
    p.add_argument("--patches", type=Path, default=None, help=argparse.SUPPRESS)  # tests: another series
    p.add_argument("--lock", type=Path, default=None, help=argparse.SUPPRESS)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="apply_all_patches.sh",
        description="Apply the npu-rl-recipes patch series to the pinned upstream trees, all or nothing. "
        "Maintainer commands (also through this script): 'bash apply_all_patches.sh {edit,export,tests,bump} --help'.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="dry-run the whole series; change nothing")
    mode.add_argument(
        "--status", action="store_true", help="per upstream: version, baseline ok?, patches applied n/m, series digest"
    )
    mode.add_argument("--revert", action="store_true", help="restore every tree to its exact baseline")
    p.add_argument("--only", nargs="+", metavar="NAME", help="act on these upstreams only")
    p.add_argument("--force", action="store_true", help="with --revert: also drop commits made on top of the baseline")
    _common(p)
    return p


def build_maintainer_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m npu_rl.patches", epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="command", required=True)
    e = sub.add_parser("edit", help="commit the series onto sources/NAME, one commit per patch, to edit with git")
    e.add_argument("name")
    _common(e)
    x = sub.add_parser("export", help="write the commits on top of sources/NAME's baseline back as its series")
    x.add_argument("name")
    _common(x)
    b = sub.add_parser(
        "bump",
        help="move upstream NAME to release VERSION: resolve, stage, replay the series (3-way), switch; resumable",
        description="Move one upstream to a new release, all or nothing (docs/maintaining.md). A conflict or a "
        "patch upstream already contains stops the bump with the old pin untouched; fix it as the message says "
        "and run the same command again. A bump to the pinned version is a no-op.",
        epilog=EXIT_CODES
        + "  130 interrupted before the switch: the old pin is untouched; run the same command to go on\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    b.add_argument("name", help="the upstream's name in sources.lock (verl, vllm, vllm-ascend, megatron-core, ...)")
    b.add_argument("version", help="the new release (PEP 440), e.g. 0.9.1")
    b.add_argument("--ref", help="git tag or branch of the release (default: the old ref with the version replaced)")
    b.add_argument("--filename", help="index archive name (default: the old one with the version replaced)")
    b.add_argument("--git-url", help="resolve the ref in this repository (a mirror) instead of the lock's git")
    c = b.add_mutually_exclusive_group()
    c.add_argument("--commit", help="the release's full commit SHA, when no repository can be reached")
    c.add_argument(
        "--no-commit",
        action="store_true",
        help="index archives only: pin the archive without a commit when none can be resolved (the note says why)",
    )
    b.add_argument("--drop", nargs="+", default=[], metavar="PATCH", help="drop these patches (file names)")
    b.add_argument(
        "--abort", action="store_true", help="delete the staged bump of NAME (any version); the old pin stays"
    )
    b.add_argument("--downgrade", action="store_true", help="allow VERSION to be older than the pinned one")
    _common(b)
    t = sub.add_parser("tests", help="print the upstream test paths named by the patches' Tests: fields")
    t.add_argument("--only", nargs="+", metavar="NAME")
    _common(t)
    return p


def _sources_dir(arg: Path | None) -> Path:
    if arg is not None:
        return arg.resolve()
    env = os.environ.get("NPU_RL_SOURCES")
    return Path(env).resolve() if env else REPO_ROOT / "sources"


def _print_status(rows: list[engine.StatusRow]) -> None:
    head = ("upstream", "version", "source", "baseline", "applied", "series")
    print(format_table(head, [(r.name, r.version, r.source, r.baseline, r.applied, r.digest) for r in rows]))


def _bump(args, sources: Path, patches_dir: Path | None) -> int:
    from npu_rl.lock import LOCK_PATH
    from npu_rl.patches.bump import BumpOptions, bump

    lock_path = args.lock.resolve() if args.lock else LOCK_PATH
    opts = BumpOptions(
        ref=args.ref,
        filename=args.filename,
        git_url=args.git_url,
        commit=args.commit,
        no_commit=args.no_commit,
        drop=tuple(args.drop),
        abort=args.abort,
        downgrade=args.downgrade,
    )
    bump(args.name, args.version, sources, patches_dir, lock_path, lock_path.parent / "README.md", opts)
    return 0


def main(argv: list[str] | None = None) -> int:
    signals.install()
    argv = list(sys.argv[1:] if argv is None else argv)
    maintainer = bool(argv) and argv[0] in ("edit", "export", "tests", "bump")
    parser = build_maintainer_parser() if maintainer else build_parser()
    args = parser.parse_args(argv)
    if not maintainer and args.force and not args.revert:
        parser.error("--force only goes with --revert")
    sources = _sources_dir(args.sources)
    patches_dir = args.patches.resolve() if args.patches else None
    started = time.monotonic()
    command = "apply_all_patches.sh " + " ".join(argv)
    try:
        if maintainer and args.command == "tests":  # reads the series only: no lock needed
            lock = load_lock(args.lock)
            for up in engine.select(lock, args.only):
                for p in load_series(up.name, patches_dir).patches:
                    for t in p.tests:
                        print(f"{up.name} {t}")
            return 0
        read_only = not maintainer and (args.status or args.check)
        with srclock.exclusive(sources, command.strip(), read_only=read_only):
            srclock.clean_leftovers(sources, lambda m: print(m, file=sys.stderr))
            code = _run(args, maintainer, sources, patches_dir)
        if code or (not maintainer and args.status):
            return code  # --status prints the table only: two runs on the same trees print the same
    except NpuRlError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:  # a write of ours (not git's) refused: disk full, read-only, permission
        print(f"error: {IOFailure.from_os_error(exc, 'writing')}", file=sys.stderr)
        return IOFailure.exit_code
    except KeyboardInterrupt as exc:
        what = f"interrupted ({exc})" if isinstance(exc, signals.Interrupted) else "interrupted"
        if maintainer and args.command == "bump":
            print(
                f"{what}: the old pin is untouched unless the switch had begun; run the same command to go on "
                "(or to finish the switch), or add --abort to discard the staged bump",
                file=sys.stderr,
            )
        else:
            print(f"{what}: every tree changed was put back; nothing else was touched", file=sys.stderr)
        return signals.exit_code(exc)
    print(f"done in {time.monotonic() - started:.1f} s")
    return 0


def _run(args, maintainer: bool, sources: Path, patches_dir: Path | None) -> int:
    """The command itself, with the sources folder locked; returns an exit code (0 = go on)."""
    if maintainer and args.command == "bump":
        return _bump(args, sources, patches_dir)
    lock = load_lock(args.lock)
    if maintainer:
        up = lock.get(args.name)
        (export.edit if args.command == "edit" else export.export)(up, sources, patches_dir)
        return 0
    if args.status:
        rows = engine.status(lock, sources, patches_dir, args.only)
        _print_status(rows)
        from npu_rl.patches.bump import staged_bumps

        for line in staged_bumps(sources):
            print(f"bump: {line}")
        problems = engine.status_problems(rows)
        for line in problems:
            print(f"not consistent: {line}", file=sys.stderr)
        return 3 if problems else 0
    if args.revert:
        engine.revert(lock, sources, patches_dir, args.only, force=args.force)
    elif args.check:
        engine.check(lock, sources, patches_dir, args.only)
    else:
        engine.apply(lock, sources, patches_dir, args.only)
        signals.settle()
        if signals.interrupted():  # it came after apply's last check: the series is complete and kept
            name = signal.Signals(signals.interrupted()).name
            print(f"{name} came as the series finished: every tree is fully applied, nothing was put back",
                  file=sys.stderr)  # fmt: skip
    return 0
