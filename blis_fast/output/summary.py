"""The metrics JSON block and the per-request results file (ENG-7.4, ENG-7.6, CLU-7.21, CLU-7.24).

Inputs are plain arrays filled by the engine:

* :class:`InstanceMetrics` — one instance's counters and latency samples (or the cluster
  aggregate, see :func:`aggregate_instances`);
* :class:`RequestColumns` — one row per request *registered* at an instance (routed and not
  dropped at enqueue; unfinished and timed-out requests included), any row order.

All times are ticks (µs). Absent per-request values are NaN (float columns) or -1 (int
columns), and are written as 0 in the results file, as the reference does for missing map
entries.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from blis_fast.gonum import atoi, or_none
from blis_fast.output.adapters import AdapterFigures, adapters_block, merge_adapter_figures
from blis_fast.output.gojson import format_go_float, marshal_indent, needs_escape, quote_go_string
from blis_fast.output.stats import (
    mean_ms,
    percentile_ms,
    sorted_values,
    sorted_weighted,
    weighted_mean_ms,
    weighted_percentile_ms,
)

__all__ = [
    "InstanceMetrics",
    "RequestColumns",
    "aggregate_instances",
    "build_metrics_output",
    "metrics_block",
    "results_order",
    "results_text",
    "write_results_file",
    "replay_results_text",
    "write_replay_results",
    "format_go_floats",
    "atomic_write_text",
]


def _f64() -> np.ndarray:
    return np.empty(0, dtype=np.float64)


def _i64() -> np.ndarray:
    return np.empty(0, dtype=np.int64)


@dataclass
class InstanceMetrics:
    """One instance's end-of-run metrics (``sim.Metrics`` after Finalize), ticks = µs."""

    completed: int = 0
    """CompletedRequests (normal and length-capped completions)."""
    still_queued: int = 0
    """Requests in the wait queue at the end."""
    still_running: int = 0
    """Requests in the running batch at the end."""
    dropped_unservable: int = 0
    """Requests dropped at enqueue (ENG-3.x)."""
    timed_out: int = 0
    """Requests cancelled by their client timeout."""
    length_capped: int = 0
    """Requests force-completed at the MaxModelLen boundary."""
    total_input_tokens: int = 0
    """TotalInputTokens counter."""
    total_output_tokens: int = 0
    """TotalOutputTokens counter (counted at completion, DELTA-6)."""
    preemption_count: int = 0
    """Preemption events."""
    kv_allocation_failures: int = 0
    """Final-token KV allocation failures (JSON key omitted when 0)."""
    sim_ended_time_us: int = 0
    """SimEndedTime: min(last processed event time, horizon); the aggregate takes the max."""
    ttft_us: np.ndarray = field(default_factory=_f64)
    """float64: RequestTTFTs values — every request that reached its first token (any order)."""
    e2e_us: np.ndarray = field(default_factory=_f64)
    """float64: RequestE2Es values — completed requests (any order)."""
    scheduling_delay_us: np.ndarray = field(default_factory=_i64)
    """int64: RequestSchedulingDelays values — every request ever admitted (any order)."""
    itl_values_us: np.ndarray = field(default_factory=_i64)
    """int64: distinct-or-not ITL sample values of AllITLs (completed requests' final attempt)."""
    itl_counts: np.ndarray = field(default_factory=_i64)
    """int64: multiplicity of each entry of ``itl_values_us`` (same length)."""
    wait_queue_len_sum: int = 0
    """Sum over steps of the wait-queue length recorded per step (NumWaitQRequests)."""
    wait_queue_len_steps: int = 0
    """Number of per-step wait-queue samples (len(NumWaitQRequests))."""
    cache_hit_rate: float = 0.0
    """KV store CacheHitRate captured at Finalize."""
    kv_thrashing_rate: float = 0.0
    """KV store KVThrashingRate captured at Finalize."""
    adapters: AdapterFigures | None = None
    """LoRA: the per-adapter figures behind the ``adapters`` block (None: no adapter)."""


