"""Simulation-based fit of a latency backend's α/β (blackbox, or trained-physics): a start
(a regression for blackbox, the published coefficients rescaled by a one-factor search for
trained-physics), then Powell on the logarithms of the free coefficients; several searches
from seeded starts can run at once on the sweep's worker processes.

Why Powell on logarithms: the loss is a replay's MAPE, piecewise constant at the scale of
integer-µs step times and jumping with discrete scheduling decisions (TTFT depends on where an
arrival falls in the step cycle), so gradients and the finite differences ``least_squares``
takes are noise. Powell's bounded line searches are derivative-free and, on recovery traces,
reached lower losses than Nelder-Mead and differential evolution for the same budget.
Optimizing ``log(c)`` inside bounds keeps every coefficient positive and puts coefficients of
very different magnitudes (µs per step vs µs per token) on one scale. Deterministic for a seed
and a number of starts (not of workers): the seed only shapes the starts and Powell's initial
directions, and the replays are deterministic. Parallel searches rather than parallel
evaluations inside one search: Powell's line searches are sequential, and independent starts
also guard against the local minima the TTFT term makes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from blis_fast.config.defaults import TRAINED_PHYSICS_SECTION, load_defaults
from blis_fast.data import data_path
from blis_fast.fit.problem import (
    DEFAULT_LOSS,
    FitTrace,
    metric_errors,
    pair_trace,
    simulate,
    trace_loss,
)

__all__ = ["BLACKBOX_BOUNDS", "BLACKBOX_NAMES", "FIT_MODELS", "MAX_STARTS", "FitModel",
           "FitResult", "evaluations_per_search", "fit", "initial_guess"]

BLACKBOX_NAMES = ("alpha0", "alpha1", "alpha2", "beta0", "beta1", "beta2")
# (lower, upper) of each coefficient: µs, µs/input token, µs/output token, µs/step,
# µs/prefill token, µs/decode token
BLACKBOX_BOUNDS = ((1.0, 1e7), (1e-4, 1e4), (0.0, 0.0), (1.0, 1e7), (1e-4, 1e4), (1e-2, 1e6))


@dataclass(frozen=True)
class FitModel:
    """A latency backend the fit can tune: its coefficient names (3 alphas, then the betas),
    the bounds of each and which ones move (the others keep their starting value)."""

    latency_model: str
    names: tuple[str, ...]
    bounds: tuple[tuple[float, float], ...]
    free: tuple[int, ...]
    prescale: bool  # start with a search for one factor on every coefficient (unknown scale)

    def clip(self, values: list[float] | tuple[float, ...]) -> tuple[float, ...]:
        """``values`` inside the bounds of the free coefficients (fixed ones pass as they are)."""
        return tuple(min(max(v, lo), hi) if k in self.free else v
                     for k, (v, (lo, hi)) in enumerate(zip(values, self.bounds, strict=True)))


# α2 (a per-output-token delay that does not slow the batch) shifts every ITL sample exactly as
# β0 does at a steady batch size, so observed latencies cannot tell them apart: it stays 0.
BLACKBOX = FitModel("blackbox", BLACKBOX_NAMES, BLACKBOX_BOUNDS, (0, 1, 3, 4, 5), prescale=False)

# trained-physics (kernels/engine/latency.py): α0 queueing µs, α1 post-decode µs, α2 µs per output
# token; β0 prefill compute, β1 decode compute, β2 weight loading, β3 TP all-reduce, β4 µs per
# layer, β5 µs per request, β6 µs per step, β7 MoE per layer, β8 prefill KV, β9 decode KV.
# Free: the terms a single-GPU dense deployment's latencies can tell apart. α2 and β4 are
# constants per output token / per step like β6 (kept at the default), β3 and β7 need TP > 1
# or MoE, β1 and β8 are 0 in the published coefficients (their phases are charged to the
# memory terms) and stay so.
PHYSICS_NAMES = ("alpha0", "alpha1", "alpha2", *(f"beta{k}" for k in range(10)))
PHYSICS_BOUNDS = ((1.0, 1e8), (1.0, 1e8), (0.0, 1e6), (1e-6, 1e6), (0.0, 1e6), (1e-6, 1e6),
                  (0.0, 1e6), (0.0, 1e6), (1e-4, 1e7), (1e-2, 1e8), (0.0, 1e6), (0.0, 1e6),
                  (1e-6, 1e6))
TRAINED_PHYSICS = FitModel("trained-physics", PHYSICS_NAMES, PHYSICS_BOUNDS,
                           (0, 1, 3, 5, 8, 9, 12), prescale=True)

FIT_MODELS = {m.latency_model: m for m in (BLACKBOX, TRAINED_PHYSICS)}
"""The backends ``blis fit --latency-model`` accepts."""


class _Stop(Exception):
    """The evaluation or time budget is spent."""


@dataclass
class FitResult:
    """The fitted coefficients, the initial guess and the loss of every evaluation."""

    coefficients: tuple[float, ...]
    initial: tuple[float, ...]
    loss: float
    losses: list[float] = field(default_factory=list)  # every evaluation, search after search
    stopped: str = ""
    seconds: float = 0.0
    latency_model: str = "blackbox"
    search_losses: list[float] = field(default_factory=list)  # the best loss of each search
    loss_function: str = DEFAULT_LOSS  # the per-metric error minimized (problem.LOSSES)

    @property
    def alpha(self) -> tuple[float, float, float]:
        """α0, α1, α2."""
        return tuple(self.coefficients[:3])  # type: ignore[return-value]

    @property
    def beta(self) -> tuple[float, ...]:
        """The betas (3 for blackbox, 10 for trained-physics)."""
        return tuple(self.coefficients[3:])

    @property
    def model(self) -> FitModel:
        """The fitted backend's description (names, bounds, free coefficients)."""
        return FIT_MODELS[self.latency_model]


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
    input length (→ α0, β1 + α1). Per-token TTFT: 90% to β1, 10% to α1. Requests with a
    quality flag (``FitTrace.flags``: their TTFT and ITL measure the delivery path) are left
    out; when none is left, E2E on the output length gives the TTFT and the step time."""
    xs_b, ys_itl, xs_in, ys_ttft = [], [], [], []
    xs_out, ys_e2e = [], []
    for ft in traces:
        r = ft.trace.records
        valid = (r.request_id >= ft.warm_up) & (r.first_chunk_us >= r.send_us) \
            & (r.last_chunk_us >= r.first_chunk_us)
        xs_out.append(r.output_tokens[valid].astype(np.float64))
        ys_e2e.append((r.last_chunk_us - r.send_us)[valid].astype(np.float64) - float(ft.rtt_us))
        flagged = ft.flags.flagged if ft.flags is not None else set()
        keep = valid & ~np.isin(r.request_id, np.fromiter(flagged, dtype=np.int64))
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
    if not sum(x.size for x in xs_in):  # every request flagged: E2E = TTFT + (n - 1) steps
        c_ttft, c_itl = _linear_fit(np.concatenate(xs_out) - 1.0, np.concatenate(ys_e2e))
        s_ttft = s_itl = 0.0
    step = max(c_itl, 0.0)
    if step <= 0:  # no multi-token outputs: read a step time off the TTFT intercept
        step = max(c_ttft, 2.0) / 2.0
    beta2 = s_itl if s_itl > 0 else 0.01 * step
    per_token = s_ttft if s_ttft > 0 else 0.01 * step / 100.0
    beta0 = step
    alpha0 = max(c_ttft - beta0, 0.05 * step)
    return BLACKBOX.clip([alpha0, 0.1 * per_token, 0.0, beta0, 0.9 * per_token, beta2])


def physics_start(base_options: dict[str, Any]) -> tuple[float, ...]:
    """trained-physics starting coefficients: the published ones (``defaults.yaml``, section
    ``TRAINED_PHYSICS_SECTION``), padded to 10 betas; the fit's first stage rescales them."""
    path = base_options.get("defaults_filepath") or str(data_path("defaults.yaml"))
    coeffs = load_defaults(path).coefficients.get(TRAINED_PHYSICS_SECTION)
    alpha = list(coeffs.alpha_coeffs or ()) if coeffs is not None else []
    beta = list(coeffs.beta_coeffs or ()) if coeffs is not None else []
    alpha = (alpha + [0.0] * 3)[:3]
    beta = (beta + [0.0] * 10)[:10]
    full = TRAINED_PHYSICS.clip(alpha + beta)
    return tuple(max(v, TRAINED_PHYSICS.bounds[k][0]) if k in TRAINED_PHYSICS.free else v
                 for k, v in enumerate(full))


