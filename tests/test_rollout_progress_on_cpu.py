"""Rollout progress (``NPU_RL_ROLLOUT_PROGRESS``): the reporter with a fake clock, and the patched verl
``ReplayBuffer`` driving it while ``sample`` waits for generation.

TransferQueue's listing (``tq.kv_list``, a Ray-backed store) is replaced by a scripted sequence of
listings in the shape TransferQueue returns (prompt tags with status, trajectory tags with
``response_len``); the replay buffer, its polling loop and the patch are verl's own code.
"""

from __future__ import annotations

import io

import pytest

from npu_rl import rollout_progress as rp
from npu_rl.errors import NpuRlError
from npu_rl.rollout_progress import RolloutProgress, Snapshot


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def snap(pending=(), running=(), finished=(), traj=None):
    return Snapshot(frozenset(pending), frozenset(running), frozenset(finished), traj or {})


def traj(uid, n, lens):
    return {f"{uid}_{s}_0": {"status": "success", "response_len": ln} for s, ln in zip(range(n), lens, strict=True)}


def test_periodic_lines_with_counts_rate_longest_and_age():
    clock, out = Clock(), io.StringIO()
    p = RolloutProgress(interval_s=30, stream=out, tty=False, clock=clock)
    assert p.observe("train", snap()) is None  # idle: nothing printed
    p.observe("train", snap(running=["a", "b", "c"]))
    clock.t += 10
    p.observe("train", snap(running=["b", "c"], finished=["a"], traj=traj("a", 4, [100, 300, 200, 400])))
    clock.t += 25  # 35 s since the last line: a new one
    t = p.observe(
        "train", snap(running=["c"], finished=["a", "b"], traj={**traj("a", 4, [100] * 4), **traj("b", 4, [50] * 4)})
    )
    assert t == "rollout train: 8/12 responses, 2/3 groups, 17 tok/s, longest 100 tok, 1 groups running for 0:00:35"
    lines = out.getvalue().splitlines()
    assert len(lines) == 2  # first poll, then 35 s later (the 10 s poll was inside the interval)
    assert lines[0].startswith("rollout train: 0/? responses, 0/3 groups")
    clock.t += 5
    final = p.observe(
        "train",
        snap(
            finished=["a", "b", "c"], traj={**traj("a", 4, [1] * 4), **traj("b", 4, [1] * 4), **traj("c", 4, [9] * 4)}
        ),
    )
    assert final.endswith("longest 9 tok, done in 0:00:40") and out.getvalue().splitlines()[-1] == final
    assert "train" not in p._active  # the next rollout starts afresh


def test_hang_shows_as_a_growing_age_with_no_progress():
    clock, out = Clock(), io.StringIO()
    p = RolloutProgress(interval_s=60, stream=out, tty=False, clock=clock)
    s = snap(running=["x"], finished=["y"], traj=traj("y", 2, [10, 20]))
    for _ in range(5):
        p.observe("val", s)
        clock.t += 60
    ages = [line.rsplit("running for ", 1)[1] for line in out.getvalue().splitlines()]
    assert ages == ["0:00:00", "0:01:00", "0:02:00", "0:03:00", "0:04:00"]


def test_tty_draws_a_tqdm_bar():
    clock, out = Clock(), io.StringIO()
    p = RolloutProgress(stream=out, tty=True, clock=clock)
    p.observe("train", snap(running=["a", "b"]))
    clock.t += 2
    p.observe("train", snap(running=["b"], finished=["a"], traj=traj("a", 2, [30, 70])))
    text = out.getvalue()
    assert "rollout train" in text and "2/4" in text and "50 tok/s" in text and "longest 70 tok" in text


def test_switch_and_interval_from_the_environment():
    assert rp.from_env({}) is None
    assert rp.from_env({"NPU_RL_ROLLOUT_PROGRESS": "1"}).interval_s == 60.0
    assert rp.from_env({"NPU_RL_ROLLOUT_PROGRESS": "yes", "NPU_RL_ROLLOUT_PROGRESS_INTERVAL": "5"}).interval_s == 5.0
    with pytest.raises(NpuRlError, match="NPU_RL_ROLLOUT_PROGRESS='maybe'"):
        rp.from_env({"NPU_RL_ROLLOUT_PROGRESS": "maybe"})
    with pytest.raises(NpuRlError, match="NPU_RL_ROLLOUT_PROGRESS_INTERVAL"):
        rp.from_env({"NPU_RL_ROLLOUT_PROGRESS": "1", "NPU_RL_ROLLOUT_PROGRESS_INTERVAL": "0"})


# --------------------------------------------------------------------------------------------------
# The patched verl replay buffer.


def listing(groups: dict[str, str], lens: dict[str, list[int]], step: int = 1) -> dict:
    """What tq.kv_list() returns: partition -> key -> tag."""
    items: dict = {}
    for uid, status in groups.items():
        items[uid] = {"is_prompt": True, "status": status, "global_steps": step}
        for s, ln in enumerate(lens.get(uid, [])):
            items[f"{uid}_{s}_0"] = {"status": "success", "response_len": ln, "prompt_len": 8, "global_steps": step}
    return {"train": items}


def _no_store(*args, **kwargs):
    raise AssertionError("the test must not reach TransferQueue's store (it would connect to Ray)")


