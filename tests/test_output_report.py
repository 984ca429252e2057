"""stdout report (CLU-7.25..7.29, DELTA-9/11/12): rebuilt from the numbers of parity cases."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from _output_parity import (
    CASES,
    instance_from_block,
    load_results,
    request_columns,
    results_cases,
    section,
    section_value,
    stdout_blocks,
    typed_metrics,
)
from hypothesis import given
from hypothesis import strategies as st
from naive import inversion_pairs

from blis_fast.errors import BlisConfigError
from blis_fast.output.anomalies import (
    count_inversion_pairs,
    detect_hol_blocking,
    detect_priority_inversions,
)
from blis_fast.output.fitness import parse_fitness_weights
from blis_fast.output.gojson import marshal_indent
from blis_fast.output.report import (
    ClusterReport,
    TraceSummary,
    jain_fairness_index,
    render_report,
    summarize_trace,
)
from blis_fast.output.stats import distribution
from blis_fast.output.summary import InstanceMetrics, RequestColumns, build_metrics_output

RUN_CASES = [
    c for c in results_cases() if json.loads((c / "case.json").read_text())["subcommand"] == "run"
]


def _arg(case: Path, flag: str, default: str = "") -> str:
    args = json.loads((case / "case.json").read_text())["args"]
    return args[args.index(flag) + 1] if flag in args else default


def _build_report(case: Path) -> tuple[ClusterReport, list[dict], str]:
    """Inputs of the report taken from the case: counters from stdout, samples from records."""
    stdout = (case / "stdout.txt").read_text()
    blocks, rest = stdout_blocks(stdout)
    names = [b["instance_id"] for b in blocks[:-1]] if len(blocks) > 1 else None
    cols = request_columns(load_results(case).get("requests", []), names)
    if len(blocks) == 1:
        instances = [instance_from_block(blocks[0], cols, None)]
    else:
        instances = [instance_from_block(b, cols, i) for i, b in enumerate(blocks[:-1])]
    # HOL blocking needs per-step queue samples (not printed): give `h` instances a queue.
    hol = int(section_value(rest, "Anomaly Counters", "HOL Blocking Events") or 0)
    for i, m in enumerate(instances):
        m.wait_queue_len_sum, m.wait_queue_len_steps = (1000, 1) if i < hol else (0, 0)
    # Cache hit / thrashing rates are KV-store figures: take the printed value as input.
    for m in instances:
        m.cache_hit_rate = float(section_value(rest, "KV Cache Metrics", "Cache Hit Rate") or 0)
        m.kv_thrashing_rate = float(
            section_value(rest, "KV Cache Metrics", "KV Thrashing Rate") or 0
        )
    shed = {}
    for line in section(rest, "Anomaly Counters"):
        mm = re.fullmatch(r"  Shed \((.*)\): (\d+)", line)
        if mm:
            shed[mm.group(1)] = int(mm.group(2))
    trace = None
    if section(rest, "Trace Summary"):
        dist = {}
        for line in section(rest, "Trace Summary"):
            mm = re.fullmatch(r"  (instance_\d+): (\d+)", line)
            if mm:
                dist[mm.group(1)] = int(mm.group(2))
        trace = TraceSummary(
            total_decisions=int(section_value(rest, "Trace Summary", "Total Decisions")),
            admitted=int(section_value(rest, "Trace Summary", "Admitted")),
            rejected=int(section_value(rest, "Trace Summary", "Rejected")),
            target_distribution=dist,
            mean_regret=float(section_value(rest, "Trace Summary", "Mean Regret")),
            max_regret=float(section_value(rest, "Trace Summary", "Max Regret")),
        )
    priority = _arg(case, "--priority-policy", "constant")
    report = ClusterReport(
        instances=instances,
        requests=cols,
        admission_rejections=int(
            section_value(rest, "Anomaly Counters", "Rejected Requests (Admission)") or 0
        ),
        routing_rejections=int(
            section_value(rest, "Anomaly Counters", "Rejected Requests (Routing)") or 0
        ),
        shed_by_tier=shed,
        priority_policy=priority,
        fitness_weights=_arg(case, "--fitness-weights"),
        trace_summary=trace,
    )
    return report, blocks, rest


@pytest.mark.skipif(not RUN_CASES, reason="parity cases not available")
@pytest.mark.parametrize("case", RUN_CASES, ids=[c.name for c in RUN_CASES])
def test_stdout_rebuilt(case: Path) -> None:
    report, blocks, rest = _build_report(case)
    text = render_report(report)
    got_blocks, got_rest = stdout_blocks(text)
    assert len(got_blocks) == len(blocks)
    for got, exp in zip(got_blocks, blocks, strict=True):
        for k in ("itl_mean_ms", "itl_p90_ms", "itl_p95_ms", "itl_p99_ms"):
            got[k] = exp[k]  # per-token ITL samples are not in the case files
        assert marshal_indent(typed_metrics(got)) == marshal_indent(typed_metrics(exp))
    assert got_rest == rest


@pytest.mark.skipif(not RUN_CASES, reason="parity cases not available")
def test_metrics_block_text_exact() -> None:
    # DELTA-9: every block printed, header + MarshalIndent + newline, even with 0 completions.
    case = CASES / "c4-reject-all"
    stdout = (case / "stdout.txt").read_text()
    report, _, _ = _build_report(case)
    assert render_report(report) == stdout


def test_replay_anomaly_variant() -> None:
    # DELTA-11.3: replay has no timed-out trigger or line; shed lines kept.
    m = InstanceMetrics(timed_out=3, completed=1, sim_ended_time_us=10)
    rep = ClusterReport(instances=[m], requests=RequestColumns.empty(), subcommand="replay")
    assert "Anomaly" not in render_report(rep)
    rep.admission_rejections = 2
    rep.shed_by_tier = {"standard": 1, "batch": 1}
    text = render_report(rep)
    tail = text[text.index("=== Anomaly Counters ===") :]
    assert tail == (
        "=== Anomaly Counters ===\n"
        "Priority Inversions: 0\n"
        "HOL Blocking Events: 0\n"
        "Rejected Requests (Admission): 2\n"
        "  Shed (batch): 1\n"
        "  Shed (standard): 1\n"
        "Rejected Requests (Routing): 0\n"
        "Dropped Unservable: 0\n"
        "Length-Capped Requests: 0\n"
    )
    rep.subcommand = "run"
    text = render_report(rep)
    assert "Timed Out Requests: 3\nLength-Capped Requests: 0\n" in text


def test_fitness_matches_case() -> None:
    case = CASES / "c8-scorer-load-aware-fitness"
    if not case.is_dir():
        pytest.skip("case absent")
    report, _, rest = _build_report(case)
    assert section(render_report(report), "Fitness Evaluation") == section(
        rest, "Fitness Evaluation"
    )


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("c4-round-robin-inverted-slo-reverse-priority", 987),
        ("c8-scorer-load-balance-slo-priority", 362),
    ],
)
def test_priority_inversions_match_case(name: str, expected: int) -> None:
    case = CASES / name
    if not case.is_dir():
        pytest.skip("case absent")
    cols = request_columns(load_results(case)["requests"])
    policy = _arg(case, "--priority-policy")
    got = detect_priority_inversions(
        cols.handled_by, cols.slo_class, cols.arrival_us, cols.e2e_us, policy, cols.request_id
    )
    assert got == expected
    assert (
        detect_priority_inversions(
            cols.handled_by, cols.slo_class, cols.arrival_us, cols.e2e_us, "constant"
        )
        == 0
    )


@given(st.lists(st.integers(min_value=0, max_value=40).map(float), max_size=600))
def test_count_inversion_pairs_matches_naive(values: list[float]) -> None:
    naive = inversion_pairs(values)
    assert count_inversion_pairs(np.array(values)) == naive
    assert count_inversion_pairs(np.array(values), brute_force_max=0) == naive


def test_count_inversion_pairs_large() -> None:
    rng = np.random.default_rng(2)
    x = rng.integers(1, 10**6, 3000).astype(float)
    naive = int(np.count_nonzero(np.triu(x[:, None] > 2 * x[None, :], k=1)))
    assert count_inversion_pairs(x) == naive


def test_hol_blocking() -> None:
    # CLU-7.14: mean over all instances (idle = 0); strictly greater than 2x the mean.
    def inst(s: int, n: int) -> InstanceMetrics:
        return InstanceMetrics(wait_queue_len_sum=s, wait_queue_len_steps=n)

    assert detect_hol_blocking([inst(100, 1)]) == 0
    assert detect_hol_blocking([inst(10, 1), inst(0, 0)]) == 0  # 10 > 2*5 is false
    assert detect_hol_blocking([inst(10, 1), inst(0, 0), inst(0, 0)]) == 1
    assert detect_hol_blocking([inst(0, 5), inst(0, 0)]) == 0


def test_jain_fairness() -> None:
    assert jain_fairness_index({}) == 0.0
    assert jain_fairness_index({"a": 0.0}) == 1.0
    assert jain_fairness_index({"a": 5.0}) == 1.0
    v = {"tenant-a": 6741.0, "tenant-b": 25844.0, "tenant-c": 45855.0}
    assert f"{jain_fairness_index(v):.4f}" == "0.7283"


@pytest.mark.parametrize(
    ("s", "expected"),
    [
        ("", {}),
        ("throughput:0.5", {"throughput": 0.5}),
        (" throughput : 0.5 , p99_ttft:1e-1", {"throughput": 0.5, "p99_ttft": 0.1}),
        ("a:1,a:2", {"a": 2.0}),
        ("a:0", {"a": 0.0}),
        ("a:0x1p-2", {"a": 0.25}),
        ("a:1_000", {"a": 1000.0}),
        ("a:b:1", None),
        ("a", None),
        ("a:1,", None),
        ("a:-1", None),
        ("a:NaN", None),
        ("a:inf", None),
        ("a:1e400", None),
        ("a:", None),
        ("a:1__0", None),
        ("a:١", None),
    ],
)
def test_parse_fitness_weights(s: str, expected: dict | None) -> None:
    if expected is None:
        with pytest.raises(BlisConfigError, match="Invalid fitness weights"):
            parse_fitness_weights(s)
    else:
        assert parse_fitness_weights(s) == expected


def test_fitness_errors_carry_stdout() -> None:
    m = InstanceMetrics(completed=1, sim_ended_time_us=1000, e2e_us=np.array([5.0]))
    rep = ClusterReport(instances=[m], requests=RequestColumns.empty(), fitness_weights="bogus:1")
    with pytest.raises(BlisConfigError, match="unknown fitness metric key") as ei:
        render_report(rep)
    assert ei.value.stdout.startswith("=== Simulation Metrics ===")  # type: ignore[attr-defined]
    rep.fitness_weights = "throughput"
    with pytest.raises(BlisConfigError, match="Invalid fitness weights"):
        render_report(rep)


def test_per_model_section_format() -> None:
    # CLU-7.28: p50/p99 in ticks, n, throughput with %.2f.
    n = 4
    cols = RequestColumns(
        request_id=np.array([f"request_{i}" for i in range(n)], dtype=object),
        arrival_us=np.arange(n, dtype=np.int64),
        num_prefill_tokens=np.full(n, 10),
        num_decode_tokens=np.array([5, 6, 7, 8]),
        ttft_us=np.array([100.0, 200.0, 300.0, np.nan]),
        itl_us=np.array([1.0, 1.0, np.nan, np.nan]),
        e2e_us=np.array([1000.0, 3000.0, np.nan, np.nan]),
        scheduling_delay_us=np.zeros(n, dtype=np.int64),
        handled_by=np.zeros(n, dtype=np.int32),
        slo_class=np.array([""] * n, dtype=object),
        tenant_id=np.array(["t1", "", "t1", "t2"], dtype=object),
        model=np.array(["m-b", "m-a", "m-a", ""], dtype=object),
        length_capped=np.zeros(n, dtype=bool),
    )
    m = InstanceMetrics(completed=2, sim_ended_time_us=2_000_000)
    text = render_report(ClusterReport(instances=[m], requests=cols))
    assert text.endswith(
        "=== Per-Model Metrics ===\n"
        "  m-a:\n"
        "    TTFT: p50=250.00 p99=299.00 (n=2)\n"
        "    E2E:  p50=3000.00 p99=3000.00 (n=1)\n"
        "    Throughput: 0.50 req/s, 3.00 tok/s\n"
        "  m-b:\n"
        "    TTFT: p50=100.00 p99=100.00 (n=1)\n"
        "    E2E:  p50=1000.00 p99=1000.00 (n=1)\n"
        "    Throughput: 0.50 req/s, 2.50 tok/s\n"
        "=== Per-Tenant Metrics ===\n"
        "  t1: requests=1, tokens=5\n"
        "  Jain Fairness Index: 1.0000\n"
    )
    # Per-SLO needs more than one class (empty counts as "default").
    assert "Per-SLO" not in text


def test_trace_summary() -> None:
    ts = summarize_trace(
        np.array([True, True, False]), np.array([1, 0, 1, 1]), np.array([0.5, 0.0, 2.0, 0.25])
    )
    assert ts.total_decisions == 3 and ts.admitted == 2 and ts.rejected == 1
    assert ts.target_distribution == {"instance_0": 1, "instance_1": 3}
    assert ts.mean_regret == (0.5 + 0.0 + 2.0 + 0.25) / 4 and ts.max_regret == 2.0
    empty = summarize_trace(np.array([False]), np.array([], dtype=np.int64), np.array([]))
    rep = ClusterReport(
        instances=[InstanceMetrics()], requests=RequestColumns.empty(), trace_summary=empty
    )
    assert render_report(rep).endswith(
        "=== Trace Summary ===\nTotal Decisions: 1\n  Admitted: 0\n  Rejected: 1\n"
        "Unique Targets: 0\nMean Regret: 0.000000\nMax Regret: 0.000000\n"
    )


def test_single_instance_prints_only_cluster_block() -> None:
    text = render_report(
        ClusterReport(instances=[InstanceMetrics()], requests=RequestColumns.empty())
    )
    assert text.count("=== Simulation Metrics ===") == 1
    assert '"instance_id": "cluster"' in text
    two = render_report(
        ClusterReport(
            instances=[InstanceMetrics(), InstanceMetrics()], requests=RequestColumns.empty()
        )
    )
    assert two.count("=== Simulation Metrics ===") == 3


def test_distribution_of_case_ttft_in_ticks() -> None:
    # CLU-7.27 values are ticks: the per-SLO means printed for a case.
    case = CASES / "c4-round-robin-inverted-slo-reverse-priority"
    if not case.is_dir():
        pytest.skip("case absent")
    cols = request_columns(load_results(case)["requests"])
    sel = np.asarray(cols.slo_class) == "background"
    d = distribution(np.asarray(cols.ttft_us)[sel])
    assert f"{d.mean:.2f}" == "27117.41" and f"{d.p99:.2f}" == "137707.00"
    assert build_metrics_output("cluster", InstanceMetrics())["completed_requests"] == 0
