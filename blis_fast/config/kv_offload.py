"""The August reference's KV-offload tier chain: its configuration (spec kv-offload.md, KVO-1..3,
KVO-11).

``--kv-offload-config FILE`` names a YAML file with one top-level ``kv_offload:`` block (vLLM's
offload surface): a CPU tier sized in bytes and an ordered list of secondary ``fs`` tiers whose
device physics come from ``defaults.yaml``'s ``kv_offload_devices:`` table or from explicit
figures. This module reads the file strictly, resolves defaults and device classes, validates in
the reference's order and with its messages (KVO-2), derives the per-block byte size from the
model (KVO-3.1) and writes / reads the trace header's ``kv_offload:`` key (KVO-11.1, KVO-11.2).

The simulation of the chain reads :class:`KVOffloadConfig` from ``EngineConfig.kv_offload``.
The reference accepts three configurations that it cannot build and then panics (KVO-D3):
``blocks_per_chunk != 1``, ``eviction_policy: arc`` and a CPU budget below one block;
:func:`check_buildable` refuses them with one line instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import yaml

from blis_fast.config.kv_capacity import kv_bytes_per_token
from blis_fast.config.strict_yaml import (
    YamlContext,
    as_bool,
    as_str,
    decode_struct,
    is_null,
    mapping_items,
    parse_root,
)
from blis_fast.config.strict_yaml import _v3_number as _number
from blis_fast.errors import BlisConfigError, BlisInputError
from blis_fast.files import read_input_text
from blis_fast.gofmt import go_g, go_quote

FLAG = "--kv-offload-config"
DEFAULT_THREADS = 16
"""vLLM's default read and write server count of a secondary tier."""


# ---------------------------------------------------------------------------------------------
# Resolved configuration


@dataclass(frozen=True)
class KVOffloadDevice:
    """One ``kv_offload_devices:`` entry of ``defaults.yaml`` (KVO-2.4): the O_DIRECT triple
    (bytes/µs, µs), the optional ramp and jitter, and the optional buffered-I/O twins of all
    six; None = absent (a buffered field then falls back to its O_DIRECT value)."""

    read_bandwidth: float = 0.0
    write_bandwidth: float = 0.0
    base_latency: float = 0.0
    saturation_queue_depth: int | None = None
    single_transfer_fraction: float | None = None
    latency_jitter_stddev: float | None = None
    buffered_read_bandwidth: float | None = None
    buffered_write_bandwidth: float | None = None
    buffered_base_latency: float | None = None
    buffered_saturation_queue_depth: int | None = None
    buffered_single_transfer_fraction: float | None = None
    buffered_latency_jitter_stddev: float | None = None

    def regime(self, direct_io: bool) -> tuple[float, float, float, int, float, float]:
        """(read bw, write bw, base latency, Qsat, f1, sigma) of the regime ``direct_io``
        selects (KVO-2.5 step 5): the O_DIRECT figures with the ramp and jitter off (Qsat 1,
        f1 1.0, sigma 0) where absent; buffered I/O replaces each figure it sets."""
        rb, wb, base = self.read_bandwidth, self.write_bandwidth, self.base_latency
        qsat = 1 if self.saturation_queue_depth is None else self.saturation_queue_depth
        f1 = 1.0 if self.single_transfer_fraction is None else self.single_transfer_fraction
        sigma = 0.0 if self.latency_jitter_stddev is None else self.latency_jitter_stddev
        if direct_io:
            return rb, wb, base, qsat, f1, sigma

        def pick(buffered: Any, direct: Any) -> Any:
            return direct if buffered is None else buffered

        return (pick(self.buffered_read_bandwidth, rb), pick(self.buffered_write_bandwidth, wb),
                pick(self.buffered_base_latency, base),
                pick(self.buffered_saturation_queue_depth, qsat),
                pick(self.buffered_single_transfer_fraction, f1),
                pick(self.buffered_latency_jitter_stddev, sigma))


