"""``scaling.parquet``: the fleet's timeline (one row per lifecycle change of an instance) of an
autoscaled run or a run on node pools, built from the fleet at the end of the run
(``SimulationResult.fleet_view``: each instance's placement, ready, drain and termination
times and the signal values of the decision that placed or drained it)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from blis_fast.output.schemas import load_schema

_EVENTS = (  # (time column of the fleet view, state, order within a time)
    ("placed_us", "loading", 0), ("ready_us", "active", 1),
    ("drained_us", "draining", 2), ("terminated_us", "terminated", 3))

_SIGNAL_COLUMNS = (("decision_time_us", int), ("signal_since_us", int), ("supply_tokens", float),
                   ("demand_tokens", float), ("pending_tokens", float), ("signal_tokens", float),
                   ("delta", int))
"""The signal columns (fields of ``ScalingSignals`` of the same names) and their types."""


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
    fleet = res.fleet_view
    setup = res.config.autoscale
    names = res.instance_names
    placed, ready = fleet.placed_us.tolist(), fleet.ready_us.tolist()
    node_of, tp_of, label_of = fleet.node.tolist(), fleet.tp.tolist(), fleet.label.tolist()
    autoscaled = fleet.autoscaled.tolist()
    pool_of, node_name = node_names(setup.pools)
    events = []
    for attr, state, order in _EVENTS:
        for i, t in enumerate(getattr(fleet, attr).tolist()):
            if t < 0 or (state == "loading" and ready[i] == t):
                continue  # never happened, or active at once (no loading row)
            events.append((t, order, i, state))
    events.sort(key=lambda e: (e[0], e[2], e[1]))
    cols: dict[str, list] = {f.name: [] for f in load_schema("scaling")}
    state_now = ["" for _ in names]
    for t, _order, i, state in events:
        if state in ("loading", "active") and (state == "loading" or placed[i] == t):
            reason = "scale_up" if autoscaled[i] else (
                "warm_start" if state == "active" and setup.has_pools and setup.warm_start
                else "startup")
        else:
            reason = {"active": "loaded", "draining": "scale_down", "terminated": "drained"}[state]
        state_now[i] = state
        node = node_of[i]
        cols["time_us"].append(t)
        cols["instance"].append(names[i])
        cols["pool"].append(pool_of[node] if node >= 0 else None)
        cols["node"].append(node_name[node] if node >= 0 else None)
        cols["gpu_type"].append(setup.labels[label_of[i]])
        cols["tp"].append(max(1, tp_of[i]))
        cols["state"].append(state)
        cols["reason"].append(reason)
        cols["routable_after"].append(state_now.count("active"))
        cols["loading_after"].append(state_now.count("loading"))
        cols["gpus_allocated_after"].append(sum(
            max(1, tp_of[k]) for k, s in enumerate(state_now)
            if s not in ("", "terminated") and node_of[k] >= 0))
        signals = {"scale_up": fleet.placed_by, "scale_down": fleet.drained_by}.get(reason)
        decided = signals is not None and not np.isnan(signals.decision_time_us[i])
        for name, kind in _SIGNAL_COLUMNS:
            cols[name].append(kind(getattr(signals, name)[i]) if decided else None)
    return cols


def scaling_table(res) -> pa.Table:
    """The timeline as a table with the ``schemas/scaling.json`` schema."""
    schema = load_schema("scaling")
    cols = scaling_columns(res)
    return pa.Table.from_pydict({f.name: cols[f.name] for f in schema}, schema=schema)
