"""``blis saturate``: per configuration of a sweep spec, the highest request rate meeting an SLO.

For each configuration (base + axes, without ``rate``) the rate is bisected between a lower
and an upper bound until the bracket is narrower than the tolerance, assuming the SLO metrics
grow with the rate. The answer is the highest rate at which every SLO held; it is null when
the SLO fails at the lower bound, and the upper bound when it still holds there.
"""

from __future__ import annotations

import contextlib
import math
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import pyarrow as pa

from blis_fast.errors import BlisConfigError
from blis_fast.gonum import NumError, parse_float
from blis_fast.output.parquet import atomic_write_table, summary_table
from blis_fast.output.provenance import file_provenance, with_provenance
from blis_fast.sweep.execute import TaskRunner
from blis_fast.sweep.progress import Progress
from blis_fast.sweep.spec import SweepPlan, load_sweep_plan, validate_plan
from blis_fast.sweep.store import metric_fields, option_field
from blis_fast.sweep.worker import check_stop, error_text, raise_if_interrupted

__all__ = ["Slo", "SaturationTask", "bisect_rate", "find_saturation", "parse_slo",
           "saturation_table"]

_SLO_RE = re.compile(r"^\s*([a-z0-9_]+)\s*(<=|<|>=|>)\s*([-+0-9.eE]+)\s*$")
_COMPARE = {"<=": lambda a, b: a <= b, "<": lambda a, b: a < b,
            ">=": lambda a, b: a >= b, ">": lambda a, b: a > b}


@dataclass(frozen=True)
class Slo:
    """One objective on a summary metric, e.g. ``ttft_p99_ms <= 500``."""

    metric: str
    op: str
    bound: float

    def holds(self, metrics: dict[str, Any]) -> bool:
        """True when the run's metric meets the objective."""
        return bool(_COMPARE[self.op](metrics[self.metric], self.bound))

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{self.bound:g}"


def parse_slo(text: str) -> Slo:
    """``metric<=number`` (or ``<``, ``>=``, ``>``) on a summary metric column."""
    names = [f.name for f in metric_fields()]
    m = _SLO_RE.match(text)
    if m is None:
        raise BlisConfigError(f"--slo {text!r}: expected METRIC<=NUMBER, e.g. ttft_p99_ms<=500")
    metric, op, number = m.groups()
    if metric not in names:
        raise BlisConfigError(f"--slo {text!r}: unknown metric {metric!r}; metrics: "
                              + ", ".join(names))
    try:
        bound = parse_float(number)
    except NumError:
        raise BlisConfigError(f"--slo {text!r}: {number!r} is not a number") from None
    if not math.isfinite(bound):
        raise BlisConfigError(f"--slo {text!r}: the bound must be finite")
    return Slo(metric, op, bound)


@dataclass
class SaturationTask:
    """One configuration's search: run options without ``rate``, the SLOs and the bracket."""

    config_id: str
    kwargs: dict[str, Any]
    slos: tuple[Slo, ...]
    low: float
    high: float
    tolerance: float


@dataclass
class SaturationResult:
    """The search's answer for one configuration."""

    config_id: str
    max_rate: float | None
    """Highest rate tried at which every SLO held (None: not even at the lower bound)."""
    min_failing_rate: float | None
    """Lowest rate tried at which an SLO failed (None: they held up to the upper bound)."""
    runs: int
    metrics: dict[str, Any] | None
    """Summary metrics of the run at ``max_rate``."""
    error: str | None = None


def bisect_rate(task: SaturationTask) -> SaturationResult:
    """Bisect the rate of one configuration (runs in a worker)."""
    from blis_fast import api  # runs in the worker process only

    runs = 0

    def measure(rate: float) -> tuple[bool, dict[str, Any]]:
        nonlocal runs
        check_stop()
        runs += 1
        metrics = summary_table(api.run(**task.kwargs, rate=rate).summary_row).to_pylist()[0]
        return all(slo.holds(metrics) for slo in task.slos), metrics

    try:
        ok, metrics = measure(task.low)
        if not ok:
            return SaturationResult(task.config_id, None, task.low, runs, None)
        ok_high, metrics_high = measure(task.high)
        if ok_high:
            return SaturationResult(task.config_id, task.high, None, runs, metrics_high)
        low, high = task.low, task.high
        while high - low > task.tolerance:
            mid = (low + high) / 2
            if not low < mid < high:  # the bracket is one float apart: it cannot shrink
                break
            ok_mid, metrics_mid = measure(mid)
            if ok_mid:
                low, metrics = mid, metrics_mid
            else:
                high = mid
        return SaturationResult(task.config_id, low, high, runs, metrics)
    except Exception as exc:  # noqa: BLE001 - one configuration's failure is its row's error
        raise_if_interrupted(exc)
        return SaturationResult(task.config_id, None, None, runs, None, error_text(exc))


