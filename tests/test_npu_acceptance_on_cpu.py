"""The NPU acceptance suite (tools/npu_acceptance.sh, npu_rl.acceptance) on a machine without NPUs.

- the plan: A/B pairs differ in one switch, the launcher's dry run of real runs passes;
- the refusal: without --dry-run on a machine without NPUs, the launcher's exit code and reason;
- the report from the recorded logs in tests/data/acceptance/out: every number is compared with a
  value worked out by hand from the fixture's lines (the README there lists them), never with one
  the code under test computed;
- the cleanup: a real launcher with a real Ray head (NPU_RL_ALLOW_NO_NPU=1, as the launcher's own
  tests) runs a recipe that leaves a process behind; the suite stops it, after a normal end and after
  a SIGTERM in the middle of the run, and nothing the run started outlives the test.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from npu_rl import REPO_ROOT
from npu_rl.acceptance import facts, report
from npu_rl.acceptance.plan import build_plan
from npu_rl.errors import NpuRlError
from tests.procs import free_port

# Runs the launcher's head path, which refuses to start beside a Ray node of another test (serial group).
pytestmark = pytest.mark.serial

FIXTURE = REPO_ROOT / "tests" / "data" / "acceptance" / "out"
LEAKY = REPO_ROOT / "tests" / "data" / "acceptance" / "leaky_recipe.sh"
TOOL = REPO_ROOT / "tools" / "npu_acceptance.sh"


def _tool(*args, env=None, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(TOOL), *args], cwd=REPO_ROOT, env=env or dict(os.environ), stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout, check=False,
    )  # fmt: skip


# -- the plan -------------------------------------------------------------------------------------------


def _switches(run) -> set[str]:
    return set(run.overrides) | {f"{k}={v}" for k, v in run.env.items()}


def test_every_pair_differs_in_exactly_its_switch():
    for quick in (False, True):
        plan = build_plan(quick=quick)
        assert len({r.name for r in plan.runs}) == len(plan.runs)
        for p in plan.pairs:
            a, b = _switches(plan.run(p.off)), _switches(plan.run(p.on))
            only_a = {s for s in a - b if not s.startswith("trainer.experiment_name=")}
            only_b = {s for s in b - a if not s.startswith("trainer.experiment_name=")}
            keys = {s.split("=", 1)[0].lstrip("+") for s in only_a | only_b}
            # one switch: one key with its A and/or B value, or (SAM) the keys of one config section
            assert keys and len(only_a | only_b) <= max(2, len(keys)), (p.feature, only_a, only_b)
            assert len({k.rpartition(".")[0] for k in keys}) == 1, (p.feature, keys)
            assert len(keys) == 1 or p.feature == "SAM speculative decoding", (p.feature, keys)
    full = build_plan()
    assert [p.feature for p in full.pairs] == [
        "graph mode (ACL graphs)", "npugraph_ex", "SAM speculative decoding", "rollout rebalance", "engine GC guard",
        "length-aware resampler", "skip old-log-prob", "graph mode (ACL graphs), Qwen3-8B",
    ]  # fmt: skip
    assert full.not_planned and full.not_planned[0][0] == "all-to-all-v MoE reshard"
    assert "Qwen3-8B" not in {r.model for r in build_plan(quick=True).runs}
    # the resampler's two arms both run two epochs of the same prompts
    resampler = build_plan(quick=True).run("0.6b-2ep-resampler")
    assert {"trainer.total_epochs=2", "data.train_max_samples=64", "data.dataloader_num_workers=0"} <= set(
        resampler.overrides
    )


@pytest.fixture(scope="module")
def dry_run() -> subprocess.CompletedProcess:
    """One dry run of two real runs of the plan (each is the launcher's --dry-run: ~15 s here)."""
    return _tool("--dry-run", "--only", "0.6b-base,0.6b-gc-off", timeout=240)


def test_dry_run_prints_each_runs_preflight_plan_and_exits_0(dry_run):
    out = dry_run.stdout
    assert dry_run.returncode == 0, out[-3000:]
    assert "acceptance suite: dry run (nothing is started)" in out
    assert "stack as installed: torch " in out and "verl 0.9.1 (pinned 0.9.1)" in out
    assert "patch series: apply_all_patches.sh --status exited " in out
    assert "pair engine GC guard: A=0.6b-gc-off B=0.6b-base" in out
    assert "=== run 1/2: 0.6b-base" in out and "=== run 2/2: 0.6b-gc-off" in out
    assert out.count("preflight of /") == 2 and out.count("preflight: ok") == 2  # the launcher's preflight plans
    assert out.count("dry run: the preflight passed (exit 0)") == 2
    # the plan's settings reached the preflight: 2 steps of 64 prompts, features as switched
    assert "batch           64 prompts x n 4 = 256 trajectories/step" in out
    base, gc_off = out.split("=== run 2/2")
    assert "features on     no GC pauses in decode steps, rollout progress" in base
    assert "no GC pauses" not in gc_off.split("features on", 1)[1].splitlines()[0]
    assert "NPU_RL_ENGINE_GC=0" in gc_off
    assert "2/2 runs passed the preflight" in out


def test_dry_run_refuses_an_unknown_run_name():
    r = _tool("--dry-run", "--only", "0.6b-nope")
    assert r.returncode == 2
    assert "--only 0.6b-nope: no such run; the plan has 0.6b-base, 0.6b-eager" in r.stdout


def test_without_dry_run_a_machine_without_npus_is_refused_with_the_launchers_code_and_reason(tmp_path):
    assert not list(Path("/dev").glob("davinci[0-9]*")) and not shutil.which("npu-smi"), "this test needs no NPU"
    env = {k: v for k, v in os.environ.items() if k != "NPU_RL_ALLOW_NO_NPU"}
    r = _tool("--quick", "--out", str(tmp_path / "out"), env=env, timeout=120)
    assert r.returncode == 78, r.stdout
    assert "error: this node has no NPU (no /dev/davinci<N>, no npu-smi): a real run cannot train here" in r.stdout
    assert "refused: ray_start_npu.sh exited 78" in r.stdout and "nothing ran" in r.stdout
    result = json.loads((tmp_path / "out" / "runs" / "0.6b-base" / "result.json").read_text())
    assert result["exit_code"] == 78 and result["leftovers"] == []
    assert not list((tmp_path / "out" / "runs" / "0.6b-base").glob("*/train.log"))  # nothing started


# -- the report from recorded logs ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("report") / "out"
    shutil.copytree(FIXTURE, out)
    r = _tool("report", str(out))
    assert r.returncode == 1, r.stdout  # the fixture has a failed run and a leftover process
    assert "report.md: FAILED" in r.stdout
    return out, json.loads((out / "report.json").read_text())


def _run(rep, name):
    return next(r for r in rep["runs"] if r["name"] == name)


def test_report_run_numbers_are_the_logs(built):
    _, rep = built
    base = _run(rep, "0.6b-base")["summary"]
    # steps 2 and 3 of runs/0.6b-base/*/train.log (step 1 warms up)
    assert base["steps"] == 3 and base["steps_compared"] == [2, 3]
    assert base["generate_s"] == pytest.approx((20.0 + 22.0) / 2)
    assert base["step_s"] == pytest.approx((50.0 + 52.0) / 2)
    assert base["old_log_prob_s"] == pytest.approx(5.0)
    assert base["update_weights_s"] == pytest.approx((2.5 + 2.0) / 2)
    assert base["tokens_per_s_per_die"] == pytest.approx((220.0 + 210.0) / 2)
    assert base["tokens_per_s_per_card"] == pytest.approx(215.0 * 2)
    assert base["peak_hbm_reserved_gib"] == pytest.approx(25.5)  # max of 24.0, 25.5, 25.0 (every step)
    assert base["peak_hbm_allocated_gib"] == pytest.approx(21.0)  # max of 20.5, 21.0, 20.8
    assert base["first_step"] == {
        "step": 1, "actor/entropy": 0.62, "actor/grad_norm": 0.21, "rollout_probs_diff_mean": 0.0012,
        "rollout_probs_diff_key": "training/rollout_probs_diff_mean",
    }  # fmt: skip
    assert base["engine_gc_announced"] == 2 and base["spec_decode"] is None
    assert _run(rep, "0.6b-base")["dies"] == 16
    sam = _run(rep, "0.6b-sam")["summary"]
    assert sam["generate_s"] == pytest.approx((15.0 + 17.0) / 2)
    assert sam["step_s"] == pytest.approx((45.0 + 47.0) / 2)
    assert sam["tokens_per_s_per_die"] == pytest.approx((240.0 + 236.0) / 2)
    assert sam["peak_hbm_reserved_gib"] == pytest.approx(26.0)
    # the three SpecDecoding lines: accepted 5124 + 6000 + 2100, drafted 11735 + 12000 + 6000
    spec = sam["spec_decode"]
    assert (spec["lines"], spec["accepted"], spec["drafted"]) == (3, 13224, 29735)
    assert spec["acceptance_rate"] == pytest.approx(13224 / 29735)
    assert spec["mean_acceptance_length"] == pytest.approx((2.31 * 11735 + 2.50 * 12000 + 2.05 * 6000) / 29735)
    gc_off = _run(rep, "0.6b-gc-off")
    assert gc_off["summary"]["generate_s"] == pytest.approx((21.5 + 22.5) / 2)
    assert gc_off["summary"]["tokens_per_s_per_die"] == pytest.approx((214.0 + 208.0) / 2)
    assert gc_off["summary"]["engine_gc_announced"] == 0
    assert gc_off["leftovers"] == ["pid 6161: VLLM::EngineCore"]
    assert [_run(rep, n)["wall_s"] for n in ("0.6b-base", "0.6b-sam", "0.6b-gc-off", "0.6b-eager")] == [
        412.3,
        398.0,
        420.9,
        15.2,
    ]
    eager = _run(rep, "0.6b-eager")
    assert eager["status"] == "failed" and eager["exit_code"] == 65 and "summary" not in eager
    assert eager["reason"].startswith("error: actor_rollout_ref.model.path: ~/models/Qwen3-0.6B is incomplete")


def test_report_ab_table_is_the_logs(built):
    out, rep = built
    pairs = {p["feature"]: p for p in rep["pairs"]}
    assert pairs["graph mode (ACL graphs)"]["status"] == "no data from 0.6b-eager"
    sam = pairs["SAM speculative decoding"]
    assert sam["status"] == "compared" and sam["steps_off"] == sam["steps_on"] == [2, 3]
    assert sam["values"]["generate_s"] == pytest.approx({"off": 21.0, "on": 16.0, "change_pct": (16 - 21) / 21 * 100})
    assert sam["values"]["step_s"] == pytest.approx({"off": 51.0, "on": 46.0, "change_pct": (46 - 51) / 51 * 100})
    assert sam["values"]["tokens_per_s_per_die"] == pytest.approx(
        {"off": 215.0, "on": 238.0, "change_pct": (238 - 215) / 215 * 100}
    )
    gc = pairs["engine GC guard"]
    assert gc["values"]["generate_s"] == pytest.approx({"off": 22.0, "on": 21.0, "change_pct": (21 - 22) / 22 * 100})
    assert gc["values"]["tokens_per_s_per_die"] == pytest.approx(
        {"off": 211.0, "on": 215.0, "change_pct": (215 - 211) / 211 * 100}
    )
    assert gc["evidence"] == {"engine_gc_announced": {"off": 0, "on": 2}}
    md = (out / "report.md").read_text()
    # the same numbers in the Markdown, as printed by hand: 4 significant digits, changes to 0.1 %
    assert "| SAM speculative decoding | 0.6b-base | 0.6b-sam | after-first | 21 | 16 | -23.8% | 51 | 46 | -9.8% " \
        "| 215 | 238 | +10.7% | tokens per forward (vLLM's mean acceptance length): – / 2.334; " \
        "draft acceptance rate: – / 0.4447 |" in md  # fmt: skip
    assert "| engine GC guard | 0.6b-gc-off | 0.6b-base | after-first | 22 | 21 | -4.5% | 52 | 51 | -1.9% | 211 " \
        "| 215 | +1.9% | engine cores with the GC guard on: 0 / 2 |" in md  # fmt: skip
    assert "| 0.6b-base | the shipped recipe | passed | 412.3 | 16 | 3 | 21 | 51 | 215 | 430 | 25.5 | 21 |" in md
    assert (
        "| 0.6b-sam | SAM speculative decoding, 3 draft tokens | passed | 398 | 16 | 3 | 16 | 46 | 238 | 476 | 26 "
        "| 21.2 |" in md
    )
    assert "| 0.6b-eager | eager rollout (no ACL graphs) | failed (exit 65) | 15.2 | – |" in md
    # the node's facts as recorded in facts.json, the patch series table included
    assert "| vllm_ascend | 0.23.0.post1 (pinned 0.23.0.post1) |" in md
    assert (
        "verl           0.9.1         pypi verl-0.9.1.tar.gz                ok        8/8      ba605f9ac9cd7ee7" in md
    )
    assert "| 0.6b-base | 1 | 0.62 | 0.21 | 0.0012 | `training/rollout_probs_diff_mean` |" in md
    assert "| 0.6b-base | first_step.actor/entropy | 0.62 | unknown | – | unknown |" in md


def test_report_verdict_timeline_png_and_redaction(built):
    out, rep = built
    assert rep["verdict"] == {
        "runs_passed": 3, "runs_failed": 1, "runs_not_run": 0, "pairs_compared": 2, "baselines_outside": 0,
        "baselines_unknown": 6, "leftover_processes": 1, "ok": False,
    }  # fmt: skip
    # timeline: steps back to back (64 s, 50 s, 52 s), verl's phases in order, "other" = the rest
    tl = _run(rep, "0.6b-base")["timeline"]
    assert [s["start_s"] for s in tl] == [0.0, 64.0, 114.0]
    assert tl[0]["phases"] == [
        ["gen", 30.0], ["old_log_prob", 6.0], ["adv", 0.5], ["update_actor", 20.0], ["update_weights", 3.5],
        ["other", 64.0 - (30.0 + 6.0 + 0.5 + 20.0 + 3.5)],
    ]  # fmt: skip
    png = (out / "timeline.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", png[16:24])
    assert (width, height) == (1100, int((0.6 * 3 + 1.6) * 100))  # 11 in x (0.6 per run + 1.6) in at 100 dpi
    assert (
        rep["timeline_png"] == "timeline.png"
        and "![verl's phases per step](timeline.png)" in (out / "report.md").read_text()
    )
    for name in ("report.md", "report.json"):
        text = (out / name).read_text()
        for secret in ("10.20.30.40", "node-a3-07", "/home/alice", '"private"'):
            assert secret not in text, (name, secret)
    line = (FIXTURE / "runs/0.6b-base/20261201-140000-grpo_gsm8k_smoke/launcher.log").read_text()
    assert report.redact(line, ["node-a3-07"]) == (
        "[npu-rl 14:00:00] head node <ip> (enp189s0f0); job: 1 node(s) x 16 NPU (/dev/davinci*) = 16 dies, "
        "head <ip>:6379\n"
    )
    assert report.redact("ssh node-a3-07.cluster and node-a3-07: cann 9.1.0, torch 2.10.0.post4", ["node-a3-07"]) == (
        "ssh <host>.cluster and <host>: cann 9.1.0, torch 2.10.0.post4"
    )


def test_tolerances_compare_when_a_baseline_exists(tmp_path):
    out = tmp_path / "out"
    shutil.copytree(FIXTURE, out)
    tol = tmp_path / "baselines.toml"
    tol.write_text(
        '[[baseline]]\nrun = "0.6b-base"\nmetric = "first_step.actor/entropy"\nvalue = 0.60\nrel_tol = 0.05\n'
        '[[baseline]]\nrun = "0.6b-base"\nmetric = "first_step.actor/grad_norm"\nvalue = 0.10\nrel_tol = 0.5\n'
        '[[baseline]]\nrun = "0.6b-base"\nmetric = "generate_s"\nvalue = 20\nrel_tol = 0.1\n'
        '[[baseline]]\nrun = "0.6b-sam"\nmetric = "first_step.rollout_probs_diff_mean"\nvalue = 0.001\n'
        "rel_tol = 0.1\nabs_tol = 0.0005\n"
    )
    rep = report.write(out, tol)
    rows = {(c["run"], c["metric"]): c for c in rep["baselines"]}
    entropy = rows[("0.6b-base", "first_step.actor/entropy")]  # |0.62 - 0.60| = 0.02 <= 0.05 x 0.60 = 0.03
    assert (entropy["status"], entropy["bound"]) == ("within", pytest.approx(0.03))
    grad = rows[("0.6b-base", "first_step.actor/grad_norm")]  # |0.21 - 0.10| = 0.11 > 0.5 x 0.10 = 0.05
    assert (grad["status"], grad["bound"]) == ("outside", pytest.approx(0.05))
    gen = rows[("0.6b-base", "generate_s")]  # |21 - 20| = 1 <= 2
    assert (gen["status"], gen["bound"]) == ("within", pytest.approx(2.0))
    diff = rows[("0.6b-sam", "first_step.rollout_probs_diff_mean")]  # |0.0012 - 0.001| <= max(0.0005, 0.0001)
    assert (diff["status"], diff["bound"]) == ("within", pytest.approx(0.0005))
    assert rep["verdict"]["baselines_outside"] == 1 and rep["verdict"]["baselines_unknown"] == 0
    assert "| 0.6b-base | first_step.actor/grad_norm | 0.21 | 0.1 | 0.05 | outside |" in (out / "report.md").read_text()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '[[baseline]]\nrun = "x"\nmetric = "generate_s"\nvalue = "soon"\n',
            "value = 'soon': write a number, or \"unknown\"",
        ),
        ('[[baseline]]\nrun = "x"\nmetric = "gen_s"\nvalue = 1\n', "metric = 'gen_s' is not one the report measures"),
        ('[[baseline]]\nrun = "x"\nmetric = "step_s"\nvalue = 1\nrel_tol = -1\n', "rel_tol = -1 must be a number >= 0"),
        ('[[baseline]]\nrun = "x"\nvalue = 1\n', "missing key 'metric'"),
        ('[[baseline]]\nrun = "x"\nmetric = "step_s"\nvalue = 1\ntol = 1\n', "unknown key(s) ['tol']"),
        ("[[baseline]\n", "not valid TOML"),
    ],
)
def test_a_bad_tolerances_file_names_the_file_entry_and_key(tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(NpuRlError) as e:
        report.load_baselines(path)
    assert str(path) in str(e.value) and message in str(e.value)


def test_the_shipped_tolerances_are_valid_and_unknown_until_reported():
    rows = report.load_baselines()
    assert rows and {r["value"] for r in rows} == {"unknown"}
    assert {r["run"] for r in rows} == {"0.6b-base", "8b-base"}


def test_cann_is_read_from_the_toolkit_and_a_wrong_one_refused(tmp_path):
    info = tmp_path / "ascend-toolkit" / "latest" / "aarch64-linux" / "ascend_toolkit_install.info"
    info.parent.mkdir(parents=True)
    info.write_text("package_name=Ascend-cann-toolkit\nversion=8.3.RC1\narch=aarch64\n")
    version, source = facts.cann_version({}, root=tmp_path)
    assert (version, source) == ("8.3.RC1", str(info))
    problem = facts.cann_problem(version)
    assert "CANN 8.3.RC1 is installed" in problem and "needs CANN 9.1" in problem
    assert facts.cann_problem("9.1.0") is None
    assert "CANN was not found" in facts.cann_problem(facts.cann_version({}, root=tmp_path / "none")[0])


# -- no process left behind -----------------------------------------------------------------------------


def _started_by(log_dir: Path, ray_tmp: str) -> list[psutil.Process]:
    """Live processes of this test's runs: their environment names its LOG_DIR, or Ray's temp dir."""
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        try:
            if p.pid == os.getpid() or p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if str(log_dir) in p.environ().get("LOG_DIR", "") or any(ray_tmp in a for a in p.info["cmdline"] or []):
                found.append(p)
        except psutil.Error:
            continue
    return found


@pytest.fixture
def leaky(tmp_path):
    """A plan with one run of the leaky recipe, and the environment of a one-machine job on loopback."""
    ray_tmp = tempfile.mkdtemp(prefix="/tmp/nrla")  # short: Ray's socket paths must fit 107 bytes
    plan = {"runs": [{"name": "leaky", "what": "leaves a process behind", "recipe": str(LEAKY), "env_script": "",
                      "overrides": [], "env": {}, "model": None}], "pairs": []}  # fmt: skip
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "NPUS_PER_NODE": "4", "RAY_AUTH_MODE": "disabled",
        "NPU_RL_TRAIN_PYTHON": sys.executable, "NPU_RL_WORKER_POLL": "1", "NPU_RL_ALLOW_NO_NPU": "1",
        "RAY_START_ARGS": f"--temp-dir={ray_tmp} --num-cpus=1 --include-dashboard=false",
    }  # fmt: skip
    env.pop("RAY_ADDRESS", None)
    out = tmp_path / "out"
    yield env, out, ray_tmp
    left = _started_by(out, ray_tmp)
    for p in left:
        p.kill()
    shutil.rmtree(ray_tmp, ignore_errors=True)
    assert not left, f"processes left behind: {[(p.pid, p.info['cmdline']) for p in left]}"


