"""What a P/D run reports (the reference at ``f90a1e3a``: ``cluster.go: Run``,
``projectPDMetrics``, ``pd_metrics.go: CollectPDMetrics``, ``cmd/root.go: printPDMetrics``).

* per-instance blocks are the sub-requests' own (not projected, PD-6.2);
* the cluster block sums the instances, then corrects the counters (completed minus prefill
  completions, drops at the decode side added to dropped, transfers in flight added to
  running) and takes TTFT/E2E/scheduling delay from the parents' projection
  (:func:`project`), ITL from every instance's samples;
* ``=== PD Metrics ===`` (:func:`pd_section`) and its figures as ``summary.parquet`` columns
  (:func:`pd_summary_columns`), both from :func:`pd_figures`.

Reference behaviour kept as it is (README, "known reference behaviour"): dropped and timed-out
parents are projected as if completed; "Dropped at Decode KV" prints 0; the cluster
scheduling delay of a disaggregated request is its prefill's only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from blis_fast.config.pd import ROLE_DECODE, ROLE_PREFILL
from blis_fast.engine.results import SimulationResult
from blis_fast.output.adapters import projected_adapter_figures
from blis_fast.output.requests import (
    client_meta,
    mean_itl,
    request_engine_records,
    request_identity,
)
from blis_fast.output.stats import Distribution, distribution, go_fixed
from blis_fast.output.summary import InstanceMetrics, RequestColumns, aggregate_instances


@dataclass
class Projection:
    """The workload's requests as the cluster reports them: local requests with their own
    values, disaggregated parents with projected ones (NaN / -1 = none)."""

    rows: np.ndarray  # workload rows with a per-request record (local registered + parents)
    ttft_us: np.ndarray  # float64
    e2e_us: np.ndarray  # float64
    sched_us: np.ndarray  # int64, -1 = none
    itl_us: np.ndarray  # float64
    handled_by: np.ndarray  # int32
    capped: np.ndarray  # bool
    parent_ttft_us: np.ndarray  # float64 projected TTFT of every projected parent (NaN = none)


def project(res: SimulationResult) -> Projection:
    """projectPDMetrics (PD-6.3): per disaggregated parent with a completion time (decode
    done, decode timeout, or dropped at transfer start), E2E, TTFT, scheduling delay and ITL
    from its sub-requests; local requests keep their own values."""
    pd = res.pd
    table = res.table
    n = table.n
    par = pd.parents
    otp = res.config.latency.output_token_time
    flag = par.disaggregated
    local = np.flatnonzero(~flag & (res.registered[:n] == 1))
    parents = np.flatnonzero(flag & (par.done_us > 0))
    r, p = parents, parents + n
    arrival = table.arrival_us[r]
    d_exists = res.sched_delay_us[r] >= 0
    d = res.sched_delay_us[r]
    e_exists = res.completed[r]
    e = res.e2e_us[r]
    pre = pd.first_token_us[r] != 0
    e2e_sub = np.where(pre, e, e + d).astype(np.float64)
    e2e_sub = np.where(e2e_sub < 0, np.nan, e2e_sub)
    e2e_done = (par.done_us[r] - arrival).astype(np.float64)
    e2e_done = np.where(e2e_done < 0, np.nan, e2e_done)
    e2e = np.where(d_exists & e_exists, e2e_sub, e2e_done)
    pf_ttft = res.ttft_us[p]
    has_pf = pf_ttft >= 0
    itl0 = pd.first_itl_step_us[r] + otp
    with_decode = has_pf & d_exists & par.attached[r] & (pd.first_itl_step_us[r] >= 0)
    decode_ttft = d + itl0
    ttft = np.where(with_decode & (decode_ttft >= 0), decode_ttft, pf_ttft).astype(np.float64)
    ttft = np.where(has_pf, ttft, np.nan)
    sched = res.sched_delay_us[p]
    out_len = table.output_len[r]
    itl = mean_itl(res, r, out_len)
    local_ttft = res.ttft_us[local]
    local_e2e = res.e2e_us[local]
    return Projection(
        rows=np.concatenate([local, r]),
        ttft_us=np.concatenate([np.where(local_ttft >= 0, local_ttft.astype(np.float64),
                                         np.nan), ttft]),
        e2e_us=np.concatenate([np.where(local_e2e >= 0, local_e2e.astype(np.float64), np.nan),
                               e2e]),
        sched_us=np.concatenate([res.sched_delay_us[local], sched]).astype(np.int64),
        itl_us=np.concatenate([mean_itl(res, local, table.output_len[local]), itl]),
        handled_by=np.concatenate([res.instance[local], par.decode_instance[r]]).astype(np.int32),
        capped=np.concatenate([res.length_capped[local] == 1, res.length_capped[r] == 1]),
        parent_ttft_us=ttft,
    )


def request_columns_pd(res: SimulationResult, proj: Projection) -> RequestColumns:
    """The results file's records: one per local request and per projected parent."""
    table = res.table
    rows = proj.rows

    def meta(key: str) -> np.ndarray:
        return client_meta(table, rows, key)

    return RequestColumns(
        pd=_pd_columns(res, rows),
        request_id=np.array(table.id_strings(), dtype=object)[rows],
        arrival_us=table.arrival_us[rows],
        num_prefill_tokens=table.input_len[rows],
        num_decode_tokens=table.output_len[rows],
        ttft_us=proj.ttft_us, itl_us=proj.itl_us, e2e_us=proj.e2e_us,
        scheduling_delay_us=proj.sched_us, handled_by=proj.handled_by,
        slo_class=meta("slo_class"), tenant_id=meta("tenant_id"), model=meta("model"),
        length_capped=proj.capped, **request_identity(table, rows),
        **request_engine_records(res, rows),
    )


