"""Speculative decoding in the rollout simulator (npu_rl.sim.spec): hand-worked steps, the gate, the
verify cost, acceptance traces, equality with the plain simulator when nothing drafts, bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest

from npu_rl.sim import CostModel, ReplicaConfig, SimError, SimRequest, simulate
from npu_rl.sim.routing import PullRouting, VerlDefaultRouting
from npu_rl.sim.spec import AcceptanceTrace, SpecConfig, load_acceptance, simulate_spec

# t0 10 ms, t1 1 ms per sequence, no KV term, free prefill: every number below is worked by hand
COST = CostModel(t0=10.0, t1=1.0, t2=0.0, prefill_per_token=0.0)
ONE = ReplicaConfig(1, max_num_seqs=8)


def flat(rate: float, length: int) -> AcceptanceTrace:
    return AcceptanceTrace(np.array([0.0]), np.array([rate]), length)


def two_requests():
    return [SimRequest(0, 0, 0, 9), SimRequest(1, 1, 0, 5)]


def test_two_requests_drafting_all_the_way():
    # k 3, gamma 0.5: a drafting iteration costs 10 * (1 + 0.5 * 3) + 1 * b * 4 = 25 + 4b ms.
    # Both start with 1 token from prefill. A (9 tokens, 2 per forward): 1 -> 3 -> 5 -> 7 -> 9, 4 passes.
    # B (5 tokens, 1.5 per forward): 1 -> 2.5 -> 4 -> 5 (capped at its length), 3 passes.
    # Iterations 1-3 at b = 2: 3 * 33 = 99 ms (B done); iteration 4 at b = 1: 29 ms -> A at 128 ms.
    spec = SpecConfig(k=3, batch_threshold=2, gamma=0.5)
    res = simulate_spec(two_requests(), COST, ONE, PullRouting(), spec, {0: flat(2.0, 9), 1: flat(1.5, 5)})
    assert res.finish_ms.tolist() == pytest.approx([128.0, 99.0])
    assert res.extra["forwards"].tolist() == [4, 3]
    assert res.extra["draft_iterations"].tolist() == [4]
    assert res.generated.tolist() == [9, 5]
    assert np.isnan(res.lower_bound_ms)
    # without drafting: A needs 8 iterations, B 4; 4 at b = 2 (12 ms) then 4 at b = 1 (11 ms): 48, 92 ms
    plain = simulate_spec(two_requests(), COST, ONE, PullRouting(), None)
    assert plain.finish_ms.tolist() == pytest.approx([92.0, 48.0])
    assert plain.step_ms == simulate(two_requests(), COST, ONE, PullRouting()).step_ms


def test_batch_gate_drafts_only_in_the_tail():
    # gate 1: while both run (b = 2) iterations are plain (12 ms); B finishes after 4 (1 -> 5) at 48 ms
    # with A at 5 tokens; then A alone drafts: 5 -> 7 -> 9 in 2 iterations of 25 + 4 = 29 ms: 106 ms.
    spec = SpecConfig(k=3, batch_threshold=1, gamma=0.5)
    res = simulate_spec(two_requests(), COST, ONE, PullRouting(), spec, {0: flat(2.0, 9), 1: flat(1.5, 5)})
    assert res.finish_ms.tolist() == pytest.approx([106.0, 48.0])
    assert res.extra["draft_iterations"].tolist() == [2]
    assert res.extra["forwards"].tolist() == [6, 4]


def test_verify_cost_has_the_kv_term_once_and_per_token_compute():
    # one request, prompt 100, 5 tokens, t2 = 0.01, gamma 0, k 3, 2 tokens per forward: 1 -> 3 -> 5.
    # kv = 101 then 103: (10 + 1 * 4 + 1.01) + (10 + 4 + 1.03) = 30.04 ms
    cost = CostModel(t0=10.0, t1=1.0, t2=0.01, prefill_per_token=0.0)
    res = simulate_spec([SimRequest(0, 0, 100, 5)], cost, ONE, PullRouting(), SpecConfig(3, 1), {0: flat(2.0, 5)})
    assert res.step_ms == pytest.approx(30.04)
    assert SpecConfig(4, 8, gamma=0.25).step_ms(cost, 2, 1000) == pytest.approx(10 * 2 + 1 * 2 * 5 + 10)


def test_acceptance_by_position_and_stretched_to_another_length():
    # chunks of 3 tokens: 1 token per pass in [0, 3), 3 per pass from 3 on: 1 -> 2 -> 3 -> 5 (capped)
    tr = AcceptanceTrace(np.array([0.0, 3.0]), np.array([1.0, 3.0]), 5)
    res = simulate_spec([SimRequest(0, 0, 0, 5)], COST, ONE, PullRouting(), SpecConfig(2, 1), {0: tr})
    assert res.extra["forwards"].tolist() == [3]
    # the same trace on a 10-token request: the rate changes at 6 (3 * 10 / 5): 1..6 one by one (5 passes),
    # then 6 -> 9 -> 10: 7 passes
    res = simulate_spec([SimRequest(0, 0, 0, 10)], COST, ONE, PullRouting(), SpecConfig(2, 1), {0: tr})
    assert res.extra["forwards"].tolist() == [7]
    assert tr.scaled_to(10).starts.tolist() == [0.0, 6.0]


def test_trace_from_forwards_and_json(tmp_path):
    tr = AcceptanceTrace.from_forwards(2500, [512, 256, 452], 1024)
    assert tr.rates.tolist() == [2.0, 4.0, 1.0]
    assert tr.tokens_per_forward == pytest.approx(2500 / 1220)
    with pytest.raises(SimError, match="need 3"):
        AcceptanceTrace.from_forwards(2500, [512, 256], 1024)
    doc = {
        "chunk_tokens": 1024,
        "datasets": {
            "d": [
                {
                    "prompt_id": 0,
                    "source": "a",
                    "response_len": 2500,
                    "capped": False,
                    "forwards": {"sam_own": {"3": [512, 256, 452]}},
                },
                {
                    "prompt_id": 0,
                    "source": "b",
                    "response_len": 31500,
                    "capped": True,
                    "forwards": {"sam_own": {"3": [100] * 31}},
                },
            ]
        },
    }
    p = tmp_path / "acc.json"
    p.write_text(json.dumps(doc))
    assert len(load_acceptance(p, "d", "sam_own", 3)) == 2
    (only,) = load_acceptance(p, "d", "sam_own", 3, capped=False)
    assert only.meta == ("d", 0, "a", False)
    with pytest.raises(SimError, match="no drafter 'ngram' at k=3"):
        load_acceptance(p, "d", "ngram", 3)
    with pytest.raises(SimError, match="no dataset 'x'"):
        load_acceptance(p, "x", "sam_own", 3)


@pytest.mark.parametrize("lockstep", [False, True])
def test_no_drafting_equals_the_plain_simulator(lockstep):
    """Random steps (KV budgets with preemption, prefix caching, 1-token responses, both routings):
    with the gate at 0 every finish time, assignment and iteration count equals npu_rl.sim.simulate's."""
    rng = np.random.default_rng(7)
    cost = CostModel(t0=5.0, t1=0.3, t2=0.01, prefill_per_token=0.05)
    preempted = 0
    for _ in range(25):
        n = int(rng.integers(1, 40))
        ng = max(1, n // 3)
        p = rng.integers(0, 50, ng)
        reqs = [SimRequest(i, i % ng, int(p[i % ng]), int(rng.integers(1, 300))) for i in range(n)]
        top = max(r.prompt_len + r.response_len for r in reqs)
        cfg = ReplicaConfig(
            int(rng.integers(1, 4)),
            max_num_seqs=int(rng.integers(1, 9)),
            kv_budget_tokens=None if rng.random() < 0.3 else int(top + rng.integers(0, 800)),
            lockstep=lockstep,
            prefix_caching=bool(rng.integers(0, 2)),
        )
        for make in (lambda: VerlDefaultRouting(seed=3), PullRouting):
            a = simulate(reqs, cost, cfg, make())
            b = simulate_spec(reqs, cost, cfg, make(), SpecConfig(3, 0))
            assert b.finish_ms == pytest.approx(a.finish_ms, rel=1e-9)
            assert (a.replica == b.replica).all() and (a.preemptions == b.preemptions).all()
            assert (a.decode_iterations == b.decode_iterations).all()
            assert b.replica_busy_ms == pytest.approx(a.replica_busy_ms, rel=1e-9)
            assert b.lower_bound_ms == a.lower_bound_ms
            preempted += int(a.preemptions.sum())
    assert preempted > 0  # the comparison covered KV preemption


def test_drafting_helps_when_free_and_lockstep_pays_the_slowest_rank():
    # gamma 0, t1 = 0: a drafting iteration costs what a plain one costs, so 2 tokens per pass halve
    # the decode iterations of a lone request
    cost = CostModel(t0=10.0, t1=0.0, t2=0.0, prefill_per_token=0.0)
    r = [SimRequest(0, 0, 0, 101)]
    res = simulate_spec(r, cost, ONE, PullRouting(), SpecConfig(3, 1), {0: flat(2.0, 101)})
    assert res.step_ms == pytest.approx(500.0)
    assert simulate(r, cost, ONE, PullRouting()).step_ms == pytest.approx(1000.0)
    # lockstep of 2 ranks, gate 1, requests dealt round-robin: rank 0 gets A and C (b = 2: plain, 10 ms),
    # rank 1 gets B (b = 1: drafts at gamma 1: 10 * (1 + 3) = 40 ms, 4 tokens per pass). Iteration 1 costs
    # the max, 40 ms: B 1 -> 5 done at 40; A, C at 2 tokens; 3 more plain iterations of rank 0 alone: 70 ms.
    lock = ReplicaConfig(2, max_num_seqs=4, lockstep=True)
    reqs = [SimRequest(0, 0, 0, 5), SimRequest(1, 1, 0, 5), SimRequest(2, 2, 0, 5)]
    traces = {0: flat(4.0, 5), 1: flat(4.0, 5), 2: flat(4.0, 5)}
    res = simulate_spec(reqs, cost, lock, PullRouting(), SpecConfig(3, 1, gamma=1.0), traces)
    assert res.replica.tolist() == [0, 1, 0]
    assert res.finish_ms.tolist() == pytest.approx([70.0, 40.0, 70.0])
    assert res.replica_work_ms.tolist() == pytest.approx([40.0, 40.0])
    assert res.replica_busy_ms.tolist() == pytest.approx([70.0, 40.0])


def test_bad_input():
    with pytest.raises(SimError, match="num_speculative_tokens"):
        SpecConfig(0, 8)
    with pytest.raises(SimError, match="batch_threshold"):
        SpecConfig(3, -1)
    with pytest.raises(SimError, match="gamma"):
        SpecConfig(3, 8, gamma=-0.1)
    with pytest.raises(SimError, match=r"no acceptance trace for requests \[1\]"):
        simulate_spec(two_requests(), COST, ONE, PullRouting(), SpecConfig(3, 8), {0: flat(2.0, 9)})
    with pytest.raises(SimError, match="arrival_ms > 0"):
        simulate_spec([SimRequest(0, 0, 0, 5, arrival_ms=3.0)], COST, ONE, PullRouting(), None)
    with pytest.raises(SimError, match="duplicate request id"):
        simulate_spec([SimRequest(0, 0, 0, 5), SimRequest(0, 0, 0, 5)], COST, ONE, PullRouting(), None)


def _reference(reqs, traces, cost, spec):
    """Iteration by iteration, straight from the model's definition: one replica, every request admitted
    at t = 0 (free prefill, 1 token each), no KV budget. Returns finish times (ms) in input order."""
    pos = [1.0] * len(reqs)
    finish = [0.0 if r.response_len == 1 else None for r in reqs]
    t = 0.0
    while any(f is None for f in finish):
        run = [i for i, f in enumerate(finish) if f is None]
        kv = sum(reqs[i].prompt_len + pos[i] for i in run)
        if len(run) <= spec.batch_threshold:
            t += spec.step_ms(cost, len(run), kv)
            for i in run:
                tr, n = traces[i], reqs[i].response_len
                pos[i] = min(n, pos[i] + tr.rate_at(pos[i] * tr.length / n))
        else:
            t += cost.decode_ms(len(run), kv)
            for i in run:
                pos[i] += 1
        for i in run:
            if pos[i] >= reqs[i].response_len - 1e-9:
                finish[i] = t
    return finish


def test_segments_equal_iteration_by_iteration():
    """Random traces with several rate changes, stretched to other lengths, random gates: the jumps from
    event to event give the reference's finish times."""
    rng = np.random.default_rng(11)
    cost = CostModel(t0=7.0, t1=0.2, t2=0.003, prefill_per_token=0.0)
    for _ in range(30):
        n = int(rng.integers(1, 12))
        reqs = [SimRequest(i, i, int(rng.integers(0, 40)), int(rng.integers(1, 400))) for i in range(n)]
        traces = []
        for _ in reqs:
            length = int(rng.integers(1, 500))
            chunk = int(rng.integers(5, 60))
            nchunk = (length + chunk - 1) // chunk
            traces.append(AcceptanceTrace(chunk * np.arange(nchunk, dtype=float), rng.uniform(1, 4.5, nchunk), length))
        spec = SpecConfig(k=4, batch_threshold=int(rng.integers(1, n + 2)), gamma=float(rng.uniform(0, 0.5)))
        res = simulate_spec(reqs, cost, ReplicaConfig(1, max_num_seqs=16), PullRouting(), spec, dict(enumerate(traces)))
        assert res.finish_ms.tolist() == pytest.approx(_reference(reqs, traces, cost, spec), rel=1e-9)


def _bench():
    import importlib.util

    from npu_rl import REPO_ROOT

    spec = importlib.util.spec_from_file_location("sim_spec_bench", REPO_ROOT / "benchmarks" / "sim_spec.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class _Oracle:
    """A drafter that proposes the true continuation (``right``) or a token that never matches."""

    def __init__(self, resp, k, right):
        self.resp, self.k, self.right, self.i = resp, k, right, 0

    def begin(self, prompt):
        return np.empty(0, np.int32)

    def step(self, new):
        self.i += len(new)
        if not self.right:
            return np.full(self.k, -1, np.int32)
        return self.resp[self.i : self.i + self.k]

    def end(self):
        pass


def test_benchmark_replay_tail_and_fit():
    b = _bench()
    resp = np.arange(10, dtype=np.int32)
    # no draft before the first pass (1 token), then 3 + 1 per pass: 1 -> 5 -> 9 -> 10
    assert b.replay_one(_Oracle(resp, 3, True), np.zeros(2, np.int32), resp, 3) == [4]
    assert b.replay_one(_Oracle(resp, 3, False), np.zeros(2, np.int32), resp, 3) == [10]
    tr = AcceptanceTrace(np.array([0.0, 1024.0, 2048.0]), np.array([2.0, 3.0, 4.0]), 3000)
    cut = b.truncate(tr, 2000)
    assert cut.starts.tolist() == [0.0, 1024.0] and cut.length == 2000
    # the plain 2-request step: 4 iterations at b = 2 (48 ms), then 4 at b = 1 (44 ms)
    plain = simulate(two_requests(), COST, ONE, PullRouting())
    assert [b.tail_ms(plain, g) for g in (0, 1, 2)] == pytest.approx([0.0, 44.0, 92.0])
    # gamma fitted so that the drafting phase (gate 1) runs at 0.8 of its plain time (44 ms):
    # A alone drafts 5 -> 7 -> 9, two passes of 10 * (1 + 3 * gamma) + 1 * 4 ms = 0.8 * 44 -> gamma 0.12
    steps = [(two_requests(), {0: flat(2.0, 9), 1: flat(1.5, 5)})]
    gamma, r0, share, _ = b.calibrate(steps, COST, ONE, 3, 1, 0.8)
    assert r0 == pytest.approx(2 * 14 / 44)
    assert share == pytest.approx(44 / 92)
    assert gamma == pytest.approx(0.12)
    # a target below what free verification gives (28 / 44 = 0.64) has no fit
    assert b.calibrate(steps, COST, ONE, 3, 1, 0.6)[0] is None
