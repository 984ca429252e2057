"""Workload parity for the spec-file and concurrency parity cases (WL-4..WL-8, DELTA-46..62).

For every parity case that runs ``blis run`` with ``--workload-spec`` or ``--concurrency``, the
workload is regenerated with :func:`generate_workload` and compared with the reference's
``trace.csv`` on every column that depends only on workload generation. Session follow-ups
(rounds >= 1 of closed-loop and concurrency sessions) are produced by the engine from the
session blueprints while it runs, so those rows are left out of the row-by-row comparison;
their draws are checked separately against the blueprints' own RNG streams.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import yaml
from parity import CASES_DIR, case_distribution_params, run_case_params

from blis_fast.errors import BlisInputError
from blis_fast.gonum import INT64_MAX
from blis_fast.kernels.generation.samplers import sample_length
from blis_fast.kernels.generation.token_ids import skip_token_ids
from blis_fast.kernels.go.gorand import new_source
from blis_fast.workload.generated import apply_timeout_to_workload
from blis_fast.workload.generator import generate_workload
from blis_fast.workload.precedence import (
    resolve_horizon,
    resolve_max_requests,
    resolve_workload_seed,
)
from blis_fast.workload.spec import apply_timeout_to_spec
from blis_fast.workload.spec_yaml import load_workload_spec
from blis_fast.workload.synthesis import (
    synthesize_concurrency,
    validate_distribution_params,
)
from blis_fast.workload.trace_v2 import TraceOutcome, build_trace_csv, export_trace_v2

WORKLOAD_COLUMNS = (
    "client_id", "tenant_id", "slo_class", "session_id", "round_index", "prefix_group",
    "prefix_length", "streaming", "input_tokens", "output_tokens", "text_tokens",
    "image_tokens", "audio_tokens", "video_tokens", "reason_ratio", "model", "deadline_us",
    "arrival_time_us",
)
def _cases() -> list:
    """The spec-driven run cases; one that exports no trace (no ``--trace-output``, e.g. some
    LoRA twins) has no reference rows to compare and is skipped."""
    params = []
    for p in run_case_params(True, "invalid input: checked by test_invalid_spec_case"):
        if not p.marks and not (CASES_DIR / p.id / "trace.csv").is_file():
            skip = pytest.mark.skip(reason="the case exports no trace (no --trace-output)")
            p = pytest.param(*p.values, id=p.id, marks=[skip])
        params.append(p)
    return params


def _regenerate(case_dir: Path, flags: dict[str, str]):
    """The reference's run-path workload for the case's flags (WL-1, DELTA-28/29)."""
    seed = int(flags.get("--seed", 42))
    block = int(flags.get("--block-size-in-tokens", 16))
    timeout = int(flags.get("--timeout", 300))
    if "--workload-spec" in flags:
        spec = load_workload_spec(str(case_dir / flags["--workload-spec"]))
        spec.seed = resolve_workload_seed(spec.seed, seed, "--seed" in flags)
        horizon = resolve_horizon(spec.horizon, int(flags.get("--horizon", INT64_MAX)),
                                  "--horizon" in flags)
        apply = "--timeout" in flags
    else:
        p = case_distribution_params(flags)
        validate_distribution_params(p)
        n_given = int(flags["--num-requests"]) if "--num-requests" in flags else 0
        spec = synthesize_concurrency(p, int(flags["--concurrency"]),
                                      int(flags.get("--think-time-ms", 0)), n_given, seed)
        horizon = int(flags.get("--horizon", INT64_MAX))
        apply = True
    if apply:
        apply_timeout_to_spec(spec, timeout)
    max_requests = resolve_max_requests(spec.num_requests, int(flags.get("--num-requests", 100)),
                                        "--num-requests" in flags)
    wl = generate_workload(spec, horizon, max_requests, block)
    if apply:
        wl = apply_timeout_to_workload(wl, timeout)
    return spec, wl


def _read(case_dir: Path):
    with open(case_dir / "trace.csv", encoding="utf-8", newline="") as f:
        ref = list(csv.DictReader(f))
    with open(case_dir / "trace.yaml", encoding="utf-8") as f:
        header = yaml.safe_load(f)
    return ref, header


def _ours(table) -> list[dict]:
    n = table.n
    out = TraceOutcome(np.zeros(n, np.int8), np.full(n, -1, np.int64), np.zeros(n, np.int64))
    return list(csv.DictReader(build_trace_csv(table, out).splitlines()))


@pytest.mark.parametrize(("name", "case", "flags"), _cases())
def test_workload_columns_match_reference(name, case, flags):
    """Every pre-generated row equals the reference's, column for column, in order."""
    case_dir = CASES_DIR / name
    spec, wl = _regenerate(case_dir, flags)
    ref, header = _read(case_dir)
    assert header["workload_seed"] == spec.seed
    followup_ids = {b.session_id for b in wl.sessions}
    # Follow-ups (engine-generated rounds >= 1 of blueprint sessions) are skipped here.
    pre = [r for r in ref if not (r["session_id"] in followup_ids and r["round_index"] != "0")]
    ours = _ours(wl.table)
    assert len(ours) == len(pre), (len(ours), len(pre), len(ref))
    cols = WORKLOAD_COLUMNS + (("request_id",) if len(pre) == len(ref) else ())
    for i, (o, r) in enumerate(zip(ours, pre, strict=True)):
        for c in cols:
            assert o[c] == r[c], (name, i, c, o[c], r[c])


