"""``pools.parquet`` of a P/D run (blis_fast's addition): one row per pool (prefill, decode,
shared), in that order, with its layout, its instances' counters summed, the latencies of the
phase it serves and the KV it sent, received or could not take.

Counters are the instances' own (sub-requests unprojected, PD-6.2), so the prefill and
shared rows' ``completed`` give the ``=== PD Metrics ===`` prefill throughput; per-request
figures come from the same arrays as ``requests.parquet``'s P/D columns. Instances outside
the pools (more instances than pool members) serve nothing and get no row.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from blis_fast.config.pd import ROLE_DECODE, ROLE_PREFILL
from blis_fast.engine.results import SimulationResult
from blis_fast.output.cost import instance_gpus, run_end_us
from blis_fast.output.pd import run_ended_us
from blis_fast.output.schemas import load_schema
from blis_fast.output.stats import (
    distribution,
    sorted_weighted,
    weighted_mean_ms,
    weighted_percentile_ms,
)
from blis_fast.output.summary import InstanceMetrics

__all__ = ["POOL_ROLES", "pool_rows", "pools_table"]

POOL_ROLES = (("prefill", ROLE_PREFILL), ("decode", ROLE_DECODE),
              ("shared", ROLE_PREFILL | ROLE_DECODE))
"""Each pool's name and role bits, in row order."""


def _stats_ms(prefix: str, values_us: np.ndarray) -> dict[str, float | None]:
    """``<prefix>_mean_ms``, ``_p50_ms``, ``_p99_ms`` of µs values (linear-interpolated
    percentiles, the P/D block's); null when there are none."""
    if values_us.size == 0:
        return {f"{prefix}_{stat}_ms": None for stat in ("mean", "p50", "p99")}
    dist = distribution(values_us)
    return {f"{prefix}_mean_ms": dist.mean / 1e3, f"{prefix}_p50_ms": dist.p50 / 1e3,
            f"{prefix}_p99_ms": dist.p99 / 1e3}


def _itl_ms(members: list[InstanceMetrics]) -> dict[str, float | None]:
    """The pool's step-level ITL (each step's duration + output-token time, weighted by the
    tokens it produced: the cluster block's ITL over these instances)."""
    values = np.concatenate([np.asarray(m.itl_values_us, np.int64) for m in members])
    counts = np.concatenate([np.asarray(m.itl_counts, np.int64) for m in members])
    if int(counts.sum()) == 0:
        return {"itl_mean_ms": None, "itl_p50_ms": None, "itl_p99_ms": None}
    iv, ic = sorted_weighted(values, counts)
    return {"itl_mean_ms": weighted_mean_ms(iv, ic),
            "itl_p50_ms": weighted_percentile_ms(iv, ic, 50),
            "itl_p99_ms": weighted_percentile_ms(iv, ic, 99)}