@dataclass(frozen=True)
class KVOffloadTier:
    """One resolved secondary tier (KVO-2.5): figures of the selected I/O regime, explicit
    figures over the device class's; ``device_class`` is an echo for the trace header."""

    type: str = "fs"
    root_dir: str = ""
    n_read_threads: int = DEFAULT_THREADS
    n_write_threads: int = DEFAULT_THREADS
    locality: str = ""
    enable_kv_events: bool = False
    direct_io: bool = False
    device_class: str = ""
    read_bandwidth: float = 0.0  # bytes per µs (the peak when a ramp is set)
    write_bandwidth: float = 0.0
    base_latency: float = 0.0  # µs, both directions (KVO-D8)
    saturation_queue_depth: int = 1  # Qsat: < 2 = no ramp
    single_transfer_fraction: float = 1.0  # f1: bandwidth fraction of one transfer alone
    latency_jitter_stddev: float = 0.0  # sigma: 0 = no jitter draw


@dataclass(frozen=True)
class KVOffloadConfig:
    """The resolved ``kv_offload:`` block (KVO-2.2) and what the model makes of it (KVO-3).

    ``per_block_bytes`` is the KV bytes of one GPU block on one TP rank (0 until derived from
    the model, :func:`with_block_bytes`); ``cpu_blocks`` the CPU tier's capacity in blocks."""

    cpu_bytes_to_use: int
    per_block_bytes: int = 0
    block_size: int = 16  # offload block in tokens = blocks_per_chunk x GPU block
    blocks_per_chunk: int = 1
    tokens_per_hash: int = 16  # recorded only (KVO-3.4, KVO-D4)
    eviction_policy: str = "lru"
    offload_prompt_only: bool = True
    self_describing_kv_events: bool = False  # recorded only (KVO-D4)
    tiers: tuple[KVOffloadTier, ...] = ()

    @property
    def cpu_blocks(self) -> int:
        """CPU tier capacity in blocks: ``cpu_bytes_to_use // per_block_bytes`` (KVO-3.2);
        0 while ``per_block_bytes`` is not derived."""
        return self.cpu_bytes_to_use // self.per_block_bytes if self.per_block_bytes > 0 else 0

    def user_facing(self) -> KVOffloadConfig:
        """The configuration without the derived ``per_block_bytes`` (what replay compares
        between a flag and a trace header, KVO-11.2)."""
        return replace(self, per_block_bytes=0)


# ---------------------------------------------------------------------------------------------
# Decoding (the file and the defaults table): None = key absent or null (Go pointer fields)


def _opt_int(ctx: YamlContext, node: yaml.Node, what: str) -> int | None:
    return None if is_null(node) else int(_number(ctx, node, what, "int"))


def _opt_float(ctx: YamlContext, node: yaml.Node, what: str) -> float | None:
    return None if is_null(node) else float(_number(ctx, node, what, "float"))


def _opt_str(ctx: YamlContext, node: yaml.Node, what: str) -> str | None:
    return None if is_null(node) else as_str(ctx, node, what)


def _opt_bool(ctx: YamlContext, node: yaml.Node, what: str) -> bool | None:
    return None if is_null(node) else as_bool(ctx, node, what)


def _float(ctx: YamlContext, node: yaml.Node, what: str) -> float:
    return 0.0 if is_null(node) else float(_number(ctx, node, what, "float"))


_TIER_FIELDS = {
    "type": _opt_str, "root_dir": _opt_str, "n_read_threads": _opt_int,
    "n_write_threads": _opt_int, "locality": _opt_str, "enable_kv_events": _opt_bool,
    "direct_io": _opt_bool, "device_class": _opt_str, "read_bandwidth": _opt_float,
    "write_bandwidth": _opt_float, "base_latency": _opt_float,
}


def _tiers(ctx: YamlContext, node: yaml.Node, what: str) -> tuple[dict[str, Any], ...]:
    if is_null(node):
        return ()
    if not isinstance(node, yaml.SequenceNode):
        raise ctx.fail(node, f"{what}: expected a list")
    return tuple(decode_struct(ctx, item, f"{what}[{i}]", _TIER_FIELDS)
                 for i, item in enumerate(node.value))


