"""Sensitivity sweep of a simulated comparison over the cost model's published uncertainty (REFERENCE §7).

§7's coefficients are published figures, not our measurements: t0 ±50%, t1 up to 6x, t2 x0.4-1.6. A
simulated claim ("ordering A is 20% faster than B") should hold over that range, so benchmarks report
``sweep(...)``'s min / median / max of the ratio instead of one number::

    def ratio(cost):
        return simulate(reqs_a, cost, cfg, routing_a()).step_ms / simulate(reqs_b, cost, cfg, routing_b()).step_ms
    s = sweep(ratio, CostModel.qwen3_32b_tp8_a3_graph())
    print(s.summary())   # "ratio min 0.78 / median 0.81 / max 0.85 over 36 cost models"
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from npu_rl.sim.model import CostModel, SimError

#: Multipliers of the base coefficients swept by default (REFERENCE §7 uncertainty ranges).
DEFAULT_LEVELS: dict[str, tuple[float, ...]] = {
    "t0": (0.5, 1.0, 1.5),
    "t1": (0.6, 1.0, 2.5, 6.0),
    "t2": (0.4, 1.0, 1.6),
}


@dataclass(frozen=True)
class SweepResult:
    """``values[k]`` is the metric under ``factors[k]`` (a dict of multipliers, e.g. {"t0": 0.5, ...})."""

    values: np.ndarray
    factors: tuple[dict[str, float], ...]
    base: CostModel

    @property
    def min(self) -> float:
        return float(np.min(self.values))

    @property
    def median(self) -> float:
        return float(np.median(self.values))

    @property
    def max(self) -> float:
        return float(np.max(self.values))

    @property
    def at_base(self) -> float:
        """The metric at the base cost model (all multipliers 1), NaN if the grid did not include it."""
        for f, v in zip(self.factors, self.values, strict=True):
            if all(x == 1.0 for x in f.values()):
                return float(v)
        return float("nan")

    def argmin(self) -> dict[str, float]:
        return self.factors[int(np.argmin(self.values))]

    def argmax(self) -> dict[str, float]:
        return self.factors[int(np.argmax(self.values))]

    def summary(self, name: str = "ratio", fmt: str = ".3f") -> str:
        return (
            f"{name} min {self.min:{fmt}} / median {self.median:{fmt}} / max {self.max:{fmt}} "
            f"(base {self.at_base:{fmt}}) over {len(self.values)} cost models"
        )


def sweep(
    metric: Callable[[CostModel], float],
    base: CostModel,
    levels: Mapping[str, Sequence[float]] | None = None,
) -> SweepResult:
    """Evaluate ``metric(cost)`` on the grid of ``base.scaled(**factors)`` over ``levels``.

    ``levels`` maps coefficient names (``t0``, ``t1``, ``t2``, ``prefill``) to multipliers; default
    :data:`DEFAULT_LEVELS` (3 x 4 x 3 = 36 cost models). ``metric`` typically returns a ratio of two
    simulated step times under the same cost model. Raises :class:`~npu_rl.sim.model.SimError` for an
    unknown coefficient name, an empty or non-positive level list, or a metric that is not a finite number.
    """
    levels = dict(DEFAULT_LEVELS if levels is None else levels)
    allowed = {"t0", "t1", "t2", "prefill"}
    for k, v in levels.items():
        if k not in allowed:
            raise SimError(f"sweep level {k!r}: coefficients are {sorted(allowed)}")
        if not v or any(not x > 0 for x in v):
            raise SimError(f"sweep level {k!r}={list(v)!r}: give one or more positive multipliers")
    names = list(levels)
    factors, values = [], []
    for combo in itertools.product(*(levels[k] for k in names)):
        f = dict(zip(names, (float(x) for x in combo), strict=True))
        v = float(metric(base.scaled(**f)))
        if not np.isfinite(v):
            raise SimError(f"sweep metric returned {v} for factors {f}")
        factors.append(f)
        values.append(v)
    return SweepResult(np.array(values), tuple(factors), base)