def _check_bounds(low: float, high: float, tolerance: float) -> None:
    if not (math.isfinite(low) and low > 0):
        raise BlisConfigError(f"--low must be a finite rate > 0, got {low}")
    if not (math.isfinite(high) and high > low):
        raise BlisConfigError(f"--high must be a finite rate > --low, got {high}")
    if not (math.isfinite(tolerance) and tolerance > 0):
        raise BlisConfigError(f"--tolerance must be a finite value > 0, got {tolerance}")


def _without_rate(plan: SweepPlan) -> None:
    if "rate" in plan.lines:
        raise BlisConfigError(f"{plan.path}:{plan.lines['rate']}: 'rate' is what saturate "
                              "searches; remove it from the spec")


def find_saturation(spec_path: str | Path, slos: list[Slo], low: float, high: float,
                    tolerance: float, *, workers: int | None = None, backend: str = "local",
                    ray_address: str | None = None, progress: TextIO | None = None
                    ) -> pa.Table:
    """The saturation table of every configuration of the spec (one row each)."""
    if not slos:
        raise BlisConfigError("--slo is required (e.g. --slo 'ttft_p99_ms<=500')")
    _check_bounds(low, high, tolerance)
    results: list[SaturationResult] = []
    with TaskRunner(backend, workers, ray_address) as runner, contextlib.ExitStack() as stack:
        plan = load_sweep_plan(spec_path, validate=False)
        _without_rate(plan)
        for rate in (low, high):  # both ends of the bracket pass blis run's checks
            validate_plan(plan, {"rate": rate})
        offload_dir = stack.enter_context(  # the varied offload blocks (spec.py)
            tempfile.TemporaryDirectory(prefix="blis-saturate-offload-"))
        plan.write_offload_files(offload_dir)
        tasks = [SaturationTask(c.config_id, plan.run_kwargs(c, offload_dir=offload_dir),
                                tuple(slos), low, high, tolerance) for c in plan.configs]
        bar = Progress(len(tasks), 0, progress, label="saturate")
        try:
            for res in runner.map(bisect_rate, tasks):
                results.append(res)
                bar.advance(1, int(res.error is not None))
        finally:
            bar.close()
    return saturation_table(plan, sorted(results, key=lambda r: r.config_id), slos)


def saturation_table(plan: SweepPlan, results: list[SaturationResult], slos: list[Slo]
                     ) -> pa.Table:
    """Rows: config_id, option columns, the bracket found, the SLO metrics at the max rate, error."""
    values = {c.config_id: c.values for c in plan.configs}
    metrics = list(dict.fromkeys(s.metric for s in slos))
    metric_types = {f.name: f.type for f in metric_fields()}
    schema = pa.schema([
        pa.field("config_id", pa.string(), nullable=False),
        *(option_field(c, plan) for c in plan.columns),
        pa.field("max_rate_per_sec", pa.float64()),
        pa.field("min_failing_rate_per_sec", pa.float64()),
        pa.field("runs", pa.int64(), nullable=False),
        *(pa.field(m, metric_types[m]) for m in metrics),
        pa.field("slo", pa.string(), nullable=False), pa.field("error", pa.string())])
    slo_text = " and ".join(str(s) for s in slos)
    rows = [{"config_id": r.config_id, **values[r.config_id], "max_rate_per_sec": r.max_rate,
             "min_failing_rate_per_sec": r.min_failing_rate, "runs": r.runs,
             **{m: None if r.metrics is None else r.metrics[m] for m in metrics},
             "slo": slo_text, "error": r.error} for r in results]
    return pa.Table.from_pylist(rows, schema=schema)


def write_saturation(path: str | Path, table: pa.Table) -> None:
    """Write the saturation table as Parquet, atomically, with the version provenance (its
    metric columns are ``schemas/summary.json``'s)."""
    atomic_write_table(path, with_provenance(table, file_provenance("summary", "saturate")),
                       flag="--out")
