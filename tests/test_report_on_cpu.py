"""python -m npu_rl.report (npu_rl.evidence.report): the run report from verl's own file tracker, or
from the console lines when a run has none (issue 34)."""

from __future__ import annotations

import pytest

from npu_rl import report as report_cli
from npu_rl.evidence import report

PNG = b"\x89PNG\r\n\x1a\n"
VAL = "val-core/npu_rl/toy_find_digit/acc/mean@1"


def _step_metrics(i: int) -> dict:
    return {
        "critic/score/mean": 0.1 * i,
        "response_length/mean": 1.0,
        "response_length/max": 1.0,
        "response_length/min": 1.0,
        "timing_s/gen": 8.0,
        "timing_s/update_actor": 2.0,
        "timing_s/step": 11.0,  # 1 s outside the timed phases
        "rollout_corr/kl": 1e-8 * i,
        "actor/ppo_kl": 0.05,
        "actor/pg_loss": -0.01 if i != 2 else 0.0,
        "npu_rl/rollout_rebalance/active": 1.0,
        "rollout_rebalance/idle_fraction/mean": 0.2,
        "rollout_rebalance/idle_fraction/max": 0.3,
        "training/global_step": i,
    }


@pytest.fixture
def tracked_run(tmp_path, monkeypatch):
    """A run directory whose metrics.jsonl verl's own FileLogger wrote, as the trainer logs: the
    validation before training at step 0, then steps 1-4 with a validation at step 4."""
    from verl.utils.tracking import FileLogger

    run = tmp_path / "20261205-000000-grpo_learn_cpu"
    run.mkdir()
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(run / "metrics.jsonl"))
    log = FileLogger("npu-rl-cpu", "qwen3-toy-grpo")
    log.log({VAL: 0.0}, step=0)
    for i in range(1, 5):
        log.log({**_step_metrics(i), **({VAL: 0.75} if i == 4 else {})}, step=i)
    log.finish()
    return run


def test_the_report_reads_verls_file_tracker_and_draws_each_figure(tracked_run):
    md = report.write_report(tracked_run, chance=0.125)
    assert md == tracked_run / "report" / "report.md"
    text = md.read_text()
    assert "Read from `metrics.jsonl`" in text and "4 training step(s), 1..4" in text
    assert "first step(s) 0.1, 0.2, last 0.4, best 0.4; chance 0.125" in text
    assert "validation score per step: 0: 0, 4: 0.75" in text  # step 0 is validation only
    assert "actor/pg_loss non-zero at 3/4 steps" in text
    assert "| gen | 8.00 | 8.00 | 73% |" in text  # 8 of 11 s
    assert "| other | 1.00 | 1.00 | 9% |" in text
    assert "| **step** | **11.00** | | |" in text
    assert "largest |rollout_corr/kl| 4e-08 nats/token at 4 step(s)" in text
    assert "- rollout_rebalance: active at 4/4 steps" in text
    assert "rollout_rebalance/idle_fraction/max first 0.3, last 0.3, mean 0.3" in text
    for name in ("learning.png", "lengths.png", "phases.png", "agreement.png", "features.png"):
        assert (tracked_run / "report" / name).read_bytes()[:8] == PNG, name
        assert f"![{name}]({name})" in text


