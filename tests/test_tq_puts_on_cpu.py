"""Coalesced TransferQueue puts (npu_rl.tq_puts; verl patch 0013-verl-feature-coalesced-trajectory-puts).

The coalescer is driven here by a put that records its calls, at the scale of a real step (512
prompts x 16 responses, each prompt's status before and after its trajectories, as verl's
``AgentLoopWorkerTQ`` writes them), and counted in calls, not timed. The last test writes through
the coalescer the patched worker builds into a real TransferQueue (local Ray) and reads every
trajectory back with verl's reader.
"""

from __future__ import annotations

import asyncio
import random
import re

import pytest

from npu_rl.tq_puts import PutCoalescer


class Recorder:
    """A TransferQueue stand-in that stores what each call wrote; each call takes ``hops`` loop turns
    (a request and its reply), and the ones listed in ``fail_calls`` raise."""

    def __init__(self, hops: int = 3, fail_calls: tuple[int, ...] = ()):
        self.hops, self.fail_calls = hops, fail_calls
        self.calls: list[tuple[str, list[str], bool]] = []
        self.store: dict[tuple[str, str], dict] = {}
        self.order: list[tuple[str, str]] = []

    async def __call__(self, keys, fields, tags, partition_id):
        self.calls.append((partition_id, list(keys), fields is not None))
        n = len(self.calls)
        for _ in range(self.hops):
            await asyncio.sleep(0)
        if n in self.fail_calls:
            raise ConnectionError(f"call {n} lost")
        for i, key in enumerate(keys):
            row = self.store.setdefault((partition_id, key), {})
            row.update(tags[i])
            if fields is not None:
                row["fields"] = fields[i]
            self.order.append((partition_id, key))


async def _step(coalescer, prompts: int, n: int, seed: int = 0) -> None:
    """verl's _run_prompt for every prompt at once: status running, n sessions that finish in random
    engine steps and put their trajectory, then status finished."""
    rng = random.Random(seed)

    async def session(uid, i):
        for _ in range(rng.randrange(40)):  # decode steps until this response ends
            await asyncio.sleep(0)
        fields = {"responses": [uid, i], "reward_score": float(i % 2)}
        await coalescer.put([f"{uid}_{i}_0"], [fields], [{"status": "success", "response_len": 2}], "train")

    async def run_prompt(uid):
        await coalescer.put([uid], None, [{"status": "running"}], "train")
        await asyncio.gather(*(session(uid, i) for i in range(n)))
        await coalescer.put([uid], None, [{"status": "finished"}], "train")

    await asyncio.gather(*(run_prompt(f"p{p}") for p in range(prompts)))


def test_a_step_of_8192_trajectories_takes_a_few_hundred_calls_with_every_row_intact():
    rec = Recorder()
    co = PutCoalescer(rec, report_every_s=0)
    asyncio.run(_step(co, prompts=512, n=16))
    trajectories = [k for (_, k) in rec.store if k.count("_") == 2]
    assert len(trajectories) == 512 * 16
    for p in range(512):
        assert rec.store[("train", f"p{p}")] == {"status": "finished"}
        for i in range(16):
            row = rec.store[("train", f"p{p}_{i}_0")]
            assert row["fields"] == {"responses": [f"p{p}", i], "reward_score": float(i % 2)}
            assert row["status"] == "success"
    # verl's order: a prompt is finished only after its trajectories are stored
    where = {}
    for pos, (_, key) in enumerate(rec.order):
        where.setdefault(key, []).append(pos)
    for p in range(512):
        last_traj = max(where[f"p{p}_{i}_0"][0] for i in range(16))
        assert where[f"p{p}"][-1] > last_traj
    # one call per put would be 512 * 18 = 9,216; the calls follow the 40 decode steps
    assert co.stats.puts == 512 * 18
    assert co.stats.keys == 512 * 18
    assert len(rec.calls) == co.stats.calls <= 50, co.stats.line()  # 19 when written
    # tags-only and field puts never share a call
    for _, keys, with_fields in rec.calls:
        assert all((k.count("_") == 2) == with_fields for k in keys)


def test_an_idle_worker_sends_at_once():
    rec = Recorder(hops=1)

    async def main():
        task = asyncio.ensure_future(PutCoalescer(rec).put(["a_0_0"], [{"x": 1}], [{}], "val"))
        for _ in range(2):  # the put's turn, then its call's: no timer, no wait for company
            await asyncio.sleep(0)
        assert rec.calls == [("val", ["a_0_0"], True)]
        await task

    asyncio.run(main())


def test_a_lost_call_fails_every_put_it_carried_and_the_next_call_goes_out():
    rec = Recorder(fail_calls=(2,))
    co = PutCoalescer(rec)

    async def main():
        first = asyncio.ensure_future(co.put(["k0"], None, [{"s": 0}], "train"))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        rest = [asyncio.ensure_future(co.put([f"k{i}"], None, [{"s": i}], "train")) for i in range(1, 5)]
        results = await asyncio.gather(first, *rest, return_exceptions=True)
        assert results[0] is None
        assert all(isinstance(r, ConnectionError) for r in results[1:])  # k1..k4 rode call 2
        await co.put(["k5"], None, [{"s": 5}], "train")

    asyncio.run(main())
    assert [c[1] for c in rec.calls] == [["k0"], ["k1", "k2", "k3", "k4"], ["k5"]]
    assert set(rec.store) == {("train", "k0"), ("train", "k5")}


