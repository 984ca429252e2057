"""Trace v2 loading and the requests of ``blis replay`` (WL-9.1, WL-9.4, WL-9.6, DELTA-60/63).

The header is strict YAML; the data CSV has 27 columns matched by position (and an optional
``adapter`` column found by name, LORA-8.5). Requests are
rebuilt in file order with token ids drawn from ``NewSource(--seed)``: the prefix of every
prefix group with a recorded length first, then per record its input and output ids.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field

import numpy as np

from blis_fast.config.kv_offload import decode_header_block
from blis_fast.config.strict_yaml import (
    as_float,
    as_int,
    as_str,
    decode_struct,
    is_null,
    mapping_items,
    parse_root,
)
from blis_fast.errors import BlisConfigError, BlisInputError
from blis_fast.files import MAX_TRACE_BYTES, read_input_text
from blis_fast.gofmt import go_quote, go_trim_space
from blis_fast.gonum import INT64_MAX, NumError, atoi, parse_float
from blis_fast.kernels.generation.replay_tokens import replay_digests
from blis_fast.kernels.generation.samplers import DIST_SEQUENCE
from blis_fast.kernels.go import gorand
from blis_fast.workload.generated import SessionBlueprint
from blis_fast.workload.request_table import RequestTable
from blis_fast.workload.samplers import SamplerSpec
from blis_fast.workload.trace_v2 import (
    OBSERVED_KV_SOURCE_TIERED,
    TRACE_V2_COLUMNS,
    ObservedKVMetrics,
    decode_observed_kv_metrics,
)

N_COLUMNS = 27
_SERVER = {"type": as_str, "model": as_str, "tensor_parallel": as_int, "max_num_seqs": as_int,
           "block_size": as_int, "gpu_memory_utilization": as_float, "max_model_len": as_int}
_HEADER = {
    "trace_version": as_int, "time_unit": as_str, "created_at": as_str, "mode": as_str,
    "warm_up_requests": as_int, "workload_spec": as_str, "workload_seed": as_int,
    "server": lambda ctx, n, w: decode_struct(ctx, n, w, _SERVER),
    "network": lambda ctx, n, w: decode_struct(ctx, n, w, {"measured_rtt_ms": as_float}),
    "kv_offload": decode_header_block,  # the tier chain's resolved config (KVO-11.1)
    "observed_kv_metrics": decode_observed_kv_metrics,  # observe's scraped hit rate (KVO-11.3)
}


@dataclass
class TraceRecords:
    """The columns of a trace's data file that replay uses."""

    request_id: np.ndarray
    client_id: list[str]
    tenant_id: list[str]
    slo_class: list[str]
    prefix_group: list[str]
    prefix_length: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    model: list[str]
    streaming: list[bool]
    deadline_us: np.ndarray
    arrival_us: np.ndarray
    session_id: list[str]
    round_index: np.ndarray
    text_tokens: np.ndarray
    image_tokens: np.ndarray
    audio_tokens: np.ndarray
    video_tokens: np.ndarray
    reason_ratio: np.ndarray
    # Observed-trace columns (``blis observe``): read for ``blis calibrate``, unused by replay.
    server_input_tokens: np.ndarray
    send_us: np.ndarray
    first_chunk_us: np.ndarray
    last_chunk_us: np.ndarray
    num_chunks: np.ndarray
    status: list[str]
    # LoRA adapter per row (LORA-8.5: a column found by its header name, trimmed; "" = none)
    adapter: list[str] = field(default_factory=list)


def load_trace_header(path: str) -> dict:
    """Parse the header YAML strictly (unknown keys are errors naming file and line)."""
    try:
        text = read_input_text(path)
    except (OSError, UnicodeDecodeError) as exc:
        raise BlisInputError(f"--trace-header: cannot read {path}: {exc}") from None
    with parse_root(text, path, "trace header") as (ctx, root):
        header = decode_struct(ctx, root, "trace header", _HEADER)
        lines = {key: knode.start_mark.line + 1
                 for key, knode, _ in (mapping_items(ctx, root, "trace header")
                                       if not is_null(root) else ())}
    # a header of another version or time unit would be replayed with the wrong meaning
    version = header.get("trace_version", 0)
    if version not in (0, 2):
        raise BlisInputError(f"--trace-header {path}:{lines['trace_version']}: trace_version "
                             f"{version} is not supported (only 2)")
    unit = header.get("time_unit", "")
    if unit not in ("", "microseconds", "us"):
        raise BlisInputError(f"--trace-header {path}:{lines['time_unit']}: time_unit "
                             f"{go_quote(unit)} is not supported (only microseconds)")
    return header


