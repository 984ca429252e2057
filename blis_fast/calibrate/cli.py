"""The ``blis calibrate`` command: flags of the reference (CAL-1.1, April; the August
reference's hit-rate loop and adapter mode) plus ``--plot``.

The report goes to ``--report`` (nothing on stdout); the summary is logged on stderr after it.
Errors are raised as ``BlisError`` and printed by ``blis_fast.cli`` (one line, exit 2); no
file is written unless every check passed.
"""

from __future__ import annotations

import contextlib
import logging

import click

from blis_fast.cli_numbers import GO_FLOAT, GO_INT
from blis_fast.errors import BlisConfigError

log = logging.getLogger("blis_fast")

_REQUIRED = ("trace-header", "trace-data", "sim-results", "report")


@contextlib.contextmanager
def _info_logging():
    """Show info lines for the command's duration (calibrate's summary is logged at info)."""
    previous = log.level
    log.setLevel(logging.INFO)
    try:
        yield
    finally:
        log.setLevel(previous)


@click.command("calibrate")
@click.option("--trace-header", default="", metavar="FILE", help="Observed trace header YAML (from blis observe; "
              "required)")
@click.option("--trace-data", default="", metavar="FILE", help="Observed trace data CSV (from blis observe; "
              "required)")
@click.option("--sim-results", default="", metavar="FILE", help="SimResult JSON (from blis replay "
              "--results-path; required)")
@click.option("--report", default="", metavar="FILE", help="Calibration report JSON to write (required)")
@click.option("--warmup-requests", type=GO_INT, default="-1", metavar="INT", show_default=True,
              help="Exclude request ids below this (-1: the header's warm_up_requests; 0: none)")
@click.option("--network-rtt-us", type=GO_INT, default="-1", metavar="INT", show_default=True,
              help="RTT in µs added to the sim latencies (-1: the header's "
              "network.measured_rtt_ms)")
@click.option("--network-bandwidth-mbps", type=GO_FLOAT, default="0", metavar="FLOAT",
              show_default=True,
              help="Bandwidth for the upload/download delay of 4 bytes per token (0: none)")
@click.option("--itl-data", default="", metavar="FILE",
              help="ITL chunk CSV (from blis observe --record-itl): adds the itl metric")
@click.option("--plot", "plot_path", default="", metavar="FILE",
              help="Also draw sim vs real (per-request scatter and CDFs of TTFT and E2E) to "
              "this image file (.png, .svg, .pdf)")
@click.option("--exclude-flagged", is_flag=True, default=False,
              help="Grade TTFT and ITL without the requests delivered in one burst, sent "
              "unstreamed or read by a late client (the report then says so)")
@click.option("--adapter-reference", default="", metavar="FILE",
              help="Digital-Twin reference JSON (adapter_aware/adapter_blind aggregates): "
              "compare BLIS's aggregate TTFT and output throughput with it instead (the trace "
              "flags are then not used)")
@click.option("--sim-metrics", default="", metavar="FILE",
              help="BLIS metrics JSON (blis run/replay --metrics-path): with an observed trace "
              "whose header has observed_kv_metrics, its cache_hit_rate is compared with the "
              "real one (the report's hit_rate); with --adapter-reference, the adapter-aware "
              "run (required there)")
@click.option("--hit-rate-tolerance-pp", type=GO_FLOAT, default="5", metavar="FLOAT",
              show_default=True,
              help="Band of the KV hit-rate comparison in percentage points (|sim - real| x 100)")
@click.option("--ttft-mape-threshold", type=GO_FLOAT, default="0.15", metavar="FLOAT",
              show_default=True,
              help="TTFT MAPE (fraction) at or below which the report's ttft_tolerance is within")
@click.option("--sim-metrics-blind", default="", metavar="FILE",
              help="BLIS metrics JSON of the same workload without adapters: adds the "
              "aware/blind (delta-normalized) error to the --adapter-reference report")
