"""Feature settings: each feature declares its switch and tuning variables once, here; the rest is derived.

A :class:`Setting` is one environment variable: name, type, default, allowed range, which process
reads it (:data:`READERS`), one line of doc. A :class:`Feature` groups its switch (a boolean setting,
or a config key) with its tuning settings. From :data:`FEATURES` come

- the runtime readers: :func:`get` (typed value, default when unset or blank; :class:`SettingsError`
  otherwise), :func:`is_on` (lenient, for code that only reports), :func:`values`;
- the preflight's checks, :func:`check`: every variable set parses and is in range; a switch is a
  boolean; a tuning variable set while its feature is off is named; a variable with a feature's
  prefix that no feature declares is named with the closest declared one; a variable a Ray worker or
  vLLM engine reads that only the train script sets is refused (Ray workers inherit their node's
  environment, not the driver's); reference-recipe names we replaced are refused;
- the README's features and settings tables (:func:`features_table`, :func:`settings_table`) and the
  ``--help`` text of ``python -m npu_rl.settings`` (:func:`help_text`).

Every bad value raises one error type, :class:`SettingsError`, naming the variable, the value and the
allowed values: ``NPU_RL_ENGINE_GC_EVERY='x' is not an integer >= 1``. No feature module parses its
own variables (``tests/test_settings_on_cpu.py`` greps for it).

Library: values are converted by pydantic (``TypeAdapter``: its boolean words, integers, finite
numbers, literal choices), which the stack already pins. ``pydantic-settings`` (pinned too, as a
dependency of vLLM's) was considered and not used: its sources read ``os.environ`` and dotenv files,
while every reader here takes an explicit mapping (the preflight judges the job's environment as the
ENV_SCRIPT left it, and compares it with the node's), it ignores environment variables it has no
field for (the misspelling check is the point), it has no notion of a switch whose tuning settings
are inert while it is off or of which process reads a variable, and its errors are pydantic's
``ValidationError`` lists rather than one line naming the variable. What would remain of it here is
pydantic's conversion, used directly.

This module imports no feature module (they import it): the import circle between the feature table
and rollout rebalance's settings is gone.
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Literal

from npu_rl import REPO_ROOT
from npu_rl.errors import NpuRlError

Reader = Literal["driver", "worker", "engine"]

#: Which process reads a setting. Only ``driver`` settings may be set in the train script alone.
READERS: dict[str, str] = {
    "driver": "the train script's own process",
    "worker": "Ray workers on every node (trainer, actor and rollout-server actors)",
    "engine": "vLLM's engine-core processes on every node",
}

BOOL_WORDS = "1/0, true/false, yes/no, on/off"


class SettingsError(NpuRlError, ValueError):
    """A feature setting's value cannot be used: names the variable, the value and the allowed values.

    Also a ``ValueError``, so code that validated values with ``ValueError`` before keeps working.

    Attributes:
        name: the variable. value: what it was set to (as written). allowed: the allowed values, in words.
    """

    def __init__(self, name: str, value: str, allowed: str, shown: str | None = None) -> None:
        self.name, self.value, self.allowed, self._shown = name, value, allowed, shown
        super().__init__(f"{name}={shown if shown is not None else repr(value)} is not {allowed}")

    def __reduce__(self):  # raised in a Ray actor, it is pickled back to the driver
        return type(self), (self.name, self.value, self.allowed, self._shown)

    @property
    def fix(self) -> str:
        return f"set {self.name} to {self.allowed} in the ENV_SCRIPT, or unset it"


@dataclass(frozen=True)
class Setting:
    """One environment variable of a feature.

    ``type`` is ``bool``, ``int``, ``float`` or ``str``; ``choices`` restricts a ``str``; ``words`` are
    extra values accepted besides the type (e.g. ``auto``), read as themselves; ``ge``/``gt``/``le``/
    ``lt`` bound a number; ``unit`` names it (``MiB``, ``seconds``); ``default`` is the value when
    unset or blank (None: the reader derives it, ``default_doc`` says how).
    """

    name: str
    type: type
    default: Any
    doc: str
    reader: Reader = "worker"
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    unit: str = ""
    choices: tuple[str, ...] = ()
    words: tuple[str, ...] = ()
    default_doc: str = ""

    def allowed(self) -> str:
        """The allowed values in words, e.g. ``an integer >= 1`` or ``a positive number of MiB``."""
        if self.type is bool:
            base = f"a boolean ({BOOL_WORDS})"
        elif self.choices:
            base = "one of " + ", ".join(repr(c) for c in self.choices)
        elif self.type is str:
            base = "any text"
        else:
            noun = "integer" if self.type is int else "number"
            positive = self.gt == 0 and self.ge is None and self.le is None and self.lt is None
            base = f"a positive {noun}" if positive else ("an integer" if self.type is int else "a number")
            base += f" of {self.unit}" if self.unit else ""
            if not positive:
                base += self._range()
        if self.words:
            return ", ".join(repr(w) for w in self.words) + " or " + base
        return base

    def _range(self) -> str:
        low = self.ge if self.ge is not None else self.gt
        high = self.le if self.le is not None else self.lt
        if low is not None and high is not None:
            return f" in {'[' if self.ge is not None else '('}{low:g}, {high:g}{']' if self.le is not None else ')'}"
        if low is not None:
            return f" {'>=' if self.ge is not None else '>'} {low:g}"
        if high is not None:
            return f" {'<=' if self.le is not None else '<'} {high:g}"
        return ""

    def default_text(self) -> str:
        if self.default_doc:
            return self.default_doc
        if self.type is bool:
            return "1" if self.default else "0"
        if self.default is None or self.default == "":
            return "(unset)"
        return f"{self.default:g}" if isinstance(self.default, float) else str(self.default)

    def parse(self, raw: str) -> Any:
        """``raw`` (stripped, not blank) as this setting's value.

        Raises:
            SettingsError: not of the type, not a choice, or out of range.
        """
        from pydantic import ValidationError

        if raw.lower() in self.words:
            return raw.lower()
        try:
            value = _adapter(self.type, self.choices).validate_python(raw)
        except ValidationError:
            raise SettingsError(self.name, raw, self.allowed()) from None
        if self.type in (int, float) and not (
            (self.ge is None or value >= self.ge)
            and (self.gt is None or value > self.gt)
            and (self.le is None or value <= self.le)
            and (self.lt is None or value < self.lt)
        ):
            raise SettingsError(self.name, raw, self.allowed(), shown=str(value))
        return value

    def read(self, env: Mapping[str, str]) -> Any:
        """The value in ``env``; the default when unset or blank."""
        raw = env.get(self.name, "").strip()
        return self.default if not raw else self.parse(raw)


@cache
def _adapter(kind: type, choices: tuple[str, ...]):
    from typing import Annotated

    from pydantic import Field, TypeAdapter

    if choices:
        return TypeAdapter(Literal[choices])  # type: ignore[valid-type]
    if kind is float:
        return TypeAdapter(Annotated[float, Field(allow_inf_nan=False)])
    return TypeAdapter(kind)


def switch(name: str, doc: str, reader: Reader = "worker") -> Setting:
    """A feature's on/off variable (a boolean, off by default)."""
    return Setting(name, bool, False, doc, reader)


