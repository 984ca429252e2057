"""Strict loading of ``defaults.yaml`` and its lookups (spec ENG-10.2/10.3, DELTA-22..24).

The file is parsed node by node so that every unknown key, duplicate key or value of the wrong
type is reported with the file name and the 1-based line where it occurs (``BlisInputError``).
Known layout::

    defaults:   {model id: {GPU, tensor_parallelism, vllm_version, hf_repo}}
    workloads:  {preset: {prefix_tokens, prompt_tokens, prompt_tokens_stdev, ..., output_tokens_max}}
    models:     [{id, GPU, tensor_parallelism, vllm_version, alpha_coeffs, beta_coeffs, best_loss}]
    <a section of COEFFICIENT_SECTIONS> (a latency backend's global α/β; its registry entry in
    ``config/latency_backends.py`` names the section): {alpha_coeffs, beta_coeffs}
    version:    string
    lora:       {load_base_latency_us, load_bandwidth_bytes_us, footprint_bytes_per_rank,
                 step_overhead_tiers: {rank: {k6, k7}}} (LoRA cost defaults, LORA-1.4)
    kv_offload_devices: {class: {read_bandwidth, write_bandwidth, base_latency, ...}} (device
                 classes of --kv-offload-config secondary tiers, KVO-2.4)

``total_kv_blocks`` is not a key of ``models:`` entries any more (DELTA-23) and is rejected.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import yaml

from blis_fast.config.kv_offload import KVOffloadDevice, decode_kv_offload_devices
from blis_fast.config.lora import LoRADefaults, decode_lora_defaults
from blis_fast.config.strict_yaml import (
    YamlContext,
    as_float,
    as_float_list,
    as_int,
    as_str,
    decode_struct,
    is_null,
    mapping_items,
    parse_root,
)
from blis_fast.errors import BlisInputError
from blis_fast.files import read_input_text
from blis_fast.stored import kept_beside

__all__ = [
    "COEFFICIENT_SECTIONS",
    "CROSSMODEL_SECTION",
    "TRAINED_PHYSICS_SECTION",
    "TRAINED_ROOFLINE_SECTION",
    "CoefficientSet",
    "DefaultsReadError",
    "DefaultSpec",
    "DefaultsConfig",
    "ModelCoefficients",
    "WorkloadPreset",
    "get_coefficients",
    "get_default_specs",
    "get_hf_repo",
    "load_defaults",
]


TRAINED_PHYSICS_SECTION = "trained_physics_coefficients"
CROSSMODEL_SECTION = "crossmodel_defaults"
TRAINED_ROOFLINE_SECTION = "trained_roofline_defaults"
COEFFICIENT_SECTIONS: tuple[str, ...] = (
    TRAINED_PHYSICS_SECTION,
    CROSSMODEL_SECTION,
    TRAINED_ROOFLINE_SECTION,
)
"""The top-level sections holding latency backends' global α/β, the known keys of the file
besides the fixed ones. A backend's registry entry (``config/latency_backends.py``) names its
section with one of these constants (``Coefficients(TRAINED_PHYSICS_SECTION, 7)``); a backend
with a new section adds it here first (``Coefficients`` rejects a section not listed)."""


class DefaultsReadError(BlisInputError):
    """The defaults file exists but could not be read (as opposed to parsed)."""


@dataclass(frozen=True)
class DefaultSpec:
    """One ``defaults:`` entry: deployment defaults of a model."""

    gpu: str = ""
    tensor_parallelism: int = 0
    vllm_version: str = ""
    hf_repo: str = ""


@dataclass(frozen=True)
class WorkloadPreset:
    """One ``workloads:`` preset (token counts of the synthesized distribution)."""

    prefix_tokens: int = 0
    prompt_tokens: int = 0
    prompt_tokens_stdev: int = 0
    prompt_tokens_min: int = 0
    prompt_tokens_max: int = 0
    output_tokens: int = 0
    output_tokens_stdev: int = 0
    output_tokens_min: int = 0
    output_tokens_max: int = 0


@dataclass(frozen=True)
class ModelCoefficients:
    """One ``models:`` entry: blackbox α/β for an (id, GPU, TP, vLLM version) combination."""

    id: str = ""
    gpu: str = ""
    tensor_parallelism: int = 0
    vllm_version: str = ""
    alpha_coeffs: tuple[float, ...] | None = None
    beta_coeffs: tuple[float, ...] | None = None
    best_loss: float = 0.0


@dataclass(frozen=True)
class CoefficientSet:
    """A latency backend's global α/β pair (its ``defaults.yaml`` section)."""

    alpha_coeffs: tuple[float, ...] | None = None
    beta_coeffs: tuple[float, ...] | None = None


