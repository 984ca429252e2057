"""Fitness of a run (CLU-7.8..7.12): the metrics it reads (:class:`RawMetrics`, also what the
report's anomaly and KV sections print), ``--fitness-weights`` parsing and the weighted score."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from blis_fast.errors import BlisConfigError
from blis_fast.gofmt import go_quote, go_trim_space
from blis_fast.gonum import parse_float
from blis_fast.output.stats import Distribution

FITNESS_KEYS = (
    "throughput",
    "tokens_per_sec",
    "p99_ttft",
    "p50_ttft",
    "mean_ttft",
    "p99_e2e",
    "p50_e2e",
    "mean_e2e",
)
_REFERENCE_RPS = 100.0
_REFERENCE_TPS = 10000.0
_REFERENCE_TICKS = 1000.0



@dataclass
class RawMetrics:
    """``cluster.RawMetrics`` (CLU-7.8): what fitness and the anomaly/KV sections read."""

    ttft: Distribution
    e2e: Distribution
    requests_per_sec: float
    tokens_per_sec: float
    priority_inversions: int
    hol_blocking_events: int
    rejected_requests: int
    routing_rejections: int
    dropped_unservable: int
    length_capped_requests: int
    timed_out_requests: int
    shed_by_tier: dict[str, int]
    cache_hit_rate: float
    preemption_rate: float
    kv_thrashing_rate: float


@dataclass
class FitnessResult:
    """Weighted fitness score and its normalised (unweighted) components."""

    score: float
    components: dict[str, float]


def parse_fitness_weights(s: str) -> dict[str, float]:
    """``ParseFitnessWeights`` (CLU-7.9); raises BlisConfigError("Invalid fitness weights: ...")."""
    if s == "":
        return {}
    weights: dict[str, float] = {}
    for raw in s.split(","):
        pair = go_trim_space(raw)
        parts = pair.split(":", 1)
        if len(parts) != 2:
            raise BlisConfigError(
                f"Invalid fitness weights: invalid fitness weight {go_quote(pair)}: expected key:value"
            )
        key = go_trim_space(parts[0])
        try:
            val = parse_float(go_trim_space(parts[1]))
        except ValueError as exc:
            raise BlisConfigError(
                f"Invalid fitness weights: invalid fitness weight value for {go_quote(key)}: {exc}"
            ) from None
        if math.isnan(val) or math.isinf(val) or val < 0:
            raise BlisConfigError(
                f"Invalid fitness weights: invalid weight for {go_quote(key)}: "
                f"must be a finite non-negative number, got {val!r}"
            )
        weights[key] = val
    return weights


def _extract_metric(m: RawMetrics, key: str) -> float | None:
    if key == "throughput":
        return m.requests_per_sec / (m.requests_per_sec + _REFERENCE_RPS)
    if key == "tokens_per_sec":
        return m.tokens_per_sec / (m.tokens_per_sec + _REFERENCE_TPS)
    src = {
        "p99_ttft": m.ttft.p99,
        "p50_ttft": m.ttft.p50,
        "mean_ttft": m.ttft.mean,
        "p99_e2e": m.e2e.p99,
        "p50_e2e": m.e2e.p50,
        "mean_e2e": m.e2e.mean,
    }
    if key in src:
        return 1.0 / (1.0 + src[key] / _REFERENCE_TICKS)
    return None


def compute_fitness(raw: RawMetrics, weights: Mapping[str, float]) -> FitnessResult:
    """``ComputeFitness`` (CLU-7.11/7.12); unknown keys raise BlisConfigError."""
    keys = sorted(weights)
    for key in keys:
        if _extract_metric(raw, key) is None:
            raise BlisConfigError(
                f"Fitness evaluation failed: unknown fitness metric key {go_quote(key)}; "
                f"valid keys: {', '.join(FITNESS_KEYS)}"
            )
    score = 0.0
    comps: dict[str, float] = {}
    for key in keys:
        value = _extract_metric(raw, key)
        assert value is not None
        comps[key] = value
        score += value * weights[key]
    return FitnessResult(score=score, components=comps)