@dataclass(frozen=True)
class Feature:
    """One switchable feature.

    ``switch`` is its on/off variable (or None when a config key switches it), ``config`` the config key
    and the value that turns it on, ``tuning`` the other variables that tune it, ``prefixes`` the
    name prefixes only this feature's variables use (a misspelling under them is named),
    ``patches`` the series entries (``<upstream>/<file name>``) it needs, ``issue`` where it is specified.
    """

    name: str
    summary: str
    issue: int
    switch: Setting | None = None
    config: tuple[str, str] | None = None
    tuning: tuple[Setting, ...] = ()
    prefixes: tuple[str, ...] = ()
    patches: tuple[str, ...] = ()

    @property
    def env(self) -> str | None:
        """The switch variable's name (None when only a config key switches it)."""
        return self.switch.name if self.switch else None

    @property
    def params(self) -> tuple[str, ...]:
        """The tuning variables' names."""
        return tuple(s.name for s in self.tuning)

    @property
    def settings(self) -> tuple[Setting, ...]:
        return ((self.switch,) if self.switch else ()) + self.tuning

    def switch_text(self) -> str:
        return f"{self.switch.name}=1" if self.switch else f"{self.config[0]}={self.config[1]}"  # type: ignore[index]

    def available(self) -> bool:
        if not self.patches:
            return False
        for entry in self.patches:
            upstream, name = entry.split("/", 1)
            series = REPO_ROOT / "patches" / upstream / "series"
            if not series.is_file() or name not in series.read_text().split():
                return False
        return True