@dataclass(frozen=True)
class DefaultsConfig:
    """The parsed content of a defaults file."""

    path: str
    defaults: dict[str, DefaultSpec] = field(default_factory=dict)
    workloads: dict[str, WorkloadPreset] = field(default_factory=dict)
    models: tuple[ModelCoefficients, ...] = ()
    coefficients: dict[str, CoefficientSet] = field(default_factory=dict)  # by section name
    version: str = ""
    lora: LoRADefaults | None = None  # the ``lora:`` block (LORA-1.4); None when absent
    # ``kv_offload_devices:`` (KVO-2.4): device class -> figures; empty when absent
    kv_offload_devices: dict[str, KVOffloadDevice] = field(default_factory=dict)


_DEFAULT_FIELDS = {
    "GPU": as_str,
    "tensor_parallelism": as_int,
    "vllm_version": as_str,
    "hf_repo": as_str,
}
_WORKLOAD_FIELDS = {name: as_int for name in WorkloadPreset.__dataclass_fields__}
_MODEL_FIELDS = {
    "GPU": as_str,
    "alpha_coeffs": as_float_list,
    "beta_coeffs": as_float_list,
    "id": as_str,
    "tensor_parallelism": as_int,
    "vllm_version": as_str,
    "best_loss": as_float,
}
_COEFF_FIELDS = {"alpha_coeffs": as_float_list, "beta_coeffs": as_float_list}


def _decode_defaults_map(ctx: YamlContext, node: yaml.Node, what: str) -> dict[str, DefaultSpec]:
    out: dict[str, DefaultSpec] = {}
    if is_null(node):
        return out
    for key, _k, vnode in mapping_items(ctx, node, what):
        v = decode_struct(ctx, vnode, f"{what}[{key}]", _DEFAULT_FIELDS)
        out[key] = DefaultSpec(
            gpu=v.get("GPU", ""),
            tensor_parallelism=v.get("tensor_parallelism", 0),
            vllm_version=v.get("vllm_version", ""),
            hf_repo=v.get("hf_repo", ""),
        )
    return out


def _decode_workloads(ctx: YamlContext, node: yaml.Node, what: str) -> dict[str, WorkloadPreset]:
    out: dict[str, WorkloadPreset] = {}
    if is_null(node):
        return out
    for key, _k, vnode in mapping_items(ctx, node, what):
        out[key] = WorkloadPreset(**decode_struct(ctx, vnode, f"{what}[{key}]", _WORKLOAD_FIELDS))
    return out


def _decode_models(ctx: YamlContext, node: yaml.Node, what: str) -> tuple[ModelCoefficients, ...]:
    if is_null(node):
        return ()
    if not isinstance(node, yaml.SequenceNode):
        raise ctx.fail(node, f"{what}: expected a list")
    out = []
    for i, item in enumerate(node.value):
        v = decode_struct(ctx, item, f"{what}[{i}]", _MODEL_FIELDS)
        out.append(
            ModelCoefficients(
                id=v.get("id", ""),
                gpu=v.get("GPU", ""),
                tensor_parallelism=v.get("tensor_parallelism", 0),
                vllm_version=v.get("vllm_version", ""),
                alpha_coeffs=v.get("alpha_coeffs"),
                beta_coeffs=v.get("beta_coeffs"),
                best_loss=v.get("best_loss", 0.0),
            )
        )
    return tuple(out)


