"""``scaling.parquet``: the fleet's timeline (one row per lifecycle change of an instance) of an
autoscaled run or a run on node pools, built from the end state of ``kernels/cluster/autoscale.py``
(each instance's placement, ready, drain and termination times and the signal values of the
decision that placed or drained it)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from blis_fast.kernels.cluster.autoscale_layout import AsInst, Signal
from blis_fast.kernels.enums import InstanceKind
from blis_fast.output.schemas import load_schema

_EVENTS = (  # (time column, state, order within a time)
    (AsInst.PLACED, "loading", 0), (AsInst.READY, "active", 1),
    (AsInst.DRAINED, "draining", 2), (AsInst.TERMINATED, "terminated", 3))


def node_names(pools) -> tuple[list[str], list[str]]:
    """Each node's pool and name (``<pool>-<k>``), in inventory order."""
    pool_of, names = [], []
    for p in pools:
        for k in range(p.initial_nodes):
            pool_of.append(p.name)
            names.append(f"{p.name}-{k}")
    return pool_of, names


def scaling_columns(res) -> dict[str, list]:
    """The timeline's columns (``schemas/scaling.json``)."""
    asc = res.fleet
    setup = res.config.autoscale
    names = res.instance_names
    inst = asc.inst[: len(names)]
    pool_of, node_name = node_names(setup.pools)
    events = []
    for i, row in enumerate(inst):
        for col, state, order in _EVENTS:
            t = int(row[col])
            if t < 0 or (state == "loading" and row[AsInst.READY] == t):
                continue  # never happened, or active at once (no loading row)
            events.append((t, order, i, state))
    events.sort(key=lambda e: (e[0], e[2], e[1]))
    cols: dict[str, list] = {f.name: [] for f in load_schema("scaling")}
    state_now = ["" for _ in names]
    for t, _order, i, state in events:
        row = inst[i]
        autoscaled = row[AsInst.KIND] == InstanceKind.AUTOSCALED
        if state in ("loading", "active") and (state == "loading" or row[AsInst.PLACED] == t):
            reason = "scale_up" if autoscaled else (
                "warm_start" if state == "active" and setup.has_pools and setup.warm_start
                else "startup")
        else:
            reason = {"active": "loaded", "draining": "scale_down", "terminated": "drained"}[state]
        state_now[i] = state
        node = int(row[AsInst.NODE])
        cols["time_us"].append(t)
        cols["instance"].append(names[i])
        cols["pool"].append(pool_of[node] if node >= 0 else None)
        cols["node"].append(node_name[node] if node >= 0 else None)
        cols["gpu_type"].append(setup.labels[int(row[AsInst.LABEL])])
        cols["tp"].append(max(1, int(row[AsInst.TP])))
        cols["state"].append(state)
        cols["reason"].append(reason)
        cols["routable_after"].append(state_now.count("active"))
        cols["loading_after"].append(state_now.count("loading"))
        cols["gpus_allocated_after"].append(sum(
            max(1, int(inst[k, AsInst.TP])) for k, s in enumerate(state_now)
            if s not in ("", "terminated") and inst[k, AsInst.NODE] >= 0))
        sig = None
        if reason == "scale_up":
            sig = asc.inst_sig[i, 0]
        elif reason == "scale_down":
            sig = asc.inst_sig[i, 1]
        decided = sig is not None and not np.isnan(sig[Signal.TICK])
        for name, k, kind in (("decision_time_us", Signal.TICK, int),
                              ("signal_since_us", Signal.SINCE, int),
                              ("supply_tokens", Signal.SUPPLY, float),
                              ("demand_tokens", Signal.DEMAND, float),
                              ("pending_tokens", Signal.PENDING, float),
                              ("signal_tokens", Signal.AMOUNT, float),
                              ("delta", Signal.DELTA, int)):
            cols[name].append(kind(sig[k]) if decided else None)
    return cols


def scaling_table(res) -> pa.Table:
    """The timeline as a table with the ``schemas/scaling.json`` schema."""
    schema = load_schema("scaling")
    cols = scaling_columns(res)
    return pa.Table.from_pydict({f.name: cols[f.name] for f in schema}, schema=schema)
