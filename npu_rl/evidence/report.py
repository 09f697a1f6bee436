"""A run report a user can read: ``python -m npu_rl.report RUN_DIR [--chance P] [--out DIR]``.

``python -m npu_rl.report --compare RUN_A RUN_B --label A --label B --metric KEY... [--out PNG]`` prints
the runs' metrics side by side per step and draws them (:func:`compare`).

Writes ``report.md`` and PNGs (matplotlib, Agg backend) into ``RUN_DIR/report/`` (or ``--out``):

- ``learning.png``: the training reward per step (``critic/score/mean``) and the validation score at
  each test step (verl's ``val-core/<data source>/{acc,reward}/mean@N``), with the task's chance;
- ``lengths.png``: response length per step (mean, min, max) and the share clipped at the maximum;
- ``phases.png``: seconds per step in each phase verl times (``timing_s/gen``, ``old_log_prob``,
  ``update_actor``, ``update_weights``, ...), stacked, with what the step spent outside them;
- ``agreement.png``: rollout-vs-actor agreement (``|rollout_corr/kl|``, or the on-policy shortcut's
  ``actor/training/rollout_probs_diff_max``) against one update's movement (``actor/ppo_kl``);
- ``features.png``: each feature's step metrics that the run logged (SAM acceptance, guard cuts,
  rebalance idle fractions, resampler batch spread), one panel per feature.

Where the numbers come from: verl's own ``file`` tracker (``trainer.logger`` with ``file``), which
:func:`run_verl <internal/verl.sh>` points at ``RUN_DIR/metrics.jsonl`` (``{"step": N, "data": {...}}``
per line); a run without it (``logger=["console"]`` only) is read from the console lines of
``RUN_DIR/train.log`` instead, and the report says which. Validation metrics (``val-*``) are split from
the training metrics as :func:`npu_rl.e2e.split_validation` does: step 0 is the validation before
training. A series the run did not log is left out and named in the report, never drawn as zeros.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from npu_rl.e2e import parse_metrics, split_validation, val_scores_of
from npu_rl.errors import NpuRlError, UsageError

METRICS_FILE = "metrics.jsonl"

#: verl's timed phases, in the order a step runs them (others it logs are appended in name order).
PHASES = (
    "gen",
    "reward",
    "old_log_prob",
    "ref",
    "values",
    "adv",
    "update_critic",
    "update_actor",
    "update_weights",
    "testing",
    "save_checkpoint",
)

#: (panel title, key pattern): a panel is drawn when the run logged a key the pattern matches.
FEATURE_PANELS = (
    ("SAM speculative decoding", re.compile(r"npu_rl/sam/(?!active$).+")),
    ("long-tail guard", re.compile(r"npu_rl/long_tail_guard/(cuts|cut_fraction)")),
    ("rollout rebalance", re.compile(r"rollout_rebalance/idle_fraction/(mean|max)")),
    ("length-aware resampler", re.compile(r"sampler/(batch_len_cv|batch_len_max_over_mean)")),
)


class ReportError(NpuRlError):
    """The run directory holds nothing to report on (the message names the file and the fix)."""


@dataclass
class Run:
    """What a run logged: training metrics and validation metrics per step."""

    run_dir: Path
    source: str  # "metrics.jsonl" or "train.log"
    steps: dict[int, dict[str, float]]
    val: dict[int, dict[str, float]] = field(default_factory=dict)

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """(steps, values) of the training metric ``key``, in step order; only the steps that logged it."""
        pts = [(s, m[key]) for s, m in sorted(self.steps.items()) if key in m and math.isfinite(m[key])]
        return [s for s, _ in pts], [v for _, v in pts]

    def keys(self) -> set[str]:
        return {k for m in self.steps.values() for k in m}

    def val_scores(self) -> list[tuple[int, float]]:
        """(step, validation score): the mean over data sources of ``val-core/*/{acc,reward}/mean@N``."""
        return val_scores_of(self.val)


def _numeric(data: dict) -> dict[str, float]:
    out = {}
    for k, v in data.items():
        if isinstance(v, bool):
            out[k] = float(v)
        elif isinstance(v, int | float):
            out[k] = float(v)
    return out


def read_metrics_jsonl(path: Path) -> dict[int, dict[str, float]]:
    """verl's ``file`` tracker output -> {step: {key: value}} (numeric values; later lines of a step
    add to and override earlier ones, as a tracker's view of the step would).

    Raises:
        ReportError: a line that is not a JSON object with ``step`` and ``data`` (names the line).
    """
    steps: dict[int, dict[str, float]] = {}
    lines = path.read_text(encoding="utf-8").splitlines()
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            step, data = int(rec["step"]), rec["data"]
        except (ValueError, KeyError, TypeError) as e:
            if n == len(lines):
                break  # the last line of a run that was killed while writing it
            raise ReportError(f"{path}:{n}: not a verl file-tracker line ({e}): {line[:120]!r}") from e
        steps.setdefault(step, {}).update(_numeric(data))
    return steps


def load(run_dir: Path) -> Run:
    """Read a run directory: ``metrics.jsonl`` when the run wrote one, else ``train.log``'s console lines.

    Raises:
        ReportError: ``run_dir`` is not a directory, holds neither file, or no step was logged.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ReportError(f"{run_dir}: no such run directory (the launcher prints it as 'logs in ...')")
    jsonl, log = run_dir / METRICS_FILE, run_dir / "train.log"
    if jsonl.is_file() and jsonl.stat().st_size:
        raw, source = read_metrics_jsonl(jsonl), METRICS_FILE
    elif log.is_file():
        raw, source = parse_metrics(log.read_text(encoding="utf-8", errors="replace").splitlines()), "train.log"
    else:
        raise ReportError(
            f"{run_dir}: neither {METRICS_FILE} (verl's file tracker) nor train.log: "
            "give the directory the launcher made for the run (RUN_DIR = LOG_DIR/<time>-<recipe>)"
        )
    steps, val = split_validation(raw)
    if not steps:
        raise ReportError(f"{run_dir / source}: no training step was logged (did the run reach step 1?)")
    return Run(run_dir, source, steps, val)


def phase_seconds(run: Run) -> dict[str, list[float]]:
    """{phase: seconds per training step} for every ``timing_s/<phase>`` the run logged (0 where a
    step did not run the phase, e.g. ``testing``), plus ``other``: the step's time outside them."""
    keys = run.keys()
    logged = [p for p in PHASES if f"timing_s/{p}" in keys]
    logged += sorted({k[len("timing_s/") :] for k in keys if k.startswith("timing_s/")} - set(logged) - {"step"})
    out = {p: [m.get(f"timing_s/{p}", 0.0) for _, m in sorted(run.steps.items())] for p in logged}
    if "timing_s/step" in keys:
        totals = [m.get("timing_s/step", 0.0) for _, m in sorted(run.steps.items())]
        out["other"] = [max(0.0, t - sum(out[p][i] for p in logged)) for i, t in enumerate(totals)]
    return out


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt, fig, out: Path) -> None:
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def plot_learning(run: Run, out: Path, chance: float | None) -> bool:
    xs, ys = run.series("critic/score/mean")
    val = run.val_scores()
    if not xs and not val:
        return False
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4))
    if xs:
        ax.plot(xs, ys, marker=".", label="training reward (critic/score/mean)")
    if val:
        ax.plot([s for s, _ in val], [v for _, v in val], marker="o", label="validation score")
    if chance is not None:
        ax.axhline(chance, color="grey", linestyle="--", label=f"chance ({chance:g})")
    ax.set_xlabel("training step")
    ax.set_ylabel("score")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    _save(plt, fig, out)
    return True


def plot_lengths(run: Run, out: Path) -> bool:
    series = {k: run.series(f"response_length/{k}") for k in ("mean", "min", "max")}
    if not any(xs for xs, _ in series.values()):
        return False
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, (xs, ys) in series.items():
        if xs:
            ax.plot(xs, ys, marker=".", label=f"response length {name}")
    xs, ys = run.series("response_length/clip_ratio")
    if xs:
        ax2 = ax.twinx()
        ax2.plot(xs, ys, color="grey", linestyle=":", label="clipped at the maximum (share)")
        ax2.set_ylim(0, 1.05)
        ax2.set_ylabel("share clipped")
        ax2.legend(loc="upper right")
    ax.set_xlabel("training step")
    ax.set_ylabel("tokens")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left")
    _save(plt, fig, out)
    return True


def plot_phases(run: Run, out: Path) -> bool:
    phases = phase_seconds(run)
    if not phases:
        return False
    plt = _plt()
    steps = sorted(run.steps)
    fig, ax = plt.subplots(figsize=(8, 4))
    bottom = [0.0] * len(steps)
    for name, vals in phases.items():
        ax.bar(steps, vals, bottom=bottom, label=name)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax.set_xlabel("training step")
    ax.set_ylabel("seconds")
    ax.legend(fontsize="small", ncol=2)
    ax.grid(alpha=0.3, axis="y")
    _save(plt, fig, out)
    return True


def plot_agreement(run: Run, out: Path) -> bool:
    kl_x, kl = run.series("rollout_corr/kl")
    diff_x, diff = run.series("actor/training/rollout_probs_diff_max")
    mv_x, mv = run.series("actor/ppo_kl")
    if not (kl_x or diff_x):
        return False
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4))
    tiny = 1e-12  # a log axis cannot show 0
    if kl_x:
        ax.plot(kl_x, [max(abs(v), tiny) for v in kl], marker=".", label="|rollout_corr/kl| (rollout vs actor)")
    if diff_x:
        ax.plot(diff_x, [max(v, tiny) for v in diff], marker=".", label="max |p_actor - p_rollout| (update pass)")
    if mv_x:
        ax.plot(mv_x, [max(abs(v), tiny) for v in mv], marker=".", label="actor/ppo_kl (one update's movement)")
    ax.set_yscale("log")
    ax.set_xlabel("training step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    _save(plt, fig, out)
    return True


def feature_series(run: Run) -> list[tuple[str, dict[str, tuple[list[int], list[float]]]]]:
    """[(panel title, {key: (steps, values)})] for each feature panel whose keys the run logged."""
    keys = run.keys()
    out = []
    for title, pattern in FEATURE_PANELS:
        found = sorted(k for k in keys if pattern.fullmatch(k))
        if found:
            out.append((title, {k: run.series(k) for k in found}))
    return out


def plot_features(run: Run, out: Path) -> bool:
    panels = feature_series(run)
    if not panels:
        return False
    plt = _plt()
    fig, axes = plt.subplots(len(panels), 1, figsize=(7, 2.6 * len(panels)), squeeze=False)
    for ax, (title, series) in zip(axes[:, 0], panels, strict=True):
        for key, (xs, ys) in series.items():
            ax.plot(xs, ys, marker=".", label=key)
        ax.set_title(title, fontsize="medium")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="x-small")
    axes[-1, 0].set_xlabel("training step")
    _save(plt, fig, out)
    return True


def _f(v: float) -> str:
    return f"{v:.3g}"


def render_markdown(run: Run, images: list[str], chance: float | None) -> str:
    """The report's text: what was learned, where the time went, whether the weights arrived, what
    each feature did, and the figures."""
    steps = sorted(run.steps)
    lines = [
        f"# Run report: {run.run_dir.name}",
        "",
        f"Read from `{run.source}` in `{run.run_dir}`: {len(steps)} training step(s), {steps[0]}..{steps[-1]}.",
        "",
        "## Learning",
        "",
    ]
    _, score = run.series("critic/score/mean")
    if score:
        first = score[:2]
        lines.append(
            f"- training reward (critic/score/mean): first step(s) {', '.join(map(_f, first))}, "
            f"last {_f(score[-1])}, best {_f(max(score))}" + (f"; chance {chance:g}" if chance is not None else "")
        )
    else:
        lines.append("- training reward: not logged (critic/score/mean absent)")
    val = run.val_scores()
    if val:
        lines.append("- validation score per step: " + ", ".join(f"{s}: {_f(v)}" for s, v in val))
    else:
        lines.append("- validation: none logged (trainer.test_freq and val_before_train off?)")
    _, pg = run.series("actor/pg_loss")
    if pg:
        lines.append(f"- actor/pg_loss non-zero at {sum(v != 0 for v in pg)}/{len(pg)} steps")
    lines += ["", "## Time per phase (seconds per training step)", ""]
    phases = phase_seconds(run)
    if phases:
        _, total = run.series("timing_s/step")
        mean_total = sum(total) / len(total) if total else sum(sum(v) for v in phases.values()) / len(steps)
        lines += ["| phase | mean s | max s | share |", "|---|---:|---:|---:|"]
        for name, vals in phases.items():
            mean = sum(vals) / len(vals)
            share = mean / mean_total if mean_total else 0.0
            lines.append(f"| {name} | {mean:.2f} | {max(vals):.2f} | {share:.0%} |")
        lines.append(f"| **step** | **{mean_total:.2f}** | | |")
    else:
        lines.append("No `timing_s/*` metric was logged.")
    lines += ["", "## Rollout vs actor", ""]
    _, kl = run.series("rollout_corr/kl")
    _, diff = run.series("actor/training/rollout_probs_diff_max")
    _, mv = run.series("actor/ppo_kl")
    if kl:
        lines.append(f"- largest |rollout_corr/kl| {_f(max(abs(v) for v in kl))} nats/token at {len(kl)} step(s)")
    if diff:
        lines.append(f"- largest max |p_actor - p_rollout| of the update pass {_f(max(diff))}")
    if mv:
        lines.append(f"- largest actor/ppo_kl (one update's movement) {_f(max(abs(v) for v in mv))}")
    if not (kl or diff):
        lines.append("- not logged (no rollout_corr/* and no rollout_probs_diff metrics)")
    lines += ["", "## Features", ""]
    active = sorted(k for k in run.keys() if k.startswith("npu_rl/") and k.endswith("/active"))
    for key in active:
        _, vals = run.series(key)
        name, ones = key[len("npu_rl/") : -len("/active")], sum(v == 1.0 for v in vals)
        lines.append(f"- {name}: active at {ones}/{len(steps)} steps")
    panels = feature_series(run)
    for title, series in panels:
        parts = []
        for key, (_, ys) in series.items():
            parts.append(f"{key} first {_f(ys[0])}, last {_f(ys[-1])}, mean {_f(sum(ys) / len(ys))}")
        lines.append(f"- {title}: " + "; ".join(parts))
    if not active and not panels:
        lines.append("- no feature metric was logged")
    lines += ["", "## Figures", ""]
    lines += [f"![{name}]({name})" for name in images]
    return "\n".join(lines) + "\n"


def write_report(run_dir: Path, out: Path | None = None, chance: float | None = None) -> Path:
    """Write ``report.md`` and the PNGs of a run into ``out`` (default ``RUN_DIR/report``); returns
    the path of ``report.md``.

    Raises:
        ReportError: see :func:`load`.
    """
    run = load(Path(run_dir))
    out = Path(out) if out is not None else run.run_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    images = []
    for name, draw in (
        ("learning.png", lambda p: plot_learning(run, p, chance)),
        ("lengths.png", lambda p: plot_lengths(run, p)),
        ("phases.png", lambda p: plot_phases(run, p)),
        ("agreement.png", lambda p: plot_agreement(run, p)),
        ("features.png", lambda p: plot_features(run, p)),
    ):
        if draw(out / name):
            images.append(name)
    md = out / "report.md"
    md.write_text(render_markdown(run, images, chance), encoding="utf-8")
    return md


def compare(runs: list[tuple[str, Run]], keys: list[str], out: Path) -> tuple[str, bool]:
    """Runs side by side, step by step: a markdown table per metric (a column per run, "-" where a run
    did not log the step) and, into ``out`` (a PNG), one panel per metric with a line per run.

    Returns (the tables, whether a figure was drawn: False when no run logged any of ``keys``).

    Raises:
        ReportError: a metric that none of the runs logged (names it and what each run logged of its prefix).
    """
    lines, drawn = [], []
    for key in keys:
        per_run = [(label, dict(zip(*run.series(key), strict=True))) for label, run in runs]
        if not any(vals for _, vals in per_run):
            prefix = key.rsplit("/", 1)[0] + "/"
            near = sorted({k for _, run in runs for k in run.keys() if k.startswith(prefix)})[:8]
            raise ReportError(f"no run logged {key} (keys under {prefix}: {', '.join(near) or 'none'})")
        steps = sorted({s for _, vals in per_run for s in vals})
        lines += [f"### {key}", "", "| step | " + " | ".join(label for label, _ in per_run) + " |"]
        lines.append("|---:|" + "---:|" * len(per_run))
        for step in steps:
            cells = [_f(vals[step]) if step in vals else "-" for _, vals in per_run]
            lines.append(f"| {step} | " + " | ".join(cells) + " |")
        lines.append("")
        drawn.append((key, per_run))
    plt = _plt()
    fig, axes = plt.subplots(len(drawn), 1, figsize=(7, 2.6 * len(drawn)), squeeze=False)
    for ax, (key, per_run) in zip(axes[:, 0], drawn, strict=True):
        for label, vals in per_run:
            xs = sorted(vals)
            ax.plot(xs, [vals[x] for x in xs], marker=".", label=label)
        ax.set_title(key, fontsize="medium")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="x-small")
    axes[-1, 0].set_xlabel("training step")
    _save(plt, fig, out)
    return "\n".join(lines), True


def _compare_main(a: argparse.Namespace) -> int:
    labels = a.label or [Path(d).name for d in a.compare]
    if len(labels) != len(a.compare):
        raise UsageError(f"--label given {len(labels)} time(s) for {len(a.compare)} run(s): one label per run")
    if not a.metric:
        raise UsageError("--compare needs --metric KEY (one or more training metrics, e.g. npu_rl/sam/acceptance)")
    runs = [(label, load(Path(d))) for label, d in zip(labels, a.compare, strict=True)]
    out = Path(a.out) if a.out else Path("compare.png")
    tables, _ = compare(runs, a.metric, out)
    print(tables)
    print(f"figure: {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m npu_rl.report", description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", type=Path, nargs="?", help="the run's directory (LOG_DIR/<time>-<recipe>)")
    p.add_argument(
        "--out",
        type=Path,
        help="where to write report.md and the PNGs (default RUN_DIR/report); with --compare, the PNG",
    )
    p.add_argument("--chance", type=float, help="the task's chance score, drawn on the learning curve")
    p.add_argument("--compare", nargs="+", metavar="RUN_DIR", help="runs to compare step by step (instead of RUN_DIR)")
    p.add_argument("--label", action="append", help="with --compare: a run's label, once per run in order")
    p.add_argument("--metric", nargs="+", help="with --compare: the training metrics to compare")
    a = p.parse_args(argv)
    try:
        if a.compare:
            return _compare_main(a)
        if a.run_dir is None:
            raise UsageError("give RUN_DIR (a run's report) or --compare RUN_DIR ... --metric KEY ...")
        if a.chance is not None and not 0 <= a.chance <= 1:
            raise UsageError(f"--chance {a.chance}: a score between 0 and 1")
        md = write_report(a.run_dir, a.out, a.chance)
    except NpuRlError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    print(f"report: {md}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
