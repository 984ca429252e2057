"""The fit report: losses, fitted values with bounds, calibrate figures per trace and holdout,
the requests left out of TTFT and ITL, and the verdict (``blis_fast.fit.verdict``)."""

from __future__ import annotations

import math
from typing import Any

from blis_fast.calibrate.pairing import CalibrationPairs
from blis_fast.calibrate.report import build_report
from blis_fast.fit.optimize import FitResult
from blis_fast.fit.problem import FitTrace, metric_errors, pair_trace, simulate, trace_loss
from blis_fast.fit.verdict import judge

__all__ = ["build_fit_report"]


def build_fit_report(result: FitResult, traces: list[FitTrace], holdout: list[FitTrace],
                     base_options: dict[str, Any], weights: dict[str, float]
                     ) -> tuple[dict, list[tuple[str, CalibrationPairs]]]:
    """The report dict and the (role, pairs) of every trace, replayed with the fitted values."""
    entries, figures = [], []
    for role, group in (("fit", traces), ("holdout", holdout)):
        for ft in group:
            pairs = pair_trace(ft, simulate(ft, base_options, result.latency_model,
                                            result.alpha, result.beta))
            figures.append((role, pairs))
            entries.append({"role": role, "trace_header": ft.header_path,
                            "trace_data": ft.data_path, "itl_data": ft.itl_path,
                            "left_out_of_ttft_itl": ft.left_out,
                            "calibration": build_report(pairs)})
    verdict = judge([p for role, p in figures if role == "fit"], weights,
                    start_loss(result, traces, base_options, weights), result.loss)
    model = result.model
    coefficients = [
        {"name": name, "value": value, "initial": start, "lower": lo, "upper": hi,
         "fitted": k in model.free}
        for k, (name, value, start, (lo, hi)) in enumerate(zip(
            model.names, result.coefficients, result.initial, model.bounds, strict=True))
    ]
    report = {
        "latency_model": result.latency_model,
        "alpha_coeffs": list(result.alpha),
        "beta_coeffs": list(result.beta),
        "coefficients": coefficients,
        "weights": weights,
        "loss_function": result.loss_function,
        "loss": result.loss,
        "stopped": result.stopped,
        "seconds": result.seconds,
        "losses": result.losses,
        "search_losses": result.search_losses,
        "traces": [e for e in entries if e["role"] == "fit"],
        "holdout": [e for e in entries if e["role"] == "holdout"],
        "verdict": verdict.report(),
    }
    return report, figures


def start_loss(result: FitResult, traces: list[FitTrace], base_options: dict[str, Any],
               weights: dict[str, float]) -> float:
    """The loss at the starting coefficients, as the search scores an evaluation."""
    total = 0.0
    for ft in traces:
        sims = simulate(ft, base_options, result.latency_model, result.initial[:3],
                        result.initial[3:])
        value = trace_loss(metric_errors(pair_trace(ft, sims), result.loss_function), weights)
        total += value if math.isfinite(value) else 1e9
    return total / len(traces)
