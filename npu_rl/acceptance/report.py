"""The acceptance report: ``report.json`` (every number), ``report.md`` (the tables, ready to paste)
and ``timeline.png`` (verl's phases of every step of every run), built from an output folder.

The folder is what :mod:`npu_rl.acceptance.runner` writes: ``plan.json``, ``facts.json`` and per
run ``runs/<name>/result.json`` (launcher exit code, seconds, leftover processes) next to the
launcher's run directory. Nothing in the report is copied from the environment except the facts
:mod:`npu_rl.acceptance.facts` collects; IPv4 addresses, the node's host names and the home folder
are replaced (``<ip>``, ``<host>``, ``~``) in every file written.
"""

from __future__ import annotations

import json
import math
import re
import tomllib
from pathlib import Path

from npu_rl.acceptance import logs
from npu_rl.acceptance.plan import Plan, load_plan
from npu_rl.errors import NpuRlError

BASELINES = Path(__file__).with_name("baselines.toml")
SCHEMA = 1
# What the report shows for each pair beyond time and throughput: summary keys, both arms.
EVIDENCE = {
    "SAM speculative decoding": ("spec_decode.mean_acceptance_length", "spec_decode.acceptance_rate"),
    "rollout rebalance": ("rebalance_idle_fraction",),
    "skip old-log-prob": ("old_log_prob_s",),
    "length-aware resampler": ("batch_len_cv",),
    "engine GC guard": ("engine_gc_announced",),
}
LABELS = {
    "spec_decode.mean_acceptance_length": "tokens per forward (vLLM's mean acceptance length)",
    "spec_decode.acceptance_rate": "draft acceptance rate",
    "rebalance_idle_fraction": "replica idle fraction",
    "old_log_prob_s": "old-log-prob s",
    "batch_len_cv": "sampler/batch_len_cv",
    "engine_gc_announced": "engine cores with the GC guard on",
}
METRICS = (
    "first_step.actor/entropy", "first_step.actor/grad_norm", "first_step.rollout_probs_diff_mean",
    "generate_s", "step_s", "tokens_per_s_per_die", "tokens_per_s_per_card", "peak_hbm_reserved_gib",
    "peak_hbm_allocated_gib",
)  # fmt: skip
_IPV4 = re.compile(r"(?<![\d.])(?:(?:25[0-5]|2[0-4]\d|1?\d?\d)\.){3}(?:25[0-5]|2[0-4]\d|1?\d?\d)(?![\d.])")


def get(summary: dict, dotted: str):
    """``summary["a"]["b"]`` for ``"a.b"`` (the first dot only splits: metric names hold slashes)."""
    head, _, rest = dotted.partition(".")
    value = summary.get(head)
    if rest:
        return value.get(rest) if isinstance(value, dict) else None
    return value


def load_baselines(path: Path = BASELINES) -> list[dict]:
    """The ``[[baseline]]`` entries of a tolerances file, validated.

    Raises:
        NpuRlError: not TOML, an unknown or missing key, an unknown metric, a ``value`` that is
            neither a number nor ``"unknown"``, or a negative tolerance; the message names the file,
            the entry and the key.
    """
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise NpuRlError(f"{path}: no such tolerances file") from None
    except tomllib.TOMLDecodeError as e:
        raise NpuRlError(f"{path}: not valid TOML ({e})") from None
    extra = set(data) - {"baseline"}
    if extra:
        raise NpuRlError(f"{path}: unknown top-level key(s) {sorted(extra)}; only [[baseline]] entries belong here")
    out = []
    for i, b in enumerate(data.get("baseline", []), 1):
        where = f"{path}: [[baseline]] #{i}"
        unknown = set(b) - {"run", "metric", "value", "rel_tol", "abs_tol", "source"}
        if unknown:
            keys = "run, metric, value, rel_tol, abs_tol, source"
            raise NpuRlError(f"{where}: unknown key(s) {sorted(unknown)} (keys: {keys})")
        for key in ("run", "metric", "value"):
            if key not in b:
                raise NpuRlError(f"{where}: missing key {key!r}")
        if b["metric"] not in METRICS:
            raise NpuRlError(f"{where}: metric = {b['metric']!r} is not one the report measures ({', '.join(METRICS)})")
        value = b["value"]
        if not (value == "unknown" or (isinstance(value, int | float) and not isinstance(value, bool))):
            raise NpuRlError(f'{where}: value = {value!r}: write a number, or "unknown" until one is measured')
        tols = {}
        for key in ("rel_tol", "abs_tol"):
            t = b.get(key, 0.0)
            if isinstance(t, bool) or not isinstance(t, int | float) or t < 0 or math.isnan(t):
                raise NpuRlError(f"{where}: {key} = {t!r} must be a number >= 0")
            tols[key] = float(t)
        out.append({"run": b["run"], "metric": b["metric"], "value": value, **tols, "source": b.get("source", "")})
    return out


