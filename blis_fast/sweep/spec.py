"""Sweep specs: parse a sweep YAML strictly, expand its axes into configurations, validate them.

A spec holds ``base`` (options of ``blis run`` by field name, e.g. ``num_instances``) and axes
that vary options: ``grid`` (cartesian product), ``zip`` (equal-length lists varied together),
``random`` (seeded samples from ranges or choice lists) and ``seeds`` (replications). The axes
combine as a product, in that order, seeds varying fastest. Every configuration is checked by
the same validation ``blis run`` uses (``build_options`` then ``runner.prepare``) before any
simulation starts, so a bad value is one error naming the key, the file and its line.

Keys ``kv_offload.<field>`` and ``kv_offload.secondary_tiers.<i>.<field>`` (or the whole list,
``kv_offload.secondary_tiers``) vary the KV offload chain (``--kv-offload-config``, issue 32):
each configuration's ``kv_offload:`` block is the base file's (``base.kv_offload_config``, or
an empty block) with those fields set, written as ``<dir>/<config_id>.yaml`` by
:meth:`SweepPlan.write_offload_files` (a sweep keeps them under ``--out``/kv_offload) and
given to the run as its ``--kv-offload-config``.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import random
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from blis_fast.config.strict_yaml import (
    YamlContext,
    as_int,
    decode_struct,
    is_null,
    mapping_items,
    parse_root,
    scalar,
)
from blis_fast.errors import BlisConfigError, BlisError, BlisInputError
from blis_fast.files import read_input_text
from blis_fast.options import OPTIONS_BY_FIELD, RUN_OPTIONS, OptionSpec, build_options, coerce

__all__ = [
    "AXES",
    "OFFLOAD_PREFIX",
    "PATH_OPTIONS",
    "RANDOM_DISTRIBUTIONS",
    "SweepConfig",
    "SweepPlan",
    "load_sweep_plan",
    "parse_sweep_spec",
    "validate_plan",
]

AXES = ("grid", "zip", "random", "seeds")
MAX_SWEEP_CONFIGS = 100_000
"""Most configurations one sweep may expand to (counted before any is built)."""
"""The axis sections of a spec, in the order they nest (the last varies fastest)."""

PATH_OPTIONS = frozenset(spec.field for spec in RUN_OPTIONS
                         if spec.file in ("input", "input-folder"))
"""Options naming input files: relative paths are taken relative to the spec file."""

OUTPUT_OPTIONS = frozenset(spec.field for spec in RUN_OPTIONS if spec.file == "output")
"""Per-run output options: a sweep writes its own outputs under ``--out``."""

OFFLOAD_PREFIX = "kv_offload."
"""Spec keys under this prefix set fields of the configurations' ``kv_offload:`` block."""
OFFLOAD_TIERS = "secondary_tiers"

RUN_DEFAULTS = {"log": "error"}
"""Run options a sweep sets unless the spec does: per-run diagnostics would drown the progress."""


@dataclass(frozen=True)
class RangeDistribution:
    """A ``random`` axis distribution over ``[low, high]`` drawn from one uniform variate."""

    option_kinds: frozenset[str]
    draw: Callable[[float, float, float], float | int]
    low_must_be_positive: bool = False


def _draw_int(u: float, low: float, high: float) -> int:
    return min(int(high), int(low) + math.floor(u * (int(high) - int(low) + 1)))


RANDOM_DISTRIBUTIONS: dict[str, RangeDistribution] = {
    "uniform": RangeDistribution(frozenset({"float"}), lambda u, lo, hi: lo + (hi - lo) * u),
    "loguniform": RangeDistribution(
        frozenset({"float"}),
        lambda u, lo, hi: math.exp(math.log(lo) + (math.log(hi) - math.log(lo)) * u),
        low_must_be_positive=True),
    "int": RangeDistribution(frozenset({"int", "float"}), _draw_int),
}
"""Range distributions of the ``random`` axis (``choice: [...]`` is the list form)."""


@dataclass(frozen=True)
class SweepConfig:
    """One configuration: its id (expansion index + content hash) and its option values."""

    index: int
    config_id: str
    values: dict[str, Any]


