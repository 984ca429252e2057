"""``blis calibrate --plot``: one figure of sim against real, per request and as distributions.

Top row: a scatter of sim vs real per paired request for TTFT and E2E (ms) with the identity
line (points on it are perfect predictions). Bottom row: the empirical CDFs of real and sim
TTFT and E2E. Drawn with matplotlib's Agg canvas (no pyplot state, no display), like
``blis plot``; the image is written through a temporary file, so a failure leaves no file.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from blis_fast.calibrate.pairing import CalibrationPairs, paired_arrays
from blis_fast.errors import BlisConfigError
from blis_fast.sweep.plot import PlotResult

__all__ = ["check_plot_path", "plot_calibration", "render_plot"]


def _figure_class():
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise BlisConfigError("--plot needs matplotlib: pip install 'blis_fast[plot]'") from None
    return Figure


def check_plot_path(path: str) -> str:
    """The image format of ``path`` (from its suffix); an error if matplotlib cannot write it."""
    fmt = Path(path).suffix.lower().lstrip(".")
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    supported = FigureCanvasAgg(_figure_class()()).get_supported_filetypes()
    if fmt not in supported:
        raise BlisConfigError(f"--plot {path}: unknown image format {fmt or '(no suffix)'!r}; "
                              f"use one of {', '.join(sorted(supported))}")
    return fmt


def _cdf(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    xs = np.sort(values)
    return xs, np.arange(1, xs.size + 1, dtype=np.float64) / xs.size


def plot_calibration(pairs: CalibrationPairs, report: dict | None = None, *,
                     width: float = 10.0, height: float = 8.0, dpi: int = 100) -> PlotResult:
    """The 2x2 figure; ``series`` holds every drawn (x, y) in ms, e.g. ``"ttft scatter"`` =
    (real, sim) per pair and ``"ttft real cdf"`` = (sorted real, i/n). With the ``report``,
    the scatter titles also give each metric's MAPE and Pearson r."""
    fig = _figure_class()(figsize=(width, height), dpi=dpi, layout="constrained")
    axes = fig.subplots(2, 2)
    result = PlotResult(fig)
    for col, (name, label, vec) in enumerate((("ttft", "TTFT", pairs.ttft),
                                              ("e2e", "E2E", pairs.e2e))):
        real, sim = (a / 1000.0 for a in paired_arrays(vec))
        ax = axes[0, col]
        ax.scatter(real, sim, s=12, alpha=0.7, label="requests")
        result.series[f"{name} scatter"] = (real, sim)
        if real.size:
            lo = float(min(real.min(), sim.min()))
            hi = float(max(real.max(), sim.max()))
            ax.plot([lo, hi], [lo, hi], color="black", linewidth=1, linestyle="--",
                    label="sim = real")
        ax.set_xlabel(f"real {label} (ms)")
        ax.set_ylabel(f"sim {label} (ms)")
        title = f"{label} per request ({real.size} pairs"
        if report is not None and name in report["metrics"]:
            q = report["metrics"][name]["request_level"]
            title += f", MAPE {q['mape'] * 100:.1f}%, r {q['pearson_r']:.3f}"
        ax.set_title(title + ")")
        ax.legend(fontsize="small")
        ax.grid(True, alpha=0.3)
        ax = axes[1, col]
        for side, values in (("real", real), ("sim", sim)):
            xs, ys = _cdf(values)
            result.series[f"{name} {side} cdf"] = (xs, ys)
            ax.step(xs, ys, where="post", label=side)
        ax.set_xlabel(f"{label} (ms)")
        ax.set_ylabel("fraction of requests")
        ax.set_title(f"{label} distribution")
        ax.legend(fontsize="small")
        ax.grid(True, alpha=0.3)
    return result


def render_plot(result: PlotResult, fmt: str) -> bytes:
    """The figure encoded as an image of format ``fmt`` (e.g. ``png``)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(result.figure)
    buf = io.BytesIO()
    result.figure.savefig(buf, format=fmt, dpi=result.figure.dpi)
    return buf.getvalue()