def check_observed_kv_replayable(header: dict, offload_on: bool) -> ObservedKVMetrics | None:
    """The header's ``observed_kv_metrics`` (None without it), refused when it was measured on
    vLLM's offload tiers (source ``tiered``) and this replay has no ``--kv-offload-config``
    chain: its GPU-only hit rate could not be held against the tiered one (KVO-11.3)."""
    observed = header.get("observed_kv_metrics")
    if observed is not None and observed.source == OBSERVED_KV_SOURCE_TIERED and not offload_on:
        raise BlisConfigError(
            f"the trace's observed_kv_metrics were captured from the tiered KV-offload counters "
            f"(source={go_quote(observed.source)}) but this replay has no offload config; replay "
            "would produce a GPU-only hit-rate that calibrate cannot compare against the tiered "
            "observation — pass --kv-offload-config <file> matching the observed deployment "
            "(INV-13, never silent degradation)")
    return observed


def _int(text: str, what: str, row: int, path: str, minimum: int | None = None) -> int:
    """A CSV integer field, read as the reference reads it (``strconv.Atoi`` / ``ParseInt(s,
    10, 64)``: both base 10, 64-bit, no spaces or ``_``)."""
    try:
        v = atoi(text)
    except NumError:
        raise BlisInputError(f"--trace-data {path}: row {row}: invalid {what} {text!r}") from None
    if not -(1 << 63) <= v <= INT64_MAX:
        raise BlisInputError(f"--trace-data {path}: row {row}: {what} {text} is outside the "
                             "64-bit integer range")
    if minimum is not None and v < minimum:
        raise BlisInputError(f"--trace-data {path}: row {row}: {what} must be >= {minimum}, got {v}")
    return v


def load_trace_records(path: str) -> TraceRecords:
    """Read the data CSV (WL-9.4 with DELTA-60's 27 columns); errors name file and row."""
    try:
        text = read_input_text(path, MAX_TRACE_BYTES, universal_newlines=False)
        rows = list(csv.reader(io.StringIO(text, newline="")))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise BlisInputError(f"--trace-data: cannot read {path}: {exc}") from None
    if not rows or not rows[0] or rows[0][0].strip().lstrip("\ufeff") != TRACE_V2_COLUMNS[0]:
        first = ",".join(rows[0])[:40] if rows else ""
        raise BlisInputError(f"--trace-data {path}: row 1: expected the header row "
                             f"({TRACE_V2_COLUMNS[0]},{TRACE_V2_COLUMNS[1]},...), got {first!r}")
    cols: dict[str, list] = {k: [] for k in TraceRecords.__dataclass_fields__}
    adapter_col = next((k for k, name in enumerate(rows[0]) if go_trim_space(name) == "adapter"),
                       -1)
    for row_no, f in enumerate(rows[1:], start=2):
        if adapter_col >= 0:
            cols["adapter"].append(go_trim_space(f[adapter_col]) if adapter_col < len(f) else "")
        if len(f) < N_COLUMNS:
            raise BlisInputError(f"--trace-data {path}: row {row_no}: CSV row has {len(f)} "
                                 f"columns, expected {N_COLUMNS}")
        cols["request_id"].append(_int(f[0], "request_id", row_no, path))
        cols["round_index"].append(_int(f[5], "round_index", row_no, path, 0))
        cols["prefix_length"].append(_int(f[7], "prefix_length", row_no, path, 0))
        if f[8] not in ("1", "t", "T", "TRUE", "true", "True", "0", "f", "F", "FALSE", "false",
                        "False"):
            raise BlisInputError(f"--trace-data {path}: row {row_no}: invalid streaming {f[8]!r}")
        cols["streaming"].append(f[8] in ("1", "t", "T", "TRUE", "true", "True"))
        cols["input_tokens"].append(_int(f[9], "input_tokens", row_no, path, 0))
        cols["output_tokens"].append(_int(f[10], "output_tokens", row_no, path, 0))
        for k, name in ((11, "text_tokens"), (12, "image_tokens"), (13, "audio_tokens"),
                        (14, "video_tokens")):
            cols[name].append(_int(f[k], name, row_no, path, 0))
        try:
            ratio = parse_float(f[15])
        except NumError:
            raise BlisInputError(f"--trace-data {path}: row {row_no}: invalid reason_ratio "
                                 f"{f[15]!r}") from None
        if not (math.isfinite(ratio) and 0 <= ratio <= 1):
            raise BlisInputError(f"--trace-data {path}: row {row_no}: reason_ratio must be in "
                                 f"[0, 1], got {ratio}")
        cols["reason_ratio"].append(ratio)
        deadline = _int(f[17], "deadline_us", row_no, path, 0)
        cols["server_input_tokens"].append(_int(f[18], "server_input_tokens", row_no, path, 0))
        arrival = _int(f[19], "arrival_time_us", row_no, path)
        for k, name, key in ((20, "send_time_us", "send_us"),
                             (21, "first_chunk_time_us", "first_chunk_us"),
                             (22, "last_chunk_time_us", "last_chunk_us")):
            cols[key].append(_int(f[k], name, row_no, path))
        cols["num_chunks"].append(_int(f[23], "num_chunks", row_no, path, 0))
        cols["status"].append(f[24])
        if deadline > 0 and arrival > 0 and deadline < arrival:
            raise BlisInputError(f"--trace-data {path}: row {row_no}: deadline_us {deadline} "
                                 f"is before arrival_time_us {arrival}")
        cols["deadline_us"].append(deadline)
        cols["arrival_us"].append(arrival)
        for key, k in (("client_id", 1), ("tenant_id", 2), ("slo_class", 3),
                       ("session_id", 4), ("prefix_group", 6), ("model", 16)):
            cols[key].append(f[k])
    ints = ("request_id", "prefix_length", "input_tokens", "output_tokens", "deadline_us",
            "arrival_us", "round_index", "text_tokens", "image_tokens", "audio_tokens",
            "video_tokens", "server_input_tokens", "send_us", "first_chunk_us", "last_chunk_us",
            "num_chunks")
    cols["reason_ratio"] = np.array(cols["reason_ratio"], dtype=np.float64)
    return TraceRecords(**{k: (np.array(v, dtype=np.int64) if k in ints else v)
                           for k, v in cols.items()})