@dataclass
class SweepPlan:
    """An expanded sweep: the option columns every row carries and the configurations."""

    path: str
    text: str
    columns: tuple[str, ...]
    """Option fields of the configurations, in the options-table order (``seed`` included)."""
    varied: tuple[str, ...]
    """Option fields set by an axis (the rest come from ``base`` or the defaults)."""
    configs: list[SweepConfig]
    lines: dict[str, int] = field(default_factory=dict)
    """1-based spec line of each key, for error messages."""
    offload_columns: tuple[str, ...] = ()
    """``kv_offload.*`` keys of the configurations (after the option columns)."""
    _offload_bases: dict[str, dict[str, Any]] = field(default_factory=dict, init=False,
                                                      repr=False, compare=False)
    """The base files' blocks by path, each read once (every configuration starts from one)."""

    def run_kwargs(self, config: SweepConfig, overrides: dict[str, Any] | None = None,
                   offload_dir: str | Path | None = None) -> dict[str, Any]:
        """Keyword arguments of ``blis_fast.run`` for one configuration (paths made absolute),
        with ``overrides`` on top; a sweep varying the offload chain names the configuration's
        file under ``offload_dir`` (see :meth:`write_offload_files`)."""
        kwargs = dict(RUN_DEFAULTS)
        base_dir = Path(self.path).resolve().parent
        for name, value in config.values.items():
            if name in self.offload_columns:
                continue
            if name in PATH_OPTIONS and value and not Path(value).is_absolute():
                value = str(base_dir / value)
            kwargs[name] = value
        if self.offload_columns:
            if offload_dir is None:
                raise ValueError("this sweep varies kv_offload: run_kwargs needs offload_dir")
            kwargs["kv_offload_config"] = str(Path(offload_dir).resolve()
                                              / f"{config.config_id}.yaml")
        kwargs.update(overrides or {})
        return kwargs

    def offload_block(self, config: SweepConfig) -> dict[str, Any]:
        """The ``kv_offload:`` block of one configuration: the base file's (empty without
        one) with the configuration's ``kv_offload.*`` values set, as plain YAML data."""
        from blis_fast.config.kv_offload import load_kv_offload_file  # lazy: sweeps using it

        base = config.values.get("kv_offload_config", "")
        if base and not Path(base).is_absolute():
            base = str(Path(self.path).resolve().parent / base)
        if base and base not in self._offload_bases:
            self._offload_bases[base] = {k: v for k, v in (load_kv_offload_file(base) or {}).items()
                                         if v is not None}
        block = dict(self._offload_bases[base]) if base else {}
        tiers = [dict(t) for t in block.get(OFFLOAD_TIERS, ())]
        keys = sorted(self.offload_columns, key=lambda k: k.count("."))  # whole list first
        for key in keys:
            value = config.values[key]
            path = key[len(OFFLOAD_PREFIX):].split(".")
            if path == [OFFLOAD_TIERS]:
                tiers = [dict(t) for t in json.loads(value)]
            elif path[0] == OFFLOAD_TIERS:
                index = int(path[1])
                if index >= len(tiers):
                    raise BlisConfigError(
                        f"{key}: the configuration has "
                        f"{len(tiers)} secondary tier(s); set {OFFLOAD_PREFIX}{OFFLOAD_TIERS} "
                        "or the base --kv-offload-config file to add tiers")
                tiers[index][path[2]] = value
            else:
                block[path[0]] = value
        if tiers or OFFLOAD_TIERS in block:
            block[OFFLOAD_TIERS] = tiers
        return block

    def write_offload_files(self, directory: str | Path,
                            configs: list[SweepConfig] | None = None) -> None:
        """Write each configuration's (or those of ``configs``) ``kv_offload:`` block as
        ``<directory>/<config_id>.yaml`` (atomically; an existing file is replaced by the same
        content); nothing without ``kv_offload.*`` keys."""
        if not self.offload_columns:
            return
        Path(directory).mkdir(parents=True, exist_ok=True)
        for config in self.configs if configs is None else configs:
            self._write_offload_file(directory, config, self.offload_block(config))

    @staticmethod
    def _write_offload_file(directory: str | Path, config: SweepConfig,
                            block: dict[str, Any]) -> None:
        """``<directory>/<config_id>.yaml`` holding ``block`` as its ``kv_offload:`` block."""
        from blis_fast.files import write_output_file  # lazy: only sweeps varying kv_offload

        text = yaml.safe_dump({"kv_offload": block}, sort_keys=True)
        write_output_file(Path(directory) / f"{config.config_id}.yaml", "sweep kv_offload file",
                          text.encode())

    def describe(self, config: SweepConfig) -> str:
        """The varied values of a configuration, ``rate=10.0, seed=3``."""
        return ", ".join(f"{k}={config.values[k]!r}" for k in self.varied) or "base"


