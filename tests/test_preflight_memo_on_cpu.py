"""Reused library verdicts (npu_rl.preflight.memo, issue 17 part 6): a repeated dry run of an unchanged
recipe replays what verl / vLLM / vllm-ascend said, and any change of what they read runs them again.

The end-to-end case goes through the real launcher on the real 32B recipe with an error only vLLM's
engine config finds; the others drive the memo on real files and directories (its audit hook records
what a stage really opens and lists), on real composed configs.
"""

from __future__ import annotations

import json
import os
import re

import pytest
from omegaconf import OmegaConf

from npu_rl import REPO_ROOT
from npu_rl.preflight import memo, run_preflight
from npu_rl.preflight.report import Problem, Report
from npu_rl.recipes import dry_run
from tests.test_preflight_on_cpu import BASE, ENV_2X16

# Dry runs in their own processes (the memo between them is the subject): left out of --quick.
pytestmark = pytest.mark.slow

pytest.importorskip("verl")
pytest.importorskip("vllm")

R = "actor_rollout_ref.rollout"
RECIPE_32B = (REPO_ROOT / "recipes/qwen3-32b/grpo_32die.sh", REPO_ROOT / "recipes/qwen3-32b/env_2node.sh")
LIBRARY_ERROR = f"error: {R}.max_num_batched_tokens: 8192 < max_model_len (34816) with enable_chunked_prefill=False"


def _report_lines(out: str) -> list[str]:
    """The preflight's plan and problems up to its verdict line, without the memo's own plan line (the
    environment table after it shows the launcher's per-run temporary paths)."""
    lines = out.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("preflight of "))
    end = next(i for i, ln in enumerate(lines) if ln.startswith("preflight: "))
    return [ln for ln in lines[start : end + 1] if not ln.startswith("library checks")]


def _plan_line(out: str) -> str:
    return next(ln for ln in out.splitlines() if ln.startswith("library checks"))


def test_a_repeated_dry_run_replays_the_libraries_verdict_and_the_switch_turns_reuse_off(monkeypatch):
    # the error comes from verl's vLLMHttpServer / vLLM's SchedulerConfig only (no hand rule says it)
    bad = (f"{R}.enable_chunked_prefill=False",)
    rc1, out1, _ = dry_run(*RECIPE_32B, *bad)
    assert rc1 == 65 and LIBRARY_ERROR in out1, out1
    assert "checks run now (first run of this configuration)" in _plan_line(out1)

    rc2, out2, _ = dry_run(*RECIPE_32B, *bad)
    assert rc2 == 65, out2
    assert "verdicts reused from" in _plan_line(out2) and "NPU_RL_PREFLIGHT_CACHE=0 re-runs them" in out2
    assert _report_lines(out2) == _report_lines(out1)  # every problem, in the same order

    monkeypatch.setenv("NPU_RL_PREFLIGHT_CACHE", "0")
    rc3, out3, _ = dry_run(*RECIPE_32B, *bad)
    assert rc3 == 65 and "checks run now (NPU_RL_PREFLIGHT_CACHE=0)" in _plan_line(out3), out3
    assert _report_lines(out3) == _report_lines(out1)

    # the switch's run recorded its fresh verdict: the next run reuses that one, not the first
    monkeypatch.delenv("NPU_RL_PREFLIGHT_CACHE")
    rc5, out5, _ = dry_run(*RECIPE_32B, *bad)
    when = re.compile(r"reused from (\S+ \S+)")
    assert rc5 == 65 and when.search(_plan_line(out5)).group(1) != when.search(_plan_line(out2)).group(1), (
        _plan_line(out2),
        _plan_line(out3),
        _plan_line(out5),
    )
    assert _report_lines(out5) == _report_lines(out1)

    # the fixed recipe is another configuration: judged afresh, and accepted
    rc4, out4, _ = dry_run(*RECIPE_32B, *bad, f"{R}.max_num_batched_tokens=34816")
    assert rc4 == 0 and "checks run now (first run of this configuration)" in _plan_line(out4), out4


def _stage(m: memo.Memo, report: Report, rule_file, listed_dir) -> None:
    with m.stage("rules", report) as run:
        if run:  # a stand-in library: reads a file, lists a directory, reports what the file says
            report.error("some.key", rule_file.read_text(), f"{len(os.listdir(listed_dir))} files")


def test_an_entry_is_used_until_a_file_or_directory_the_stage_read_changes(tmp_path):
    lib = tmp_path / "lib"
    lib.mkdir()
    rule = lib / "rule.txt"
    rule.write_text("too small")
    cache = tmp_path / "cache"
    key = "a" * 64

    first = memo.Memo(key, cache)
    report = Report()
    _stage(first, report, rule, lib)
    first.save()
    assert not first.hit and first.reason == "first run of this configuration"
    saved = json.loads((cache / f"{key}.json").read_text())
    assert saved["deps"][str(rule)][0] == "file" and saved["deps"][str(lib)][0] == "dir"

    second = memo.Memo(key, cache)
    replay = Report()
    rule.write_text("changed!!")  # same stage result would differ: but the entry is checked at open
    assert second.hit  # opened before the change
    _stage(second, replay, rule, lib)
    assert replay.problems == [Problem("some.key", "too small", "1 files", True)]

    third = memo.Memo(key, cache)
    assert not third.hit and third.reason == f"{rule} changed since the cached verdict"
    _stage(third, Report(), rule, lib)
    third.save()
    assert memo.Memo(key, cache).hit

    (lib / "new.txt").write_text("")  # a new file in a directory the stage listed (a pip install)
    fourth = memo.Memo(key, cache)
    assert not fourth.hit and fourth.reason == f"{lib} changed since the cached verdict"


