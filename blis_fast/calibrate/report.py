"""The calibration report (CAL-5, April form) and the summary lines logged after it (CAL-8).

The report is the reference's JSON: ``trace_info``, ``metrics`` (``e2e``, ``itl`` when ITL
pairs exist, ``ttft``; sorted keys as Go writes a map), an always-empty ``config_match`` and
three ``known_limitations`` strings. A NaN or infinite value cannot be written as JSON (the
reference fails the same way), so :func:`report_text` raises naming the value.
"""

from __future__ import annotations

import math

from blis_fast.calibrate.pairing import CalibrationPairs
from blis_fast.calibrate.stats import compare_metric
from blis_fast.errors import BlisInputError
from blis_fast.output.gojson import marshal_indent

__all__ = ["KNOWN_LIMITATIONS", "build_report", "report_text", "summary_lines"]

# Caveats the report always lists (the April reference's three).
KNOWN_LIMITATIONS = (
    "BLIS models discrete batch steps. Real servers use iteration-level continuous batching. "
    "This may cause systematic TTFT prediction error under high load.",
    "Sim constructs synthetic prefix token IDs. Prefix cache hit rates may differ from real "
    "server, especially after evictions.",
    "If the real server uses speculative decoding, actual token generation patterns differ "
    "from sim's sequential model.",
)


def build_report(pairs: CalibrationPairs) -> dict:
    """The report as an ordered dict (metrics only for metrics with pairs)."""
    trace_info: dict = {
        "num_requests": pairs.num_requests,
        "warm_up_excluded": pairs.warm_up_excluded,
        "matched_pairs": pairs.matched,
        "token_mismatches": pairs.token_mismatches,
    }
    if pairs.itl_dropped:
        trace_info["itl_dropped"] = pairs.itl_dropped
    metrics = {}
    for name, vec in (("e2e", pairs.e2e), ("itl", pairs.itl), ("ttft", pairs.ttft)):
        if vec.real:
            metrics[name] = compare_metric(vec.real, vec.sim)
    return {"trace_info": trace_info, "metrics": metrics, "config_match": {},
            "known_limitations": list(KNOWN_LIMITATIONS)}


def _non_finite(obj: object, path: str) -> str | None:
    """The path of the first NaN/infinite float in ``obj``, or None."""
    if isinstance(obj, float):
        return None if math.isfinite(obj) else path
    if isinstance(obj, dict):
        for key, value in obj.items():
            found = _non_finite(value, f"{path}.{key}" if path else key)
            if found:
                return found
    return None


def report_text(report: dict) -> str:
    """The report file's text (Go ``MarshalIndent``, 2 spaces, no trailing newline)."""
    bad = _non_finite(report, "")
    if bad is not None:
        value = report
        for key in bad.split("."):
            value = value[key]
        shown = "NaN" if value != value else ("+Inf" if value > 0 else "-Inf")
        hint = (" (one side is constant up to rounding, so its variance came out negative)"
                if bad.endswith("pearson_r") else "")
        raise BlisInputError(f"calibration report: {bad} is {shown}{hint}; JSON cannot hold "
                             f"it, no report written")
    return marshal_indent(report)


def summary_lines(report: dict, pairs: CalibrationPairs, report_path: str) -> list[str]:
    """The info lines the reference logs after writing the report."""
    lines = [
        f"Calibration report written to {report_path}",
        f"  Matched pairs: {pairs.matched} (warm-up excluded: {pairs.warm_up_excluded}, "
        f"unmatched real: {pairs.unmatched_real}, unmatched sim: {pairs.unmatched_sim})",
        "Workload-level aggregate metrics:",
    ]
    metrics = report["metrics"]
    labels = (("ttft", "TTFT: "), ("e2e", "E2E:  "), ("itl", "ITL:  "))
    for key, label in labels:
        if key not in metrics:
            continue
        w = metrics[key]["workload_level"]
        lines += [
            f"  {label}Real mean={w['real_mean']:.0f}µs, Sim mean={w['sim_mean']:.0f}µs, "
            f"Error={w['mean_error']:+.0f}µs ({w['mean_percent_error'] * 100:.1f}%)",
            f"        Real P50={w['real_p50']:.0f}µs, P90={w['real_p90']:.0f}µs, "
            f"P99={w['real_p99']:.0f}µs",
            f"        Sim  P50={w['sim_p50']:.0f}µs, P90={w['sim_p90']:.0f}µs, "
            f"P99={w['sim_p99']:.0f}µs",
        ]
    lines.append("Request-level prediction quality:")
    for key, label in labels:
        if key not in metrics:
            continue
        q = metrics[key]["request_level"]
        lines.append(f"  {label}MAPE={q['mape'] * 100:.1f}%, PearsonR={q['pearson_r']:.3f}, "
                     f"Bias={q['bias_direction']}, Quality={q['quality']}")
    return lines