@dataclass
class _Axes:
    """Decoded spec sections: option values per key, with the line each key is on."""

    base: dict[str, Any] = field(default_factory=dict)
    grid: dict[str, list[Any]] = field(default_factory=dict)
    zipped: dict[str, list[Any]] = field(default_factory=dict)
    random_rows: list[dict[str, Any]] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)
    lines: dict[str, int] = field(default_factory=dict)


def _offload_spec(ctx: YamlContext, knode: yaml.Node, key: str, where: str) -> OptionSpec:
    """The value type of a ``kv_offload.*`` key (module docstring): a field of the block, of
    one secondary tier, or the whole tier list (kind ``tiers``)."""
    from blis_fast.config.kv_offload import FLAG, field_kinds  # lazy: sweeps using it

    block_kinds, tier_kinds = field_kinds()
    path = key[len(OFFLOAD_PREFIX):].split(".")
    kind = None
    if path == [OFFLOAD_TIERS]:
        kind = "tiers"
    elif len(path) == 1:
        kind = block_kinds.get(path[0])
    elif len(path) == 3 and path[0] == OFFLOAD_TIERS and path[1].isdigit():
        kind = tier_kinds.get(path[2])
    if kind is None:
        raise ctx.fail(knode, f"unknown offload key {key!r} in {where}; the keys are "
                              f"{OFFLOAD_PREFIX}<field> ({', '.join(block_kinds)}), "
                              f"{OFFLOAD_PREFIX}{OFFLOAD_TIERS} (the whole list) and "
                              f"{OFFLOAD_PREFIX}{OFFLOAD_TIERS}.<index>.<field> "
                              f"({', '.join(tier_kinds)})")
    return OptionSpec(FLAG.lstrip("-"), kind, None, "")


def _option(ctx: YamlContext, knode: yaml.Node, key: str, where: str, lines: dict[str, int]
            ) -> OptionSpec:
    """The ``blis run`` option named by a spec key; unknown, output or repeated keys fail."""
    spec = (_offload_spec(ctx, knode, key, where) if key.startswith(OFFLOAD_PREFIX)
            else OPTIONS_BY_FIELD.get(key))
    if spec is None:
        hint = (f" (option keys use '_': {key.replace('-', '_')})"
                if key.replace("-", "_") in OPTIONS_BY_FIELD else "")
        raise ctx.fail(knode, f"unknown option {key!r} in {where}{hint}; the keys are the "
                              "options of blis run (see blis run --help)")
    if key in OUTPUT_OPTIONS:
        raise ctx.fail(knode, f"{where}.{key}: per-run outputs are not sweep options; the "
                              "sweep writes its results under --out")
    if key in lines:
        raise ctx.fail(knode, f"{where}.{key}: {key!r} is already set at line {lines[key]}; "
                              "a key may appear in one section only")
    lines[key] = knode.start_mark.line + 1
    return spec


def _value(ctx: YamlContext, node: yaml.Node, spec: OptionSpec, what: str) -> Any:
    """One option value, coerced exactly as ``build_options`` coerces API values (a whole
    secondary-tier list: its canonical JSON text, checked when the configuration is)."""
    if spec.kind == "tiers":
        if not isinstance(node, yaml.SequenceNode) or not all(
                isinstance(item, yaml.MappingNode) for item in node.value):
            raise ctx.fail(node, f"{what}: expected a list of tiers (mappings), [] for none")
        return json.dumps(yaml.safe_load(yaml.serialize(node)), sort_keys=True)
    if spec.kind == "floats" and isinstance(node, yaml.SequenceNode):
        raw: Any = [scalar(ctx, item, f"{what}[{i}]") for i, item in enumerate(node.value)]
    else:
        raw = scalar(ctx, node, what)
    if raw is None:
        raise ctx.fail(node, f"{what}: a value is required")
    try:
        value = coerce(spec, raw)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ctx.fail(node, f"{what}: invalid value {raw!r} for --{spec.flag}: {exc}") from None
    if spec.kind == "int" and not -(1 << 63) <= value < (1 << 63):
        raise ctx.fail(node, f"{what}: {value} is outside the 64-bit integer range of "
                             f"--{spec.flag}")
    return value


