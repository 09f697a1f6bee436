"""Rollout rebalance core: the dispatcher against fake asyncio replicas (no vLLM, no Ray).

Every request dispatched exactly once, never more than max_num_seqs in flight per replica,
longest-predicted-first release, failing and slow replicas lose nothing, and the outputs the trainer
sees are in input order: GRPO advantages computed with verl's own compute_grpo_outcome_advantage on
the restored outputs equal the ones computed without any dispatcher.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter, defaultdict

import numpy as np
import pytest
import torch

from npu_rl.errors import NpuRlError
from npu_rl.rebalance import (
    Dispatcher,
    DispatchPolicy,
    EMALengthPredictor,
    dispatch_batch,
    predicted_work,
    prompt_key,
    restore_order,
)


class OraclePredictor:
    """Knows the true length of every group (the 'perfect prediction' case)."""

    def __init__(self, lengths: dict[str, float]):
        self.lengths = lengths

    def predict(self, key, prompt_len):
        return self.lengths.get(key)

    def observe(self, key, prompt_len, response_len):
        pass

    def prior(self):
        return 1.0


class FakeReplica:
    """An asyncio 'vLLM replica': a request of length L takes L * tick seconds; counts its slots."""

    def __init__(self, name: str, max_num_seqs: int, tick: float = 2e-4, fail: bool = False, slow: float = 1.0):
        self.name, self.max_num_seqs, self.tick, self.fail, self.slow = name, max_num_seqs, tick, fail, slow
        self.inflight = 0
        self.max_seen = 0
        self.calls: Counter[str] = Counter()
        self.served: list[str] = []
        self.started: list[str] = []

    async def generate(self, rid: str, length: int) -> dict:
        self.calls[rid] += 1
        self.inflight += 1
        self.max_seen = max(self.max_seen, self.inflight)
        self.started.append(rid)
        try:
            assert self.inflight <= self.max_num_seqs, f"{self.name}: {self.inflight} > max_num_seqs"
            await asyncio.sleep(length * self.tick * self.slow)
            if self.fail:
                raise ConnectionError(f"{self.name} is down")
            self.served.append(rid)
            return {"rid": rid, "replica": self.name, "len": length}
        finally:
            self.inflight -= 1


def run(coro):
    return asyncio.run(coro)


def make_requests(num_prompts: int, n: int, seed: int = 0) -> list[dict]:
    """GRPO-shaped requests: num_prompts groups of n samples, INTERLEAVED (sample-major order), each
    with a true response length and a reward that depends on its prompt and sample."""
    rng = random.Random(seed)
    reqs = []
    for s in range(n):
        for p in range(num_prompts):
            reqs.append(
                {
                    "rid": f"p{p}s{s}",
                    "group": f"g{p}",
                    "uid": p,
                    "len": rng.randint(1, 120),
                    "reward": float(rng.random() < (p + 1) / (num_prompts + 1)) + 0.1 * s,
                }
            )
    return reqs


def test_every_request_once_and_slots_bounded():
    replicas = {f"r{i}": FakeReplica(f"r{i}", max_num_seqs=3) for i in range(4)}
    reqs = make_requests(num_prompts=10, n=5)

    async def main():
        d = Dispatcher({k: r.max_num_seqs for k, r in replicas.items()}, gather_s=0.01)
        outs = await dispatch_batch(
            d,
            reqs,
            lambda r, t: replicas[t].generate(r["rid"], r["len"]),
            group_of=lambda r: r["group"],
            response_len=lambda o: o["len"],
        )
        return d, outs

    d, outs = run(main())
    calls = sum((r.calls for r in replicas.values()), Counter())
    assert sorted(calls) == sorted(r["rid"] for r in reqs)
    assert set(calls.values()) == {1}
    assert all(r.max_seen <= 3 for r in replicas.values())
    assert max(r.max_seen for r in replicas.values()) == 3  # the slots were actually used
    assert [o["rid"] for o in outs] == [r["rid"] for r in reqs]
    m = d.step_metrics()
    assert len(m) == 1 and m[0]["rollout_rebalance/requests/max"] >= 1
    assert sum(m[0][f"rollout_rebalance/r{i}/requests"] for i in range(4)) == len(reqs)
    assert d.policy.idle()


def test_longest_predicted_first():
    rng = random.Random(3)
    lengths = {f"g{i}": float(rng.randint(1, 1000)) for i in range(40)}
    rep = FakeReplica("r0", max_num_seqs=2, tick=1e-5)

    async def main():
        d = Dispatcher({"r0": 2}, predictor=OraclePredictor(lengths), gather_s=0.05)
        await asyncio.gather(*(d.run(g, lambda t, g=g: rep.generate(g, 1), group=g, prompt_len=100) for g in lengths))

    run(main())
    started = [lengths[g] for g in rep.started]
    assert started == sorted(lengths.values(), reverse=True)


def test_fifo_order_keeps_arrival():
    rep = FakeReplica("r0", max_num_seqs=1, tick=1e-5)
    groups = [f"g{i}" for i in range(10)]

    async def main():
        d = Dispatcher({"r0": 1}, predictor=OraclePredictor({g: float(i) for i, g in enumerate(groups)}), order="fifo")
        await asyncio.gather(*(d.run(g, lambda t, g=g: rep.generate(g, 1), group=g) for g in groups))

    run(main())
    assert rep.started == groups


def test_failing_replica_loses_nothing():
    replicas = {"ok0": FakeReplica("ok0", 4), "bad": FakeReplica("bad", 4, fail=True), "ok1": FakeReplica("ok1", 4)}
    reqs = make_requests(num_prompts=8, n=4, seed=1)

    async def main():
        d = Dispatcher({k: 4 for k in replicas}, max_target_failures=2)
        outs = await dispatch_batch(
            d, reqs, lambda r, t: replicas[t].generate(r["rid"], r["len"]), group_of=lambda r: r["group"]
        )
        return d, outs

    d, outs = run(main())
    served = Counter(replicas["ok0"].served + replicas["ok1"].served)
    assert sorted(served) == sorted(r["rid"] for r in reqs) and set(served.values()) == {1}
    assert [o["rid"] for o in outs] == [r["rid"] for r in reqs]
    assert all(o["replica"] != "bad" for o in outs)
    # out of rotation after 2 consecutive failures: at most its 4 slots + 1 refill were ever tried
    assert 2 <= sum(replicas["bad"].calls.values()) <= 4 + 1
    assert d.policy.targets["bad"].healthy is False
    assert d.last_step is not None and d.last_step.failed_targets == ["bad"]


def test_all_replicas_failing_raises_instead_of_hanging():
    replicas = {"a": FakeReplica("a", 2, fail=True), "b": FakeReplica("b", 2, fail=True)}
    reqs = make_requests(num_prompts=4, n=2)

    async def main():
        d = Dispatcher({"a": 2, "b": 2}, max_target_failures=1)
        return await asyncio.wait_for(
            dispatch_batch(d, reqs, lambda r, t: replicas[t].generate(r["rid"], 1), group_of=lambda r: r["group"]), 5
        )

    with pytest.raises((NpuRlError, ConnectionError)):
        run(main())


def test_slow_replica_gets_less_work():
    replicas = {"fast": FakeReplica("fast", 2), "slow": FakeReplica("slow", 2, slow=8.0)}
    reqs = [{"rid": f"q{i}", "group": f"q{i}", "len": 20} for i in range(40)]

    async def main():
        d = Dispatcher({"fast": 2, "slow": 2})
        return await dispatch_batch(
            d, reqs, lambda r, t: replicas[t].generate(r["rid"], r["len"]), group_of=lambda r: r["group"]
        )

    outs = run(main())
    per = Counter(o["replica"] for o in outs)
    assert per["fast"] + per["slow"] == 40
    assert per["fast"] >= 3 * per["slow"]


def grpo_advantages(rewards: list[float], uids: list[int]) -> torch.Tensor:
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    t = 3
    token_level_rewards = torch.zeros(len(rewards), t)
    token_level_rewards[:, -1] = torch.tensor(rewards)
    mask = torch.ones(len(rewards), t)
    adv, _ = compute_grpo_outcome_advantage(token_level_rewards, mask, np.array(uids, dtype=object))
    return adv[:, 0]


def test_order_restoration_keeps_grpo_advantages():
    """The trainer pairs output i with input i's uid. The restored outputs give exactly the GRPO
    advantages of a run without dispatcher; outputs in completion order (the reference's first data
    rebalance) give different ones, which this test would catch."""
    reqs = make_requests(num_prompts=6, n=4, seed=7)
    replicas = {f"r{i}": FakeReplica(f"r{i}", 3) for i in range(3)}
    completion: list[str] = []

    async def call(r, target):
        out = await replicas[target].generate(r["rid"], r["len"])
        completion.append(r["rid"])
        return {**out, "reward": r["reward"]}

    async def main():
        return await dispatch_batch(Dispatcher({k: 3 for k in replicas}), reqs, call, group_of=lambda r: r["group"])

    outs = run(main())
    uids = [r["uid"] for r in reqs]
    expected = grpo_advantages([r["reward"] for r in reqs], uids)
    restored = grpo_advantages([o["reward"] for o in outs], uids)
    assert torch.allclose(restored, expected)

    by_rid = {r["rid"]: r for r in reqs}
    assert completion != [r["rid"] for r in reqs]  # the dispatcher really did reorder execution
    shuffled = grpo_advantages([by_rid[rid]["reward"] for rid in completion], uids)
    assert not torch.allclose(shuffled, expected)


def test_restore_order_guards():
    assert restore_order([(1, "b"), (0, "a")], 2) == ["a", "b"]
    with pytest.raises(NpuRlError, match="twice"):
        restore_order([(0, "a"), (0, "a")], 2)
    with pytest.raises(NpuRlError, match="missing"):
        restore_order([(0, "a")], 2)
    with pytest.raises(NpuRlError, match="outside"):
        restore_order([(2, "a")], 2)


def test_policy_balances_predicted_work_lpt():
    # 4 targets, plenty of slots: the longest requests are spread one per target first.
    p = DispatchPolicy({f"t{i}": 100 for i in range(4)})
    lengths = [30000, 29000, 28000, 27000] + [1000] * 60
    for i, L in enumerate(lengths):
        p.submit(p.make_request(f"r{i}", group=f"g{i}", prompt_len=2000, predicted_len=L), 0.0)
    out = p.assign(0.0)
    assert len(out) == len(lengths)
    long_targets = {r.target for r in out if r.predicted_len > 10000}
    assert len(long_targets) == 4
    loads = [t.load for t in p.targets.values()]
    assert max(loads) / min(loads) < 1.1
    # count-based (verl default) would give each target 16 requests regardless of length
    assert predicted_work(30000, 2000) > 10 * predicted_work(1000, 2000)


def test_policy_keep_groups_and_affinity():
    p = DispatchPolicy({"a": 8, "b": 8}, keep_groups=True)
    for s in range(4):
        for g in range(2):
            p.submit(p.make_request(f"g{g}s{s}", group=f"g{g}", prompt_len=10, predicted_len=100 * (g + 1)), 0.0)
    out = p.assign(0.0)
    per_group = defaultdict(set)
    for r in out:
        per_group[r.group].add(r.target)
    assert all(len(t) == 1 for t in per_group.values())
    assert per_group["g0"] != per_group["g1"]
    # affinity: a request bound to a full target waits; others pass it
    q = DispatchPolicy({"a": 1, "b": 1})
    q.submit(q.make_request("x", group="x", prompt_len=0, predicted_len=10), 0.0)
    assert [r.target for r in q.assign(0.0)] == ["a"]
    q.submit(q.make_request("y", group="y", prompt_len=0, predicted_len=99, affinity="a"), 1.0)
    q.submit(q.make_request("z", group="z", prompt_len=0, predicted_len=1), 1.0)
    assert [(r.request_id, r.target) for r in q.assign(1.0)] == [("z", "b")]
    q.finish("x", 2.0, response_len=10)
    assert [(r.request_id, r.target) for r in q.assign(2.0)] == [("y", "a")]


def test_policy_errors():
    p = DispatchPolicy({"a": 1})
    r = p.make_request("x", group="x", prompt_len=0, predicted_len=1)
    p.submit(r, 0.0)
    with pytest.raises(NpuRlError, match="twice"):
        p.submit(p.make_request("x", group="x", prompt_len=0, predicted_len=1), 0.0)
    with pytest.raises(NpuRlError, match="not in flight"):
        p.finish("nope", 0.0)
    with pytest.raises(NpuRlError, match="capacity"):
        DispatchPolicy({"a": 0})
    with pytest.raises(NpuRlError, match="ROLLOUT_REBALANCE_ORDER"):
        DispatchPolicy({"a": 1}, order="shortest")


def test_step_metrics_idle_fraction():
    p = DispatchPolicy({"a": 1, "b": 1})
    for i, L in enumerate([100, 10]):
        p.submit(p.make_request(f"r{i}", group=f"g{i}", prompt_len=0, predicted_len=L), 0.0)
    p.assign(0.0)
    p.finish("r1", 10.0, response_len=10)
    p.finish("r0", 100.0, response_len=100)
    (step,) = p.drain_steps()
    m = step.metrics()
    assert m["rollout_rebalance/step_s"] == 100.0
    assert m["rollout_rebalance/a/idle_fraction"] == 0.0
    assert m["rollout_rebalance/b/idle_fraction"] == pytest.approx(0.9)
    assert m["rollout_rebalance/predicted_actual_corr"] == pytest.approx(1.0)


def test_ema_predictor():
    e = EMALengthPredictor(decay=0.5, prior_len=1000)
    assert e.predict("k", 10) is None and e.prior() == 1000
    e.observe("k", 10, 100)
    e.observe("k", 10, 300)
    assert e.predict("k", 10) == 200.0
    assert e.prior() == 200.0
    with pytest.raises(NpuRlError, match="ROLLOUT_REBALANCE_EMA_DECAY"):
        EMALengthPredictor(decay=1.0)
    assert prompt_key([1, 2, 3]) == prompt_key(np.array([1, 2, 3])) != prompt_key([1, 2, 4])


def test_preflight_checks():
    from omegaconf import OmegaConf

    from npu_rl.preflight.rebalance import check_rollout_rebalance
    from npu_rl.preflight.report import Report

    def run_check(env, **rollout):
        base = {"name": "vllm", "max_num_seqs": 256, "data_parallel_size": 32, "response_length": 32768}
        cfg = OmegaConf.create({"actor_rollout_ref": {"rollout": {**base, **rollout}}})
        r = Report()
        check_rollout_rebalance(cfg, env, r)
        return r

    assert not run_check({}).problems  # switch off: nothing checked
    assert not run_check({"ROLLOUT_REBALANCE_ENABLE": "1"}).problems
    r = run_check({"ROLLOUT_REBALANCE_ENABLE": "1", "ROLLOUT_REBALANCE_MAX_INFLIGHT": "x"})
    assert [p.error for p in r.problems] == [True] and "ROLLOUT_REBALANCE_MAX_INFLIGHT" in r.problems[0].message
    r = run_check({"ROLLOUT_REBALANCE_ENABLE": "1"}, name="sglang", disaggregation={"enabled": True})
    assert len(r.errors) == 2
    r = run_check(
        {"ROLLOUT_REBALANCE_ENABLE": "1", "ROLLOUT_REBALANCE_MAX_INFLIGHT": "512", "ROLLOUT_REBALANCE_DP_RANKS": "0"}
    )
    assert not r.errors and {p.key for p in r.warnings} == {
        "ROLLOUT_REBALANCE_MAX_INFLIGHT",
        "ROLLOUT_REBALANCE_DP_RANKS",
    }


def test_policy_kv_budget_holds_requests_centrally():
    p = DispatchPolicy({"a": 10, "b": 10}, kv_budget=1000)
    for i, L in enumerate([600, 500, 300, 100]):
        p.submit(p.make_request(f"r{i}", group=f"g{i}", prompt_len=0, predicted_len=L), 0.0)
    placed = {r.request_id: r.target for r in p.assign(0.0)}
    # r0 (600) and r1 (500) open a and b; r2 (300) fits next to r1 only; r3 (100) fits next to r0
    assert placed == {"r0": "a", "r1": "b", "r2": "b", "r3": "a"}
    q = DispatchPolicy({"a": 10}, kv_budget=1000)
    for i, L in enumerate([900, 800, 10]):
        q.submit(q.make_request(f"r{i}", group=f"g{i}", prompt_len=0, predicted_len=L), 0.0)
    assert [r.request_id for r in q.assign(0.0)] == ["r0"]  # strict order: the 10-token one waits too
    q.finish("r0", 1.0)
    assert [r.request_id for r in q.assign(1.0)] == ["r1", "r2"]


def test_removed_targets_make_requests_wait_not_fail():
    rep = FakeReplica("a", 2, tick=1e-5)

    async def main():
        d = Dispatcher({"a": 2})
        d.remove_target("a")  # e.g. verl's hybrid mode during weight sync
        task = asyncio.ensure_future(d.run("x", lambda t: rep.generate("x", 1), group="x"))
        await asyncio.sleep(0.05)
        assert not task.done() and d.policy.waiting == 1
        d.add_target("a", 2)
        return await asyncio.wait_for(task, 2)

    assert run(main())["rid"] == "x"


def test_cancelled_waiter_leaves_no_trace():
    async def main():
        d = Dispatcher({"a": 1})
        first = await d.acquire("first", group="g")
        waiter = asyncio.ensure_future(d.acquire("second", group="g"))
        await asyncio.sleep(0.01)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert d.policy.waiting == 0
        d.release("first", response_len=5)
        assert first == "a" and d.policy.idle()

    run(main())
