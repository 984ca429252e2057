"""LoRA multi-adapter serving: the resolved configuration (spec lora.md, LORA-0..LORA-1, LORA-6).

The configuration is resolved once per ``run``/``replay`` from three layers (LORA-1.3): the
``--lora-config`` file, the ``lora:`` block of ``defaults.yaml`` and the scalar ``--lora-*``
flags. It is *active* (LORA-0.2) only when adapters are declared and a positive capacity is set;
otherwise it is inert, but still validated (LORA-1.5, LORA-D12).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

import yaml

from blis_fast.config.strict_yaml import (
    YamlContext,
    as_str,
    decode_struct,
    is_null,
    mapping_items,
    parse_root,
)
from blis_fast.config.strict_yaml import _v3_number as _number
from blis_fast.errors import BlisConfigError, BlisInputError
from blis_fast.files import read_input_text


@dataclass(frozen=True)
class LoRAAdapter:
    """One registry entry: adapter id, rank (> 0) and the optional base model (LORA-1.8)."""

    id: str
    rank: int
    base_model: str = ""


@dataclass(frozen=True)
class LoRAConfig:
    """The resolved LoRA configuration; ``None`` scalars were never set (LORA-1.3)."""

    capacity: int | None = None  # None = never set (file key absent and flag not given)
    load_base_latency_us: float | None = None
    load_bandwidth_bytes_us: float | None = None
    footprint_bytes_per_rank: float | None = None
    tiers: tuple[tuple[int, float, float], ...] = ()  # (rank key, k6, k7), keys ascending
    adapters: tuple[LoRAAdapter, ...] = ()  # the registry, file order
    scorer_weight: float | None = None  # --lora-scorer-weight when given

    @property
    def active(self) -> bool:
        """True when adapters are declared and a positive capacity is set (LORA-0.2)."""
        return bool(self.adapters) and self.capacity is not None and self.capacity > 0

    def rank_of(self, adapter_id: str) -> int:
        """The declared rank of ``adapter_id``; 0 for an id not in the registry (LORA-4.8)."""
        for a in self.adapters:
            if a.id == adapter_id:
                return a.rank
        return 0

    def load_ticks(self, adapter_id: str) -> int:
        """Cold-load duration in ticks: ``max(1, ceil(L))`` with L of LORA-4.3 (0 unregistered)."""
        rank = self.rank_of(adapter_id)
        if rank == 0:
            latency = 0.0
        else:
            base = self.load_base_latency_us or 0.0
            footprint = self.footprint_bytes_per_rank or 0.0
            bandwidth = self.load_bandwidth_bytes_us or 0.0
            latency = base + math.ceil(footprint * float(rank) / bandwidth)
        return max(1, math.ceil(latency))

    @property
    def max_rank(self) -> int:
        """The largest declared rank (0 without adapters)."""
        return max((a.rank for a in self.adapters), default=0)

    def reserved_float(self) -> float:
        """The static HBM reservation as the reference's float64 product (LORA-6.1); 0 inert."""
        if not self.active:
            return 0.0
        footprint = self.footprint_bytes_per_rank or 0.0
        return float(self.capacity or 0) * footprint * float(self.max_rank)

    def reserved_bytes(self) -> int:
        """The static HBM reservation in bytes, truncated to an int (LORA-6.1); 0 when inert."""
        value = self.reserved_float()
        if not math.isfinite(value) or value <= 0:
            return 0
        return int(value)


INERT = LoRAConfig()
"""An inert configuration (no adapters, nothing set)."""

LORA_AFFINITY = "lora-affinity"
"""The name of the routing scorer that prefers instances holding the request's adapter."""
MAX_LOAD_LATENCY_US = 1e15
"""Largest cold-load latency accepted (µs, LORA-1.6): load ticks stay far from int64 overflow."""
MAX_RESERVED_BYTES = 1e18
"""Largest static HBM reservation accepted (bytes, LORA-1.6)."""
_GIB = float(1 << 30)


# ---------------------------------------------------------------------------------------------
# The --lora-config file and the defaults.yaml block (LORA-1.2, LORA-1.4)


@dataclass(frozen=True)
class _Raw:
    """A ``lora:`` block as written: None = key absent (or null); tiers keep k6/k7 presence."""

    capacity: int | None = None
    load_base_latency_us: float | None = None
    load_bandwidth_bytes_us: float | None = None
    footprint_bytes_per_rank: float | None = None
    tiers: tuple[tuple[int, float | None, float | None], ...] = ()  # file order, keys as given
    adapters: tuple[LoRAAdapter, ...] = ()