def _pd_columns(res: SimulationResult, rows: np.ndarray) -> dict[str, np.ndarray]:
    """requests.parquet's P/D columns for the results-file ``rows`` (times in µs, -1 / NaN /
    None = null)."""
    par = res.pd.parents_at(rows)
    n = res.table.n
    split = par.disaggregated
    decode_done = split & res.completed[rows]
    dropped = split & ~par.attached & (par.transfer_start_us > 0)
    outcome = np.where(~split, "local", np.where(decode_done, "completed", np.where(
        dropped, "dropped_at_decode", "decode_timed_out"))).astype(object)

    def inst(a: np.ndarray) -> np.ndarray:
        return np.array([f"instance_{i}" if i >= 0 else None for i in a.tolist()], dtype=object)

    prefill_ttft = np.where(split, res.ttft_us[np.where(split, rows + n, rows)], -1)
    dsched = np.where(split, res.sched_delay_us[rows], -1)
    moved = par.transfer_done_us > 0
    return {
        "disaggregated": split.astype(object),
        "pd_outcome": outcome,
        "prefill_instance": inst(np.where(split, par.prefill_instance, -1)),
        "decode_instance": inst(np.where(split, par.decode_instance, -1)),
        "prefill_ttft_ms": np.where(prefill_ttft >= 0, prefill_ttft, np.nan).astype(np.float64),
        "decode_scheduling_delay_ms": np.where(dsched >= 0, dsched, np.nan).astype(np.float64),
        "transfer_start_us": np.where(split & (par.transfer_start_us > 0),
                                      par.transfer_start_us, -1),
        "transfer_end_us": np.where(moved, par.transfer_done_us, -1),
        "kv_blocks_transferred": np.where(split, par.blocks, -1),
        "transfer_concurrency": np.where(split & moved & res.config.pd.contention,
                                         par.transfer_active, -1),
    }


def cluster_aggregate_pd(res: SimulationResult, instances: list[InstanceMetrics],
                         proj: Projection) -> InstanceMetrics:
    """The cluster block of a P/D run: instance sums with the reference's corrections, the
    projected per-request values (PD-6.1, PD-6.3)."""
    agg = aggregate_instances(instances)
    cnt = res.pd.counts
    par = res.pd.parents
    n = res.table.n
    agg.completed -= cnt.prefill_completed
    agg.dropped_unservable += cnt.dropped_at_decode_kv
    pending_decode = int(np.count_nonzero(par.disaggregated & res.pd.became_decode_sub[:n]
                                          & res.queued_or_running[:n]
                                          & (par.decode_enqueue_us > 0)))
    in_transfer = (cnt.prefill_completed - cnt.decode_completed - cnt.decode_timed_out
                   - cnt.dropped_at_decode_kv - pending_decode)
    if in_transfer > 0:
        agg.still_running += in_transfer
    agg.ttft_us = proj.ttft_us[~np.isnan(proj.ttft_us)]
    agg.e2e_us = proj.e2e_us[~np.isnan(proj.e2e_us)]
    agg.scheduling_delay_us = proj.sched_us[proj.sched_us >= 0]
    agg.adapters = projected_adapter_figures(res, proj.rows, proj.ttft_us, proj.e2e_us,
                                             agg.adapters)
    return agg