def aggregate_instances(instances: Sequence[InstanceMetrics]) -> InstanceMetrics:
    """Cluster aggregate of per-instance metrics (CLU-7.1..7.5, ``aggregateMetrics``)."""
    agg = InstanceMetrics()
    n = len(instances)
    hit = 0.0
    thrash = 0.0
    for m in instances:
        agg.completed += int(m.completed)
        agg.still_queued += int(m.still_queued)
        agg.still_running += int(m.still_running)
        agg.dropped_unservable += int(m.dropped_unservable)
        agg.timed_out += int(m.timed_out)
        agg.length_capped += int(m.length_capped)
        agg.total_input_tokens += int(m.total_input_tokens)
        agg.total_output_tokens += int(m.total_output_tokens)
        agg.preemption_count += int(m.preemption_count)
        agg.kv_allocation_failures += int(m.kv_allocation_failures)
        agg.sim_ended_time_us = max(agg.sim_ended_time_us, int(m.sim_ended_time_us))
        agg.wait_queue_len_sum += int(m.wait_queue_len_sum)
        agg.wait_queue_len_steps += int(m.wait_queue_len_steps)
        hit += float(m.cache_hit_rate)
        thrash += float(m.kv_thrashing_rate)
    if n > 0:
        agg.cache_hit_rate = hit / float(n)
        agg.kv_thrashing_rate = thrash / float(n)
        agg.ttft_us = np.concatenate([np.asarray(m.ttft_us, np.float64) for m in instances])
        agg.e2e_us = np.concatenate([np.asarray(m.e2e_us, np.float64) for m in instances])
        agg.scheduling_delay_us = np.concatenate(
            [np.asarray(m.scheduling_delay_us, np.int64) for m in instances]
        )
        agg.itl_values_us = np.concatenate(
            [np.asarray(m.itl_values_us, np.int64) for m in instances]
        )
        agg.itl_counts = np.concatenate([np.asarray(m.itl_counts, np.int64) for m in instances])
        agg.adapters = merge_adapter_figures([m.adapters for m in instances])
    return agg


def build_metrics_output(instance_id: str, m: InstanceMetrics) -> dict:
    """The ordered ``MetricsOutput`` dict of ``SaveResults`` (without ``requests``)."""
    duration_s = float(m.sim_ended_time_us) / 1e6
    out: dict = {
        "instance_id": instance_id,
        "completed_requests": int(m.completed),
        "still_queued": int(m.still_queued),
        "still_running": int(m.still_running),
        "injected_requests": int(
            m.completed + m.still_queued + m.still_running + m.dropped_unservable + m.timed_out
        ),
        "total_input_tokens": int(m.total_input_tokens),
        "total_output_tokens": int(m.total_output_tokens),
        "vllm_estimated_duration_s": duration_s,
    }
    stats = dict.fromkeys(
        (
            "responses_per_sec",
            "tokens_per_sec",
            "e2e_mean_ms",
            "e2e_p90_ms",
            "e2e_p95_ms",
            "e2e_p99_ms",
            "ttft_mean_ms",
            "ttft_p90_ms",
            "ttft_p95_ms",
            "ttft_p99_ms",
            "itl_mean_ms",
            "itl_p90_ms",
            "itl_p95_ms",
            "itl_p99_ms",
            "scheduling_delay_p99_ms",
        ),
        0.0,
    )
    if m.completed > 0:
        ttft = sorted_values(np.asarray(m.ttft_us, dtype=np.float64))
        e2e = sorted_values(np.asarray(m.e2e_us, dtype=np.float64))
        sd = sorted_values(np.asarray(m.scheduling_delay_us, dtype=np.int64).astype(np.float64))
        iv, ic = sorted_weighted(np.asarray(m.itl_values_us, dtype=np.int64),
                                 np.asarray(m.itl_counts, dtype=np.int64))
        stats["ttft_mean_ms"] = mean_ms(ttft)
        stats["ttft_p90_ms"] = percentile_ms(ttft, 90)
        stats["ttft_p95_ms"] = percentile_ms(ttft, 95)
        stats["ttft_p99_ms"] = percentile_ms(ttft, 99)
        stats["e2e_mean_ms"] = mean_ms(e2e)
        stats["e2e_p90_ms"] = percentile_ms(e2e, 90)
        stats["e2e_p95_ms"] = percentile_ms(e2e, 95)
        stats["e2e_p99_ms"] = percentile_ms(e2e, 99)
        stats["itl_mean_ms"] = weighted_mean_ms(iv, ic)
        stats["itl_p90_ms"] = weighted_percentile_ms(iv, ic, 90)
        stats["itl_p95_ms"] = weighted_percentile_ms(iv, ic, 95)
        stats["itl_p99_ms"] = weighted_percentile_ms(iv, ic, 99)
        stats["scheduling_delay_p99_ms"] = percentile_ms(sd, 99)
        if duration_s > 0:
            stats["responses_per_sec"] = float(m.completed) / duration_s
            stats["tokens_per_sec"] = float(m.total_output_tokens) / duration_s
    out.update(stats)
    if m.kv_allocation_failures != 0:
        out["kv_allocation_failures"] = int(m.kv_allocation_failures)
    out["preemption_count"] = int(m.preemption_count)
    out["dropped_unservable"] = int(m.dropped_unservable)
    out["length_capped_requests"] = int(m.length_capped)
    out["timed_out_requests"] = int(m.timed_out)
    block = adapters_block(m.adapters, duration_s)
    if block is not None:  # LORA-8.1
        out["adapters"] = block
    return out