@click.option("--adapter-mape-threshold", type=GO_FLOAT, default="0.20", metavar="FLOAT",
              show_default=True, help="Error bound (fraction) of the --adapter-reference "
              "comparison")
@click.pass_context
def calibrate_command(ctx: click.Context, trace_header: str, trace_data: str, sim_results: str,
                      report: str, warmup_requests: int, network_rtt_us: int,
                      network_bandwidth_mbps: float, itl_data: str, plot_path: str,
                      exclude_flagged: bool, adapter_reference: str, sim_metrics: str,
                      hit_rate_tolerance_pp: float, ttft_mape_threshold: float,
                      sim_metrics_blind: str, adapter_mape_threshold: float) -> None:
    """Compare the latencies of an observed trace with a replay's SimResults (or, with
    --adapter-reference, a LoRA run's aggregates with a Digital-Twin reference)."""
    if adapter_reference:
        _warn_unused(ctx, _TRACE_FLAGS, "with --adapter-reference")
        _adapter_reference(adapter_reference, sim_metrics, sim_metrics_blind, report,
                           adapter_mape_threshold)
        return
    _warn_unused(ctx, _ADAPTER_FLAGS, "without --adapter-reference")
    from blis_fast.calibrate.calibration import calibrate  # lazy: not for blis --help
    from blis_fast.calibrate.report import report_text, summary_lines  # lazy: not for blis --help

    plan, plot_format = _output_plan(trace_header, trace_data, sim_results, report, itl_data,
                                     sim_metrics, plot_path)
    result = calibrate(trace_header, trace_data, sim_results, warmup_requests=warmup_requests,
                       network_rtt_us=network_rtt_us,
                       network_bandwidth_mbps=network_bandwidth_mbps,
                       itl_data=itl_data or None, hit_rate_tolerance_pp=hit_rate_tolerance_pp,
                       ttft_mape_threshold=ttft_mape_threshold)
    from blis_fast.calibrate.inputs import load_itl  # lazy: not for blis --help
    from blis_fast.calibrate.quality import quality_lines, regrade, trace_flags  # lazy: numpy
    from blis_fast.workload.replay import load_trace_records  # lazy: not for blis --help

    flags = trace_flags(load_trace_records(trace_data), trace_data, result.warm_up,
                        load_itl(itl_data) if itl_data else None)
    if exclude_flagged and flags.flagged:
        result.report = regrade(result.report, result.pairs, flags, trace_data)
    from blis_fast.calibrate.hit_rate import add_verdicts, verdict_lines  # lazy: not for --help

    result.report = add_verdicts(result.report, result.observed_kv, trace_header, sim_metrics,
                                 hit_rate_tolerance_pp, ttft_mape_threshold,
                                 bool(_given(ctx, ("hit_rate_tolerance_pp",
                                                   "ttft_mape_threshold"))))
    _write(plan, report, report_text(result.report), plot_path, plot_format, result)
    with _info_logging():
        for line in result.pairs.warnings:
            log.warning(line)
        for line in quality_lines(flags, result.pairs, exclude_flagged):
            log.warning(line)
        for line in summary_lines(result.report, result.pairs, report):
            log.info(line)
        for level, line in verdict_lines(result.report):
            log.log(level, line)
        if plot_format is not None:
            log.info(f"Plot written to {plot_path}")


