"""Parquet outputs of ``--output-dir``: ``summary.parquet`` (one row) and ``requests.parquet``.

Column names and Arrow types come from the JSON schema files in ``schemas/`` (packaged as
``blis_fast/data/schemas``), loaded by :func:`blis_fast.output.schemas.load_schema`; the
writers build tables with exactly those schemas. Files are written atomically: a temporary file
in the target's directory, then ``os.replace``, so a failed run never leaves a partial file
behind.
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from blis_fast.files import write_output_file
from blis_fast.output.provenance import file_provenance, with_provenance
from blis_fast.output.schemas import load_schema
from blis_fast.output.summary import RequestColumns, results_order

__all__ = [
    "atomic_write_table",
    "write_summary_parquet",
    "write_requests_parquet",
    "requests_table",
    "summary_table",
    "decisions_table",
    "write_decisions_parquet",
]


def atomic_write_table(path: str | os.PathLike, table: pa.Table, flag: str = "output") -> None:
    """Write ``table`` as Parquet atomically (``blis_fast.files.write_output_file``)."""
    write_output_file(path, flag, lambda tmp: pq.write_table(table, tmp))


def _stamped(table: pa.Table, schema: str) -> pa.Table:
    """``table`` with the version and schema provenance of a file written through this module's
    helpers (no run options: they are not known here)."""
    return with_provenance(table, file_provenance(schema, "python"))


def summary_table(summary_dict: dict) -> pa.Table:
    """One-row table of a metrics dict (``build_metrics_output``); missing counters are 0. A
    LoRA run's ``adapters`` block goes to ``adapters.parquet`` (``output/adapters.py``)."""
    schema = load_schema("summary")
    unknown = set(summary_dict) - set(schema.names) - {"requests", "adapters"}
    if unknown:
        raise ValueError(f"summary has fields not in the schema: {sorted(unknown)}")
    cols = []
    for f in schema:
        v = summary_dict.get(f.name)
        if v is None and f.name == "kv_allocation_failures":
            v = 0
        elif v is None and not f.nullable:
            raise ValueError(f"summary is missing field {f.name!r}")
        cols.append(pa.array([v], type=f.type))
    return pa.Table.from_arrays(cols, schema=schema)


def write_summary_parquet(path: str | os.PathLike, summary_dict: dict) -> None:
    """Write ``summary.parquet`` (one row) atomically."""
    atomic_write_table(path, _stamped(summary_table(summary_dict), "summary"))


def requests_table(columns: RequestColumns) -> pa.Table:
    """Per-request table, rows in the results-file order, absent latencies null."""
    schema = load_schema("requests")
    order = results_order(columns.request_id, columns.arrival_us)

    def take(x, dtype=None) -> np.ndarray:
        a = np.asarray(x) if dtype is None else np.asarray(x, dtype=dtype)
        return a[order]

    def strs(x) -> pa.Array:
        return pa.array(take(x).astype(str).tolist(), type=pa.string())

    def ms(x) -> pa.Array:
        a = take(x, np.float64)
        return pa.array(a / 1e3, type=pa.float64(), mask=np.isnan(a))

    sd = take(columns.scheduling_delay_us, np.int64)
    hb = take(columns.handled_by, np.int64)
    e2e = take(columns.e2e_us, np.float64)
    arrays = {
        "request_id": strs(columns.request_id),
        "arrival_us": pa.array(take(columns.arrival_us, np.int64), type=pa.int64()),
        "num_prefill_tokens": pa.array(take(columns.num_prefill_tokens, np.int64), type=pa.int64()),
        "num_decode_tokens": pa.array(take(columns.num_decode_tokens, np.int64), type=pa.int64()),
        "ttft_ms": ms(columns.ttft_us),
        "itl_ms": ms(columns.itl_us),
        "e2e_ms": ms(columns.e2e_us),
        "scheduling_delay_ms": pa.array(
            np.where(sd < 0, 0, sd).astype(np.float64) / 1e3, type=pa.float64(), mask=sd < 0
        ),
        "slo_class": strs(columns.slo_class),
        "tenant_id": strs(columns.tenant_id),
        "model": strs(columns.model),
        "handled_by": pa.array(
            [f"instance_{i}" if i >= 0 else None for i in hb.tolist()]
            if columns.instance_names is None
            else [columns.instance_names[i] if i >= 0 else None for i in hb.tolist()],
            type=pa.string()
        ),
        "length_capped": pa.array(take(columns.length_capped, bool), type=pa.bool_()),
        "completed": pa.array(~np.isnan(e2e), type=pa.bool_()),
        **_identity_arrays(columns, take),
        **_engine_arrays(columns, take),
        "adapter": pa.array(
            [None] * len(order) if columns.adapter is None
            else [a or None for a in take(columns.adapter).tolist()], type=pa.string()),
    }
    ttft_us = take(columns.ttft_us, np.float64)
    first_token = take(columns.arrival_us, np.int64) + np.rint(np.nan_to_num(ttft_us)).astype(
        np.int64)
    arrays["first_token_us"] = pa.array(first_token, type=pa.int64(), mask=np.isnan(ttft_us))
    pd_cols = columns.pd or {}
    for f in schema:  # P/D columns: null without P/D (output/pd.py: request_columns_pd)
        if f.name in arrays:
            continue
        values = pd_cols.get(f.name)
        if values is None:
            arrays[f.name] = pa.nulls(len(order), type=f.type)
        else:
            a = take(values)
            mask = None if a.dtype == object else (a < 0 if a.dtype.kind == "i" else np.isnan(a)
                                                   if a.dtype.kind == "f" else None)
            if f.type == pa.float64():
                a = a / 1e3  # the *_ms columns are kept in µs until here
            arrays[f.name] = pa.array(a.tolist() if a.dtype == object else a, type=f.type,
                                      mask=mask)
    if set(arrays) != set(schema.names):
        raise AssertionError("requests schema and writer disagree")
    return pa.Table.from_arrays([arrays[n] for n in schema.names], schema=schema)


