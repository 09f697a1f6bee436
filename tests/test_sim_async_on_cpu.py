"""The fully-async / one-step-off pipeline simulator (npu_rl.sim.async_pipeline) on hand-worked tiny cases.

Cost model in the hand-worked cases: every decode iteration 10 ms (t0 = 10, t1 = t2 = 0); prefill 1 ms per
new token (no context factor) where a case needs it, else free. One replica unless stated.
"""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest

from npu_rl.sim import CostModel, ReplicaConfig, SimError, SimRequest, simulate
from npu_rl.sim.async_pipeline import (
    REF_235B_TOKENS,
    AsyncConfig,
    TrainerModel,
    WeightSyncModel,
    rollout_work_ms,
    simulate_fully_async,
    simulate_one_step_off,
    simulate_sync,
)
from npu_rl.sim.model import lower_bound
from npu_rl.sim.routing import VerlDefaultRouting

FLAT = CostModel(t0=10.0, t1=0.0, t2=0.0, prefill_per_token=0.0)
PREFILL = CostModel(t0=10.0, t1=0.0, t2=0.0, prefill_per_token=1.0, prefill_ctx_tokens=math.inf)


def const_source(prompt: int, lens: list[int]):
    return lambda k: (prompt, lens)


def test_staleness_zero_is_the_sync_timeline_by_hand():
    # one prompt, n = 2, responses of 3 and 5 tokens: the prefill samples the first token, so the longer
    # needs 4 iterations = 40 ms; train 200 ms; sync 100 ms: each version takes 40 + 200 + 100 = 340 ms
    acfg = AsyncConfig(n=2, required_samples=1, staleness_threshold=0.0, sync_s=0.1)
    res = simulate_fully_async(const_source(10, [3, 5]), FLAT, ReplicaConfig(1, 4), acfg, lambda tok: 0.2, 3)
    assert [(s.start_ms, s.end_ms, s.sync_end_ms) for s in res.steps] == [
        (40.0, 240.0, 340.0),
        (380.0, 580.0, 680.0),
        (720.0, 920.0, 1020.0),
    ]
    assert res.syncs == [(240.0, 340.0), (580.0, 680.0), (920.0, 1020.0)]
    assert list(res.sample_submit_ms) == [0.0, 340.0, 680.0]  # the next prompt waits for the sync
    assert [s.tokens for s in res.steps] == [2 * 10 + 3 + 5] * 3
    assert all(s.staleness == [0] and s.partial == [False] for s in res.steps)
    assert res.aborts == 0 and res.reprefill_tokens == 0
    tokens, ms, steps = res.throughput(warmup=1)
    assert (tokens, ms, steps) == (56.0, 680.0, 2)


