"""The numbers of one run, read from the launcher's run directory (``train.log``, ``env.txt``).

verl's step metrics come from :func:`npu_rl.e2e.load` (the console logger's ``step:N - key:value``
lines); this module adds vLLM's spec-decode lines and the summary the report shows. Units: seconds,
tokens per second, GiB (verl's ``*_memory_*_gb`` are ``torch.npu.max_memory_*() / 1024**3``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from npu_rl import e2e

DIES_PER_CARD = 2  # Atlas A3: one card (one npu-smi "NPU") carries two dies

# vllm/v1/spec_decode/metrics.py, SpecDecodingLogging.log (vLLM 0.23.0): one line per stats interval
_SPEC = re.compile(
    r"SpecDecoding metrics: Mean acceptance length: (?P<mal>[0-9.]+|nan), "
    r"Accepted throughput: (?P<acc_tps>[0-9.]+|nan) tokens/s, Drafted throughput: (?P<draft_tps>[0-9.]+|nan) tokens/s, "
    r"Accepted: (?P<accepted>\d+) tokens, Drafted: (?P<drafted>\d+) tokens"
)
_GC_ON = "engine GC guard on"  # npu_rl/engine_gc.py, printed once by every engine core with the guard on

# verl's V1 trainer phases (marked_timer names in verl/trainer/ppo/v1/trainer_base.py), in step order
PHASES = ("gen", "reward", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor", "update_weights")


@dataclass
class SpecDecode:
    """vLLM's spec-decode counters summed over a run's stats lines."""

    lines: int
    accepted: int
    drafted: int
    acceptance_rate: float  # accepted / drafted
    mean_acceptance_length: float  # tokens per forward pass per request (the bonus token included)


def parse_spec_decode(text: str) -> SpecDecode | None:
    """Sum vLLM's ``SpecDecoding metrics:`` lines; None when there are none.

    The mean acceptance length of the run is each line's value weighted by its drafted tokens (exact
    when every draft has ``num_speculative_tokens`` tokens: then drafted tokens are proportional to
    the drafts vLLM divides by).
    """
    rows = [m for m in _SPEC.finditer(text)]
    if not rows:
        return None
    accepted = sum(int(m["accepted"]) for m in rows)
    drafted = sum(int(m["drafted"]) for m in rows)
    weighted = sum(float(m["mal"]) * int(m["drafted"]) for m in rows if m["mal"] != "nan")
    return SpecDecode(
        lines=len(rows),
        accepted=accepted,
        drafted=drafted,
        acceptance_rate=accepted / drafted if drafted else math.nan,
        mean_acceptance_length=weighted / drafted if drafted else math.nan,
    )


def select_steps(steps: dict[int, dict[str, float]], which: str) -> list[int]:
    """The steps a comparison uses: ``after-first`` (all but the first, warm-up, when there are two or
    more), ``last-epoch`` (the steps whose ``training/epoch`` is the largest) or ``all``.

    Raises:
        ValueError: an unknown ``which``.
    """
    order = sorted(steps)
    if which == "all":
        return order
    if which == "after-first":
        return order[1:] if len(order) >= 2 else order
    if which == "last-epoch":
        last = max((steps[s].get("training/epoch", 0.0) for s in order), default=0.0)
        return [s for s in order if steps[s].get("training/epoch", 0.0) == last]
    raise ValueError(f"steps={which!r}: use all, after-first or last-epoch")


def _mean(vals: list[float]) -> float | None:
    return sum(vals) / len(vals) if vals else None


def summarize(steps: dict[int, dict[str, float]], text: str, which: str = "after-first") -> dict:
    """The report's numbers of one run (None where the log has no such metric).

    Means are over the steps :func:`select_steps` picks; ``first_step`` holds step 1's (the lowest
    step's) entropy, grad norm and rollout-vs-actor probability difference, which the tolerances
    compare; peaks are over every step.
    """
    chosen = select_steps(steps, which)

    def mean(key: str) -> float | None:
        return _mean([steps[s][key] for s in chosen if key in steps[s]])

    def peak(key: str) -> float | None:
        vals = [m[key] for m in steps.values() if key in m]
        return max(vals) if vals else None

    per_die = mean("perf/throughput")  # verl: total_num_tokens / (step time * dies)
    first = steps[min(steps)] if steps else {}
    diff_key = next(
        (k for k in ("training/rollout_probs_diff_mean", "actor/training/rollout_probs_diff_mean") if k in first), None
    )
    spec = parse_spec_decode(text)
    return {
        "steps": len(steps),
        "steps_compared": chosen,
        "generate_s": mean("timing_s/gen"),
        "step_s": mean("timing_s/step"),
        "old_log_prob_s": mean("timing_s/old_log_prob"),
        "update_actor_s": mean("timing_s/update_actor"),
        "update_weights_s": mean("timing_s/update_weights"),
        "tokens_per_s_per_die": per_die,
        "tokens_per_s_per_card": per_die * DIES_PER_CARD if per_die is not None else None,
        "peak_hbm_allocated_gib": peak("actor/perf/max_memory_allocated_gb"),
        "peak_hbm_reserved_gib": peak("actor/perf/max_memory_reserved_gb"),
        "response_length_mean": mean("response_length/mean"),
        "rebalance_idle_fraction": mean("rollout_rebalance/idle_fraction/mean"),
        "batch_len_cv": mean("sampler/batch_len_cv"),
        "first_step": {
            "step": min(steps) if steps else None,
            "actor/entropy": first.get("actor/entropy"),
            "actor/grad_norm": first.get("actor/grad_norm"),
            "rollout_probs_diff_mean": first.get(diff_key) if diff_key else None,
            "rollout_probs_diff_key": diff_key,
        },
        "engine_gc_announced": text.count(_GC_ON),
        "spec_decode": spec.__dict__ if spec else None,
    }


def timeline(steps: dict[int, dict[str, float]]) -> list[dict]:
    """Per step: its start (seconds since the first step began, steps back to back) and the phases
    verl timed, in order, plus ``other`` (the step time the phases do not cover, never negative)."""
    rows, t = [], 0.0
    for s in sorted(steps):
        m = steps[s]
        total = m.get("timing_s/step")
        if total is None:
            continue
        phases = [(p, m[f"timing_s/{p}"]) for p in PHASES if f"timing_s/{p}" in m]
        other = max(total - sum(d for _, d in phases), 0.0)
        rows.append({"step": s, "start_s": t, "step_s": total, "phases": [*phases, ("other", other)]})
        t += total
    return rows


def find_run_dir(log_dir: Path) -> Path | None:
    """The launcher's newest run directory (``<time>-<recipe>/`` with a ``launcher.log``) under ``log_dir``."""
    runs = sorted(p for p in log_dir.glob("*/") if (p / "launcher.log").is_file()) if log_dir.is_dir() else []
    return runs[-1] if runs else None


def read_run(run_dir: Path, which: str = "after-first") -> dict:
    """:func:`summarize` and :func:`timeline` of a run directory.

    Raises:
        FileNotFoundError: no ``train.log`` (the launcher never started the recipe).
    """
    ev = e2e.load(run_dir)
    return {"summary": summarize(ev.steps, ev.log, which), "timeline": timeline(ev.steps), "steps": ev.steps}