def test_calls_are_split_at_max_keys_and_by_partition_and_field_names():
    rec = Recorder()
    co = PutCoalescer(rec, max_keys=3)

    async def main():
        block = asyncio.ensure_future(co.put(["x"], [{"a": -1}], [{}], "train"))
        await asyncio.sleep(0)
        await asyncio.sleep(0)  # the first call is on the wire: the rest wait together
        puts = [co.put([f"t{i}"], [{"a": i}], [{}], "train") for i in range(5)]
        puts += [co.put(["v0"], [{"a": 0}], [{}], "val"), co.put(["b0"], [{"b": 0}], [{}], "train")]
        puts += [co.put(["big0", "big1", "big2", "big3"], [{"a": 9}] * 4, [{}] * 4, "train")]
        await asyncio.gather(block, *puts)

    asyncio.run(main())
    calls = [(p, keys) for p, keys, _ in rec.calls]
    assert calls[0] == ("train", ["x"])
    assert ("train", ["t0", "t1", "t2"]) in calls and ("train", ["t3", "t4"]) in calls
    assert ("val", ["v0"]) in calls and ("train", ["b0"]) in calls
    assert ("train", ["big0", "big1", "big2", "big3"]) in calls  # one put is never split
    assert len(calls) == 6


def test_the_coalescer_says_what_it_did_at_its_report_interval():
    lines = []
    co = PutCoalescer(Recorder(), report_every_s=1e-9, report=lines.append)
    asyncio.run(co.put(["a", "b"], None, [{}, {}], "train"))
    assert lines == ["agent-loop puts so far: 1 puts (2 keys) in 1 TransferQueue calls, 1.0 puts a call"]


@pytest.mark.parametrize(
    ("keys", "fields", "tags", "message"),
    [
        (["a", "b"], None, [{}], "2 key(s) with 1 tag(s)"),
        (["a"], [{"x": 1}, {"x": 2}], [{}], "2 field dict(s)"),
        (["a", "b"], [{"x": 1}, {"y": 2}], [{}, {}], "different names"),
    ],
)
def test_malformed_puts_are_refused_before_anything_is_sent(keys, fields, tags, message):
    rec = Recorder()
    with pytest.raises(ValueError, match=re.escape(message)):
        asyncio.run(PutCoalescer(rec).put(keys, fields, tags, "train"))
    assert rec.calls == []


@pytest.mark.serial
@pytest.mark.slow
def test_trajectories_through_the_coalescer_read_back_from_a_real_transfer_queue(monkeypatch):
    """verl's own put (npu_rl.tq_puts.verl_put, as the patched worker calls it) into TransferQueue
    0.1.8 on a private local Ray: trajectories of different lengths put one by one and coalesced
    into shared calls read back equal, row by row, through tq.kv_batch_get, and every status tag lands."""
    import os

    ray = pytest.importorskip("ray")
    tq = pytest.importorskip("transfer_queue")
    import torch
    from omegaconf import OmegaConf

    from npu_rl import tq_puts

    class Worker:
        pass

    said = []
    monkeypatch.setattr(tq_puts, "worker_log", said.append)

    def trajectory(uid: str, i: int) -> dict:
        prompt = torch.arange(5 + i % 3, dtype=torch.int64)
        response = torch.arange(1 + i % 4, dtype=torch.int64) + 100
        return {
            "prompts": prompt,
            "responses": response,
            "response_mask": torch.ones_like(response),
            "input_ids": torch.cat([prompt, response]),
            "reward_score": float(i),
            "extra_fields": {"reward_extra_info": {"acc": float(i % 2)}, "uid": uid},
            "uid": uid,
        }

    async def write(worker):
        coalescer = tq_puts.for_worker(worker)

        async def prompt(uid):
            await coalescer.put([uid], None, [{"status": "running"}], "train")
            await asyncio.gather(
                *(
                    coalescer.put([f"{uid}_{i}_0"], [trajectory(uid, i)], [{"status": "success"}], "train")
                    for i in range(8)
                )
            )
            await coalescer.put([uid], None, [{"status": "finished"}], "train")

        await asyncio.gather(*(prompt(f"u{p}") for p in range(6)))
        return coalescer.stats

    before = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"
    try:
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
        tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}))
        # one trajectory the way verl 0.9.1 writes it without the patch: its own call
        asyncio.run(tq_puts.verl_put(["solo_0_0"], [trajectory("solo", 3)], [{"status": "success"}], "train"))
        stats = asyncio.run(write(Worker()))
        assert stats.calls < stats.puts == 6 * 10  # some calls carried several puts
        assert len(said) == 1 and said[0].startswith("agent-loop puts coalesced (verl patch 0013)")  # no silent no-op
        keys = ["solo_0_0"] + [f"u{p}_{i}_0" for p in range(6) for i in range(8)]
        got = tq.kv_batch_get(keys=keys, partition_id="train")
        listing = tq.kv_list(partition_id="train")["train"]
    finally:
        try:
            tq.close()
        finally:
            ray.shutdown()
            if before is None:
                os.environ.pop("RAY_AUTH_MODE", None)
            else:
                os.environ["RAY_AUTH_MODE"] = before
    for row, key in enumerate(keys):
        uid, i = key.split("_")[0], (3 if key.startswith("solo") else int(key.split("_")[1]))
        want = trajectory(uid, i)
        for name in ("prompts", "responses", "input_ids"):
            assert got[name][row].tolist() == want[name].tolist(), (key, name)
        assert float(got["reward_score"][row]) == want["reward_score"]
        assert got["extra_fields"][row] == want["extra_fields"]
        assert listing[key]["status"] == "success"
    assert all(listing[f"u{p}"]["status"] == "finished" for p in range(6))
