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
from blis_fast.options import RUN_OPTIONS
from blis_fast.output.adapters import adapter_figures, adapter_rows, adapters_table
from blis_fast.output.cost import CostReport, run_cost, summary_columns
from blis_fast.output.decisions import decision_columns
from blis_fast.output.kv_offload import kv_summary_columns
from blis_fast.output.pd import (
    cluster_aggregate_pd,
    pd_figures,
    pd_section,
    pd_summary_columns,
    project,
    request_columns_pd,
)
from blis_fast.output.report import ClusterReport, render_report, summarize_trace
from blis_fast.output.requests import request_columns
from blis_fast.output.summary import (
    InstanceMetrics,
    RequestColumns,
    aggregate_instances,
    build_metrics_output,
    replay_results_text,
    results_text,
)
from blis_fast.workload.request_table import RequestTable
from blis_fast.workload.trace_v2 import (
    ObservedKVMetrics,
    TraceOutcome,
    kv_offload_header_text,
    trace_v2_files,
)


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
    cache_hit_rate: float = 0.0  # the cluster's: the mean of the instances' (CLU-7.1)


def plan_outputs(opts: Any, replay: bool) -> OutputPlan:
    """Check every output path of the run before anything is generated or simulated."""
    plan = OutputPlan()  # no output may overwrite an input
    for spec in RUN_OPTIONS:
        path = getattr(opts, spec.field)
        if spec.file == "input":
            plan.add_inputs([(f"--{spec.flag}", path)])
        elif spec.file == "input-folder" and path:
            plan.add_inputs([(f"--{spec.flag}", os.path.join(path, "config.json"))])
    if not replay and opts.metrics_path and opts.results_path and (
            os.path.realpath(opts.metrics_path) != os.path.realpath(opts.results_path)):
        raise BlisConfigError("--metrics-path and --results-path are two names of one output; "
                              f"give one of them (got {opts.metrics_path!r} and "
                              f"{opts.results_path!r})")
    if replay:  # two outputs: SimResults (--results-path) and the metrics file (--metrics-path)
        if opts.results_path:
            plan.check_file(opts.results_path, "--results-path")
        if opts.metrics_path:
            plan.check_file(opts.metrics_path, "--metrics-path")
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
                         "scaling.parquet", "pools.parquet", "adapters.parquet"):
                plan.check_file(os.path.join(opts.output_dir, name), "--output-dir")
    return plan


def instance_metrics(res: SimulationResult) -> list[InstanceMetrics]:
    """Per-instance metrics objects for the report (ENG-7, CLU-7.1)."""
    out: list[InstanceMetrics] = []
    ended = res.sim_ended_us
    otp = res.config.latency.output_token_time
    for i in range(res.counters.shape[0]):
        mine = res.instance == i
        ttft = res.ttft_us[mine & (res.ttft_us >= 0)].astype(np.float64)
        e2e = res.e2e_us[mine & (res.e2e_us >= 0)].astype(np.float64)
        sched = res.sched_delay_us[mine & (res.sched_delay_us >= 0)].astype(np.int64)
        steps = (res.step_instance == i) & (res.step_itl_count > 0)
        out.append(InstanceMetrics(
            completed=int(res.instance_count("COMPLETED")[i]),
            still_queued=int(res.still_queued[i]),
            still_running=int(res.still_running[i]),
            dropped_unservable=int(res.instance_count("DROPPED")[i]),
            timed_out=int(res.instance_count("TIMED_OUT")[i]),
            length_capped=int(res.instance_count("LENGTH_CAPPED")[i]),
            total_input_tokens=int(res.instance_count("IN_TOKENS")[i]),
            total_output_tokens=int(res.instance_count("OUT_TOKENS")[i]),
            preemption_count=int(res.instance_count("PREEMPTIONS")[i]),
            kv_allocation_failures=int(res.instance_count("KV_FAILURES")[i]),
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
            adapters=adapter_figures(res, i),
        ))
    return out


def trace_outcome(res: SimulationResult, n: int | None = None) -> TraceOutcome:
    """Per-request status/TTFT/ITL sums for the trace v2 export (WL-9.5) of the first ``n``
    requests (default: all). A disaggregated request is exported as the reference does: its
    original request never ran, so it is incomplete with no first token (PD-6.6)."""
    if n is None:
        n = res.table.n
    state = res.state[:n]
    status = np.full(state.shape[0], 2, dtype=np.int8)
    status[res.completed[:n]] = 0
    status[res.timed_out[:n]] = 1
    # chunk times only while the first token stands: a request preempted after it and not
    # re-prefilled since (then timed out or cut by the horizon) has none, as in the reference
    ttft = np.where(res.ttft_standing[:n], res.ttft_us[:n], -1).astype(np.int64)
    itl = res.itl_sum_us[:n].astype(np.int64)
    if res.pd is not None:
        split = res.pd.disaggregated[:n]
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
    for idx in np.flatnonzero(res.rejected_at_admission):
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
        from blis_fast.output.pools import pool_rows  # lazy: pools loads pyarrow, P/D only

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
        num_instances=opts.num_instances,
        replay_timeouts=replay and res.adapter_loads is not None,
    )
    cost = run_cost(res, int(aggregate.completed))
    stdout = render_report(report)
    if cost.priced:
        stdout += cost.section()
    return RunOutputs(stdout=stdout, summary=summary, per_instance=per_instance,
                      requests=requests, cost=cost if cost.priced else None,
                      summary_extras={**summary_columns(res, cost),
                                      **pd_summary_columns(figures),
                                      **kv_summary_columns(res, instances)},
                      pools=pools, cache_hit_rate=float(aggregate.cache_hit_rate))