def _cfg(model_path: str, **rollout):
    return OmegaConf.create({"actor_rollout_ref": {"model": {"path": model_path}, "rollout": {"tp": 8, **rollout}}})


def test_the_key_covers_config_environment_model_files_and_paths_but_not_the_launchers_temporaries(tmp_path):
    model = tmp_path / "Qwen3-32B"
    meta = REPO_ROOT / "recipes/models/Qwen3-32B.json"
    env = {"NNODES": "2", "PYTORCH_NPU_ALLOC_CONF": "expandable_segments:False", "NPU_RL_PLAN_MARK": "/tmp/a"}
    base = memo.key_of(_cfg(str(model)), [], env, meta)
    assert memo.key_of(_cfg(str(model)), [], env, meta) == base
    volatile = {"NPU_RL_PLAN_MARK": "/tmp/b", "SHLVL": "3", "NPU_RL_FROM_SHELL": "A B", "NPU_RL_PREFLIGHT_CACHE": "0"}
    assert memo.key_of(_cfg(str(model)), [], {**env, **volatile}, meta) == base

    changed = {
        "a config value": memo.key_of(_cfg(str(model), tp=4), [], env, meta),
        "an interpolation as written": memo.key_of(_cfg(str(model), tp="${oc.env:TP,8}"), [], env, meta),
        "an injected key": memo.key_of(_cfg(str(model)), ["data.sampler.bucket_size"], env, meta),
        "an environment variable": memo.key_of(
            _cfg(str(model)), [], {**env, "PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True"}, meta
        ),
        "another model facts file": memo.key_of(_cfg(str(model)), [], env, REPO_ROOT / "recipes/models/Qwen3-8B.json"),
    }
    model.mkdir()
    changed["the model folder appearing"] = memo.key_of(_cfg(str(model)), [], env, meta)
    (model / "config.json").write_text("{}")
    changed["a file in the model folder"] = memo.key_of(_cfg(str(model)), [], env, meta)
    local_meta = tmp_path / "config.json"
    local_meta.write_text(meta.read_text())
    changed["the facts file's path"] = memo.key_of(_cfg(str(model)), [], env, local_meta)
    same_path = memo.key_of(_cfg(str(model)), [], env, local_meta)
    local_meta.write_text(meta.read_text().replace('"num_hidden_layers": 64', '"num_hidden_layers": 32'))
    changed["the facts file's content"] = memo.key_of(_cfg(str(model)), [], env, local_meta)
    keys = [base, same_path, *changed.values()]
    assert changed["the facts file's content"] != same_path
    assert len(set(keys)) == len(keys) - 1, changed  # same_path == changed["the facts file's path"]


def test_an_unreadable_or_foreign_entry_is_a_miss_and_is_replaced(tmp_path):
    key = "b" * 64
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / f"{key}.json").write_text('{"format": 1, "key": "b')  # cut short (a full disk)
    m = memo.Memo(key, cache)
    assert not m.hit and m.reason == "cached entry unreadable (JSONDecodeError)"
    with m.stage("rules", Report()) as run:
        assert run
    m.save()
    assert memo.Memo(key, cache).hit
    (cache / f"{key}.json").write_text(json.dumps({"format": 0, "key": key, "stages": {}, "deps": {}}))
    m = memo.Memo(key, cache)
    assert not m.hit and m.reason == "cached entry of another format"


def test_a_cache_that_cannot_be_written_costs_only_the_reuse(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    m = memo.Memo("c" * 64, blocker / "preflight")
    report = Report()
    with m.stage("rules", report) as run:
        if run:
            report.warn("k", "kept")
    m.save()
    assert report.problems == [Problem("k", "kept", "", False)]
    assert re.search(r"not cached: \[Errno 20\] Not a directory", m.status), m.status


@pytest.mark.parametrize("value", ["maybe"])
def test_a_bad_switch_value_is_an_error_naming_it_and_the_checks_still_run(value):
    r = run_preflight([*BASE, f"{R}.enable_chunked_prefill=False"], {**ENV_2X16, "NPU_RL_PREFLIGHT_CACHE": value})
    errors = {p.key: p for p in r.report.errors}
    assert f"NPU_RL_PREFLIGHT_CACHE={value!r}: write 1" in errors["NPU_RL_PREFLIGHT_CACHE"].message
    assert errors["NPU_RL_PREFLIGHT_CACHE"].fix == "unset NPU_RL_PREFLIGHT_CACHE or write 0 or 1"
    assert f"{R}.max_num_batched_tokens" in errors  # the libraries still judged the rollout