_BLOCK_FIELDS = {
    "cpu_bytes_to_use": _opt_int, "block_size": _opt_int, "blocks_per_chunk": _opt_int,
    "tokens_per_hash": _opt_int, "eviction_policy": _opt_str, "offload_prompt_only": _opt_bool,
    "self_describing_kv_events": _opt_bool, "store_threshold": _opt_int,
    "secondary_tiers": _tiers,
}


_KINDS = {_opt_int: "int", _opt_float: "float", _opt_str: "str", _opt_bool: "bool"}


def field_kinds() -> tuple[dict[str, str], dict[str, str]]:
    """The scalar fields of a ``kv_offload:`` block and of one secondary tier, each with its
    kind (``int``, ``float``, ``str``, ``bool``): what a sweep may set key by key."""
    return ({k: _KINDS[f] for k, f in _BLOCK_FIELDS.items() if f in _KINDS},
            {k: _KINDS[f] for k, f in _TIER_FIELDS.items() if f in _KINDS})


def _block(ctx: YamlContext, node: yaml.Node, what: str) -> dict[str, Any] | None:
    return None if is_null(node) else decode_struct(ctx, node, what, _BLOCK_FIELDS)


_DEVICE_FIELDS = {
    "read_bandwidth": _float, "write_bandwidth": _float, "base_latency": _float,
    "saturation_queue_depth": _opt_int, "single_transfer_fraction": _opt_float,
    "latency_jitter_stddev": _opt_float, "buffered_read_bandwidth": _opt_float,
    "buffered_write_bandwidth": _opt_float, "buffered_base_latency": _opt_float,
    "buffered_saturation_queue_depth": _opt_int, "buffered_single_transfer_fraction": _opt_float,
    "buffered_latency_jitter_stddev": _opt_float,
}


def decode_kv_offload_devices(ctx: YamlContext, node: yaml.Node, what: str
                              ) -> dict[str, KVOffloadDevice]:
    """``defaults.yaml``'s ``kv_offload_devices:`` table (KVO-2.4), device class -> figures."""
    if is_null(node):
        return {}
    out: dict[str, KVOffloadDevice] = {}
    for name, _knode, vnode in mapping_items(ctx, node, what):
        out[name] = KVOffloadDevice(**decode_struct(ctx, vnode, f"{what}.{name}",
                                                    _DEVICE_FIELDS))
    return out


def load_kv_offload_file(path: str) -> dict[str, Any] | None:
    """Read and strictly parse a ``--kv-offload-config`` file (KVO-2.1): the ``kv_offload:``
    block's keys as written (None = absent or null), or None when the file has no such block."""
    from blis_fast.gofmt import go_quote  # lazy: only runs that name the flag

    try:
        text = read_input_text(path)
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise BlisInputError(f"read {FLAG} file {go_quote(path)}: {reason}") from None
    try:
        with parse_root(text, path, f"{FLAG} file") as (ctx, root):
            top = decode_struct(ctx, root, f"{FLAG} file", {"kv_offload": _block})
    except BlisInputError as exc:
        raise BlisInputError(f"parse {FLAG} file {go_quote(path)}: {exc}") from None
    return top.get("kv_offload")


# ---------------------------------------------------------------------------------------------
# Resolution and validation (KVO-2.2 .. KVO-2.5, in the reference's order)


