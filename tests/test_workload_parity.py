"""Workload parity with the reference's exported traces (WL-2, WL-5, WL-9.5, DELTA-28/60/61/62).

For every parity case that runs ``blis run`` on the distribution workload or a preset (no
``--workload-spec``, no ``--concurrency``), the workload is regenerated from the case's flags
and compared with the columns of its ``trace.csv`` that depend only on the workload, plus
``workload_seed`` in ``trace.yaml``.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import yaml
from parity import CASES_DIR, case_distribution_params, run_case_params

from blis_fast.gonum import INT64_MAX
from blis_fast.workload.generated import apply_timeout
from blis_fast.workload.generator import generate_requests
from blis_fast.workload.synthesis import (
    lookup_preset,
    synthesize_from_distribution,
    synthesize_from_preset,
    validate_distribution_params,
    validate_rate,
)
from blis_fast.workload.trace_v2 import TraceOutcome, build_trace_csv, export_trace_v2

ROOT = Path(__file__).resolve().parents[1]

# Preset figures of the reference's defaults.yaml (WL-2.5), used only if the project's
# defaults.yaml is not readable.
FALLBACK_PRESETS = {
    "chatbot": dict(
        prefix_tokens=0, prompt_tokens=256, prompt_tokens_stdev=100, prompt_tokens_min=2,
        prompt_tokens_max=800, output_tokens=256, output_tokens_stdev=100, output_tokens_min=1,
        output_tokens_max=1024,
    ),
    "contentgen": dict(
        prefix_tokens=0, prompt_tokens=1024, prompt_tokens_stdev=150, prompt_tokens_min=10,
        prompt_tokens_max=2048, output_tokens=1024, output_tokens_stdev=200,
        output_tokens_min=10, output_tokens_max=2048,
    ),
    "summarization": dict(
        prefix_tokens=0, prompt_tokens=4096, prompt_tokens_stdev=500, prompt_tokens_min=100,
        prompt_tokens_max=8192, output_tokens=512, output_tokens_stdev=150,
        output_tokens_min=10, output_tokens_max=2048,
    ),
    "multidoc": dict(
        prompt_tokens=10240, prompt_tokens_stdev=1200, prompt_tokens_min=500,
        prompt_tokens_max=20480, output_tokens=1536, output_tokens_stdev=300,
        output_tokens_min=50, output_tokens_max=4096,
    ),
}

MARCH_REFERENCE = "blis@9afd96ff"  # before --timeout (deadline 0) and the 27-column trace

# Flags that take no value (everything else the cases use takes exactly one).
def _presets() -> dict:
    path = ROOT / "defaults.yaml"
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
        workloads = data.get("workloads")
        if isinstance(workloads, dict) and workloads:
            return workloads
    except (OSError, yaml.YAMLError, AttributeError):
        pass
    return FALLBACK_PRESETS


def _workload_cases() -> list:
    # Invalid-input cases: the reference exits 1 before writing any trace; their rejection is
    # the CLI's business, there is no workload to compare.
    return run_case_params(False, "invalid-input case: no trace written")


def _regenerate(case: dict, flags: dict[str, str]):
    seed = int(flags.get("--seed", 42))
    rate = float(flags.get("--rate", 1.0))
    num_requests = int(flags.get("--num-requests", 100))
    block_size = int(flags.get("--block-size-in-tokens", 16))
    horizon = int(flags.get("--horizon", INT64_MAX))
    workload = flags.get("--workload", "distribution")
    validate_rate(rate)
    if workload == "distribution":
        p = case_distribution_params(flags, rate=rate, num_requests=num_requests)
        validate_distribution_params(p)
        spec = synthesize_from_distribution(p, seed=seed)
    else:
        preset = lookup_preset(_presets(), workload)
        spec = synthesize_from_preset(preset, rate, num_requests, seed=seed)
    table = generate_requests(
        spec, horizon=horizon, max_requests=num_requests, block_size=block_size
    )
    if case["reference"] != MARCH_REFERENCE:
        table = apply_timeout(table, int(flags.get("--timeout", 300)))  # DELTA-28
    return table


@pytest.mark.parametrize(("name", "case", "flags"), _workload_cases())
def test_workload_matches_reference_trace(name, case, flags):
    """Workload-only trace columns and the header seed equal the reference's, row for row."""
    case_dir = CASES_DIR / name
    table = _regenerate(case, flags)
    with open(case_dir / "trace.csv", encoding="utf-8", newline="") as f:
        ref = list(csv.DictReader(f))
    with open(case_dir / "trace.yaml", encoding="utf-8") as f:
        ref_header = yaml.safe_load(f)
    assert table.n == len(ref)

    n = table.n
    outcome = TraceOutcome(
        status=np.zeros(n, dtype=np.int8),
        ttft_us=np.full(n, -1, dtype=np.int64),
        itl_sum_us=np.zeros(n, dtype=np.int64),
    )
    ours = list(csv.DictReader(build_trace_csv(table, outcome).splitlines()))

    if case["reference"] == MARCH_REFERENCE:
        # 26-column trace: input_tokens includes the prefix, prefix_group always empty,
        # no prefix_length column and no workload_seed in the header.
        assert "workload_seed" not in ref_header
        for i, r in enumerate(ref):
            assert int(r["input_tokens"]) == table.input_len[i], (name, i)
        cols = ["request_id", "client_id", "output_tokens", "arrival_time_us", "send_time_us",
                "deadline_us"]
    else:
        assert ref_header["workload_seed"] == table.seed == int(flags.get("--seed", 42))
        cols = ["request_id", "client_id", "input_tokens", "output_tokens", "arrival_time_us",
                "send_time_us", "deadline_us", "prefix_group", "prefix_length"]
    for i, (r, o) in enumerate(zip(ref, ours, strict=True)):
        for c in cols:
            assert o[c] == r[c], (name, i, c, o[c], r[c])


