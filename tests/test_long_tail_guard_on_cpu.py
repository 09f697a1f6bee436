"""Long-tail guard decision core (issue 5): hand-computed cases of the abort rule and its bookkeeping."""

from __future__ import annotations

import pytest

from npu_rl.sampler.guard import GuardParams, LongTailGuard, stragglers_to_abort

P = GuardParams(factor=2.0, min_tokens=1000, finished_fraction=0.75)


def test_nothing_is_cut_before_the_finished_fraction():
    # 2 of 4 finished (50% < 75%): wait, however long the others are
    assert not stragglers_to_abort([500, 700], [90000, 90000], P).any()


def test_stragglers_past_factor_times_median_and_min_tokens_are_cut():
    finished = [400, 600, 800, 1000, 1200, 1400]  # median 900 -> 2 x 900 = 1800 > min_tokens 1000
    running = [1700, 1801, 5000]  # 6 of 9 finished = 67% < 75%: nothing yet
    assert not stragglers_to_abort(finished, running, P).any()
    finished += [1500, 1600, 1700]  # 9 of 12 = 75%: median 1250 -> threshold 2500
    assert stragglers_to_abort(finished, running, P).tolist() == [False, False, True]


def test_min_tokens_protects_short_steps():
    # median 100 -> 2 x 100 = 200, but nothing under min_tokens=1000 is ever cut
    assert stragglers_to_abort([100] * 9, [900, 1001], P).tolist() == [False, True]


def test_env_parsing_names_the_variable():
    env = {"VLLM_ROLLOUT_EARLY_STOP_ENABLE": "1", "VLLM_ROLLOUT_EARLY_STOP_MIN_TOKENS": "8000"}
    assert GuardParams.from_env(env) == GuardParams(min_tokens=8000)
    assert GuardParams.from_env({"VLLM_ROLLOUT_EARLY_STOP_ENABLE": "0"}) is None
    with pytest.raises(ValueError, match="VLLM_ROLLOUT_EARLY_STOP_FACTOR=0.5 is not a number >= 1"):
        GuardParams.from_env({"VLLM_ROLLOUT_EARLY_STOP_ENABLE": "1", "VLLM_ROLLOUT_EARLY_STOP_FACTOR": "0.5"})
    with pytest.raises(ValueError, match="MIN_TOKENS='1e4' is not an integer"):
        GuardParams.from_env({"VLLM_ROLLOUT_EARLY_STOP_ENABLE": "1", "VLLM_ROLLOUT_EARLY_STOP_MIN_TOKENS": "1e4"})


def test_replica_bookkeeping_cuts_each_request_once_and_reports_metrics():
    g = LongTailGuard(P)
    for r in "abcdefgh":
        g.start(r)
    for r, n in zip("abcde", [300, 400, 500, 600, 700], strict=True):
        g.finish(r, n)
    g.progress("f", 900)
    g.progress("g", 1200)
    g.progress("h", 3000)
    assert g.decide() == []  # 5 of 8 finished < 75%
    g.finish("f", 800)  # 6 of 8: median 550 -> threshold max(2 x 550, 1000) = 1100
    assert g.decide() == ["g", "h"]
    assert g.decide() == []  # each request is aborted once
    g.finish("g", 1210, aborted=True)  # vLLM returns what was generated, finish_reason "abort"
    g.finish("h", 3005, aborted=True)
    assert g.was_cut("h") and not g.was_cut("a")
    m = g.new_step()
    assert m == {
        "guard/cut_count": 2.0,
        "guard/cut_fraction": 2 / 8,
        "guard/cut_len_mean": (1210 + 3005) / 2,
        "guard/threshold": 1100.0,
    }
    assert g.new_step()["guard/cut_count"] == 0.0


def test_server_glue_aborts_through_the_server_and_reports_cuts_as_length():
    import asyncio

    from npu_rl.sampler.guard import ServerGuard

    now = [0.0]
    g = ServerGuard(P, interval_s=1.0, clock=lambda: now[0])
    aborted: list[str] = []

    async def abort(rid):  # the server's abort_request: the request then returns with finish reason "abort"
        aborted.append(rid)

    async def run():
        for r in "abcd":
            g.begin(7, r)
        for r, n in zip("abc", [100, 200, 300], strict=True):
            await g.observe(r, n, abort)
            assert not g.end(r, n, aborted=False)
        await g.observe("d", 5000, abort)  # 3 of 4 finished: median 200 -> threshold 1000; but throttled
        assert aborted == []
        now[0] = 1.5
        await g.observe("d", 5001, abort)
        assert aborted == ["d"]
        return g.end("d", 5002, aborted=True)

    assert asyncio.run(run()) is True  # the server reports stop_reason "length": not resumed by verl's client
    g.begin(8, "e")  # the next training step (weights synced): the last step's metrics
    assert g.last_metrics["guard/cut_count"] == 1.0 and g.last_metrics["guard/cut_len_mean"] == 5002


def test_server_guard_is_off_unless_switched_on(monkeypatch):
    from npu_rl.sampler.guard import ServerGuard, server_guard

    class Server:
        global_steps = 3

    monkeypatch.delenv("VLLM_ROLLOUT_EARLY_STOP_ENABLE", raising=False)
    assert server_guard(Server(), "r1") is None
    monkeypatch.setenv("VLLM_ROLLOUT_EARLY_STOP_ENABLE", "1")
    s = Server()
    first = server_guard(s, "r1")
    assert isinstance(first, ServerGuard) and server_guard(s, "r2") is first and first.step == 3
