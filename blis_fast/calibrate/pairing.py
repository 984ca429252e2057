"""Pairing observed trace rows with SimResults by request id (CAL-3, CAL-3.1).

Rows are visited in file order. A row below the warm-up count is excluded; a row without a
SimResult is unmatched; otherwise it is matched, and paired unless its real TTFT or E2E is
negative (the reference then also counts it as unmatched, so its ``num_requests`` counts such a
row twice). The sim side is shifted to the client's view: RTT plus, with a bandwidth, the
upload (and for E2E download) time of 4 bytes per token, using the SimResult's token counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from blis_fast.calibrate.inputs import ITLData, SimResult
from blis_fast.workload.replay import TraceRecords

__all__ = ["CalibrationPairs", "LatencyPairs", "pair_requests", "transfer_delay_us"]


@dataclass
class LatencyPairs:
    """Matched real and sim values of one metric (µs), with the request id of each pair."""

    real: list[float] = field(default_factory=list)
    sim: list[float] = field(default_factory=list)
    request_id: list[int] = field(default_factory=list)

    def add(self, request_id: int, real: float, sim: float) -> None:
        """Append one pair."""
        self.real.append(real)
        self.sim.append(sim)
        self.request_id.append(request_id)


@dataclass
class CalibrationPairs:
    """The paired vectors and the row accounting of one calibration.

    Every trace row is counted exactly once in ``warm_up_excluded``, ``matched`` or
    ``unmatched_no_sim``; ``negative_latency`` rows are a subset of ``matched`` that have no
    TTFT/E2E pair. ``unmatched_real`` is the reference's count (both kinds of unmatched).
    """

    ttft: LatencyPairs = field(default_factory=LatencyPairs)
    e2e: LatencyPairs = field(default_factory=LatencyPairs)
    itl: LatencyPairs = field(default_factory=LatencyPairs)
    warm_up_excluded: int = 0
    matched: int = 0
    unmatched_no_sim: int = 0
    negative_latency: int = 0
    unmatched_sim: int = 0
    token_mismatches: int = 0
    itl_dropped: int = 0
    warnings: list[str] = field(default_factory=list)

    @property
    def unmatched_real(self) -> int:
        """Rows without a SimResult plus matched rows with a negative real latency."""
        return self.unmatched_no_sim + self.negative_latency

    @property
    def num_requests(self) -> int:
        """The report's ``num_requests``: matched + warm-up + unmatched real (CAL-5)."""
        return self.matched + self.warm_up_excluded + self.unmatched_real


def transfer_delay_us(bandwidth_mbps: float, tokens: int) -> float:
    """Time in µs to send ``tokens`` tokens of 4 bytes at ``bandwidth_mbps`` (0 if no bandwidth)."""
    if bandwidth_mbps <= 0:
        return 0.0
    bits = float(tokens * 4) * 8
    return bits / (bandwidth_mbps * 1e6) * 1e6


def _index_sim(sim_results: list[SimResult]) -> dict[int, SimResult]:
    """SimResults by id; for a duplicated id the last entry wins."""
    return {sr.request_id: sr for sr in sim_results}