def _opt_int(ctx: YamlContext, node: yaml.Node, what: str) -> int | None:
    """A Go ``*int`` field: null = unset; a float is truncated, a quoted number refused."""
    return None if is_null(node) else int(_number(ctx, node, what, "int"))


def _opt_float(ctx: YamlContext, node: yaml.Node, what: str) -> float | None:
    """A Go ``*float64`` field: null = unset."""
    return None if is_null(node) else float(_number(ctx, node, what, "float"))


def _int(ctx: YamlContext, node: yaml.Node, what: str) -> int:
    return 0 if is_null(node) else int(_number(ctx, node, what, "int"))


def _tiers(ctx: YamlContext, node: yaml.Node, what: str
           ) -> tuple[tuple[int, float | None, float | None], ...]:
    """``step_overhead_tiers``: rank (int key, a float key truncated) -> {k6, k7}; a later
    key that truncates to an earlier one replaces it (a Go map)."""
    if is_null(node):
        return ()
    out: dict[int, tuple[float | None, float | None]] = {}
    for _key, knode, vnode in mapping_items(ctx, node, what):
        rank = int(_number(ctx, knode, f"{what} key", "int"))
        v = decode_struct(ctx, vnode, f"{what}[{rank}]", {"k6": _opt_float, "k7": _opt_float})
        out[rank] = (v.get("k6"), v.get("k7"))
    return tuple((rank, k6, k7) for rank, (k6, k7) in out.items())


def _adapters(ctx: YamlContext, node: yaml.Node, what: str) -> tuple[LoRAAdapter, ...]:
    if is_null(node):
        return ()
    if not isinstance(node, yaml.SequenceNode):
        raise ctx.fail(node, f"{what}: expected a list")
    fields = {"id": as_str, "rank": _int, "base_model": as_str}
    out = []
    for i, item in enumerate(node.value):
        v = decode_struct(ctx, item, f"{what}[{i}]", fields)
        out.append(LoRAAdapter(v.get("id", ""), v.get("rank", 0), v.get("base_model", "")))
    return tuple(out)


_BLOCK_FIELDS = {
    "adapter_capacity": _opt_int,
    "load_base_latency_us": _opt_float,
    "load_bandwidth_bytes_us": _opt_float,
    "step_overhead_tiers": _tiers,
    "footprint_bytes_per_rank": _opt_float,
    "adapters": _adapters,
}


def decode_lora_block(ctx: YamlContext, node: yaml.Node, what: str) -> _Raw:
    """A ``lora:`` block (of a ``--lora-config`` file or of ``defaults.yaml``), strictly."""
    v = decode_struct(ctx, node, what, _BLOCK_FIELDS)
    return _Raw(capacity=v.get("adapter_capacity"),
                load_base_latency_us=v.get("load_base_latency_us"),
                load_bandwidth_bytes_us=v.get("load_bandwidth_bytes_us"),
                footprint_bytes_per_rank=v.get("footprint_bytes_per_rank"),
                tiers=v.get("step_overhead_tiers", ()),
                adapters=v.get("adapters", ()))


@dataclass(frozen=True)
class LoRADefaults:
    """``defaults.yaml``'s ``lora:`` block: plain floats (a missing scalar is 0, LORA-D11)."""

    load_base_latency_us: float = 0.0
    load_bandwidth_bytes_us: float = 0.0
    footprint_bytes_per_rank: float = 0.0
    tiers: tuple[tuple[int, float | None, float | None], ...] = ()


def decode_lora_defaults(ctx: YamlContext, node: yaml.Node, what: str) -> LoRADefaults | None:
    """The ``lora:`` block of a defaults file (None when null)."""
    if is_null(node):
        return None
    fields = {k: _BLOCK_FIELDS[k] for k in ("load_base_latency_us", "load_bandwidth_bytes_us",
                                           "footprint_bytes_per_rank", "step_overhead_tiers")}
    v = decode_struct(ctx, node, what, fields)
    return LoRADefaults(load_base_latency_us=v.get("load_base_latency_us") or 0.0,
                        load_bandwidth_bytes_us=v.get("load_bandwidth_bytes_us") or 0.0,
                        footprint_bytes_per_rank=v.get("footprint_bytes_per_rank") or 0.0,
                        tiers=v.get("step_overhead_tiers", ()))