def _items(ctx: YamlContext, node: yaml.Node, what: str) -> list[yaml.Node]:
    """The items of a non-empty YAML list."""
    if not isinstance(node, yaml.SequenceNode) or not node.value:
        raise ctx.fail(node, f"{what}: expected a non-empty list of values")
    return node.value


def _list_axis(ctx: YamlContext, node: yaml.Node, section: str, lines: dict[str, int]
               ) -> dict[str, list[Any]]:
    """A ``grid`` or ``zip`` section: option key -> list of values."""
    out: dict[str, list[Any]] = {}
    for key, knode, vnode in mapping_items(ctx, node, section):
        spec = _option(ctx, knode, key, section, lines)
        what = f"{section}.{key}"
        out[key] = [_value(ctx, item, spec, f"{what}[{i}]")
                    for i, item in enumerate(_items(ctx, vnode, what))]
    return out


def _random_axis(ctx: YamlContext, node: yaml.Node, lines: dict[str, int]) -> list[dict]:
    """The ``random`` section: ``samples`` draws of ``params`` with the sweep's own ``seed``."""
    params: list[tuple[str, OptionSpec, Callable[[float], Any]]] = []

    def decode_params(ctx: YamlContext, pnode: yaml.Node, what: str) -> None:
        for key, knode, vnode in mapping_items(ctx, pnode, what):
            spec = _option(ctx, knode, key, what, lines)
            params.append((key, spec, _distribution(ctx, vnode, spec, f"{what}.{key}")))

    top = decode_struct(ctx, node, "random", {"samples": as_int, "seed": as_int,
                                              "params": decode_params})
    if top.get("samples", 0) <= 0:
        raise ctx.fail(node, "random.samples: expected a number of samples > 0")
    if top["samples"] > MAX_SWEEP_CONFIGS:
        raise ctx.fail(node, f"random.samples: {top['samples']} samples, more than the "
                             f"{MAX_SWEEP_CONFIGS} configurations a sweep may have")
    if not params:
        raise ctx.fail(node, "random.params: expected at least one option to sample")
    rng = random.Random(top.get("seed", 0))
    rows = []
    for _ in range(top["samples"]):
        rows.append({key: coerce(spec, draw(rng.random())) for key, spec, draw in params})
    return rows


def _distribution(ctx: YamlContext, node: yaml.Node, spec: OptionSpec, what: str
                  ) -> Callable[[float], Any]:
    """A ``{uniform|loguniform|int: [low, high]}`` or ``{choice: [...]}`` mapping -> draw(u)."""
    known = [*RANDOM_DISTRIBUTIONS, "choice"]
    items = mapping_items(ctx, node, what)
    if len(items) != 1:
        raise ctx.fail(node, f"{what}: expected one of {', '.join(known)} with its arguments")
    name, knode, vnode = items[0]
    if name == "choice":
        values = [_value(ctx, item, spec, f"{what}.choice[{i}]")
                  for i, item in enumerate(_items(ctx, vnode, f"{what}.choice"))]
        return lambda u: values[min(len(values) - 1, math.floor(u * len(values)))]
    dist = RANDOM_DISTRIBUTIONS.get(name)
    if dist is None:
        raise ctx.fail(knode, f"{what}: unknown distribution {name!r}; known: {', '.join(known)}")
    if spec.kind not in dist.option_kinds:
        raise ctx.fail(knode, f"{what}: {name} cannot set --{spec.flag} (a {spec.kind} option)")
    bounds = _items(ctx, vnode, f"{what}.{name}")
    float_spec = OptionSpec(spec.flag, "float", 0.0, "")
    low = high = math.nan
    if len(bounds) == 2:
        low, high = (_value(ctx, b, float_spec, f"{what}.{name}[{i}]")
                     for i, b in enumerate(bounds))
    if not (math.isfinite(low) and math.isfinite(high) and low <= high):
        raise ctx.fail(vnode, f"{what}.{name}: expected [low, high] with finite low <= high")
    if dist.low_must_be_positive and low <= 0:
        raise ctx.fail(vnode, f"{what}.{name}: low must be > 0")
    return lambda u: dist.draw(u, low, high)


