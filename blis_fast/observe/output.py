"""Files ``blis observe`` writes: trace v2 header + CSV, the ITL CSV, and Parquet (OBS-8).

The trace follows the April reference: header keys in its order (``trace_version: 2``, yaml.v3
style with 4-space nesting), the 27 trace v2 columns with Go csv quoting, rows in completion
order. All files of a run are first written to temporary files beside their targets and then
renamed, so an interrupted or failed run leaves either complete files or none.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from blis_fast.gofmt import go_g
from blis_fast.observe.orchestrator import Observed
from blis_fast.observe.quality import Quality, assess
from blis_fast.output.schemas import load_schema
from blis_fast.workload.trace_v2 import TRACE_V2_COLUMNS, go_csv_field
from blis_fast.workload.yaml_writer import yaml_string

ITL_HEADER = "request_id,chunk_index,timestamp_us\n"
QUALITY_COLUMNS = ("burst", "not_streamed", "client_late", "client_lag_us")
"""blis_fast-only trace columns (``--quality-columns``, issue 30), after the 27 of trace v2;
the reference's reader stops at its own columns, blis_fast's reads the lag
(``observe.quality.trace_client_lag_us``)."""

def trace_header(created_at: str, warmup: int, seed: int, workload_spec: str,
                 server_type: str, model: str, rtt_ms: float) -> str:
    """The observed trace's YAML header (OBS-8.2, April: ``trace_version: 2``)."""
    lines = [
        "trace_version: 2",
        "time_unit: us",
        f"created_at: {yaml_string(created_at)}",
        "mode: real",
        f"warm_up_requests: {int(warmup)}",
        f"workload_seed: {int(seed)}",
    ]
    if workload_spec:
        lines.append(f"workload_spec: {yaml_string(workload_spec)}")
    lines += ["server:", f"    type: {yaml_string(server_type)}", f"    model: {yaml_string(model)}"]
    if rtt_ms != 0:
        lines += ["network:", f"    measured_rtt_ms: {go_g(float(rtt_ms))}"]
    else:
        lines.append("network: {}")
    return "\n".join(lines) + "\n"


def row_fields(o: Observed) -> list[str]:
    """One trace row's 27 fields (OBS-8.1): suffix-only input, prefix 0 if it would be negative."""
    p, r, j = o.pending, o.record, o.job
    input_tokens = p.input_tokens - p.prefix_length
    prefix_len = p.prefix_length
    if input_tokens < 0:
        input_tokens, prefix_len = p.input_tokens, 0
    return [
        str(r.request_id), go_csv_field(p.client_id), go_csv_field(p.tenant_id),
        go_csv_field(p.slo_class), go_csv_field(j.session_id), str(j.round_index),
        go_csv_field(p.prefix_group), str(prefix_len), "true" if p.streaming else "false",
        str(input_tokens), str(r.output_tokens), "0", "0", "0", "0", "0",
        go_csv_field(p.model), str(p.deadline_us), str(r.server_input_tokens),
        str(j.arrival_us), str(r.send_time_us), str(r.first_chunk_time_us),
        str(r.last_chunk_time_us), str(r.num_chunks), go_csv_field(r.status),
        go_csv_field(r.error_message), go_csv_field(r.finish_reason),
    ]


def observed_quality(observed: Sequence[Observed]) -> Quality:
    """The observation-quality flags of the recorded requests (``observe.quality``)."""
    return assess(
        np.array([o.pending.streaming for o in observed], dtype=bool),
        np.array([o.record.status == "ok" for o in observed], dtype=bool),
        np.array([o.record.send_time_us for o in observed], dtype=np.int64),
        np.array([o.record.first_chunk_time_us for o in observed], dtype=np.int64),
        np.array([o.record.last_chunk_time_us for o in observed], dtype=np.int64),
        np.array([o.record.num_chunks for o in observed], dtype=np.int64),
        np.array([o.client_lag_us for o in observed], dtype=np.int64))


