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
    with pytest.raises(ValueError, match="VLLM_ROLLOUT_EARLY_STOP_FACTOR=0.5: must be >= 1"):
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
