"""Issue 39, item 4: the resampler, rebalance and async benchmarks take the user's response lengths
(--lengths FILE, npu_rl.sim.workloads.load_lengths_file), run on a small file none of them was
developed on, and bad files are named by line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import bench_async  # noqa: E402
import bench_rebalance  # noqa: E402
import bench_resampler  # noqa: E402

from npu_rl.sim.model import SimError  # noqa: E402
from npu_rl.sim.workloads import TABLE, load_lengths_file, load_workload  # noqa: E402

# Three prompts of a made-up workload: a short-answer one, a long reasoning one with a capped response,
# one without prompt_tokens or id.
ROWS = [
    {"id": "short", "prompt_tokens": 60, "response_tokens": [40, 55, 61, 38]},
    {"id": "long", "prompt_tokens": 210, "response_tokens": [9000, 16384, 7100, 12050], "capped": [0, 1, 0, 0]},
    {"response_tokens": [700, 1300, 950, 2100]},
]


def run(main, argv: list[str]) -> tuple[int, str, str]:
    """The benchmark of ``main`` run as a user runs it, ``python benchmarks/<name>.py ARGV``: (exit code,
    stdout, stderr). In its own process because in one clean-clone CI worker neither capsys nor
    contextlib.redirect_stdout saw the benchmark's prints (pytest's fd-level capture got them); the
    cause was not found (Ray's tqdm print patch, checked, is not it)."""
    script = REPO / "benchmarks" / f"{main.__module__}.py"
    r = subprocess.run([sys.executable, str(script), *argv], capture_output=True, text=True, timeout=300, check=False)
    return r.returncode, r.stdout, r.stderr


@pytest.fixture
def mine(tmp_path) -> Path:
    path = tmp_path / "my_lengths.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in ROWS) + "\n")
    return path


def test_a_jsonl_file_becomes_a_workload(mine):
    w = load_lengths_file(mine)
    assert w.name == "my_lengths" and w.prompt_names == ("short", "long", "3")
    assert list(w.prompt_tokens) == [60, 210, 0]
    assert [list(r) for r in w.responses] == [r["response_tokens"] for r in ROWS]
    assert w.n_capped() == 1 and w.all_lengths().max() == 16384


def test_a_length_table_is_taken_whole_or_by_name(tmp_path):
    w = load_lengths_file(f"{TABLE}:qwen25math_maj8")
    assert w.n_prompts == load_workload("qwen25math_maj8").n_prompts == 100
    with pytest.raises(SimError, match=r"pass .*:NAME with NAME one of \['qwen25math_maj8'"):
        load_lengths_file(TABLE)
    one = tmp_path / "one.json"
    one.write_text(
        json.dumps(
            {
                "datasets": {
                    "mine": {
                        "prompts": [
                            {"id": "a", "prompt_tokens": 5, "response_tokens": [7, 9], "capped": [False, False]}
                        ]
                    }
                }
            }
        )
    )
    assert load_lengths_file(one).name == "mine"


@pytest.mark.parametrize(
    ("line", "what"),
    [
        ('{"prompt_tokens": 5}', 'need a JSON object with "response_tokens"'),
        ('{"response_tokens": [10, 0]}', "token counts >= 1"),
        ('{"response_tokens": [10, 20], "capped": [true]}', "one flag per response"),
        ("[10, 20]", "need a JSON object"),
    ],
)
def test_a_bad_line_is_named(tmp_path, line, what):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(ROWS[0]) + "\n" + line + "\n")
    with pytest.raises(SimError, match=rf"bad.jsonl:2: .*{what}"):
        load_lengths_file(bad)


def test_the_resampler_benchmark_replays_the_users_lengths(mine):
    code, out, _ = run(
        bench_resampler.main, ["--lengths", str(mine), "--recipes", "32B", "--epochs", "2", "--steps", "2"]
    )
    assert code == 0
    row = next(x for x in out.splitlines() if x.startswith("my_lengths "))
    assert row.split()[1] == "32B"
    # the length-aware order of epoch 1 predicts the short prompt's mean from epoch 0's draws
    assert np.isfinite([float(x) for x in row.split()[4:7]]).all()


def test_the_rebalance_benchmark_routes_the_users_lengths(mine):
    argv = ["--lengths", str(mine), "--settings", "32b", "--steps", "1", "--sweep-steps", "0", "--no-plots"]
    code, out, _ = run(bench_rebalance.main, argv)
    assert code == 0
    assert "# workload my_lengths: 3 prompts, 12 responses" in out


def test_the_async_benchmark_samples_the_users_lengths(mine):
    code, out, _ = run(bench_async.main, ["--quick", "--lengths", str(mine)])
    assert code == 0 and f"my_lengths (real lengths, 3 prompts of {mine}" in out


def test_a_bad_file_stops_each_benchmark_with_its_name(tmp_path):
    absent = str(tmp_path / "absent.jsonl")
    for main in (bench_resampler.main, bench_rebalance.main, bench_async.main):
        code, _, err = run(main, ["--lengths", absent])
        assert code == 2 and f"--lengths {absent}: no such file" in err, main.__module__