def starting_point(model: FitModel, traces: list[FitTrace],
                   base_options: dict[str, Any]) -> tuple[float, ...]:
    """Where every search starts: the regression guess (blackbox) or the published values."""
    return initial_guess(traces) if model is BLACKBOX else physics_start(base_options)


@dataclass
class _Search:
    """One search's inputs (picklable: it runs on a sweep worker process)."""

    index: int
    model_name: str
    traces: list[FitTrace]
    base_options: dict[str, Any]
    weights: dict[str, float]
    start: tuple[float, ...]
    max_evaluations: int
    deadline: float  # wall-clock time.time() at which the whole fit's --time-limit runs out
    seed: int
    loss: str  # the per-metric error (a key of problem.LOSSES)


@dataclass
class _SearchResult:
    index: int
    losses: list[float]
    loss: float
    coefficients: tuple[float, ...]
    stopped: str


class _Objective:
    """The loss of a coefficient vector (mean over the traces of the weighted per-metric error),
    with the budget check and the bookkeeping of every evaluation."""

    def __init__(self, search: _Search, on_evaluation) -> None:
        self.search = search
        self.model = FIT_MODELS[search.model_name]
        self.losses: list[float] = []
        self.best: tuple[float, tuple[float, ...]] = (math.inf, search.start)
        self.on_evaluation = on_evaluation

    def __call__(self, coeffs: tuple[float, ...], stage_weights: dict[str, float]) -> float:
        s = self.search
        if len(self.losses) >= s.max_evaluations:
            raise _Stop("max-evaluations")
        # the first search always evaluates its start once, so a fit has a result
        if (self.losses or s.index > 0) and time.time() > s.deadline:
            raise _Stop("time-limit")
        total = stage_total = 0.0
        for ft in s.traces:
            sims = simulate(ft, s.base_options, self.model.latency_model, coeffs[:3], coeffs[3:])
            errors = metric_errors(pair_trace(ft, sims), s.loss)
            value = trace_loss(errors, s.weights)
            total += value if math.isfinite(value) else 1e9
            value = trace_loss(errors, stage_weights)
            stage_total += value if math.isfinite(value) else 1e9
        value = total / len(s.traces)
        self.losses.append(value)
        if value < self.best[0]:
            self.best = (value, coeffs)
        if self.on_evaluation is not None:
            self.on_evaluation(len(self.losses), value, self.best[0])
        return stage_total / len(s.traces)