@pytest.mark.parametrize("lockstep", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_staleness_zero_rollout_equals_the_engine(seed, lockstep):
    # staleness 0, one version of the whole batch, concurrency for every prompt: the rollouter's generation
    # is the engine's synchronous step (same admission, KV preemption, prefix caching, lockstep)
    rng = np.random.default_rng(seed)
    b, n = 8, 4
    lens = rng.integers(1, 3000, size=(b, n))
    plen = rng.integers(10, 500, size=b)
    cost = CostModel.qwen3_32b_tp8_a3_graph()
    cfg = ReplicaConfig(1, max_num_seqs=8, kv_budget_tokens=7000, lockstep=lockstep)
    acfg = AsyncConfig(n=n, required_samples=b, max_concurrent_samples=b)
    res = simulate_fully_async(lambda k: (int(plen[k]), lens[k].tolist()), cost, cfg, acfg, lambda tok: 1.0, 1)
    reqs = [SimRequest(k * n + j, k, int(plen[k]), int(lens[k][j])) for k in range(b) for j in range(n)]
    eng = simulate(reqs, cost, cfg, VerlDefaultRouting(num_workers=1, interleave="sequential"))
    assert res.steps[0].start_ms == pytest.approx(eng.step_ms, rel=1e-12)
    assert res.reprefill_tokens == eng.reprefill_tokens  # KV preemptions re-prefill the same tokens
    assert eng.reprefill_tokens > 0 or seed  # at least one case exercises preemption


def test_partial_rollout_resume_reprefills_by_hand():
    # prompts of 10 tokens, n = 2. Sample 0 responds (2, 2), sample 1 (100, 100), later samples (2, 2).
    # staleness 1, required 1, trigger 1: max_required = 1 * 2 * 1 = 2 samples per version.
    lens = {0: [2, 2], 1: [100, 100]}
    acfg = AsyncConfig(n=2, required_samples=1, staleness_threshold=1.0, sync_s=0.05, max_concurrent_samples=2)
    res = simulate_fully_async(lambda k: (10, lens.get(k, [2, 2])), PREFILL, ReplicaConfig(1, 4), acfg,
                               lambda tok: 0.1, 3)  # fmt: skip
    # t=0: both samples admitted; prompt prefills 10 + 10 ms (prefix cache: once per group); sample 0 needs
    # 1 iteration -> done at 30; trainer 30-130; the sync aborts sample 1 at its first boundary >= 130
    # (30 + 10 x 10 iterations: 12 tokens each), sync + resume 50 ms -> 180
    s0, s1, s2 = res.steps
    assert (s0.start_ms, s0.end_ms, s0.sync_end_ms) == (30.0, 130.0, 180.0)
    # at 180: the prefix cache was reset. Resumed requests first: prompt + 12 generated = 22 tokens, then
    # 12 (the prompt is cached again by its sibling), then sample 2's prompt 10 (its sibling: cached):
    # 44 ms of prefill, one iteration -> sample 2 done at 234
    assert s1.start_ms == 234.0 and s1.samples == [2]
    # second sync at 334: resumed at 224 with 12 tokens, 11 iterations -> 23; re-prefill 33 + 23. The third
    # sync ends the run (no resume after it)
    assert res.reprefill_tokens == (22 + 12) + (33 + 23)
    assert res.aborts == 2 * 3  # both requests of sample 1 at each of the three syncs
    assert math.isnan(res.sample_done_ms[1])  # still generating across versions
    assert s2.samples == [3]


def test_partial_rollout_reprefill_count_first_resume():
    # the same case with two steps: one resume (after the first sync; the second ends the run)
    lens = {0: [2, 2], 1: [100, 100]}
    acfg = AsyncConfig(n=2, required_samples=1, staleness_threshold=1.0, sync_s=0.05, max_concurrent_samples=2)
    res = simulate_fully_async(lambda k: (10, lens.get(k, [2, 2])), PREFILL, ReplicaConfig(1, 4), acfg,
                               lambda tok: 0.1, 2)  # fmt: skip
    assert res.reprefill_tokens == 22 + 12
    assert res.aborts == 4


def test_partial_rollout_false_truncates_at_the_sync():
    lens = {0: [2, 2], 1: [100, 100]}
    acfg = AsyncConfig(
        n=2, required_samples=1, staleness_threshold=1.0, sync_s=0.05, max_concurrent_samples=2, partial_rollout=False
    )
    res = simulate_fully_async(lambda k: (10, lens.get(k, [2, 2])), PREFILL, ReplicaConfig(1, 4), acfg,
                               lambda tok: 0.1, 2)  # fmt: skip
    # sample 1's requests end with 12 tokens at the first sync (130) and enter the queue then
    assert res.truncated_requests == 2 and res.aborts == 0 and res.reprefill_tokens == 0
    assert res.sample_done_ms[1] == 130.0
    assert res.steps[1].samples == [1] and res.steps[1].tokens == 2 * (10 + 12)


def test_queue_and_staleness_bounds_hold():
    # fast rollout, slow trainer: the rollouter runs ahead until the gates close
    rng = np.random.default_rng(1)
    src = lambda k: (50, rng.integers(1, 400, size=4).tolist())  # noqa: E731
    for stale in (0.0, 0.5, 2.0):
        acfg = AsyncConfig(
            n=4, required_samples=3, trigger_parameter_sync_step=2, staleness_threshold=stale, sync_s=0.01
        )
        res = simulate_fully_async(src, FLAT, ReplicaConfig(2, 8), acfg, lambda tok: 30.0, 8)
        assert acfg.max_required_samples == int(3 * (stale + 1) * 2)
        assert res.max_queue_len <= acfg.max_required_samples
        assert res.max_submitted_per_version <= acfg.max_required_samples
        assert res.max_in_flight_samples <= res.extra["max_concurrent_samples"] <= acfg.max_required_samples
        assert res.dropped_samples == 0
        assert len(res.syncs) == 4 and all(len(s.samples) == 3 for s in res.steps)


@pytest.mark.parametrize("seed", range(12))
def test_invariants_on_random_pipelines(seed):
    # random small pipelines (independent or lockstep replicas, KV budgets, partial rollout on/off):
    # the trainer gets exactly its samples, in order, after they are done; the pools never overlap a sync;
    # verl's gates hold; with staleness 0 nothing is ever aborted or trained stale
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 5))
    table = {}

    def src(k):
        if k not in table:
            r = np.random.default_rng([seed, k])
            table[k] = (int(r.integers(1, 200)), r.integers(1, 1500, size=n).tolist())
        return table[k]

    cfg = ReplicaConfig(
        int(rng.integers(1, 4)),
        max_num_seqs=int(rng.integers(2, 12)),
        kv_budget_tokens=int(rng.choice([5000, 20000])),
        lockstep=bool(rng.integers(2)),
    )
    stale = float(rng.choice([0.0, 0.5, 1.0]))
    acfg = AsyncConfig(
        n=n,
        required_samples=int(rng.integers(1, 5)),
        trigger_parameter_sync_step=int(rng.integers(1, 4)),
        staleness_threshold=stale,
        partial_rollout=bool(rng.integers(2)),
        sync_s=float(rng.uniform(0, 2)),
        resume_s=1.0,
    )
    train = float(rng.uniform(0.1, 20))
    n_steps = 3 * acfg.trigger_parameter_sync_step
    res = simulate_fully_async(src, CostModel.qwen3_32b_tp8_a3_graph(), cfg, acfg, lambda tok: train, n_steps)
    assert len(res.steps) == n_steps
    seen = set()
    prev_end = 0.0
    for k, st in enumerate(res.steps):
        assert len(st.samples) == acfg.required_samples and not seen & set(st.samples)
        seen |= set(st.samples)
        assert all(res.sample_done_ms[s] <= st.start_ms for s in st.samples)
        assert st.start_ms >= prev_end and st.end_ms == pytest.approx(st.start_ms + train * 1e3)
        prev_end = st.sync_end_ms if st.sync_end_ms is not None else st.end_ms
        assert (st.sync_end_ms is not None) == ((k + 1) % acfg.trigger_parameter_sync_step == 0)
        if acfg.partial_rollout:  # every response complete
            assert st.tokens == sum(src(s)[0] * n + sum(src(s)[1]) for s in st.samples)
    assert len(res.syncs) == 3
    for (a, b), st in zip(res.syncs, [s for s in res.steps if s.sync_end_ms is not None], strict=True):
        assert a == st.end_ms and b >= a + (acfg.sync_s + acfg.resume_s) * 1e3 - 1e-6
    assert res.max_queue_len <= acfg.max_required_samples
    assert res.max_submitted_per_version <= acfg.max_required_samples
    assert res.max_in_flight_samples <= res.extra["max_concurrent_samples"]
    assert res.dropped_samples == 0
    if stale == 0.0:
        assert res.aborts == 0 and res.truncated_requests == 0
        assert all(x == 0 for st in res.steps for x in st.staleness)