def compare(measured: float | None, baseline: dict) -> dict:
    """One tolerance check: status ``within``, ``outside``, ``unknown`` (no baseline) or ``not measured``."""
    row = {"run": baseline["run"], "metric": baseline["metric"], "measured": measured, "value": baseline["value"],
           "bound": None, "source": baseline["source"]}  # fmt: skip
    if measured is None:
        return {**row, "status": "not measured"}
    if baseline["value"] == "unknown":
        return {**row, "status": "unknown"}
    value = float(baseline["value"])
    bound = max(baseline["abs_tol"], baseline["rel_tol"] * abs(value))
    return {**row, "bound": bound, "status": "within" if abs(measured - value) <= bound else "outside"}


def _pct(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or a == 0:
        return None
    return (b - a) / a * 100.0


def _failure_reason(run_out: Path) -> str:
    """The launcher's last error or refusal line in ``launcher.out`` (its own and the preflight's)."""
    path = run_out / "launcher.out"
    if not path.is_file():
        return "no launcher output"
    lines = path.read_text(errors="replace").splitlines()
    for pattern in (r"\berror: ", r"preflight: REJECTED", r"exited with"):
        hits = [ln.strip() for ln in lines if re.search(pattern, ln)]
        if hits:
            return hits[-1][:400]
    return lines[-1].strip()[:400] if lines else "no launcher output"


def build(out: Path, baselines_path: Path = BASELINES, plan: Plan | None = None) -> dict:
    """The report's data (``report.json``) from an output folder.

    Raises:
        NpuRlError: ``out/plan.json`` is missing or malformed, or the tolerances file is invalid.
    """
    plan = plan or load_plan(out / "plan.json")
    baselines = load_baselines(baselines_path)
    facts_path = out / "facts.json"
    facts = json.loads(facts_path.read_text()) if facts_path.is_file() else {}
    runs, data = [], {}
    for r in plan.runs:
        run_out = out / "runs" / r.name
        result_path = run_out / "result.json"
        result = json.loads(result_path.read_text()) if result_path.is_file() else None
        entry = {"name": r.name, "what": r.what, "recipe": r.recipe, "model": r.model,
                 "switches": {**r.env}, "overrides": list(r.overrides)}  # fmt: skip
        if result is None:
            runs.append({**entry, "status": "not run"})
            continue
        entry.update({"exit_code": result.get("exit_code"), "wall_s": result.get("wall_s"),
                      "leftovers": result.get("leftovers", [])})  # fmt: skip
        run_dir = logs.find_run_dir(run_out)
        if run_dir is None or not (run_dir / "train.log").is_file():
            runs.append({**entry, "status": "failed", "reason": _failure_reason(run_out)})
            continue
        parsed = logs.read_run(run_dir)
        data[r.name] = parsed
        env = logs.e2e.parse_env(run_dir / "env.txt")
        dies = _dies(env)
        status = "passed" if result.get("exit_code") == 0 and parsed["summary"]["steps"] > 0 else "failed"
        entry.update({"status": status, "dies": dies, "summary": parsed["summary"], "timeline": parsed["timeline"]})
        if status == "failed":
            entry["reason"] = _failure_reason(run_out)
        runs.append(entry)
    pairs = []
    for p in plan.pairs:
        row = {"feature": p.feature, "switch": p.switch, "off": p.off, "on": p.on, "steps": p.steps}
        if p.off not in data or p.on not in data:
            missing = [n for n in (p.off, p.on) if n not in data]
            pairs.append({**row, "status": f"no data from {', '.join(missing)}"})
            continue
        a = logs.summarize(data[p.off]["steps"], "", p.steps)
        b = logs.summarize(data[p.on]["steps"], "", p.steps)
        ea, eb = data[p.off]["summary"], data[p.on]["summary"]
        values = {}
        for key in ("generate_s", "step_s", "tokens_per_s_per_die"):
            values[key] = {"off": a[key], "on": b[key], "change_pct": _pct(a[key], b[key])}
        evidence = {k: {"off": get(ea, k), "on": get(eb, k)} for k in EVIDENCE.get(p.feature, ())}
        pairs.append({**row, "status": "compared", "steps_off": a["steps_compared"], "steps_on": b["steps_compared"],
                      "values": values, "evidence": evidence})  # fmt: skip
    checks = []
    for bl in baselines:
        if bl["run"] in data:
            checks.append(compare(get(data[bl["run"]]["summary"], bl["metric"]), bl))
        elif any(r.name == bl["run"] for r in plan.runs):
            checks.append({**compare(None, bl), "status": "not measured"})
    leftovers = sum(len(r.get("leftovers", [])) for r in runs)
    verdict = {
        "runs_passed": sum(r["status"] == "passed" for r in runs),
        "runs_failed": sum(r["status"] == "failed" for r in runs),
        "runs_not_run": sum(r["status"] == "not run" for r in runs),
        "pairs_compared": sum(p["status"] == "compared" for p in pairs),
        "baselines_outside": sum(c["status"] == "outside" for c in checks),
        "baselines_unknown": sum(c["status"] == "unknown" for c in checks),
        "leftover_processes": leftovers,
    }
    verdict["ok"] = verdict["runs_failed"] == 0 and verdict["baselines_outside"] == 0 and leftovers == 0
    public_facts = {k: v for k, v in facts.items() if k != "private"}
    return {"schema": SCHEMA, "facts": public_facts, "runs": runs, "pairs": pairs, "baselines": checks,
            "not_planned": [list(x) for x in plan.not_planned], "verdict": verdict,
            "_private": facts.get("private", {})}  # fmt: skip


def _dies(env: dict[str, str]) -> int | None:
    try:
        return int(env.get("NNODES", "1")) * int(env["NPUS_PER_NODE"])
    except (KeyError, ValueError):
        return None


def fmt(x) -> str:
    """A number as the report prints it: 4 significant digits; ``–`` for none."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    if isinstance(x, int) and not isinstance(x, bool):
        return str(x)
    return f"{x:.4g}"


def fmt_pct(x: float | None) -> str:
    """A change in percent with its sign and one decimal (``+10.7%``); ``–`` for none."""
    return "–" if x is None else f"{x:+.1f}%"


def markdown(rep: dict) -> str:
    """``report.md``: verdict, environment, runs, A/B table, tolerances, what was not planned."""
    v = rep["verdict"]
    f = rep["facts"]
    out = ["# NPU acceptance report", ""]
    out.append(
        f"**{'PASSED' if v['ok'] else 'FAILED'}**: {v['runs_passed']} run(s) passed, {v['runs_failed']} failed, "
        f"{v['runs_not_run']} not run; {v['pairs_compared']} A/B pair(s) compared; baselines: "
        f"{v['baselines_outside']} outside tolerance, {v['baselines_unknown']} unknown (not reported yet); "
        f"leftover processes: {v['leftover_processes']}."
    )
    out += ["", "## Environment", "", "| fact | value |", "|---|---|"]
    for key in ("cann", "driver", "python", "platform", "npus"):
        if key in f:
            out.append(f"| {key} | {_cell(f[key])} |")
    for name, info in sorted(f.get("packages", {}).items()):
        pin = info.get("pinned")
        out.append(f"| {name} | {_cell(info.get('installed') or 'not installed')}"
                   f"{f' (pinned {pin})' if pin else ''} |")  # fmt: skip
    if f.get("npu_smi"):
        out += ["", "npu-smi:", "", "```", *f["npu_smi"], "```"]
    if f.get("patch_status", {}).get("output"):
        out += ["", "`bash apply_all_patches.sh --status`:", "", "```", *f["patch_status"]["output"], "```"]
    out += ["", "## Runs", "",
            "| run | what | status | wall s | dies | steps | generate s | step s | tokens/s per die "
            "| tokens/s per card | peak HBM reserved GiB | peak HBM allocated GiB |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rep["runs"]:
        s = r.get("summary") or {}
        status = r["status"] if r["status"] != "failed" else f"failed (exit {r.get('exit_code')})"
        out.append(
            f"| {r['name']} | {r['what']} | {status} | {fmt(r.get('wall_s'))} | {fmt(r.get('dies'))} "
            f"| {fmt(s.get('steps'))} "
            f"| {fmt(s.get('generate_s'))} | {fmt(s.get('step_s'))} | {fmt(s.get('tokens_per_s_per_die'))} "
            f"| {fmt(s.get('tokens_per_s_per_card'))} | {fmt(s.get('peak_hbm_reserved_gib'))} "
            f"| {fmt(s.get('peak_hbm_allocated_gib'))} |"
        )
    failed = [r for r in rep["runs"] if r.get("reason")]
    if failed:
        out += ["", "Why runs failed (the launcher's last error line):", ""]
        out += [f"- {r['name']}: `{r['reason']}`" for r in failed]
    out += ["", "wall s: the whole launcher run, start-up included. Means over the steps after the first "
            "(step 1 warms up); generate = verl's `timing_s/gen`; "
            "tokens/s per die = verl's `perf/throughput`; a card is 2 dies (Atlas A3); HBM from "
            "`actor/perf/max_memory_*_gb`."]  # fmt: skip
    out += ["", "## A/B: each feature off (A) and on (B)", "",
            "| feature | A | B | steps | generate s A | B | change | step s A | B | change | tokens/s per die A | B "
            "| change | evidence (A / B) |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for p in rep["pairs"]:
        if p["status"] != "compared":
            out.append(f"| {p['feature']} | {p['off']} | {p['on']} | {p['status']} |" + " |" * 10)
            continue
        vals = p["values"]
        cells = []
        for key in ("generate_s", "step_s", "tokens_per_s_per_die"):
            cells += [fmt(vals[key]["off"]), fmt(vals[key]["on"]), fmt_pct(vals[key]["change_pct"])]
        ev = "; ".join(f"{LABELS.get(k, k)}: {fmt(e['off'])} / {fmt(e['on'])}" for k, e in p["evidence"].items())
        ev = ev or "–"
        out.append(f"| {p['feature']} | {p['off']} | {p['on']} | {p['steps']} | " + " | ".join(cells) + f" | {ev} |")
    out += ["", "change = (B - A) / A. Same seeds and prompts in both arms; one switch differs (`plan.json`)."]
    out += ["", "## First step of every run", "",
            "| run | step | actor/entropy | actor/grad_norm | rollout-vs-actor prob. diff (mean) | from |",
            "|---|---|---|---|---|---|"]  # fmt: skip
    for r in rep["runs"]:
        fs = (r.get("summary") or {}).get("first_step")
        if fs:
            cells = [fmt(fs[k]) for k in ("step", "actor/entropy", "actor/grad_norm", "rollout_probs_diff_mean")]
            out.append(f"| {r['name']} | " + " | ".join(cells) + f" | `{fs['rollout_probs_diff_key'] or '–'}` |")
    out += ["", "## First steps against the baselines (`npu_rl/acceptance/baselines.toml`)", "",
            "| run | metric | measured | baseline | tolerance | status |", "|---|---|---|---|---|---|"]  # fmt: skip
    for c in rep["baselines"]:
        out.append(f"| {c['run']} | {c['metric']} | {fmt(c['measured'])} | {c['value']} | {fmt(c['bound'])} "
                   f"| {c['status']} |")  # fmt: skip
    if rep["not_planned"]:
        out += ["", "## Not planned on this node", ""]
        out += [f"- {name}: {why}" for name, why in rep["not_planned"]]
    out += ["", "## Rollout timeline", "", "![verl's phases per step](timeline.png)", ""]
    return "\n".join(out)


def _cell(x) -> str:
    return str(x).replace("|", "\\|").replace("\n", " ")


def plot_timeline(rep: dict, path: Path) -> bool:
    """``timeline.png``: one row per run, each step a bar split into verl's phases (seconds since its
    first step). Returns False (and writes nothing) when no run has step timings."""
    rows = [r for r in rep["runs"] if r.get("timeline")]
    if not rows:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [*logs.PHASES, "other"]
    colors = dict(zip(names, plt.get_cmap("tab10").colors, strict=False))
    fig, ax = plt.subplots(figsize=(11, 0.6 * len(rows) + 1.6))
    used = set()
    for y, r in enumerate(rows):
        for step in r["timeline"]:
            t = step["start_s"]
            for phase, dur in step["phases"]:
                ax.broken_barh([(t, dur)], (y - 0.35, 0.7), facecolors=colors[phase],
                               label=phase if phase not in used else None)  # fmt: skip
                used.add(phase)
                t += dur
            ax.vlines(step["start_s"], y - 0.45, y + 0.45, color="black", linewidth=1.0)
    ax.set_yticks(range(len(rows)), [r["name"] for r in rows])
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the first step began (verl's timing_s/*; black ticks: step starts)")
    ax.set_title("rollout timeline per step")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=5, fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def redact(text: str, hosts: list[str] | tuple[str, ...] = (), homes: list[str] | tuple[str, ...] = ()) -> str:
    """``text`` without IPv4 addresses, the given host names, and ``~`` for the home folders given and
    this process's own."""
    for h in sorted({h for h in hosts if h and len(h) >= 2}, key=len, reverse=True):
        text = re.sub(rf"(?<![\w.-]){re.escape(h)}(?![\w-])", "<host>", text)
    for home in sorted({*homes, str(Path.home())} - {"", "/"}, key=len, reverse=True):
        text = re.sub(rf"{re.escape(home.rstrip('/'))}(?=/|\b)", "~", text)
    return _IPV4.sub("<ip>", text)


def write(out: Path, baselines_path: Path = BASELINES) -> dict:
    """Build the report of ``out`` and write ``report.json``, ``report.md`` and ``timeline.png`` there.

    Returns the report's data (as written, redacted).
    """
    rep = build(out, baselines_path)
    private = rep.pop("_private", {})
    hosts, homes = private.get("hosts", []), [private["home"]] if private.get("home") else []
    has_png = plot_timeline(rep, out / "timeline.png")
    rep["timeline_png"] = "timeline.png" if has_png else None
    text = redact(json.dumps(rep, indent=2, default=str), hosts, homes)
    (out / "report.json").write_text(text + "\n")
    md = markdown(rep)
    if not has_png:
        md = md.replace("![verl's phases per step](timeline.png)", "no step timings in any run")
    (out / "report.md").write_text(redact(md, hosts, homes))
    return json.loads(text)
