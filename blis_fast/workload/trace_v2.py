"""Trace v2 export of a run (``blis run --trace-output P``): ``P.yaml`` + ``P.csv``.

Follows the April reference (WL-9.1-9.5 as amended by DELTA-60/61/62): a 27-column CSV (a
28th, ``adapter``, when some request carries a LoRA adapter: LORA-8.5),
Go ``encoding/csv`` quoting, and a YAML header carrying ``workload_seed``. Columns are
built with NumPy and written with a single join, so 100k rows take well under a second.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import repeat
from pathlib import Path

import numpy as np
import yaml

from blis_fast.config.kv_offload import KVOffloadConfig
from blis_fast.config.strict_yaml import (
    YamlContext,
    as_float,
    as_int,
    as_str,
    decode_struct,
    is_null,
)
from blis_fast.files import OutputPlan
from blis_fast.gofmt import go_f
from blis_fast.workload.request_table import RequestTable
from blis_fast.workload.yaml_writer import yaml_float, yaml_string

TRACE_V2_COLUMNS = (
    "request_id",
    "client_id",
    "tenant_id",
    "slo_class",
    "session_id",
    "round_index",
    "prefix_group",
    "prefix_length",
    "streaming",
    "input_tokens",
    "output_tokens",
    "text_tokens",
    "image_tokens",
    "audio_tokens",
    "video_tokens",
    "reason_ratio",
    "model",
    "deadline_us",
    "server_input_tokens",
    "arrival_time_us",
    "send_time_us",
    "first_chunk_time_us",
    "last_chunk_time_us",
    "num_chunks",
    "status",
    "error_message",
    "finish_reason",
)
"""The 27 trace v2 data columns, in order (DELTA-60)."""

STATUS_OK = 0
STATUS_TIMED_OUT = 1
STATUS_INCOMPLETE = 2
_STATUS_TEXT = ("ok", "timeout", "incomplete")


@dataclass(frozen=True)
class TraceOutcome:
    """Per-request simulation outcome needed by the trace (arrays aligned with the table rows)."""

    status: np.ndarray  # int8: 0 completed, 1 timed out, 2 anything else (incomplete, dropped)
    ttft_us: np.ndarray  # int64: time to first token (µs); -1 when no first token
    itl_sum_us: np.ndarray  # int64: sum of the request's inter-token latencies (µs)


OBSERVED_KV_SOURCE_TIERED = "tiered"
"""``observed_kv_metrics.source`` of a hit rate from vLLM's multi-tier offload counters."""
OBSERVED_KV_SOURCE_GPU = "gpu-prefix-cache-fallback"
"""``observed_kv_metrics.source`` of a hit rate from the GPU prefix cache alone (a weaker
signal: no offload tier is seen)."""


@dataclass(frozen=True)
class ObservedKVMetrics:
    """The ``observed_kv_metrics:`` key of an observed trace's header (KVO-11.3): the real
    server's KV-cache hit rate over the observation window, from two scrapes of its
    Prometheus ``/metrics``. ``blis calibrate`` holds it against the simulator's aggregate
    ``cache_hit_rate``; ``blis replay --trace-output`` copies it unchanged, since a replay
    cannot measure it again."""

    source: str
    hit_rate: float
    block_hits: int = 0  # counter deltas over the window (summed over label sets)
    block_queries: int = 0
    read_time_total: float = 0.0  # tiered only: read/write time deltas (vLLM's seconds)
    write_time_total: float = 0.0
    vllm_commit: str = ""  # --vllm-commit, as given

    def header_text(self) -> str:
        """The key as yaml.v3 writes the reference's struct (indent 4, ``omitempty`` on the
        times and the commit)."""
        lines = ["observed_kv_metrics:", f"    source: {yaml_string(self.source)}",
                 f"    hit_rate: {yaml_float(self.hit_rate)}",
                 f"    block_hits: {int(self.block_hits)}",
                 f"    block_queries: {int(self.block_queries)}"]
        if self.read_time_total != 0:
            lines.append(f"    read_time_total: {yaml_float(self.read_time_total)}")
        if self.write_time_total != 0:
            lines.append(f"    write_time_total: {yaml_float(self.write_time_total)}")
        if self.vllm_commit:
            lines.append(f"    vllm_commit: {yaml_string(self.vllm_commit)}")
        return "\n".join(lines) + "\n"


