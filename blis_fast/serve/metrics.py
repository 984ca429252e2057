"""``/metrics`` of ``blis serve``: vLLM's V1 Prometheus metrics, fed by the live simulation.

The names, help texts' meaning, label names (``model_name``, ``engine``) and histogram bucket
boundaries follow vLLM's ``PrometheusStatLogger`` (``vllm/v1/metrics/loggers.py`` of
vllm-project/vllm, the v0.11 layout that added ``vllm:inter_token_latency_seconds`` and kept
``vllm:time_per_output_token_seconds`` beside it as the deprecated name). So a dashboard, an
autoscaler or a router that reads a vLLM fleet reads this one unchanged.

What is measured, and in which clock: every latency is **simulated** time in seconds (what the
simulated vLLM instance would report on its GPU), not the wall clock of the HTTP server: at
``--speed 20`` a 100 ms simulated TTFT is 5 ms of wall time and is reported as 0.1 s. Token
counts are the simulation's. The scheduler gauges and the prefix-cache counters are read from
the simulation when ``/metrics`` is scraped (a custom collector), the request counters and
histograms are recorded as requests produce tokens and finish. Prefix-cache queries and hits
count tokens, as vLLM's do (the simulation counts blocks; they are multiplied by the block
size).

One registry holds every series, labelled ``engine="<instance index>"``; a per-instance port
exposes only its own instance's series (:func:`instance_registry`).
"""

from __future__ import annotations

import operator
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import reduce
from itertools import accumulate
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry, Counter, disable_created_metrics, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""The Prometheus text exposition format's content type (what vLLM's /metrics answers)."""

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
"""``vllm:time_to_first_token_seconds`` boundaries (vLLM's loggers.py)."""
TOKEN_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
                         2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
"""``vllm:inter_token_latency_seconds``, ``vllm:time_per_output_token_seconds`` and
``vllm:request_time_per_output_token_seconds`` boundaries (vLLM's loggers.py)."""
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                           50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
"""``vllm:e2e_request_latency_seconds`` and ``vllm:request_queue_time_seconds`` boundaries
(vLLM's ``request_latency_buckets``)."""
FINISH_REASONS = ("stop", "length", "abort")
"""vLLM's ``FinishReason`` values, each a ``finished_reason`` label of request_success."""

LABELS = ("model_name", "engine")


@dataclass(frozen=True)
class GaugeSnapshot:
    """The scheduler state of every instance at one instant (read at scrape time)."""

    running: Sequence[int]
    waiting: Sequence[int]
    kv_usage: Sequence[float]
    prefix_query_tokens: Sequence[int]
    prefix_hit_tokens: Sequence[int]


def snapshot_from_gauges(gauges: Any, block_size: int) -> GaugeSnapshot:
    """Read the live simulation's ``gauges()`` object (per-instance sequences ``running``,
    ``waiting``, ``kv_usage``, ``prefix_queries``, ``prefix_hits``; the prefix counts in blocks)
    into a :class:`GaugeSnapshot` whose prefix counts are tokens, as vLLM reports them."""
    return GaugeSnapshot(
        running=[int(v) for v in gauges.running],
        waiting=[int(v) for v in gauges.waiting],
        kv_usage=[float(v) for v in gauges.kv_usage],
        prefix_query_tokens=[int(v) * block_size for v in gauges.prefix_queries],
        prefix_hit_tokens=[int(v) * block_size for v in gauges.prefix_hits])


class _SchedulerCollector(Collector):
    """The gauges and prefix-cache counters, read from the simulation at scrape time."""

    def __init__(self, model: str, read: Callable[[], GaugeSnapshot]) -> None:
        self._model = model
        self._read = read

    def collect(self) -> Iterator[Metric]:
        snap = self._read()
        running = GaugeMetricFamily("vllm:num_requests_running",
                                    "Number of requests in model execution batches.",
                                    labels=LABELS)
        waiting = GaugeMetricFamily("vllm:num_requests_waiting",
                                    "Number of requests waiting to be processed.", labels=LABELS)
        kv = GaugeMetricFamily("vllm:kv_cache_usage_perc",
                               "KV-cache usage. 1 means 100 percent usage.", labels=LABELS)
        queries = CounterMetricFamily("vllm:prefix_cache_queries",
                                      "Prefix cache queries, in terms of number of queried "
                                      "tokens.", labels=LABELS)
        hits = CounterMetricFamily("vllm:prefix_cache_hits",
                                   "Prefix cache hits, in terms of number of cached tokens.",
                                   labels=LABELS)
        for i in range(len(snap.running)):
            labels = [self._model, str(i)]
            running.add_metric(labels, snap.running[i])
            waiting.add_metric(labels, snap.waiting[i])
            kv.add_metric(labels, snap.kv_usage[i])
            queries.add_metric(labels, snap.prefix_query_tokens[i])
            hits.add_metric(labels, snap.prefix_hit_tokens[i])
        yield from (running, waiting, kv, queries, hits)


PENDING_GAPS = 8192
"""Inter-token gaps an instance keeps unfolded before they go into its histograms."""


class _Histogram(Collector):
    """A histogram family with one series per instance, kept as plain bucket counts and
    exposed through prometheus_client's ``HistogramMetricFamily`` at scrape time.

    prometheus_client's own ``Histogram.observe`` (a lock and a loop over the boundaries per
    value) was a tenth of the server's time with 500 streams: inter-token latencies are
    observed once per token. Here a value costs one ``bisect`` and two additions.
    """

    def __init__(self, name: str, doc: str, buckets: tuple[float, ...], model: str,
                 num_instances: int) -> None:
        self.name, self.doc, self.model = name, doc, model
        self.bounds = buckets
        self.counts = [[0] * (len(buckets) + 1) for _ in range(num_instances)]
        self.sums = [0.0] * num_instances

    def observe(self, instance: int, value: float) -> None:
        self.counts[instance][bisect_left(self.bounds, value)] += 1
        self.sums[instance] += value

    def observe_many(self, instance: int, values_us: list[int]) -> None:
        """Observe each of ``values_us`` (µs, observed in seconds) as :meth:`observe` would,
        in one vectorised pass (the same buckets; the sum added value by value, in order)."""
        seconds = np.asarray(values_us, dtype=np.int64) / 1e6
        idx = np.searchsorted(np.asarray(self.bounds), seconds, side="left")
        counts = self.counts[instance]
        for k, c in enumerate(np.bincount(idx, minlength=len(counts)).tolist()):
            counts[k] += c
        self.sums[instance] = reduce(operator.add, seconds.tolist(), self.sums[instance])

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self.name, self.doc, labels=LABELS)
        edges = [floatToGoString(b) for b in self.bounds] + ["+Inf"]
        for i, counts in enumerate(self.counts):
            cumulative = list(zip(edges, accumulate(counts), strict=True))
            family.add_metric([self.model, str(i)], cumulative, self.sums[i])
        yield family