_GUARD = "VLLM_ROLLOUT_EARLY_STOP_"
_GC = "NPU_RL_ENGINE_GC"
_RB = "ROLLOUT_REBALANCE_"

FEATURES: tuple[Feature, ...] = (
    Feature(
        "random init",
        "trains from Megatron's random initialisation instead of loading the checkpoint (throughput runs)",
        4,
        switch=switch("NPU_RL_RANDOM_INIT", "keep Megatron's random initial weights (read by the actor workers)"),
        prefixes=("NPU_RL_RANDOM_",),
        patches=("verl/0002-verl-feature-random-init.patch",),
    ),
    Feature(
        "length-aware resampler",
        "groups prompts of similar predicted response length into the same generation batch",
        5,
        config=("data.sampler.class_name", "LengthAwareEpochSampler"),
        patches=("verl/0006-verl-feature-length-aware-sampler.patch",),
    ),
    Feature(
        "long-tail guard",
        "aborts straggling responses once most of a step has finished (truncates; opt-in)",
        5,
        switch=switch(f"{_GUARD}ENABLE", "abort straggling responses (read by verl's vLLM servers)"),
        tuning=(
            Setting(
                f"{_GUARD}FACTOR", float, 2.0, "abort a running response longer than this x the finished median", ge=1
            ),
            Setting(f"{_GUARD}MIN_TOKENS", int, 10000, "never abort a response shorter than this (tokens)", ge=0),
            Setting(
                f"{_GUARD}FINISHED_FRACTION",
                float,
                0.9,
                "decide only once this fraction of the step finished",
                gt=0,
                le=1,
            ),
        ),
        prefixes=("VLLM_ROLLOUT_",),
        patches=("verl/0007-verl-feature-long-tail-guard.patch",),
    ),
    Feature(
        "SAM speculative decoding",
        "suffix-automaton drafter verified by vLLM's rejection sampler",
        6,
        config=("actor_rollout_ref.rollout.engine_kwargs.vllm.speculative_config.method", "sam"),
        tuning=(
            Setting(
                "VLLM_SPECULATIVE_BATCH_SIZE_THRE",
                int,
                None,
                "draft while the running batch is at most this (alias of speculative_config.sam_batch_size_threshold)",
                ge=1,
                words=("always", "never"),
                default_doc="the key, else 32",
            ),
        ),
        prefixes=("VLLM_SPECULATIVE_",),
        patches=(
            "vllm/0002-vllm-feature-sam-speculative-method.patch",
            "vllm/0005-vllm-feature-spec-decode-request-counts.patch",
            "vllm-ascend/0001-vllm-ascend-feature-sam-speculative-method.patch",
            "verl/0012-verl-feature-sam-acceptance-metrics.patch",
        ),
    ),
    Feature(
        "all-to-all-v MoE reshard",
        "sends each rollout rank only its experts after every training step",
        7,
        switch=switch("ALL_TO_ALL_RESHARD", "reshard experts by all-to-all-v at the weight sync (actor workers)"),
        config=("actor_rollout_ref.rollout.checkpoint_engine.expert_reshard", "true"),
        tuning=(
            Setting(
                "USE_ALLTOALL_OVERLAP", bool, False, "start the next collective before handing over the current one"
            ),
            Setting(
                "ALL_TO_ALL_RESHARD_BUCKET_MB",
                float,
                None,
                "bytes each rank sends and receives per collective",
                gt=0,
                unit="MiB",
                default_doc="one expert per rank",
            ),
        ),
        prefixes=("ALL_TO_ALL", "USE_ALLTOALL"),
        patches=("verl/0005-verl-feature-expert-reshard.patch", "mbridge/0001-mbridge-feature-export-skip.patch"),
    ),
    Feature(
        "rollout rebalance",
        "pull-based, longest-predicted-first dispatch of rollout requests across replicas",
        8,
        switch=switch(f"{_RB}ENABLE", "our dispatcher replaces verl's request load balancer (the trainer actor)"),
        tuning=(
            Setting(
                f"{_RB}ORDER",
                str,
                "longest",
                "longest: longest predicted work first; fifo: arrival",
                choices=("longest", "fifo"),
            ),
            Setting(f"{_RB}PREDICT", bool, True, "0: ignore learned lengths (prompt length only)"),
            Setting(f"{_RB}KEEP_GROUPS", bool, False, "1: the n samples of a prompt go to one target"),
            Setting(
                f"{_RB}DP_RANKS",
                bool,
                "auto",
                "route to each DP rank of a multi-rank replica; 0: one target per replica",
                words=("auto",),
                default_doc="auto",
            ),
            Setting(f"{_RB}MAX_INFLIGHT", int, 0, "slots per target; 0 = rollout.max_num_seqs", ge=0),
            Setting(f"{_RB}GATHER_S", float, 0.5, "hold the first releases of a batch this long", ge=0, unit="seconds"),
            Setting(f"{_RB}EMA_DECAY", float, 0.5, "per-prompt EMA decay of observed response lengths", ge=0, lt=1),
            Setting(
                f"{_RB}PRIOR_LEN",
                float,
                0.0,
                "length of unseen prompts before any observation; 0 = response_length / 4",
                ge=0,
            ),
            Setting(f"{_RB}MAX_ATTEMPTS", int, 3, "tries of one request when its replica dies", ge=1),
            Setting(f"{_RB}METRICS_FILE", str, "", "append per-step metrics as JSON lines to this file"),
        ),
        prefixes=("ROLLOUT_REBALANCE",),
        patches=("verl/0008-verl-feature-rollout-rebalance.patch",),
    ),
    Feature(
        "skip old-log-prob recompute",
        "on-policy updates use log_prob.detach() instead of a second forward pass",
        9,
        config=("actor_rollout_ref.actor.recompute_old_log_prob", "false"),
        patches=("verl/0003-verl-feature-skip-old-log-prob.patch",),
    ),
    Feature(
        "no GC pauses in decode steps",
        "vLLM's engine core steps with automatic GC off and collects between steps at a bounded cadence",
        9,
        switch=switch(_GC, "automatic GC off inside vLLM engine steps", reader="engine"),
        tuning=(
            Setting(f"{_GC}_EVERY", int, 32, "collect generations 0-1 every this many steps", "engine", ge=1),
            Setting(f"{_GC}_MAX_GEN0", int, 200_000, "... or past this many young container objects", "engine", ge=1),
            Setting(
                f"{_GC}_FULL_GROWTH", float, 0.25, "full collection once the heap grew by this fraction", "engine", gt=0
            ),
        ),
        prefixes=(_GC,),
        patches=("vllm/0001-vllm-feature-engine-gc.patch",),
    ),
    Feature(
        "rollout progress",
        "progress bar (TTY) or periodic line during generation: requests done/total, tokens/s, longest response",
        9,
        switch=switch("NPU_RL_ROLLOUT_PROGRESS", "progress of generation in the trainer's log (the trainer actor)"),
        tuning=(
            Setting(
                "NPU_RL_ROLLOUT_PROGRESS_INTERVAL",
                float,
                60.0,
                "one line this often when not on a terminal",
                gt=0,
                unit="seconds",
            ),
        ),
        prefixes=("NPU_RL_ROLLOUT_PROGRESS",),
        patches=("verl/0004-verl-feature-rollout-progress.patch",),
    ),
)

