"""What a run's GPUs cost (blis_fast's extension; the reference has no cost output): GPU-seconds
from each instance's lifetime (loading, serving and draining: from its placement to its
termination or the end of the run), per node pool and in total, priced per GPU-hour by
``node_pools[].gpu_hour_cost`` or ``--gpu-hour-cost``.

The end of the run is the horizon or the last instance event, whichever is earlier. Without
node pools every instance counts in one pool named ``default``; a fixed fleet's instances live
from 0 to the end.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from blis_fast.config.pd import ROLE_DECODE, ROLE_PREFILL, pool_tp

DEFAULT_POOL = "default"


@dataclass
class CostReport:
    """GPU-seconds and, when priced, the cost of a run."""

    gpu_seconds: float
    pool_gpu_seconds: dict[str, float] = field(default_factory=dict)
    priced: bool = False
    cost_usd: float | None = None
    cost_per_1k_completed_usd: float | None = None
    pool_cost_usd: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict:
        """The results file's ``cost`` object."""
        return {"gpu_seconds": self.gpu_seconds, "pool_gpu_seconds": self.pool_gpu_seconds,
                "cost_usd": self.cost_usd,
                "cost_per_1000_completed_usd": self.cost_per_1k_completed_usd}

    def section(self) -> str:
        """The stdout section (printed after everything else, only when priced)."""
        lines = ["=== Cost ===", f"GPU-Seconds: {self.gpu_seconds:.1f}"]
        lines += [f"  {pool}: {secs:.1f}" for pool, secs in self.pool_gpu_seconds.items()]
        lines.append(f"Cost (USD): {self.cost_usd:.4f}")
        per_1k = ("n/a (no request completed)" if self.cost_per_1k_completed_usd is None
                  else f"{self.cost_per_1k_completed_usd:.4f}")
        lines.append(f"Cost per 1000 Completed Requests (USD): {per_1k}")
        return "\n".join(lines) + "\n"


def summary_columns(res, cost: CostReport) -> dict:
    """The cost and fleet columns of ``summary.parquet`` (null where they do not apply)."""
    cols: dict = {"gpu_seconds": cost.gpu_seconds, "cost_usd": cost.cost_usd,
                  "cost_per_1k_completed_usd": cost.cost_per_1k_completed_usd,
                  "peak_replicas": None, "scale_up_events": None, "scale_down_events": None}
    fleet = res.fleet_view
    if fleet is not None:
        ready, drained = fleet.ready_us, fleet.drained_us
        starts = np.sort(ready[ready >= 0])
        stops = np.sort(drained[drained >= 0])
        # serving just after each activation: activated by then minus drained by then
        alive = (np.arange(1, starts.size + 1)
                 - np.searchsorted(stops, starts, side="right"))
        cols["peak_replicas"] = int(alive.max(initial=0))
        cols["scale_up_events"] = fleet.scale_ups
        cols["scale_down_events"] = fleet.scale_downs
    return cols


def instance_gpus(res) -> np.ndarray:
    """GPUs of each instance of a fixed fleet: its TP (at least 1), a P/D pool's own
    (``--prefill-tp``, ``--decode-tp``; shared pods take the decode pool's) where given."""
    cfg = res.config
    n = res.counters.shape[0]
    tp = max(1, int(cfg.latency.tp))
    gpus = np.full(n, tp, np.int64)
    if cfg.pd_on:
        roles = cfg.pd.roles(n)
        for pool, mask in (("prefill", roles == ROLE_PREFILL),
                           ("decode", (roles & ROLE_DECODE) > 0)):
            gpus[mask] = max(1, pool_tp(cfg.options, cfg.pd, pool, tp))
    return gpus


def run_end_us(res) -> int:
    """The end of the run: the horizon or the last instance event, whichever is earlier."""
    last = int(res.instance_count("CLOCK").max(initial=0))
    fleet = res.fleet_view
    if fleet is not None:
        for times in (fleet.placed_us, fleet.ready_us, fleet.drained_us, fleet.terminated_us):
            last = max(last, int(times.max(initial=0)))
    return min(last, int(res.config.options.horizon))


def run_cost(res, completed: int) -> CostReport:
    """GPU-seconds per pool and in total, priced when a price was given."""
    opts = res.config.options
    end = run_end_us(res)
    setup = res.config.autoscale
    per_pool: dict[str, float] = {}
    price_of: dict[str, float | None] = {}
    flag_price = opts.gpu_hour_cost if opts.given("gpu_hour_cost") else None
    fleet = res.fleet_view
    if fleet is None or not setup.has_pools:
        price_of[DEFAULT_POOL] = flag_price
    else:
        for p in setup.pools:
            price_of[p.name] = p.gpu_hour_cost if p.gpu_hour_cost is not None else flag_price
    if fleet is None:
        per_pool[DEFAULT_POOL] = float(instance_gpus(res).sum()) * end / 1e6
    else:
        from blis_fast.output.scaling import node_names  # lazy: scaling loads pyarrow

        pool_of, _ = node_names(setup.pools)
        for p in price_of:
            per_pool[p] = 0.0
        for placed, gone, node, tp in zip(fleet.placed_us.tolist(), fleet.terminated_us.tolist(),
                                          fleet.node.tolist(), fleet.tp.tolist(), strict=True):
            if placed > end:
                continue
            stop = end if gone < 0 else min(gone, end)
            pool = pool_of[node] if node >= 0 else DEFAULT_POOL
            gpus = max(1, tp) if node >= 0 else max(1, int(res.config.latency.tp))
            per_pool[pool] = per_pool.get(pool, 0.0) + gpus * (stop - placed) / 1e6
    report = CostReport(gpu_seconds=float(np.sum(list(per_pool.values()))),
                        pool_gpu_seconds=per_pool)
    if any(v is not None for v in price_of.values()):
        report.priced = True
        report.pool_cost_usd = {p: per_pool[p] / 3600.0 * (price_of.get(p) or 0.0)
                                for p in per_pool}
        report.cost_usd = float(sum(report.pool_cost_usd.values()))
        if completed > 0:
            report.cost_per_1k_completed_usd = report.cost_usd * 1000.0 / completed
    return report