def test_one_step_off_by_hand():
    # generation of one batch: 40 ms (responses 3 and 5); train 200 ms; sync 100 ms.
    # step k: s = max(gen_end, train_end) + 100; gen_end = s + 40; train_end = s + 200
    res = simulate_one_step_off(const_source(10, [3, 5]), FLAT, ReplicaConfig(1, 4), 1, lambda tok: 0.2, 3, sync_s=0.1)
    assert res.step_end_ms == [340.0, 640.0, 940.0]  # trainer-bound: 300 ms per step
    tokens, ms, steps = res.throughput(warmup=1)
    assert (ms, steps) == (600.0, 2)


def test_sync_by_hand():
    res = simulate_sync(
        const_source(10, [3, 5]), FLAT, ReplicaConfig(1, 4), 1, lambda tok: 0.2, 2, colocated_sync_s=0.01
    )
    assert res.gen_ms == [40.0, 40.0] and res.step_end_ms == [250.0, 500.0]


def test_rollout_work_bounds_the_engine():
    rng = np.random.default_rng(3)
    cost = CostModel.qwen3_32b_tp8_a3_graph()
    for _ in range(5):
        reqs = [SimRequest(i, i // 4, 100, int(x)) for i, x in enumerate(rng.integers(1, 5000, 64))]
        cfg = ReplicaConfig(2, max_num_seqs=16)
        w = rollout_work_ms(reqs, cost, cfg)
        assert w / 2 <= simulate(reqs, cost, cfg, VerlDefaultRouting()).step_ms
        assert w / 2 <= lower_bound(reqs, cost, ReplicaConfig(2, max_num_seqs=16)) + 1e-9


def test_trainer_and_sync_models_follow_their_sources():
    t = TrainerModel.qwen3_235b()
    # the published 235B step: update 2353.23 s and one forward pass 1262.269 s on 128 dies
    assert t.step_s(REF_235B_TOKENS, 128, 0) == pytest.approx(2353.23)
    assert t.step_s(REF_235B_TOKENS, 128, 1) == pytest.approx(2353.23 + 1262.269)
    assert t.step_s(REF_235B_TOKENS, 64, 0) == pytest.approx(2 * 2353.23)
    t32 = TrainerModel.qwen3_32b()
    assert t32.update_tok_s_die == pytest.approx(t.update_tok_s_die * 22 / 32.8)
    w = WeightSyncModel()
    assert w.sync_s(30.5) == pytest.approx(11.0)  # verl's checkpoint engine figure it is built from
    with pytest.raises(SimError, match="trainer dies"):
        t.step_s(100, 0)


def test_bad_input_is_refused():
    with pytest.raises(SimError, match="staleness_threshold"):
        AsyncConfig(n=2, required_samples=1, staleness_threshold=-1)
    with pytest.raises(SimError, match="each must be >= 1"):
        AsyncConfig(n=2, required_samples=0)
    acfg = AsyncConfig(n=2, required_samples=1)
    with pytest.raises(SimError, match="need n=2"):
        simulate_fully_async(const_source(10, [3]), FLAT, ReplicaConfig(1, 4), acfg, lambda tok: 0.1, 1)
    with pytest.raises(SimError, match="kv_budget_tokens"):
        simulate_fully_async(const_source(10, [300, 3]), FLAT, ReplicaConfig(1, 4, 100), acfg, lambda tok: 0.1, 1)


def test_bench_async_quick(tmp_path):
    import importlib.util

    from npu_rl import REPO_ROOT

    spec = importlib.util.spec_from_file_location("bench_async", REPO_ROOT / "benchmarks" / "bench_async.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_async"] = mod  # its dataclasses look their module up
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.modules.pop("bench_async", None)
    out_json, out_png = tmp_path / "a.json", tmp_path / "a.png"
    assert mod.main(["--quick", "--out-json", str(out_json), "--out-png", str(out_png)]) == 0
    import json

    data = json.loads(out_json.read_text())
    (res,) = data["results"]
    best = res["best_async"]
    assert best["tok_s_die"] > 0 and best["ratio_to_sync"] > 0
    assert best["ratio_to_pipeline_bound"] >= 1.0 - 1e-9  # the bound is a bound
    assert res["sync"]["ratio_to_lb"] >= 1.0
    assert out_png.stat().st_size > 10_000