def _dist_line(label: str, dist: Distribution) -> str:
    return (f"{label}: mean={go_fixed(dist.mean, 1)} p50={go_fixed(dist.p50, 1)} "
            f"p95={go_fixed(dist.p95, 1)} p99={go_fixed(dist.p99, 1)}\n")


@dataclass(frozen=True)
class PDFigures:
    """The ``=== PD Metrics ===`` figures of a P/D run (PD-6.10), computed once for stdout
    and ``summary.parquet``; distributions in µs, None when empty (their line is omitted)."""

    any_disaggregated: bool  # some request was split: the block is printed
    disaggregated: int  # parents whose transfer completed
    decode_completed: int
    decode_timed_out: int
    dropped_at_decode_kv: int  # the real count (the block prints 0, reference behaviour)
    prefill_throughput: float  # sub-request completions per second, prefill-role instances
    decode_throughput: float
    imbalance: float  # max/min of the two; 1.0 when both are 0, inf when one is
    parent_ttft: Distribution | None
    transfer: Distribution | None
    contention: bool
    peak_transfers: int
    mean_queue_depth: float


def pd_figures(res: SimulationResult, instances: list[InstanceMetrics],
               proj: Projection | None = None) -> PDFigures:
    """The P/D block's figures (``proj``: the run's :func:`project`, computed when None)."""
    pd = res.pd
    par = pd.parents
    cnt = pd.counts
    flag = par.disaggregated
    cfg = res.config
    roles = cfg.pd.roles(cfg.options.num_instances)
    ended = run_ended_us(instances)
    seconds = float(ended) / 1e6

    def throughput(bit: int) -> float:
        if ended <= 0:
            return 0.0
        done = sum(int(m.completed) for i, m in enumerate(instances) if roles[i] & bit)
        return float(done) / seconds

    pre, dec = throughput(ROLE_PREFILL), throughput(ROLE_DECODE)
    if pre == 0 and dec == 0:
        ratio = 1.0
    elif pre == 0 or dec == 0:
        ratio = math.inf
    else:
        ratio = max(pre, dec) / min(pre, dec)
    proj_ttft = (proj or project(res)).parent_ttft_us
    ttft = proj_ttft[proj_ttft > 0]
    start, done = par.transfer_start_us, par.transfer_done_us
    ok = flag & (start > 0) & (done >= start)
    starts = cnt.transfer_starts
    return PDFigures(
        any_disaggregated=bool(flag.any()),
        disaggregated=int(np.count_nonzero(flag & (done > 0))),
        decode_completed=cnt.decode_completed,
        decode_timed_out=cnt.decode_timed_out,
        dropped_at_decode_kv=cnt.dropped_at_decode_kv,
        prefill_throughput=pre, decode_throughput=dec, imbalance=ratio,
        parent_ttft=distribution(ttft) if ttft.size else None,
        transfer=distribution((done - start)[ok]) if ok.any() else None,
        contention=bool(cfg.pd.contention),
        peak_transfers=cnt.peak_transfers,
        mean_queue_depth=float(cnt.queue_depth_sum) / starts if starts else 0.0,
    )


def run_ended_us(instances: list[InstanceMetrics]) -> int:
    """The run's SimEndedTime: the latest instance's (the P/D throughputs' denominator)."""
    return max((m.sim_ended_time_us for m in instances), default=0)


def pd_section(res: SimulationResult, instances: list[InstanceMetrics],
               figures: PDFigures | None = None) -> str:
    """``=== PD Metrics ===`` (PD-6.9), or "" when no request was disaggregated."""
    f = figures or pd_figures(res, instances)
    if not f.any_disaggregated:
        return ""
    ratio = ("inf (one pool idle)" if math.isinf(f.imbalance) else go_fixed(f.imbalance, 4))
    lines = ["=== PD Metrics ===\n",
             f"Disaggregated Requests: {f.disaggregated}\n",
             "Dropped at Decode KV: 0\n",
             f"Prefill Throughput: {go_fixed(f.prefill_throughput, 4)} sub-req/s\n",
             f"Decode Throughput: {go_fixed(f.decode_throughput, 4)} sub-req/s\n",
             f"Load Imbalance Ratio: {ratio}\n"]
    if f.parent_ttft is not None:
        lines.append(_dist_line("Parent TTFT (us)", f.parent_ttft))
    if f.transfer is not None:
        lines.append(_dist_line("KV Transfer Duration (us)", f.transfer))
    if f.contention:
        lines.append(f"Peak Concurrent Transfers: {f.peak_transfers}\n")
        lines.append(f"Mean Transfer Queue Depth: {go_fixed(f.mean_queue_depth, 4)}\n")
    return "".join(lines)