def _seeds(ctx: YamlContext, node: yaml.Node, lines: dict[str, int]) -> list[int]:
    """``seeds: N`` (N seeds counting up from the default seed, 42) or ``seeds: [s1, ...]``."""
    seed_spec = OPTIONS_BY_FIELD["seed"]
    if "seed" in lines:
        raise ctx.fail(node, f"seeds: 'seed' is already set at line {lines['seed']}")
    lines["seed"] = node.start_mark.line + 1
    if isinstance(node, yaml.SequenceNode):
        return [_value(ctx, item, seed_spec, f"seeds[{i}]")
                for i, item in enumerate(_items(ctx, node, "seeds"))]
    count = as_int(ctx, node, "seeds")
    if count <= 0:
        raise ctx.fail(node, "seeds: expected a list of seeds or a count > 0")
    if count > MAX_SWEEP_CONFIGS:
        raise ctx.fail(node, f"seeds: {count} seeds, more than the {MAX_SWEEP_CONFIGS} "
                             "configurations a sweep may have")
    return [seed_spec.default + i for i in range(count)]


def _decode(text: str, path: str) -> _Axes:
    """The spec's sections, decoded in a fixed order (base, grid, zip, random, seeds)."""
    axes = _Axes()
    nodes: dict[str, yaml.Node] = {}

    def keep(name: str) -> Callable[[YamlContext, yaml.Node, str], None]:
        def store(_ctx: YamlContext, node: yaml.Node, _what: str) -> None:
            nodes[name] = node
        return store

    with parse_root(text, path, "sweep spec") as (ctx, root):
        decode_struct(ctx, root, "sweep spec", {name: keep(name) for name in ("base", *AXES)})
        if "base" in nodes and not is_null(nodes["base"]):
            for key, knode, vnode in mapping_items(ctx, nodes["base"], "base"):
                spec = _option(ctx, knode, key, "base", axes.lines)
                axes.base[key] = _value(ctx, vnode, spec, f"base.{key}")
        if "grid" in nodes:
            axes.grid = _list_axis(ctx, nodes["grid"], "grid", axes.lines)
        if "zip" in nodes:
            axes.zipped = _list_axis(ctx, nodes["zip"], "zip", axes.lines)
            lengths = {len(v) for v in axes.zipped.values()}
            if len(lengths) > 1:
                raise ctx.fail(nodes["zip"], "zip: the lists must have equal lengths, got "
                               + ", ".join(f"{k}: {len(v)}" for k, v in axes.zipped.items()))
        if "random" in nodes:
            axes.random_rows = _random_axis(ctx, nodes["random"], axes.lines)
        if "seeds" in nodes:
            axes.seeds = _seeds(ctx, nodes["seeds"], axes.lines)
    return axes


def config_id(index: int, values: dict[str, Any]) -> str:
    """``<index>-<hash>``: expansion order, then 8 hex digits of the values' SHA-256."""
    canonical = json.dumps(values, sort_keys=True, separators=(",", ":"))
    return f"{index:06d}-{hashlib.sha256(canonical.encode()).hexdigest()[:8]}"


