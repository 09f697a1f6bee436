"""PNG plots of simulated rollout steps (matplotlib, Agg backend): per-replica running counts over time
and per-replica utilisation, for one or several :class:`~npu_rl.sim.model.SimResult` side by side."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from npu_rl.sim.model import SimError, SimResult


def running_matrix(result: SimResult, times_ms: Sequence[float] | np.ndarray) -> np.ndarray:
    """Running sequences of each replica at each time: shape (R, len(times_ms)), from ``result.timeline``."""
    times = np.asarray(times_ms, dtype=np.float64)
    out = np.zeros((len(result.timeline), len(times)), dtype=np.int64)
    for r, (t, b) in enumerate(result.timeline):
        k = np.searchsorted(t, times, side="right") - 1
        out[r] = np.where(k >= 0, b[np.clip(k, 0, None)], 0)
    return out


def _as_dict(results: SimResult | Mapping[str, SimResult]) -> dict[str, SimResult]:
    if isinstance(results, SimResult):
        return {"": results}
    out = dict(results)
    if not out or not all(isinstance(v, SimResult) for v in out.values()):
        raise SimError("plot: pass a SimResult or a non-empty mapping of label -> SimResult")
    return out


def plot_timelines(
    results: SimResult | Mapping[str, SimResult],
    path: str | Path,
    *,
    title: str | None = None,
    time_unit: str = "s",
    bins: int = 400,
) -> Path:
    """Write a PNG: per result one row with (left) a replica x time heat map of running sequences, the
    step end and lower bound marked, and (right) each replica's busy fraction of the step.

    All rows share the time axis (the longest step), so shorter steps show as empty space on the right.
    ``time_unit``: "s" or "ms". Returns the path written. Raises :class:`~npu_rl.sim.model.SimError` on an
    empty input or an unknown unit.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res = _as_dict(results)
    scale = {"s": 1e-3, "ms": 1.0}.get(time_unit)
    if scale is None:
        raise SimError(f"plot_timelines time_unit={time_unit!r}: use 's' or 'ms'")
    t_end = max(r.step_ms for r in res.values()) or 1.0
    times = np.linspace(0.0, t_end, bins)
    vmax = max(max((int(b.max()) for _, b in r.timeline), default=1) for r in res.values()) or 1
    fig, axes = plt.subplots(
        len(res), 2, figsize=(12, 2.2 + 1.6 * len(res)), squeeze=False, gridspec_kw={"width_ratios": [4, 1]}
    )
    im = None
    for row, (label, r) in enumerate(res.items()):
        ax, bx = axes[row]
        mat = running_matrix(r, times)
        n_rep = mat.shape[0]
        im = ax.imshow(
            mat,
            aspect="auto",
            origin="lower",
            interpolation="nearest",
            extent=(0, t_end * scale, -0.5, n_rep - 0.5),
            vmin=0,
            vmax=vmax,
            cmap="viridis",
        )
        ax.axvline(r.step_ms * scale, color="red", lw=1, label=f"step {r.step_ms * scale:.4g} {time_unit}")
        ax.axvline(
            r.lower_bound_ms * scale, color="white", lw=1, ls="--", label=f"lower bound ({r.ratio_to_lower_bound:.2f}x)"
        )
        ax.set_ylabel("replica")
        ax.set_title(
            f"{label}: running sequences per replica" if label else "running sequences per replica", fontsize=9
        )
        ax.legend(loc="upper right", fontsize=7)
        busy = r.replica_busy_ms / r.step_ms if r.step_ms > 0 else np.zeros(n_rep)
        bx.barh(np.arange(n_rep), busy, color="tab:blue")
        bx.set_xlim(0, 1)
        bx.set_ylim(-0.5, n_rep - 0.5)
        bx.set_title(f"busy fraction (mean {busy.mean():.2f})", fontsize=9)
    axes[-1][0].set_xlabel(f"time ({time_unit})")
    axes[-1][1].set_xlabel("busy / step")
    if im is not None:
        fig.colorbar(im, ax=[a[0] for a in axes], fraction=0.02, pad=0.01, label="running")
    if title:
        fig.suptitle(title)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_running(
    results: SimResult | Mapping[str, SimResult],
    path: str | Path,
    *,
    title: str | None = None,
    time_unit: str = "s",
    bins: int = 600,
    normalize: bool = True,
) -> Path:
    """Write a PNG of the total running sequences over time (all replicas), one line per result;
    ``normalize`` divides by the number of requests (the curve's shape, comparable across step sizes)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res = _as_dict(results)
    scale = {"s": 1e-3, "ms": 1.0}.get(time_unit)
    if scale is None:
        raise SimError(f"plot_running time_unit={time_unit!r}: use 's' or 'ms'")
    fig, ax = plt.subplots(figsize=(8, 4))
    for label, r in res.items():
        times = np.linspace(0.0, r.step_ms, bins)
        total = running_matrix(r, times).sum(axis=0).astype(float)
        if normalize and len(r.rids):
            total /= len(r.rids)
        ax.plot(times * scale, total, label=label or None)
    ax.set_xlabel(f"time ({time_unit})")
    ax.set_ylabel("running / requests" if normalize else "running")
    if any(res):
        ax.legend(fontsize=8)
    if title:
        ax.set_title(title)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
