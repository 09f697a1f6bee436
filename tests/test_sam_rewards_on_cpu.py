"""The trainer's rewards into SAM's history store (issue 34, item 5; npu_rl.spec_decode.rewards, verl patch 0012).

The end-to-end cases through a real Ray actor (RayHistory, as the proposer makes it, and step_rewards
on the TensorDict shape verl's V1 trainer reads from TransferQueue) live beside the history store's
other Ray tests in tests/test_spec_decode_history_on_cpu.py, on that module's one Ray instance: a
second Ray start in the same pytest process cannot create the store's actor class again."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is in the CPU environment: install_stack.sh --cpu")
omegaconf = pytest.importorskip("omegaconf", reason="omegaconf comes with verl: install_stack.sh --cpu")

from npu_rl.spec_decode.rewards import jagged_rows, step_rewards  # noqa: E402

SPEC = "actor_rollout_ref.rollout.engine_kwargs.vllm.speculative_config"


def config(model: str, **spec):
    spec = {"method": "sam", "num_speculative_tokens": 4, "sam_history_mb": 16, **spec}
    rollout = {"engine_kwargs": {"vllm": {"speculative_config": spec}}}
    return omegaconf.OmegaConf.create({"actor_rollout_ref": {"model": {"path": model}, "rollout": rollout}})


def step_data(prompts, responses, scores):
    """The fields _compute_metrics reads, as TransferQueue returns them: jagged tensors, one row per trajectory."""
    jag = lambda rows, dt: torch.nested.nested_tensor([torch.tensor(r, dtype=dt) for r in rows], layout=torch.jagged)  # noqa: E731
    return {
        "prompts": jag(prompts, torch.int64),
        "responses": jag(responses, torch.int64),
        "rm_scores": jag(scores, torch.float32),
    }


def test_rows_of_jagged_and_dense_tensors():
    t = torch.nested.nested_tensor([torch.tensor(r) for r in ([1, 2], [3], [4, 5, 6])], layout=torch.jagged)
    assert [r.tolist() for r in jagged_rows(t, [0, 2])] == [[1, 2], [4, 5, 6]]
    assert [r.tolist() for r in jagged_rows(torch.tensor([[1, 2], [3, 4]]), [1])] == [[3, 4]]


@pytest.mark.parametrize(
    "cfg",
    [
        {"method": "ngram"},  # SAM off
        {"sam_history_mb": 0},  # no history
        {"sam_history_rewards": False},  # history ranked by age
    ],
)
def test_nothing_is_read_or_sent_unless_sam_history_and_its_rewards_are_on(cfg, tmp_path):
    class Untouchable(dict):
        def __getitem__(self, key):
            raise AssertionError(f"read {key}")

    assert step_rewards(Untouchable(), np.ones(2, bool), config(str(tmp_path), **cfg)) == {}
