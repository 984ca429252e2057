"""The stdout text of ``blis run`` / ``blis replay`` (CLU-7.25..7.29 with DELTA-9, -11, -12).

Order for ``run``: per-instance metrics blocks (N > 1) → ``cluster`` block → fitness (when
weights are given) → anomaly counters → KV cache metrics → per-SLO → per-model → per-tenant →
trace summary (when a trace summary is supplied). ``replay`` prints the same without the
fitness section and with its own anomaly variant (no timed-out term or line, DELTA-11.3).

Everything here is a pure function of plain data: :class:`ClusterReport` carries the
per-instance :class:`~blis_fast.output.summary.InstanceMetrics`, the per-request
:class:`~blis_fast.output.summary.RequestColumns` and the cluster counters. The fitness score
is computed in ``fitness.py``, the anomaly counters in ``anomalies.py``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from blis_fast.errors import BlisConfigError
from blis_fast.output.anomalies import (
    detect_hol_blocking,
    detect_priority_inversions,
)
from blis_fast.output.fitness import (
    RawMetrics,
    compute_fitness,
    parse_fitness_weights,
)
from blis_fast.output.stats import Distribution, distribution, go_fixed, sequential_sum
from blis_fast.output.summary import (
    InstanceMetrics,
    RequestColumns,
    aggregate_instances,
    build_metrics_output,
    metrics_block,
)

__all__ = [
    "TraceSummary",
    "ClusterReport",
    "ModelMetrics",
    "TenantMetrics",
    "collect_raw_metrics",
    "per_slo_distributions",
    "per_model_metrics",
    "per_tenant_metrics",
    "jain_fairness_index",
    "summarize_trace",
    "render_report",
]


# --------------------------------------------------------------------------- data


@dataclass
class TraceSummary:
    """``trace.Summarize`` result (CLU-6.5), printed by ``--summarize-trace``."""

    total_decisions: int = 0
    """Number of admission records."""
    admitted: int = 0
    """Admission records with admitted = true."""
    rejected: int = 0
    """Admission records with admitted = false."""
    target_distribution: dict[str, int] = field(default_factory=dict)
    """Instance ID -> number of routing records choosing it."""
    mean_regret: float = 0.0
    """Sum of routing regrets (in record order) / number of routing records."""
    max_regret: float = 0.0
    """Largest routing regret, starting from 0."""

    @property
    def unique_targets(self) -> int:
        """Number of distinct chosen instances."""
        return len(self.target_distribution)


@dataclass
class ClusterReport:
    """Everything the stdout report needs, as plain data."""

    instances: list[InstanceMetrics]
    """Per-instance metrics in instance order (``instance_0`` ...)."""
    requests: RequestColumns
    """Per-request records of every request registered at an instance."""
    admission_rejections: int = 0
    """Requests rejected by admission (incl. tenant-budget sheds)."""
    routing_rejections: int = 0
    """Requests with no routable instance."""
    shed_by_tier: dict[str, int] = field(default_factory=dict)
    """Admission rejections per SLO class ("standard" for empty); only non-zero entries."""
    priority_policy: str = "constant"
    """Effective priority policy name (inversions are 0 for "constant" or "")."""
    fitness_weights: str = ""
    """The ``--fitness-weights`` string ("" = no fitness section)."""
    trace_summary: TraceSummary | None = None
    """Trace summary to print (only when tracing is on and --summarize-trace is set)."""
    aggregate: InstanceMetrics | None = None
    """Cluster aggregate; computed with ``aggregate_instances`` when None."""
    priority_inversions: int | None = None
    """Override for the inversion count (computed from ``requests`` when None)."""
    subcommand: str = "run"
    """``run`` or ``replay`` (section set and anomaly variant)."""
    metrics_outputs: list[dict] | None = None
    """Precomputed ``build_metrics_output`` dicts: one per instance, then the cluster's."""
    pd_section: str = ""
    """The ``=== PD Metrics ===`` text of a P/D run (``output/pd.py``), printed before the
    trace summary."""
    num_instances: int | None = None
    """``--num-instances`` as given: the per-instance blocks print iff it is > 1, however many
    instances ran (autoscaled instances, or start-up instances node pools could not place,
    change the count; AS-7.4). None: iff more than one instance ran."""
    replay_timeouts: bool = False
    """A replay's anomaly block as the August reference prints it (timeouts trigger it and have
    their line, as in ``run``): for runs with active LoRA, which only that reference simulates."""


@dataclass
class ModelMetrics:
    """Per-model TTFT/E2E distributions (ticks) and throughput (CLU-7.19)."""

    ttft: Distribution
    e2e: Distribution
    throughput_rps: float
    throughput_tokens_per_sec: float
    total_requests: int