def _run_search(search: _Search, on_evaluation=None) -> _SearchResult:
    """One search: an optional one-factor rescaling, then two Powell stages on the logarithms
    of the free coefficients (module docstring)."""
    from scipy.optimize import minimize, minimize_scalar

    model = FIT_MODELS[search.model_name]
    objective = _Objective(search, on_evaluation)
    free = list(model.free)
    lo = np.log([model.bounds[k][0] for k in free])
    hi = np.log([model.bounds[k][1] for k in free])
    start = list(search.start)

    def coeffs_of(theta: np.ndarray) -> tuple[float, ...]:
        full = list(start)
        for k, v in zip(free, np.exp(np.clip(theta, lo, hi)).tolist(), strict=True):
            full[k] = float(v)
        return tuple(full)

    weights = search.weights
    decode_weights = dict(weights, ttft=0.0)
    if decode_weights["e2e"] == 0 and decode_weights["itl"] == 0:
        decode_weights = weights
    rng = np.random.default_rng(search.seed)
    centre = np.log([start[k] for k in free])
    stopped = "converged"
    try:
        if model.prescale:  # every time in the model scales with the coefficients together
            res = minimize_scalar(lambda f: objective(coeffs_of(centre + f), decode_weights),
                                  bounds=(-9.0, 9.0), method="bounded",
                                  options={"xatol": 0.02, "maxiter": 40})
            centre = np.clip(centre + res.x, lo, hi)
        # Stage 1 fits the step costs on E2E/ITL alone (TTFT varies with where an arrival falls
        # in the step cycle, which buries the per-decode-token slope in local minima); stage 2
        # starts there with the user's weights and shorter steps. The result is the best
        # evaluation under the user's weights.
        for stage_weights, scale, share in ((decode_weights, 0.7, 2), (weights, 0.2, 1)):
            steps = scale * rng.choice([-1.0, 1.0], size=centre.size) \
                * rng.uniform(0.7, 1.3, size=centre.size)
            budget = max((search.max_evaluations - len(objective.losses)) // share, 1)
            res = minimize(lambda th, w=stage_weights: objective(coeffs_of(th), w), centre,
                           method="Powell", bounds=list(zip(lo, hi, strict=True)),
                           options={"direc": np.diag(steps), "xtol": 1e-3, "ftol": 1e-5,
                                    "maxfev": budget})
            centre = np.clip(res.x, lo, hi)
    except _Stop as why:
        stopped = str(why)
    if stopped == "converged" and len(objective.losses) >= search.max_evaluations - 1:
        stopped = "max-evaluations"  # a stage's share of the budget ran out
    return _SearchResult(search.index, objective.losses, objective.best[0], objective.best[1],
                         stopped)


MAX_STARTS = 10_000
"""Most ``--starts`` of one fit: each start is a search object made up front (and a task for the
workers), so the count is bounded like any other allocation a flag sizes."""


def evaluations_per_search(max_evaluations: int, starts: int) -> list[int]:
    """``max_evaluations`` split over ``starts`` searches: equal shares, the remainder to the
    first ones, so the total is exactly the budget (each search needs at least one)."""
    if not 1 <= starts <= min(max_evaluations, MAX_STARTS):
        raise ValueError(f"starts must be in [1, min(max_evaluations, {MAX_STARTS})], "
                         f"got {starts} for {max_evaluations} evaluations")
    share, extra = divmod(max_evaluations, starts)
    return [share + (k < extra) for k in range(starts)]


def _spread_start(model: FitModel, start: tuple[float, ...], seed: int, index: int
                  ) -> tuple[float, ...]:
    """Start ``index`` > 0 of a multi-start fit: the common start moved by a seeded random
    factor (log-normal, σ = 0.5) on each free coefficient."""
    if index == 0:
        return start
    rng = np.random.default_rng([seed, index])
    moved = list(start)
    for k in model.free:
        moved[k] = start[k] * float(np.exp(0.5 * rng.standard_normal()))
    return model.clip(moved)


def fit(traces: list[FitTrace], base_options: dict[str, Any], weights: dict[str, float], *,
        latency_model: str = "blackbox", max_evaluations: int = 2000,
        time_limit_s: float = 60.0, seed: int = 0, starts: int = 1, workers: int = 1,
        backend: str = "local", loss: str = DEFAULT_LOSS,
        on_evaluation: Callable[[int, float, float], None] | None = None) -> FitResult:
    """Minimize the mean over ``traces`` of the weighted per-metric error (``loss``: MAPE or
    the RMS log ratio, ``problem.LOSSES``) by replaying them.

    ``starts`` independent searches (the first from the starting point, the others from seeded
    moves of it) share ``max_evaluations``; with ``workers`` > 1 they run at once on the sweep's
    worker processes (``backend`` local or ray), and the result does not depend on how many
    workers ran them. The best evaluation of all wins (ties: the lower start). ``time_limit_s``
    bounds the whole fit's wall time: a search stops when it runs out and a later search then
    does not start (the first always evaluates its start, so there is a result). ``on_evaluation(count, loss, best)`` is called after every
    evaluation of an in-process search, or after each search run by workers (the progress bar).
    """
    started = time.monotonic()
    deadline = time.time() + time_limit_s
    model = FIT_MODELS[latency_model]
    start = starting_point(model, traces, base_options)
    searches = [_Search(k, latency_model, traces, base_options, weights,
                        _spread_start(model, start, seed, k), budget, deadline, seed + k, loss)
                for k, budget in enumerate(evaluations_per_search(max_evaluations, starts))]
    if workers > 1 and starts > 1:
        from blis_fast.sweep.execute import TaskRunner  # lazy: parallel starts only

        results = []
        with TaskRunner(backend, min(workers, starts)) as runner:
            for res in runner.map(_run_search, searches):  # progress: once per finished search
                results.append(res)
                if on_evaluation is not None:
                    on_evaluation(sum(len(r.losses) for r in results), res.loss,
                                  min(r.loss for r in results))
    else:
        results = []
        for search in searches:
            if results and time.time() > deadline:
                break
            results.append(_run_search(search, on_evaluation))
    results = sorted((r for r in results if r.losses), key=lambda r: r.index)
    best = min(results, key=lambda r: (r.loss, r.index))
    losses = [v for r in results for v in r.losses]
    stopped = best.stopped
    return FitResult(coefficients=best.coefficients, initial=start, loss=best.loss,
                     losses=losses, stopped=stopped, seconds=time.monotonic() - started,
                     latency_model=latency_model,
                     search_losses=[r.loss for r in results], loss_function=loss)
