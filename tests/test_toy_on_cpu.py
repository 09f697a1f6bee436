"""npu_rl.toy and its commands: the learning runs' tokenizer, model, task, data and reward (issue 34).

The tokenizer is loaded back with ``AutoTokenizer`` as verl and vLLM load it; the model with
transformers' ``Qwen3ForCausalLM``; the chance reward is measured by sampling the random model.
"""

from __future__ import annotations

import json
import re

import pytest

from npu_rl import data, models, toy

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def _prompt_ids(tok, messages) -> list[int]:
    """The prompt's token ids as verl's RLHFDataset makes them (the chat template, generation prompt)."""
    enc = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)
    return list(enc["input_ids"])


@pytest.fixture(scope="module")
def toy_model(tmp_path_factory):
    dest = tmp_path_factory.mktemp("toy") / "Qwen3-toy"
    assert models.main(["toy", str(dest), "--layers", "1", "--hidden", "128", "--seed", "2"]) == 0  # the recipe's
    return dest


def test_the_tokenizer_loads_with_autotokenizer_and_renders_the_chat_format(toy_model):
    tok = transformers.AutoTokenizer.from_pretrained(toy_model)
    ids = _prompt_ids(tok, [{"role": "user", "content": "c 7 a b"}])
    assert tok.convert_ids_to_tokens(ids) == [
        "<|im_start|>", "user", "\n", "c", "7", "a", "b", "<|im_end|>", "\n", "<|im_start|>", "assistant", "\n",
    ]  # fmt: skip
    assert tok.encode("\n", add_special_tokens=False) == [tok.convert_tokens_to_ids("\n")]  # verl needs one token
    assert len(tok) == 22 and tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert tok("12 34")["input_ids"] == [tok.convert_tokens_to_ids(c) for c in "1234"]  # one token a digit
    answer = [tok.convert_tokens_to_ids("4"), tok.eos_token_id]
    assert tok.decode(answer, skip_special_tokens=True) == "4"
    assert tok.convert_ids_to_tokens(tok("7 x")["input_ids"]) == ["7", "<unk>"]


