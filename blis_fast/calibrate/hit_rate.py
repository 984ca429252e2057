"""``blis calibrate``'s KV hit-rate and TTFT-tolerance verdicts (KVO-11.3, CAL-6.2; the August
reference's #1598).

The real side is the trace header's ``observed_kv_metrics`` (``blis observe
--scrape-kv-metrics``), the simulated side the ``cache_hit_rate`` of ``blis replay
--metrics-path`` (``--sim-metrics``). Their distance is in percentage points, ``|sim - real| *
100``, and passes within ``--hit-rate-tolerance-pp`` (plus 1e-9, so that a distance of exactly
the band, which floating point may compute a hair above it, passes). Without ``--sim-metrics``,
or with a file that has no ``cache_hit_rate``, the comparison is skipped with a warning. The
TTFT verdict holds the report's request-level TTFT MAPE against ``--ttft-mape-threshold``.

The August reference adds ``ttft_tolerance`` to every report with a TTFT metric; the April
reference never does. So that every April calibrate case keeps its exact report, blis_fast adds
the two blocks only to a calibration that uses the loop: a header with
``observed_kv_metrics``, or any of ``--sim-metrics``, ``--hit-rate-tolerance-pp`` and
``--ttft-mape-threshold`` on the command line (none of which the April reference has).
"""

from __future__ import annotations

import logging
import math

from blis_fast.errors import BlisConfigError, BlisInputError
from blis_fast.gofmt import go_g
from blis_fast.workload.trace_v2 import ObservedKVMetrics

__all__ = ["BAND_EPSILON", "DEFAULT_HIT_RATE_TOLERANCE_PP", "DEFAULT_TTFT_MAPE_THRESHOLD",
           "add_verdicts", "check_tolerances", "hit_rate_comparison", "verdict_lines"]

DEFAULT_HIT_RATE_TOLERANCE_PP = 5.0
DEFAULT_TTFT_MAPE_THRESHOLD = 0.15
BAND_EPSILON = 1e-9

log = logging.getLogger("blis_fast")


def check_tolerances(tolerance_pp: float, ttft_threshold: float) -> None:
    """Both bounds must be finite and >= 0."""
    for flag, value in (("hit-rate-tolerance-pp", tolerance_pp),
                        ("ttft-mape-threshold", ttft_threshold)):
        if not (math.isfinite(value) and value >= 0):
            raise BlisConfigError(f"--{flag} must be a finite number >= 0, got {go_g(value)}")


def hit_rate_comparison(real: float, sim: float, tolerance_pp: float, source: str) -> dict:
    """The report's ``hit_rate`` object (keys in the reference's order)."""
    error_pp = abs(sim - real) * 100
    return {"real_hit_rate": real, "sim_hit_rate": sim, "abs_error_pp": error_pp,
            "tolerance_pp": tolerance_pp, "within": error_pp <= tolerance_pp + BAND_EPSILON,
            "source": source}


def _observed(observed: ObservedKVMetrics, trace_header: str) -> ObservedKVMetrics:
    """The header's block, refused when its rate is not a fraction (a corrupt header: observe
    never writes one)."""
    if not 0 <= observed.hit_rate <= 1:
        raise BlisInputError(f"--trace-header {trace_header}: observed_kv_metrics.hit_rate must "
                             f"be a fraction in [0, 1], got {go_g(observed.hit_rate)}")
    return observed


def add_verdicts(report: dict, observed: ObservedKVMetrics | None, trace_header: str,
                 sim_metrics: str, tolerance_pp: float, ttft_threshold: float,
                 bounds_given: bool = False) -> dict:
    """``report`` with ``hit_rate`` (when the header has an observed rate and ``sim_metrics``
    a ``cache_hit_rate``) and ``ttft_tolerance`` (when there is a TTFT metric) appended, if
    the calibration uses the loop (module docstring; ``bounds_given``: one of the two bound
    flags was on the command line); warnings say why a comparison was skipped."""
    from blis_fast.calibrate.adapter_reference import load_sim_cache_hit_rate  # lazy

    out = dict(report)
    if observed is None and not sim_metrics and not bounds_given:
        return out  # an April-style calibration: the April report, key for key
    if observed is not None:
        observed = _observed(observed, trace_header)
        if not sim_metrics:
            log.warning(f"the trace header has an observed KV hit rate ({observed.source}, "
                        f"{observed.hit_rate:.4f}) but no --sim-metrics was given: no hit-rate "
                        "comparison (write one with blis replay --metrics-path FILE)")
        else:
            sim = load_sim_cache_hit_rate(sim_metrics)
            if sim is None:
                log.warning(f"--sim-metrics {sim_metrics} has no cache_hit_rate: no hit-rate "
                            "comparison (blis replay --metrics-path writes it)")
            else:
                out["hit_rate"] = hit_rate_comparison(observed.hit_rate, sim, tolerance_pp,
                                                      observed.source)
    elif sim_metrics:
        log.warning(f"--sim-metrics not used: the trace header {trace_header} has no "
                    "observed_kv_metrics (blis observe --scrape-kv-metrics records them)")
    ttft = report["metrics"].get("ttft")
    if ttft is not None:
        mape = ttft["request_level"]["mape"]
        out["ttft_tolerance"] = {"mape": mape, "threshold": ttft_threshold,
                                 "within": mape <= ttft_threshold}
    return out


def verdict_lines(report: dict) -> list[tuple[int, str]]:
    """The (level, message) lines of the two verdicts: info when within, warning when not."""
    lines = []
    hr = report.get("hit_rate")
    if hr is not None:
        lines.append((logging.INFO if hr["within"] else logging.WARNING,
                      f"KV hit rate ({hr['source']}): real {hr['real_hit_rate']:.4f}, sim "
                      f"{hr['sim_hit_rate']:.4f}, error {hr['abs_error_pp']:.2f} pp (tolerance "
                      f"{hr['tolerance_pp']:.2f} pp) [{'WITHIN' if hr['within'] else 'EXCEEDS'}]"))
    tv = report.get("ttft_tolerance")
    if tv is not None:
        lines.append((logging.INFO if tv["within"] else logging.WARNING,
                      f"TTFT MAPE {tv['mape'] * 100:.1f}% (threshold {tv['threshold'] * 100:.1f}%)"
                      f" [{'WITHIN' if tv['within'] else 'EXCEEDS'}]"))
    return lines