def resolve_kv_offload(block: dict[str, Any] | None, devices: dict[str, KVOffloadDevice],
                       gpu_block_tokens: int) -> KVOffloadConfig:
    """The resolved configuration of a parsed ``kv_offload:`` block (None: the file had none),
    defaults applied and device classes resolved; the first failure is raised as a
    BlisConfigError ``kv_offload: <reason>`` in the reference's words and order."""

    def fail(msg: str) -> BlisConfigError:
        return BlisConfigError(f"kv_offload: {msg}")

    if block is None:
        raise fail(f"the {FLAG} file has no top-level kv_offload: block")
    if gpu_block_tokens <= 0:
        raise fail(f"GPU block size (--block-size-in-tokens) must be > 0, got {gpu_block_tokens}")
    cpu = block.get("cpu_bytes_to_use")
    if cpu is None:
        raise fail("cpu_bytes_to_use is required")
    threshold = block.get("store_threshold")
    if threshold is not None and threshold < 0:
        raise fail(f"store_threshold must be >= 0, got {threshold}")
    if threshold is not None and threshold >= 2:
        raise fail(f"store_threshold={threshold}: store_threshold is not supported for "
                   "TieringOffloadingSpec (values >= 2 are rejected; it is single-tier-only and "
                   "fixed at 1 on the multi-tier offload path)")
    size, per_chunk = block.get("block_size"), block.get("blocks_per_chunk")
    if size is not None and per_chunk is not None:
        raise fail("block_size and blocks_per_chunk are mutually exclusive (they encode the "
                   "same quantity: block_size = blocks_per_chunk × gpu_block_size); set at "
                   "most one")
    if size is not None:
        if size <= 0 or size % gpu_block_tokens != 0:
            raise fail(f"block_size ({size}) must be a positive multiple of the GPU block size "
                       f"({gpu_block_tokens})")
        per_chunk = size // gpu_block_tokens
    elif per_chunk is not None:
        if per_chunk <= 0:
            raise fail(f"blocks_per_chunk must be > 0, got {per_chunk}")
        size = per_chunk * gpu_block_tokens
        if size >= 1 << 63:
            raise fail(f"blocks_per_chunk ({per_chunk}) is too large — block_size = "
                       f"blocks_per_chunk × gpu_block_size ({gpu_block_tokens}) would "
                       "overflow int64")
    else:
        size, per_chunk = gpu_block_tokens, 1
    per_hash = block.get("tokens_per_hash")
    if per_hash is not None and per_hash <= 0:
        raise fail(f"tokens_per_hash must be > 0, got {per_hash}")
    tiers = tuple(_resolve_tier(i, t, devices, fail, go_quote)
                  for i, t in enumerate(block.get("secondary_tiers", ())))
    cfg = KVOffloadConfig(
        cpu_bytes_to_use=cpu, block_size=size, blocks_per_chunk=per_chunk,
        tokens_per_hash=gpu_block_tokens if per_hash is None else per_hash,
        eviction_policy=_first(block.get("eviction_policy"), "lru"),
        offload_prompt_only=_first(block.get("offload_prompt_only"), True),
        self_describing_kv_events=_first(block.get("self_describing_kv_events"), False),
        tiers=tiers)
    problem = validation_error(cfg)
    if problem is not None:
        raise BlisConfigError(problem)
    return cfg


def _first(value: Any, default: Any) -> Any:
    return default if value is None else value


def _resolve_tier(i: int, t: dict[str, Any], devices: dict[str, KVOffloadDevice],
                  fail: Any, go_quote: Any) -> KVOffloadTier:
    """KVO-2.5 steps 1-6 for ``secondary_tiers[i]``."""
    kind = t.get("type")
    if kind is None:
        raise fail(f"secondary_tiers[{i}].type is required")
    if kind != "fs":
        raise fail(f"secondary_tiers[{i}].type={go_quote(kind)} is not supported in BLIS yet "
                   "(only \"fs\" is representable; obj/p2p/example tiers have no faithful config "
                   "mapping — see #1587/#1585)")
    root = t.get("root_dir")
    if not root:
        raise fail(f'secondary_tiers[{i}].root_dir is required for an "fs" tier')
    direct = t.get("direct_io")
    if direct is None:
        raise fail(f"secondary_tiers[{i}].direct_io must be set explicitly (BLIS makes vLLM's "
                   "runtime O_DIRECT probe an explicit config axis; direct vs buffered I/O are "
                   "materially different storage physics)")
    rb = wb = base = 0.0
    qsat, f1, sigma = 1, 1.0, 0.0
    name = t.get("device_class")
    if name is not None:
        device = devices.get(name)
        if device is None:
            known = ", ".join(sorted(devices)) if devices else "<none configured>"
            raise fail(f"secondary_tiers[{i}].device_class={go_quote(name)} is not defined in "
                       f"defaults.yaml kv_offload_devices (known: {known})")
        rb, wb, base, qsat, f1, sigma = device.regime(direct)
    explicit = (t.get("read_bandwidth"), t.get("write_bandwidth"), t.get("base_latency"))
    if name is None and None in explicit:
        raise fail(f"secondary_tiers[{i}] needs a device_class OR an explicit read_bandwidth + "
                   "write_bandwidth + base_latency triple")
    rb, wb, base = (_first(v, d) for v, d in zip(explicit, (rb, wb, base), strict=True))
    return KVOffloadTier(
        type=kind, root_dir=root,
        n_read_threads=_first(t.get("n_read_threads"), DEFAULT_THREADS),
        n_write_threads=_first(t.get("n_write_threads"), DEFAULT_THREADS),
        locality=_first(t.get("locality"), ""),
        enable_kv_events=_first(t.get("enable_kv_events"), False), direct_io=direct,
        device_class=_first(name, ""), read_bandwidth=rb, write_bandwidth=wb, base_latency=base,
        saturation_queue_depth=qsat, single_transfer_fraction=f1, latency_jitter_stddev=sigma)