def write_outputs(plan: OutputPlan, opts: Any, replay: bool, injected: RequestTable,
                  res: SimulationResult, outputs: RunOutputs,
                  observed_kv: ObservedKVMetrics | None = None) -> None:
    """Stage every requested output file and publish them together (any failure removes them
    all); ``injected`` is the table of the requests the run injected itself, ``observed_kv``
    a replayed trace's ``observed_kv_metrics`` (copied into its ``--trace-output`` header)."""
    with plan:
        _stage(plan, opts, replay, injected, res, outputs, observed_kv)
        plan.commit()


def writes_cache_hit_rate(replay: bool, res: SimulationResult) -> bool:
    """Whether the ``--metrics-path`` file carries ``cache_hit_rate`` (KVO-10.3).

    The August reference writes it into every such file; the April reference never does. So
    that every April case keeps its exact keys, blis_fast writes it where no April command
    line can reach: ``blis replay --metrics-path`` (April's replay has no metrics file) and a
    ``blis run`` with the ``--kv-offload-config`` tier chain (an August-only flag)."""
    return replay or res.config.kv_offload is not None


def metrics_file_head(outputs: RunOutputs, hit_rate: bool) -> dict:
    """The metrics file's top-level object: the cluster summary, ``cache_hit_rate`` after
    ``preemption_count`` where the reference's struct has it (with ``hit_rate``), then the
    cost block of a priced run."""
    head: dict = {}
    for key, value in outputs.summary.items():
        head[key] = value
        if key == "preemption_count" and hit_rate:
            head["cache_hit_rate"] = outputs.cache_hit_rate
    if outputs.cost is not None:
        head["cost"] = outputs.cost.as_dict()
    return head


def _stage(plan: OutputPlan, opts: Any, replay: bool, injected: RequestTable,
           res: SimulationResult, outputs: RunOutputs,
           observed_kv: ObservedKVMetrics | None = None) -> None:
    offload = kv_offload_header_text(res.config.kv_offload)  # KVO-11.1: "" without the chain
    if opts.trace_output and replay:
        # a replay exports the requests it injected, in injection order (DELTA-64/65), and
        # keeps the trace's observed hit rate (KVO-11.3: a replay cannot measure it again)
        files = trace_v2_files(opts.trace_output, injected, trace_outcome(res, injected.n),
                               replayed=True, kv_offload=offload, observed_kv=observed_kv)
    elif opts.trace_output:
        files = trace_v2_files(opts.trace_output, res.table, trace_outcome(res),
                               kv_offload=offload)
    else:
        files = []
    for path, text in files:
        plan.stage_text(path, "--trace-output", text)
    if replay and opts.results_path:
        plan.stage_text(opts.results_path, "--results-path", replay_results_text(outputs.requests))
    if (opts.metrics_path if replay else opts.metrics_path or opts.results_path):
        flag = "--metrics-path" if opts.metrics_path else "--results-path"
        head = metrics_file_head(outputs, writes_cache_hit_rate(replay, res))
        plan.stage_text(opts.metrics_path or opts.results_path, flag,
                        results_text(head, outputs.requests))
    if opts.output_dir:
        import pyarrow.parquet as pq  # lazy: pyarrow only loads when files are written

        from blis_fast.output.parquet import requests_table, summary_table  # lazy: pyarrow

        tables = [("summary.parquet", summary_table({**outputs.summary,
                                                     **outputs.summary_extras})),
                  ("requests.parquet", requests_table(outputs.requests))]
        if res.decisions is not None:
            from blis_fast.output.parquet import decisions_table  # lazy: pyarrow

            tables.append(("decisions.parquet", decisions_table(
                decision_columns(res.decisions, _deciding_policy(res.config),
                                 res.instance_name))))
        if res.fleet is not None:
            from blis_fast.output.scaling import scaling_table  # lazy: pyarrow

            tables.append(("scaling.parquet", scaling_table(res)))
        if outputs.pools is not None:
            from blis_fast.output.pools import pools_table  # lazy: pyarrow

            tables.append(("pools.parquet", pools_table(outputs.pools)))
        if "adapters" in outputs.summary:  # LoRA: the adapters blocks as rows
            tables.append(("adapters.parquet", adapters_table(
                adapter_rows([*outputs.per_instance, outputs.summary]))))
        from blis_fast.output.provenance import (  # lazy: pyarrow
            run_provenance,
            with_provenance,
        )

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