def parse_sweep_spec(text: str, path: str) -> SweepPlan:
    """Decode a sweep spec and expand it into configurations (not yet validated as runs)."""
    axes = _decode(text, path)
    count = (math.prod(len(v) for v in axes.grid.values())
             * (len(next(iter(axes.zipped.values()))) if axes.zipped else 1)
             * max(len(axes.random_rows), 1) * max(len(axes.seeds), 1))
    if count > MAX_SWEEP_CONFIGS:
        raise BlisConfigError(f"{path}: the sweep expands to {count} configurations, more than "
                              f"the {MAX_SWEEP_CONFIGS} a sweep may have; split it")
    grid_rows = [dict(zip(axes.grid, combo, strict=True))
                 for combo in itertools.product(*axes.grid.values())]
    zip_rows = [dict(zip(axes.zipped, vals, strict=True))
                for vals in zip(*axes.zipped.values(), strict=True)] or [{}]
    random_rows = axes.random_rows or [{}]
    seed_rows = [{"seed": s} for s in axes.seeds] or [{}]
    varied = {*axes.grid, *axes.zipped, *(axes.random_rows[0] if axes.random_rows else ()),
              *(("seed",) if axes.seeds else ())}
    offload_columns = tuple(sorted(k for k in (*axes.base, *varied)
                                   if k.startswith(OFFLOAD_PREFIX)))
    columns = tuple(spec.field for spec in RUN_OPTIONS
                    if spec.field in axes.base or spec.field in varied or spec.field == "seed"
                    ) + offload_columns
    configs: list[SweepConfig] = []
    seed_default = {"seed": OPTIONS_BY_FIELD["seed"].default}
    for parts in itertools.product(grid_rows, zip_rows, random_rows, seed_rows):
        merged = {**seed_default, **axes.base, **parts[0], **parts[1], **parts[2], **parts[3]}
        values = {name: merged[name] for name in columns}
        configs.append(SweepConfig(len(configs), config_id(len(configs), values), values))
    return SweepPlan(path=path, text=text, columns=columns,
                     varied=tuple(c for c in columns if c in varied), configs=configs,
                     lines=axes.lines, offload_columns=offload_columns)


def validate_plan(plan: SweepPlan, overrides: dict[str, Any] | None = None) -> None:
    """Check every configuration (with ``overrides``) as ``blis run`` would, before anything
    runs or is written. Configurations differing only in ``seed`` are checked once (no check
    depends on the seed)."""
    from blis_fast.runner import prepare  # lazy: numba, to check configurations only

    checked: set[str] = set()
    with tempfile.TemporaryDirectory(prefix="blis-sweep-offload-") as offload_dir:
        for config in plan.configs:
            try:
                if plan.offload_columns:  # the file's text, not its path, makes it distinct
                    offload = plan.offload_block(config)
                    plan._write_offload_file(offload_dir, config, offload)
                    block = json.dumps(offload, sort_keys=True)
                else:
                    block = ""
                kwargs = plan.run_kwargs(config, overrides, offload_dir)
                key = json.dumps({k: v for k, v in kwargs.items()
                                  if k not in ("seed", "kv_offload_config")},
                                 sort_keys=True) + block
                if key in checked:
                    continue
                checked.add(key)
                prepare(build_options(kwargs))
            except BlisError as exc:  # the files are temporary: name them as a sweep will
                message = str(exc).replace(str(Path(offload_dir).resolve()) + os.sep,
                                           "kv_offload" + os.sep)
                raise BlisConfigError(_config_error(plan, config, message)) from None


def _config_error(plan: SweepPlan, config: SweepConfig, message: str) -> str:
    """``file:line: configuration <id> (<varied values>): <message>``, line of the named key."""
    def names(key: str) -> bool:  # the message is about this key
        if key in plan.offload_columns:
            return key in message or ("--kv-offload-config" in message
                                      and key.rsplit(".", 1)[-1] in message)
        return f"--{OPTIONS_BY_FIELD[key].flag}" in message

    keys = (*sorted(plan.offload_columns, key=len, reverse=True),  # the most specific first
            *(k for k in plan.columns if k not in plan.offload_columns))
    line = next((plan.lines[k] for k in keys if k in plan.lines and names(k)), None)
    where = f"{plan.path}:{line}" if line is not None else plan.path
    return f"{where}: configuration {config.config_id} ({plan.describe(config)}): {message}"


def load_sweep_plan(path: str | Path, validate: bool = True) -> SweepPlan:
    """Read, expand and (by default) validate the sweep spec at ``path``."""
    path = str(path)
    try:
        text = read_input_text(path)
    except (OSError, UnicodeDecodeError) as exc:
        raise BlisInputError(f"cannot read sweep spec {path}: {exc}") from None
    plan = parse_sweep_spec(text, path)
    if validate:
        validate_plan(plan)
    return plan