def load_lora_file(path: str) -> _Raw:
    """Read and strictly parse a ``--lora-config`` file: one top-level ``lora:`` block
    (LORA-1.2); ``lora:`` null or ``{}`` is valid and inert. Errors name the flag and file."""
    try:
        text = read_input_text(path)
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise BlisInputError(f"--lora-config: cannot read {path}: {reason}") from None
    try:
        with parse_root(text, path, "--lora-config file") as (ctx, root):
            top = decode_struct(ctx, root, "--lora-config file", {"lora": decode_lora_block})
    except BlisInputError as exc:
        message = str(exc)
        if not message.startswith("cannot parse"):
            message = f"cannot parse --lora-config file {message}"
        raise BlisInputError(f"--lora-config: {message}") from None
    return top.get("lora", _Raw())


# ---------------------------------------------------------------------------------------------
# Resolution and validation (LORA-1.3, LORA-1.5, LORA-1.6)


def resolve_lora(opts: Any, defaults_lora: Any = None) -> LoRAConfig:
    """The run's LoRA configuration: the ``--lora-config`` file, then ``defaults.yaml``'s
    ``lora:`` block (``defaults_lora``, a parsed block or None) for each scalar the file left
    unset and for the tiers when the file set none, then each scalar ``--lora-*`` flag given
    (LORA-1.3); validated (LORA-1.5) and, when active, the cost model's bounds checked
    (LORA-1.6). ``--lora-scorer-weight`` is carried as given (composed with the policies)."""
    raw = load_lora_file(opts.lora_config) if opts.lora_config else _Raw()
    if defaults_lora is not None:
        d = defaults_lora
        raw = replace(
            raw,
            load_base_latency_us=_first(raw.load_base_latency_us, d.load_base_latency_us, 0.0),
            load_bandwidth_bytes_us=_first(raw.load_bandwidth_bytes_us,
                                           d.load_bandwidth_bytes_us, 0.0),
            footprint_bytes_per_rank=_first(raw.footprint_bytes_per_rank,
                                            d.footprint_bytes_per_rank, 0.0),
            # the defaults' tiers are plain floats: an absent k6/k7 there reads as 0
            tiers=raw.tiers or tuple((r, k6 or 0.0, k7 or 0.0) for r, k6, k7 in d.tiers))
    flags = {"capacity": "lora_adapter_capacity",
             "load_base_latency_us": "lora_load_base_latency_us",
             "load_bandwidth_bytes_us": "lora_load_bandwidth_bytes_us",
             "footprint_bytes_per_rank": "lora_footprint_bytes_per_rank"}
    raw = replace(raw, **{key: getattr(opts, field) for key, field in flags.items()
                          if opts.given(field)})
    try:
        validate_raw(raw)
    except BlisConfigError as exc:  # the reference's words, plus the flag that set the value
        raise BlisConfigError(_naming_flag(str(exc), opts, flags)) from None
    cfg = LoRAConfig(
        capacity=raw.capacity,
        load_base_latency_us=raw.load_base_latency_us,
        load_bandwidth_bytes_us=raw.load_bandwidth_bytes_us,
        footprint_bytes_per_rank=raw.footprint_bytes_per_rank,
        tiers=tuple(sorted((r, k6 or 0.0, float(k7 or 0.0)) for r, k6, k7 in raw.tiers)),
        adapters=raw.adapters,
        scorer_weight=opts.lora_scorer_weight if opts.given("lora_scorer_weight") else None)
    if cfg.active:
        check_cost_model(cfg)
    return cfg


def _first(*values: float | None) -> float | None:
    return next((v for v in values if v is not None), None)


def _bad(v: float, *, zero_ok: bool) -> bool:
    return math.isnan(v) or math.isinf(v) or (v < 0 if zero_ok else v <= 0)


def _naming_flag(message: str, opts: Any, flags: dict[str, str]) -> str:
    """``message`` with the ``--lora-*`` flag that set the refused value, when a flag did (the
    reference's message names only the config key)."""
    for key, field in flags.items():
        name = "adapter_capacity" if key == "capacity" else key
        if opts.given(field) and f": {name} must" in message:
            return f"{message} (set by --{field.replace('_', '-')})"
    return message