def metrics_block(metrics_dict: dict) -> str:
    """The stdout block ``=== Simulation Metrics ===`` + JSON + newline (DELTA-9: always)."""
    return "=== Simulation Metrics ===\n" + marshal_indent(metrics_dict) + "\n"


@dataclass
class RequestColumns:
    """Per-request records, one row per request registered at an instance (any row order)."""

    request_id: Sequence[str] | np.ndarray
    """Request IDs (``request_<i>``, session follow-ups ``session_..._round_...``)."""
    arrival_us: np.ndarray
    """int64 ArrivalTime."""
    num_prefill_tokens: np.ndarray
    """int64 len(InputTokens)."""
    num_decode_tokens: np.ndarray
    """int64 len(OutputTokens): the pre-sampled output length, not the generated count."""
    ttft_us: np.ndarray
    """float64 RequestTTFTs value; NaN when the request never reached its first token."""
    itl_us: np.ndarray
    """float64 RequestITLs value (per-request mean ITL, ENG-7.2 step 4); NaN if not completed."""
    e2e_us: np.ndarray
    """float64 RequestE2Es value; NaN when not completed."""
    scheduling_delay_us: np.ndarray
    """int64 RequestSchedulingDelays value; -1 when never admitted."""
    handled_by: np.ndarray
    """int32 instance index the request was routed to; -1 for none (omitted)."""
    slo_class: Sequence[str] | np.ndarray
    """SLO class, "" when none."""
    tenant_id: Sequence[str] | np.ndarray
    """Tenant id, "" when none."""
    model: Sequence[str] | np.ndarray
    """Model tag, "" when none."""
    length_capped: np.ndarray
    """bool: force-completed at the MaxModelLen boundary."""
    gateway_queue_delay_ms: np.ndarray | None = None
    """float64 DELTA-10 gateway delay in ms (flow control only; None or 0 = omitted)."""
    pd: dict | None = None
    """P/D runs: per-row P/D columns (``output/pd.py: PD_COLUMNS``), None otherwise."""
    instance_names: Sequence[str] | None = None
    """The id of each instance index (None: ``instance_<i>``; autoscaled runs name theirs)."""
    client_id: Sequence[str] | np.ndarray | None = None
    """The workload client of each row ("" when it has no id); None when not known (records
    rebuilt from a results file), which ``requests.parquet`` writes as nulls."""
    session_id: Sequence[str | None] | np.ndarray | None = None
    """The session of each row, None outside a session; None for the whole column when not
    known."""
    round_index: np.ndarray | None = None
    """int64 round of each row within its session, -1 outside a session; None when not known."""
    preemptions: np.ndarray | None = None
    """int64 times each row's request was preempted (P/D: its sub-requests' together); None
    when not known."""
    cached_prefix_tokens: np.ndarray | None = None
    """int64 leading prompt tokens the prefix cache held at the row's last admission from the
    wait queue (P/D: the prefill sub-request's); None when not known."""
    priority: np.ndarray | None = None
    """float64 the priority policy's value when last computed for the row (P/D: the prefill
    sub-request's); None when not known."""
    slo_priority: np.ndarray | None = None
    """int64 the priority of the row's SLO class (bundle overrides applied); None when not
    known."""
    adapter: Sequence[str] | np.ndarray | None = None
    """The LoRA adapter of each row ("" for the base model); None when no row has one."""
    kv_cpu_reloaded_blocks: np.ndarray | None = None
    """int64 blocks the CPU tier reloaded into the GPU cache for each row over its life; None
    without a CPU tier."""
    kv_promoted_blocks: np.ndarray | None = None
    """int64 blocks promotion reads brought back from a secondary tier for each row; None
    without ``--kv-offload-config``."""
    kv_deferrals: np.ndarray | None = None
    """int64 times each row's admission was set aside to await a fetch; None without
    ``--kv-offload-config``."""
    kv_fetch_wait_ms: np.ndarray | None = None
    """float64 milliseconds each row spent deferred awaiting a fetch; None without
    ``--kv-offload-config``."""

    def instance_name(self, i: int) -> str:
        """The id ``handled_by`` index ``i`` stands for."""
        return self.instance_names[i] if self.instance_names is not None else f"instance_{i}"

    def __len__(self) -> int:
        """Number of rows."""
        return int(np.asarray(self.arrival_us).shape[0])

    @classmethod
    def empty(cls) -> RequestColumns:
        """A table with no rows."""
        e_s = np.empty(0, dtype=object)
        return cls(
            request_id=e_s,
            arrival_us=_i64(),
            num_prefill_tokens=_i64(),
            num_decode_tokens=_i64(),
            ttft_us=_f64(),
            itl_us=_f64(),
            e2e_us=_f64(),
            scheduling_delay_us=_i64(),
            handled_by=np.empty(0, dtype=np.int32),
            slo_class=e_s,
            tenant_id=e_s,
            model=e_s,
            length_capped=np.empty(0, dtype=bool),
        )