def _identity_arrays(columns: RequestColumns, take) -> dict[str, pa.Array]:
    """The client_id, session_id and round_index columns; nulls where RequestColumns does not
    know them."""
    n = len(columns)
    out = {}
    for name in ("client_id", "session_id"):
        values = getattr(columns, name)
        out[name] = (pa.nulls(n, type=pa.string()) if values is None else
                     pa.array(take(np.asarray(values, dtype=object)).tolist(), type=pa.string()))
    if columns.round_index is None:
        out["round_index"] = pa.nulls(n, type=pa.int64())
    else:
        rounds = take(columns.round_index, np.int64)
        out["round_index"] = pa.array(rounds, type=pa.int64(), mask=rounds < 0)
    return out


ENGINE_COLUMNS: dict[str, pa.DataType] = {
    "preemptions": pa.int64(),
    "cached_prefix_tokens": pa.int64(),
    "priority": pa.float64(),
    "slo_priority": pa.int64(),
    "kv_cpu_reloaded_blocks": pa.int64(),
    "kv_promoted_blocks": pa.int64(),
    "kv_deferrals": pa.int64(),
    "kv_fetch_wait_ms": pa.float64(),
}
"""The per-request columns the engine kernel collects (``engine/results.py: read_result``),
each a :class:`RequestColumns` field of the same name."""


def _engine_arrays(columns: RequestColumns, take) -> dict[str, pa.Array]:
    """The ENGINE_COLUMNS; nulls where RequestColumns does not know them."""
    out = {}
    for name, arrow_type in ENGINE_COLUMNS.items():
        values = getattr(columns, name)
        out[name] = (pa.nulls(len(columns), type=arrow_type) if values is None else
                     pa.array(take(values, arrow_type.to_pandas_dtype()), type=arrow_type))
    return out


def write_requests_parquet(path: str | os.PathLike, columns: RequestColumns) -> None:
    """Write ``requests.parquet`` atomically."""
    atomic_write_table(path, _stamped(requests_table(columns), "requests"))


def decisions_table(columns: dict) -> pa.Table:
    """The decision trace as a table with the ``schemas/decisions.json`` schema."""
    schema = load_schema("decisions")
    return pa.Table.from_pydict({f.name: columns[f.name] for f in schema}, schema=schema)


def write_decisions_parquet(path: str | os.PathLike, columns: dict) -> None:
    """Write ``decisions.parquet`` (one row per admission or routing decision), atomically."""
    atomic_write_table(path, _stamped(decisions_table(columns), "decisions"))