def validation_error(cfg: KVOffloadConfig) -> str | None:
    """The reference's check of a resolved configuration (KVO-2.5 step 7 and the block's own
    figures), as ``kv_offload: <reason>``; None when it passes. ``per_block_bytes`` is not
    checked here (it is derived later)."""

    if cfg.cpu_bytes_to_use <= 0:
        return ("kv_offload: cpu_bytes_to_use must be > 0 when offload is enabled, got "
                f"{cfg.cpu_bytes_to_use}")
    if cfg.block_size <= 0:
        return f"kv_offload: block_size must be > 0, got {cfg.block_size}"
    if cfg.blocks_per_chunk <= 0:
        return f"kv_offload: blocks_per_chunk must be > 0, got {cfg.blocks_per_chunk}"
    if cfg.tokens_per_hash <= 0:
        return f"kv_offload: tokens_per_hash must be > 0, got {cfg.tokens_per_hash}"
    if cfg.eviction_policy not in ("lru", "arc"):
        return ('kv_offload: eviction_policy must be "lru" or "arc", got '
                f"{go_quote(cfg.eviction_policy)}")
    for i, t in enumerate(cfg.tiers):
        where = f"kv_offload: secondary_tiers[{i}]"
        if t.type != "fs":
            return (f'{where}.type must be "fs" (only the filesystem tier is representable in '
                    f"BLIS; obj/p2p/example are not yet supported), got {go_quote(t.type)}")
        if t.root_dir == "":
            return f'{where}.root_dir is required for an "fs" tier'
        if t.locality not in ("", "LOCAL", "REMOTE"):
            return (f'{where}.locality must be "LOCAL" or "REMOTE" (or unset), got '
                    f"{go_quote(t.locality)}")
        if t.n_read_threads <= 0:
            return f"{where}.n_read_threads must be > 0, got {t.n_read_threads}"
        if t.n_write_threads <= 0:
            return f"{where}.n_write_threads must be > 0, got {t.n_write_threads}"
        for field_name, v in (("read_bandwidth", t.read_bandwidth),
                              ("write_bandwidth", t.write_bandwidth)):
            if not (math.isfinite(v) and v > 0):
                return f"{where}.{field_name} must be a finite value > 0, got {go_g(v)}"
        if not (math.isfinite(t.base_latency) and t.base_latency >= 0):
            return f"{where}.base_latency must be a finite value >= 0, got {go_g(t.base_latency)}"
        if t.saturation_queue_depth < 0:
            return (f"{where}.saturation_queue_depth must be >= 0, got "
                    f"{t.saturation_queue_depth}")
        f1 = t.single_transfer_fraction
        if not math.isfinite(f1):
            return f"{where}.single_transfer_fraction must be a finite value, got {go_g(f1)}"
        if t.saturation_queue_depth >= 2 and not 0 < f1 <= 1:
            return (f"{where}.single_transfer_fraction must be in (0,1] when "
                    f"saturation_queue_depth >= 2, got {go_g(f1)}")
        sigma = t.latency_jitter_stddev
        if not (math.isfinite(sigma) and sigma >= 0):
            return f"{where}.latency_jitter_stddev must be a finite value >= 0, got {go_g(sigma)}"
    return None


