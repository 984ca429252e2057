"""Output layer: Go-compatible JSON, statistics, the stdout report, results file, Parquet.

Modules: ``gojson`` (Go ``encoding/json`` formatting), ``stats`` (Go-exact mean, percentile,
Distribution), ``summary`` (metrics block, per-request results file), ``report`` (stdout
sections, anomaly detectors, fitness), ``parquet`` (``--output-dir`` files; imports pyarrow,
so it is not imported here).
"""

from blis_fast.output.report import ClusterReport, TraceSummary, render_report
from blis_fast.output.summary import (
    InstanceMetrics,
    RequestColumns,
    aggregate_instances,
    build_metrics_output,
    write_results_file,
)

__all__ = [
    "ClusterReport",
    "TraceSummary",
    "render_report",
    "InstanceMetrics",
    "RequestColumns",
    "aggregate_instances",
    "build_metrics_output",
    "write_results_file",
]
