"""``blis fit --plot``: the loss per evaluation and observed vs predicted TTFT, ITL and E2E."""

from __future__ import annotations

import numpy as np

from blis_fast.calibrate.pairing import CalibrationPairs, paired_arrays
from blis_fast.calibrate.plot import _figure_class
from blis_fast.fit.optimize import FitResult
from blis_fast.fit.problem import LOSSES
from blis_fast.sweep.plot import PlotResult

__all__ = ["plot_fit"]


def plot_fit(result: FitResult, figures: list[tuple[str, CalibrationPairs]]) -> PlotResult:
    """A 2x2 figure: loss curve (best so far), then a sim-vs-real scatter per metric (ms),
    fit traces and holdouts in separate colours."""
    fig = _figure_class()(figsize=(11.0, 8.0), dpi=100, layout="constrained")
    axes = fig.subplots(2, 2)
    out = PlotResult(fig)
    losses = np.asarray(result.losses, dtype=np.float64)
    ax = axes[0, 0]
    if losses.size:
        x = np.arange(1, losses.size + 1)
        ax.plot(x, losses, ".", markersize=3, alpha=0.4, label="evaluation")
        ax.plot(x, np.minimum.accumulate(losses), label="best so far")
        out.series["loss"] = (x.astype(np.float64), losses)
    ax.set_yscale("log")
    ax.set_xlabel("evaluation")
    ax.set_ylabel(f"weighted {LOSSES[result.loss_function].label}")
    ax.set_title(f"fit loss ({result.stopped}, best {result.loss:.4f})")
    ax.legend(fontsize="small")
    ax.grid(True, alpha=0.3)
    for ax, name in zip((axes[0, 1], axes[1, 0], axes[1, 1]), ("ttft", "itl", "e2e"), strict=True):
        lo, hi = np.inf, -np.inf
        for role, pairs in figures:
            real, sim = (a / 1000.0 for a in paired_arrays(getattr(pairs, name)))
            if not real.size:
                continue
            ax.scatter(real, sim, s=10, alpha=0.6, label=role)
            out.series.setdefault(f"{name} {role}", (real, sim))
            lo, hi = min(lo, real.min(), sim.min()), max(hi, real.max(), sim.max())
        if np.isfinite(lo):
            ax.plot([lo, hi], [lo, hi], color="black", linewidth=1, linestyle="--")
            ax.legend(fontsize="small")
        ax.set_xlabel(f"observed {name.upper()} (ms)")
        ax.set_ylabel(f"predicted {name.upper()} (ms)")
        ax.set_title(f"{name.upper()} per request" + ("" if np.isfinite(lo) else " (no data)"))
        ax.grid(True, alpha=0.3)
    return out