def pool_rows(res: SimulationResult, instances: list[InstanceMetrics]) -> list[dict]:
    """One dict per pool with instances (``schemas/pools.json``'s fields)."""
    cfg = res.config
    opts = cfg.options
    pd = cfg.pd
    par = res.pd.parents
    n = res.table.n
    roles = pd.roles(opts.num_instances)
    ended = run_ended_us(instances)
    end_us = run_end_us(res)
    blocks = cfg.kv_blocks_per_instance()
    gpus_of = instance_gpus(res)
    flag = par.disaggregated
    prefill_inst, decode_inst = par.prefill_instance, par.decode_instance
    start, done = par.transfer_start_us, par.transfer_done_us
    held = par.attached
    moved_blocks = par.blocks
    completed_at_end, timed_out_at_end = res.completed[:n], res.timed_out[:n]
    peak_kv = res.peak_kv_blocks
    arrival = res.table.arrival_us
    local = ~flag & (res.registered[:n] == 1)
    rows: list[dict] = []
    for name, bits in POOL_ROLES:
        idx = np.flatnonzero(roles == bits)
        if idx.size == 0:
            continue
        members = [instances[i] for i in idx.tolist()]
        tp = int(gpus_of[idx[0]])
        gpu = cfg.latency.gpu
        given = "prefill_hardware" if bits == ROLE_PREFILL else "decode_hardware"
        if pd.prefill > 0 and opts.given(given):
            gpu = getattr(opts, given)
        pre = flag & np.isin(prefill_inst, idx)  # prefill sub-requests routed here
        dec = flag & np.isin(decode_inst, idx)  # decode instance chosen here
        sent = pre & (start > 0) & held
        received = dec & (done > 0)
        completed = int(sum(m.completed for m in members))
        pf_ttft = res.ttft_us[np.flatnonzero(pre) + n]
        pf_wait = res.sched_delay_us[np.flatnonzero(pre) + n]
        d_sched = res.sched_delay_us[:n]
        admitted = dec & (d_sched >= 0) & (par.decode_enqueue_us > 0)
        d_wait = (arrival + d_sched - par.decode_enqueue_us)[admitted]
        d_done = dec & completed_at_end
        pool_blocks = blocks[idx]
        peak = peak_kv[idx]
        capacity = float(pool_blocks.sum()) * float(end_us)
        row = {
            "pool": name,
            "instances": int(idx.size),
            "instance_ids": [res.instance_name(i) for i in idx.tolist()],
            "tp": tp,
            "gpu": gpu,
            "gpus": int(idx.size) * tp,
            "gpu_seconds": int(idx.size) * tp * end_us / 1e6,
            "kv_blocks_per_instance": int(pool_blocks.max()),
            "prefill_sub_requests": int(np.count_nonzero(pre)),
            "decode_sub_requests": int(np.count_nonzero(dec)),
            "local_requests": int(np.count_nonzero(local & np.isin(res.instance[:n], idx))),
            "completed": completed,
            "throughput_per_s": completed / (ended / 1e6) if ended > 0 else 0.0,
            "input_tokens": int(sum(m.total_input_tokens for m in members)),
            "output_tokens": int(sum(m.total_output_tokens for m in members)),
            "still_queued": int(sum(m.still_queued for m in members)),
            "still_running": int(sum(m.still_running for m in members)),
            "dropped_unservable": int(sum(m.dropped_unservable for m in members)),
            "timed_out": int(sum(m.timed_out for m in members)),
            "preemptions": int(sum(m.preemption_count for m in members)),
            **_stats_ms("prefill_ttft", pf_ttft[pf_ttft >= 0].astype(np.float64)),
            **_stats_ms("prefill_wait", pf_wait[pf_wait >= 0].astype(np.float64)),
            **_stats_ms("decode_wait", d_wait.astype(np.float64)),
            **_stats_ms("decode_e2e", res.e2e_us[:n][d_done].astype(np.float64)),
            **_itl_ms(members),
            "kv_peak_utilization": float(np.max(peak / np.maximum(pool_blocks, 1))),
            "kv_mean_utilization": (float(res.kv_integral[idx].sum()) / capacity
                                    if capacity > 0 else 0.0),
            "transfers_sent": int(np.count_nonzero(sent)),
            "kv_blocks_sent": int(moved_blocks[sent].sum()),
            "kv_bytes_sent": int(round(float(moved_blocks[sent].sum()) * pd.block_bytes)),
            "transfers_received": int(np.count_nonzero(received)),
            "kv_blocks_received": int(moved_blocks[received].sum()),
            "kv_bytes_received": int(round(float(moved_blocks[received].sum())
                                           * pd.block_bytes)),
            "decode_completed": int(np.count_nonzero(d_done)),
            "decode_kv_drops": int(np.count_nonzero(dec & (start > 0) & ~held)),
            "decode_timeouts": int(np.count_nonzero(dec & timed_out_at_end)),
        }
        rows.append(row)
    return rows


def pools_table(rows: list[dict]) -> pa.Table:
    """``pool_rows`` as a table with the ``schemas/pools.json`` schema."""
    schema = load_schema("pools")
    return pa.Table.from_pylist(rows, schema=schema)