def decode_observed_kv_metrics(ctx: YamlContext, node: yaml.Node, what: str) -> ObservedKVMetrics | None:
    """A trace header's ``observed_kv_metrics:`` key, strictly (an unknown sub-key is an
    error naming it; absent ones are zero, as Go leaves them); None when null."""
    if is_null(node):
        return None
    fields = {"source": as_str, "hit_rate": as_float, "block_hits": as_int,
              "block_queries": as_int, "read_time_total": as_float,
              "write_time_total": as_float, "vllm_commit": as_str}
    values = decode_struct(ctx, node, what, fields)
    return ObservedKVMetrics(**{"source": "", "hit_rate": 0.0, **values})


# Unicode White_Space as Go's unicode.IsSpace sees it (Python's isspace() is broader).
_GO_SPACE = frozenset(
    "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008"
    "\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)


def go_csv_field(field: str) -> str:
    """Quote one field the way Go's ``csv.Writer`` does (comma ``,``, ``\\n`` line ends)."""
    if field == "":
        return field
    needs = (
        field == "\\."
        or "," in field
        or '"' in field
        or "\r" in field
        or "\n" in field
        or field[0] in _GO_SPACE
    )
    if not needs:
        return field
    return '"' + field.replace('"', '""') + '"'


def _int_strings(a: np.ndarray) -> list[str] | str:
    """Decimal text of an integer array (a list of str; one str if all values agree)."""
    a = np.asarray(a, dtype=np.int64)
    if a.size and a[0] == a.min() == a.max():
        return str(int(a[0]))
    return list(map(str, a.tolist()))


def _ratio_strings(ratio: np.ndarray) -> np.ndarray:
    """``strconv.FormatFloat(r, 'f', -1, 64)`` of every reason ratio (few distinct values)."""
    uniq, inv = np.unique(ratio, return_inverse=True)
    if uniq.shape[0] == 1:
        return go_f(float(uniq[0]))
    text = np.array([go_f(float(v)) for v in uniq], dtype=object)
    return text[inv.reshape(-1)]


def build_trace_csv(table: RequestTable, outcome: TraceOutcome,
                    sort_by_arrival: bool = True) -> str:
    """Return the whole trace v2 CSV text (header row included) for ``table`` rows in order.

    Per row: client/tenant/SLO/model come from the row's client; ``session_id`` and
    ``round_index`` from the session columns; ``prefix_group`` and ``streaming`` from the
    client except on the engine's session follow-ups (they carry neither, WL-6.5); prefix length,
    multimodal counts and ``reason_ratio`` are per row (DELTA-62: ``input_tokens`` excludes the
    prefix).
    """
    n = table.n
    adapters = table.adapter_idx is not None and bool(np.any(table.adapter_idx >= 0))
    # LORA-8.5: a trailing ``adapter`` column only when some request carries an adapter
    header = ",".join(TRACE_V2_COLUMNS + (("adapter",) if adapters else ())) + "\n"
    if n == 0:
        return header
    status = np.asarray(outcome.status, dtype=np.int64)
    ttft = np.asarray(outcome.ttft_us, dtype=np.int64)
    itl = np.asarray(outcome.itl_sum_us, dtype=np.int64)
    if status.shape != (n,) or ttft.shape != (n,) or itl.shape != (n,):
        raise ValueError(f"TraceOutcome arrays must all have length {n}")
    if np.any((status < 0) | (status > 2)):
        raise ValueError("TraceOutcome.status must hold 0, 1 or 2")

    # ``blis run`` stable-sorts by arrival before numbering rows (follow-ups come last in the
    # table); ``blis replay`` exports its requests in injection order (DELTA-64)
    order = (np.argsort(table.arrival_us, kind="stable") if sort_by_arrival
             else np.arange(n, dtype=np.int64))
    arrival = table.arrival_us[order]
    prefix = table.prefix_length[order]
    inp = table.input_len[order]
    cidx = table.client_idx[order]
    rnd = table.round_index[order]
    status, ttft, itl = status[order], ttft[order], itl[order]

    # DELTA-62: prefix reported separately; input_tokens is the suffix length.
    bad = prefix > inp
    prefix = np.where(bad, 0, prefix)
    suffix = inp - prefix
    has_first = ttft >= 0
    first = np.where(has_first, arrival + ttft, 0)
    last = np.where(has_first, arrival + ttft + itl, 0)

    clients = table.clients or [{}]
    head = np.array(
        [
            ",".join(
                (
                    go_csv_field(str(c.get("id", ""))),
                    go_csv_field(str(c.get("tenant_id", ""))),
                    go_csv_field(str(c.get("slo_class", ""))),
                )
            )
            for c in clients
        ],
        dtype=object,
    )
    group = np.array([go_csv_field(str(c.get("prefix_group", ""))) for c in clients],
                     dtype=object)
    streaming = np.array(["true" if c.get("streaming", False) else "false" for c in clients],
                         dtype=object)
    model = np.array([go_csv_field(str(c.get("model", ""))) for c in clients], dtype=object)
    # engine-made session follow-ups (the last rows) carry no prefix group and no streaming
    engine_made = np.zeros(n, dtype=bool)
    engine_made[n - len(table.extra_ids):] = bool(table.extra_ids)
    followup = engine_made[order]
    if followup.any():
        group_col = np.where(followup, "", group[cidx]).astype(object)
        stream_col = np.where(followup, "false", streaming[cidx]).astype(object)
    else:
        group_col = group[cidx]
        stream_col = streaming[cidx]
    if table.sessions:
        sess_names = np.array([go_csv_field(x) for x in table.sessions] + [""], dtype=object)
        sess_col = sess_names[table.session_idx[order]]
    else:
        sess_col = ""
    status_txt = np.array([s + ",," for s in _STATUS_TEXT], dtype=object)

    arr_s = _int_strings(arrival)
    # one list of cell texts per column, joined row by row: a join per row copies each cell
    # once, where adding 27 object arrays copied every row's growing prefix 27 times
    columns = [
        list(map(str, range(n))),
        head[cidx],
        sess_col,
        _int_strings(rnd),
        group_col,
        _int_strings(prefix),
        stream_col,
        _int_strings(suffix),
        _int_strings(table.output_len[order]),
        _int_strings(table.text_tokens[order]),
        _int_strings(table.image_tokens[order]),
        _int_strings(table.audio_tokens[order]),
        _int_strings(table.video_tokens[order]),
        _ratio_strings(table.reason_ratio[order]),
        model[cidx],
        _int_strings(table.deadline_us[order]),
        "0",  # server_input_tokens
        arr_s,
        arr_s,  # send_time_us = arrival
        _int_strings(first),
        _int_strings(last),
        "0",  # num_chunks
        status_txt[status],  # status, error_message (empty), finish_reason (empty)
    ]
    if adapters:
        names = np.array([go_csv_field(a) for a in table.adapter_names] + [""], dtype=object)
        columns.append(names[table.adapter_idx[order]])
    cells = [repeat(c, n) if isinstance(c, str) else c if isinstance(c, list) else c.tolist()
             for c in columns]
    rows = map(",".join, zip(*cells, strict=True))
    return header + "\n".join(rows) + "\n"


def build_trace_header(seed: int | None, mode: str = "generated", kv_offload: str = "",
                       observed_kv: ObservedKVMetrics | None = None) -> str:
    """The trace v2 YAML header of a run export (WL-9.5, DELTA-61), or of a replay export
    (``mode="replayed"``, no seed; DELTA-64); ``kv_offload`` is the ``kv_offload:`` key's text
    of a run with the tier chain (``kv_offload_header_text``, KVO-11.1);
    ``observed_kv`` the replayed trace's ``observed_kv_metrics`` (KVO-11.3), copied last."""
    text = f"trace_version: 2\ntime_unit: microseconds\nmode: {mode}\nwarm_up_requests: 0\n"
    if seed is not None:
        text += f"workload_seed: {int(seed)}\n"
    return text + kv_offload + ("" if observed_kv is None else observed_kv.header_text())


def export_trace_v2(prefix: str | Path, table: RequestTable, outcome: TraceOutcome,
                    replayed: bool = False) -> None:
    """Write ``<prefix>.yaml`` and ``<prefix>.csv``, as ``--trace-output`` does."""
    with OutputPlan() as plan:
        for path, text in trace_v2_files(prefix, table, outcome, replayed):
            plan.stage_text(path, "--trace-output", text)
        plan.commit()


def trace_v2_files(prefix: str | Path, table: RequestTable, outcome: TraceOutcome,
                   replayed: bool = False, kv_offload: str = "",
                   observed_kv: ObservedKVMetrics | None = None) -> list[tuple[str, str]]:
    """``(path, text)`` of the two files of ``--trace-output <prefix>`` (header, then data);
    ``kv_offload`` and ``observed_kv`` as :func:`build_trace_header` takes them."""
    base = str(prefix)
    header = build_trace_header(None if replayed else table.seed,
                                "replayed" if replayed else "generated", kv_offload,
                                observed_kv)
    data = build_trace_csv(table, outcome, sort_by_arrival=not replayed)
    return [(base + ".yaml", header), (base + ".csv", data)]


# ---------------------------------------------------------------------------------------------
# The trace header's kv_offload: key (KVO-11.1, KVO-11.2)


def kv_offload_header_text(cfg: KVOffloadConfig | None) -> str:
    """The ``kv_offload:`` key of a trace header as the reference writes it (yaml.v3, indent
    4); "" without a configuration."""
    if cfg is None:
        return ""
    def b(v: bool) -> str:
        return "true" if v else "false"

    lines = ["kv_offload:",
             f"    cpu_bytes_to_use: {cfg.cpu_bytes_to_use}",
             f"    per_block_bytes: {cfg.per_block_bytes}",
             f"    block_size: {cfg.block_size}",
             f"    blocks_per_chunk: {cfg.blocks_per_chunk}",
             f"    tokens_per_hash: {cfg.tokens_per_hash}",
             f"    eviction_policy: {yaml_string(cfg.eviction_policy)}",
             f"    offload_prompt_only: {b(cfg.offload_prompt_only)}",
             f"    self_describing_kv_events: {b(cfg.self_describing_kv_events)}"]
    if cfg.tiers:
        lines.append("    secondary_tiers:")
    for t in cfg.tiers:
        pairs = [("type", yaml_string(t.type)), ("root_dir", yaml_string(t.root_dir)),
                 ("n_read_threads", str(t.n_read_threads)),
                 ("n_write_threads", str(t.n_write_threads))]
        if t.locality:
            pairs.append(("locality", yaml_string(t.locality)))
        pairs += [("enable_kv_events", b(t.enable_kv_events)), ("direct_io", b(t.direct_io))]
        if t.device_class:
            pairs.append(("device_class", yaml_string(t.device_class)))
        pairs += [("read_bandwidth", yaml_float(t.read_bandwidth)),
                  ("write_bandwidth", yaml_float(t.write_bandwidth)),
                  ("base_latency", yaml_float(t.base_latency)),
                  ("saturation_queue_depth", str(t.saturation_queue_depth)),
                  ("single_transfer_fraction", yaml_float(t.single_transfer_fraction)),
                  ("latency_jitter_stddev", yaml_float(t.latency_jitter_stddev))]
        for n, (key, value) in enumerate(pairs):
            lines.append(f"        {'- ' if n == 0 else '  '}{key}: {value}")
    return "\n".join(lines) + "\n"