def test_a_process_the_run_leaves_behind_is_stopped_and_reported(leaky, tmp_path):
    env, out, ray_tmp = leaky
    r = _tool("--plan", str(tmp_path / "plan.json"), "--out", str(out), env=env, timeout=240)
    assert r.returncode == 1, r.stdout[-4000:]  # the leftover makes the suite fail
    assert "stopping Ray" in r.stdout  # the launcher stopped its Ray head itself
    result = json.loads((out / "runs" / "leaky" / "result.json").read_text())
    assert result["exit_code"] == 0
    assert len(result["leftovers"]) == 1 and "VLLM::EngineCore 600" in result["leftovers"][0]
    assert not _started_by(out, ray_tmp)
    rep = json.loads((out / "report.json").read_text())
    assert rep["verdict"]["leftover_processes"] == 1 and rep["verdict"]["ok"] is False
    assert "leftover processes: 1" in (out / "report.md").read_text()


def test_sigterm_during_a_run_stops_the_launcher_ray_and_the_leftovers(leaky, tmp_path):
    env, out, ray_tmp = leaky
    log = tmp_path / "tool.log"  # a file, not a pipe nobody reads while the run starts: it cannot fill and block
    with log.open("w") as sink:
        proc = subprocess.Popen(
            ["bash", str(TOOL), "--plan", str(tmp_path / "plan.json"), "--out", str(out)], cwd=REPO_ROOT,
            env={**env, "TRAIN_SLEEP": "120"}, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        # A loaded 2-core CI machine took more than 120 s to bring Ray up and start the recipe (stop 43).
        deadline = time.monotonic() + 360
        while not list((out / "runs" / "leaky").glob("*/train.log")) or "left behind" not in "".join(
            p.read_text() for p in (out / "runs" / "leaky").glob("*/train.log")
        ):
            assert proc.poll() is None and time.monotonic() < deadline, "the run did not start"
            time.sleep(0.5)
        assert any("raylet" in " ".join(p.info["cmdline"] or []) for p in _started_by(out, ray_tmp)
                   if p.info.get("cmdline")), "Ray is not up"  # fmt: skip
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:  # the test failed early: let the tool stop what it started, then insist
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    stdout = log.read_text()
    assert proc.returncode == 128 + signal.SIGTERM, stdout[-4000:]
    assert time.monotonic() - started < 90
    assert "SIGTERM: stopping run leaky" in stdout, stdout[-4000:]
    assert "stopping Ray" in stdout
    result = json.loads((out / "runs" / "leaky" / "result.json").read_text())
    assert result["interrupted"] == signal.SIGTERM and len(result["leftovers"]) == 1
    assert not _started_by(out, ray_tmp)
    assert (out / "report.md").is_file()  # the report of what ran is still written
