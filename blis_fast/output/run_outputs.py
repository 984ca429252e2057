"""What one ``blis run``/``blis replay`` writes, made from the kernel's results.

``plan_outputs`` checks every output path before anything runs; ``build_outputs`` turns a
``SimulationResult`` into the per-instance and cluster metrics, the per-request columns and
the stdout report (ENG-7, CLU-7); ``write_outputs`` stages the requested files and publishes
them all or none (``files.OutputPlan``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from blis_fast.engine.results import SimulationResult
from blis_fast.errors import BlisConfigError
from blis_fast.files import OutputPlan
from blis_fast.kernels.enums import Registration, RequestState
from blis_fast.kernels.state import InstanceCounter
from blis_fast.options import RUN_OPTIONS
from blis_fast.output.cost import CostReport, run_cost, summary_columns
from blis_fast.output.report import ClusterReport, render_report, summarize_trace
from blis_fast.output.summary import (
    InstanceMetrics,
    RequestColumns,
    aggregate_instances,
    build_metrics_output,
    replay_results_text,
    results_text,
)
from blis_fast.workload.request_table import RequestTable
from blis_fast.workload.trace_v2 import TraceOutcome, trace_v2_files


@dataclass
class RunOutputs:
    """The metrics of a run, as printed and as written."""

    stdout: str
    summary: dict  # the cluster's metrics (the results file's summary)
    per_instance: list[dict]
    requests: RequestColumns
    cost: CostReport | None = None  # when a GPU-hour price was given (blis_fast's extension)
    summary_extras: dict = field(default_factory=dict)  # summary.parquet's cost/fleet/P/D columns
    pools: list[dict] | None = None  # pools.parquet's rows (output/pools.py), P/D runs only


def plan_outputs(opts: Any, replay: bool) -> OutputPlan:
    """Check every output path of the run before anything is generated or simulated."""
    plan = OutputPlan()  # no output may overwrite an input
    for spec in RUN_OPTIONS:
        path = getattr(opts, spec.field)
        if spec.file == "input":
            plan.add_inputs([(f"--{spec.flag}", path)])
        elif spec.file == "input-folder" and path:
            plan.add_inputs([(f"--{spec.flag}", os.path.join(path, "config.json"))])
    if opts.metrics_path and opts.results_path and (
            os.path.realpath(opts.metrics_path) != os.path.realpath(opts.results_path)):
        raise BlisConfigError("--metrics-path and --results-path are two names of one output; "
                              f"give one of them (got {opts.metrics_path!r} and "
                              f"{opts.results_path!r})")
    if replay and opts.results_path:
        plan.check_file(opts.results_path, "--results-path")
    elif opts.metrics_path or opts.results_path:
        flag = "--metrics-path" if opts.metrics_path else "--results-path"
        plan.check_file(opts.metrics_path or opts.results_path, flag)
    if opts.trace_output:
        plan.check_file(opts.trace_output + ".yaml", "--trace-output")
        plan.check_file(opts.trace_output + ".csv", "--trace-output")
    if opts.output_dir:
        plan.check_dir(opts.output_dir, "--output-dir")
        if os.path.isdir(opts.output_dir):
            for name in ("summary.parquet", "requests.parquet", "decisions.parquet",
                         "scaling.parquet", "pools.parquet"):
                plan.check_file(os.path.join(opts.output_dir, name), "--output-dir")
    return plan


def instance_metrics(res: SimulationResult) -> list[InstanceMetrics]:
    """Per-instance metrics objects for the report (ENG-7, CLU-7.1)."""
    out: list[InstanceMetrics] = []
    ended = res.sim_ended_us
    otp = res.config.latency.output_token_time
    for i in range(res.counters.shape[0]):
        c = res.counters[i]
        mine = res.instance == i
        ttft = res.ttft_us[mine & (res.ttft_us >= 0)].astype(np.float64)
        e2e = res.e2e_us[mine & (res.e2e_us >= 0)].astype(np.float64)
        sched = res.sched_delay_us[mine & (res.sched_delay_us >= 0)].astype(np.int64)
        steps = (res.step_instance == i) & (res.step_itl_count > 0)
        out.append(InstanceMetrics(
            completed=int(c[InstanceCounter.COMPLETED]),
            still_queued=int(res.still_queued[i]),
            still_running=int(res.still_running[i]),
            dropped_unservable=int(c[InstanceCounter.DROPPED]),
            timed_out=int(c[InstanceCounter.TIMED_OUT]),
            length_capped=int(c[InstanceCounter.LENGTH_CAPPED]),
            total_input_tokens=int(c[InstanceCounter.IN_TOKENS]),
            total_output_tokens=int(c[InstanceCounter.OUT_TOKENS]),
            preemption_count=int(c[InstanceCounter.PREEMPTIONS]),
            kv_allocation_failures=int(c[InstanceCounter.KV_FAILURES]),
            sim_ended_time_us=int(ended[i]),
            ttft_us=ttft,
            e2e_us=e2e,
            scheduling_delay_us=sched,
            itl_values_us=res.step_duration[steps] + otp,
            itl_counts=res.step_itl_count[steps],
            wait_queue_len_sum=int(res.wait_queue_sum[i, 0]),
            wait_queue_len_steps=int(res.wait_queue_sum[i, 1]),
            cache_hit_rate=float(res.cache_hit_rate[i]),
            kv_thrashing_rate=float(res.thrashing_rate[i]),
        ))
    return out


def mean_itl(res: SimulationResult, rows: np.ndarray, out_len: np.ndarray) -> np.ndarray:
    """Per-request mean ITL of ``rows`` (ENG-7.2 step 4): the ITL sum over max(samples - 1, 1)
    (samples = the output length, or the decode steps when length-capped); 0 without outputs,
    NaN unless completed."""
    capped = res.length_capped[rows] == 1
    n_itl = np.where(capped, res.itl_count[rows], out_len)
    denom = np.maximum(n_itl - 1, 1).astype(np.float64)
    itl = res.itl_sum_us[rows].astype(np.float64) / denom
    itl = np.where(out_len > 0, itl, 0.0)
    return np.where(res.state[rows] == RequestState.COMPLETED, itl, np.nan)


def client_meta(table: RequestTable, rows: np.ndarray, key: str) -> np.ndarray:
    """Client metadata ``key`` (slo_class, tenant_id, model) of ``rows``, "" when none."""
    clients = table.clients
    values = np.array([str(c.get(key, "") or "") for c in clients] or [""], dtype=object)
    return values[table.client_idx[rows]] if len(clients) else np.full(len(rows), "",
                                                                         dtype=object)


def request_identity(table: RequestTable, rows: np.ndarray) -> dict[str, np.ndarray]:
    """The ``client_id``, ``session_id`` and ``round_index`` columns of ``rows`` (what
    :class:`RequestColumns` holds for ``requests.parquet``): session and round None / -1
    outside a session."""
    sessions = np.array(list(table.sessions) + [None], dtype=object)
    session_idx = table.session_idx[rows]
    in_session = session_idx >= 0
    return {
        "client_id": client_meta(table, rows, "id"),
        "session_id": sessions[np.where(in_session, session_idx, len(table.sessions))],
        "round_index": np.where(in_session, table.round_index[rows], -1).astype(np.int64),
    }


def request_engine_records(res: SimulationResult, rows: np.ndarray) -> dict[str, np.ndarray]:
    """The ``preemptions``, ``cached_prefix_tokens``, ``priority`` and ``slo_priority`` columns
    of workload ``rows`` (what the kernel collected per request, for ``requests.parquet``).

    In a P/D run a disaggregated parent reports its sub-requests: preemptions of both, the
    cached prefix and the priority of its prefill sub-request (row ``n + r``, the one its
    ``scheduling_delay_ms`` comes from); a local request's row ``n + r`` is never used."""
    preemptions = res.preemptions[rows].astype(np.int64)
    cached = res.cached_prefix_tokens[rows]
    priority = res.priority[rows]
    if res.pd is not None:
        from blis_fast.kernels.pd import ParentField

        n = res.table.n
        split = res.pd.par[rows, ParentField.FLAG] == 1
        preemptions = preemptions + res.preemptions[rows + n]
        cached = np.where(split, res.cached_prefix_tokens[rows + n], cached)
        priority = np.where(split, res.priority[rows + n], priority)
    return {
        "preemptions": preemptions,
        "cached_prefix_tokens": cached.astype(np.int64),
        "priority": priority.astype(np.float64),
        "slo_priority": res.slo_priority[rows].astype(np.int64),
    }