def _output_plan(trace_header: str, trace_data: str, sim_results: str, report: str,
                 itl_data: str, sim_metrics: str, plot_path: str):
    """The required flags checked, then the output paths (``files.OutputPlan``: no output
    may be an input) and the ``--plot`` format (None without it)."""
    given = {"trace-header": trace_header, "trace-data": trace_data,
             "sim-results": sim_results, "report": report}
    for name in _REQUIRED:
        if not given[name]:
            raise BlisConfigError(f"--{name} is required")
    from blis_fast.files import OutputPlan  # lazy: not for blis --help

    plan = OutputPlan()
    plan.add_inputs([("--trace-header", trace_header), ("--trace-data", trace_data),
                     ("--sim-results", sim_results), ("--itl-data", itl_data),
                     ("--sim-metrics", sim_metrics)])
    plan.check_file(report, "--report")
    plot_format = None
    if plot_path:
        # lazy: not for blis --help (polars)
        from blis_fast.calibrate.plot import check_plot_path

        plot_format = check_plot_path(plot_path)
        plan.check_file(plot_path, "--plot")
    return plan, plot_format


def _write(plan, report: str, text: str, plot_path: str, plot_format: str | None,
           result) -> None:
    """The report and its asked-for plot, written together or not at all."""
    with plan:
        plan.stage_text(report, "--report", text)
        if plot_format is not None:
            # lazy: not for blis --help (polars)
            from blis_fast.calibrate.plot import plot_calibration, render_plot

            image = render_plot(plot_calibration(result.pairs, result.report), plot_format)
            plan.stage(plot_path, "--plot", image)
        plan.commit()


_TRACE_FLAGS = ("trace_header", "trace_data", "sim_results", "warmup_requests", "network_rtt_us",
                "network_bandwidth_mbps", "itl_data", "plot_path", "exclude_flagged",
                "hit_rate_tolerance_pp", "ttft_mape_threshold")
_ADAPTER_FLAGS = ("sim_metrics_blind", "adapter_mape_threshold")
"""Flags only adapter mode reads (``--sim-metrics`` serves both modes)."""


def _given(ctx: click.Context, names: tuple[str, ...]) -> list[str]:
    """The flags among ``names`` (parameter names) given on the command line."""
    from click.core import ParameterSource

    return [f"--{p.opts[0].lstrip('-')}" for p in ctx.command.params
            if p.name in names and ctx.get_parameter_source(p.name) == ParameterSource.COMMANDLINE]


def _warn_unused(ctx: click.Context, names: tuple[str, ...], mode: str) -> None:
    """One warning naming the given flags that the chosen mode does not read (the reference
    ignores them silently)."""
    given = _given(ctx, names)
    if given:
        log.warning(f"{', '.join(given)} not used {mode}: ignored")


def _adapter_reference(reference: str, sim_metrics: str, sim_metrics_blind: str, report: str,
                       threshold: float) -> None:
    """``--adapter-reference`` mode (LORA-9): the checks in the reference's order, then the
    report written atomically, then the verdict lines on stderr."""
    if not sim_metrics:
        raise BlisConfigError("--sim-metrics is required with --adapter-reference (BLIS "
                              "aggregate MetricsOutput from run/replay --metrics-path)")
    if not report:
        raise BlisConfigError("--report is required")
    from blis_fast.calibrate import adapter_reference as ar  # lazy: not for blis --help
    from blis_fast.files import OutputPlan  # lazy: not for blis --help

    ar.check_threshold(threshold)
    ref = ar.load_dt_reference(reference)
    aware = ar.load_blis_aggregate(sim_metrics)
    blind = ar.load_blis_aggregate(sim_metrics_blind) if sim_metrics_blind else None
    plan = OutputPlan()
    plan.add_inputs([("--adapter-reference", reference), ("--sim-metrics", sim_metrics),
                     ("--sim-metrics-blind", sim_metrics_blind)])
    plan.check_file(report, "--report")
    result = ar.compare(ref, aware, blind, threshold)
    text = ar.report_text(result)
    with plan:
        plan.stage_text(report, "--report", text)
        plan.commit()
    with _info_logging():
        for level, line in ar.report_lines(result, report, bool(sim_metrics_blind)):
            log.log(level, line)


def register(main_group: click.Group) -> None:
    """Add ``calibrate`` to the ``blis`` command group."""
    main_group.add_command(calibrate_command)
