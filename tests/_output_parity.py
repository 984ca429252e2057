"""Helpers for the output-layer tests: read the parity cases and rebuild typed inputs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from blis_fast.output.summary import InstanceMetrics, RequestColumns

try:
    from tests.parity import CASES_DIR as CASES
    from tests.parity import adopted_case_ids
except ImportError:
    from parity import CASES_DIR as CASES
    from parity import adopted_case_ids

# MetricsOutput field types (sim/metrics_utils.go): every other field is a float64.
INT_FIELDS = {
    "completed_requests",
    "still_queued",
    "still_running",
    "injected_requests",
    "total_input_tokens",
    "total_output_tokens",
    "kv_allocation_failures",
    "preemption_count",
    "dropped_unservable",
    "length_capped_requests",
    "timed_out_requests",
}
STR_FIELDS = {"instance_id"}
# RequestMetrics field types.
REQ_INT = {"num_prefill_tokens", "num_decode_tokens"}
REQ_STR = {"requestID", "slo_class", "tenant_id", "handled_by", "model"}
REQ_BOOL = {"length_capped"}


def case_dirs() -> list[Path]:
    """The folders of the parity cases of implemented families, less P/D cases (their cluster
    block and results are projected from sub-requests (output/pd.py), which a rebuild from the
    case files' per-instance blocks cannot reproduce; the parity suite checks them end to end,
    and tests/test_pd_invariants.py the projection's inputs) and the August reference's other cases
    (``head_extras``: their files carry keys and lines the April outputs rebuilt here do not
    have; the parity test compares them without those)."""
    return [CASES / name for name in adopted_case_ids()
            if "pd" not in _needs(name)
            and not json.loads((CASES / name / "case.json").read_text()).get("head_extras")]


def _needs(name: str) -> list[str]:
    return json.loads((CASES / name / "case.json").read_text()).get("needs", [])


def results_cases() -> list[Path]:
    """Case folders whose results.json is a MetricsOutput object."""
    out = []
    for d in case_dirs():
        f = d / "results.json"
        if f.is_file() and f.read_text().lstrip().startswith("{"):
            out.append(d)
    return out


def typed_metrics(d: dict) -> dict:
    """A parsed MetricsOutput with Go's field types restored (ints vs float64)."""
    out = {}
    for k, v in d.items():
        if k in STR_FIELDS:
            out[k] = v
        elif k in INT_FIELDS:
            out[k] = int(v)
        elif k == "requests":
            out[k] = [typed_request(r) for r in v]
        else:
            out[k] = float(v)
    return out


def typed_request(r: dict) -> dict:
    """A parsed RequestMetrics with Go's field types restored."""
    out = {}
    for k, v in r.items():
        if k in REQ_STR or k in REQ_BOOL:
            out[k] = v
        elif k in REQ_INT:
            out[k] = int(v)
        else:
            out[k] = float(v)
    return out


def load_results(case: Path) -> dict:
    """results.json of a case parsed in order."""
    return json.loads((case / "results.json").read_text(), object_pairs_hook=dict)


def ticks(ms_or_s: float, scale: float) -> int:
    """Integer ticks ``t`` with ``t / scale == value`` (checked)."""
    t = round(ms_or_s * scale)
    assert float(t) / scale == ms_or_s, (ms_or_s, scale)
    return t


def float_ticks(ms: float) -> float:
    """A float64 ``x`` with ``x / 1e3 == ms`` (the per-request mean ITL is not integral)."""
    x = ms * 1e3
    for cand in (x, np.nextafter(x, np.inf), np.nextafter(x, -np.inf)):
        if float(cand) / 1e3 == ms:
            return float(cand)
    raise AssertionError(ms)


def request_columns(records: list[dict], names: list[str] | None = None) -> RequestColumns:
    """Rebuild engine-style columns from results-file records (0 latency = absent);
    ``names`` gives the instance ids in index order (default ``instance_<i>``; autoscaled runs
    have others)."""
    n = len(records)
    ttft = np.full(n, np.nan)
    e2e = np.full(n, np.nan)
    itl = np.full(n, np.nan)
    sd = np.full(n, -1, dtype=np.int64)
    for i, r in enumerate(records):
        if r["ttft_ms"] > 0:
            ttft[i] = ticks(r["ttft_ms"], 1e3)
        if r["e2e_ms"] > 0:
            e2e[i] = ticks(r["e2e_ms"], 1e3)
            itl[i] = float_ticks(r["itl_ms"])
        if r["ttft_ms"] > 0 or r["scheduling_delay_ms"] > 0:
            sd[i] = ticks(r["scheduling_delay_ms"], 1e3)
    hb = [r.get("handled_by", "") for r in records]
    index = ({n: i for i, n in enumerate(names)} if names is not None
             else {h: int(h.split("_")[1]) for h in set(hb) if h})
    return RequestColumns(
        request_id=np.array([r["requestID"] for r in records], dtype=object),
        arrival_us=np.array([ticks(r["arrived_at"], 1e6) for r in records], dtype=np.int64),
        num_prefill_tokens=np.array([r["num_prefill_tokens"] for r in records], dtype=np.int64),
        num_decode_tokens=np.array([r["num_decode_tokens"] for r in records], dtype=np.int64),
        ttft_us=ttft,
        itl_us=itl,
        e2e_us=e2e,
        scheduling_delay_us=sd,
        handled_by=np.array([index[h] if h else -1 for h in hb], dtype=np.int32),
        slo_class=np.array([r.get("slo_class", "") for r in records], dtype=object),
        tenant_id=np.array([r.get("tenant_id", "") for r in records], dtype=object),
        model=np.array([r.get("model", "") for r in records], dtype=object),
        length_capped=np.array([r.get("length_capped", False) for r in records], dtype=bool),
        instance_names=names,
    )


def stdout_blocks(text: str) -> tuple[list[dict], str]:
    """Metrics JSON blocks of a stdout and the text after the last block."""
    blocks = []
    rest = text
    header = "=== Simulation Metrics ===\n"
    while rest.startswith(header):
        end = rest.index("\n}\n") + 3
        blocks.append(json.loads(rest[len(header) : end], object_pairs_hook=dict))
        rest = rest[end:]
    return blocks, rest


def instance_from_block(block: dict, req: RequestColumns, instance: int | None) -> InstanceMetrics:
    """InstanceMetrics whose counters come from a printed block and samples from the records."""
    sel = (
        np.ones(len(req), dtype=bool)
        if instance is None
        else np.asarray(req.handled_by) == instance
    )
    ttft = np.asarray(req.ttft_us)[sel]
    e2e = np.asarray(req.e2e_us)[sel]
    sd = np.asarray(req.scheduling_delay_us)[sel]
    return InstanceMetrics(
        completed=block["completed_requests"],
        still_queued=block["still_queued"],
        still_running=block["still_running"],
        dropped_unservable=block["dropped_unservable"],
        timed_out=block["timed_out_requests"],
        length_capped=block["length_capped_requests"],
        total_input_tokens=block["total_input_tokens"],
        total_output_tokens=block["total_output_tokens"],
        preemption_count=block["preemption_count"],
        kv_allocation_failures=block.get("kv_allocation_failures", 0),
        sim_ended_time_us=ticks(float(block["vllm_estimated_duration_s"]), 1e6),
        ttft_us=ttft[~np.isnan(ttft)],
        e2e_us=e2e[~np.isnan(e2e)],
        scheduling_delay_us=sd[sd >= 0],
    )


def section(rest: str, title: str) -> list[str]:
    """Lines of the stdout section ``=== title ===`` (without the header)."""
    lines = rest.splitlines()
    try:
        start = lines.index(f"=== {title} ===")
    except ValueError:
        return []
    out = []
    for line in lines[start + 1 :]:
        if line.startswith("=== "):
            break
        out.append(line)
    return out


def section_value(rest: str, title: str, label: str) -> str | None:
    """Value after ``label: `` inside a section."""
    for line in section(rest, title):
        m = re.fullmatch(rf"\s*{re.escape(label)}: (.*)", line)
        if m:
            return m.group(1)
    return None