def replay_horizon(arrivals: np.ndarray) -> int:
    """Default horizon (WL-9.7): twice the last arrival; 600 s if all at 0; none if empty."""
    if arrivals.size == 0:
        return INT64_MAX
    m = max(int(arrivals.max()), 0)
    if m > INT64_MAX // 2:
        return INT64_MAX
    if m <= 0:
        return 600_000_000
    return 2 * m


@dataclass
class ReplayedWorkload:
    """The requests a replay injects and, in closed-loop mode, the sessions it continues."""

    table: RequestTable
    sessions: list = field(default_factory=list)  # SessionBlueprint per closed-loop session


def replay_workload(rec: TraceRecords, seed: int, block_size: int, closed_loop: bool = False,
                    think_sampler: SamplerSpec | None = None,
                    horizon: int = INT64_MAX) -> ReplayedWorkload:
    """The requests of ``blis replay`` (WL-9.6, DELTA-63) and, with ``closed_loop``, the session
    blueprints of DELTA-65: each session's round 0 (sessions in first-appearance order), then
    the non-session records in file order; later rounds come from the blueprints.

    ``think_sampler`` (``--think-time-dist``/``--think-time-ms``) replaces the think times
    derived from the trace's arrival gaps; ``horizon`` bounds the follow-ups.
    """
    n = rec.arrival_us.shape[0]
    if n == 0:
        raise BlisInputError("--trace-data: empty trace")
    sessions: dict[str, list[int]] = {}
    if closed_loop:
        for i, sid in enumerate(rec.session_id):
            if sid:
                sessions.setdefault(sid, []).append(i)
        for sid, rows in sessions.items():
            rows.sort(key=lambda i: int(rec.round_index[i]))
            for k, i in enumerate(rows):
                if int(rec.round_index[i]) != k:
                    raise BlisInputError(
                        f"--trace-data: cannot build session blueprints: session {go_quote(sid)} "
                        f"has non-consecutive round indices (expected {k}, got "
                        f"{int(rec.round_index[i])})")
        order = np.array([rows[0] for rows in sessions.values()]
                         + [i for i, sid in enumerate(rec.session_id) if not sid], dtype=np.int64)
    else:
        order = np.arange(n, dtype=np.int64)
    own = np.zeros(n, dtype=np.int64)
    own[: len(sessions)] = 1
    group_code: dict[str, int] = {}
    group_len: list[int] = []
    for g, plen in zip(rec.prefix_group, rec.prefix_length.tolist(), strict=True):
        if g and plen > 0 and g not in group_code:
            group_code[g] = len(group_len)
            group_len.append(int(plen))
    groups = [rec.prefix_group[i] for i in order.tolist()]
    prefix_of = np.array([group_code.get(g, -1) for g in groups], dtype=np.int64)
    prefix_len = np.array(group_len, dtype=np.int64)
    inp = rec.input_tokens[order]
    out = rec.output_tokens[order]
    offsets, digests, streams, prefix_tok, p_off = replay_digests(
        gorand.new_source(seed), prefix_len, prefix_of, inp, out, block_size, own)
    plen_row = np.where(prefix_of >= 0, prefix_len[np.maximum(prefix_of, 0)]
                        if len(group_len) else 0, 0)
    clients: list[dict] = []
    client_code: dict[tuple, int] = {}
    cidx = np.empty(order.shape[0], dtype=np.int32)
    for k, i in enumerate(order.tolist()):
        key = (rec.client_id[i], rec.tenant_id[i], rec.slo_class[i], rec.model[i],
               rec.prefix_group[i], rec.streaming[i])
        if key not in client_code:
            client_code[key] = len(clients)
            clients.append({"id": key[0], "tenant_id": key[1], "slo_class": key[2],
                            "model": key[3], "prefix_group": key[4], "streaming": key[5]})
        cidx[k] = client_code[key]
    names = list(dict.fromkeys(rec.session_id[i] for i in order.tolist() if rec.session_id[i]))
    name_code = {name: k for k, name in enumerate(names)}
    table = RequestTable(
        arrival_us=rec.arrival_us[order], input_len=(inp + plen_row).astype(np.int64),
        output_len=out.copy(), max_output_len=out.copy(), deadline_us=rec.deadline_us[order],
        prefix_length=rec.prefix_length[order], client_idx=cidx, chunk_offsets=offsets,
        chunk_digests=digests, clients=clients, block_size=block_size, seed=seed,
        request_numbers=rec.request_id[order],
        session_idx=np.array([name_code.get(rec.session_id[i], -1) for i in order.tolist()],
                             dtype=np.int32),
        round_index=rec.round_index[order].astype(np.int32),
        text_tokens=rec.text_tokens[order], image_tokens=rec.image_tokens[order],
        audio_tokens=rec.audio_tokens[order], video_tokens=rec.video_tokens[order],
        reason_ratio=rec.reason_ratio[order], sessions=names,
        **_adapter_fields(rec, order),
    )
    blueprints = []
    for k, (sid, rows) in enumerate(sessions.items()):
        r0 = rows[0]
        g = prefix_of[k]
        prefix = prefix_tok[p_off[g]: p_off[g + 1]] if g >= 0 else np.zeros(0, np.int64)
        think = think_sampler
        if think is None and len(rows) > 1:
            gaps = np.maximum(np.diff(rec.arrival_us[rows]), 0)
            think = SamplerSpec(DIST_SEQUENCE, gaps.astype(np.float64))
        blueprints.append(SessionBlueprint(
            session_id=sid, client_id=rec.client_id[r0], client_idx=int(cidx[k]), seed=0,
            max_rounds=len(rows), unlimited_rounds=False, context_growth="", think_time_us=0,
            timeout=None, horizon=horizon if horizon > 0 else INT64_MAX,
            input_sampler=SamplerSpec(DIST_SEQUENCE,
                                      rec.input_tokens[rows[1:]].astype(np.float64)),
            output_sampler=SamplerSpec(DIST_SEQUENCE,
                                       rec.output_tokens[rows[1:]].astype(np.float64)),
            prefix=prefix, tenant_id=rec.tenant_id[r0], slo_class=rec.slo_class[r0],
            model=rec.model[r0], round0_row=k, think_sampler=think, rng_state=streams[k]))
    return ReplayedWorkload(table, blueprints)


def _adapter_fields(rec: TraceRecords, order: np.ndarray) -> dict:
    """The table's adapter columns from the trace's ``adapter`` column (LORA-1.9: ids are
    kept as given, registered or not); none when no row names an adapter."""
    if not any(rec.adapter):
        return {}
    names = [rec.adapter[i] for i in order.tolist()]
    code = {name: k for k, name in enumerate(dict.fromkeys(n for n in names if n))}
    idx = np.array([code.get(n, -1) for n in names], dtype=np.int32)
    return {"adapter_idx": idx, "adapter_names": tuple(code)}


def max_injected_arrival(rec: TraceRecords, closed_loop: bool) -> np.ndarray:
    """Arrivals of the records a replay injects up front (closed loop: no rounds >= 1)."""
    if not closed_loop:
        return rec.arrival_us
    keep = np.array([not (sid and r != 0) for sid, r in
                     zip(rec.session_id, rec.round_index.tolist(), strict=True)], dtype=bool)
    return rec.arrival_us[keep]