@dataclass
class TenantMetrics:
    """Per-tenant completed requests and pre-sampled output tokens (DELTA-12)."""

    completed_requests: int
    total_tokens_served: int


# --------------------------------------------------------------------------- groupings


def _groups(labels: np.ndarray, mask: np.ndarray) -> dict[str, np.ndarray]:
    sel = np.flatnonzero(mask)
    if sel.size == 0:
        return {}
    keys, inv = np.unique(labels[sel], return_inverse=True)
    return {str(k): sel[inv == i] for i, k in enumerate(keys.tolist())}


def per_slo_distributions(req: RequestColumns) -> dict[str, tuple[Distribution, Distribution]]:
    """``ComputePerSLODistributions``: class -> (TTFT, E2E) distributions in ticks."""
    cls = np.asarray(req.slo_class)
    cls = np.where(cls == "", "default", cls.astype(str)) if cls.size else cls.astype(str)
    ttft = np.asarray(req.ttft_us, dtype=np.float64)
    e2e = np.asarray(req.e2e_us, dtype=np.float64)
    tg = _groups(cls, ~np.isnan(ttft))
    eg = _groups(cls, ~np.isnan(e2e))
    out: dict[str, tuple[Distribution, Distribution]] = {}
    for k in sorted(set(tg) | set(eg)):
        out[k] = (
            distribution(ttft[tg[k]]) if k in tg else Distribution(),
            distribution(e2e[eg[k]]) if k in eg else Distribution(),
        )
    return out


def per_model_metrics(req: RequestColumns, sim_ended_time_us: int) -> dict[str, ModelMetrics]:
    """``ComputePerModelMetrics`` (CLU-7.19); empty when no tagged request has data."""
    model = np.asarray(req.model).astype(str)
    ttft = np.asarray(req.ttft_us, dtype=np.float64)
    e2e = np.asarray(req.e2e_us, dtype=np.float64)
    dec = np.asarray(req.num_decode_tokens, dtype=np.int64)
    tagged = model != ""
    tg = _groups(model, tagged & ~np.isnan(ttft))
    eg = _groups(model, tagged & ~np.isnan(e2e))
    out: dict[str, ModelMetrics] = {}
    for k in sorted(set(tg) | set(eg)):
        rows = eg.get(k, np.empty(0, dtype=np.int64))
        count = int(rows.size)
        tokens = int(np.sum(dec[rows])) if count else 0
        rps = 0.0
        tps = 0.0
        if sim_ended_time_us > 0 and count > 0:
            dur = float(sim_ended_time_us) / 1e6
            rps = float(count) / dur
            if tokens > 0:
                tps = float(tokens) / dur
        out[k] = ModelMetrics(
            ttft=distribution(ttft[tg[k]]) if k in tg else Distribution(),
            e2e=distribution(e2e[rows]) if count else Distribution(),
            throughput_rps=rps,
            throughput_tokens_per_sec=tps,
            total_requests=count,
        )
    return out


def per_tenant_metrics(req: RequestColumns) -> dict[str, TenantMetrics]:
    """``ComputePerTenantMetrics`` (DELTA-12): completed requests with a tenant label."""
    tenant = np.asarray(req.tenant_id).astype(str)
    e2e = np.asarray(req.e2e_us, dtype=np.float64)
    dec = np.asarray(req.num_decode_tokens, dtype=np.int64)
    groups = _groups(tenant, (tenant != "") & ~np.isnan(e2e))
    return {
        k: TenantMetrics(
            completed_requests=int(rows.size), total_tokens_served=int(np.sum(dec[rows]))
        )
        for k, rows in sorted(groups.items())
    }


def jain_fairness_index(values: Mapping[str, float]) -> float:
    """``JainFairnessIndex``: (Σx)² / (n·Σx²) with sums in sorted key order; 1 if Σx² = 0."""
    n = float(len(values))
    if n == 0:
        return 0.0
    sx = 0.0
    sx2 = 0.0
    for k in sorted(values):
        x = float(values[k])
        sx += x
        sx2 += x * x
    if sx2 == 0:
        return 1.0
    return (sx * sx) / (n * sx2)


def summarize_trace(
    admitted: np.ndarray, chosen_instance: np.ndarray, regret: np.ndarray,
    names: Sequence[str] | None = None,
) -> TraceSummary:
    """``trace.Summarize`` from admission flags and routing records (instance index, regret);
    ``names`` are the instance ids by index (default ``instance_<i>``)."""
    adm = np.asarray(admitted, dtype=bool)
    chosen = np.asarray(chosen_instance, dtype=np.int64)
    reg = np.asarray(regret, dtype=np.float64)
    ts = TraceSummary(
        total_decisions=int(adm.size),
        admitted=int(np.count_nonzero(adm)),
        rejected=int(adm.size - np.count_nonzero(adm)),
    )
    if chosen.size:
        inst, cnt = np.unique(chosen, return_counts=True)
        ts.target_distribution = {
            (names[i] if names is not None else f"instance_{i}"): int(c)
            for i, c in zip(inst.tolist(), cnt.tolist(), strict=True)
        }
        ts.mean_regret = sequential_sum(reg) / float(reg.size)
        ts.max_regret = max(0.0, float(np.max(reg)))
    return ts


