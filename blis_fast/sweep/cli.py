"""``blis sweep``, ``blis saturate`` and ``blis plot``. Errors are raised as ``BlisError`` and
reported by ``blis_fast.cli.main``; hook the commands in with ``register(main_group)``."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from blis_fast.cli_numbers import GO_FLOAT, GO_INT
from blis_fast.errors import BlisConfigError
from blis_fast.sweep import BACKENDS

_BACKEND_OPTIONS = (
    click.option("--workers", type=GO_INT, default=None,
                 help="Worker processes (Ray: CPUs of a local Ray) [default: all cores]"),
    click.option("--backend", type=click.Choice(BACKENDS), default="local", show_default=True,
                 help="local: a pool of worker processes; ray: Ray tasks"),
    click.option("--ray-address", default=None, help="Address of a running Ray cluster"),
)


def _backend_options(func):
    for option in reversed(_BACKEND_OPTIONS):
        func = option(func)
    return func


@click.command("sweep")
@click.argument("spec")
@click.option("--out", "out_dir", required=True, help="Output directory of the sweep")
@_backend_options
@click.option("--resume", is_flag=True, help="Run only the configurations not yet in --out")
@click.option("--requests", "with_requests", is_flag=True,
              help="Also write per-request rows (and a P/D configuration's pools), "
                   "partitioned by configuration id")
@click.option("--chunk-size", type=GO_INT, default=None,
              help="Configurations per task [default: about 64 tasks, at most 32 each]")
def sweep_command(spec: str, out_dir: str, workers: int | None, backend: str,
                  ray_address: str | None, resume: bool, with_requests: bool,
                  chunk_size: int | None) -> None:
    """Run every configuration of SPEC (base + grid/zip/random/seeds axes) into --out."""
    from blis_fast.sweep.run import run_sweep  # lazy: not for blis --help

    try:
        outcome = run_sweep(spec, out_dir, workers=workers, backend=backend,
                            ray_address=ray_address, resume=resume, with_requests=with_requests,
                            chunk_size=chunk_size, progress=sys.stderr)
    except KeyboardInterrupt:
        sys.stderr.write(f"blis: sweep interrupted; finished configurations are in {out_dir}, "
                         "rerun with --resume to complete it\n")
        raise
    click.echo(f"{outcome.ran} configuration(s) run ({outcome.errors} failed), "
               f"{outcome.skipped} already done, {outcome.total} in all: {out_dir}/summary")


@click.command("saturate")
@click.argument("spec")
@click.option("--slo", "slos", multiple=True, required=True,
              help="Objective on a summary metric, e.g. 'ttft_p99_ms<=500' (repeatable: all hold)")
@click.option("--low", type=GO_FLOAT, default=1.0, show_default=True, help="Lowest rate (req/s)")
@click.option("--high", type=GO_FLOAT, default=100.0, show_default=True,
              help="Highest rate (req/s)")
@click.option("--tolerance", type=GO_FLOAT, default=0.5, show_default=True,
              help="Stop when the rate bracket is this narrow (req/s)")
@click.option("--out", "out_path", default=None, help="Write the table as Parquet here")
@_backend_options
def saturate_command(spec: str, slos: tuple[str, ...], low: float, high: float, tolerance: float,
                     out_path: str | None, workers: int | None, backend: str,
                     ray_address: str | None) -> None:
    """Per configuration of SPEC, bisect the highest request rate at which every SLO holds."""
    import polars as pl

    from blis_fast.sweep.saturate import (  # lazy: not for blis --help
        find_saturation,
        parse_slo,
        write_saturation,
    )

    parsed = [parse_slo(s) for s in slos]
    if out_path:
        from blis_fast.files import OutputPlan  # lazy: not for blis --help

        plan = OutputPlan()
        plan.add_inputs([("SPEC", spec)])
        plan.check_file(out_path, "--out")  # before any bisection runs
    table = find_saturation(spec, parsed, low, high, tolerance, workers=workers,
                            backend=backend, ray_address=ray_address, progress=sys.stderr)
    if out_path:
        write_saturation(out_path, table)
    frame = pl.from_arrow(table)
    options = [f.name for f in table.schema][1:table.schema.get_field_index("max_rate_per_sec")]
    constant = {c for c in options if frame[c].n_unique() == 1}
    shown = [c for c in frame.columns if c not in constant and c != "slo"]
    with pl.Config(tbl_rows=-1, tbl_cols=-1, tbl_width_chars=200, fmt_str_lengths=60):
        click.echo(f"SLO: {' and '.join(str(s) for s in parsed)}")
        click.echo(str(frame.select(shown)))


@click.command("plot")
@click.argument("source")
@click.option("--x", "x", default=None, help="Column on the x axis (e.g. rate)")
@click.option("--y", "y", default=None, help="Column on the y axis (e.g. ttft_p99_ms)")
@click.option("--cdf", "cdf", default=None,
              help="Plot the CDF of a per-request column (e.g. ttft_ms, e2e_ms) instead")
@click.option("--by", default=None, help="One line per value of this column")
@click.option("--facet", default=None, help="One panel per value of this column")
@click.option("--where", "where", multiple=True, help="Keep rows with COLUMN=VALUE (repeatable)")
@click.option("--logy", is_flag=True, help="Logarithmic y axis")
@click.option("--logx", is_flag=True, help="Logarithmic x axis (base 2: for doublings)")
@click.option("--scaling", is_flag=True,
              help="SOURCE is an autoscaled run's --output-dir: replicas, request rate and p99 "
                   "TTFT over time")
@click.option("--window", type=GO_FLOAT, default=10.0, show_default=True,
              help="--scaling: window of the rate and TTFT series (seconds)")
@click.option("-o", "--output", "output", required=True, help="Image file to write (.png, .svg)")
@click.option("--width", type=GO_FLOAT, default=8.0, show_default=True, help="Width in inches")
@click.option("--height", type=GO_FLOAT, default=5.0, show_default=True, help="Height in inches")
@click.option("--dpi", type=GO_INT, default=100, show_default=True, help="Pixels per inch")
def plot_command(source: str, x: str | None, y: str | None, cdf: str | None, by: str | None,
                 facet: str | None, where: tuple[str, ...], logy: bool, logx: bool,
                 scaling: bool,
                 window: float, output: str, width: float, height: float, dpi: int) -> None:
    """Plot a sweep directory (SOURCE) or a Parquet file: y vs x lines, or a CDF."""
    from blis_fast.sweep import plot as P  # lazy: not for blis --help

    _check_figure(width, height, dpi, output)
    from blis_fast.files import OutputPlan  # lazy: not for blis --help

    plan = OutputPlan()
    plan.add_inputs([("SOURCE", source)])
    plan.check_file(output, "--output")
    if scaling:
        if x is not None or y is not None or cdf is not None:
            raise BlisConfigError("--scaling plots a run's timeline: leave out --x, --y, --cdf")
        result = P.plot_scaling(source, window, width=width, height=height, dpi=dpi)
    elif cdf is not None:
        if x is not None or y is not None:
            raise BlisConfigError("--cdf plots one column: leave out --x and --y")
        frame = P.filter_rows(P.load_requests(source), list(where))
        result = P.plot_cdf(frame, cdf, by, facet, width=width, height=height, dpi=dpi)
    else:
        if x is None or y is None:
            raise BlisConfigError("--x and --y are required (or --cdf COLUMN)")
        frame = P.filter_rows(P.load_summary(source), list(where))
        result = P.plot_lines(frame, x, y, by, facet, logy=logy, logx=logx, width=width,
                              height=height, dpi=dpi)
    result.save(output)
    click.echo(f"{output}: {len(result.series)} series")


PLOT_FORMATS = (".png", ".svg", ".pdf")
"""The image formats ``blis plot`` writes (chosen by the output's suffix)."""
MAX_PIXELS = 50_000_000
"""Largest raster (width x height in pixels) ``blis plot`` draws: about 200 MB of RGBA."""


def _check_figure(width: float, height: float, dpi: int, output: str) -> None:
    """Refuse a figure matplotlib cannot draw, or only with gigabytes: sizes finite and at
    least 1 inch, 10 to 2400 dpi, at most MAX_PIXELS pixels, a known image suffix."""
    from blis_fast.gofmt import go_g  # lazy: not for blis --help

    for flag, inches in (("width", width), ("height", height)):
        if not (1 <= inches <= 1000):
            raise BlisConfigError(f"--{flag} must be between 1 and 1000 inches, got {go_g(inches)}")
    if not (10 <= dpi <= 2400):
        raise BlisConfigError(f"--dpi must be between 10 and 2400, got {dpi}")
    if width * height * dpi * dpi > MAX_PIXELS:
        raise BlisConfigError(
            f"--width {go_g(width)} x --height {go_g(height)} inches at --dpi {dpi} is "
            f"{width * dpi * height * dpi:.0f} pixels, more than {MAX_PIXELS}")
    suffix = Path(output).suffix.lower()
    if suffix not in PLOT_FORMATS:
        raise BlisConfigError(f"--output {output}: unknown image format {suffix or '(none)'!r}; "
                              f"use one of {', '.join(PLOT_FORMATS)}")


def register(main_group: click.Group) -> None:
    """Add ``sweep``, ``saturate`` and ``plot`` to the ``blis`` command group."""
    main_group.add_command(sweep_command)
    main_group.add_command(saturate_command)
    main_group.add_command(plot_command)