def validate_raw(raw: _Raw) -> None:
    """LORA-1.5: the first failure, as ``Invalid LoRA configuration: LoRAConfig: <msg>``.
    Tiers are checked in ascending key order (the reference's map order is random, LORA-D5)."""
    from blis_fast.gofmt import go_g, go_quote  # lazy: only runs that resolve LoRA

    def fail(msg: str) -> None:
        raise BlisConfigError(f"Invalid LoRA configuration: LoRAConfig: {msg}")

    has = bool(raw.adapters)
    if has and raw.capacity is not None and raw.capacity <= 0:
        fail(f"adapter_capacity must be > 0 when adapters are declared, got {raw.capacity}")
    seen: set[str] = set()
    for i, a in enumerate(raw.adapters):
        if a.id == "":
            fail(f"adapter[{i}] has empty id")
        if a.rank <= 0:
            fail(f"adapter {go_quote(a.id)} rank must be > 0, got {a.rank}")
        if a.id in seen:
            fail(f"duplicate adapter id {go_quote(a.id)}")
        seen.add(a.id)
    v = raw.load_base_latency_us
    if v is not None and _bad(v, zero_ok=True):
        fail(f"load_base_latency_us must be finite and >= 0, got {go_g(v)}")
    v = raw.load_bandwidth_bytes_us
    if v is not None and _bad(v, zero_ok=False):
        fail(f"load_bandwidth_bytes_us must be finite and > 0 (divisor guard), got {go_g(v)}")
    v = raw.footprint_bytes_per_rank
    if v is not None and _bad(v, zero_ok=False):
        fail(f"footprint_bytes_per_rank must be finite and > 0, got {go_g(v)}")
    for rank, k6, k7 in sorted(raw.tiers, key=lambda t: t[0]):
        if rank <= 0:
            fail(f"step_overhead_tiers rank key must be > 0, got {rank}")
        if k6 is not None and _bad(k6, zero_ok=True):
            fail(f"step_overhead_tiers[{rank}].k6 must be finite and >= 0, got {go_g(k6)}")
        if k7 is None or _bad(k7, zero_ok=False):
            fail(f"step_overhead_tiers[{rank}].k7 must be finite and > 0 (divisor guard)")
    if has and raw.capacity is not None and raw.capacity > 0 and None in (
            raw.load_base_latency_us, raw.load_bandwidth_bytes_us, raw.footprint_bytes_per_rank):
        fail("load_base_latency_us, load_bandwidth_bytes_us, and footprint_bytes_per_rank must "
             "all be set when adapters are declared with a positive capacity")


def load_latency_us(cfg: LoRAConfig, rank: int) -> float:
    """LORA-4.3's L for a registered adapter of ``rank`` (float64, the reference's order)."""
    footprint = (cfg.footprint_bytes_per_rank or 0.0) * float(rank)
    return (cfg.load_base_latency_us or 0.0) + math.ceil(footprint / (cfg.load_bandwidth_bytes_us
                                                                      or math.inf))


def check_cost_model(cfg: LoRAConfig) -> None:
    """LORA-1.6 (an active config): every adapter's load latency finite and <= 1e15 µs, the
    reservation finite and <= 1e18 bytes; else ``Invalid LoRA configuration (HBM
    reservation): lora.NewCostModel: <msg>``."""
    from blis_fast.gofmt import go_g, go_quote  # lazy: only runs that resolve LoRA

    prefix = "Invalid LoRA configuration (HBM reservation): lora.NewCostModel: "
    for a in cfg.adapters:
        latency = _load_latency_or_inf(cfg, a.rank)
        if not math.isfinite(latency) or latency > MAX_LOAD_LATENCY_US:
            raise BlisConfigError(
                f"{prefix}adapter {go_quote(a.id)} rank {a.rank} yields an unusable load latency "
                f"({go_g(latency)} µs) — reduce rank or footprint_bytes_per_rank")
    reserved = cfg.reserved_float()
    if not math.isfinite(reserved) or reserved > MAX_RESERVED_BYTES:
        raise BlisConfigError(
            f"{prefix}static HBM reservation (capacity {cfg.capacity} × footprint_bytes_per_rank "
            f"{go_g(cfg.footprint_bytes_per_rank or 0.0)} × max rank {cfg.max_rank} = "
            f"{go_g(reserved)} bytes) is unusable — reduce adapter_capacity, "
            "footprint_bytes_per_rank, or the maximum declared rank")


def _load_latency_or_inf(cfg: LoRAConfig, rank: int) -> float:
    try:
        return load_latency_us(cfg, rank)
    except OverflowError:  # ceil of an infinite quotient
        return math.inf


# ---------------------------------------------------------------------------------------------
# Reservation messages (LORA-6.3)


def reserved_gib(cfg: LoRAConfig | None) -> float:
    """The reservation in GiB (float64 bytes / 2^30); 0 without LoRA."""
    return 0.0 if cfg is None else float(cfg.reserved_bytes()) / _GIB


def reservation_info(scope: str, cfg: LoRAConfig | None) -> str | None:
    """The info line of an applied reservation, or None when there is none."""
    if cfg is None or cfg.reserved_bytes() <= 0:
        return None
    return (f"{scope}: reserved {reserved_gib(cfg):.2f} GiB GPU HBM for LoRA adapters (static "
            "capacity × per-slot footprint); usable KV blocks reduced accordingly")


