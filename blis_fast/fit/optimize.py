"""Simulation-based fit of blackbox α/β: a regression start, then Powell on log-coefficients.

Why Powell on logarithms: the loss is a replay's MAPE, piecewise constant at the scale of
integer-µs step times and jumping with discrete scheduling decisions (TTFT depends on where an
arrival falls in the step cycle), so gradients and the finite differences ``least_squares``
takes are noise. Powell's bounded line searches are derivative-free and, on recovery traces,
reached lower losses than Nelder-Mead and differential evolution for the same budget.
Optimizing ``log(c)`` inside bounds keeps every coefficient positive and puts coefficients of
very different magnitudes (µs per step vs µs per token) on one scale. Deterministic for a seed:
the seed only shapes Powell's initial directions, and the replays are deterministic.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from blis_fast.fit.problem import FitTrace, metric_mapes, pair_trace, simulate, trace_loss

__all__ = ["BLACKBOX_NAMES", "BLACKBOX_BOUNDS", "FitResult", "fit", "initial_guess"]

BLACKBOX_NAMES = ("alpha0", "alpha1", "alpha2", "beta0", "beta1", "beta2")
# (lower, upper) of each coefficient: µs, µs/input token, µs/output token, µs/step,
# µs/prefill token, µs/decode token
BLACKBOX_BOUNDS = ((1.0, 1e7), (1e-4, 1e4), (0.0, 0.0), (1.0, 1e7), (1e-4, 1e4), (1e-2, 1e6))
# α2 (a per-output-token delay that does not slow the batch) shifts every ITL sample exactly as
# β0 does at a steady batch size, so observed latencies cannot tell them apart: it stays 0.
FREE = (0, 1, 3, 4, 5)


class _Stop(Exception):
    """The evaluation or time budget is spent."""


@dataclass
class FitResult:
    """The fitted coefficients, the initial guess and the loss of every evaluation."""

    coefficients: tuple[float, ...]
    initial: tuple[float, ...]
    loss: float
    losses: list[float] = field(default_factory=list)
    stopped: str = ""
    seconds: float = 0.0

    @property
    def alpha(self) -> tuple[float, float, float]:
        """α0, α1, α2."""
        return tuple(self.coefficients[:3])  # type: ignore[return-value]

    @property
    def beta(self) -> tuple[float, float, float]:
        """β0, β1, β2."""
        return tuple(self.coefficients[3:])  # type: ignore[return-value]


def _clip(values: list[float]) -> tuple[float, ...]:
    return tuple(min(max(v, lo), hi) for v, (lo, hi) in zip(values, BLACKBOX_BOUNDS, strict=True))


def _linear_fit(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Least-squares intercept and slope (slope 0 when x does not vary)."""
    if x.size == 0:
        return 0.0, 0.0
    if x.size < 2 or float(np.ptp(x)) == 0.0:
        return float(np.mean(y)), 0.0
    slope, intercept = np.polyfit(x, y, 1)
    return float(intercept), float(slope)


def initial_guess(traces: list[FitTrace]) -> tuple[float, ...]:
    """Blackbox coefficients from two regressions on the observed rows (warm-up excluded):
    per-token decode time on the number of requests in flight (→ β0, β2), and TTFT on the
    input length (→ α0, β1 + α1). Per-token TTFT: 90% to β1, 10% to α1."""
    xs_b, ys_itl, xs_in, ys_ttft = [], [], [], []
    for ft in traces:
        r = ft.trace.records
        keep = (r.request_id >= ft.warm_up) & (r.first_chunk_us >= r.send_us) \
            & (r.last_chunk_us >= r.first_chunk_us)
        send = r.send_us[keep].astype(np.float64)
        first = r.first_chunk_us[keep].astype(np.float64)
        last = r.last_chunk_us[keep].astype(np.float64)
        n_out = r.output_tokens[keep].astype(np.float64)
        n_in = (r.input_tokens + r.prefix_length)[keep].astype(np.float64)
        mid = (first + last) / 2.0
        in_flight = ((send[None, :] <= mid[:, None]) & (mid[:, None] <= last[None, :])).sum(axis=1)
        multi = n_out > 1
        xs_b.append(in_flight[multi].astype(np.float64))
        ys_itl.append((last - first)[multi] / (n_out[multi] - 1.0))
        xs_in.append(n_in)
        ys_ttft.append(first - send - float(ft.rtt_us))
    c_itl, s_itl = _linear_fit(np.concatenate(xs_b), np.concatenate(ys_itl))
    c_ttft, s_ttft = _linear_fit(np.concatenate(xs_in), np.concatenate(ys_ttft))
    step = max(c_itl, 0.0)
    if step <= 0:  # no multi-token outputs: read a step time off the TTFT intercept
        step = max(c_ttft, 2.0) / 2.0
    beta2 = s_itl if s_itl > 0 else 0.01 * step
    per_token = s_ttft if s_ttft > 0 else 0.01 * step / 100.0
    beta0 = step
    alpha0 = max(c_ttft - beta0, 0.05 * step)
    return _clip([alpha0, 0.1 * per_token, 0.0, beta0, 0.9 * per_token, beta2])


