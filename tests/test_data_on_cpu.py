"""Data preparation on real samples: verl 0.9.1's RLHFDataset loads the output with the real Qwen3
tokenizer, indices are unique, and each dataset's prompt style is graded by the reward function its
data_source selects in verl (a correct answer in the asked format scores, a wrong one does not)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from npu_rl import REPO_ROOT
from npu_rl.data import SPECS, DataError, convert, main, read_rows, strip_wrapper

pytest.importorskip("verl")
DATA = REPO_ROOT / "tests" / "data"

CASES = [  # (dataset, file, rows expected)
    ("gsm8k", "gsm8k_train_head20.jsonl", 20),
    ("math500", "math500_head10.jsonl", 10),
    ("aime2024", "aime2024_qwq.jsonl", 30),
    ("aime2025", "aime2025_qwq.jsonl", 30),
    ("dapo-math-17k", "dapo_math_head20.jsonl", 20),
    ("deepscaler", "deepscaler_rows0-9_265.parquet", 10),  # row 265 has an empty ground truth
]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    out = tmp_path_factory.mktemp("data")
    files = {}
    for name, file, _ in CASES:
        rc = main([name, "--input", str(DATA / file), "--out", str(out), "--split", "train", "--skip-invalid"])
        assert rc == 0
        files[name] = out / name / "train.parquet"
    return files


@pytest.mark.slow  # verl's dataset with the real tokenizer
def test_rlhf_dataset_loads_the_output_with_the_qwen3_chat_template(prepared, tok):
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset

    cfg = OmegaConf.create({"max_prompt_length": 2048, "filter_overlong_prompts": True, "truncation": "error"})
    # One dataset over all six files (one tokenizer pass: RLHFDataset applies the chat template to filter).
    ds = RLHFDataset([str(prepared[name]) for name, _, _ in CASES], tok, cfg)
    assert len(ds) == sum(rows for _, _, rows in CASES)
    items = [ds[i] for i in range(len(ds))]
    for name, _, rows in CASES:
        mine = [it for it in items if it["extra_info"]["dataset"] == name]
        assert sorted(it["index"] for it in mine) == list(range(rows)), name  # extra_info.index, unique
        assert {it["data_source"] for it in mine} == {SPECS[name].data_source}
        assert all(it["reward_model"]["ground_truth"] for it in mine)
        text = tok.apply_chat_template(mine[0]["raw_prompt"], tokenize=False, add_generation_prompt=True)
        assert text.startswith("<|im_start|>user\n") and text.endswith("<|im_start|>assistant\n")


def _answer_in_style(name: str, truth: str) -> str:
    if name == "gsm8k":
        return f"Adding them up gives the total.\n#### {truth}"
    if SPECS[name].template.startswith("Solve the following"):
        return f"Some reasoning.\nAnswer: {truth}"
    return f"Some reasoning, so the answer is $\\boxed{{{truth}}}$."


@pytest.mark.parametrize(("name", "file", "rows"), CASES)
def test_data_source_routes_to_a_reward_that_grades_the_asked_format(prepared, name, file, rows):
    from verl.utils.reward_score import default_compute_score

    df = pd.read_parquet(prepared[name])
    for _, row in df.head(3).iterrows():
        truth = row["reward_model"]["ground_truth"]
        good = default_compute_score(row["data_source"], _answer_in_style(name, truth), truth)
        bad = default_compute_score(row["data_source"], _answer_in_style(name, "123456789"), truth)
        good = good["score"] if isinstance(good, dict) else good
        bad = bad["score"] if isinstance(bad, dict) else bad
        assert good > bad, (name, truth, good, bad)


def test_known_wrappers_are_replaced_not_doubled():
    r = json.loads((DATA / "aime2024_qwq.jsonl").read_text().splitlines()[0])
    rows, _ = convert([r], SPECS["aime2024"], "test")
    content = rows[0]["prompt"][0]["content"]
    assert "Please reason step by step" not in content and content.count("Answer:") == 2  # template's own two
    assert strip_wrapper(SPECS["math500"].template.format(q="What is 1+1?")) == "What is 1+1?"
    gsm = read_rows(DATA / "gsm8k_train_head20.jsonl")
    rows, _ = convert(gsm, SPECS["gsm8k"], "train")
    assert rows[0]["reward_model"]["ground_truth"] == "72" and "####" in rows[0]["prompt"][0]["content"]


def test_bad_rows_are_named_or_skipped_and_counted(tmp_path):
    rows = read_rows(DATA / "deepscaler_rows0-9_265.parquet")
    with pytest.raises(DataError, match=r"row 10: no answer \(empty or absent ground truth\).*--skip-invalid"):
        convert(rows, SPECS["deepscaler"], "train", "dsr")
    kept, skipped = convert(rows, SPECS["deepscaler"], "train", "dsr", skip_invalid=True)
    assert len(kept) == 10 and len(skipped) == 1 and [r["extra_info"]["index"] for r in kept] == list(range(10))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "x", "answer": "#### 1"}\nnot json\n')
    with pytest.raises(DataError, match=r"bad.jsonl:2: not JSON"):
        read_rows(bad)
    assert main(["gsm8k", "--input", str(bad), "--out", str(tmp_path)]) == 1
    assert not (tmp_path / "gsm8k").exists()  # nothing half-written


def test_answers_are_normalised_and_a_wrong_dataset_is_refused():
    aime = [{"problem": "p", "answer": "025"}, {"problem": "q", "answer": " 7 "}]
    rows, _ = convert(aime, SPECS["aime2024"], "test")
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["25", "7"]  # math_dapo compares "Answer: 25"
    gsm = read_rows(DATA / "gsm8k_train_head20.jsonl")
    with pytest.raises(DataError, match=r"row 0: the answer looks like GSM8K's .* convert it as gsm8k"):
        convert(gsm, SPECS["math500"], "test")
    latex = [{"problem": "p", "answer": "\\left( 3, \\frac{\\pi}{2} \\right)"}]
    assert convert(latex, SPECS["gsm8k"], "t")[0][0]["reward_model"]["ground_truth"] == latex[0]["answer"]
