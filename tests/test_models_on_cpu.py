"""Model directory checks and the download CLI's errors (no network here)."""

from __future__ import annotations

import json
import sys

import pytest

from npu_rl.models import ModelError, download, main, missing_files


def test_missing_files_lists_what_a_run_needs(tmp_path):
    assert missing_files(tmp_path / "nope") == [f"{tmp_path / 'nope'} (no such directory)"]
    (tmp_path / "config.json").write_text("{}")
    assert missing_files(tmp_path, config_only=True) == [
        "tokenizer.json (or vocab.json + merges.txt)",
        "tokenizer_config.json",
    ]
    for f in ("vocab.json", "merges.txt", "tokenizer_config.json"):
        (tmp_path / f).write_text("")
    assert missing_files(tmp_path, config_only=True) == []
    assert missing_files(tmp_path) == ["model.safetensors.index.json or model.safetensors (the weights)"]
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"x": "s1", "y": "s2"}}))
    (tmp_path / "s1").write_bytes(b"w")
    assert missing_files(tmp_path) == ["s2"]
    assert main(["verify", str(tmp_path)]) == 1
    (tmp_path / "s2").write_bytes(b"w")
    assert main(["verify", str(tmp_path)]) == 0


def test_missing_hub_library_says_how_to_install_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "modelscope", None)  # absent, whether or not it is installed here
    with pytest.raises(ModelError, match="pip install modelscope"):
        download("Qwen/Qwen3-0.6B", tmp_path / "m", hub="modelscope", config_only=True)
    assert main(["download", "Qwen/Qwen3-0.6B", "--config-only", "--dest", str(tmp_path / "m")]) == 1
    assert "pip install modelscope" in capsys.readouterr().err


def test_empty_shards_and_bad_indexes_are_reported(tmp_path):
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (tmp_path / f).write_text("{}")
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"x": "s1"}}))
    (tmp_path / "s1").write_bytes(b"")
    assert missing_files(tmp_path) == ["s1 (empty: an interrupted download?)"]
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": ["s1"]}))
    assert "unreadable" in missing_files(tmp_path)[-1]
    assert missing_files(tmp_path / "config.json") == [f"{tmp_path / 'config.json'} (not a directory)"]