def pair_requests(records: TraceRecords, sim_results: list[SimResult], *, warm_up: int,
                  rtt_us: int, bandwidth_mbps: float, itl: ITLData | None = None,
                  itl_per_token: bool = False) -> CalibrationPairs:
    """Pair the trace rows with the SimResults (and, given ITL rows, the per-request ITL).

    ``itl_per_token`` (``blis fit``, not calibrate): the real ITL divides a request's chunk gaps
    by its output tokens - 1 rather than by the number of gaps, as the sim side does; the usage
    chunk vLLM sends after the last token otherwise makes it read 1/n low."""
    sim_by_id = _index_sim(sim_results)
    pairs = CalibrationPairs()
    matched_ids: set[int] = set()
    ids = records.request_id.tolist()
    inputs = records.input_tokens.tolist()
    outputs = records.output_tokens.tolist()
    send = records.send_us.tolist()
    first = records.first_chunk_us.tolist()
    last = records.last_chunk_us.tolist()
    rtt = float(rtt_us)
    for rid, n_in, n_out, t_send, t_first, t_last in zip(ids, inputs, outputs, send, first, last,
                                                         strict=True):
        if rid < warm_up:
            pairs.warm_up_excluded += 1
            continue
        sr = sim_by_id.get(rid)
        if sr is None:
            pairs.unmatched_no_sim += 1
            continue
        matched_ids.add(rid)
        pairs.matched += 1
        # The adopted reference compares the trace's input_tokens (suffix only for a prefix
        # group) with the SimResult's full input: every prefix-group row is a mismatch.
        if n_in != sr.input_tokens or n_out != sr.output_tokens:
            pairs.token_mismatches += 1
        real_ttft = float(t_first - t_send)
        real_e2e = float(t_last - t_send)
        if real_ttft < 0 or real_e2e < 0:
            pairs.negative_latency += 1
            continue
        up = transfer_delay_us(bandwidth_mbps, sr.input_tokens)
        down = transfer_delay_us(bandwidth_mbps, sr.output_tokens)
        pairs.ttft.add(rid, real_ttft, sr.ttft_us + rtt + up)
        pairs.e2e.add(rid, real_e2e, sr.e2e_us + rtt + up + down)
    pairs.unmatched_sim = sum(1 for sr in sim_results if sr.request_id not in matched_ids)
    if itl is not None and itl.request_id.size > 0:
        tokens = dict(zip(ids, outputs, strict=True)) if itl_per_token else None
        _pair_itl(pairs, ids, sim_by_id, itl, warm_up, tokens)
    return pairs


def _pair_itl(pairs: CalibrationPairs, ids: list[int], sim_by_id: dict[int, SimResult],
              itl: ITLData, warm_up: int, output_tokens: dict[int, int] | None = None) -> None:
    """Real ITL = mean of the non-negative consecutive chunk deltas (chunks sorted by index,
    stable), or their sum over the trace's output tokens - 1 when ``output_tokens`` is given
    (per token; rows with fewer than 2 output tokens keep the mean); sim ITL = (e2e - ttft) /
    (output_tokens - 1), 0 for a single output token."""
    chunks: dict[int, list[tuple[int, int]]] = {}
    for rid, idx, ts in zip(itl.request_id.tolist(), itl.chunk_index.tolist(),
                            itl.timestamp_us.tolist(), strict=True):
        chunks.setdefault(rid, []).append((idx, ts))
    for rid in ids:
        if rid < warm_up:
            continue
        sr = sim_by_id.get(rid)
        rows = chunks.get(rid)
        if sr is None or rows is None or len(rows) < 2:
            continue
        stamps = [ts for _, ts in sorted(rows, key=lambda row: row[0])]
        total = 0.0
        count = 0
        for a, b in zip(stamps[:-1], stamps[1:], strict=True):
            delta = float(b - a)
            if delta < 0:
                continue
            total += delta
            count += 1
        if count == 0:
            pairs.itl_dropped += 1
            pairs.warnings.append(f"calibrate: request {rid} ITL dropped (all {len(stamps) - 1} "
                                  f"deltas negative, likely clock skew)")
            continue
        sim_itl = (sr.e2e_us - sr.ttft_us) / float(sr.output_tokens - 1) \
            if sr.output_tokens > 1 else 0.0
        n_out = output_tokens.get(rid, 0) if output_tokens is not None else 0
        pairs.itl.add(rid, total / (n_out - 1 if n_out > 1 else count), sim_itl)


def paired_arrays(pairs: LatencyPairs) -> tuple[np.ndarray, np.ndarray]:
    """(real, sim) of one metric as float arrays."""
    return np.asarray(pairs.real, dtype=np.float64), np.asarray(pairs.sim, dtype=np.float64)