def _str_array(x: Sequence[str] | np.ndarray) -> np.ndarray:
    a = np.asarray(x)
    if a.dtype.kind not in "UO":
        a = a.astype(str)
    return a


def results_order(request_id: Sequence[str] | np.ndarray, arrival_us: np.ndarray) -> np.ndarray:
    """Row order of the results file: IDs sorted bytewise, then Go's ``sort.Slice`` by arrival."""
    ids = _str_array(request_id)
    by_id = np.argsort(ids, kind="stable")
    arrived = np.asarray(arrival_us, dtype=np.int64)[by_id].astype(np.float64) / 1e6
    if arrived.size > 1 and np.unique(arrived).size < arrived.size:
        from blis_fast.kernels.go.gosort import go_sort_slice_order  # lazy: loads numba

        return by_id[go_sort_slice_order(arrived)]
    return by_id[np.argsort(arrived, kind="stable")]


def format_go_floats(values: np.ndarray) -> list[str]:
    """``format_go_float`` over an array (fast path for 0 and 1e-4 <= |x| < 1e16)."""
    a = np.asarray(values, dtype=np.float64)
    ax = np.abs(a)
    if np.all((ax == 0) | ((ax >= 1e-4) & (ax < 1e16))):
        return [r[:-2] if (r := repr(x)).endswith(".0") else r for x in a.tolist()]
    return [format_go_float(x) for x in a.tolist()]