def request_columns(res: SimulationResult, table: RequestTable) -> RequestColumns:
    """Per-request records of every request registered at an instance (ENG-7.6, CLU-7.24)."""
    rows = np.flatnonzero(res.registered == 1)
    out_len = table.output_len[rows]
    capped = res.length_capped[rows] == 1
    itl = mean_itl(res, rows, out_len)
    ttft = res.ttft_us[rows]
    e2e = res.e2e_us[rows]

    def meta(key: str) -> np.ndarray:
        return client_meta(table, rows, key)

    return RequestColumns(
        request_id=np.array(table.id_strings(), dtype=object)[rows],
        arrival_us=table.arrival_us[rows],
        num_prefill_tokens=table.input_len[rows],
        num_decode_tokens=out_len,
        ttft_us=np.where(ttft >= 0, ttft.astype(np.float64), np.nan),
        itl_us=itl,
        e2e_us=np.where(e2e >= 0, e2e.astype(np.float64), np.nan),
        scheduling_delay_us=res.sched_delay_us[rows].astype(np.int64),
        handled_by=res.instance[rows].astype(np.int32),
        instance_names=res.instance_names,
        slo_class=meta("slo_class"),
        tenant_id=meta("tenant_id"),
        model=meta("model"),
        length_capped=capped,
        **request_identity(table, rows),
        **request_engine_records(res, rows),
    )


