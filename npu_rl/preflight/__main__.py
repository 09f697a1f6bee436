"""``python -m npu_rl.preflight RECIPE [ENV]`` (a dry run through the launcher) or ``check -- OVERRIDES``."""

import argparse
import json
import logging
import os
import sys
import warnings

from npu_rl import REPO_ROOT
from npu_rl.preflight import check_command
from npu_rl.preflight.async_trainers import TRAINERS


class ImportNotices:
    """Hold back the warnings and log lines below ERROR that libraries emit while they are being
    imported (verl's optional engines and its platform line, torch's "No CUDA runtime is found",
    megatron-core's Transformer Engine / Apex fallbacks: ~20 lines before the plan of every dry run);
    they are about this machine's optional packages, not the recipe. Every other warning and log line
    prints as before. :meth:`summary` is one line for the end, or "" when there were none."""

    def __init__(self) -> None:
        self.held: list[str] = []
        self._show = warnings.showwarning
        self._handle = logging.Logger.handle

    def __enter__(self) -> "ImportNotices":
        self._show = warnings.showwarning
        warnings.showwarning = self._hook
        self._handle = logging.Logger.handle
        held, handle = self.held, self._handle

        def hold_import_records(logger: logging.Logger, record: logging.LogRecord) -> None:
            if record.levelno < logging.ERROR and _importing():
                held.append(f"{record.levelname} {record.name}: {record.getMessage()}")
            else:
                handle(logger, record)

        logging.Logger.handle = hold_import_records
        return self

    def __exit__(self, *exc) -> None:
        warnings.showwarning = self._show
        logging.Logger.handle = self._handle

    def _hook(self, message, category, filename, lineno, file=None, line=None) -> None:
        if _importing():
            self.held.append(f"{category.__name__}: {message}")
        else:
            self._show(message, category, filename, lineno, file, line)

    def summary(self) -> str:
        if not self.held:
            return ""
        first = next((h for h in self.held if not h.startswith(("INFO ", "DEBUG "))), self.held[0])
        return (
            f"note: {len(self.held)} warning(s) and log line(s) while importing the libraries, about this "
            f"machine's optional packages and platform, not about the recipe (the first warning: {first[:120]})"
        )


def _importing() -> bool:
    """True when the warning is raised by a module's top-level code (an importlib frame is on the stack)."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib._bootstrap"):
            return True
        frame = frame.f_back
    return False


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["check"]:
        p = argparse.ArgumentParser(prog="python -m npu_rl.preflight check")
        p.add_argument("--recipe", default="", help="recipe path, for messages")
        p.add_argument(
            "--trainer",
            default="sync",
            choices=sorted(TRAINERS),
            help="the entry point run_verl runs (run_verl --trainer; docs/async.md)",
        )
        p.add_argument("args", nargs=argparse.REMAINDER, help="-- then the main_ppo command line")
        a = p.parse_args(argv[1:])
        args = a.args[1:] if a.args[:1] == ["--"] else a.args
        with ImportNotices() as notices:
            code, text, facts = check_command(args, os.environ, a.trainer, a.recipe)
        facts_path = os.environ.get("NPU_RL_PLAN_JSON")
        if facts_path:
            with open(facts_path, "w") as f:
                json.dump(facts, f)
        mark = os.environ.get("NPU_RL_PLAN_MARK")
        if mark:
            with open(mark, "w") as f:
                f.write("ok\n")
        print(text, flush=True)
        if notices.summary():
            print(notices.summary(), file=sys.stderr, flush=True)
        return code
    p = argparse.ArgumentParser(
        prog="python -m npu_rl.preflight",
        description="Check a recipe without starting anything: the same as `bash ray_start_npu.sh --dry-run`.",
    )
    p.add_argument("recipe")
    p.add_argument("rest", nargs=argparse.REMAINDER, metavar="[ENV] [K=V ...]")
    a = p.parse_args(argv)
    launcher = str(REPO_ROOT / "ray_start_npu.sh")
    os.execvp("bash", ["bash", launcher, "--dry-run", a.recipe, *a.rest])
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