def test_a_run_without_the_file_tracker_is_read_from_its_console_lines(tmp_path):
    """logger=["console"] only: the console lines of train.log; a series not logged is not drawn."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "train.log").write_text(
        "(TaskRunnerV1 pid=1) step:1 - critic/score/mean:0.1 - timing_s/gen:3.0 - timing_s/step:4.0\n"
        "(TaskRunnerV1 pid=1) step:2 - critic/score/mean:0.3 - timing_s/gen:5.0 - timing_s/step:6.0\n"
    )
    assert report_cli.main([str(run), "--out", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "report.md").read_text()
    assert "Read from `train.log`" in text and "2 training step(s)" in text
    assert "| gen | 4.00 | 5.00 | 80% |" in text
    assert "- not logged (no rollout_corr/* and no rollout_probs_diff metrics)" in text
    assert "validation: none logged" in text and "no feature metric was logged" in text
    drawn = sorted(p.name for p in (tmp_path / "out").glob("*.png"))
    assert drawn == ["learning.png", "phases.png"]


def test_bad_run_directories_are_named_with_the_fix(tmp_path, capsys):
    assert report_cli.main([str(tmp_path / "nope")]) == 1
    assert "no such run directory" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert report_cli.main([str(empty)]) == 1
    assert "neither metrics.jsonl (verl's file tracker) nor train.log" in capsys.readouterr().err
    (empty / "train.log").write_text("no step lines here\n")
    assert report_cli.main([str(empty)]) == 1
    assert "no training step was logged" in capsys.readouterr().err
    assert report_cli.main([str(empty), "--chance", "3"]) == 2
    assert "--chance 3.0: a score between 0 and 1" in capsys.readouterr().err


def test_a_torn_last_line_is_tolerated_and_a_bad_middle_line_is_named(tracked_run, capsys):
    path = tracked_run / "metrics.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines) + '\n{"step": 5, "da')  # killed while writing step 5
    assert sorted(report.load(tracked_run).steps) == [1, 2, 3, 4]
    lines[2] = "not json"
    path.write_text("\n".join(lines) + "\n")
    assert report_cli.main([str(tracked_run)]) == 1
    assert f"{path}:3: not a verl file-tracker line" in capsys.readouterr().err


def test_the_launcher_points_verls_file_tracker_into_each_nodes_run_directory(tmp_path):
    """Set before `ray start`, so the TaskRunner inherits it on whichever node it runs; a path the
    user exported wins."""
    from types import SimpleNamespace

    from npu_rl.launch.cli import Launcher

    def run_dir_env(env, is_head=True):
        launcher = Launcher(tmp_path / "grpo_x.sh", None, {"LOG_DIR": str(tmp_path / "logs"), **env})
        run = launcher.open_run_dir(SimpleNamespace(is_head=is_head, node_ip="192.0.2.7"))  # what it reads
        launcher.close()
        return run, launcher.env

    run, env = run_dir_env({})
    assert env["VERL_FILE_LOGGER_PATH"] == str(run / report.METRICS_FILE) and run.parent == tmp_path / "logs"
    run, env = run_dir_env({}, is_head=False)
    assert run.name.endswith("-grpo_x-192.0.2.7") and env["VERL_FILE_LOGGER_PATH"] == str(run / "metrics.jsonl")
    assert run_dir_env({"VERL_FILE_LOGGER_PATH": "/data/mine.jsonl"})[1]["VERL_FILE_LOGGER_PATH"] == "/data/mine.jsonl"


def test_a_dry_run_names_a_ray_node_that_stops_while_it_looks(tmp_path, monkeypatch):
    """The head's dry run names a Ray node already running here. It read the list twice, and a node
    that stopped in between (another job's, or a parallel test's) crashed the dry run with an
    IndexError; seen in a clean-clone CI. One read now."""
    from npu_rl.launch import cluster
    from npu_rl.launch.cli import Launcher

    reads = iter([["pid 7 (user u), GCS 192.0.2.7:6379"], []])
    monkeypatch.setattr(cluster, "running_raylets", lambda: next(reads))
    env = {"LOG_DIR": str(tmp_path / "logs"), "NNODES": "1", "NPUS_PER_NODE": "2", "VERL_PLATFORM": "cpu"}
    launcher = Launcher(tmp_path / "grpo_x.sh", None, env)
    lines: list[str] = []
    launcher.log = lines.append
    launcher.resolve(dry_run=True)
    node = "pid 7 (user u), GCS 192.0.2.7:6379"
    assert f"note: the real run would stop here: a Ray node already runs here ({node})" in lines


def test_two_runs_are_compared_step_by_step_and_an_unlogged_metric_is_named(tracked_run, tmp_path, capsys):
    """--compare: one column per run, '-' where a run did not log the step, a PNG panel per metric."""
    other = tmp_path / "other"
    other.mkdir()
    lines = [
        f'{{"step": {i}, "data": {{"critic/score/mean": {0.5 * i}, "npu_rl/sam/acceptance": 0.1}}}}' for i in (1, 2, 5)
    ]
    (other / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    png = tmp_path / "cmp.png"
    args = ["--compare", str(tracked_run), str(other), "--label", "a", "--label", "b", "--out", str(png)]
    assert report_cli.main([*args, "--metric", "critic/score/mean"]) == 0
    out = capsys.readouterr().out
    assert (
        "| step | a | b |" in out
        and "| 1 | 0.1 | 0.5 |" in out
        and "| 4 | 0.4 | - |" in out
        and "| 5 | - | 2.5 |" in out
    )
    assert png.read_bytes()[:8] == PNG
    assert report_cli.main([*args, "--metric", "npu_rl/sam/acceptance_typo"]) != 0
    assert (
        "no run logged npu_rl/sam/acceptance_typo (keys under npu_rl/sam/: npu_rl/sam/acceptance)"
        in capsys.readouterr().err
    )
    assert report_cli.main([*args[:-2], "--label", "c", "--metric", "critic/score/mean"]) != 0  # 3 labels, 2 runs
    assert "one label per run" in capsys.readouterr().err