def trace_outcome(res: SimulationResult, n: int | None = None) -> TraceOutcome:
    """Per-request status/TTFT/ITL sums for the trace v2 export (WL-9.5) of the first ``n``
    requests (default: all). A disaggregated request is exported as the reference does: its
    original request never ran, so it is incomplete with no first token (PD-6.6)."""
    if n is None:
        n = res.table.n
    state = res.state[:n]
    status = np.full(state.shape[0], 2, dtype=np.int8)
    status[state == RequestState.COMPLETED] = 0
    status[state == RequestState.TIMED_OUT] = 1
    ttft = res.ttft_us[:n].astype(np.int64)
    itl = res.itl_sum_us[:n].astype(np.int64)
    if res.pd is not None:
        from blis_fast.kernels.pd import ParentField

        split = res.pd.par[:n, ParentField.FLAG] == 1
        status[split] = 2
        ttft[split] = -1
        itl[split] = 0
    return TraceOutcome(status=status, ttft_us=ttft, itl_sum_us=itl)


def shed_by_tier(res: SimulationResult) -> dict[str, int]:
    """Admission rejections per SLO class (DELTA-11)."""
    if res.rejected_admission == 0:
        return {}
    table = res.table
    counts: dict[str, int] = {}
    for idx in np.flatnonzero(res.registered == Registration.REJECTED_ADMISSION):
        client = table.clients[table.client_idx[idx]] if table.clients else {}
        tier = str(client.get("slo_class", "") or "") or "standard"
        counts[tier] = counts.get(tier, 0) + 1
    return counts


def trace_summary(res: SimulationResult):
    """The --summarize-trace section's numbers (CLU-6.5), when tracing was on."""
    if res.decisions is None:
        return None
    d = res.decisions
    return summarize_trace(d.admitted, d.routing_target, d.routing_regret, res.instance_names)


