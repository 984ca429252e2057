"""``blis calibrate --adapter-reference``: BLIS's aggregates against a Digital-Twin reference
(LORA-9, August reference).

A LoRA run's workload-level TTFT (``ttft_mean_ms``) and output throughput
(``total_output_tokens / vllm_estimated_duration_s``) from a ``--metrics-path`` file are held
against the adapter-aware aggregates of a Digital-Twin (DT) reference JSON, per metric as the
absolute percentage error ``|blis - dt| / |dt|`` with a pass/fail bound. With the metrics of the
same workload run without adapters (``--sim-metrics-blind``) a second figure compares the
aware/blind *ratios* of both sides: the base latency model cancels out, leaving the adapter
costs alone.

Both input files are decoded as Go's non-strict ``encoding/json`` fills the reference's structs:
keys match field names case-insensitively (an exact match first), unknown keys are ignored,
``null`` or a missing key leaves the figure at 0, a later duplicate key wins (a repeated object
only overwrites the fields it names), and a value of the
wrong type (a string for a number, a fraction for an integer, a number out of float64 range)
makes the file unparsable. Beyond the reference, negative figures that make the comparison
meaningless are refused: a BLIS ``ttft_mean_ms`` or ``total_output_tokens`` below 0, and a DT
``adapter_blind`` TTFT or output throughput below 0.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from typing import Any

from blis_fast.errors import BlisConfigError, BlisInputError
from blis_fast.files import MAX_CONFIG_BYTES, MAX_TRACE_BYTES, read_input_bytes
from blis_fast.gofmt import go_g
from blis_fast.gonum import NumError, atoi, parse_float
from blis_fast.output.gojson import marshal_indent
from blis_fast.output.stats import go_fixed

__all__ = ["DEFAULT_MAPE_THRESHOLD", "BLISAggregate", "DTAggregate", "DTReference", "ape",
           "check_threshold", "compare", "load_blis_aggregate", "load_dt_reference",
           "load_sim_cache_hit_rate", "report_lines", "report_text"]

DEFAULT_MAPE_THRESHOLD = 0.20
"""``--adapter-mape-threshold`` when not given (the reference's SC-007 target)."""


@dataclass(frozen=True)
class DTAggregate:
    """One side (adapter-aware or adapter-blind) of a DT reference: mean TTFT in ms, output and
    total throughput in tokens/s (``total_throughput`` is read but never compared)."""

    ttft_ms: float = 0.0
    output_throughput: float = 0.0
    total_throughput: float = 0.0


@dataclass(frozen=True)
class DTReference:
    """A DT reference file: the model's name and its aware and blind aggregates."""

    model: str = ""
    adapter_aware: DTAggregate = DTAggregate()
    adapter_blind: DTAggregate = DTAggregate()


@dataclass(frozen=True)
class BLISAggregate:
    """BLIS's side, from a MetricsOutput JSON: mean TTFT in ms and output tokens/s."""

    ttft_ms: float
    output_throughput: float


# ------------------------------------------------------------------ Go encoding/json decoding


class _Number(str):
    """A JSON number literal kept as text, parsed later as the field's Go type wants it."""


class _Object(list):
    """A JSON object as its (key, value) pairs in file order (duplicates kept)."""


def _reject_constant(name: str) -> None:
    raise ValueError(f"invalid JSON literal {name}")


def _parse_json(data: bytes) -> Any:
    """Parse JSON text into str/_Number/_Object/list/bool/None, or raise ValueError."""
    text = data.decode("utf-8", errors="replace")  # Go replaces bad UTF-8 inside strings
    try:
        return json.loads(text, parse_int=_Number, parse_float=_Number,
                          parse_constant=_reject_constant, object_pairs_hook=_Object)
    except RecursionError:
        raise ValueError("the JSON nests too deeply") from None


_STR, _INT, _FLOAT, _ARRAY, _OBJECT, _ANY = "string", "int", "float64", "array", "object", "any"


def _shown(raw: Any) -> str:
    if isinstance(raw, _Number):
        return f"number {raw}"
    if isinstance(raw, str):
        return "string"
    if isinstance(raw, bool):
        return "bool"
    if isinstance(raw, _Object):
        return "object"
    return "array"


def _decode_value(raw: Any, kind: Any, key: str, earlier: Any) -> Any:
    """``raw`` as the Go type ``kind`` (a dict of fields for a struct, decoded over the
    ``earlier`` values of a repeated key, as Go fills the same struct); ValueError if unfit."""
    if isinstance(kind, dict):
        if not isinstance(raw, _Object):
            raise ValueError(f"cannot unmarshal {_shown(raw)} into {key} (an object)")
        return _decode_struct(raw, kind, key + ".", earlier)
    if kind == _ANY:
        return raw
    fits = {_STR: isinstance(raw, str) and not isinstance(raw, _Number),
            _INT: isinstance(raw, _Number), _FLOAT: isinstance(raw, _Number),
            _ARRAY: isinstance(raw, list) and not isinstance(raw, _Object),
            _OBJECT: isinstance(raw, _Object)}[kind]
    if fits and kind == _INT:
        try:
            return atoi(raw)
        except NumError:
            fits = False
    elif fits and kind == _FLOAT:
        try:
            return parse_float(raw)
        except NumError:
            fits = False
    if not fits:
        raise ValueError(f"cannot unmarshal {_shown(raw)} into {key} (of Go type {kind})")
    return raw


def _decode_struct(obj: _Object, fields: dict[str, Any], prefix: str = "",
                   earlier: dict[str, Any] | None = None) -> dict[str, Any]:
    """The values of a JSON object's known fields, matched as Go does: exact name first, else
    case-insensitively; unknown keys and nulls are skipped; a later duplicate overwrites (a
    repeated object only the fields it names)."""
    folded = {name.lower(): name for name in fields}
    values: dict[str, Any] = dict(earlier or {})
    for key, raw in obj:
        name = key if key in fields else folded.get(key.lower())
        if name is None or raw is None:
            continue
        values[name] = _decode_value(raw, fields[name], prefix + name, values.get(name))
    return values


def _decode_file(data: bytes, fields: dict[str, Any]) -> dict[str, Any]:
    """A whole file decoded into the struct ``fields`` (top-level ``null``: all zero)."""
    doc = _parse_json(data)
    if doc is None:
        return {}
    if not isinstance(doc, _Object):
        raise ValueError(f"cannot unmarshal {_shown(doc)} into a JSON object")
    return _decode_struct(doc, fields)


def _read_struct(path: str, limit: int, fields: dict[str, Any], read_fail: str,
                 parse_fail: str) -> dict[str, Any]:
    """The file ``path`` decoded into the struct ``fields``; an unreadable file raises
    ``read_fail: reason``, an unparsable one ``parse_fail: reason`` (the reference's wording)."""
    try:
        data = read_input_bytes(path, limit)
    except OSError as exc:
        raise BlisInputError(f"{read_fail}: {exc.strerror or exc}") from None
    try:
        return _decode_file(data, fields)
    except ValueError as exc:
        detail = f"invalid JSON: {exc}" if isinstance(exc, json.JSONDecodeError) else str(exc)
        raise BlisInputError(f"{parse_fail}: {detail}") from None


# ---------------------------------------------------------------------------------- inputs


def check_threshold(threshold: float) -> None:
    """``--adapter-mape-threshold`` must be a finite fraction above 0 (LORA-9.1)."""
    if not (math.isfinite(threshold) and threshold > 0):
        raise BlisConfigError(f"--adapter-mape-threshold must be a finite number > 0, got "
                              f"{go_g(threshold)}")


_DT_SIDE = {"ttft": _FLOAT, "output_throughput": _FLOAT, "total_throughput": _FLOAT}
_DT_FIELDS = {"model": _STR, "adapter_aware": _DT_SIDE, "adapter_blind": _DT_SIDE}


def _dt_side(values: dict[str, float] | None) -> DTAggregate:
    values = values or {}
    return DTAggregate(values.get("ttft", 0.0), values.get("output_throughput", 0.0),
                       values.get("total_throughput", 0.0))


def load_dt_reference(path: str) -> DTReference:
    """The DT reference of ``--adapter-reference``; its aware TTFT and output throughput must
    be positive (they are the denominators of the errors)."""
    values = _read_struct(path, MAX_CONFIG_BYTES, _DT_FIELDS,
                          f"reading adapter reference {path}", f"parsing adapter reference {path}")
    ref = DTReference(values.get("model", ""), _dt_side(values.get("adapter_aware")),
                      _dt_side(values.get("adapter_blind")))
    aware, blind = ref.adapter_aware, ref.adapter_blind
    if aware.ttft_ms <= 0 or aware.output_throughput <= 0:
        raise BlisInputError(f"adapter reference {path}: adapter_aware ttft/output_throughput "
                             f"must be positive (got ttft={go_g(aware.ttft_ms)} "
                             f"tput={go_g(aware.output_throughput)})")
    if blind.ttft_ms < 0 or blind.output_throughput < 0:
        raise BlisInputError(f"adapter reference {path}: adapter_blind ttft/output_throughput "
                             f"must be >= 0 (got ttft={go_g(blind.ttft_ms)} "
                             f"tput={go_g(blind.output_throughput)})")
    return ref


_METRICS_FIELDS: dict[str, Any] = {
    "instance_id": _STR, "cache_hit_rate": _FLOAT, "requests": _ARRAY, "adapters": _OBJECT,
    "saturation": _ANY, "per_class": _ANY, "goodput_rps": _FLOAT, "slo_attainment": _FLOAT,
    **dict.fromkeys(("completed_requests", "still_queued", "still_running", "injected_requests",
                     "total_input_tokens", "total_output_tokens", "kv_allocation_failures",
                     "preemption_count", "dropped_unservable", "length_capped_requests",
                     "timed_out_requests"), _INT),
    **dict.fromkeys(("vllm_estimated_duration_s", "responses_per_sec", "tokens_per_sec",
                     "e2e_mean_ms", "e2e_p90_ms", "e2e_p95_ms", "e2e_p99_ms", "ttft_mean_ms",
                     "ttft_p90_ms", "ttft_p95_ms", "ttft_p99_ms", "itl_mean_ms", "itl_p90_ms",
                     "itl_p95_ms", "itl_p99_ms", "scheduling_delay_p99_ms"), _FLOAT),
}
"""The top-level fields of the reference's MetricsOutput with their Go types (the elements of
``requests`` and ``adapters`` are not type-checked)."""


def load_blis_aggregate(path: str) -> BLISAggregate:
    """BLIS's aggregate TTFT and output throughput from a ``--metrics-path`` JSON file."""
    values = _read_struct(path, MAX_TRACE_BYTES, _METRICS_FIELDS,  # requests[] grows with runs
                          f"Failed to read sim metrics from {path}",
                          f"Failed to parse sim metrics JSON from {path}")
    duration = values.get("vllm_estimated_duration_s", 0.0)
    if duration <= 0:
        raise BlisInputError(f"sim metrics {path}: vllm_estimated_duration_s must be > 0 to "
                             f"compute throughput, got {go_g(duration)}")
    ttft = values.get("ttft_mean_ms", 0.0)
    tokens = values.get("total_output_tokens", 0)
    if ttft < 0 or tokens < 0:
        bad = ("ttft_mean_ms", go_g(ttft)) if ttft < 0 else ("total_output_tokens", tokens)
        raise BlisInputError(f"sim metrics {path}: {bad[0]} must be >= 0, got {bad[1]}")
    return BLISAggregate(ttft, float(tokens) / duration)


def load_sim_cache_hit_rate(path: str) -> float | None:
    """The aggregate ``cache_hit_rate`` of a ``--metrics-path`` JSON file (``blis calibrate
    --sim-metrics`` outside adapter mode, KVO-11.3); None when the key is absent or null (a
    file from ``blis run`` without the tier chain, or from the April reference). Beyond the
    reference, a rate outside [0, 1] is refused: no simulator writes one."""
    values = _read_struct(path, MAX_TRACE_BYTES, _METRICS_FIELDS, f"read --sim-metrics {path}",
                          f"parse --sim-metrics {path}")
    rate = values.get("cache_hit_rate")
    if rate is not None and not 0 <= rate <= 1:
        raise BlisInputError(f"--sim-metrics {path}: cache_hit_rate must be a fraction in "
                             f"[0, 1], got {go_g(rate)}")
    return rate


# ---------------------------------------------------------------------------- the comparison


def ape(blis: float, dt: float) -> float:
    """Absolute percentage error ``|blis - dt| / |dt|`` as a fraction; +Inf when ``dt`` is 0."""
    if dt == 0:
        return math.inf
    return abs(blis - dt) / abs(dt)


def compare(ref: DTReference, aware: BLISAggregate, blind: BLISAggregate | None,
            threshold: float) -> dict:
    """The report (an ordered dict, the reference's key order): ``ttft`` then ``throughput``,
    each with its error and verdict, and ``delta_mape`` where both blind values are non-zero."""
    specs = (("ttft", ref.adapter_aware.ttft_ms, aware.ttft_ms, ref.adapter_blind.ttft_ms,
              None if blind is None else blind.ttft_ms),
             ("throughput", ref.adapter_aware.output_throughput, aware.output_throughput,
              ref.adapter_blind.output_throughput,
              None if blind is None else blind.output_throughput))
    metrics = []
    for name, dt, blis, dt_base, blis_base in specs:
        mape = ape(blis, dt)
        metric: dict[str, Any] = {"metric": name, "dt_value": dt, "blis_value": blis,
                                  "mape": mape, "within_threshold": mape <= threshold}
        if blis_base is not None and dt_base != 0 and blis_base != 0:
            metric["delta_mape"] = ape(blis / blis_base, dt / dt_base)
        metrics.append(metric)
    return {"model": ref.model, "mape_threshold": threshold, "metrics": metrics,
            "all_within_threshold": all(m["within_threshold"] for m in metrics)}


def report_text(report: dict) -> str:
    """The report file's text (Go ``MarshalIndent``, two spaces, no trailing newline). A value
    that is not a finite number cannot be written as JSON (the reference fails there too)."""
    for i, metric in enumerate(report["metrics"]):
        for key, value in metric.items():
            if isinstance(value, float) and not math.isfinite(value):
                raise BlisInputError(f"adapter-reference report: metrics[{i}] ({metric['metric']}) "
                                     f"{key} is {go_g(value)}; JSON cannot hold it, no report "
                                     f"written")
    return marshal_indent(report)


def report_lines(report: dict, report_path: str, blind_given: bool) -> list[tuple[int, str]]:
    """The (logging level, message) lines logged on stderr after the report is written."""
    pct = report["mape_threshold"] * 100
    lines = [(logging.INFO, f"Adapter-reference comparison ({report['model']}) written to "
                            f"{report_path} (MAPE threshold {go_fixed(pct, 0)}%)")]
    for m in report["metrics"]:
        line = (f"  {m['metric']:<11} BLIS={go_fixed(m['blis_value'], 2)} "
                f"DT={go_fixed(m['dt_value'], 2)} MAPE={go_fixed(m['mape'] * 100, 1)}% "
                f"[{'WITHIN' if m['within_threshold'] else 'EXCEEDS'}]")
        if "delta_mape" in m:
            line += f" delta-normalized MAPE={go_fixed(m['delta_mape'] * 100, 1)}%"
        lines.append((logging.INFO if m["within_threshold"] else logging.WARNING, line))
    if blind_given:
        for m in report["metrics"]:
            if "delta_mape" not in m:
                lines.append((logging.WARNING,
                              f"delta-normalized diagnostic skipped for \"{m['metric']}\": the "
                              f"DT reference's adapter_blind {m['metric']} is zero or the BLIS "
                              f"blind aggregate is zero (aware/blind ratio undefined)."))
    if not report["all_within_threshold"]:
        lines.append((logging.WARNING,
                      f"SC-007 not satisfied on all metrics for {report['model']} at "
                      f"MAPE<={go_fixed(pct, 0)}% — that dimension's fidelity claim is "
                      f"unsupported for this config (design §15 falsification path). The "
                      f"comparison mechanism succeeded; the bound was not met."))
    return lines
