"""``blis calibrate`` and the observation-quality flags (issue 30, ``blis_fast.observe.quality``).

A request delivered in one burst, sent unstreamed, or read by a late client has a TTFT and an
ITL that do not measure the server. Calibrate grades what the reference grades (every pair) and
says on stderr how many pairs carry a flag and what TTFT and ITL read without them; with
``--exclude-flagged`` it grades TTFT and ITL without them instead, and the report then says so
in a blis_fast-only ``observation_quality`` key with the figures of every pair beside it. E2E is
always graded on every pair: the last chunk still marks the end of the answer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from blis_fast.calibrate.inputs import ITLData
from blis_fast.calibrate.pairing import CalibrationPairs, LatencyPairs
from blis_fast.calibrate.stats import compare_metric
from blis_fast.errors import BlisInputError
from blis_fast.observe.quality import Quality, assess, chunk_bursts, trace_client_lag_us
from blis_fast.workload.replay import TraceRecords

__all__ = ["TraceFlags", "regrade", "trace_flags", "without"]

FLAG_KINDS = ("burst", "not_streamed", "client_late")


@dataclass(frozen=True)
class TraceFlags:
    """The quality of a trace's rows past the warm-up, and the flagged request ids by kind."""

    quality: Quality
    ids: dict[str, list[int]]

    @property
    def flagged(self) -> set[int]:
        """Every flagged request id."""
        return {i for ids in self.ids.values() for i in ids}


def trace_flags(records: TraceRecords, trace_data: str, warm_up: int,
                itl: ITLData | None = None) -> TraceFlags:
    """Flag the trace's rows from ``warm_up`` on (the lag column is read when present); with
    the trace's ITL rows, a request whose recorded chunks came in a burst is one too."""
    rid = np.asarray(records.request_id, dtype=np.int64)
    ok = np.array([s == "ok" for s in records.status], dtype=bool) & (rid >= warm_up)
    lag = trace_client_lag_us(trace_data, rid.size)
    q = assess(np.asarray(records.streaming, dtype=bool), ok, records.send_us,
               records.first_chunk_us, records.last_chunk_us, records.num_chunks, lag)
    if itl is not None and itl.request_id.size:
        extra = np.isin(rid, chunk_bursts(itl.request_id, itl.chunk_index, itl.timestamp_us,
                                          warm_up)) & q.judged
        q = Quality(q.judged, q.burst | extra, q.not_streamed & ~extra, q.client_late,
                    q.client_lag_us)
    ids = {kind: sorted(int(i) for i in rid[getattr(q, kind)]) for kind in FLAG_KINDS}
    return TraceFlags(q, ids)


def without(pairs: LatencyPairs, drop: set[int]) -> LatencyPairs:
    """``pairs`` less the pairs of the request ids in ``drop`` (order kept)."""
    out = LatencyPairs()
    for rid, real, sim in zip(pairs.request_id, pairs.real, pairs.sim, strict=True):
        if rid not in drop:
            out.add(rid, real, sim)
    return out


def _mean(values: list[float]) -> float:
    return float(np.mean(values)) if values else 0.0


def _figure(name: str, pairs: LatencyPairs) -> str:
    if not pairs.real:
        return f"{name}: no pairs left"
    real, sim = _mean(pairs.real), _mean(pairs.sim)
    err = (sim - real) / real * 100 if real else 0.0
    return (f"{name} real mean={real:.0f}µs, sim mean={sim:.0f}µs ({err:+.1f}%, "
            f"{len(pairs.real)} pairs)")


def quality_lines(flags: TraceFlags, pairs: CalibrationPairs, excluded: bool) -> list[str]:
    """The stderr lines: each flag's count, which figures were graded, and the other ones."""
    drop = flags.flagged
    if not drop:
        return []
    lines = [f"calibrate: {line}" for line in flags.quality.summary_lines()]
    clean = {"TTFT": without(pairs.ttft, drop), "ITL": without(pairs.itl, drop)}
    whole = {"TTFT": pairs.ttft, "ITL": pairs.itl}
    shown = [k for k in ("TTFT", "ITL") if whole[k].real]
    if excluded:
        lines.append(f"calibrate: graded TTFT and ITL without the {len(drop)} flagged "
                     f"request(s); with them: "
                     + "; ".join(_figure(k, whole[k]) for k in shown))
    else:
        lines.append("calibrate: graded TTFT and ITL on every pair, flagged ones included (the "
                     "reference's figures; --exclude-flagged grades without them); without "
                     "them: " + "; ".join(_figure(k, clean[k]) for k in shown))
    return lines


def regrade(report: dict, pairs: CalibrationPairs, flags: TraceFlags, trace_data: str) -> dict:
    """The report with TTFT and ITL graded without the flagged requests, and a blis_fast-only
    ``observation_quality`` key saying so (flagged ids by kind, every pair's workload figures).
    Refuses (exit 2) when fewer than 2 TTFT pairs are left."""
    drop = flags.flagged
    metrics = dict(report["metrics"])
    with_flagged = {}
    for name, vec in (("itl", pairs.itl), ("ttft", pairs.ttft)):
        if not vec.real:
            continue
        kept = without(vec, drop)
        if name == "ttft" and len(kept.real) < 2:
            raise BlisInputError(
                f"--exclude-flagged: --trace-data {trace_data}: only {len(kept.real)} of "
                f"{len(vec.real)} TTFT pairs are free of quality flags, too few to grade")
        with_flagged[name] = report["metrics"][name]["workload_level"]
        if len(kept.real) >= 2:
            metrics[name] = compare_metric(kept.real, kept.sim)
        else:
            metrics.pop(name, None)
    out = dict(report)
    out["metrics"] = dict(sorted(metrics.items()))
    out["observation_quality"] = {
        "graded": "ttft and itl without the flagged requests; e2e on every pair",
        "flagged_request_ids": flags.ids,
        "with_flagged_workload_level": with_flagged,
    }
    return out