# --------------------------------------------------------------------------- collection


def collect_raw_metrics(report: ClusterReport) -> RawMetrics:
    """``CollectRawMetrics`` with the per-instance metrics (CLU-7.8, 7.13, 7.14, 7.18)."""
    agg = (
        report.aggregate if report.aggregate is not None else aggregate_instances(report.instances)
    )
    rps = tps = 0.0
    if agg.sim_ended_time_us > 0 and agg.completed > 0:
        dur = float(agg.sim_ended_time_us) / 1e6
        rps = float(agg.completed) / dur
        tps = float(agg.total_output_tokens) / dur
    if report.priority_inversions is not None:
        inversions = int(report.priority_inversions)
    else:
        r = report.requests
        inversions = detect_priority_inversions(
            r.handled_by, r.slo_class, r.arrival_us, r.e2e_us, report.priority_policy, r.request_id
        )
    preempt = 0
    hit = 0.0
    thrash = 0.0
    for m in report.instances:
        preempt += int(m.preemption_count)
        hit += float(m.cache_hit_rate)
        thrash += float(m.kv_thrashing_rate)
    count = len(report.instances)
    return RawMetrics(
        ttft=distribution(agg.ttft_us),
        e2e=distribution(agg.e2e_us),
        requests_per_sec=rps,
        tokens_per_sec=tps,
        priority_inversions=inversions,
        hol_blocking_events=detect_hol_blocking(report.instances),
        rejected_requests=int(report.admission_rejections),
        routing_rejections=int(report.routing_rejections),
        dropped_unservable=int(agg.dropped_unservable),
        length_capped_requests=int(agg.length_capped),
        timed_out_requests=int(agg.timed_out),
        shed_by_tier=dict(report.shed_by_tier),
        cache_hit_rate=hit / float(count) if count else 0.0,
        preemption_rate=float(preempt) / float(agg.completed) if agg.completed > 0 else 0.0,
        kv_thrashing_rate=thrash / float(count) if count else 0.0,
    )


# --------------------------------------------------------------------------- rendering


def _fitness_section(raw: RawMetrics, weights_str: str) -> str:
    weights = parse_fitness_weights(weights_str)
    fit = compute_fitness(raw, weights)
    lines = ["=== Fitness Evaluation ===", f"Score: {go_fixed(fit.score, 6)}"]
    lines += [f"  {k}: {go_fixed(fit.components[k], 6)}" for k in sorted(fit.components)]
    return "\n".join(lines) + "\n"


def _anomaly_section(raw: RawMetrics, subcommand: str) -> str:
    trigger = (
        raw.priority_inversions > 0
        or raw.hol_blocking_events > 0
        or raw.rejected_requests > 0
        or raw.routing_rejections > 0
        or raw.dropped_unservable > 0
        or raw.length_capped_requests > 0
        or (subcommand == "run" and raw.timed_out_requests > 0)
    )
    if not trigger:
        return ""
    lines = [
        "=== Anomaly Counters ===",
        f"Priority Inversions: {raw.priority_inversions}",
        f"HOL Blocking Events: {raw.hol_blocking_events}",
        f"Rejected Requests (Admission): {raw.rejected_requests}",
    ]
    lines += [f"  Shed ({t}): {raw.shed_by_tier[t]}" for t in sorted(raw.shed_by_tier)]
    lines += [
        f"Rejected Requests (Routing): {raw.routing_rejections}",
        f"Dropped Unservable: {raw.dropped_unservable}",
    ]
    if subcommand == "run":
        lines.append(f"Timed Out Requests: {raw.timed_out_requests}")
    lines.append(f"Length-Capped Requests: {raw.length_capped_requests}")
    return "\n".join(lines) + "\n"


def _kv_section(raw: RawMetrics) -> str:
    if raw.preemption_rate == 0 and raw.cache_hit_rate == 0 and raw.kv_thrashing_rate == 0:
        return ""
    return (
        "=== KV Cache Metrics ===\n"
        f"Preemption Rate: {go_fixed(raw.preemption_rate, 4)}\n"
        f"Cache Hit Rate: {go_fixed(raw.cache_hit_rate, 4)}\n"
        f"KV Thrashing Rate: {go_fixed(raw.kv_thrashing_rate, 4)}\n"
    )