PD_SUMMARY_COLUMNS = (
    "pd_disaggregated_requests", "pd_decode_completed", "pd_decode_timed_out",
    "pd_dropped_at_decode_kv", "pd_prefill_throughput", "pd_decode_throughput",
    "pd_load_imbalance_ratio",
    "pd_parent_ttft_mean_ms", "pd_parent_ttft_p50_ms", "pd_parent_ttft_p95_ms",
    "pd_parent_ttft_p99_ms",
    "pd_kv_transfer_mean_ms", "pd_kv_transfer_p50_ms", "pd_kv_transfer_p95_ms",
    "pd_kv_transfer_p99_ms",
    "pd_peak_concurrent_transfers", "pd_mean_transfer_queue_depth",
)
"""summary.parquet's P/D columns (schemas/summary.json), null for a run without P/D."""


def pd_summary_columns(figures: PDFigures | None) -> dict:
    """summary.parquet's P/D columns from the block's figures (ms, not the block's µs); all
    null without P/D, distributions null when empty, transfer queue figures null without
    ``--pd-transfer-contention``."""
    cols: dict = dict.fromkeys(PD_SUMMARY_COLUMNS)
    if figures is None:
        return cols
    f = figures
    cols.update(pd_disaggregated_requests=f.disaggregated,
                pd_decode_completed=f.decode_completed, pd_decode_timed_out=f.decode_timed_out,
                pd_dropped_at_decode_kv=f.dropped_at_decode_kv,
                pd_prefill_throughput=f.prefill_throughput,
                pd_decode_throughput=f.decode_throughput, pd_load_imbalance_ratio=f.imbalance)
    for name, dist in (("parent_ttft", f.parent_ttft), ("kv_transfer", f.transfer)):
        if dist is not None:
            for stat in ("mean", "p50", "p95", "p99"):
                cols[f"pd_{name}_{stat}_ms"] = getattr(dist, stat) / 1e3
    if f.contention:
        cols["pd_peak_concurrent_transfers"] = f.peak_transfers
        cols["pd_mean_transfer_queue_depth"] = f.mean_queue_depth
    return cols


def pd_warnings(res: SimulationResult, opts) -> list[str]:
    """One line per reference behaviour this run actually ran into (README, "known reference
    behaviour"), each at most once."""
    pd = res.pd
    cnt = pd.counts
    par = pd.parents
    n = res.table.n
    split = par.disaggregated
    out: list[str] = []
    ended_badly = cnt.dropped_at_decode_kv + cnt.decode_timed_out
    if ended_badly:
        out.append(f"{ended_badly} disaggregated requests that were dropped at their decode "
                   "instance or timed out are included in the TTFT/E2E/scheduling-delay "
                   "statistics and the results file as if completed (reference behaviour, "
                   "upstream #1511)")
    dropped = cnt.dropped_at_decode_kv
    if dropped:
        out.append(f'"Dropped at Decode KV" in the P/D block is always 0 (reference behaviour); '
                   f"the {dropped} requests dropped for lack of KV on their decode instance "
                   "are in dropped_unservable")
    projected = split & (par.done_us > 0)
    if projected.any():
        out.append("for disaggregated requests the cluster scheduling_delay_p99_ms covers only "
                   "the wait before prefill, not the wait on the decode instance (reference "
                   "behaviour)")
    if opts.trace_output and split.any():
        out.append(f"--trace-output writes the {int(split.sum())} disaggregated requests with "
                   "status incomplete and no chunk times (reference behaviour); their outcomes "
                   "are in --metrics-path")
    late = cnt.past_deadline
    if late:
        out.append(f"{late} decode sub-requests reached their decode instance after their "
                   "deadline; they are timed out at the deadline, before the transfer that "
                   "delivered them ended (reference behaviour)")
    proj = project(res)
    parent_rows = proj.rows[len(proj.rows) - len(proj.parent_ttft_us):]
    prefill_ttft = res.ttft_us[parent_rows + n].astype(np.float64)
    early = int(np.count_nonzero((prefill_ttft >= 0)
                                 & (proj.parent_ttft_us < prefill_ttft)))
    if early:
        out.append("KV transfers start at the beginning of the last prefill step (reference "
                   f"behaviour), so decoding can begin before prefill ends: {early} "
                   "disaggregated requests report a TTFT shorter than their own prefill")
    return out
