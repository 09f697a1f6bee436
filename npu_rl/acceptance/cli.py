"""``bash tools/npu_acceptance.sh [--dry-run] [--quick] [--out DIR] [--only RUN,...]``, and
``... report OUT`` to rebuild the report of an output folder. docs/npu_acceptance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

from npu_rl import REPO_ROOT
from npu_rl.acceptance import facts as facts_mod
from npu_rl.acceptance import report as report_mod
from npu_rl.acceptance.plan import MODELS, Plan, build_plan, load_plan
from npu_rl.acceptance.runner import Interrupted, Signals, run_one
from npu_rl.errors import NpuRlError

EXIT_CODES = """exit codes:
  0   every run passed, no baseline outside its tolerance, nothing left running (--dry-run: every preflight passed)
  1   a run failed, a number is outside its tolerance, or a run left processes behind (stopped; named in the report)
  2   usage
  65  --dry-run: a preflight rejected a run (its errors are printed above)
  66  a model or data file the runs need is missing (the download command is printed)
  78  this node cannot run the suite: no NPU (the launcher's refusal and reason), or a wrong or missing CANN
  69/70/75  the launcher's: a Ray node or the port is busy / Ray failed / NPUs missing (the suite stops)
  130/143  interrupted: the running launcher stopped its recipe and Ray, leftovers were stopped, the report written
"""
# Launcher exit codes after which no later run can succeed either: the suite stops.
STOP_CODES = {
    2: "usage", 69: "Ray node or port busy", 70: "Ray failed", 75: "NPUs missing", 78: "bad topology / no NPU",
}  # fmt: skip
RUN_TIMEOUT_S = 3600.0


def log(msg: str) -> None:
    """One ``[npu-rl acceptance HH:MM:SS]`` line on stderr."""
    print(f"[npu-rl acceptance {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def build_parser() -> argparse.ArgumentParser:
    """The suite's options (``--help``)."""
    p = argparse.ArgumentParser(
        prog="tools/npu_acceptance.sh",
        description="The NPU acceptance suite: real recipes through ray_start_npu.sh on one node, every feature "
        "off and on, and a report (report.md, report.json, timeline.png) to attach to an issue.",
        epilog=EXIT_CODES + "\n  report OUT [--tolerances FILE]   rebuild the report of an output folder",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--dry-run", action="store_true", help="print the plan of every run (the launcher's --dry-run)")
    p.add_argument("--quick", action="store_true", help="2 steps per run, Qwen3-0.6B only, no npugraph_ex arm")
    p.add_argument("--out", type=Path, help="output folder (default: logs/acceptance-<time>)")
    p.add_argument("--only", help="comma-separated run names of the plan (pairs need both arms)")
    p.add_argument("--plan", type=Path, help="a plan.json to run instead of the built-in plan")
    p.add_argument("--tolerances", type=Path, default=report_mod.BASELINES, help="baselines file")
    p.add_argument("--run-timeout", type=float, default=RUN_TIMEOUT_S, help="seconds per run (default 3600)")
    return p


def select(plan: Plan, only: str | None) -> Plan:
    """The plan restricted to the runs named in ``only`` (and the pairs whose arms both remain).

    Raises:
        NpuRlError: a name the plan does not have (the known names are listed).
    """
    if not only:
        return plan
    names = [n.strip() for n in only.split(",") if n.strip()]
    known = [r.name for r in plan.runs]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise NpuRlError(f"--only {','.join(unknown)}: no such run; the plan has {', '.join(known)}")
    runs = tuple(r for r in plan.runs if r.name in names)
    pairs = tuple(p for p in plan.pairs if p.off in names and p.on in names)
    return Plan(runs, pairs, plan.not_planned)


def with_paths(plan: Plan, env: dict[str, str]) -> Plan:
    """Each run's MODEL_PATH (``$MODELS_DIR/<model>``, default ``~/models``) and DATA_DIR in its env."""
    models = Path(env.get("MODELS_DIR") or Path.home() / "models")
    data = env.get("DATA_DIR") or str(Path.home() / "data")
    runs = tuple(
        replace(r, env={**r.env, "MODEL_PATH": str(models / r.model), "DATA_DIR": data}) if r.model in MODELS else r
        for r in plan.runs
    )
    return Plan(runs, plan.pairs, plan.not_planned)


def missing_inputs(plan: Plan) -> list[str]:
    """Files the runs need that this node lacks, each with the command that fetches it."""
    from npu_rl.models import missing_files

    problems, seen = [], set()
    for r in plan.runs:
        if r.model not in MODELS or r.env["MODEL_PATH"] in seen:
            continue
        seen.add(r.env["MODEL_PATH"])
        model_dir = Path(r.env["MODEL_PATH"])
        gone = missing_files(model_dir)
        if gone:
            problems.append(
                f"{r.model} at {model_dir} (MODEL_PATH, from MODELS_DIR) lacks {', '.join(gone)}: "
                f"python -m npu_rl.models download {MODELS[r.model].hub_id} --dest {model_dir}. The weights are "
                "needed: these FSDP recipes cannot start from a random initialisation (NPU_RL_RANDOM_INIT acts on "
                "Megatron only)"
            )
    data = {Path(r.env["DATA_DIR"]) for r in plan.runs if "DATA_DIR" in r.env}
    for d in sorted(data):
        for split in ("train", "test"):
            f = d / "gsm8k" / f"{split}.parquet"
            if not f.is_file():
                fix = f"python -m npu_rl.data gsm8k --hub modelscope --split {split} --out {d}"
                problems.append(f"{f} is missing: {fix}")
    return problems


def npus_view(env: dict[str, str]) -> tuple[bool, str, int | None]:
    """The launcher's own view of this node's NPUs: (devices found, description, exit code if its
    topology is already refused)."""
    from npu_rl.launch.topology import resolve_topology

    try:
        topo = resolve_topology(env, dry_run=False)
    except NpuRlError as e:
        return False, f"refused by the launcher's topology check: {e}", e.exit_code
    return bool(topo.devices_found), f"{topo.npus_per_node} dies per node ({topo.npus_source})", None


def dry_run(plan: Plan, env: dict[str, str]) -> int:
    """The launcher's ``--dry-run`` of every run, then a table of the verdicts; exit 0 when all pass."""
    import subprocess

    from npu_rl.table import format_table

    found, npus, _ = npus_view(env)
    facts = facts_mod.collect(env, npus)
    print("acceptance suite: dry run (nothing is started)")
    print(f"node: NPUs {'found' if found else 'not found'}: {npus}; CANN {facts['cann']}; driver {facts['driver']}")
    installed = ", ".join(
        f"{name} {info['installed'] or 'not installed'}" + (f" (pinned {info['pinned']})" if info["pinned"] else "")
        for name, info in facts["packages"].items()
    )
    print(f"stack as installed: {installed}")
    print(f"patch series: {facts['patch_series']}")
    for line in facts["patch_status"]["output"]:
        print(f"  {line}")
    if found and (problem := facts_mod.cann_problem(facts["cann_version"])):
        print(f"note: the real run would stop here: {problem}")
    print(f"runs: {len(plan.runs)}; A/B pairs: {len(plan.pairs)}")
    for p in plan.pairs:
        print(f"  pair {p.feature}: A={p.off} B={p.on} ({p.switch}; steps compared: {p.steps})")
    for name, why in plan.not_planned:
        print(f"  not planned: {name}: {why}")
    rows, worst = [], 0
    for i, r in enumerate(plan.runs, 1):
        print(f"\n=== run {i}/{len(plan.runs)}: {r.name}: {r.what}", flush=True)
        switches = " ".join(f"{k}={v}" for k, v in sorted(r.env.items()))
        print(f"$ {switches} {' '.join(r.command(dry_run=True))}", flush=True)
        proc = subprocess.run(
            r.command(dry_run=True), cwd=REPO_ROOT, env={**env, **r.env}, stdin=subprocess.DEVNULL, check=False,
        )  # fmt: skip
        rows.append((r.name, proc.returncode, "passed" if proc.returncode == 0 else "REJECTED"))
        if proc.returncode and not worst:
            worst = proc.returncode
    print("\nplan of the acceptance suite:")
    print(format_table(("run", "exit", "preflight"), rows))
    print(f"{sum(rc == 0 for _, rc, _ in rows)}/{len(rows)} runs passed the preflight")
    return worst


def real_run(plan: Plan, env: dict[str, str], out: Path, tolerances: Path, run_timeout: float) -> int:
    """Gate, facts, every run, the report. Returns the suite's exit code (:data:`EXIT_CODES`)."""
    allow = env.get("NPU_RL_ALLOW_NO_NPU") == "1"
    found, npus, topo_rc = npus_view(env)
    if topo_rc is not None:
        log(npus)
        return topo_rc
    out.mkdir(parents=True, exist_ok=True)
    (out / "plan.json").write_text(plan.to_json() + "\n")
    if not found and not allow:
        # The launcher decides: on a node without NPUs it refuses a real run before starting anything.
        first = plan.runs[0]
        log(f"no NPU found ({npus}); the launcher's verdict on the first run:")
        res = run_one(first, out, env, log, run_timeout)
        if res.exit_code != 0:
            log(f"refused: ray_start_npu.sh exited {res.exit_code} ({_reason(out / 'runs' / first.name)}); nothing ran")
            return res.exit_code
        done = {first.name}
    else:
        done = set()
    facts = facts_mod.collect(env, npus)
    (out / "facts.json").write_text(json.dumps(facts, indent=2) + "\n")
    if allow:
        log("NPU_RL_ALLOW_NO_NPU=1: CANN and model checks skipped (testing the suite; not an acceptance run)")
    elif not done:
        problem = facts_mod.cann_problem(facts["cann_version"])
        if problem:
            log(f"refused: {problem}")
            return 78
        missing = missing_inputs(plan)
        if missing:
            log("refused: files the runs need are missing (nothing was started):")
            for m in missing:
                log(f"  {m}")
            return 66
    code = 0
    try:
        with Signals(log):  # between runs too: a signal ends the suite with the report of what ran
            code = _run_all(plan, env, out, run_timeout, done)
    except Interrupted as e:
        code = 128 + e.signum
        log("interrupted: the report covers the runs that finished")
    rep = report_mod.write(out, tolerances)
    log(f"report: {out / 'report.md'} ({out / 'report.json'}, {out / 'timeline.png'})")
    v = rep["verdict"]
    log(
        f"{v['runs_passed']} passed, {v['runs_failed']} failed, {v['runs_not_run']} not run; baselines outside: "
        f"{v['baselines_outside']}, unknown: {v['baselines_unknown']}; leftover processes: {v['leftover_processes']}"
    )
    if code:
        return code
    return 0 if v["ok"] else 1


def _run_all(plan: Plan, env: dict[str, str], out: Path, run_timeout: float, done: set[str]) -> int:
    """Every run not in ``done``, in order; a launcher refusal in :data:`STOP_CODES` stops (its code)."""
    for r in plan.runs:
        if r.name in done:
            continue
        res = run_one(r, out, env, log, run_timeout)
        left = f"; {len(res.leftovers)} leftover process(es) stopped" if res.leftovers else ""
        log(f"run {r.name}: exit {res.exit_code} in {res.wall_s:g} s{left}")
        if res.exit_code in STOP_CODES:
            why = _reason(out / "runs" / r.name)
            log(f"stopping the suite: the launcher refused ({STOP_CODES[res.exit_code]}): {why}")
            return res.exit_code
    return 0


def _reason(folder: Path) -> str:
    return report_mod.redact(report_mod._failure_reason(folder))


def main(argv: list[str] | None = None) -> int:
    """``tools/npu_acceptance.sh``: a dry run, a real run or ``report OUT``; returns the exit code."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["report"]:
        p = argparse.ArgumentParser(prog="tools/npu_acceptance.sh report", description="rebuild the report of OUT")
        p.add_argument("out", type=Path)
        p.add_argument("--tolerances", type=Path, default=report_mod.BASELINES)
        a = p.parse_args(argv[1:])
        try:
            rep = report_mod.write(a.out, a.tolerances)
        except NpuRlError as e:
            print(f"[npu-rl] error: {e}", file=sys.stderr)
            return 2
        print(f"{a.out / 'report.md'}: {'PASSED' if rep['verdict']['ok'] else 'FAILED'}")
        return 0 if rep["verdict"]["ok"] else 1
    a = build_parser().parse_args(argv)
    env = dict(os.environ)
    try:
        report_mod.load_baselines(a.tolerances)  # a broken tolerances file stops the suite before any run
        plan = load_plan(a.plan) if a.plan else build_plan(quick=a.quick, nnodes=int(env.get("NNODES", "1") or 1))
        plan = with_paths(select(plan, a.only), env)
    except (NpuRlError, ValueError) as e:
        print(f"[npu-rl] error: {e}", file=sys.stderr)
        return 2
    if not plan.runs:
        print("[npu-rl] error: the plan has no runs", file=sys.stderr)
        return 2
    if a.dry_run:
        return dry_run(plan, env)
    out = a.out or REPO_ROOT / "logs" / time.strftime("acceptance-%Y%m%d-%H%M%S")
    return real_run(plan, env, out.resolve(), a.tolerances, a.run_timeout)