def _decode_coeffs(ctx: YamlContext, node: yaml.Node, what: str) -> CoefficientSet | None:
    if is_null(node):
        return None
    v = decode_struct(ctx, node, what, _COEFF_FIELDS)
    return CoefficientSet(alpha_coeffs=v.get("alpha_coeffs"), beta_coeffs=v.get("beta_coeffs"))


_FIXED_FIELDS: dict[str, Callable[[YamlContext, yaml.Node, str], Any]] = {
    "models": _decode_models,
    "defaults": _decode_defaults_map,
    "version": as_str,
    "workloads": _decode_workloads,
    "lora": decode_lora_defaults,
    "kv_offload_devices": decode_kv_offload_devices,
}


_CACHE: dict[tuple[str, int, int], DefaultsConfig] = {}


def load_defaults(path: str | os.PathLike[str]) -> DefaultsConfig:
    """Parse a defaults file strictly; raise ``BlisInputError`` naming key, file and line."""
    p = os.fspath(path)
    try:
        st = os.stat(p)
        key = (os.path.abspath(p), st.st_mtime_ns, st.st_size)
        if key in _CACHE:
            return _CACHE[key]
        text = read_input_text(p)
    except (OSError, ValueError) as exc:  # ValueError: bad UTF-8, a NUL byte in the path
        raise DefaultsReadError(f"cannot read defaults file {p}: {exc}") from exc
    cfg = kept_beside(__file__, "defaults", text.encode("utf-8"), lambda: _parse(text, p),
                      DefaultsConfig, _DECODER_SOURCES)
    cfg = cfg if cfg.path == p else replace(cfg, path=p)
    _CACHE[key] = cfg
    return cfg


_DECODER_SOURCES = ("strict_yaml.py", "kv_offload.py", os.path.join(os.pardir, "gonum.py"))
"""Beside this module, the code that decides what a defaults file parses to (the strict YAML
toolkit, Go's number parsers): the stored parse (``blis_fast.stored``, 70 ms of a warm quick
start saved) is keyed by them, this module (its coefficient sections included) and the file's
content."""


def _parse(text: str, p: str) -> DefaultsConfig:
    """Decode a defaults file's text strictly."""
    fields = {**_FIXED_FIELDS, **dict.fromkeys(COEFFICIENT_SECTIONS, _decode_coeffs)}
    with parse_root(text, p, "defaults file") as (ctx, root):
        top = decode_struct(ctx, root, "defaults file", fields)
    return DefaultsConfig(
        path=p,
        defaults=top.get("defaults", {}),
        workloads=top.get("workloads", {}),
        models=top.get("models", ()),
        coefficients={s: top[s] for s in COEFFICIENT_SECTIONS if top.get(s) is not None},
        version=top.get("version", ""),
        lora=top.get("lora"),
        kv_offload_devices=top.get("kv_offload_devices", {}),
    )


def get_default_specs(cfg: DefaultsConfig, model: str) -> tuple[str, int, str]:
    """GetDefaultSpecs: (GPU, TP, vLLM version) of ``model`` from ``defaults:``, or ("", 0, "")."""
    spec = cfg.defaults.get(model)
    if spec is None:
        return "", 0, ""
    return spec.gpu, spec.tensor_parallelism, spec.vllm_version


def get_coefficients(
    cfg: DefaultsConfig, model: str, tp: int, gpu: str, vllm_version: str
) -> tuple[tuple[float, ...] | None, tuple[float, ...] | None]:
    """GetCoefficients: α, β of the first ``models:`` entry matching all four keys, else (None, None)."""
    for m in cfg.models:
        if (
            m.id == model
            and m.tensor_parallelism == tp
            and m.gpu == gpu
            and m.vllm_version == vllm_version
        ):
            return m.alpha_coeffs, m.beta_coeffs
    return None, None


def get_hf_repo(cfg: DefaultsConfig, model: str) -> str:
    """GetHFRepo: the ``hf_repo`` spelling of ``model`` ("" when absent)."""
    spec = cfg.defaults.get(model)
    return spec.hf_repo if spec is not None else ""