@pytest.fixture
def reporter(monkeypatch):
    clock, out = Clock(), io.StringIO()
    r = RolloutProgress(interval_s=1e9, stream=out, tty=False, clock=clock)
    monkeypatch.setattr(rp, "_REPORTER", r)
    monkeypatch.setattr(rp, "_READ_ENV", True)
    return r, clock, out


def test_patched_replay_buffer_reports_while_sample_waits(monkeypatch, reporter):
    pytest.importorskip("transfer_queue")
    from verl.trainer.ppo.v1 import replay_buffer as rbmod

    r, clock, out = reporter
    script = [
        listing({"u1": "running", "u2": "running"}, {}),
        listing({"u1": "finished", "u2": "running"}, {"u1": [100, 200]}),
        listing({"u1": "finished", "u2": "finished"}, {"u1": [100, 200], "u2": [300, 50]}),
    ]
    calls = iter(script)
    last = [script[-1]]

    def kv_list():
        clock.t += 2
        last[0] = next(calls, last[0])
        return last[0]

    cleared: list = []
    monkeypatch.setattr(rbmod.tq, "kv_list", kv_list)
    monkeypatch.setattr(rbmod.tq, "kv_clear", lambda **kw: cleared.append(kw))
    monkeypatch.setattr(rbmod.tq, "kv_batch_get", _no_store)
    rb = rbmod.ReplayBuffer(
        trainer_mode="sync",
        trainer_config={},
        max_off_policy_threshold=8,
        max_off_policy_strategy="drop",
        sampler_kwargs={},
        poll_interval=0.0,
    )
    batch, _metrics = rb.sample(global_steps=1, partition_id="train", batch_size=2)
    assert sorted(batch.keys) == ["u1_0_0", "u1_1_0", "u2_0_0", "u2_1_0"]
    assert [sorted(c["keys"]) for c in cleared] == [["u1", "u2"]]  # the prompt tags sample() clears
    lines = out.getvalue().splitlines()
    assert lines[0] == "rollout train: 0/? responses, 0/2 groups, 0 tok/s, longest 0 tok, 2 groups running for 0:00:00"
    assert lines[-1] == "rollout train: 4/4 responses, 2/2 groups, 162 tok/s, longest 300 tok, done in 0:00:04"


def test_patched_replay_buffer_is_silent_when_off(monkeypatch):
    pytest.importorskip("transfer_queue")
    from verl.trainer.ppo.v1 import replay_buffer as rbmod

    monkeypatch.setattr(rp, "_REPORTER", None)
    monkeypatch.setattr(rp, "_READ_ENV", False)
    monkeypatch.delenv("NPU_RL_ROLLOUT_PROGRESS", raising=False)
    monkeypatch.setattr(rbmod.tq, "kv_list", lambda: listing({"u1": "finished"}, {"u1": [5]}))
    monkeypatch.setattr(rbmod.tq, "kv_clear", _no_store)
    rb = rbmod.ReplayBuffer("sync", {}, 8, "drop", {}, poll_interval=0.0)
    rb._sync_metadata_from_transfer_queue()
    assert rp._READ_ENV and rp._REPORTER is None and rb.finished_keys["train"] == {"u1"}


def test_multi_output_sessions_count_once():
    clock, out = Clock(), io.StringIO()
    p = RolloutProgress(stream=out, tty=False, clock=clock)
    outputs = {"a_0_0": {"response_len": 5}, "a_0_1": {"response_len": 7}, "a_1_0": {"response_len": 3}}
    p.observe("train", snap(running=["b"]))
    clock.t += 1
    text = p.observe("train", snap(running=["b"], finished=["a"], traj=outputs))
    assert text.startswith("rollout train: 2/4 responses, 1/2 groups, 15 tok/s, longest 7 tok")


def test_a_group_with_every_response_but_a_running_status_is_named_after_two_quiet_minutes():
    """The hang seen in a CPU DAPO run: all n responses of group x are in TransferQueue, its status
    never leaves 'running', nothing else arrives; group z still lacks a response and is not named."""
    clock, out = Clock(), io.StringIO()
    p = RolloutProgress(interval_s=60, stream=out, tty=False, clock=clock)
    s = snap(
        running=["x", "z"], finished=["y"], traj={**traj("y", 2, [1, 1]), **traj("x", 2, [1, 1]), **traj("z", 1, [1])}
    )
    for _ in range(3):  # 0, 60, 120 s without a new response
        p.observe("train", s)
        clock.t += 60
    warnings = [line for line in out.getvalue().splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1, out.getvalue()
    assert "group(s) x have all 2 responses" in warnings[0] and "for 0:02:00" in warnings[0]
    assert "z" not in warnings[0].split("have all")[0]


def test_a_new_response_restarts_the_quiet_clock():
    clock, out = Clock(), io.StringIO()
    p = RolloutProgress(interval_s=60, stream=out, tty=False, clock=clock)
    base = {**traj("y", 2, [1, 1]), **traj("x", 2, [1, 1])}
    for i in range(4):  # a response of another group arrives every minute: the run is moving
        p.observe("train", snap(running=["x", "w"], finished=["y"], traj={**base, **traj("w", i + 1, [1] * (i + 1))}))
        clock.t += 60
    assert "warning:" not in out.getvalue()