def test_the_model_is_a_seeded_qwen3_of_the_tokenizers_vocabulary(toy_model, tmp_path):
    cfg = json.loads((toy_model / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3ForCausalLM"] and cfg["vocab_size"] == 22
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["head_dim"]) == (128, 1, 32)
    assert cfg["eos_token_id"] == 2 and cfg["pad_token_id"] == 0
    again = tmp_path / "again"
    models.write_toy(again, layers=1, hidden=128, seed=2)
    assert (again / "model.safetensors").read_bytes() == (toy_model / "model.safetensors").read_bytes()
    other = models.write_toy(tmp_path / "other", layers=1, hidden=128, seed=1)
    assert (other / "model.safetensors").read_bytes() != (toy_model / "model.safetensors").read_bytes()
    mtime = (again / "model.safetensors").stat().st_mtime_ns
    models.write_toy(again, layers=1, hidden=128, seed=2)  # up to date: nothing rewritten
    assert (again / "model.safetensors").stat().st_mtime_ns == mtime
    with pytest.raises(models.ModelError, match="multiple of 32"):
        models.write_toy(tmp_path / "bad", hidden=48)


@pytest.mark.parametrize(
    ("response", "score"),
    [
        ("4", 1.0),
        ("4 4 1", 1.0),
        (" 4", 1.0),
        ("4\n", 1.0),
        ("3", 0.05),
        ("3 4", 0.05),
        ("34", 0.0),
        ("user 4", 0.0),
        ("", 0.0),
        ("<unk>", 0.0),
    ],
)
def test_the_reward_reads_the_first_word(response, score):
    assert toy.compute_score(toy.DATA_SOURCE, response, "4") == score


@pytest.mark.parametrize(
    ("response", "score"),
    [
        ("4 4 4", 1.0),
        ("4 4 4 4 1", 1.0),  # words past the answer's are not read
        ("4 4 1", (1 + 1 + 0.05) / 3),
        ("4", 1 / 3),  # a missing word scores 0
        ("user 4 4", 2 / 3),
        ("3 3 3", 0.05),
        ("", 0.0),
    ],
)
def test_the_repeat_variants_reward_is_the_mean_over_the_answers_words(response, score):
    assert toy.compute_score(toy.DATA_SOURCE, response, "4 4 4") == pytest.approx(score)


def test_the_data_command_repeats_the_answer_and_remakes_one_digit_data(tmp_path, capsys):
    pd = pytest.importorskip("pandas")
    args = ["toy", "--out", str(tmp_path), "--train-rows", "40", "--val-rows", "8"]
    assert data.main(args) == 0
    one = pd.read_parquet(tmp_path / "toy" / "train.parquet")
    assert data.main([*args, "--repeat", "3"]) == 0  # another answer: made again, same prompts
    assert capsys.readouterr().out.rstrip().endswith("answers repeated 3 times (seed 0): written")
    three = pd.read_parquet(tmp_path / "toy" / "train.parquet")
    question = lambda frame: list(frame["extra_info"].map(lambda e: e["question"]))  # noqa: E731
    assert question(three) == question(one)
    for (_, a), (_, b) in zip(one.iterrows(), three.iterrows(), strict=True):
        assert b["reward_model"]["ground_truth"] == " ".join([a["reward_model"]["ground_truth"]] * 3)
    assert data.main(["toy", "--out", str(tmp_path), "--repeat", "0"]) == 1
    assert "--repeat must be >= 1 (got 0)" in capsys.readouterr().err


def test_the_reward_refuses_another_data_source():
    with pytest.raises(ValueError, match="openai/gsm8k"):
        toy.compute_score("openai/gsm8k", "4", "4")


def test_the_data_command_writes_disjoint_splits_whose_answer_is_the_prompts_digit(tmp_path, capsys):
    pd = pytest.importorskip("pandas")
    assert data.main(["toy", "--out", str(tmp_path), "--train-rows", "300", "--val-rows", "50"]) == 0
    assert capsys.readouterr().out.rstrip().endswith(": written")
    train = pd.read_parquet(tmp_path / "toy" / "train.parquet")
    val = pd.read_parquet(tmp_path / "toy" / "val.parquet")
    assert (len(train), len(val)) == (300, 50)
    places = set()
    for frame in (train, val):
        for _, row in frame.iterrows():
            words = row["prompt"][0]["content"].split()
            digits = [i for i, w in enumerate(words) if w.isdigit()]
            assert len(words) == 4 and len(digits) == 1 and len(words[digits[0]]) == 1
            assert all(w in "abcde" and len(w) == 1 for i, w in enumerate(words) if i != digits[0])
            assert row["reward_model"]["ground_truth"] == words[digits[0]] and row["data_source"] == toy.DATA_SOURCE
            places.add(digits[0])
        assert sorted(frame["extra_info"].map(lambda e: e["index"])) == list(range(len(frame)))
    assert places == {0, 1, 2, 3}  # the digit is not always in one place
    questions = set(train["extra_info"].map(lambda e: e["question"]))
    assert not questions & set(val["extra_info"].map(lambda e: e["question"]))
    with pytest.raises(SystemExit):
        data.main(["toy", "--out", str(tmp_path), "--hub", "hf"])
    with pytest.raises(ValueError, match="2 digits, not one"):
        toy.answer("7 2 a b")


def test_the_data_command_keeps_data_that_is_up_to_date_and_remakes_the_rest(tmp_path, capsys):
    pytest.importorskip("pandas")
    args = ["toy", "--out", str(tmp_path), "--train-rows", "40", "--val-rows", "8"]
    train = tmp_path / "toy" / "train.parquet"
    assert data.main(args) == 0
    made = train.stat().st_mtime_ns
    capsys.readouterr()
    assert data.main(args) == 0  # the recipe calls it on every start
    assert train.stat().st_mtime_ns == made and capsys.readouterr().out.rstrip().endswith(": up to date, kept")
    assert data.main([*args[:-4], "--train-rows", "41", "--val-rows", "8"]) == 0  # other rows: made again
    assert capsys.readouterr().out.rstrip().endswith(": written")
    (tmp_path / "toy" / "made.json").write_text("{not json")  # a stamp that is not ours: made again
    assert data.main(args) == 0 and capsys.readouterr().out.rstrip().endswith(": written")
    (tmp_path / "toy" / "val.parquet").unlink()  # a file gone: made again
    assert data.main(args) == 0 and capsys.readouterr().out.rstrip().endswith(": written")
    assert (tmp_path / "toy" / "val.parquet").is_file()


def test_the_random_model_earns_chance(toy_model):
    """The documented chance (~0.08) measured: the recipe's random model's sampled first words, scored."""
    tok = transformers.AutoTokenizer.from_pretrained(toy_model)
    model = transformers.AutoModelForCausalLM.from_pretrained(toy_model)
    rows = toy.rows(400, "chance", 0)
    prompts = [_prompt_ids(tok, r["prompt"]) for r in rows]
    torch.manual_seed(0)
    with torch.no_grad():
        out = model.generate(
            torch.tensor(prompts), max_new_tokens=4, do_sample=True, top_k=0, pad_token_id=0, eos_token_id=2
        )
    texts = tok.batch_decode(out[:, len(prompts[0]) :], skip_special_tokens=True)
    truths = [r["reward_model"]["ground_truth"] for r in rows]
    mean = sum(toy.compute_score(toy.DATA_SOURCE, t, g) for t, g in zip(texts, truths, strict=True)) / len(rows)
    assert 0.03 <= mean <= 0.1, mean  # below the 0.1 the recipes and CI call chance
    print(f"chance measured: {mean:.3f}")


def test_the_learning_recipes_preflight_reads_the_toy_models_facts():
    """env_cpu_learn.sh points NPU_RL_MODEL_META at recipes/qwen3-tiny/toy_config.json (the model is
    made on first use, after the preflight): it must be the config the recipe's model command writes."""
    import json

    from npu_rl import REPO_ROOT
    from npu_rl.models import toy_config
    from tests.dryrun import plan

    recipe = REPO_ROOT / "recipes/qwen3-tiny/grpo_learn_cpu.sh"
    made = re.search(r"npu_rl\.models toy \S+ --layers (\d+) --hidden (\d+) --seed", recipe.read_text())
    shipped = json.loads((REPO_ROOT / "recipes/qwen3-tiny/toy_config.json").read_text())
    assert made and shipped == toy_config(layers=int(made.group(1)), hidden=int(made.group(2)))
    rc, out, _ = plan(recipe, REPO_ROOT / "recipes/qwen3-tiny/env_cpu_learn.sh")
    assert rc == 0, out
    assert "facts from " + str(REPO_ROOT / "recipes/qwen3-tiny/toy_config.json") in out
    assert "prompt 20 + response 1 <= max_model_len 21 <= max_position_embeddings 128" in out


def test_the_grpo_simulator_learns_and_its_lr0_control_does_not_move(toy_model, tmp_path, capsys):
    """benchmarks/toy_grpo_sim.py, how the recipe's settings were chosen (docs/e2e.md): verl's own
    advantage and loss on the toy model; at lr 0 the greedy validation never changes, at the recipe's
    settings it rises far above chance within 16 steps."""
    import sys

    from npu_rl import REPO_ROOT

    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
    import toy_grpo_sim

    assert data.main(["toy", "--out", str(tmp_path), "--train-rows", "256", "--val-rows", "128"]) == 0
    common = ["--model", str(toy_model), "--data", str(tmp_path / "toy"), "--seeds", "1", "--test-freq", "4"]
    capsys.readouterr()
    assert toy_grpo_sim.main([*common, "--steps", "4", "--lr", "0"]) == 0
    control = capsys.readouterr().out
    vals = re.search(r"validation ([\d. ]+?)  ", control).group(1).split()
    assert len(vals) == 2 and vals[0] == vals[1], control
    assert toy_grpo_sim.main([*common, "--steps", "16"]) == 0
    learned = capsys.readouterr().out
    vals = [float(v) for v in re.search(r"validation ([\d. ]+?)  ", learned).group(1).split()]
    assert vals[0] <= 0.2 and vals[-1] >= 0.6, learned
