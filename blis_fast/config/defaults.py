"""Strict loading of ``defaults.yaml`` and its lookups (spec ENG-10.2/10.3, DELTA-22..24).

The file is parsed node by node so that every unknown key, duplicate key or value of the wrong
type is reported with the file name and the 1-based line where it occurs (``BlisInputError``).
Known layout::

    defaults:   {model id: {GPU, tensor_parallelism, vllm_version, hf_repo}}
    workloads:  {preset: {prefix_tokens, prompt_tokens, prompt_tokens_stdev, ..., output_tokens_max}}
    models:     [{id, GPU, tensor_parallelism, vllm_version, alpha_coeffs, beta_coeffs, best_loss}]
    trained_physics_coefficients / crossmodel_defaults / trained_roofline_defaults:
                {alpha_coeffs, beta_coeffs}
    version:    string

``total_kv_blocks`` is not a key of ``models:`` entries any more (DELTA-23) and is rejected.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from blis_fast.errors import BlisInputError

__all__ = [
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
    """A global α/β pair (trained-physics, crossmodel or trained-roofline defaults)."""

    alpha_coeffs: tuple[float, ...] | None = None
    beta_coeffs: tuple[float, ...] | None = None


@dataclass(frozen=True)
class DefaultsConfig:
    """The parsed content of a defaults file."""

    path: str
    defaults: dict[str, DefaultSpec] = field(default_factory=dict)
    workloads: dict[str, WorkloadPreset] = field(default_factory=dict)
    models: tuple[ModelCoefficients, ...] = ()
    trained_physics: CoefficientSet | None = None
    crossmodel: CoefficientSet | None = None
    trained_roofline: CoefficientSet | None = None
    version: str = ""


# --------------------------------------------------------------------------------------------
# node-level strict decoding

_INT_TAG = "tag:yaml.org,2002:int"
_FLOAT_TAG = "tag:yaml.org,2002:float"
_NULL_TAG = "tag:yaml.org,2002:null"
_STR_TAG = "tag:yaml.org,2002:str"


class _Ctx:
    """Decoding context: the file name and a loader able to construct scalar values."""

    def __init__(self, path: str, loader: yaml.SafeLoader) -> None:
        self.path = path
        self.loader = loader

    def fail(self, node: yaml.Node, msg: str) -> BlisInputError:
        """Build the error for ``node`` (file and 1-based line)."""
        return BlisInputError(f"{self.path}:{node.start_mark.line + 1}: {msg}")


def _is_null(node: yaml.Node) -> bool:
    return isinstance(node, yaml.ScalarNode) and node.tag == _NULL_TAG


def _scalar(ctx: _Ctx, node: yaml.Node, what: str) -> Any:
    if not isinstance(node, yaml.ScalarNode):
        raise ctx.fail(node, f"{what}: expected a scalar value")
    return ctx.loader.construct_object(node, deep=True)


def _as_str(ctx: _Ctx, node: yaml.Node, what: str) -> str:
    if _is_null(node):
        return ""
    if not isinstance(node, yaml.ScalarNode):
        raise ctx.fail(node, f"{what}: expected a string")
    return str(node.value)


def _as_int(ctx: _Ctx, node: yaml.Node, what: str) -> int:
    if _is_null(node):
        return 0
    v = _scalar(ctx, node, what)
    if isinstance(v, bool) or node.tag not in (_INT_TAG, _FLOAT_TAG):
        raise ctx.fail(node, f"{what}: expected an integer, got {node.value!r}")
    if isinstance(v, float):
        if not v.is_integer():
            raise ctx.fail(node, f"{what}: expected an integer, got {node.value!r}")
        v = int(v)
    return int(v)


def _as_float(ctx: _Ctx, node: yaml.Node, what: str) -> float:
    if _is_null(node):
        return 0.0
    v = _scalar(ctx, node, what)
    if isinstance(v, bool) or node.tag not in (_INT_TAG, _FLOAT_TAG):
        raise ctx.fail(node, f"{what}: expected a number, got {node.value!r}")
    return float(v)


def _as_float_list(ctx: _Ctx, node: yaml.Node, what: str) -> tuple[float, ...] | None:
    if _is_null(node):
        return None
    if not isinstance(node, yaml.SequenceNode):
        raise ctx.fail(node, f"{what}: expected a list of numbers")
    return tuple(_as_float(ctx, item, f"{what}[{i}]") for i, item in enumerate(node.value))


def _mapping_items(ctx: _Ctx, node: yaml.Node, what: str) -> list[tuple[str, yaml.Node, yaml.Node]]:
    """Return ``(key, key_node, value_node)`` of a mapping, rejecting duplicate keys."""
    if not isinstance(node, yaml.MappingNode):
        raise ctx.fail(node, f"{what}: expected a mapping")
    seen: dict[str, int] = {}
    out = []
    for knode, vnode in node.value:
        if not isinstance(knode, yaml.ScalarNode):
            raise ctx.fail(knode, f"{what}: keys must be scalars")
        key = str(knode.value)
        if key in seen:
            raise ctx.fail(knode, f"{what}: key {key!r} already defined at line {seen[key]}")
        seen[key] = knode.start_mark.line + 1
        out.append((key, knode, vnode))
    return out


def _decode_struct(
    ctx: _Ctx, node: yaml.Node, what: str, fields: dict[str, Callable[[_Ctx, yaml.Node, str], Any]]
) -> dict[str, Any]:
    """Decode a mapping with a fixed key set; an unknown key is an error naming it."""
    if _is_null(node):
        return {}
    values: dict[str, Any] = {}
    for key, knode, vnode in _mapping_items(ctx, node, what):
        conv = fields.get(key)
        if conv is None:
            raise ctx.fail(
                knode, f"unknown key {key!r} in {what} (known keys: {', '.join(fields)})"
            )
        values[key] = conv(ctx, vnode, f"{what}.{key}")
    return values


_DEFAULT_FIELDS = {
    "GPU": _as_str,
    "tensor_parallelism": _as_int,
    "vllm_version": _as_str,
    "hf_repo": _as_str,
}
_WORKLOAD_FIELDS = {name: _as_int for name in WorkloadPreset.__dataclass_fields__}
_MODEL_FIELDS = {
    "GPU": _as_str,
    "alpha_coeffs": _as_float_list,
    "beta_coeffs": _as_float_list,
    "id": _as_str,
    "tensor_parallelism": _as_int,
    "vllm_version": _as_str,
    "best_loss": _as_float,
}
_COEFF_FIELDS = {"alpha_coeffs": _as_float_list, "beta_coeffs": _as_float_list}


def _decode_defaults_map(ctx: _Ctx, node: yaml.Node, what: str) -> dict[str, DefaultSpec]:
    out: dict[str, DefaultSpec] = {}
    if _is_null(node):
        return out
    for key, _k, vnode in _mapping_items(ctx, node, what):
        v = _decode_struct(ctx, vnode, f"{what}[{key}]", _DEFAULT_FIELDS)
        out[key] = DefaultSpec(
            gpu=v.get("GPU", ""),
            tensor_parallelism=v.get("tensor_parallelism", 0),
            vllm_version=v.get("vllm_version", ""),
            hf_repo=v.get("hf_repo", ""),
        )
    return out


def _decode_workloads(ctx: _Ctx, node: yaml.Node, what: str) -> dict[str, WorkloadPreset]:
    out: dict[str, WorkloadPreset] = {}
    if _is_null(node):
        return out
    for key, _k, vnode in _mapping_items(ctx, node, what):
        out[key] = WorkloadPreset(**_decode_struct(ctx, vnode, f"{what}[{key}]", _WORKLOAD_FIELDS))
    return out


def _decode_models(ctx: _Ctx, node: yaml.Node, what: str) -> tuple[ModelCoefficients, ...]:
    if _is_null(node):
        return ()
    if not isinstance(node, yaml.SequenceNode):
        raise ctx.fail(node, f"{what}: expected a list")
    out = []
    for i, item in enumerate(node.value):
        v = _decode_struct(ctx, item, f"{what}[{i}]", _MODEL_FIELDS)
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


def _decode_coeffs(ctx: _Ctx, node: yaml.Node, what: str) -> CoefficientSet | None:
    if _is_null(node):
        return None
    v = _decode_struct(ctx, node, what, _COEFF_FIELDS)
    return CoefficientSet(alpha_coeffs=v.get("alpha_coeffs"), beta_coeffs=v.get("beta_coeffs"))


_TOP_FIELDS: dict[str, Callable[[_Ctx, yaml.Node, str], Any]] = {
    "models": _decode_models,
    "defaults": _decode_defaults_map,
    "version": _as_str,
    "workloads": _decode_workloads,
    "trained_physics_coefficients": _decode_coeffs,
    "crossmodel_defaults": _decode_coeffs,
    "trained_roofline_defaults": _decode_coeffs,
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
        text = Path(p).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DefaultsReadError(f"cannot read defaults file {p}: {exc}") from exc
    loader = yaml.SafeLoader(text)
    try:
        try:
            root = loader.get_node() if loader.check_node() else None
        except yaml.YAMLError as exc:
            raise BlisInputError(f"cannot parse defaults file {p}: {exc}") from exc
        if root is None:
            raise BlisInputError(f"cannot parse defaults file {p}: the file is empty")
        ctx = _Ctx(p, loader)
        try:
            top = _decode_struct(ctx, root, "defaults file", _TOP_FIELDS)
        except yaml.YAMLError as exc:
            raise BlisInputError(f"cannot parse defaults file {p}: {exc}") from exc
    finally:
        loader.dispose()
    cfg = DefaultsConfig(
        path=p,
        defaults=top.get("defaults", {}),
        workloads=top.get("workloads", {}),
        models=top.get("models", ()),
        trained_physics=top.get("trained_physics_coefficients"),
        crossmodel=top.get("crossmodel_defaults"),
        trained_roofline=top.get("trained_roofline_defaults"),
        version=top.get("version", ""),
    )
    _CACHE[key] = cfg
    return cfg


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