# Names the reference recipe used that this project replaces: old name -> what to write instead.
RENAMED = {
    "VLLM_ENABLE_EXPERT_PARALLEL": "actor_rollout_ref.rollout.expert_parallel_size=<TP x DP> (verl 0.9 config)",
    "VLLM_DP_SIZE": "actor_rollout_ref.rollout.data_parallel_size=<N> (verl 0.9 config)",
}


# --- derived: lookups and readers -------------------------------------------------------------------


def declared() -> dict[str, tuple[Feature, Setting]]:
    """Every declared variable -> (its feature, its declaration), in table order."""
    return {s.name: (f, s) for f in FEATURES for s in f.settings}


def setting(name: str) -> Setting:
    """The declaration of ``name``. Raises LookupError for an undeclared name (a programming error)."""
    try:
        return declared()[name][1]
    except KeyError:
        raise LookupError(f"{name} is not a declared feature setting (npu_rl/settings.py)") from None


def feature(name: str) -> Feature:
    """The feature called ``name`` (its table name, e.g. ``rollout rebalance``)."""
    for f in FEATURES:
        if f.name == name:
            return f
    raise LookupError(f"no feature is called {name!r} (npu_rl/settings.py)")


def known_env() -> set[str]:
    """Every variable the feature table knows (switches and tuning), and the replaced reference names."""
    return set(declared()) | set(RENAMED)


