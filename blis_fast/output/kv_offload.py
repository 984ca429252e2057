"""summary.parquet's KV cache columns (issue 32): the prefix-cache hit rate and KV thrashing
rate every run has, and the offload chain's counts, null without ``--kv-offload-config``.

The CPU tier's counts are summed over the instances; each secondary tier's figures are list
columns with one entry per tier in the configuration's order (``kv_tier_device_class`` names
them), so a sweep's rows can be exploded by tier with polars.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["KV_OFFLOAD_COLUMNS", "kv_summary_columns"]

KV_OFFLOAD_COLUMNS = (
    "kv_cpu_mirrored_blocks", "kv_cpu_mirrors_skipped", "kv_cpu_evicted_blocks",
    "kv_cpu_reloaded_blocks", "kv_promotions", "kv_promotions_refused", "kv_deferrals",
    "kv_tier_device_class", "kv_tier_reads", "kv_tier_writes", "kv_tier_bytes_read",
    "kv_tier_bytes_written", "kv_tier_queue_wait_mean_ms",
)
"""The chain's columns of schemas/summary.json, null for a run without the chain."""


def kv_summary_columns(res: Any, instances: list) -> dict:
    """The KV columns of one run: its cluster cache hit and thrashing rates (the instances'
    mean, as the report prints them, CLU-7.1) and the chain's figures (``res.kv_offload``)."""
    count = len(instances)
    cols: dict = {
        "cache_hit_rate": (sum(float(m.cache_hit_rate) for m in instances) / count
                           if count else 0.0),
        "kv_thrashing_rate": (sum(float(m.kv_thrashing_rate) for m in instances) / count
                              if count else 0.0),
        **dict.fromkeys(KV_OFFLOAD_COLUMNS),
    }
    figures = getattr(res, "kv_offload", None)
    if figures is None:
        return cols
    tiers = res.config.kv_offload.tiers
    jobs = figures.tier_reads.sum(axis=0) + figures.tier_writes.sum(axis=0)
    wait = figures.tier_queue_wait_us.sum(axis=0).astype(np.float64)
    cols.update({
        "kv_cpu_mirrored_blocks": int(figures.cpu_mirrors.sum()),
        "kv_cpu_mirrors_skipped": int(figures.cpu_mirror_skipped.sum()),
        "kv_cpu_evicted_blocks": int(figures.cpu_evictions.sum()),
        "kv_cpu_reloaded_blocks": int(figures.cpu_reloads.sum()),
        "kv_promotions": int(figures.promotions_fired.sum()),
        "kv_promotions_refused": int(figures.promotions_failed.sum()),
        "kv_deferrals": int(figures.deferrals_started.sum()),
        "kv_tier_device_class": [t.device_class or f"tier{i}" for i, t in enumerate(tiers)],
        "kv_tier_reads": [int(v) for v in figures.tier_reads.sum(axis=0)],
        "kv_tier_writes": [int(v) for v in figures.tier_writes.sum(axis=0)],
        "kv_tier_bytes_read": [int(v) for v in figures.tier_bytes_read.sum(axis=0)],
        "kv_tier_bytes_written": [int(v) for v in figures.tier_bytes_written.sum(axis=0)],
        "kv_tier_queue_wait_mean_ms": [float(w / n / 1e3) if n else 0.0
                                       for w, n in zip(wait, jobs, strict=True)],
    })
    return cols