def _slo_section(req: RequestColumns) -> str:
    dists = per_slo_distributions(req)
    if len(dists) <= 1:
        return ""
    lines = ["=== Per-SLO Metrics ==="]
    for cls in sorted(dists):
        t, e = dists[cls]
        lines.append(f"  {cls}:")
        lines.append(f"    TTFT: mean={go_fixed(t.mean, 2)} p99={go_fixed(t.p99, 2)} (n={t.count})")
        lines.append(f"    E2E:  mean={go_fixed(e.mean, 2)} p99={go_fixed(e.p99, 2)} (n={e.count})")
    return "\n".join(lines) + "\n"


def _model_section(req: RequestColumns, sim_ended_time_us: int) -> str:
    models = per_model_metrics(req, sim_ended_time_us)
    if not models:
        return ""
    lines = ["=== Per-Model Metrics ==="]
    for name in sorted(models):
        m = models[name]
        lines.append(f"  {name}:")
        lines.append(
            f"    TTFT: p50={go_fixed(m.ttft.p50, 2)} p99={go_fixed(m.ttft.p99, 2)} (n={m.ttft.count})"
        )
        lines.append(
            f"    E2E:  p50={go_fixed(m.e2e.p50, 2)} p99={go_fixed(m.e2e.p99, 2)} (n={m.e2e.count})"
        )
        lines.append(
            f"    Throughput: {go_fixed(m.throughput_rps, 2)} req/s, "
            f"{go_fixed(m.throughput_tokens_per_sec, 2)} tok/s"
        )
    return "\n".join(lines) + "\n"


def _tenant_section(req: RequestColumns) -> str:
    tenants = per_tenant_metrics(req)
    if not tenants:
        return ""
    lines = ["=== Per-Tenant Metrics ==="]
    for tid in sorted(tenants):
        t = tenants[tid]
        lines.append(f"  {tid}: requests={t.completed_requests}, tokens={t.total_tokens_served}")
    jain = jain_fairness_index({k: float(v.total_tokens_served) for k, v in tenants.items()})
    lines.append(f"  Jain Fairness Index: {go_fixed(jain, 4)}")
    return "\n".join(lines) + "\n"


def _trace_section(ts: TraceSummary) -> str:
    lines = [
        "=== Trace Summary ===",
        f"Total Decisions: {ts.total_decisions}",
        f"  Admitted: {ts.admitted}",
        f"  Rejected: {ts.rejected}",
        f"Unique Targets: {ts.unique_targets}",
    ]
    if ts.target_distribution:
        lines.append("Target Distribution:")
        lines += [f"  {k}: {ts.target_distribution[k]}" for k in sorted(ts.target_distribution)]
    lines.append(f"Mean Regret: {go_fixed(ts.mean_regret, 6)}")
    lines.append(f"Max Regret: {go_fixed(ts.max_regret, 6)}")
    return "\n".join(lines) + "\n"


def render_report(report: ClusterReport) -> str:
    """The full stdout of ``blis run`` / ``blis replay`` for this report.

    A bad ``fitness_weights`` string raises BlisConfigError *after* the metrics blocks, as
    the reference exits there; the text printed up to that point is attached to the
    exception as ``exc.stdout`` so the CLI can emit it before the error line.
    """
    if report.subcommand not in ("run", "replay"):
        raise ValueError(f"unknown subcommand {report.subcommand!r}")
    agg = (
        report.aggregate if report.aggregate is not None else aggregate_instances(report.instances)
    )
    outputs = report.metrics_outputs
    if outputs is None:
        outputs = [build_metrics_output(f"instance_{i}", m) for i, m in enumerate(report.instances)]
        outputs.append(build_metrics_output("cluster", agg))
    parts: list[str] = []
    flag = report.num_instances if report.num_instances is not None else len(report.instances)
    if flag > 1:
        parts.extend(metrics_block(d) for d in outputs[:-1])
    parts.append(metrics_block(outputs[-1]))
    raw = collect_raw_metrics(
        report if report.aggregate is not None else _with_aggregate(report, agg)
    )
    if report.subcommand == "run" and report.fitness_weights != "":
        try:
            parts.append(_fitness_section(raw, report.fitness_weights))
        except BlisConfigError as exc:
            exc.stdout = "".join(parts)  # type: ignore[attr-defined]
            raise
    parts.append(_anomaly_section(raw, "run" if report.replay_timeouts else report.subcommand))
    parts.append(_kv_section(raw))
    parts.append(_slo_section(report.requests))
    parts.append(_model_section(report.requests, agg.sim_ended_time_us))
    parts.append(_tenant_section(report.requests))
    parts.append(report.pd_section)
    if report.trace_summary is not None:
        parts.append(_trace_section(report.trace_summary))
    return "".join(parts)


def _with_aggregate(report: ClusterReport, agg: InstanceMetrics) -> ClusterReport:
    return replace(report, aggregate=agg)