class ServeMetrics:
    """vLLM's metrics for every instance of the served fleet, in one prometheus_client
    registry: record calls take simulated microseconds and the instance index."""

    def __init__(self, model: str, num_instances: int,
                 read_gauges: Callable[[], GaugeSnapshot]) -> None:
        disable_created_metrics()  # no *_created series: a scrape shows what vLLM's shows
        self.model = model
        self.num_instances = num_instances
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(_SchedulerCollector(model, read_gauges))
        reg = self.registry
        self._success = Counter("vllm:request_success", "Count of successfully processed "
                                "requests.", [*LABELS, "finished_reason"], registry=reg)
        self._prompt = Counter("vllm:prompt_tokens", "Number of prefill tokens processed.",
                               LABELS, registry=reg)
        self._generation = Counter("vllm:generation_tokens",
                                   "Number of generation tokens processed.", LABELS,
                                   registry=reg)
        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> _Histogram:
            h = _Histogram(name, doc, buckets, model, num_instances)
            reg.register(h)
            return h

        self._ttft = histogram("vllm:time_to_first_token_seconds",
                               "Histogram of time to first token in seconds.", TTFT_BUCKETS)
        self._itl = histogram("vllm:inter_token_latency_seconds",
                              "Histogram of inter-token latency in seconds.",
                              TOKEN_LATENCY_BUCKETS)
        self._tpot = histogram("vllm:time_per_output_token_seconds",
                               "Histogram of time per output token in seconds. DEPRECATED: "
                               "Use vllm:inter_token_latency_seconds instead.",
                               TOKEN_LATENCY_BUCKETS)
        self._req_tpot = histogram("vllm:request_time_per_output_token_seconds",
                                   "Histogram of time_per_output_token_seconds per request.",
                                   TOKEN_LATENCY_BUCKETS)
        self._e2e = histogram("vllm:e2e_request_latency_seconds",
                              "Histogram of e2e request latency in seconds.",
                              REQUEST_LATENCY_BUCKETS)
        self._queue = histogram("vllm:request_queue_time_seconds",
                                "Histogram of time spent in WAITING phase for request.",
                                REQUEST_LATENCY_BUCKETS)
        # every series exists from the start, at zero; the children are looked up once
        self._success_of = [{r: self._success.labels(model, str(i), r) for r in FINISH_REASONS}
                            for i in range(num_instances)]
        self._prompt_of = [self._prompt.labels(model, str(i)) for i in range(num_instances)]
        self._generation_of = [self._generation.labels(model, str(i))
                               for i in range(num_instances)]
        self._new_tokens = [0] * num_instances  # told, not yet in their series (flush)
        self._new_gaps: list[list[int]] = [[] for _ in range(num_instances)]

    @staticmethod
    def _index(instance: int) -> int:
        return max(instance, 0)

    def first_token(self, instance: int, ttft_us: int, prompt_tokens: int) -> None:
        """A request's first token: its TTFT and its prompt tokens (vLLM counts a prompt
        when its prefill completes)."""
        self._ttft.observe(self._index(instance), ttft_us / 1e6)
        self._prompt_of[self._index(instance)].inc(prompt_tokens)

    def tokens(self, instance: int, count: int, gaps_us: Iterable[int]) -> None:
        """``count`` new output tokens and the inter-token gaps among them. Kept as plain
        numbers and folded into the counter and the two histograms when they are read
        (:meth:`flush`): per token, the prometheus counter's lock and a ``bisect`` per
        histogram were a sixth of the server's time under 500 streams."""
        i = self._index(instance)
        self._new_tokens[i] += count
        gaps = self._new_gaps[i]
        gaps.extend(gaps_us)
        if len(gaps) >= PENDING_GAPS:  # memory stays bounded without a scraper
            self._flush(i)

    def flush(self) -> None:
        """Fold the tokens and gaps told since the last read into their series."""
        for i in range(self.num_instances):
            self._flush(i)

    def _flush(self, i: int) -> None:
        if self._new_tokens[i]:
            self._generation_of[i].inc(self._new_tokens[i])
            self._new_tokens[i] = 0
        gaps = self._new_gaps[i]
        if gaps:
            self._itl.observe_many(i, gaps)
            self._tpot.observe_many(i, gaps)
            self._new_gaps[i] = []

    def finished(self, instance: int, reason: str, e2e_us: int, decode_us: int,
                 output_tokens: int, queue_us: int | None) -> None:
        """A request that ended (``reason``: stop, length or abort), with its end-to-end time,
        its decode time (first to last token) and, when known, its time in the wait queue."""
        i = self._index(instance)
        self._success_of[i][reason].inc()
        self._e2e.observe(i, e2e_us / 1e6)
        if output_tokens > 1:
            self._req_tpot.observe(i, decode_us / 1e6 / (output_tokens - 1))
        if queue_us is not None:
            self._queue.observe(i, queue_us / 1e6)

    def exposition(self, instance: int | None = None) -> bytes:
        """The Prometheus text of every instance, or of one instance only (its port)."""
        self.flush()
        if instance is None:
            return generate_latest(self.registry)
        return generate_latest(instance_registry(self.registry, instance))


class _OneInstance(Collector):
    """The series of one instance (``engine`` label) of a registry."""

    def __init__(self, source: CollectorRegistry, instance: int) -> None:
        self._source = source
        self._engine = str(instance)

    def collect(self) -> Iterator[Metric]:
        for family in self._source.collect():
            kept = Metric(family.name, family.documentation, family.type, family.unit)
            kept.samples = [s for s in family.samples if s.labels.get("engine") == self._engine]
            yield kept


def instance_registry(source: CollectorRegistry, instance: int) -> CollectorRegistry:
    """A registry that exposes only ``instance``'s series of ``source`` (a per-instance port's
    ``/metrics``: a router scraping it sees one vLLM server)."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(_OneInstance(source, instance))
    return reg


__all__ = ["CONTENT_TYPE", "FINISH_REASONS", "REQUEST_LATENCY_BUCKETS", "TOKEN_LATENCY_BUCKETS",
           "TTFT_BUCKETS", "GaugeSnapshot", "ServeMetrics", "instance_registry",
           "snapshot_from_gauges"]
