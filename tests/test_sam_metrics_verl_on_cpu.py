"""SAM's acceptance per step against the REAL patched verl 0.9.1 (issue 34, item 5): each response's
draft counts (vllm patch 0005, ``CompletionOutput.npu_rl_spec_counts``) go through the patched
``vLLMHttpServer.generate`` into ``extra_fields`` under verl's own ``spec_num_*`` names, through the
agent loop's ``AgentLoopOutput`` into what the TransferQueue stores, and out of the patched V1
trainer's ``_compute_metrics`` as verl's ``rollout/spec_accept_*`` and ``npu_rl/sam/*``.

The engine is the long-tail guard test's stand-in for ``AsyncLLM`` (cumulative real
``vllm.outputs.RequestOutput`` objects), with the counts vLLM's patched output processor would put
on each completion. That vLLM's scheduler counts them right is checked in its real CPU engine
against vLLM's own counters (``tests/test_spec_decode_cpu_engine_on_cpu.py``).
"""

from __future__ import annotations

import re

import pytest
from omegaconf import OmegaConf

pytest.importorskip("verl.workers.rollout.vllm_rollout.vllm_async_server")
from npu_rl.spec_decode.metrics import KEYS, extra_fields, step_metrics, summarize  # noqa: E402
from tests.test_long_tail_guard_verl_on_cpu import MiniAsyncLLM, StoredBatch, make_server, run_step  # noqa: E402

PLAN = {"a": 10, "b": 5, "c": 8}  # response lengths (tokens)
# (drafted, accepted, forwards) of each completion: forwards + accepted = its length
COUNTS = {"a": (6, 3, 7), "b": (0, 0, 5), "c": (12, 6, 2)}
SAM = {"actor_rollout_ref": {"rollout": {"engine_kwargs": {"vllm": {"speculative_config": {"method": "sam"}}}}}}


class CountingEngine(MiniAsyncLLM):
    """The stand-in engine, with each completion's counts as vllm patch 0005 sets them (None: an
    engine without speculative decoding)."""

    def __init__(self, counts: dict | None) -> None:
        super().__init__()
        self.counts = counts

    def _output(self, st, finish_reason):
        out = super()._output(st, finish_reason)
        if self.counts is not None:
            out.outputs[0].npu_rl_spec_counts = self.counts[st["rid"]]
        return out


def compute_metrics(stored: StoredBatch, monkeypatch, config: dict) -> dict:
    """The patched V1 trainer's ``_compute_metrics`` on the stored batch, with ``config`` merged in."""
    from verl.trainer.ppo.v1 import trainer_base
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    monkeypatch.setattr(trainer_base.tq, "kv_batch_get", stored.kv_batch_get)
    trainer = PPOTrainerSync.__new__(PPOTrainerSync)
    base = {"actor_rollout_ref": {"rollout": {}, "model": {}}, "trainer": {"n_gpus_per_node": 1, "nnodes": 1}}
    trainer.config = OmegaConf.merge(OmegaConf.create(base), OmegaConf.create(config))
    trainer.use_critic = False
    trainer._rollout_moe_lb_metrics_accumulator = None
    trainer._get_n_gpus_for_throughput = lambda: 1
    metrics: dict = {}
    trainer._compute_metrics(stored.meta, metrics, {"gen": 1.0, "step": 2.0, "update_actor": 0.5}, 5, 0)
    return metrics


def test_the_server_writes_each_responses_counts_under_verls_names():
    outs = run_step(make_server(CountingEngine(COUNTS)), PLAN)
    for rid, counts in COUNTS.items():
        assert [outs[rid].extra_fields[k] for k in KEYS] == list(counts)
        assert len(outs[rid].token_ids) == PLAN[rid] == counts[1] + counts[2]
    # an engine without the counts (speculative decoding off, or an unpatched vLLM): no such fields
    plain = run_step(make_server(CountingEngine(None)), PLAN)
    assert not [k for o in plain.values() for k in o.extra_fields if k in KEYS]


def test_the_trainer_logs_sam_acceptance_with_the_step(monkeypatch):
    stored = StoredBatch(run_step(make_server(CountingEngine(COUNTS)), PLAN), padding=2)
    metrics = compute_metrics(stored, monkeypatch, SAM)
    # by hand, the three real responses only (the two padding rows copy "a" and "b"):
    # drafted 18, accepted 9, forwards 14; per response accept rate 0.5, 0 (no drafts), 0.5 and
    # tokens per forward 1 + 3/7, 1, 1 + 6/2
    assert metrics["npu_rl/sam/active"] == 1.0 and metrics["npu_rl/sam/responses"] == 3.0
    assert [metrics[f"npu_rl/sam/{k}"] for k in ("drafted", "accepted", "forwards")] == [18, 9, 14]
    assert metrics["npu_rl/sam/acceptance"] == pytest.approx(0.5)
    assert metrics["npu_rl/sam/tokens_per_forward"] == pytest.approx(23 / 14)
    assert metrics["rollout/spec_accept_rate"] == pytest.approx(1 / 3)  # verl's own: per response, then the mean
    assert metrics["rollout/spec_accept_length"] == pytest.approx((1 + 3 / 7 + 1 + 4) / 3)
    assert "critic/score/mean" in metrics  # verl's own metrics of the same step, from the same batch


def test_sam_off_logs_and_reads_nothing(monkeypatch):
    stored = StoredBatch(run_step(make_server(CountingEngine(COUNTS)), PLAN))
    metrics = compute_metrics(stored, monkeypatch, {})
    assert not [k for k in metrics if k.startswith(("npu_rl/sam/", "rollout/spec_"))]
    assert ["extra_fields"] not in stored.reads
    assert step_metrics(stored.meta, stored.kv_batch_get, OmegaConf.create({})) == {}
    assert ["extra_fields"] not in stored.reads


def test_counts_lost_on_the_way_read_as_inactive(monkeypatch):
    # SAM on, but the responses carry no counts (a vLLM without patch 0005): a loud 0, no figures
    stored = StoredBatch(run_step(make_server(CountingEngine(None)), PLAN))
    metrics = compute_metrics(stored, monkeypatch, SAM)
    assert {k: v for k, v in metrics.items() if k.startswith("npu_rl/sam/")} == {
        "npu_rl/sam/active": 0.0,
        "npu_rl/sam/responses": 0.0,
    }
    assert "rollout/spec_accept_rate" not in metrics


def test_no_drafts_at_all_is_one_token_per_forward():
    out = summarize([extra_fields((0, 0, 4)), extra_fields((0, 0, 1)), None])
    assert out["npu_rl/sam/acceptance"] == 0.0 and out["npu_rl/sam/tokens_per_forward"] == 1.0
    assert out["npu_rl/sam/responses"] == 2.0 and out["rollout/spec_accept_length"] == 1.0


@pytest.mark.parametrize("counts", [(3, 4, 1), (-1, 0, 1)])
def test_inconsistent_counts_are_refused_with_the_values(counts):
    with pytest.raises(ValueError, match=re.escape(f"(drafted, accepted, forwards) = {counts}")):
        extra_fields(counts)
