"""Load, pair and report: the steps of ``blis calibrate`` in the reference's order (CAL-1.2)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from blis_fast.calibrate.hit_rate import (
    DEFAULT_HIT_RATE_TOLERANCE_PP,
    DEFAULT_TTFT_MAPE_THRESHOLD,
    check_tolerances,
)
from blis_fast.calibrate.inputs import (
    ObservedTrace,
    load_itl,
    load_observed_trace,
    load_sim_results,
)
from blis_fast.calibrate.pairing import CalibrationPairs, pair_requests
from blis_fast.calibrate.report import build_report
from blis_fast.errors import BlisConfigError, BlisInputError
from blis_fast.workload.trace_v2 import ObservedKVMetrics

__all__ = ["Calibration", "calibrate", "check_bandwidth", "resolve_rtt_us"]

UNSET = -1  # --warmup-requests / --network-rtt-us: take the value from the trace header
MIN_BANDWIDTH_MBPS = 1e-6
"""Smallest non-zero ``--network-bandwidth-mbps`` (1 bit/s): below it a request's transfer delay
is no longer a finite number of µs."""


def check_bandwidth(mbps: float) -> None:
    """``--network-bandwidth-mbps``: 0 (no transfer delay) or a finite number >= 1 bit/s. The
    reference treats a negative bandwidth as none; here it is refused, being a typo."""
    if not (mbps == 0 or (math.isfinite(mbps) and mbps >= MIN_BANDWIDTH_MBPS)):
        raise BlisConfigError(f"--network-bandwidth-mbps must be 0 (none) or a finite number "
                              f">= {MIN_BANDWIDTH_MBPS:g}, got {mbps}")


@dataclass
class Calibration:
    """A calibration's pairs, its report (an ordered dict) and the resolved parameters."""

    pairs: CalibrationPairs
    report: dict
    warm_up: int
    rtt_us: int
    observed_kv: ObservedKVMetrics | None = None  # the header's observed_kv_metrics


def resolve_rtt_us(flag_rtt_us: int, trace: ObservedTrace) -> int:
    """``--network-rtt-us``: the flag if given (>= 0), else the header's measured RTT in whole µs."""
    if flag_rtt_us != UNSET:
        if flag_rtt_us < 0:
            raise BlisConfigError(f"--network-rtt-us must be >= 0 (or left out to use the trace "
                                  f"header), got {flag_rtt_us}")
        return flag_rtt_us
    rtt_ms = trace.measured_rtt_ms
    if not math.isfinite(rtt_ms):
        raise BlisInputError(f"trace header: network.measured_rtt_ms must be finite, got {rtt_ms}")
    return math.trunc(rtt_ms * 1000) if rtt_ms > 0 else 0


def calibrate(trace_header: str, trace_data: str, sim_results: str, *,
              warmup_requests: int = UNSET, network_rtt_us: int = UNSET,
              network_bandwidth_mbps: float = 0.0, itl_data: str | None = None,
              hit_rate_tolerance_pp: float = DEFAULT_HIT_RATE_TOLERANCE_PP,
              ttft_mape_threshold: float = DEFAULT_TTFT_MAPE_THRESHOLD) -> Calibration:
    """Load the inputs, pair them and build the report, checking in the reference's order.

    ``warmup_requests`` / ``network_rtt_us`` of -1 take the header's ``warm_up_requests`` /
    ``network.measured_rtt_ms``; any other warm-up (even negative) is used as given. The
    verdict bounds (``--hit-rate-tolerance-pp``, ``--ttft-mape-threshold``) are checked here,
    after the bandwidth, as the reference checks them; ``calibrate.hit_rate`` applies them.
    Raises ``BlisError`` naming the flag or file for every input the reference refuses.
    """
    trace = load_observed_trace(trace_header, trace_data)
    sims = load_sim_results(sim_results)
    if not sims:
        raise BlisInputError(f"--sim-results {sim_results}: no sim results in the file, "
                             f"nothing to calibrate")
    warm_up = trace.warm_up_requests if warmup_requests == UNSET else warmup_requests
    rtt_us = resolve_rtt_us(network_rtt_us, trace)
    check_bandwidth(network_bandwidth_mbps)
    check_tolerances(hit_rate_tolerance_pp, ttft_mape_threshold)
    itl = load_itl(itl_data) if itl_data else None
    pairs = pair_requests(trace.records, sims, warm_up=warm_up, rtt_us=rtt_us,
                          bandwidth_mbps=network_bandwidth_mbps, itl=itl)
    if pairs.matched == 0:
        raise BlisInputError(f"no request id of --trace-data {trace_data} has a SimResult in "
                             f"--sim-results {sim_results} (after {pairs.warm_up_excluded} "
                             f"warm-up rows); both must number requests the same way")
    if not pairs.ttft.real:
        raise BlisInputError(f"--trace-data {trace_data}: every matched row has a negative "
                             f"TTFT or E2E (corrupt timestamps?), no latency pairs left")
    return Calibration(pairs, build_report(pairs), warm_up, rtt_us,
                       trace.header.get("observed_kv_metrics"))
