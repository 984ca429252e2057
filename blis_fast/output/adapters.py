"""The per-adapter figures of a LoRA run (LORA-8.1..8.3): the ``adapters`` block of each
metrics JSON object (per instance and cluster), and the rows of ``adapters.parquet``.

An adapter appears when a completed request on that instance (or cluster) carries it, or when
it was loaded or evicted there. Requests carry adapters whenever the workload or the trace
names them, even with LoRA inert (LORA-0.3): then every count is 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from blis_fast.output.stats import percentile_ms, sorted_values

__all__ = ["AdapterFigures", "adapter_figures", "adapter_ids", "adapter_rows", "adapters_block",
           "adapters_table", "merge_adapter_figures", "projected_adapter_figures"]


def adapter_ids(table, rows: np.ndarray) -> np.ndarray | None:
    """The adapter id of each of ``rows`` ("" for the base model), None when no request of
    the table has one (LORA-8.4)."""
    if table.adapter_idx is None or not table.adapter_names:
        return None
    names = np.array([*table.adapter_names, ""], dtype=object)
    idx = np.asarray(table.adapter_idx, np.int64)[rows]
    return names[np.where(idx >= 0, idx, len(table.adapter_names))]


@dataclass
class AdapterFigures:
    """Per adapter id: loads, evictions, the TTFTs (µs) and planned output tokens of the
    completed requests that carried it."""

    loads: dict[str, int]
    evictions: dict[str, int]
    ttft_us: dict[str, np.ndarray]
    tokens: dict[str, int]

    def ids(self) -> list[str]:
        """The ids the block lists, byte-wise sorted (LORA-8.2)."""
        listed = {a for a, v in self.loads.items() if v > 0}
        listed |= {a for a, v in self.evictions.items() if v > 0}
        listed |= set(self.ttft_us)
        return sorted(listed, key=lambda s: s.encode())


def adapter_figures(res, i: int | None = None) -> AdapterFigures | None:
    """Instance ``i``'s figures (None: the whole cluster) from a SimulationResult; None when no
    request carries an adapter."""
    table = res.table
    if table is None or table.adapter_idx is None or not table.adapter_names:
        return None
    names = table.adapter_names
    n = res.state.shape[0]
    idx = np.full(n, -1, np.int64)  # P/D: prefill sub-request rows (after the table's) have none
    idx[: min(n, table.n)] = table.adapter_idx[:n]
    done = (res.e2e_us > 0) & (idx >= 0)  # completed: an E2E entry > 0 (LORA-8.2)
    if res.pd is not None:  # a decode sub-request carries no adapter (LORA-2.4)
        done &= res.pd.decode_sub == 0
    if i is not None:
        done &= res.instance == i
    ttft: dict[str, np.ndarray] = {}
    tokens: dict[str, int] = {}
    out_len = np.zeros(n, np.int64)
    out_len[: min(n, table.n)] = table.output_len[:n]
    for a in np.unique(idx[done]).tolist():
        mine = done & (idx == a)
        ttft[names[a]] = res.ttft_us[mine].astype(np.float64)
        tokens[names[a]] = int(out_len[mine].sum())
    loads: dict[str, int] = {}
    evictions: dict[str, int] = {}
    if res.adapter_loads is not None:
        rows = slice(None) if i is None else slice(i, i + 1)
        for a, name in enumerate(names):
            loads[name] = int(res.adapter_loads[rows, a].sum())
            evictions[name] = int(res.adapter_evictions[rows, a].sum())
    return AdapterFigures(loads, evictions, ttft, tokens)


def merge_adapter_figures(figures: Sequence[AdapterFigures | None]) -> AdapterFigures | None:
    """The cluster's figures from the instances' (counts summed, samples pooled, LORA-8.3)."""
    present = [f for f in figures if f is not None]
    if not present:
        return None
    out = AdapterFigures({}, {}, {}, {})
    for f in present:
        for a, v in f.loads.items():
            out.loads[a] = out.loads.get(a, 0) + v
        for a, v in f.evictions.items():
            out.evictions[a] = out.evictions.get(a, 0) + v
        for a, v in f.ttft_us.items():
            prev = out.ttft_us.get(a)
            out.ttft_us[a] = v if prev is None else np.concatenate([prev, v])
        for a, v in f.tokens.items():
            out.tokens[a] = out.tokens.get(a, 0) + v
    return out


def adapters_block(fig: AdapterFigures | None, duration_s: float) -> dict | None:
    """The ``adapters`` JSON object (LORA-8.1/8.2), or None when it is omitted. TTFT
    percentiles are the ms percentile times 1000, as the reference computes them."""
    if fig is None:
        return None
    ids = fig.ids()
    if not ids:
        return None
    block: dict = {}
    for a in ids:
        p50 = p99 = tput = 0.0
        ttft = fig.ttft_us.get(a)
        if ttft is not None:
            s = sorted_values(ttft)
            p50 = percentile_ms(s, 50) * 1000
            p99 = percentile_ms(s, 99) * 1000
            if duration_s > 0:
                tput = float(fig.tokens.get(a, 0)) / duration_s
        block[a] = {"load_count": fig.loads.get(a, 0), "eviction_count": fig.evictions.get(a, 0),
                    "ttft_p50_us": p50, "ttft_p99_us": p99, "throughput_tok_per_s": tput}
    return block


def adapter_rows(metrics_objects: Sequence[dict]) -> list[dict]:
    """``adapters.parquet``'s rows from the metrics JSON objects (per instance, then the
    cluster's): one per adapter of each object's ``adapters`` block."""
    return [{"instance_id": m["instance_id"], "adapter": a, **figures}
            for m in metrics_objects for a, figures in (m.get("adapters") or {}).items()]


def adapters_table(rows: list[dict]):
    """``adapter_rows`` as a table with the ``schemas/adapters.json`` schema."""
    import pyarrow as pa  # lazy: pyarrow only loads when files are written

    from blis_fast.output.schemas import load_schema  # lazy: pyarrow

    return pa.Table.from_pylist(rows, schema=load_schema("adapters"))


def projected_adapter_figures(res, rows: np.ndarray, ttft_us: np.ndarray, e2e_us: np.ndarray,
                              counts: AdapterFigures | None) -> AdapterFigures | None:
    """A P/D run's cluster figures (LORA-8.3, LORA-D13): the instances' load and eviction
    counts (``counts``), the TTFTs and tokens of the projected records (``rows`` of the
    workload: local requests and disaggregated parents, which keep their adapter; a missing
    TTFT counts 0, as the reference's map lookup gives)."""
    table = res.table
    if table.adapter_idx is None or not table.adapter_names:
        return counts
    idx = np.asarray(table.adapter_idx, np.int64)[rows]
    e2e = np.nan_to_num(np.asarray(e2e_us, np.float64), nan=0.0)
    ttft = np.nan_to_num(np.asarray(ttft_us, np.float64), nan=0.0)
    out_len = np.asarray(table.output_len, np.int64)[rows]
    done = (e2e > 0) & (idx >= 0)
    out = AdapterFigures(dict(counts.loads) if counts else {},
                         dict(counts.evictions) if counts else {}, {}, {})
    for a in np.unique(idx[done]).tolist():
        mine = done & (idx == a)
        name = table.adapter_names[a]
        out.ttft_us[name] = ttft[mine]
        out.tokens[name] = int(out_len[mine].sum())
    return out
