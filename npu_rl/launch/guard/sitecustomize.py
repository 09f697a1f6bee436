"""The launcher's no-training guard: on ``PYTHONPATH`` only while nothing may train.

The launcher puts this folder first on ``PYTHONPATH`` while it sources the ENV_SCRIPT
(``NPU_RL_SOURCING_ENV`` set) and while it runs a recipe in plan mode (``--dry-run``, and the head's
preflight before Ray starts: ``NPU_RL_MODE=plan`` / ``NPU_RL_PLAN_MARK``). Python imports
``sitecustomize`` at start-up, so every Python started then, however the recipe starts it, refuses to

* run ``verl.trainer.main_ppo`` (``-m``, its file, or an import of it: verl's other entry points
  import ``run_ppo`` from it) or the fully-async and one-step-off-policy entry points (``-m`` or
  their file),
* start Ray (``ray start``, or ``ray.init()`` without an address, which starts a local cluster),

with one line naming what was refused, exit 2. The preflight imports none of these. Any other
``sitecustomize`` on ``sys.path`` still runs after this one.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys

# verl's training entry points (run_verl --trainer sync|fully_async|one_step_off): refused by name on
# the command line, before their heavy imports; the two experimental ones also import main_ppo.
TRAINERS = (
    "verl.trainer.main_ppo",
    "verl.experimental.fully_async_policy.fully_async_main",
    "verl.experimental.one_step_off_policy.main_ppo",
)


def _why() -> str | None:
    """Why nothing may train now, and the fix; None when the guard is off."""
    env = os.environ
    if env.get("NPU_RL_SOURCING_ENV"):
        return (
            f"the launcher is sourcing ENV_SCRIPT {env['NPU_RL_SOURCING_ENV']}, which must only set variables; "
            "a script that trains is the TRAIN_SCRIPT, given first: bash ray_start_npu.sh [--dry-run] TRAIN_SCRIPT "
            "ENV_SCRIPT"
        )
    if env.get("NPU_RL_MODE") == "plan" or env.get("NPU_RL_PLAN_MARK"):
        return (
            "plan mode (--dry-run, or the head's preflight before Ray starts) checks the recipe and trains nothing; "
            "there run_verl runs the preflight, and a recipe reaches main_ppo only through run_verl"
        )
    return None


def _refuse(what: str, why: str, at_start: bool = False) -> None:
    print(f"[npu-rl] error: refused to {what}: {why}", file=sys.stderr, flush=True)
    if at_start:
        os._exit(2)  # SystemExit while Python imports site would be a fatal error with a traceback
    raise SystemExit(2)


def _command_line(why: str) -> None:
    """Refuse at once (before verl's heavy imports) what the command line itself says."""
    argv = list(getattr(sys, "orig_argv", sys.argv))[1:]
    for i, a in enumerate(argv):
        module = a[2:] if a.startswith("-m") and a != "-m" else argv[i + 1] if a == "-m" and i + 1 < len(argv) else ""
        if module in TRAINERS:
            _refuse(f"run python -m {module}", why, at_start=True)
        if module == "ray.scripts.scripts" and "start" in argv[i + 1 :]:
            _refuse("start Ray (`ray start`)", why, at_start=True)
    words = [a for a in argv if not a.startswith("-")]
    if words and any(words[0].replace(os.sep, "/").endswith(m.replace(".", "/") + ".py") for m in TRAINERS):
        _refuse(f"run {words[0]}", why, at_start=True)
    if words and os.path.basename(words[0]) == "ray" and "start" in words[1:]:
        _refuse("start Ray (`ray start`)", why, at_start=True)


class _Guard:
    """A meta-path finder: refuses ``verl.trainer.main_ppo``; wraps ``ray.init`` once ``ray`` is imported."""

    def __init__(self, why: str):
        self.why = why

    def find_spec(self, name, path=None, target=None):
        if name == "verl.trainer.main_ppo":
            _refuse("import verl.trainer.main_ppo", self.why)
        if name != "ray":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module
        why = self.why

        def exec_and_wrap(module):
            exec_module(module)
            init = module.init

            def guarded_init(address=None, *args, **kwargs):
                target = address or os.environ.get("RAY_ADDRESS")
                if not target or target == "local":
                    _refuse("start a local Ray cluster (ray.init() without an address)", why)
                return init(address, *args, **kwargs)

            module.init = guarded_init

        spec.loader.exec_module = exec_and_wrap
        return spec


def _chain() -> None:
    """Run the next ``sitecustomize`` on ``sys.path`` (the one this module shadows), if any."""
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


def _install() -> None:
    why = _why()
    if why:
        _command_line(why)
        sys.meta_path.insert(0, _Guard(why))


_install()
_chain()
