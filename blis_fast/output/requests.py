"""The per-request columns of a run (``requests.parquet``, the results file's requests),
read from a ``SimulationResult`` and its request table.

These helpers are shared by the plain run's columns (:func:`request_columns`) and the P/D
projection (``blis_fast.output.pd``), so they sit below both: ``run_outputs`` imports ``pd``
and ``pd`` imports this module, never ``run_outputs``.
"""

from __future__ import annotations

import numpy as np

from blis_fast.engine.results import SimulationResult
from blis_fast.output.adapters import adapter_ids
from blis_fast.output.summary import RequestColumns
from blis_fast.workload.request_table import RequestTable

__all__ = [
    "client_meta",
    "mean_itl",
    "request_columns",
    "request_engine_records",
    "request_identity",
]


def mean_itl(res: SimulationResult, rows: np.ndarray, out_len: np.ndarray) -> np.ndarray:
    """Per-request mean ITL of ``rows`` (ENG-7.2 step 4): the ITL sum over max(samples - 1, 1)
    (samples = the output length, or the decode steps when length-capped); 0 without outputs,
    NaN unless completed."""
    capped = res.length_capped[rows] == 1
    n_itl = np.where(capped, res.itl_count[rows], out_len)
    denom = np.maximum(n_itl - 1, 1).astype(np.float64)
    itl = res.itl_sum_us[rows].astype(np.float64) / denom
    itl = np.where(out_len > 0, itl, 0.0)
    return np.where(res.completed[rows], itl, np.nan)


def client_meta(table: RequestTable, rows: np.ndarray, key: str) -> np.ndarray:
    """Client metadata ``key`` (slo_class, tenant_id, model) of ``rows``, "" when none."""
    clients = table.clients
    values = np.array([str(c.get(key, "") or "") for c in clients] or [""], dtype=object)
    return values[table.client_idx[rows]] if len(clients) else np.full(len(rows), "",
                                                                         dtype=object)


def request_identity(table: RequestTable, rows: np.ndarray) -> dict[str, np.ndarray]:
    """The ``client_id``, ``session_id`` and ``round_index`` columns of ``rows`` (what
    :class:`RequestColumns` holds for ``requests.parquet``): session and round None / -1
    outside a session."""
    sessions = np.array(list(table.sessions) + [None], dtype=object)
    session_idx = table.session_idx[rows]
    in_session = session_idx >= 0
    return {
        "client_id": client_meta(table, rows, "id"),
        "session_id": sessions[np.where(in_session, session_idx, len(table.sessions))],
        "round_index": np.where(in_session, table.round_index[rows], -1).astype(np.int64),
    }


def request_engine_records(res: SimulationResult, rows: np.ndarray) -> dict[str, np.ndarray]:
    """The columns of workload ``rows`` the kernel collected per request, for
    ``requests.parquet`` (``output/parquet.py: ENGINE_COLUMNS``): preemptions, cached prefix,
    priorities, and the KV tiers' records (None, written as nulls, without a CPU tier or
    without ``--kv-offload-config``).

    In a P/D run a disaggregated parent reports its sub-requests: preemptions and CPU-tier
    reloads of both, the cached prefix and the priority of its prefill sub-request (row
    ``n + r``, the one its ``scheduling_delay_ms`` comes from); a local request's row
    ``n + r`` is never used (its counts there are 0)."""
    preemptions = res.preemptions[rows].astype(np.int64)
    cached = res.cached_prefix_tokens[rows]
    priority = res.priority[rows]
    if res.pd is not None:
        n = res.table.n
        split = res.pd.disaggregated[rows]
        preemptions = preemptions + res.preemptions[rows + n]
        cached = np.where(split, res.cached_prefix_tokens[rows + n], cached)
        priority = np.where(split, res.priority[rows + n], priority)
    reloads = None
    if res.kv_cpu_reloads is not None:
        reloads = res.kv_cpu_reloads[rows]
        if res.pd is not None:
            reloads = reloads + res.kv_cpu_reloads[rows + res.table.n]
    chain = res.kv_chain_requests  # never with P/D (refused)
    return {
        "preemptions": preemptions,
        "cached_prefix_tokens": cached.astype(np.int64),
        "priority": priority.astype(np.float64),
        "slo_priority": res.slo_priority[rows].astype(np.int64),
        "kv_cpu_reloaded_blocks": None if reloads is None else reloads.astype(np.int64),
        "kv_promoted_blocks": None if chain is None else chain.promoted_blocks[rows],
        "kv_deferrals": None if chain is None else chain.deferrals[rows],
        "kv_fetch_wait_ms": None if chain is None else chain.fetch_wait_us[rows] / 1e3,
    }


def request_columns(res: SimulationResult, table: RequestTable) -> RequestColumns:
    """Per-request records of every request registered at an instance (ENG-7.6, CLU-7.24)."""
    rows = np.flatnonzero(res.registered == 1)
    out_len = table.output_len[rows]
    capped = res.length_capped[rows] == 1
    itl = mean_itl(res, rows, out_len)
    ttft = res.ttft_us[rows]
    e2e = res.e2e_us[rows]

    def meta(key: str) -> np.ndarray:
        return client_meta(table, rows, key)

    return RequestColumns(
        request_id=np.array(table.id_strings(), dtype=object)[rows],
        arrival_us=table.arrival_us[rows],
        num_prefill_tokens=table.input_len[rows],
        num_decode_tokens=out_len,
        ttft_us=np.where(ttft >= 0, ttft.astype(np.float64), np.nan),
        itl_us=itl,
        e2e_us=np.where(e2e >= 0, e2e.astype(np.float64), np.nan),
        scheduling_delay_us=res.sched_delay_us[rows].astype(np.int64),
        handled_by=res.instance[rows].astype(np.int32),
        instance_names=res.instance_names,
        slo_class=meta("slo_class"),
        tenant_id=meta("tenant_id"),
        model=meta("model"),
        length_capped=capped,
        adapter=adapter_ids(table, rows),
        **request_identity(table, rows),
        **request_engine_records(res, rows),
    )
