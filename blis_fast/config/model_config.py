"""Model architecture from a HuggingFace ``config.json`` (spec ENG-6.7, DELTA-18, DELTA-25).

Parsing follows the reference's semantics: the JSON is read as a generic object (every number a
float64, so integers are read by truncating that float), a nested ``text_config`` object is
copied over the top level (multimodal configs), and each field falls back to zero when absent or
of another JSON type. Quantized weight precision comes from ``quantization_config`` or, failing
that, from the model name (``w4a16`` → 0.5 byte, ``fp8`` → 1 byte).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, replace
from typing import Any

from blis_fast.errors import BlisInputError
from blis_fast.files import read_input_bytes
from blis_fast.gonum import atoi, or_none

__all__ = [
    "HFConfig",
    "ModelConfig",
    "apply_weight_precision_fallback",
    "infer_weight_bytes_from_model_name",
    "is_hf_config",
    "model_config_from_hf",
    "parse_hf_config",
    "parse_quantization_config",
]

_BITS_PER_BYTE = 8.0

_PRECISION_BYTES = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "int8": 1,
    "uint8": 1,
    "fp8": 1,
    "int4": 1,
    "nf4": 1,
}


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _go_int(v: Any) -> int:
    """Truncate a JSON number the way ``int(float64)`` does."""
    return int(float(v))


def _reject_constant(name: str) -> float:
    raise ValueError(f"invalid JSON number {name}")


def _loads(text: str | bytes) -> Any:
    return json.loads(text, parse_constant=_reject_constant)


@dataclass
class HFConfig:
    """A parsed ``config.json`` (after the ``text_config`` pivot), read with JSON typing rules."""

    raw: dict[str, Any]

    def get_int(self, key: str, default: int = 0) -> int:
        """The value of ``key`` as an int if it is a JSON number, else ``default``."""
        v = self.raw.get(key)
        return _go_int(v) if _is_number(v) else default

    def get_float(self, key: str) -> float | None:
        """The value of ``key`` as a float if it is a JSON number, else None."""
        v = self.raw.get(key)
        return float(v) if _is_number(v) else None

    def get_str(self, key: str, default: str = "") -> str:
        """The value of ``key`` if it is a JSON string, else ``default``."""
        v = self.raw.get(key)
        return v if isinstance(v, str) else default

    def get_bool(self, key: str) -> bool | None:
        """The value of ``key`` if it is a JSON boolean, else None."""
        v = self.raw.get(key)
        return v if isinstance(v, bool) else None


@dataclass(frozen=True)
class ModelConfig:
    """Architecture parameters used by the latency models and the KV-capacity calculation."""

    num_layers: int = 0
    hidden_dim: int = 0
    num_heads: int = 0
    num_kv_heads: int = 0
    vocab_size: int = 0
    bytes_per_param: float = 0.0
    intermediate_dim: int = 0
    num_local_experts: int = 0
    num_experts_per_tok: int = 0
    moe_expert_ffn_dim: int = 0
    shared_expert_ffn_dim: int = 0
    interleave_moe_layer_step: int = 0
    dense_intermediate_dim: int = 0
    hidden_act: str = ""
    weight_bytes_per_param: float = 0.0
    head_dim: int = 0  # config.json's explicit ``head_dim`` (0: hidden/heads); not every rule reads it

    def effective_weight_bytes_per_param(self) -> float:
        """Weight precision in bytes: the quantized value when set, else the compute dtype's."""
        if self.weight_bytes_per_param > 0:
            return self.weight_bytes_per_param
        return self.bytes_per_param


def parse_hf_config(path: str | os.PathLike[str]) -> HFConfig:
    """ParseHFConfig: read ``path`` and pivot a nested ``text_config`` over the top level."""
    p = os.fspath(path)
    try:
        text = read_input_bytes(p)
    except OSError as exc:
        raise BlisInputError(f"cannot read HF config {p}: {exc}") from exc
    try:
        data = _loads(text)
    except ValueError as exc:
        raise BlisInputError(f"cannot parse HF config JSON {p}: {exc}") from exc
    if not isinstance(data, dict):
        raise BlisInputError(
            f"cannot parse HF config JSON {p}: the top level must be a JSON object"
        )
    text_cfg = data.get("text_config")
    if isinstance(text_cfg, dict):
        data.update(text_cfg)
    return HFConfig(raw=data)


def is_hf_config(data: str | bytes) -> bool:
    """True when JSON text looks like a transformer config (layers or hidden size, maybe nested)."""
    try:
        m = _loads(data)
    except ValueError:
        return False
    if not isinstance(m, dict):
        return False
    if "num_hidden_layers" in m or "hidden_size" in m:
        return True
    text_cfg = m.get("text_config")
    if isinstance(text_cfg, dict):
        return "num_hidden_layers" in text_cfg or "hidden_size" in text_cfg
    return False


def parse_quantization_config(qc: dict[str, Any]) -> float:
    """Weight bytes per parameter declared by ``quantization_config`` (0 when not determinable)."""
    quant_method = qc.get("quant_method")
    if not isinstance(quant_method, str):
        quant_method = ""
    bits = 0
    raw_bits = qc.get("bits")
    if _is_number(raw_bits):
        bits = _go_int(raw_bits)
    elif isinstance(raw_bits, str):
        parsed = or_none(atoi, raw_bits)
        if parsed is not None:
            bits = parsed
    if bits > 0:
        return float(bits) / _BITS_PER_BYTE
    method = quant_method.casefold()
    if method == "fp8":
        return 1.0
    if method == "compressed-tensors":
        groups = qc.get("config_groups")
        if isinstance(groups, dict):
            for key in sorted(groups):
                group = groups[key]
                if not isinstance(group, dict):
                    continue
                weights = group.get("weights")
                if not isinstance(weights, dict):
                    continue
                nb = weights.get("num_bits")
                if _is_number(nb) and nb > 0:
                    return float(nb) / _BITS_PER_BYTE
    return 0.0