def fit(traces: list[FitTrace], base_options: dict[str, Any], weights: dict[str, float], *,
        max_evaluations: int = 2000, time_limit_s: float = 60.0, seed: int = 0,
        on_evaluation: Callable[[int, float, float], None] | None = None) -> FitResult:
    """Minimize the mean over ``traces`` of the weighted MAPE by replaying them in-process.

    ``on_evaluation(count, loss, best)`` is called after every evaluation (the progress bar).
    """
    from scipy.optimize import minimize

    start = time.monotonic()
    x0_coeffs = initial_guess(traces)
    free = list(FREE)
    lo = np.log([BLACKBOX_BOUNDS[k][0] for k in free])
    hi = np.log([BLACKBOX_BOUNDS[k][1] for k in free])
    losses: list[float] = []
    best: list[Any] = [math.inf, x0_coeffs]

    def loss_of(theta: np.ndarray, stage_weights: dict[str, float]) -> float:
        if len(losses) >= max_evaluations:
            raise _Stop("max-evaluations")
        if losses and time.monotonic() - start > time_limit_s:
            raise _Stop("time-limit")
        full = list(x0_coeffs)
        for k, v in zip(free, np.exp(np.clip(theta, lo, hi)).tolist(), strict=True):
            full[k] = float(v)
        coeffs = tuple(full)
        total = stage_total = 0.0
        for ft in traces:
            pairs = pair_trace(ft, simulate(ft, base_options, "blackbox", coeffs[:3], coeffs[3:]))
            mapes = metric_mapes(pairs)
            value = trace_loss(mapes, weights)
            total += value if math.isfinite(value) else 1e9
            value = trace_loss(mapes, stage_weights)
            stage_total += value if math.isfinite(value) else 1e9
        value = total / len(traces)
        losses.append(value)
        if value < best[0]:
            best[0], best[1] = value, coeffs
        if on_evaluation is not None:
            on_evaluation(len(losses), value, best[0])
        return stage_total / len(traces)

    rng = np.random.default_rng(seed)
    theta0 = np.log([x0_coeffs[k] for k in free])
    stopped = "converged"
    bounds = list(zip(lo, hi, strict=True))
    try:
        # Stage 1 fits the step costs on E2E/ITL alone (TTFT varies with where an arrival falls
        # in the step cycle, which buries the per-decode-token slope in local minima); stage 2
        # starts there with the user's weights and shorter steps. The result is the best
        # evaluation under the user's weights.
        decode_weights = dict(weights, ttft=0.0)
        if decode_weights["e2e"] == 0 and decode_weights["itl"] == 0:
            decode_weights = weights
        centre = theta0
        for stage_weights, scale, share in ((decode_weights, 0.7, 2), (weights, 0.2, 1)):
            steps = scale * rng.choice([-1.0, 1.0], size=centre.size) \
                * rng.uniform(0.7, 1.3, size=centre.size)
            res = minimize(loss_of, centre, args=(stage_weights,), method="Powell", bounds=bounds,
                           options={"direc": np.diag(steps), "xtol": 1e-3, "ftol": 1e-5,
                                    "maxfev": max((max_evaluations - len(losses)) // share, 1)})
            centre = np.clip(res.x, lo, hi)
    except _Stop as why:
        stopped = str(why)
    if stopped == "converged" and len(losses) >= max_evaluations - 1:
        stopped = "max-evaluations"  # a stage's share of the budget ran out
    return FitResult(coefficients=best[1], initial=x0_coeffs, loss=best[0], losses=losses,
                     stopped=stopped, seconds=time.monotonic() - start)