def build_outputs(res: SimulationResult, opts: Any, replay: bool) -> RunOutputs:
    """The metrics and the stdout report of a simulated run (``opts``: its RunOptions)."""
    instances = instance_metrics(res)
    pd_text = ""
    figures = pools = None
    if res.pd is not None:  # P/D: parents projected, counters corrected (output/pd.py)
        from blis_fast.output.pd import (
            cluster_aggregate_pd,
            pd_figures,
            pd_section,
            project,
            request_columns_pd,
        )
        from blis_fast.output.pools import pool_rows

        proj = project(res)
        requests = request_columns_pd(res, proj)
        aggregate = cluster_aggregate_pd(res, instances, proj)
        figures = pd_figures(res, instances, proj)
        pd_text = pd_section(res, instances, figures)
        pools = pool_rows(res, instances)
    else:
        requests = request_columns(res, res.table)  # pre-generated requests, then follow-ups
        aggregate = aggregate_instances(instances)
    per_instance = [build_metrics_output(res.instance_name(i), m) for i, m in enumerate(instances)]
    summary = build_metrics_output("cluster", aggregate)
    report = ClusterReport(
        instances=instances,
        requests=requests,
        admission_rejections=res.rejected_admission,
        routing_rejections=res.rejected_routing,
        shed_by_tier=shed_by_tier(res),
        priority_policy=res.config.policies.priority,
        fitness_weights="" if replay else opts.fitness_weights,
        trace_summary=trace_summary(res) if opts.summarize_trace else None,
        aggregate=aggregate,
        metrics_outputs=[*per_instance, summary],
        subcommand="replay" if replay else "run",
        pd_section=pd_text,
    )
    cost = run_cost(res, int(aggregate.completed))
    from blis_fast.output.pd import pd_summary_columns  # imports this module
    stdout = render_report(report)
    if cost.priced:
        stdout += cost.section()
    return RunOutputs(stdout=stdout, summary=summary, per_instance=per_instance,
                      requests=requests, cost=cost if cost.priced else None,
                      summary_extras={**summary_columns(res, cost),
                                      **pd_summary_columns(figures)},
                      pools=pools)


def write_outputs(plan: OutputPlan, opts: Any, replay: bool, injected: RequestTable,
                  res: SimulationResult, outputs: RunOutputs) -> None:
    """Stage every requested output file and publish them together (any failure removes them
    all); ``injected`` is the table of the requests the run injected itself."""
    with plan:
        _stage(plan, opts, replay, injected, res, outputs)
        plan.commit()


def _stage(plan: OutputPlan, opts: Any, replay: bool, injected: RequestTable,
           res: SimulationResult, outputs: RunOutputs) -> None:
    if opts.trace_output and replay:
        # a replay exports the requests it injected, in injection order (DELTA-64/65)
        files = trace_v2_files(opts.trace_output, injected, trace_outcome(res, injected.n),
                               replayed=True)
    elif opts.trace_output:
        files = trace_v2_files(opts.trace_output, res.table, trace_outcome(res))
    else:
        files = []
    for path, text in files:
        plan.stage_text(path, "--trace-output", text)
    if replay and opts.results_path:
        plan.stage_text(opts.results_path, "--results-path", replay_results_text(outputs.requests))
    elif opts.metrics_path or opts.results_path:
        flag = "--metrics-path" if opts.metrics_path else "--results-path"
        head = outputs.summary if outputs.cost is None else dict(
            outputs.summary, cost=outputs.cost.as_dict())
        plan.stage_text(opts.metrics_path or opts.results_path, flag,
                        results_text(head, outputs.requests))
    if opts.output_dir:
        import pyarrow.parquet as pq

        from blis_fast.output.parquet import requests_table, summary_table

        tables = [("summary.parquet", summary_table({**outputs.summary,
                                                     **outputs.summary_extras})),
                  ("requests.parquet", requests_table(outputs.requests))]
        if res.decisions is not None:
            from blis_fast.output.decisions import decision_columns
            from blis_fast.output.parquet import decisions_table

            tables.append(("decisions.parquet", decisions_table(
                decision_columns(res.decisions, _deciding_policy(res.config),
                                 res.instance_name))))
        if res.fleet is not None:
            from blis_fast.output.scaling import scaling_table

            tables.append(("scaling.parquet", scaling_table(res)))
        if outputs.pools is not None:
            from blis_fast.output.pools import pools_table

            tables.append(("pools.parquet", pools_table(outputs.pools)))
        from blis_fast.output.provenance import run_provenance, with_provenance

        command = "replay" if replay else "run"
        out_dir = plan.make_dir(opts.output_dir, "--output-dir")
        for name, tab in tables:
            tab = with_provenance(tab, run_provenance(name.removesuffix(".parquet"), opts,
                                                      res.config, command))
            plan.stage(out_dir / name, "--output-dir",
                       lambda tmp, tab=tab: pq.write_table(tab, tmp))


def _deciding_policy(cfg: Any) -> str:
    """The routing policy whose decisions the trace holds: in a P/D run the decode pool's
    (a weighted policy of ``--decode-routing-scorers`` when given), else ``--routing-policy``."""
    if cfg.pd_on and cfg.pd.decode_scorers:
        return "weighted"
    return cfg.policies.routing