def expert_count(hf: HFConfig) -> int:
    """The routed-expert count: ``num_local_experts``, else the first of the other names the
    reference reads that is > 1 (model config and KV capacity read it alike)."""
    n = hf.get_int("num_local_experts")
    if n <= 1:
        for key in ("num_routed_experts", "n_routed_experts", "num_experts"):
            v = hf.get_int(key)
            if v > 1:
                return v
    return n


def shared_expert_ffn(hf: HFConfig, moe_ffn: int, dense_ffn: int) -> int:
    """The shared experts' FFN width: ``shared_expert_intermediate_size``, else
    ``n_shared_experts`` times the per-expert width (``moe_ffn``, else ``dense_ffn``)."""
    explicit = hf.get_int("shared_expert_intermediate_size")
    if explicit > 0:
        return explicit
    n_shared = hf.get_int("n_shared_experts")
    if n_shared > 0:
        return n_shared * (moe_ffn if moe_ffn != 0 else dense_ffn)
    return 0


def model_config_from_hf(hf: HFConfig) -> ModelConfig:
    """GetModelConfigFromHF: extract the architecture fields (missing or non-numeric → 0)."""

    def first_nonzero(*keys: str) -> int:
        for k in keys:
            v = hf.get_int(k)
            if v != 0:
                return v
        return 0

    num_heads = hf.get_int("num_attention_heads")
    num_kv_heads = first_nonzero("num_key_value_heads", "num_kv_heads", "multi_query_group_num")
    if num_kv_heads == 0:
        num_kv_heads = num_heads

    bytes_per_param = 0
    dtype = hf.raw.get("torch_dtype")
    if isinstance(dtype, str):
        bytes_per_param = _PRECISION_BYTES.get(dtype, 0)
    else:
        dtype = hf.raw.get("dtype")
        if isinstance(dtype, str):
            bytes_per_param = _PRECISION_BYTES.get(dtype, 0)

    intermediate = first_nonzero("intermediate_size", "ffn_hidden_size")

    num_experts = expert_count(hf)
    moe_ffn = hf.get_int("moe_intermediate_size")
    shared_ffn = shared_expert_ffn(hf, moe_ffn, intermediate)

    weight_bpp = 0.0
    qc = hf.raw.get("quantization_config")
    if isinstance(qc, dict):
        weight_bpp = parse_quantization_config(qc)

    return ModelConfig(
        num_layers=hf.get_int("num_hidden_layers"),
        hidden_dim=hf.get_int("hidden_size"),
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        vocab_size=hf.get_int("vocab_size"),
        bytes_per_param=float(bytes_per_param),
        intermediate_dim=intermediate,
        num_local_experts=num_experts,
        num_experts_per_tok=hf.get_int("num_experts_per_tok"),
        moe_expert_ffn_dim=moe_ffn,
        shared_expert_ffn_dim=shared_ffn,
        interleave_moe_layer_step=hf.get_int("interleave_moe_layer_step"),
        dense_intermediate_dim=hf.get_int("intermediate_size_mlp"),
        hidden_act=hf.get_str("hidden_act"),
        head_dim=hf.get_int("head_dim"),
        weight_bytes_per_param=weight_bpp,
    )


# Name conventions: a "w<X>a<Y>" token gives X weight bits, an "fp8" token gives 8 bits.
_RE_WXAY = re.compile(r"(?:^|[.\-_/])w(\d+)a\d+(?:\Z|[.\-_])", re.IGNORECASE | re.ASCII)
_RE_FP8 = re.compile(r"(?:^|[.\-_/])fp8(?:\Z|[.\-_])", re.IGNORECASE | re.ASCII)


def infer_weight_bytes_from_model_name(name: str) -> float:
    """InferWeightBytesFromModelName: weight bytes/param implied by the model name, else 0."""
    m = _RE_WXAY.search(name)
    if m is not None:
        bits = or_none(atoi, m.group(1))
        if bits is not None and bits > 0:
            return float(bits) / _BITS_PER_BYTE
    if _RE_FP8.search(name):
        return 1.0
    return 0.0


def apply_weight_precision_fallback(
    mc: ModelConfig, model: str, raw: dict[str, Any]
) -> tuple[ModelConfig, list[str], list[str]]:
    """Fill a missing weight precision from the model name; return (config, infos, warnings)."""
    infos: list[str] = []
    warnings: list[str] = []
    if mc.weight_bytes_per_param == 0:
        mc = replace(mc, weight_bytes_per_param=infer_weight_bytes_from_model_name(model))
    w = mc.weight_bytes_per_param
    if w > 0 and w != mc.bytes_per_param:
        infos.append(
            f"quantized weights: {w:.2f} bytes per parameter for weights, "
            f"{mc.bytes_per_param:.1f} for compute and KV cache"
        )
    elif w == 0:
        if "quantization_config" in raw:
            warnings.append(
                "config.json has a quantization_config whose weight precision could not be determined"
            )
        elif 0 < mc.bytes_per_param <= 1:
            warnings.append(
                f"the model stores {mc.bytes_per_param:.0f} byte(s) per parameter (possibly quantized); "
                "step-time estimates may be off for quantized models"
            )
    return mc, infos, warnings
