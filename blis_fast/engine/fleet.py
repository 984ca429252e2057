"""The instance fleet of an autoscaled run or a run on node pools (AS-2, AS-3): how many
instance rows the kernel gets, the autoscaler's state, the start-up placements and the events
pushed before the arrivals, and the instance names the outputs use.

A fixed fleet (no pools, autoscaler off) never comes here: ``EngineConfig.autoscale`` is None
and the kernel runs without any autoscaler state.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from blis_fast.config.autoscale import AutoscaleSetup
from blis_fast.engine.engine_config import EngineConfig
from blis_fast.errors import BlisRuntimeError
from blis_fast.kernels.cluster import autoscale as ak
from blis_fast.kernels.engine.heap import MAX_INSTANCES
from blis_fast.kernels.enums import Event, EventPriority, InstanceKind, Lifecycle, Registration
from blis_fast.kernels.go.gomath import INT64_MAX
from blis_fast.kernels.go.gorand import new_source, subsystem_seed

ACTUATION_RING = 256
"""Actuations that can be in flight at once (a scrape delay of 256 intervals)."""


class FleetTooSmall(Exception):
    """The kernel asked for more instance rows (``Status.GROW_FLEET``): run again, bigger."""


def startup_tp(cfg: EngineConfig) -> int:
    """GPUs of a start-up instance on a pool (the global TP, at least 1)."""
    return max(1, int(cfg.latency.tp))


def initial_rows(cfg: EngineConfig) -> int:
    """Instance rows: the start-up instances plus as many as the free GPUs could hold at once
    (exact for a run without churn; a run that outgrows it starts again with twice the rows)."""
    setup = cfg.autoscale
    n = cfg.options.num_instances
    if setup is None or not setup.has_pools:
        return n
    tp = startup_tp(cfg)
    gpus = sum(p.gpus_per_node * p.initial_nodes for p in setup.pools)
    return max(n, n + gpus // tp + (1 if setup.enabled else 0))


def row_config(cfg: EngineConfig, rows: int) -> EngineConfig:
    """``cfg`` with ``rows`` instance rows, every one sized for the largest KV capacity (each
    instance's own capacity is set when it is built)."""
    setup = cfg.autoscale
    blocks = max(setup.label_blocks) if setup.label_blocks else cfg.options.total_kv_blocks
    return replace(cfg, options=replace(cfg.options, num_instances=rows),
                   instance_kv_blocks=(blocks,) * rows,
                   instance_max_model_len=(cfg.options.max_model_len,) * rows)


def new_autoscale_state(setup: AutoscaleSetup, cfg: EngineConfig, rows: int,
                        n_requests: int) -> ak.AutoscaleState:
    """The kernel's autoscaler state for ``rows`` instances (nothing placed yet)."""
    P = ak.AsParam
    par = np.zeros(P.SIZE, np.float64)
    par[P.INTERVAL] = setup.interval_us
    par[P.UP_WINDOW] = setup.up_window_us
    par[P.DOWN_WINDOW] = setup.down_window_us
    par[P.SCRAPE_MEAN] = setup.scrape_delay.mean
    par[P.SCRAPE_STD] = setup.scrape_delay.stddev
    par[P.KV_THRESHOLD] = setup.kv_cache_threshold
    par[P.UP_THRESHOLD] = setup.scale_up_threshold
    par[P.DOWN_BOUNDARY] = setup.scale_down_boundary
    par[P.AVG_INPUT] = setup.avg_input_tokens
    par[P.LOAD_MEAN] = setup.loading_delay.mean
    par[P.LOAD_STD] = setup.loading_delay.stddev
    V = ak.AsVar
    var = np.zeros(V.SIZE, np.int64)
    var[V.HAS_POOLS] = int(setup.has_pools)
    var[V.MIN_REPLICAS] = setup.min_replicas
    var[V.MAX_REPLICAS] = setup.max_replicas
    var[V.PENDING_ARRIVALS] = n_requests
    var[V.UP_FIRST] = ak.NO_TIME
    var[V.DOWN_FIRST] = ak.NO_TIME
    var[V.TICKING] = int(setup.enabled)
    var[V.LAST_SERVING_DRAINED_AT] = -1
    var[V.LAST_SERVING_DRAINED] = -1
    var[V.TICKING_STOPPED_AT] = -1
    var[V.LAST_SKIP_AT] = -1
    var[V.HORIZON_INF] = int(cfg.options.horizon == INT64_MAX)
    node_label, gpu0 = [], [0]
    for p in setup.pools:
        for _ in range(p.initial_nodes):
            node_label.append(setup.label_id(p.gpu_type))
            gpu0.append(gpu0[-1] + p.gpus_per_node)
    free = np.diff(np.array(gpu0, np.int64))
    inst = np.full((rows, ak.AsInst.SIZE), -1, np.int64)
    seed = cfg.options.seed
    return ak.AutoscaleState(
        par=par, var=var, inst=inst, cost=np.zeros(rows, np.float64),
        label_blocks=np.array(setup.label_blocks, np.int64),
        label_max_len=np.array(setup.label_max_len, np.int64),
        label_cost=np.array(setup.label_cost, np.float64),
        node_label=np.array(node_label, np.int64), node_free=free.astype(np.int64),
        node_gpu0=np.array(gpu0, np.int64),
        gpu_owner=np.full(max(1, gpu0[-1]), -1, np.int64),
        act=np.zeros((ACTUATION_RING, 3), np.int64),
        act_sig=np.zeros((ACTUATION_RING, ak.Signal.SIZE), np.float64),
        sig=np.zeros(ak.Signal.SIZE, np.float64),
        inst_sig=np.full((rows, 2, ak.Signal.SIZE), np.nan, np.float64),
        rng_scrape=new_source(subsystem_seed(seed, "autoscaler")),
        rng_loading=new_source(subsystem_seed(seed, "instance-loading")),
        v_label=np.zeros(rows, np.int64), v_tp=np.zeros(rows, np.int64),
        v_count=np.zeros(rows, np.int64), v_order=np.zeros(rows, np.int64),
        v_supply=np.zeros(rows, np.float64), v_demand=np.zeros(rows, np.float64),
        v_cost=np.zeros(rows, np.float64))


def start_fleet(cfg: EngineConfig, asc: ak.AutoscaleState, kv, inst_cfg: np.ndarray,
                inst_rank: np.ndarray, rt, heap) -> None:
    """Build the start-up instances as the reference's constructor does (AS-2.3, AS-3.2):
    without pools every one Active; with pools first-fit placements in index order (those
    that do not fit are never built), each Active when warm-started, else Loading with a
    loading delay; then the first tick at t = 0 (before the arrivals are pushed)."""
    setup = cfg.autoscale
    n = cfg.options.num_instances
    if not setup.has_pools:
        label = setup.label_id(cfg.latency.gpu)
        for k in range(n):
            i = ak.build_instance(asc, kv, inst_cfg, inst_rank, InstanceKind.STARTUP, k, -1,
                                  label, 0, 0)
            ak.activate(asc, rt, i, 0)
    else:
        tp = startup_tp(cfg)
        for k in range(n):
            node = ak.place(asc, -1, tp)
            if node < 0:
                break
            label = int(asc.node_label[node])
            i = ak.build_instance(asc, kv, inst_cfg, inst_rank, InstanceKind.STARTUP, k, node,
                                  label, tp, 0)
            ak.start_instance(asc, rt, heap, i, 0, setup.warm_start)
    ak.rebuild_routable(asc, rt)
    if setup.enabled:
        ak.push_cluster_event(heap, 0, EventPriority.SCALING_TICK, Event.SCALING_TICK, 0)


def built(asc: ak.AutoscaleState) -> int:
    """Instances built during the run (the rows the outputs report)."""
    return int(asc.var[ak.AsVar.COUNT])


def instance_names(asc: ak.AutoscaleState, model: str) -> list[str]:
    """Each built instance's id as the reference names it: ``instance_<n>`` at start-up,
    ``autoscale-<model>-<6-digit sequence>`` when the autoscaler added it (AS-4.6)."""
    names = []
    for i in range(built(asc)):
        number = int(asc.inst[i, ak.AsInst.NUMBER])
        if asc.inst[i, ak.AsInst.KIND] == InstanceKind.AUTOSCALED:
            names.append(f"autoscale-{model}-{number:06d}")
        else:
            names.append(f"instance_{number}")
    return names


def fleet_result(res, asc: ak.AutoscaleState, model: str):
    """``res`` with its per-instance arrays cut to the instances built, their names and the
    fleet's final state."""
    n = built(asc)
    for name in ("counters", "kv_integral", "wait_queue_sum", "cache_hit_rate",
                 "thrashing_rate", "still_queued", "still_running"):
        setattr(res, name, getattr(res, name)[:n])
    res.instance_names = instance_names(asc, model)
    res.fleet = asc
    return res


def run_warnings(res) -> list[str]:
    """The traps of an autoscaled run that happened (once each, with counts and times): the
    reference's behaviour reproduced, made loud."""
    asc = res.fleet
    if asc is None:
        return []
    V, Col = ak.AsVar, ak.AsInst
    var = asc.var
    cfg = res.config
    setup = cfg.autoscale
    names = res.instance_names or []
    out: list[str] = []
    n_start = cfg.options.num_instances
    started = sum(1 for i in range(built(asc)) if asc.inst[i, Col.KIND] == InstanceKind.STARTUP)
    if started < n_start:
        missing = (f"instance_{started}" if n_start - started == 1
                   else f"instance_{started}..instance_{n_start - 1}")
        out.append(f"node pools hold GPUs for only {started} of the {n_start} startup instances "
                   f"(tp={startup_tp(cfg)}): {missing} are never created")
    if var[V.LAST_SERVING_DRAINED_AT] >= 0:
        out.append(
            f"autoscaler: at t={var[V.LAST_SERVING_DRAINED_AT] / 1e6:.3f} s the scale-down "
            f"drained the last serving instance ({names[var[V.LAST_SERVING_DRAINED]]}); the "
            "reference never scales up from zero serving instances, so later requests are "
            "rejected at routing — set autoscaler.scale_down_stabilization_window_us or "
            "autoscaler.min_replicas")
    routed_at = _routing_times(res)
    rejected = (res.registered == Registration.REJECTED_ROUTING) & _model_served(res)
    if rejected.any():
        times = routed_at[rejected]
        out.append(f"{int(rejected.sum())} request(s) were rejected at routing because no "
                   f"instance was serving (first at t={times.min() / 1e6:.3f} s, last at "
                   f"t={times.max() / 1e6:.3f} s)")
    if var[V.FAILED_PLACEMENTS] > 0:
        out.append(
            f"autoscaler: {var[V.FAILED_PLACEMENTS]} scale-up placement(s) found no free GPU "
            f"(ids {var[V.FIRST_FAILED_SEQ]:06d}..{var[V.LAST_FAILED_SEQ]:06d}); their instance "
            "ids were used up, so autoscaled ids have gaps")
    if var[V.NO_POOL_SCALE_UPS] > 0:
        out.append(
            f"autoscaler: {var[V.NO_POOL_SCALE_UPS]} scale-up decision(s) added no instance: "
            "without node_pools the reference has nowhere to place one")
    autoscaled = [n for i, n in enumerate(names) if asc.inst[i, Col.KIND] == InstanceKind.AUTOSCALED]
    if autoscaled and "/" in setup.model:
        out.append(f"autoscaled instance ids contain the model name (e.g. {autoscaled[0]}); quote "
                   "them or replace '/' before using them as file names")
    idle = [i for i in range(built(asc)) if asc.inst[i, Col.STATE] == Lifecycle.DRAINING]
    if idle and setup.has_pools:
        gpus = sum(int(asc.inst[i, Col.TP]) for i in idle)
        out.append(f"{len(idle)} drained instance(s) stayed idle and never terminated; they held "
                   f"{gpus} GPU(s) until the end")
    if var[V.SKIPPED_UNREFRESHED] > 0:
        out.append(
            f"autoscaler: ticks up to t={var[V.LAST_SKIP_AT] / 1e6:.3f} s left out "
            f"{var[V.SKIPPED_UNREFRESHED]} serving replica observation(s) whose snapshot showed "
            "no KV capacity yet (not refreshed since the start under "
            "--snapshot-refresh-interval), as the reference's analyzer does")
    stopped = var[V.TICKING_STOPPED_AT]
    if stopped >= 0 and (routed_at[res.registered != Registration.NONE] > stopped).any():
        out.append(f"autoscaler: ticking stopped at t={stopped / 1e6:.3f} s (no pending arrival, "
                   "nothing in flight) although requests were still in admission/routing; no "
                   "scaling happened after it")
    return out


def _routing_times(res) -> np.ndarray:
    """When each request reached its routing decision (arrival + both latencies)."""
    opts = res.config.options
    arrival = np.asarray(res.table.arrival_us, np.int64)[: res.registered.shape[0]]
    return arrival + opts.admission_latency + opts.routing_latency


def _model_served(res) -> np.ndarray:
    """Requests whose model is the served one (a mismatch is rejected at routing anyway)."""
    model = res.config.latency.model
    clients = res.table.clients
    bad = np.array([(c.get("model") or "") not in ("", model) for c in clients] or [False])
    idx = np.asarray(res.table.client_idx, np.int64)[: res.registered.shape[0]]
    return ~bad[idx] if len(clients) else np.ones(res.registered.shape[0], bool)


def check_rows(rows: int) -> None:
    """The event key addresses at most MAX_INSTANCES instances."""
    if rows > MAX_INSTANCES:
        raise BlisRuntimeError(f"the autoscaler would need more than {MAX_INSTANCES} instance "
                               "rows (instances are never reused after they terminate)")


__all__ = ["FleetTooSmall", "built", "fleet_result", "run_warnings", "initial_rows", "instance_names",
           "new_autoscale_state", "row_config", "start_fleet"]
