"""``blis plot``: line plots of a sweep's summary (latency or throughput vs load) and request CDFs.

Every plotting function returns the plotted series with the figure, so what is drawn can be
checked against the data. Line plots average ``y`` over the rows sharing (facet, by, x) — the
seeds of a sweep, typically; rows with an error are left out. Rendering uses matplotlib's Agg
canvas directly (no pyplot state, no display needed).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from blis_fast.errors import BlisConfigError, BlisInputError
from blis_fast.files import is_regular_file
from blis_fast.gonum import NumError, parse_float

__all__ = ["PlotResult", "load_requests", "load_summary", "plot_cdf", "plot_lines",
           "plot_scaling"]

MAX_WINDOWS = 1_000_000
"""Most ``--window`` bins of a scaling plot (its arrays stay a few MB)."""


@dataclass
class PlotResult:
    """A figure and the series drawn on it: name -> (x, y), in drawing order."""

    figure: object
    series: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)

    def save(self, path: str | Path) -> None:
        """Write the figure (format from the suffix) at the figure's own size and dpi."""
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        FigureCanvasAgg(self.figure)
        self.figure.savefig(path, dpi=self.figure.dpi)


def _read_parquet(source: str | Path | list[Path], **kwargs) -> pl.DataFrame:
    """``pl.read_parquet`` with a FIFO/device refused and a non-Parquet file reported in one
    line (a CSV given to ``blis plot``, a truncated file)."""
    for f in (source if isinstance(source, list) else [source]):
        if not is_regular_file(f):
            raise BlisInputError(f"{f}: not a regular file")
    try:
        return pl.read_parquet(source, **kwargs)
    except (OSError, pl.exceptions.PolarsError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        shown = source[0] if isinstance(source, list) else source
        raise BlisInputError(f"{shown}: not a readable Parquet file ({first})") from None


def load_summary(path: str | Path) -> pl.DataFrame:
    """A sweep's summary rows (``DIR/summary/*.parquet``) or one Parquet file, by config_id."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        frame = _read_parquet(p)
    else:
        files = sorted((p / "summary").glob("*.parquet"))
        if not files:
            raise BlisInputError(f"{p}: no sweep summary (summary/*.parquet) found")
        frame = _read_parquet(files)
    return frame.sort("config_id") if "config_id" in frame.columns else frame


def load_requests(path: str | Path) -> pl.DataFrame:
    """Per-request rows: a ``requests.parquet`` file, or a sweep's ``DIR/requests`` partitions
    joined with the configuration columns of its summary."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        return _read_parquet(p)
    files = sorted((p / "requests").glob("config_id=*/*.parquet"))
    if not files:
        raise BlisInputError(f"{p}: no per-request data (run the sweep with --requests)")
    requests = _read_parquet(files, hive_partitioning=True)
    return requests.join(load_summary(p), on="config_id", how="left", suffix="_config")


def _need(frame: pl.DataFrame, *names: str | None) -> None:
    for name in names:
        if name is not None and name not in frame.columns:
            raise BlisConfigError(f"unknown column {name!r}; columns: {', '.join(frame.columns)}")


def filter_rows(frame: pl.DataFrame, where: list[str]) -> pl.DataFrame:
    """Keep rows matching every ``column=value`` (numbers compared as numbers)."""
    for cond in where:
        name, sep, text = cond.partition("=")
        if not sep:
            raise BlisConfigError(f"--where {cond!r}: expected COLUMN=VALUE")
        _need(frame, name)
        if frame.schema[name].is_numeric():
            try:
                value: object = parse_float(text)
            except NumError:
                raise BlisConfigError(f"--where {cond!r}: {name} is numeric") from None
        else:
            value = text
        frame = frame.filter(pl.col(name) == value)
    return frame


def _groups(frame: pl.DataFrame, keys: list[str]) -> list[tuple[str, pl.DataFrame]]:
    """(``"k1=v1, k2=v2"``, rows) per distinct key values, in sorted key order."""
    if not keys:
        return [("", frame)]
    out = []
    for values, rows in frame.sort(keys).group_by(keys, maintain_order=True):
        out.append((", ".join(f"{k}={v}" for k, v in zip(keys, values, strict=True)), rows))
    return out


def _figure(n_panels: int, width: float, height: float, dpi: int):
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise BlisConfigError("blis plot needs matplotlib: pip install 'blis_fast[plot]'"
                              ) from None

    cols = min(3, n_panels)
    rows = -(-n_panels // cols)
    fig = Figure(figsize=(width, height), dpi=dpi, layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False, sharey=True).ravel()
    for ax in axes[n_panels:]:
        ax.set_visible(False)
    return fig, axes


def _draw(frame: pl.DataFrame, by: str | None, facet: str | None,
          points: Callable[[pl.DataFrame], tuple[np.ndarray, np.ndarray]], name: str,
          xlabel: str, ylabel: str, *, step: bool, logy: bool, width: float, height: float,
          dpi: int, logx: bool = False) -> PlotResult:
    """One panel per ``facet`` value, one series per ``by`` value (``name`` without ``by``),
    ``points(rows)`` each."""
    panels = _groups(frame, [facet] if facet else [])
    fig, axes = _figure(len(panels), width, height, dpi)
    result = PlotResult(fig)
    for ax, (panel_name, panel) in zip(axes, panels, strict=False):
        for line_name, rows in _groups(panel, [by] if by else []):
            xs, ys = points(rows)
            result.series[", ".join(n for n in (panel_name, line_name) if n) or name] = (xs, ys)
            if step:
                ax.step(xs, ys, where="post", label=line_name or name)
            else:
                ax.plot(xs, ys, marker="o", label=line_name or name)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        if logy:
            ax.set_yscale("log")
        if logx:
            ax.set_xscale("log", base=2)
        if panel_name:
            ax.set_title(panel_name)
        if by:
            ax.legend(fontsize="small")
        ax.grid(True, alpha=0.3)
    return result


def _nonempty(frame: pl.DataFrame, column: str) -> pl.DataFrame:
    frame = frame.filter(pl.col(column).is_not_null())
    if frame.height == 0:
        raise BlisInputError(f"no rows with a value of {column!r} to plot")
    return frame


def plot_lines(frame: pl.DataFrame, x: str, y: str, by: str | None = None,
               facet: str | None = None, *, logy: bool = False, width: float = 8.0,
               height: float = 5.0, dpi: int = 100, logx: bool = False) -> PlotResult:
    """``y`` against ``x`` (mean over rows sharing x), one line per ``by``, a panel per ``facet``;
    ``logx`` for an x swept in doublings (a base-2 axis)."""
    _need(frame, x, y, by, facet)
    if "error" in frame.columns:
        frame = frame.filter(pl.col("error").is_null())

    def points(rows: pl.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        means = rows.group_by(x).agg(pl.col(y).mean()).sort(x)
        return means[x].to_numpy(), means[y].to_numpy()

    if logx and frame.filter(pl.col(x) <= 0).height:
        raise BlisInputError(f"--logx: {x!r} has values <= 0")
    return _draw(_nonempty(frame, y), by, facet, points, y, x, y, step=False, logy=logy,
                 width=width, height=height, dpi=dpi, logx=logx)


def plot_cdf(frame: pl.DataFrame, column: str, by: str | None = None,
             facet: str | None = None, *, width: float = 8.0, height: float = 5.0,
             dpi: int = 100) -> PlotResult:
    """Empirical CDF of ``column`` (e.g. ``ttft_ms``): sorted values against i/n."""
    _need(frame, column, by, facet)

    def points(rows: pl.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        xs = np.sort(rows[column].to_numpy())
        return xs, np.arange(1, xs.size + 1, dtype=np.float64) / xs.size

    return _draw(_nonempty(frame, column), by, facet, points, column, column,
                 "fraction of requests", step=True, logy=False, width=width, height=height,
                 dpi=dpi)


def plot_scaling(run_dir: str | Path, window_s: float = 10.0, *, width: float = 8.0,
                 height: float = 5.0, dpi: int = 100) -> PlotResult:
    """An autoscaled run's ``--output-dir``: serving replicas over time (a step line) against
    the request rate per window (top panel), and the p99 TTFT per window (bottom; requests by
    arrival). Series: ``replicas``, ``request_rate``, ``ttft_p99_ms`` (x in seconds)."""
    d = Path(run_dir)
    if not (d / "scaling.parquet").exists():
        raise BlisInputError(f"{d}: no scaling.parquet (run with node_pools or the autoscaler "
                             "and --output-dir)")
    if not (window_s > 0 and np.isfinite(window_s)):
        raise BlisConfigError(f"--window must be a finite number of seconds > 0, got {window_s}")
    scaling = _read_parquet(d / "scaling.parquet")
    requests = _read_parquet(d / "requests.parquet")
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise BlisConfigError("blis plot needs matplotlib: pip install 'blis_fast[plot]'"
                              ) from None
    fig = Figure(figsize=(width, height), dpi=dpi, layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True)
    result = PlotResult(fig)
    t = scaling["time_us"].to_numpy() / 1e6
    replicas = scaling["routable_after"].to_numpy()
    arrival = requests["arrival_us"].to_numpy() / 1e6
    end = max(float(t.max(initial=0.0)), float(arrival.max(initial=0.0)))
    xs_r = np.append(t, end)
    ys_r = np.append(replicas, replicas[-1] if replicas.size else 0)
    result.series["replicas"] = (xs_r, ys_r)
    top.step(xs_r, ys_r, where="post", color="C0", label="serving replicas")
    top.set_ylabel("serving replicas")
    if end / window_s > MAX_WINDOWS:
        raise BlisConfigError(f"--window {window_s:g} s cuts the run's {end:g} s into more than "
                              f"{MAX_WINDOWS} windows")
    edges = np.arange(0.0, end + window_s, window_s)
    counts, _ = np.histogram(arrival, bins=edges)
    mids = edges[:-1] + window_s / 2
    result.series["request_rate"] = (mids, counts / window_s)
    rate_ax = top.twinx()
    rate_ax.plot(mids, counts / window_s, color="C1", label="requests/s")
    rate_ax.set_ylabel(f"requests/s ({window_s:g} s windows)")
    ttft = requests["ttft_ms"].to_numpy()
    which = np.digitize(arrival, edges) - 1
    p99 = np.array([np.percentile(ttft[(which == k) & ~np.isnan(ttft)], 99)
                    if ((which == k) & ~np.isnan(ttft)).any() else np.nan
                    for k in range(len(mids))])
    result.series["ttft_p99_ms"] = (mids, p99)
    bottom.plot(mids, p99, marker="o", color="C2")
    bottom.set_ylabel("p99 TTFT (ms)")
    bottom.set_xlabel("simulated time (s)")
    for ax in (top, bottom):
        ax.grid(True, alpha=0.3)
    return result