def inert_keys(block: dict[str, Any] | None) -> list[str]:
    """The keys of a parsed block that are recorded but change nothing (KVO-2.3, KVO-D4), as
    written in the file (``secondary_tiers[i].key`` for a tier's)."""
    if not block:
        return []
    out = [k for k in ("tokens_per_hash", "self_describing_kv_events", "store_threshold")
           if block.get(k) is not None]
    for i, t in enumerate(block.get("secondary_tiers", ())):
        out += [f"secondary_tiers[{i}].{k}" for k in ("locality", "enable_kv_events")
                if t.get(k) is not None]
    return out


def inert_warning(path: str, block: dict[str, Any] | None) -> str | None:
    """The one warning naming the inert keys a ``--kv-offload-config`` file sets (KVO-D4);
    None when it sets none."""
    keys = inert_keys(block)
    if not keys:
        return None
    return (f"{FLAG} {path}: {', '.join(keys)} only recorded in the trace header: the "
            "simulation does not use them (the reference's offload keys every block by the GPU "
            "block hash and emits no KV events)")


def resolve_flag(path: str, devices: dict[str, KVOffloadDevice], gpu_block_tokens: int
                 ) -> tuple[KVOffloadConfig, str | None]:
    """The configuration of the ``--kv-offload-config`` file ``path`` (KVO-2.1) and its
    inert-key warning; a resolution failure names the flag and the file as the reference
    does (``--kv-offload-config "PATH": kv_offload: ...``)."""

    block = load_kv_offload_file(path)
    try:
        cfg = resolve_kv_offload(block, devices, gpu_block_tokens)
    except BlisConfigError as exc:
        raise BlisConfigError(f"{FLAG} {go_quote(path)}: {exc}") from None
    return cfg, inert_warning(path, block)


# ---------------------------------------------------------------------------------------------
# The model's KV bytes (KVO-3.1, 3.2) and the configurations the reference cannot build (KVO-D3)


def with_block_bytes(cfg: KVOffloadConfig, model_config: Any, tp: int, block_tokens: int,
                     backend: str) -> KVOffloadConfig:
    """``cfg`` with ``per_block_bytes = int(KV bytes per token per TP rank x block_tokens)``,
    the August rule (an explicit ``head_dim`` in config.json is used, KVO-3.1); a model the
    figure cannot be derived from is refused."""

    prefix = "kv_offload: cannot derive per_block_bytes from the model: "
    if model_config is None:
        raise BlisConfigError(f"{prefix}--latency-model {backend} resolves no model "
                              "architecture (config.json)")
    try:
        per_token = kv_bytes_per_token(model_config, tp, explicit_head_dim=True)
    except BlisConfigError as exc:
        raise BlisConfigError(f"{prefix}{exc}") from None
    block_bytes = per_token * float(block_tokens)
    if not math.isfinite(block_bytes) or block_bytes >= 2.0 ** 63:
        raise BlisConfigError(f"{prefix}{block_bytes:g} bytes per block is out of range")
    per_block = int(block_bytes)
    if per_block <= 0:
        raise BlisConfigError(f"kv_offload: derived per_block_bytes must be > 0 "
                              f"(KVBytesPerToken={per_token!r} × block_size={block_tokens})")
    return replace(cfg, per_block_bytes=per_block)


def check_buildable(cfg: KVOffloadConfig) -> None:
    """Refuse what the reference validates and then cannot build (it panics with a stack
    trace when the first instance is built, KVO-3.2, KVO-3.3, KVO-D3): one line instead."""
    prefix = f"{FLAG}: "
    if cfg.blocks_per_chunk != 1:
        raise BlisConfigError(
            f"{prefix}blocks_per_chunk {cfg.blocks_per_chunk} (block_size {cfg.block_size}) is "
            "not supported: offload works block by block (blocks_per_chunk 1; the reference "
            "panics on any other value)")
    if cfg.eviction_policy != "lru":

        raise BlisConfigError(
            f"{prefix}eviction_policy {go_quote(cfg.eviction_policy)} is not supported: only "
            '"lru" is simulated (the reference panics on any other value)')
    if cfg.per_block_bytes > 0 and cfg.cpu_blocks < 1:
        raise BlisConfigError(
            f"{prefix}cpu_bytes_to_use ({cfg.cpu_bytes_to_use}) is smaller than one KV block "
            f"({cfg.per_block_bytes} bytes for this model and TP): the CPU tier would hold no "
            "block (the reference panics)")