def own_prefixes() -> tuple[str, ...]:
    """Prefixes of variables only this project (or the reference recipe) reads: typos are caught here."""
    return tuple(p for f in FEATURES for p in f.prefixes)


def get(name: str, env: Mapping[str, str] | None = None) -> Any:
    """The value of the declared variable ``name`` in ``env`` (default ``os.environ``), typed; its
    default when unset or blank.

    Raises:
        SettingsError: the value is not of its type or out of its range.
    """
    return setting(name).read(os.environ if env is None else env)


def is_on(name: str, env: Mapping[str, str] | None = None) -> bool:
    """True when the boolean variable ``name`` reads true; a bad value reads as off. For code that only
    reports (the preflight, which names the bad value through :func:`check`, and run evidence)."""
    try:
        return get(name, env) is True
    except SettingsError:
        return False


def values(feature_name: str, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Every setting of one feature: variable -> typed value. Raises SettingsError on the first bad one."""
    env = os.environ if env is None else env
    return {s.name: s.read(env) for s in feature(feature_name).settings}


# --- derived: the preflight's checks ----------------------------------------------------------------


@dataclass
class FeatureState:
    """Which features a recipe switches on, and the problems with its feature variables."""

    on: list[Feature] = field(default_factory=list)
    errors: list[tuple[str, str, str]] = field(default_factory=list)  # (key, message, fix)
    warnings: list[tuple[str, str, str]] = field(default_factory=list)


def check(
    env: Mapping[str, str], select: Callable[[str], object], node_env: Mapping[str, str] | None = None
) -> FeatureState:
    """Read every feature's switch from ``env`` and the composed config (``select(key)``) and judge
    every feature variable set.

    ``node_env`` is what the launcher saw before running the train script (the node environment that
    Ray's workers on every node inherit); a variable a worker or engine reads that differs there was
    set in the train script, where only the driver sees it.
    """
    st = FeatureState()
    table = declared()
    for name, (_, s) in sorted(table.items()):
        if node_env is not None and s.reader != "driver" and env.get(name, "") != node_env.get(name, ""):
            st.errors.append(
                (
                    name,
                    f"is {env.get(name, '')!r} in the train script but {node_env.get(name, '')!r} in the node "
                    f"environment: Ray workers on the other nodes would not see it (read by {READERS[s.reader]})",
                    "set feature variables in the ENV_SCRIPT (sourced on every node before Ray starts)",
                )
            )
    bad = set()
    for name, (_, s) in table.items():
        try:
            s.read(env)
        except SettingsError as e:
            bad.add(name)
            st.errors.append((name, str(e), e.fix))
    for f in FEATURES:
        on = f.switch is not None and f.switch.name not in bad and f.switch.read(env) is True
        if f.config:
            key, value = f.config
            on = on or str(select(key)).lower() == value.lower()
        if not on:
            for s in f.tuning:
                if env.get(s.name, "").strip() and s.name not in bad:
                    st.warnings.append(
                        (
                            s.name,
                            f"is set but has no effect: the {f.name} is off",
                            f"switch it on with {f.switch_text()}, or drop it",
                        )
                    )
            continue
        st.on.append(f)
        if not f.available():
            st.errors.append(
                (
                    f.env or f.config[0],  # type: ignore[index]
                    f"the {f.name} is switched on ({f.switch_text()}) but is not in this release yet (issue {f.issue})",
                    "remove the switch; `bash apply_all_patches.sh --status` lists what this release carries",
                )
            )
    prefixes, known = own_prefixes(), known_env()
    for key in sorted(env):
        if key in RENAMED:
            st.errors.append((key, "is a reference-recipe name this project does not read", f"use {RENAMED[key]}"))
        elif key.startswith(prefixes) and key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            st.warnings.append(
                (key, "is not a variable any npu-rl feature reads", f"did you mean {close[0]}?" if close else "")
            )
    return st


# --- derived: documentation -------------------------------------------------------------------------


def features_table() -> str:
    """The README's feature table (markdown)."""
    rows = ["| feature | switch | tuning | in this release |", "|---|---|---|---|"]
    for f in FEATURES:
        tuning = ", ".join(f"`{p}`" for p in f.params) or "–"
        status = "yes" if f.available() else f"not yet (issue {f.issue}); switching it on is rejected"
        rows.append(f"| {f.name}: {f.summary} | `{f.switch_text()}` | {tuning} | {status} |")
    return "\n".join(rows)


def settings_table() -> str:
    """The README's table of every feature variable (markdown): allowed values, default, reader, meaning."""
    rows = ["| variable | feature | allowed | default | read by | meaning |", "|---|---|---|---|---|---|"]
    for name, (f, s) in declared().items():
        rows.append(f"| `{name}` | {f.name} | {s.allowed()} | {s.default_text()} | {s.reader} | {s.doc} |")
    return "\n".join(rows)


def help_text() -> str:
    """Every feature variable, grouped by feature: what ``python -m npu_rl.settings --help`` lists."""
    out = ["read by:", *(f"  {k:6}  {v}" for k, v in READERS.items()), ""]
    for f in FEATURES:
        if not f.settings:
            continue
        out.append(f"{f.name} (on with {f.switch_text()}):")
        for s in f.settings:
            out.append(f"  {s.name}  [{s.reader}; default {s.default_text()}]")
            out.append(f"      {s.doc}; allowed: {s.allowed()}")
    return "\n".join(out)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m npu_rl.settings",
        description="The feature variables of npu-rl (set them in the ENV_SCRIPT) and a check of this environment.",
        epilog=help_text(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--table", choices=("features", "settings"), help="print a README table (markdown)")
    p.add_argument("--check", action="store_true", help="check the feature variables of this environment")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.table:
        print(features_table() if args.table == "features" else settings_table())
        return 0
    if not args.check:
        print(help_text())
        return 0
    st = check(os.environ, lambda _key: None)
    for kind, found in (("error", st.errors), ("warning", st.warnings)):
        for key, msg, fix in found:
            print(f"{kind}: {key}: {msg}" + (f"\n    fix: {fix}" if fix else ""), file=sys.stderr)
    print(f"features switched on here: {', '.join(f.name for f in st.on) or 'none'}")
    return 1 if st.errors else 0


if __name__ == "__main__":
    sys.exit(main())
