"""The autoscaler's part of a policy bundle (AS-1): ``autoscaler``, ``node_pools`` and
``instance_lifecycle``, decoded strictly and validated in the reference's order with its
messages (Go ``sim/bundle.go: PolicyBundle.Validate`` at f90a1e3a), then blis_fast's own checks.

Keys the reference validates and then never reads (``node_pools[].min_nodes``,
``node_pools[].provisioning_delay``: nodes are never added or removed during a run) are refused
at parse with a message naming them; ``max_nodes`` is accepted (the reference requires it
>= ``initial_nodes``) and has no other effect.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import yaml

from blis_fast.config.strict_yaml import (
    YamlContext,
    as_bool,
    as_float,
    as_int,
    as_str,
    decode_struct,
    is_null,
)
from blis_fast.gofmt import go_g, go_quote
from blis_fast.options import MAX_GPU_HOUR_COST, TIME_LIMIT_US

MAX_GPU_MEMORY_GIB = 4096
"""Largest ``gpu_memory_gib`` of a node pool (GiB; today's largest GPUs have under 300)."""

MAX_POOL_GPUS = 1 << 20
"""Most GPUs all node pools may hold together (blis_fast's own limit: inventory arrays)."""
DEFAULT_KV_CACHE_THRESHOLD = 0.8
DEFAULT_SCALE_UP_THRESHOLD = 0.8
DEFAULT_SCALE_DOWN_BOUNDARY = 0.4
DEFAULT_AVG_INPUT_TOKENS = 512.0
"""The analyzer's defaults for a zero (unset) threshold (Go ``saturation_analyzer.go``)."""


@dataclass
class DelaySpec:
    """A delay in seconds: ``mean`` plus a normal draw of ``stddev`` when it is > 0 (AS-3.3)."""

    mean: float = 0.0
    stddev: float = 0.0


@dataclass
class AutoscalerBundle:
    """``autoscaler:``; ``keys`` holds the dotted names of the keys the file set."""

    interval_us: float = 0.0
    scale_up_window_us: float = 0.0
    scale_down_window_us: float = 0.0
    scrape_delay: DelaySpec = field(default_factory=DelaySpec)
    kv_cache_threshold: float = 0.0
    scale_up_threshold: float = 0.0
    scale_down_boundary: float = 0.0
    avg_input_tokens: float = 0.0
    min_replicas: int | None = None  # blis_fast's extension (AS plan 4.8)
    max_replicas: int | None = None
    keys: frozenset[str] = frozenset()


@dataclass
class NodePoolBundle:
    """One ``node_pools`` entry (a static set of identical nodes, AS-2.1)."""

    name: str = ""
    gpu_type: str = ""
    gpus_per_node: int = 0
    gpu_memory_gib: float = 0.0
    initial_nodes: int = 0
    max_nodes: int = 0
    cost_per_hour: float = 0.0
    gpu_hour_cost: float | None = None  # ours: the price of one GPU-hour (cost outputs)


@dataclass
class LifecycleBundle:
    """``instance_lifecycle:`` (AS-3.3): the loading delay and warm start of startup instances."""

    loading_delay: DelaySpec = field(default_factory=DelaySpec)
    warm_start_initial_instances: bool = False
    present: bool = False


def _delay(ctx: YamlContext, node: yaml.Node, what: str) -> DelaySpec:
    v = decode_struct(ctx, node, what, {"mean": as_float, "stddev": as_float})
    return DelaySpec(v.get("mean", 0.0), v.get("stddev", 0.0))


def _opt_int(ctx: YamlContext, node: yaml.Node, what: str) -> int | None:
    return None if is_null(node) else as_int(ctx, node, what)


_ANALYZER_FIELDS = {"kv_cache_threshold": as_float, "scale_up_threshold": as_float,
                    "scale_down_boundary": as_float, "avg_input_tokens": as_float}


def decode_autoscaler(ctx: YamlContext, node: yaml.Node, what: str) -> AutoscalerBundle:
    """``autoscaler:`` (strict: unknown keys fail naming the key)."""
    v = decode_struct(ctx, node, what, {
        "interval_us": as_float,
        "scale_up_stabilization_window_us": as_float,
        "scale_down_stabilization_window_us": as_float,
        "hpa_scrape_delay": _delay,
        "analyzer": lambda c, n, w: decode_struct(c, n, w, _ANALYZER_FIELDS),
        "min_replicas": _opt_int,
        "max_replicas": _opt_int,
    })
    analyzer = v.get("analyzer", {})
    keys = {k for k in v if k != "analyzer"} | {f"analyzer.{k}" for k in analyzer}
    return AutoscalerBundle(
        interval_us=v.get("interval_us", 0.0),
        scale_up_window_us=v.get("scale_up_stabilization_window_us", 0.0),
        scale_down_window_us=v.get("scale_down_stabilization_window_us", 0.0),
        scrape_delay=v.get("hpa_scrape_delay", DelaySpec()),
        kv_cache_threshold=analyzer.get("kv_cache_threshold", 0.0),
        scale_up_threshold=analyzer.get("scale_up_threshold", 0.0),
        scale_down_boundary=analyzer.get("scale_down_boundary", 0.0),
        avg_input_tokens=analyzer.get("avg_input_tokens", 0.0),
        min_replicas=v.get("min_replicas"), max_replicas=v.get("max_replicas"),
        keys=frozenset(keys))


def _static_node_key(ctx: YamlContext, node: yaml.Node, what: str) -> None:
    raise ctx.fail(node, f"{what}: nodes are never added or removed during a run (the reference "
                         "validates this key and ignores it); remove it")


_POOL_FIELDS = {
    "name": as_str, "gpu_type": as_str, "gpus_per_node": as_int, "gpu_memory_gib": as_float,
    "initial_nodes": as_int, "max_nodes": as_int, "cost_per_hour": as_float,
    "gpu_hour_cost": as_float,
    "min_nodes": _static_node_key, "provisioning_delay": _static_node_key,
}


def decode_node_pools(ctx: YamlContext, node: yaml.Node, what: str) -> list[NodePoolBundle]:
    """``node_pools:``, a list of pools in declaration order."""
    if is_null(node):
        return []
    if not isinstance(node, yaml.SequenceNode):
        raise ctx.fail(node, f"{what}: expected a list of node pools")
    pools = []
    for k, item in enumerate(node.value):
        v = decode_struct(ctx, item, f"{what}[{k}]", _POOL_FIELDS)
        pools.append(NodePoolBundle(**v))
    return pools


def decode_lifecycle(ctx: YamlContext, node: yaml.Node, what: str) -> LifecycleBundle:
    """``instance_lifecycle:`` (warm-up and drain policies are not bundle keys upstream)."""
    v = decode_struct(ctx, node, what, {"loading_delay": _delay,
                                        "warm_start_initial_instances": as_bool})
    return LifecycleBundle(loading_delay=v.get("loading_delay", DelaySpec()),
                           warm_start_initial_instances=v.get("warm_start_initial_instances",
                                                              False),
                           present=True)


def _finite(v: float) -> bool:
    return not (math.isnan(v) or math.isinf(v))


def autoscale_bundle_error(autoscaler: AutoscalerBundle | None, pools: list[NodePoolBundle],
                           lifecycle: LifecycleBundle) -> str | None:
    """The first failing check of the three sections, in the reference's order and words
    (Go ``PolicyBundle.Validate``), then blis_fast's own; None when all pass."""
    a = autoscaler or AutoscalerBundle()
    g = go_g
    if not _finite(a.interval_us):
        return "autoscaler.interval_us must be a finite number"
    if a.interval_us < 0:
        return f"autoscaler.interval_us must be >= 0 (0 = disabled), got {g(a.interval_us)}"
    for key, value in (("scale_up_stabilization_window_us", a.scale_up_window_us),
                       ("scale_down_stabilization_window_us", a.scale_down_window_us),
                       ("hpa_scrape_delay.mean", a.scrape_delay.mean),
                       ("hpa_scrape_delay.stddev", a.scrape_delay.stddev)):
        if not _finite(value) or value < 0:
            return f"autoscaler.{key} must be a finite non-negative number, got {g(value)}"
    kvth = a.kv_cache_threshold
    if kvth != 0 and not (0 < kvth <= 1):
        return f"autoscaler.analyzer.kv_cache_threshold must be in (0, 1], got {g(kvth)}"
    for key, value in (("scale_up_threshold", a.scale_up_threshold),
                       ("scale_down_boundary", a.scale_down_boundary),
                       ("avg_input_tokens", a.avg_input_tokens)):
        if value != 0 and not (_finite(value) and value > 0):
            return f"autoscaler.analyzer.{key} must be > 0, got {g(value)}"
    up = a.scale_up_threshold or DEFAULT_SCALE_UP_THRESHOLD
    down = a.scale_down_boundary or DEFAULT_SCALE_DOWN_BOUNDARY
    if down >= up:
        return (f"autoscaler.analyzer.scale_down_boundary ({g(down)}) must be < effective "
                f"scale_up_threshold ({g(up)})")
    for i, p in enumerate(pools):
        message = _pool_error(i, p)
        if message is not None:
            return message
    ld = lifecycle.loading_delay
    for key, value in (("mean", ld.mean), ("stddev", ld.stddev)):
        if not _finite(value):
            return f"instance_lifecycle.loading_delay.{key} must be a finite number, got {g(value)}"
        if value < 0:
            return f"instance_lifecycle.loading_delay.{key} must be >= 0, got {g(value)}"
    return _own_error(a, pools, lifecycle)


def _pool_error(i: int, p: NodePoolBundle) -> str | None:
    g = go_g
    if p.name == "":
        return f"node_pools[{i}]: name must not be empty"
    where = f"node_pools[{i}] {go_quote(p.name)}"
    if p.gpu_type == "":
        return f"{where}: gpu_type must not be empty"
    if p.gpus_per_node < 1:
        return f"{where}: gpus_per_node must be >= 1, got {p.gpus_per_node}"
    if not _finite(p.gpu_memory_gib):
        return f"{where}: gpu_memory_gib must be finite, got {g(p.gpu_memory_gib)}"
    if p.gpu_memory_gib <= 0:
        return f"{where}: gpu_memory_gib must be > 0, got {g(p.gpu_memory_gib)}"
    if p.gpu_memory_gib > MAX_GPU_MEMORY_GIB:  # its KV blocks are sized before any estimate
        return (f"{where}: gpu_memory_gib must be at most {MAX_GPU_MEMORY_GIB}, "
                f"got {g(p.gpu_memory_gib)}")
    if p.initial_nodes < 0:
        return f"{where}: initial_nodes must be >= 0, got {p.initial_nodes}"
    if p.max_nodes < p.initial_nodes:
        return f"{where}: max_nodes ({p.max_nodes}) must be >= initial_nodes ({p.initial_nodes})"
    if not _finite(p.cost_per_hour):
        return f"{where}: cost_per_hour must be finite, got {g(p.cost_per_hour)}"
    if p.cost_per_hour < 0:
        return f"{where}: cost_per_hour must be >= 0, got {g(p.cost_per_hour)}"
    return None


def _own_error(a: AutoscalerBundle, pools: list[NodePoolBundle],
               lifecycle: LifecycleBundle) -> str | None:
    """blis_fast's checks, after every reference check (so a reference error always wins):
    values the reference accepts but then hangs, panics or misbehaves on."""
    g = go_g
    if 0 < a.interval_us < 1:
        return (f"autoscaler.interval_us must be 0 (off) or at least 1 µs, got {g(a.interval_us)}: "
                "a shorter interval truncates to 0 and the reference ticks forever at one instant")
    for key, value in (("autoscaler.interval_us", a.interval_us),
                       ("autoscaler.scale_up_stabilization_window_us", a.scale_up_window_us),
                       ("autoscaler.scale_down_stabilization_window_us", a.scale_down_window_us)):
        if value > TIME_LIMIT_US:
            return f"{key} {g(value)} is beyond the simulator's time range"
    for key, d in (("autoscaler.hpa_scrape_delay", a.scrape_delay),
                   ("instance_lifecycle.loading_delay", lifecycle.loading_delay)):
        if (d.mean + 10 * d.stddev) * 1e6 > TIME_LIMIT_US:
            return f"{key} {g(d.mean)} s (stddev {g(d.stddev)} s) is beyond the simulator's time range"
    if a.min_replicas is not None and a.min_replicas < 0:
        return f"autoscaler.min_replicas must be >= 0, got {a.min_replicas}"
    if a.max_replicas is not None and a.max_replicas < 1:
        return f"autoscaler.max_replicas must be >= 1, got {a.max_replicas}"
    if (a.min_replicas is not None and a.max_replicas is not None
            and a.min_replicas > a.max_replicas):
        return (f"autoscaler.min_replicas ({a.min_replicas}) must be <= autoscaler.max_replicas "
                f"({a.max_replicas})")
    seen: set[str] = set()
    for i, p in enumerate(pools):
        price = p.gpu_hour_cost
        if price is not None and not (0 <= price <= MAX_GPU_HOUR_COST):
            return (f"node_pools[{i}] {go_quote(p.name)}: gpu_hour_cost must be a number "
                    f"between 0 and {MAX_GPU_HOUR_COST:g}, got {g(price)}")
        if p.name in seen:
            return (f"node_pools[{i}] {go_quote(p.name)}: duplicate pool name (the reference "
                    "panics on this)")
        seen.add(p.name)
    total = sum(p.gpus_per_node * p.initial_nodes for p in pools)
    if total > MAX_POOL_GPUS:
        return f"node_pools: {total} GPUs in all is more than blis places (limit {MAX_POOL_GPUS})"
    return None