def _str(ctx: YamlContext, node: yaml.Node, what: str) -> str:
    return as_str(ctx, node, what)


def _int(ctx: YamlContext, node: yaml.Node, what: str) -> int:
    return 0 if is_null(node) else int(_number(ctx, node, what, "int"))


def _bool(ctx: YamlContext, node: yaml.Node, what: str) -> bool:
    return as_bool(ctx, node, what)


_HEADER_TIER = {
    "type": _str, "root_dir": _str, "n_read_threads": _int, "n_write_threads": _int,
    "locality": _str, "enable_kv_events": _bool, "direct_io": _bool, "device_class": _str,
    "read_bandwidth": _float, "write_bandwidth": _float, "base_latency": _float,
    "saturation_queue_depth": _int, "single_transfer_fraction": _float,
    "latency_jitter_stddev": _float,
}
_HEADER_BLOCK = {
    "cpu_bytes_to_use": _int, "per_block_bytes": _int, "block_size": _int,
    "blocks_per_chunk": _int, "tokens_per_hash": _int, "eviction_policy": _str,
    "offload_prompt_only": _bool, "self_describing_kv_events": _bool,
    "secondary_tiers": lambda ctx, n, w: () if is_null(n) else tuple(
        KVOffloadTier(**decode_struct(ctx, item, f"{w}[{i}]", _HEADER_TIER))
        for i, item in enumerate(_sequence(ctx, n, w))),
}


def _sequence(ctx: YamlContext, node: yaml.Node, what: str) -> list[yaml.Node]:
    if not isinstance(node, yaml.SequenceNode):
        raise ctx.fail(node, f"{what}: expected a list")
    return list(node.value)


def decode_header_block(ctx: YamlContext, node: yaml.Node, what: str
                        ) -> KVOffloadConfig | None:
    """A trace header's ``kv_offload:`` key as recorded (absent keys are Go zero values; a
    tier's fields are taken as written, never re-resolved, KVO-11.2); None when null."""
    if is_null(node):
        return None
    v = decode_struct(ctx, node, what, _HEADER_BLOCK)
    tiers = v.pop("secondary_tiers", ())
    zero = {"cpu_bytes_to_use": 0, "block_size": 0, "blocks_per_chunk": 0,
            "tokens_per_hash": 0, "eviction_policy": "", "offload_prompt_only": False,
            "self_describing_kv_events": False}
    return KVOffloadConfig(**{**zero, **v}, tiers=tiers)


def reconcile_replay(header_cfg: KVOffloadConfig | None, header_mode: str,
                     flag_cfg: KVOffloadConfig | None) -> KVOffloadConfig | None:
    """Replay's configuration (KVO-11.2): the trace header's when it has one (it must pass the
    reference's checks, and a ``--kv-offload-config`` given beside it must resolve to the same
    configuration, ``per_block_bytes`` aside); otherwise the flag's, accepted only on a trace
    recorded from a real server (header ``mode: real``)."""
    if header_cfg is not None:
        problem = validation_error(header_cfg)
        if problem is not None:
            raise BlisConfigError(f"blis replay cannot reproduce the trace's kv_offload config: "
                                  f"{problem} (INV-13: never silent degradation)")
        if flag_cfg is not None and flag_cfg.user_facing() != header_cfg.user_facing():
            raise BlisConfigError(
                f"{FLAG} conflicts with the kv_offload config recorded in the trace header; on "
                "replay the header is authoritative — omit the flag or pass the identical "
                "config")
        return header_cfg
    if flag_cfg is not None and header_mode != "real":
        raise BlisConfigError(
            f"the trace was captured without a kv_offload config; {FLAG} cannot add one on "
            "replay of a sim-generated trace (INV-13). Only observe traces (mode \"real\") may "
            "have an offload config supplied on replay to model the observed deployment")
    return flag_cfg
