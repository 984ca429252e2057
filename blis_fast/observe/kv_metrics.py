"""``blis observe --scrape-kv-metrics``: the real server's KV-cache hit rate over the window
(KVO-11.3, OBS-9; the August reference's #1598).

The server's Prometheus ``/metrics`` text is read twice: just before the first request of the
workload (after the token-ratio request) and after the last one. Each scrape becomes a
name -> value map, every label set of a name summed (engines, tiers) and one trailing
``_total`` dropped from the name (prometheus_client writes counters with it). The hit rate
comes from the first family present in the end scrape:

1. ``vllm:kv_offload_tiering_block_hits/_block_queries`` (vLLM's offload tiers): source
   ``tiered``, with the read/write time deltas;
2. ``vllm:gpu_prefix_cache_hits/_queries`` (the GPU prefix cache): source
   ``gpu-prefix-cache-fallback``;
3. ``vllm:prefix_cache_hits/_queries``, the same counters under the name released vLLM uses
   since its V1 engine (blis_fast's addition: the reference knows only the older name and
   finds nothing on such a server); same source tag;
4. the ``vllm:gpu_prefix_cache_hit_rate`` gauge's end value (no counts).

Counts are end - start deltas (a name missing at the start counts from 0). A window without
queries, more hits than queries, a counter that went backwards, no known family — and, beyond
the reference, a value that is not a finite number, a gauge outside [0, 1] or a body the
Prometheus parser rejects — give a warning and no header block: observing never fails on
the metrics endpoint.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

from blis_fast.workload.trace_v2 import (
    OBSERVED_KV_SOURCE_GPU,
    OBSERVED_KV_SOURCE_TIERED,
    ObservedKVMetrics,
)

if TYPE_CHECKING:
    from blis_fast.observe.client import RealClient

log = logging.getLogger("blis_fast.observe")

TIERING_HITS = "vllm:kv_offload_tiering_block_hits"
TIERING_QUERIES = "vllm:kv_offload_tiering_block_queries"
TIERING_READ_TIME = "vllm:kv_offload_tiering_read_time"
TIERING_WRITE_TIME = "vllm:kv_offload_tiering_write_time"
GPU_HITS = "vllm:gpu_prefix_cache_hits"
GPU_QUERIES = "vllm:gpu_prefix_cache_queries"
V1_HITS = "vllm:prefix_cache_hits"
V1_QUERIES = "vllm:prefix_cache_queries"
GPU_HIT_RATE_GAUGE = "vllm:gpu_prefix_cache_hit_rate"

SCRAPE_TIMEOUT_S = 30.0
"""Longest wait for one ``/metrics`` answer (or the observe ``--timeout``, if shorter)."""
MAX_COUNT = float(1 << 62)
"""Largest counter delta taken as a count (the header holds int64 counts)."""


class KVMetricsError(ValueError):
    """Why no hit rate can be recorded (one line; the caller warns and writes no block)."""


def parse_metrics_text(text: str) -> dict[str, float]:
    """The samples of a Prometheus text exposition as name -> value, values of a name summed
    over its label sets, one trailing ``_total`` removed from each name."""
    from prometheus_client.parser import text_string_to_metric_families  # lazy: observe only

    sums: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                name = sample.name.removesuffix("_total")
                sums[name] = sums.get(name, 0.0) + float(sample.value)
    except (ValueError, TypeError, IndexError) as exc:
        raise KVMetricsError(f"the /metrics text is not Prometheus exposition format ({exc})"
                             ) from None
    return sums


def _delta(start: dict[str, float], end: dict[str, float], name: str) -> float:
    """``end[name] - start[name]`` (missing: 0); refused when not finite or negative."""
    a, b = start.get(name, 0.0), end.get(name, 0.0)
    if not (math.isfinite(a) and math.isfinite(b)):
        raise KVMetricsError(f"counter {name} is not a finite number (start {a:g}, end {b:g})")
    d = b - a
    if d < 0:
        raise KVMetricsError(f"counter {name} went backwards over the window (start {a:.0f}, "
                             f"end {b:.0f}; was the server restarted?)")
    if d > MAX_COUNT:
        raise KVMetricsError(f"counter {name} grew by {d:g} over the window, more than any "
                             "real count")
    return d


def _counted(start: dict[str, float], end: dict[str, float], hits_name: str,
             queries_name: str, source: str, vllm_commit: str) -> ObservedKVMetrics:
    queries = _delta(start, end, queries_name)
    hits = _delta(start, end, hits_name)
    if queries <= 0:
        raise KVMetricsError(f"{queries_name} did not grow over the window (no queries), so "
                             "there is no hit rate to record")
    if hits > queries:
        raise KVMetricsError(f"{hits_name} grew by {hits:.0f} but {queries_name} only by "
                             f"{queries:.0f}: a hit rate above 1 cannot be right")
    read = write = 0.0
    if source == OBSERVED_KV_SOURCE_TIERED:
        read, write = (_optional_delta(start, end, TIERING_READ_TIME),
                       _optional_delta(start, end, TIERING_WRITE_TIME))
    return ObservedKVMetrics(source=source, hit_rate=hits / queries,
                             block_hits=math.floor(hits + 0.5),
                             block_queries=math.floor(queries + 0.5),
                             read_time_total=read, write_time_total=write,
                             vllm_commit=vllm_commit)


def _optional_delta(start: dict[str, float], end: dict[str, float], name: str) -> float:
    """An informational delta (the tier read/write times): 0 where it cannot be taken."""
    try:
        return _delta(start, end, name)
    except KVMetricsError:
        return 0.0


def derive_hit_rate(start: dict[str, float], end: dict[str, float],
                    vllm_commit: str = "") -> ObservedKVMetrics:
    """The header block from the two scrapes (family precedence in the module docstring);
    raises :class:`KVMetricsError` when no hit rate can be recorded."""
    if TIERING_QUERIES in end:
        return _counted(start, end, TIERING_HITS, TIERING_QUERIES, OBSERVED_KV_SOURCE_TIERED,
                        vllm_commit)
    for hits, queries in ((GPU_HITS, GPU_QUERIES), (V1_HITS, V1_QUERIES)):
        if queries in end:
            return _counted(start, end, hits, queries, OBSERVED_KV_SOURCE_GPU, vllm_commit)
    if GPU_HIT_RATE_GAUGE in end:
        rate = end[GPU_HIT_RATE_GAUGE]
        if not 0 <= rate <= 1:  # NaN fails too
            raise KVMetricsError(f"gauge {GPU_HIT_RATE_GAUGE} is {rate:g}, not a rate in [0, 1]")
        return ObservedKVMetrics(source=OBSERVED_KV_SOURCE_GPU, hit_rate=rate,
                                 vllm_commit=vllm_commit)
    raise KVMetricsError(f"no KV-cache counters in /metrics (looked for {TIERING_QUERIES}, "
                         f"{GPU_QUERIES}, {V1_QUERIES} and {GPU_HIT_RATE_GAUGE})")


def metrics_url(server_url: str, kv_metrics_url: str) -> str:
    """``--kv-metrics-url``, else ``<server-url>/metrics``."""
    return kv_metrics_url or server_url.rstrip("/") + "/metrics"


async def scrape(client: RealClient, url: str) -> dict[str, float]:
    """One scrape of ``url`` parsed (:func:`parse_metrics_text`); raises
    :class:`KVMetricsError` with the reason."""
    try:
        text = await client.get_text(url, min(SCRAPE_TIMEOUT_S, client.timeout_s))
    except ValueError as exc:
        raise KVMetricsError(str(exc)) from None
    return parse_metrics_text(text)


async def window_start(client: RealClient, url: str) -> dict[str, float] | None:
    """The start-of-window scrape; None (after a warning) when it failed, so no end scrape
    is made and no block written."""
    try:
        return await scrape(client, url)
    except KVMetricsError as exc:
        log.warning("observe: --scrape-kv-metrics: the scrape before the workload failed: %s; "
                    "the trace header will have no observed_kv_metrics", exc)
        return None


async def window_end(client: RealClient, url: str, start: dict[str, float] | None,
                     vllm_commit: str) -> ObservedKVMetrics | None:
    """The end-of-window scrape and the header block; None (after a warning) on any failure,
    or without a start scrape."""
    if start is None:
        return None
    try:
        block = derive_hit_rate(start, await scrape(client, url), vllm_commit)
    except KVMetricsError as exc:
        log.warning("observe: --scrape-kv-metrics: %s; the trace header will have no "
                    "observed_kv_metrics", exc)
        return None
    log.info("observe: observed KV hit rate %.4f (source %s, %d hits of %d queries)",
             block.hit_rate, block.source, block.block_hits, block.block_queries)
    return block