def trace_csv(observed: Sequence[Observed], quality_columns: bool = False) -> str:
    """The trace CSV text, header row included, rows in completion order; with
    ``quality_columns`` the :data:`QUALITY_COLUMNS` follow the reference's 27."""
    if not quality_columns:
        rows = [",".join(TRACE_V2_COLUMNS)] + [",".join(row_fields(o)) for o in observed]
        return "\n".join(rows) + "\n"
    q = observed_quality(observed)
    def tf(flag: np.bool_) -> str:
        return "true" if flag else "false"

    rows = [",".join(TRACE_V2_COLUMNS + QUALITY_COLUMNS)] + [
        ",".join([*row_fields(o), tf(q.burst[k]), tf(q.not_streamed[k]), tf(q.client_late[k]),
                  str(q.client_lag_us[k])])
        for k, o in enumerate(observed)]
    return "\n".join(rows) + "\n"


def itl_csv(itl: Sequence[tuple[int, int, int]]) -> str:
    """The ITL CSV (OBS-8.4): one row per chunk timestamp."""
    return ITL_HEADER + "".join(f"{a},{b},{c}\n" for a, b, c in itl)


def default_itl_path(trace_data: str) -> str:
    """``--trace-data`` with one trailing ``.csv`` removed, plus ``.itl.csv``."""
    base = trace_data[:-4] if trace_data.endswith(".csv") else trace_data
    return base + ".itl.csv"


def observed_table(observed: Sequence[Observed], start_wall_us: int) -> pa.Table:
    """The observed requests as an Arrow table with the ``observed_requests`` schema."""
    schema = load_schema("observed_requests")
    n = len(observed)
    i64 = {name: np.zeros(n, dtype=np.int64) for name in (
        "request_id", "round_index", "prefix_length", "input_tokens", "output_tokens",
        "server_input_tokens", "deadline_us", "arrival_time_us", "planned_send_time_us",
        "send_time_us", "first_chunk_time_us", "last_chunk_time_us", "num_chunks")}
    strs: dict[str, list[str]] = {name: [] for name in (
        "client_id", "tenant_id", "slo_class", "session_id", "prefix_group", "model", "status",
        "error_message", "finish_reason")}
    streaming = np.zeros(n, dtype=bool)
    for k, o in enumerate(observed):
        f = row_fields(o)
        p, r, j = o.pending, o.record, o.job
        vals = (r.request_id, j.round_index, int(f[7]), int(f[9]), r.output_tokens,
                r.server_input_tokens, p.deadline_us, j.arrival_us, start_wall_us + j.arrival_us,
                r.send_time_us, r.first_chunk_time_us, r.last_chunk_time_us, r.num_chunks)
        for name, v in zip(i64, vals, strict=True):
            i64[name][k] = v
        for name, v in (("client_id", p.client_id), ("tenant_id", p.tenant_id),
                        ("slo_class", p.slo_class), ("session_id", j.session_id),
                        ("prefix_group", p.prefix_group), ("model", p.model),
                        ("status", r.status), ("error_message", r.error_message),
                        ("finish_reason", r.finish_reason)):
            strs[name].append(v)
        streaming[k] = p.streaming
    ok = np.array([o.record.status == "ok" and o.record.first_chunk_time_us > 0
                   for o in observed], dtype=bool)
    q = observed_quality(observed)
    flags = {"burst": q.burst, "not_streamed": q.not_streamed, "client_late": q.client_late}
    ttft = (i64["first_chunk_time_us"] - i64["send_time_us"]) / 1e3
    e2e = (i64["last_chunk_time_us"] - i64["send_time_us"]) / 1e3
    cols = []
    for fld in schema:
        if fld.name in i64:
            cols.append(pa.array(i64[fld.name], type=fld.type))
        elif fld.name in strs:
            cols.append(pa.array(strs[fld.name], type=fld.type))
        elif fld.name == "streaming":
            cols.append(pa.array(streaming, type=fld.type))
        elif fld.name == "ttft_ms":
            cols.append(pa.array(ttft, type=fld.type, mask=~ok))
        elif fld.name == "e2e_ms":
            cols.append(pa.array(e2e, type=fld.type, mask=~ok))
        elif fld.name in flags:
            cols.append(pa.array(flags[fld.name], type=fld.type))
        elif fld.name == "client_lag_ms":
            cols.append(pa.array(q.client_lag_us / 1e3, type=fld.type,
                                 mask=q.client_lag_us < 0))
        else:  # pragma: no cover - the schema and this writer change together
            raise ValueError(f"observed_requests schema field {fld.name!r} has no writer")
    return pa.Table.from_arrays(cols, schema=schema)
