"""The fit's objective: replay observed traces with candidate coefficients and score them.

Scoring reuses calibrate's loader, pairing rules and MAPE, so a trace's TTFT and E2E figures
here equal the ones ``blis calibrate`` reports for a replay with the same coefficients. The real
ITL differs from calibrate's in two ways, both because calibrate's chunk-gap rule (kept from
the reference) does not measure what the simulator's ITL is, the time per output token:

* **Per token, not per chunk.** Calibrate averages a request's chunk gaps, so the usage chunk
  vLLM sends µs after the last token counts as one more (near-zero) gap and the real ITL reads
  1/n low for n output tokens; a fit matching it under-predicted a real server's step time and
  mean E2E by 3-4 %. The fit divides the same gaps by the output tokens - 1 instead (the sim
  side's formula); with one chunk per token and no extra chunk the two rules agree.
* **Flagged requests left out of TTFT and ITL.** A request whose chunks reached the client in
  one burst, one sent unstreamed, or one read by a late client (``blis_fast.observe.quality``,
  the check ``blis observe`` and ``blis calibrate`` run too) has a TTFT and an ITL that measure
  the delivery path, not the server: one burst at 9 µs against ~1.7 ms made a real-server
  trace's ITL MAPE 500 % and pulled the fit to step times of a few µs, and a trace of 56
  bursts in 60 requests (a CPU-starved frontend) fitted a TTFT that was really E2E. The fit
  keeps their E2E, leaves them out of TTFT and ITL, says so, and refuses a trace with fewer
  than :data:`MIN_USABLE_REQUESTS` usable requests left for a weighted TTFT or ITL.

The per-metric error the fit minimizes is calibrate's request-level MAPE by default, or, with
``--loss rms-log``, the root mean square of ``ln(sim / real)``. MAPE charges an over-prediction
more than an under-prediction of the same ratio, so on a server whose speed wanders between
levels it settles on the fastest level: on the CPU vLLM server of the real-server test (segments
10-20 % apart) the MAPE fit under-predicted its own traces' mean E2E by 11 %, the log error by 5 %.
The log error is symmetric in the ratio; its minimum over a common scale is the geometric mean.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from blis_fast.calibrate.calibration import UNSET, resolve_rtt_us
from blis_fast.calibrate.inputs import (
    ITLData,
    ObservedTrace,
    SimResult,
    load_itl,
    load_observed_trace,
)
from blis_fast.calibrate.pairing import CalibrationPairs, pair_requests
from blis_fast.calibrate.quality import TraceFlags, trace_flags, without
from blis_fast.calibrate.report import build_report
from blis_fast.calibrate.stats import mape_and_bias
from blis_fast.errors import BlisInputError
from blis_fast.options import build_options
from blis_fast.runner import execute_replay

__all__ = ["DEFAULT_LOSS", "LOSSES", "METRICS", "FitTrace", "Loss", "check_fittable",
           "load_fit_trace", "metric_errors", "metric_mapes", "pair_trace", "simulate",
           "trace_loss"]

METRICS = ("ttft", "itl", "e2e")
MIN_USABLE_REQUESTS = 3
"""Fewest requests free of quality flags a trace needs for a weighted TTFT or ITL metric."""


@dataclass
class FitTrace:
    """One observed trace with its resolved warm-up and RTT (as calibrate resolves them)."""

    header_path: str
    data_path: str
    itl_path: str | None
    trace: ObservedTrace
    itl: ITLData | None
    warm_up: int
    rtt_us: int
    flags: TraceFlags | None = None  # requests left out of TTFT and ITL (module docstring)

    @property
    def left_out(self) -> dict[str, list[int]]:
        """The request ids left out of TTFT and ITL, by flag (``burst``, ``not_streamed``,
        ``client_late``)."""
        return dict(self.flags.ids) if self.flags is not None else {}


def load_fit_trace(header_path: str, data_path: str, itl_path: str | None = None, *,
                   warmup_requests: int = UNSET, network_rtt_us: int = UNSET) -> FitTrace:
    """Load a trace v2 header + CSV (and ITL file); -1 takes warm-up/RTT from the header."""
    trace = load_observed_trace(header_path, data_path)
    if trace.records.request_id.size == 0:
        raise BlisInputError(f"--trace-data {data_path}: no requests in the trace")
    itl = load_itl(itl_path) if itl_path else None
    warm_up = trace.warm_up_requests if warmup_requests == UNSET else warmup_requests
    return FitTrace(header_path, data_path, itl_path, trace, itl, warm_up,
                    resolve_rtt_us(network_rtt_us, trace),
                    trace_flags(trace.records, data_path, warm_up, itl))


def sim_results(requests: Any) -> list[SimResult]:
    """The SimResults ``blis replay --results-path`` would write for these request columns."""
    ids = np.asarray(requests.request_id).astype(str).tolist()
    ttft = np.asarray(requests.ttft_us, dtype=np.float64)
    e2e = np.asarray(requests.e2e_us, dtype=np.float64)
    pre = np.asarray(requests.num_prefill_tokens, dtype=np.int64).tolist()
    dec = np.asarray(requests.num_decode_tokens, dtype=np.int64).tolist()
    out: list[SimResult] = []
    for i in np.flatnonzero(~np.isnan(ttft) & ~np.isnan(e2e)).tolist():
        text = ids[i].removeprefix("request_")
        if not text.lstrip("-").isdigit():
            continue
        out.append(SimResult(int(text), float(ttft[i]), float(e2e[i]), pre[i], dec[i]))
    out.sort(key=lambda s: s.request_id)
    return out


def simulate(ft: FitTrace, base_options: dict[str, Any], latency_model: str,
             alpha: tuple[float, ...], beta: tuple[float, ...]) -> list[SimResult]:
    """Replay ``ft`` in-process with the given coefficients (diagnostics silenced)."""
    opts = dict(base_options, trace_header=ft.header_path, trace_data=ft.data_path,
                latency_model=latency_model, alpha_coeffs=tuple(alpha),
                beta_coeffs=tuple(beta), log="error")
    return sim_results(execute_replay(build_options(opts, keywords=True)).requests)


def pair_trace(ft: FitTrace, sims: list[SimResult]) -> CalibrationPairs:
    """Calibrate's pairs of the trace with a replay's SimResults (no bandwidth delay), the real
    ITL per output token, flagged requests out of TTFT and ITL (module docstring)."""
    pairs = pair_requests(ft.trace.records, sims, warm_up=ft.warm_up, rtt_us=ft.rtt_us,
                          bandwidth_mbps=0.0, itl=ft.itl, itl_per_token=True)
    drop = ft.flags.flagged if ft.flags is not None else set()
    if drop:
        pairs.ttft = without(pairs.ttft, drop)
        pairs.itl = without(pairs.itl, drop)
    return pairs


def metric_mapes(pairs: CalibrationPairs) -> dict[str, float]:
    """Request-level MAPE (a fraction) of each metric that has pairs."""
    out: dict[str, float] = {}
    for name in METRICS:
        vec = getattr(pairs, name)
        if vec.real:
            out[name] = mape_and_bias(vec.real, vec.sim)[0]
    return out


def metric_log_errors(pairs: CalibrationPairs) -> dict[str, float]:
    """Root mean square of ``ln(sim / real)`` of each metric that has pairs, over the pairs MAPE
    uses (``real != 0``); both sides floored at 1 µs (a one-token request's sim ITL is 0)."""
    out: dict[str, float] = {}
    for name in METRICS:
        vec = getattr(pairs, name)
        if vec.real:
            real = np.asarray(vec.real, dtype=np.float64)
            sim = np.asarray(vec.sim, dtype=np.float64)
            used = real != 0
            if used.any():
                ratio = np.maximum(sim[used], 1.0) / np.maximum(real[used], 1.0)
                out[name] = float(np.sqrt(np.mean(np.log(ratio) ** 2)))
            else:
                out[name] = 0.0
    return out


@dataclass(frozen=True)
class Loss:
    """A per-metric error ``blis fit --loss`` can minimize, and its name on the plot's axis."""

    per_metric: Callable[[CalibrationPairs], dict[str, float]]
    label: str


LOSSES = {"mape": Loss(metric_mapes, "MAPE"), "rms-log": Loss(metric_log_errors, "RMS log ratio")}
"""The losses by ``--loss`` name (module docstring)."""
DEFAULT_LOSS = "mape"


def metric_errors(pairs: CalibrationPairs, loss: str) -> dict[str, float]:
    """The per-metric error named by ``loss`` (a key of :data:`LOSSES`)."""
    return LOSSES[loss].per_metric(pairs)


def trace_loss(errors: dict[str, float], weights: dict[str, float]) -> float:
    """Weighted mean of the per-metric errors present (a metric without pairs drops out of the
    weights)."""
    used = [(weights[m], errors[m]) for m in METRICS if m in errors and weights[m] > 0]
    if not used:
        return float("nan")
    top = max(w for w, _ in used)  # weights relative to the largest: 1e308 cannot overflow
    total = sum(w / top for w, _ in used)
    return sum(w / top * v for w, v in used) / total


def check_fittable(ft: FitTrace, sims: list[SimResult], weights: dict[str, float], loss: str,
                   flag: str = "--trace-data") -> None:
    """Refuse (one ``BlisInputError`` line naming ``flag`` and the file) a trace that no
    coefficients can fit: no request past the warm-up with a non-negative TTFT and E2E, or a
    replay (``sims``, at the starting coefficients) that completes none of them or leaves no
    pair in a weighted metric, as when the KV cache is too small to run a request. Without this
    the search would run on a constant penalty and print coefficients at their bounds."""
    r = ft.trace.records
    rows = int(r.request_id.size)
    past = r.request_id >= ft.warm_up
    usable = past & (r.first_chunk_us >= r.send_us) & (r.last_chunk_us >= r.send_us)
    where = f"{flag} {ft.data_path}"
    if not usable.any():
        raise BlisInputError(
            f"{where}: no usable request to fit: of {rows} rows, {rows - int(past.sum())} are "
            f"warm-up (request_id < {ft.warm_up}) and {int(past.sum())} have a negative TTFT or "
            "E2E")
    pairs = pair_trace(ft, sims)
    if flag == "--trace-data":
        _check_usable(ft, pairs, weights, where)
    value = trace_loss(metric_errors(pairs, loss), weights)
    if pairs.matched == 0 or not np.isfinite(value):
        done = int(np.isin(r.request_id[usable], [s.request_id for s in sims]).sum())
        raise BlisInputError(
            f"{where}: the replay completes {done} of its {int(usable.sum())} usable requests "
            "and leaves no pair in a weighted metric: nothing to fit (a KV cache too small for "
            "its requests? --total-kv-blocks, --max-num-scheduled-tokens)")


def _check_usable(ft: FitTrace, pairs: CalibrationPairs, weights: dict[str, float],
                  where: str) -> None:
    """Refuse a trace whose flagged requests leave fewer than :data:`MIN_USABLE_REQUESTS` for a
    weighted TTFT or ITL (one line: the counts by flag, and how to fit without the metric)."""
    if ft.flags is None or not ft.flags.flagged:
        return
    counts = ", ".join(f"{len(ids)} {kind.replace('_', ' ')}" for kind, ids in ft.flags.ids.items()
                       if ids)
    for metric in ("ttft", "itl"):
        if weights[metric] <= 0 or (metric == "itl" and ft.itl is None):
            continue
        usable = len(set(getattr(pairs, metric).request_id))
        if usable < MIN_USABLE_REQUESTS:
            raise BlisInputError(
                f"{where}: only {usable} request(s) usable for {metric.upper()} once the flagged "
                f"ones are left out ({counts}; their {metric.upper()} measures the delivery "
                f"path, not the server), fewer than {MIN_USABLE_REQUESTS}: record a streamed "
                f"trace the client reads directly, or give --weight-{metric} 0 to fit without it")


def trace_report(ft: FitTrace, sims: list[SimResult]) -> dict:
    """The calibrate report of one trace (trace info and per-metric figures)."""
    return build_report(pair_trace(ft, sims))