def _quoted_optional(values: Sequence[str] | np.ndarray, key: str, n: int) -> list[str]:
    """Per-row ``,\\n      "key": "value"`` fragments ("" where the value is empty)."""
    vals = [str(v) for v in values] if not isinstance(values, list) else values
    if len(vals) != n:
        raise ValueError(f"column {key} has {len(vals)} rows, expected {n}")
    frag = {u: (f',\n      "{key}": ' + quote_go_string(u)) if u != "" else "" for u in set(vals)}
    return [frag[v] for v in vals]


def _quoted_ids(ids: list[str]) -> list[str]:
    """JSON string literals of the IDs (plain wrapping when nothing needs escaping)."""
    if not needs_escape("".join(ids)):
        return ['"' + s + '"' for s in ids]
    return [quote_go_string(s) for s in ids]


def _request_rows(req: RequestColumns) -> str:
    """The ``requests`` array elements as Go's MarshalIndent writes them, comma-joined."""
    n = len(req)
    order = results_order(req.request_id, req.arrival_us)
    ids = _str_array(req.request_id)[order]
    arrival = np.asarray(req.arrival_us, dtype=np.int64)[order]
    arrived = format_go_floats(arrival.astype(np.float64) / 1e6)
    ttft = np.asarray(req.ttft_us, dtype=np.float64)[order]
    itl = np.asarray(req.itl_us, dtype=np.float64)[order]
    e2e = np.asarray(req.e2e_us, dtype=np.float64)[order]
    sd = np.asarray(req.scheduling_delay_us, dtype=np.int64)[order]
    ttft_s = format_go_floats(np.where(np.isnan(ttft), 0.0, ttft) / 1e3)
    itl_s = format_go_floats(np.where(np.isnan(itl), 0.0, itl) / 1e3)
    e2e_s = format_go_floats(np.where(np.isnan(e2e), 0.0, e2e) / 1e3)
    sd_s = format_go_floats(np.where(sd < 0, 0, sd).astype(np.float64) / 1e3)
    pre = np.asarray(req.num_prefill_tokens, dtype=np.int64)[order].tolist()
    dec = np.asarray(req.num_decode_tokens, dtype=np.int64)[order].tolist()
    id_s = _quoted_ids([str(x) for x in ids.tolist()])
    slo = _quoted_optional(_str_array(req.slo_class)[order].tolist(), "slo_class", n)
    ten = _quoted_optional(_str_array(req.tenant_id)[order].tolist(), "tenant_id", n)
    hb = np.asarray(req.handled_by, dtype=np.int64)[order].tolist()
    names = req.instance_names
    hand = _quoted_optional([f"instance_{h}" if h >= 0 else "" for h in hb] if names is None
                            else [names[h] if h >= 0 else "" for h in hb], "handled_by", n)
    mod = _quoted_optional(_str_array(req.model)[order].tolist(), "model", n)
    if req.adapter is not None:  # LORA-8.4: after "model", omitted when empty
        adp = _quoted_optional(_str_array(req.adapter)[order].tolist(), "adapter", n)
        mod = [m + x for m, x in zip(mod, adp, strict=True)]
    capped = np.asarray(req.length_capped, dtype=bool)[order].tolist()
    cap = [',\n      "length_capped": true' if c else "" for c in capped]
    if req.gateway_queue_delay_ms is not None:
        gq = np.asarray(req.gateway_queue_delay_ms, dtype=np.float64)[order]
        gq_s = format_go_floats(gq)
        gw = [
            (',\n      "gateway_queue_delay_ms": ' + s) if v != 0 else ""
            for v, s in zip(gq.tolist(), gq_s, strict=True)
        ]
    else:
        gw = [""] * n
    rows = [
        f'    {{\n      "arrived_at": {a},\n      "requestID": {i},\n'
        f'      "num_prefill_tokens": {p},\n      "num_decode_tokens": {d},\n'
        f'      "ttft_ms": {t},\n      "itl_ms": {il},\n      "e2e_ms": {e},\n'
        f'      "scheduling_delay_ms": {sdv}{o1}{o2}{o3}{o4}{o5}{o6}\n    }}'
        for a, i, p, d, t, il, e, sdv, o1, o2, o3, o4, o5, o6 in zip(
            arrived,
            id_s,
            pre,
            dec,
            ttft_s,
            itl_s,
            e2e_s,
            sd_s,
            slo,
            ten,
            hand,
            mod,
            cap,
            gw,
            strict=True,
        )
    ]
    return ",\n".join(rows)


