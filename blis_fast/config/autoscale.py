"""The autoscaler's resolved configuration (AS-0.2, AS-1, AS-2.4): the flag merged over the
bundle as the reference does (Go ``cmd/root.go`` right after the policies are resolved), the
effective analyzer thresholds, the node pools and the per-GPU-label KV capacity.

Three switches: the autoscaler is on iff the effective interval is > 0; a placement manager
exists iff the bundle has a node pool; ``instance_lifecycle`` matters only for instances placed
on pools. With none of them a run is the fixed fleet exactly (``AutoscaleSetup.active`` False).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Any

from blis_fast.config.autoscale_bundle import (
    DEFAULT_AVG_INPUT_TOKENS,
    DEFAULT_KV_CACHE_THRESHOLD,
    DEFAULT_SCALE_DOWN_BOUNDARY,
    DEFAULT_SCALE_UP_THRESHOLD,
    AutoscalerBundle,
    DelaySpec,
    LifecycleBundle,
    NodePoolBundle,
)
from blis_fast.config.kv_capacity import calculate_kv_blocks
from blis_fast.errors import BlisConfigError
from blis_fast.gofmt import go_g, go_quote
from blis_fast.options import check_options

log = logging.getLogger("blis_fast")

KV_AUTOCALC_BACKENDS = frozenset({"roofline", "trained-physics"})
"""Backends whose KV capacity the reference recomputes per placed instance (Go
``cmd/root.go``: ``KVAutoCalc.Enabled``)."""


@dataclass
class AutoscaleSetup:
    """Everything the autoscaler, the placement and the lifecycle need, resolved."""

    interval_us: float = 0.0
    up_window_us: float = 0.0
    down_window_us: float = 0.0
    scrape_delay: DelaySpec = field(default_factory=DelaySpec)
    kv_cache_threshold: float = DEFAULT_KV_CACHE_THRESHOLD
    scale_up_threshold: float = DEFAULT_SCALE_UP_THRESHOLD
    scale_down_boundary: float = DEFAULT_SCALE_DOWN_BOUNDARY
    avg_input_tokens: float = DEFAULT_AVG_INPUT_TOKENS
    min_replicas: int = -1  # -1: not given (the reference has no bound)
    max_replicas: int = -1
    pools: list[NodePoolBundle] = field(default_factory=list)
    loading_delay: DelaySpec = field(default_factory=DelaySpec)
    warm_start: bool = False
    labels: list[str] = field(default_factory=list)  # GPU labels, byte order (kernel ids)
    label_blocks: list[int] = field(default_factory=list)  # KV blocks per label
    label_max_len: list[int] = field(default_factory=list)  # max-model-len per label
    label_cost: list[float] = field(default_factory=list)  # cost_per_hour of the first pool
    model: str = ""
    warnings: list[str] = field(default_factory=list)

    @property
    def enabled(self) -> bool:
        """The autoscaler ticks."""
        return self.interval_us > 0

    @property
    def has_pools(self) -> bool:
        """A placement manager exists (node pools declared)."""
        return bool(self.pools)

    @property
    def active(self) -> bool:
        """Anything differs from a fixed fleet of Active instances."""
        return self.enabled or self.has_pools

    def label_id(self, label: str) -> int:
        """The kernel id of a GPU label."""
        return self.labels.index(label)


def _replay_refusals(opts: Any, a: AutoscalerBundle | None, pools: list[NodePoolBundle]) -> None:
    if opts.given("model_autoscaler_interval_us"):
        raise BlisConfigError("--model-autoscaler-interval-us is not supported in blis replay; "
                              "remove this flag or use blis run instead")
    if a is not None and a.interval_us > 0:
        raise BlisConfigError(
            f"blis replay does not support autoscaler config (policy bundle interval_us="
            f"{go_g(a.interval_us)}); remove the autoscaler section from the policy bundle or "
            "use blis run instead")
    if pools:
        raise BlisConfigError(
            f"blis replay does not support node_pools config ({len(pools)} pool(s) in policy "
            "bundle); remove the node_pools section from the policy bundle or use blis run "
            "instead")


def resolve_autoscale(opts: Any, bundle: Any, latency: Any, replay: bool = False
                      ) -> AutoscaleSetup:
    """Merge ``--model-autoscaler-interval-us`` over the bundle (AS-1.2) and resolve pools,
    lifecycle and per-label KV capacity. ``bundle`` is the loaded ``PolicyBundle``."""
    a: AutoscalerBundle | None = bundle.autoscaler
    pools: list[NodePoolBundle] = list(bundle.node_pools)
    life: LifecycleBundle = bundle.instance_lifecycle
    if replay:
        _replay_refusals(opts, a, pools)
    check_options(opts, "autoscale")
    if replay:
        if life.present:
            log.warning("instance_lifecycle has no effect in blis replay")
        return AutoscaleSetup(model=latency.model if latency is not None else "")
    setup = AutoscaleSetup(model=latency.model)
    warnings = setup.warnings
    bundle_on = a is not None and a.interval_us > 0
    if bundle_on:
        setup.interval_us = a.interval_us
        setup.up_window_us = a.scale_up_window_us
        setup.down_window_us = a.scale_down_window_us
        setup.scrape_delay = a.scrape_delay
        setup.kv_cache_threshold = a.kv_cache_threshold or DEFAULT_KV_CACHE_THRESHOLD
        setup.scale_up_threshold = a.scale_up_threshold or DEFAULT_SCALE_UP_THRESHOLD
        setup.scale_down_boundary = a.scale_down_boundary or DEFAULT_SCALE_DOWN_BOUNDARY
        setup.avg_input_tokens = a.avg_input_tokens or DEFAULT_AVG_INPUT_TOKENS
    if opts.given("model_autoscaler_interval_us"):
        setup.interval_us = opts.model_autoscaler_interval_us
    if a is not None:
        if a.min_replicas is not None:
            setup.min_replicas = a.min_replicas
        if a.max_replicas is not None:
            setup.max_replicas = a.max_replicas
        ignored = sorted(k for k in a.keys if k not in ("interval_us", "min_replicas",
                                                         "max_replicas"))
        if ignored and not bundle_on:
            keys = ", ".join(ignored)
            if setup.enabled:
                warnings.append(
                    f"autoscaler: --policy-config sets autoscaler.{keys} but its interval_us is "
                    "0, so the reference ignores it; --model-autoscaler-interval-us runs with "
                    "windows 0, no scrape delay and default analyzer thresholds")
            else:
                warnings.append(f"autoscaler: --policy-config sets autoscaler.{keys} but "
                                "autoscaler.interval_us is 0: the autoscaler is off")
    setup.pools = pools
    setup.loading_delay = life.loading_delay
    setup.warm_start = life.warm_start_initial_instances
    if life.present and not pools:
        warnings.append("instance_lifecycle has no effect without node_pools")
    if setup.enabled and not latency.gpu:
        raise BlisConfigError("the autoscaler needs a GPU label for its instances: give "
                              "--hardware (the latency model resolved none)")
    _resolve_labels(setup, opts, latency)
    _pool_warnings(setup, latency)
    if setup.enabled and setup.scrape_delay.mean * 1e6 > setup.interval_us and \
            setup.up_window_us == 0:
        warnings.append(
            f"autoscaler: hpa_scrape_delay.mean {setup.scrape_delay.mean:.3f} s exceeds the "
            f"interval {setup.interval_us / 1e6:.3f} s with no scale-up window: decisions made "
            "before an actuation lands are applied too")
    return setup


def _resolve_labels(setup: AutoscaleSetup, opts: Any, latency: Any) -> None:
    """GPU labels (byte order) and, per label, the KV blocks, max-model-len and cost_per_hour of
    the first pool of that type (Go loops the pools and stops at the first type match)."""
    labels = {p.gpu_type for p in setup.pools}
    if latency.gpu:
        labels.add(latency.gpu)
    setup.labels = sorted(labels, key=lambda s: s.encode())
    autocalc = (not opts.given("total_kv_blocks") and latency.backend in KV_AUTOCALC_BACKENDS
                and latency.kv_params is not None and latency.model_config is not None
                and latency.hardware is not None)
    for label in setup.labels:
        first = next((p for p in setup.pools if p.gpu_type == label), None)
        blocks, max_len = latency.total_kv_blocks, latency.max_model_len
        if first is not None and autocalc:
            blocks, max_len = _pool_kv(first, opts, latency, setup.warnings)
        setup.label_blocks.append(int(blocks))
        setup.label_max_len.append(int(max_len))
        setup.label_cost.append(first.cost_per_hour if first is not None else 0.0)


def _pool_kv(pool: NodePoolBundle, opts: Any, latency: Any, warnings: list[str]
             ) -> tuple[int, int]:
    """Per-instance KV capacity on a pool's GPU (Go ``kv_autocalc.go:
    applyPerInstanceKVCapacity``); a failure keeps the global figures with a warning."""
    try:
        if not pool.gpu_memory_gib > 0:
            raise BlisConfigError(f"GPU memory {go_g(pool.gpu_memory_gib)} GiB")
        hw = replace(latency.hardware, memory_gib=pool.gpu_memory_gib)
        blocks = calculate_kv_blocks(latency.model_config, hw, latency.tp,
                                     opts.block_size_in_tokens, opts.gpu_memory_utilization,
                                     latency.kv_params, explicit_head_dim=True,
                                     reserved_bytes=latency.lora_reserved_bytes)  # LORA-6.3
    except BlisConfigError as exc:
        warnings.append(f"[cluster] per-instance KV auto-calc for GPU {go_quote(pool.gpu_type)} "
                        f"failed: {exc}; using inherited total-kv-blocks="
                        f"{latency.total_kv_blocks}")
        return latency.total_kv_blocks, latency.max_model_len
    max_len = latency.max_model_len
    if max_len > 0 and blocks * opts.block_size_in_tokens < max_len:
        max_len = blocks * opts.block_size_in_tokens
    return blocks, max_len


def _pool_warnings(setup: AutoscaleSetup, latency: Any) -> None:
    """Config-time warnings about pool keys that have less effect than they seem to."""
    first_of: dict[str, int] = {}
    for i, p in enumerate(setup.pools):
        name = go_quote(p.name)
        if p.max_nodes > p.initial_nodes:
            setup.warnings.append(f"node_pools[{i}] {name}: max_nodes {p.max_nodes} has no "
                                  f"effect: only the {p.initial_nodes} initial node(s) exist "
                                  "during a run")
        if latency.gpu and p.gpu_type != latency.gpu:
            setup.warnings.append(
                f"node_pools[{i}] {name}: gpu_type {p.gpu_type} differs from the hardware "
                f"{latency.gpu}: step times use {latency.gpu}'s figures (only the KV capacity "
                "follows gpu_memory_gib)")
        j = first_of.setdefault(p.gpu_type, i)
        q = setup.pools[j]
        if j != i and (q.gpu_memory_gib, q.cost_per_hour) != (p.gpu_memory_gib, p.cost_per_hour):
            setup.warnings.append(
                f"node_pools[{i}] {name} shares gpu_type {p.gpu_type} with node_pools[{j}]: its "
                "gpu_memory_gib/cost_per_hour are not used (the first pool of a type gives both)")