@pytest.mark.parametrize(("name", "case", "flags"), _cases())
def test_follow_up_draws_come_from_blueprint_streams(name, case, flags):
    """Blueprint seeds and samplers reproduce the reference's follow-up lengths (DELTA-47/48)."""
    case_dir = CASES_DIR / name
    _spec, wl = _regenerate(case_dir, flags)
    if not wl.sessions:
        pytest.skip("no session blueprints in this workload")
    ref, _header = _read(case_dir)
    by_session: dict[str, list[dict]] = {}
    for r in ref:
        if r["round_index"] != "0":
            by_session.setdefault(r["session_id"], []).append(r)
    checked = 0
    for b in wl.sessions:
        rows = sorted(by_session.get(b.session_id, []), key=lambda r: int(r["round_index"]))
        s = new_source(b.seed)
        for r in rows:
            i = sample_length(s, b.input_sampler.code, b.input_sampler.params)
            o = sample_length(s, b.output_sampler.code, b.output_sampler.params)
            skip_token_ids(s, i + o)
            assert int(r["output_tokens"]) == o, (b.session_id, r["round_index"])
            if b.context_growth != "accumulate":
                assert int(r["input_tokens"]) == len(b.prefix) + i
            elif r["round_index"] == "1":
                # DELTA-46: round 1 = P + I0 + (o0 - 1 generated tokens) + n1
                assert int(r["input_tokens"]) == (len(b.prefix) + len(b.round0_input)
                                                  + len(b.round0_output) - 1 + i)
            checked += 1
    assert checked > 0


@pytest.mark.parametrize(("name", "case", "flags"), _cases())
def test_trace_export_is_byte_identical_without_follow_ups(name, case, flags, tmp_path):
    """With the reference's outcomes, the exported trace is the reference's file, byte for byte."""
    case_dir = CASES_DIR / name
    spec, wl = _regenerate(case_dir, flags)
    ref, _header = _read(case_dir)
    if len(ref) != wl.table.n:
        pytest.skip("the trace holds engine-generated follow-ups: test_parity compares this case's whole run")
    codes = {"ok": 0, "timeout": 1, "incomplete": 2}
    arrival = np.array([int(r["arrival_time_us"]) for r in ref], dtype=np.int64)
    first = np.array([int(r["first_chunk_time_us"]) for r in ref], dtype=np.int64)
    last = np.array([int(r["last_chunk_time_us"]) for r in ref], dtype=np.int64)
    has = first != 0
    outcome = TraceOutcome(np.array([codes[r["status"]] for r in ref], dtype=np.int8),
                           np.where(has, first - arrival, -1), np.where(has, last - first, 0))
    export_trace_v2(tmp_path / "trace", wl.table, outcome)
    assert (tmp_path / "trace.csv").read_bytes() == (case_dir / "trace.csv").read_bytes()
    assert (tmp_path / "trace.yaml").read_bytes() == (case_dir / "trace.yaml").read_bytes()


def test_invalid_spec_case():
    """invalid-workload-unknown-key: strict parsing rejects the unknown client key."""
    case_dir = CASES_DIR / "invalid-workload-unknown-key"
    with pytest.raises(BlisInputError, match=r"line 23: field burstiness not found in type "
                                             r"workload\.ClientSpec"):
        load_workload_spec(str(case_dir / "bad-unknown-key.yaml"))


def test_spec_cases_are_covered():
    """Guard: the selection keeps finding the spec and concurrency cases."""
    names = {p.id for p in _cases()}
    assert len(names) >= 13
    for n in ("wl-mixed-arrivals-lengths", "wl-cohorts-lifecycle", "wl-multimodal-reasoning",
              "wl-multiturn-chat-demo-closed-loop", "concurrency-closed-loop-cli",
              "c4-scorer-precise-prefix-inference-perf", "c4-scorer-vllm-dp-servegen"):
        assert n in names


def test_generation_is_deterministic_and_spec_untouched():
    """Two generations give identical tables; the caller's spec object is not modified."""
    path = CASES_DIR / "c4-scorer-precise-prefix-inference-perf" / "inference-perf-shared-prefix.yaml"
    spec = load_workload_spec(str(path))
    a = generate_workload(spec, INT64_MAX, 300)
    b = generate_workload(spec, INT64_MAX, 300)
    assert spec.clients == [] and spec.inference_perf is not None
    for col in ("arrival_us", "input_len", "output_len", "chunk_offsets", "chunk_digests"):
        assert np.array_equal(getattr(a.table, col), getattr(b.table, col))


@pytest.mark.bench
def test_million_requests_multi_client_speed():
    """1,000,000 requests of a 4-client, 4-arrival-process spec in well under 10 s."""
    import time

    spec = load_workload_spec(str(CASES_DIR / "wl-mixed-arrivals-lengths" / "mixed-arrivals-lengths.yaml"))
    generate_workload(spec, INT64_MAX, 1000)
    start = time.perf_counter()
    wl = generate_workload(spec, INT64_MAX, 1_000_000)
    assert wl.table.n == 1_000_000
    assert time.perf_counter() - start < 10.0