def results_text(metrics_dict: dict, requests: RequestColumns | None) -> str:
    """Go's MarshalIndent of MetricsOutput with its ``requests`` array (omitted when empty);
    the LoRA ``adapters`` block comes after ``requests`` in the file (LORA-8.1)."""
    adapters = metrics_dict.get("adapters")
    if adapters is not None:
        metrics_dict = {k: v for k, v in metrics_dict.items() if k != "adapters"}
    head = marshal_indent(metrics_dict)
    if (requests is None or len(requests) == 0) and adapters is None:
        return head
    if not head.endswith("\n}"):
        raise ValueError("metrics_dict must be a non-empty dict")
    if requests is not None and len(requests) > 0:
        head = head[:-2] + ',\n  "requests": [\n' + _request_rows(requests) + "\n  ]\n}"
    if adapters is not None:
        head = head[:-2] + ",\n" + marshal_indent({"adapters": adapters})[2:]
    return head


def atomic_write_text(path: str | os.PathLike, text: str, flag: str = "output") -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically (``blis_fast.files.write_output_file``)."""
    from blis_fast.files import write_output_file  # lazy: files loads yaml

    write_output_file(path, flag, text)


def write_results_file(
    path: str | os.PathLike, metrics_dict: dict, requests: RequestColumns | None
) -> None:
    """Write the ``--results-path`` / ``--metrics-path`` file exactly as the reference does."""
    atomic_write_text(path, results_text(metrics_dict, requests))


def replay_results_text(requests: RequestColumns) -> str:
    """``blis replay --results-path`` text: ``[]SimResult`` of completed numeric-ID requests."""
    ids = _str_array(requests.request_id).tolist()
    ttft = np.asarray(requests.ttft_us, dtype=np.float64)
    e2e = np.asarray(requests.e2e_us, dtype=np.float64)
    pre = np.asarray(requests.num_prefill_tokens, dtype=np.int64).tolist()
    dec = np.asarray(requests.num_decode_tokens, dtype=np.int64).tolist()
    keep: list[tuple[int, int]] = []
    ok = ~np.isnan(ttft) & ~np.isnan(e2e)
    for i in np.flatnonzero(ok).tolist():
        rid = ids[i]
        num = or_none(atoi, rid[len("request_") :] if rid.startswith("request_") else rid)
        if num is not None:
            keep.append((num, i))
    if not keep:
        return "[]"
    nums = np.array([k[0] for k in keep], dtype=np.int64)
    rows = np.array([k[1] for k in keep], dtype=np.int64)
    # Go sorts a list built from map iteration; equal numeric IDs (e.g. "request_7" and
    # "request_07") would come out in random order there, here in row order.
    order = np.argsort(nums, kind="stable")
    nums, rows = nums[order], rows[order]
    t_s = format_go_floats(ttft[rows])
    e_s = format_go_floats(e2e[rows])
    out = [
        f'  {{\n    "request_id": {num},\n    "ttft_us": {t},\n    "e2e_us": {e},\n'
        f'    "input_tokens": {pre[r]},\n    "output_tokens": {dec[r]}\n  }}'
        for num, t, e, r in zip(nums.tolist(), t_s, e_s, rows.tolist(), strict=True)
    ]
    return "[\n" + ",\n".join(out) + "\n]"


def write_replay_results(path: str | os.PathLike, requests: RequestColumns) -> None:
    """Write the ``blis replay --results-path`` file (WL-8 SimResult list)."""
    atomic_write_text(path, replay_results_text(requests))