def test_parity_cases_are_covered():
    """Guard: the selection above keeps finding the distribution/preset cases."""
    names = [p.id for p in _workload_cases()]
    assert len(names) >= 25
    assert "block32-prefix-tokens-512" in names
    assert "chunked-prefill-multidoc" in names


def _outcome_from_reference(ref: list[dict]) -> TraceOutcome:
    """Engine outcome implied by a reference trace (inverse of the run-export rules, WL-9.5)."""
    codes = {"ok": 0, "timeout": 1, "incomplete": 2}
    arrival = np.array([int(r["arrival_time_us"]) for r in ref], dtype=np.int64)
    first = np.array([int(r["first_chunk_time_us"]) for r in ref], dtype=np.int64)
    last = np.array([int(r["last_chunk_time_us"]) for r in ref], dtype=np.int64)
    has = first != 0
    return TraceOutcome(
        status=np.array([codes[r["status"]] for r in ref], dtype=np.int8),
        ttft_us=np.where(has, first - arrival, -1),
        itl_sum_us=np.where(has, last - first, 0),
    )


@pytest.mark.parametrize(("name", "case", "flags"), _workload_cases())
def test_trace_export_is_byte_identical(name, case, flags, tmp_path):
    """With the reference's per-request outcome, export_trace_v2 writes the same bytes."""
    if case["reference"] == MARCH_REFERENCE:
        pytest.skip("March reference wrote the older 26-column trace")
    case_dir = CASES_DIR / name
    table = _regenerate(case, flags)
    with open(case_dir / "trace.csv", encoding="utf-8", newline="") as f:
        ref = list(csv.DictReader(f))
    export_trace_v2(tmp_path / "trace", table, _outcome_from_reference(ref))
    assert (tmp_path / "trace.csv").read_bytes() == (case_dir / "trace.csv").read_bytes()
    assert (tmp_path / "trace.yaml").read_bytes() == (case_dir / "trace.yaml").read_bytes()