def reservation_skipped_warning(cfg: LoRAConfig | None, total_kv_blocks: int) -> str | None:
    """The warning when KV auto-calculation was skipped with a reservation configured."""
    if cfg is None or cfg.reserved_bytes() <= 0:
        return None
    return (f"--lora-config: KV auto-calculation was skipped, so the static LoRA adapter HBM "
            f"reservation ({reserved_gib(cfg):.2f} GiB) is NOT applied to the fallback "
            f"total-kv-blocks={total_kv_blocks} — fix the model/hardware config or set "
            "--total-kv-blocks with headroom for adapters")


def explicit_blocks_warning(cfg: LoRAConfig | None, total_kv_blocks: int) -> str | None:
    """The warning when an explicit ``--total-kv-blocks`` bypasses the reservation (LORA-D10)."""
    if cfg is None or cfg.reserved_bytes() <= 0:
        return None
    return (f"--total-kv-blocks set explicitly ({total_kv_blocks} blocks); the static LoRA adapter "
            f"HBM reservation ({reserved_gib(cfg):.2f} GiB) is NOT applied to that explicit "
            "global block count (per-pool auto-calc, if any, still applies it) — omit "
            "--total-kv-blocks to let auto-calc subtract it")


def no_capacity_warning(cfg: LoRAConfig | None) -> str | None:
    """LORA-2.2: adapters declared, capacity never set (the reference logs it per instance;
    blis_fast once)."""
    if cfg is None or not cfg.adapters or cfg.capacity is not None:
        return None
    return ("adapters declared but adapter_capacity is not set; per-instance resident-adapter "
            "tracking is disabled and adapter metrics will be zero")


# ---------------------------------------------------------------------------------------------
# --lora-scorer-weight (LORA-7.3)


def compose_scorer_weight(cfg: LoRAConfig | None, routing: str,
                          scorers: tuple[tuple[str, float], ...],
                          default_profile: tuple[tuple[str, float], ...]
                          ) -> tuple[tuple[tuple[str, float], ...], str | None]:
    """The weighted profile with ``lora-affinity:W`` appended when ``--lora-scorer-weight`` was
    given, and the warning to log (None when none). ``scorers`` is the resolved profile (flag,
    else bundle; empty = the default profile)."""
    from blis_fast.gofmt import go_g, go_quote  # lazy: only runs that resolve LoRA

    weight = None if cfg is None else cfg.scorer_weight
    if weight is None:
        return scorers, None
    if routing != "weighted":
        return scorers, (f"--lora-scorer-weight has no effect when routing policy is "
                         f"{go_quote(routing)} (only applies to 'weighted')")
    if not math.isfinite(weight) or weight <= 0:
        raise BlisConfigError("Invalid --lora-scorer-weight: weight must be a finite positive "
                              f"number, got {go_g(weight)}")
    base = scorers or default_profile
    if any(name == LORA_AFFINITY for name, _w in base):
        raise BlisConfigError(
            "Invalid --lora-scorer-weight: lora-affinity already present in the scorer profile; "
            "set its weight via --routing-scorers OR --lora-scorer-weight, not both")
    return (*base, (LORA_AFFINITY, float(weight))), None


# ---------------------------------------------------------------------------------------------
# Workload references (LORA-1.8)


def check_workload_adapters(cfg: LoRAConfig | None,
                            entries: Iterable[tuple[str, str, str, str]]) -> None:
    """LORA-1.8 over ``(kind, id, model, adapter)`` for every client then every cohort in spec
    order (kind "client" or "cohort"): the first reference to an undeclared adapter, or to one
    whose ``base_model`` differs from the entry's own ``model``, is refused as
    ``LoRA workload validation: <msg>``."""
    from blis_fast.gofmt import go_quote  # lazy: only runs that resolve LoRA

    registry = {a.id: a for a in (cfg.adapters if cfg is not None else ())}
    for kind, ident, model, adapter in entries:
        if not adapter:
            continue
        where = f"{kind} {go_quote(ident)}"
        if not registry:
            msg = f"{where} references adapter {go_quote(adapter)} but no adapters are declared"
        elif adapter not in registry:
            msg = f"{where} references unknown adapter {go_quote(adapter)} (not in registry)"
        elif registry[adapter].base_model and registry[adapter].base_model != model:
            msg = (f"{where} model {go_quote(model)} does not match adapter {go_quote(adapter)} "
                   f"base model {go_quote(registry[adapter].base_model)}")
        else:
            continue
        raise BlisConfigError(f"LoRA workload validation: {msg}")
