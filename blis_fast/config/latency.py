"""Latency-backend resolution (spec ENG-10.4 as amended by DELTA-20/22/23/25/26).

``resolve_latency(LatencyOptions) -> LatencyConfig`` turns the CLI's latency-related flags into
the backend, its coefficients, the model/hardware description, the KV-cache size and the
maximum model length, in the reference's order of checks (first failure wins):

1. lower-case the model; check the backend name; alpha/beta given together; their values
   finite and ≥ 0; coefficients without ``--latency-model`` select ``blackbox``;
   ``--gpu-memory-utilization`` in (0, 1]; ``--block-size-in-tokens`` > 0.
2. GPU, TP and vLLM version default from ``defaults:`` when the defaults file exists
   (the warnings name what was taken).
3. Analytical backends (roofline, crossmodel, trained-roofline, trained-physics): GPU and TP
   required; explicit ``roofline`` with coefficients is an error; model config folder
   (``--model-config-folder`` → ``<defaults dir>/model_configs/<name after '/'>`` → a
   HuggingFace download, which this offline port replaces by the bundled copies and otherwise
   fails as the reference does when the download fails); hardware file (``--hardware-config`` →
   beside the defaults file); global α/β from ``crossmodel_defaults`` /
   ``trained_roofline_defaults`` / ``trained_physics_coefficients`` unless given.
4. Blackbox: α/β from the first matching ``models:`` entry unless given; KV blocks
   auto-calculated when possible (failures only warn); all-zero coefficients are an error.
5. Analytical backends: parse config.json, hardware entry, weight-precision fallback, KV blocks
   (``--total-kv-blocks`` → auto-calculation → 1,000,000 with a warning), MaxModelLen from
   ``max_position_embeddings`` with rope scaling, then capped to the KV capacity.
6. ``--max-model-len`` ≥ 0.

The kernel parameters are then packed (with the checks the reference makes when it builds the
latency model). Warnings and informational messages are returned on the result, never printed.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from blis_fast.config.defaults import (
    DefaultsConfig,
    DefaultsReadError,
    get_coefficients,
    get_default_specs,
    get_hf_repo,
    load_defaults,
)
from blis_fast.config.hardware import HardwareCalib, get_hw_config
from blis_fast.config.kv_capacity import calculate_kv_blocks, extract_kv_capacity_params
from blis_fast.config.model_config import (
    ModelConfig,
    apply_weight_precision_fallback,
    is_hf_config,
    model_config_from_hf,
    parse_hf_config,
)
from blis_fast.data import data_dir, data_path
from blis_fast.errors import BlisConfigError, BlisError, BlisInputError
from blis_fast.files import read_input_bytes
from blis_fast.kernels import latency as K
from blis_fast.kernels.enums import Backend

__all__ = [
    "ANALYTICAL_BACKENDS",
    "BACKEND_CODES",
    "DEFAULT_TOTAL_KV_BLOCKS",
    "VALID_BACKENDS",
    "LatencyConfig",
    "LatencyOptions",
    "apply_rope_scaling",
    "bundled_model_config_dir",
    "pack_latency_params",
    "resolve_hardware_config",
    "resolve_latency",
    "resolve_model_config",
]

DEFAULT_TOTAL_KV_BLOCKS = 1_000_000

BACKEND_CODES = {
    "blackbox": Backend.BLACKBOX,
    "roofline": Backend.ROOFLINE,
    "": Backend.ROOFLINE,
    "crossmodel": Backend.CROSSMODEL,
    "trained-roofline": Backend.TRAINED_ROOFLINE,
    "trained-physics": Backend.TRAINED_PHYSICS,
}
VALID_BACKENDS = ("blackbox", "crossmodel", "roofline", "trained-physics", "trained-roofline")
ANALYTICAL_BACKENDS = ("roofline", "crossmodel", "trained-roofline", "trained-physics")

# (defaults.yaml section attribute, section key, minimum number of betas)
_GLOBAL_COEFFS = {
    "crossmodel": ("crossmodel", "crossmodel_defaults", 4),
    "trained-roofline": ("trained_roofline", "trained_roofline_defaults", 7),
    "trained-physics": ("trained_physics", "trained_physics_coefficients", 7),
}

_HF_BASE_URL = "https://huggingface.co"
_HF_REPO_PATTERN = re.compile(r"[a-zA-Z0-9._-]+/[a-zA-Z0-9._-]+\Z")
_MAX_INT_F = 9.223372036854775808e18  # float64(math.MaxInt) on 64-bit


def _flag(name: str) -> str:
    return name.lstrip("-").replace("_", "-")


@dataclass
class LatencyOptions:
    """The latency-related CLI flag values, plus which flags were given explicitly."""

    model: str
    latency_model: str = "roofline"
    alpha_coeffs: Sequence[float] = (0.0, 0.0, 0.0)
    beta_coeffs: Sequence[float] = (0.0, 0.0, 0.0)
    hardware: str = ""
    tp: int = 0
    vllm_version: str = ""
    total_kv_blocks: int = DEFAULT_TOTAL_KV_BLOCKS
    block_size_in_tokens: int = 16
    gpu_memory_utilization: float = 0.9
    max_model_len: int = 0
    defaults_filepath: str | None = None
    model_config_folder: str = ""
    hardware_config: str = ""
    explicit: frozenset[str] = field(default_factory=frozenset)

    def given(self, flag: str) -> bool:
        """True when ``flag`` (e.g. ``"alpha-coeffs"`` or ``"--alpha-coeffs"``) was given explicitly."""
        name = _flag(flag)
        return any(_flag(f) == name for f in self.explicit)


@dataclass
class LatencyConfig:
    """A resolved latency backend, ready for the kernels (``code``, ``alpha``, ``params``)."""

    backend: str
    code: int
    alpha: np.ndarray
    beta: np.ndarray
    params: np.ndarray
    total_kv_blocks: int
    max_model_len: int
    model: str
    gpu: str
    tp: int
    vllm_version: str
    model_config: ModelConfig | None = None
    hardware: HardwareCalib | None = None
    model_config_folder: str = ""
    hardware_config_path: str = ""
    kv_blocks_source: str = "default"
    warnings: list[str] = field(default_factory=list)
    infos: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------------------------
# model config / hardware file resolution


def bundled_model_config_dir(model: str, base_dir: str) -> str:
    """``<base_dir>/model_configs/<name after the first '/'>`` (path traversal rejected)."""
    parts = model.split("/", 1)
    short = parts[1] if len(parts) == 2 else model
    short = os.path.normpath(short) if short else "."
    if ".." in short or os.path.isabs(short):
        raise BlisConfigError(f"--model: model name {model!r} contains invalid path components")
    return os.path.join(base_dir, "model_configs", short)


def _offline_fetch(hf_repo: str, model: str, local_dir: str, infos: list[str]) -> str:
    """Stand-in for the reference's HuggingFace download (this port never uses the network).

    The bundled ``model_configs/`` copies (HF configs themselves) play the role of the remote:
    a model found there resolves; anything else fails as a failed download does.
    """
    if not _HF_REPO_PATTERN.match(hf_repo):
        raise BlisConfigError(
            f"invalid HuggingFace repo name {hf_repo!r}: expected org/model made of letters, digits, '.', '-', '_'"
        )
    bundled = bundled_model_config_dir(model, str(data_dir()))
    candidate = os.path.join(bundled, "config.json")
    if os.path.abspath(bundled) != os.path.abspath(local_dir):
        try:
            data = read_input_bytes(candidate)
        except OSError:
            data = None
        if data is not None and is_hf_config(data):
            infos.append(
                f"--latency-model: using the bundled config of {model} from {bundled} (no download)"
            )
            return bundled
    url = f"{_HF_BASE_URL}/{hf_repo}/resolve/main/config.json"
    raise BlisConfigError(f"no network access: {url} is not downloaded by blis_fast")


def resolve_model_config(
    model: str, explicit_folder: str, defaults_path: str, warnings: list[str], infos: list[str]
) -> str:
    """The folder holding the model's config.json: explicit flag, bundled copy, else error."""
    if explicit_folder:
        return explicit_folder
    base_dir = os.path.dirname(defaults_path)
    local_dir = bundled_model_config_dir(model, base_dir)
    local_path = os.path.join(local_dir, "config.json")
    try:
        data = read_input_bytes(local_path)
    except OSError:
        data = None
    if data is not None:
        if is_hf_config(data):
            infos.append(f"--latency-model: using config from {local_dir}")
            return local_dir
        warnings.append(
            f"--latency-model: {local_path} is not a HuggingFace config (no num_hidden_layers or hidden_size, "
            "at the top level or in text_config); trying HuggingFace"
        )
    defaults_err: BlisError | None = None
    hf_repo = ""
    try:
        hf_repo = get_hf_repo(load_defaults(defaults_path), model)
    except BlisInputError as exc:
        defaults_err = exc
        warnings.append(
            f"--latency-model: hf_repo of {model} unavailable ({exc}); the download may fail on case"
        )
    if not hf_repo:
        hf_repo = model
    try:
        return _offline_fetch(hf_repo, model, local_dir, infos)
    except BlisConfigError as exc:
        warnings.append(f"--latency-model: HuggingFace download for {model} failed: {exc}")
    msg = (
        f"--model-config-folder: no config.json found for model {model!r} "
        f"(looked in {local_dir} and at {_HF_BASE_URL}/{hf_repo}); give --model-config-folder explicitly"
    )
    if defaults_err is not None:
        msg += f" (reading the defaults file failed: {defaults_err})"
    raise BlisConfigError(msg)


def resolve_hardware_config(explicit_path: str, defaults_path: str) -> str:
    """The hardware file: explicit flag, else ``hardware_config.json`` beside the defaults file."""
    if explicit_path:
        return explicit_path
    bundled = os.path.join(os.path.dirname(defaults_path), "hardware_config.json")
    if os.path.exists(bundled):
        return bundled
    raise BlisConfigError(
        f"--hardware-config: no hardware config at {bundled!r}; give --hardware-config explicitly"
    )


# --------------------------------------------------------------------------------------------
# MaxModelLen


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _rope_type(rope: dict[str, Any]) -> str:
    t = rope.get("type")
    rtype = t if isinstance(t, str) else ""
    if rtype == "":
        t = rope.get("rope_type")
        rtype = t if isinstance(t, str) else ""
    return rtype


def apply_rope_scaling(max_pos: int, model_type: str, rope: Any) -> tuple[int, bool]:
    """Scale ``max_position_embeddings`` by ``rope_scaling.factor`` where the reference (and vLLM) do."""
    if max_pos <= 0 or "gemma3" in model_type or rope is None or not isinstance(rope, dict):
        return max_pos, False
    rtype = _rope_type(rope)
    if rtype in ("su", "longrope", "llama3"):
        return max_pos, False
    factor = rope.get("factor")
    if not _is_number(factor):
        return max_pos, False
    factor = float(factor)
    if factor <= 1.0 or math.isnan(factor) or math.isinf(factor):
        return max_pos, False
    base = max_pos
    if rtype == "yarn":
        orig = rope.get("original_max_position_embeddings")
        if _is_number(orig) and orig > 0:
            if float(orig) >= _MAX_INT_F:
                return max_pos, False
            base = int(float(orig))
    product = float(base) * factor
    if product >= _MAX_INT_F or product < 0:
        return max_pos, False
    return int(product), True


# --------------------------------------------------------------------------------------------
# kernel parameter packing (the checks the reference makes when it builds the latency model)


def _check_coeffs(flag: str, coeffs: Sequence[float]) -> None:
    for i, c in enumerate(coeffs):
        if math.isnan(c):
            raise BlisConfigError(f"{flag}[{i}] is NaN")
        if math.isinf(c):
            raise BlisConfigError(f"{flag}[{i}] is infinite")
        if c < 0:
            raise BlisConfigError(f"{flag}[{i}] must be non-negative, got {c}")


def _positive_finite(v: float) -> bool:
    return v > 0 and not math.isnan(v) and not math.isinf(v)


def _layer_split(mc: ModelConfig) -> tuple[int, int]:
    """(MoE layers, dense layers) for uniform or interleaved MoE (DELTA-16.1)."""
    if mc.interleave_moe_layer_step > 0 and mc.num_local_experts > 1:
        n_moe = mc.num_layers // (mc.interleave_moe_layer_step + 1)
        return n_moe, mc.num_layers - n_moe
    if mc.num_local_experts > 1:
        return mc.num_layers, 0
    return 0, mc.num_layers


def _validate_roofline(mc: ModelConfig, hc: HardwareCalib, warnings: list[str]) -> None:
    problems = []
    if mc.num_heads <= 0:
        problems.append(f"num_attention_heads must be > 0, got {mc.num_heads}")
    if mc.num_layers <= 0:
        problems.append(f"num_hidden_layers must be > 0, got {mc.num_layers}")
    if mc.hidden_dim <= 0:
        problems.append(f"hidden_size must be > 0, got {mc.hidden_dim}")
    if not _positive_finite(mc.bytes_per_param):
        problems.append(
            f"bytes per parameter (torch_dtype) must be positive, got {mc.bytes_per_param}"
        )
    for name, v in (
        ("TFlopsPeak", hc.tflops_peak),
        ("BwPeakTBs", hc.bw_peak_tbs),
        ("mfuPrefill", hc.mfu_prefill),
        ("mfuDecode", hc.mfu_decode),
    ):
        if not _positive_finite(v):
            problems.append(f"hardware {name} must be positive and finite, got {v}")
    e, k = mc.num_local_experts, mc.num_experts_per_tok
    if e < 0:
        problems.append(f"MoE: expert count must be >= 0, got {e}")
    if e > 1 and k <= 0:
        problems.append(f"MoE: {e} experts but num_experts_per_tok must be > 0")
    if k > e > 1:
        problems.append(f"MoE: num_experts_per_tok ({k}) exceeds the expert count ({e})")
    if e == 0 and k > 0:
        problems.append(f"MoE: num_experts_per_tok={k} without experts")
    if mc.moe_expert_ffn_dim < 0:
        problems.append(f"MoE: moe_intermediate_size must be >= 0, got {mc.moe_expert_ffn_dim}")
    if mc.shared_expert_ffn_dim < 0:
        problems.append(f"MoE: shared expert size must be >= 0, got {mc.shared_expert_ffn_dim}")
    if hc.memory_gib != 0 and not _positive_finite(hc.memory_gib):
        problems.append(
            f"hardware MemoryGiB must be positive and finite when set, got {hc.memory_gib}"
        )
    if hc.tflops_fp8 != 0 and not _positive_finite(hc.tflops_fp8):
        problems.append(
            f"hardware TFlopsFP8 must be positive and finite when set, got {hc.tflops_fp8}"
        )
    w = mc.weight_bytes_per_param
    if w != 0:
        if not _positive_finite(w):
            problems.append(f"weight bytes per parameter must be positive when set, got {w}")
        if w > mc.bytes_per_param:
            warnings.append(
                f"weight precision ({w:.2f} bytes) exceeds compute precision ({mc.bytes_per_param:.2f} bytes); "
                "unusual but accepted"
            )
    if problems:
        raise BlisConfigError("invalid roofline config: " + "; ".join(problems))


def _pack_roofline(mc: ModelConfig, hc: HardwareCalib, tp: int) -> np.ndarray:
    d_model = float(mc.hidden_dim)
    n_layers = float(mc.num_layers)
    n_heads = float(mc.num_heads)
    n_kv = float(mc.num_kv_heads)
    if n_kv == 0:
        n_kv = n_heads
    d_head = d_model / n_heads
    d_ff = 4.0 * d_model
    if mc.intermediate_dim > 0:
        d_ff = float(mc.intermediate_dim)
    d_ff_moe = float(mc.moe_expert_ffn_dim) if mc.moe_expert_ffn_dim > 0 else d_ff
    d_ff_dense = float(mc.dense_intermediate_dim) if mc.dense_intermediate_dim > 0 else d_ff
    n_moe, n_dense = _layer_split(mc)
    wbpp = mc.effective_weight_bytes_per_param()
    peak = hc.tflops_peak * 1e12
    if wbpp == 1.0 and hc.tflops_fp8 > 0:
        peak = hc.tflops_fp8 * 1e12
    p = np.zeros(K.RF_SIZE, dtype=np.float64)
    p[K.RF_D] = d_model
    p[K.RF_L] = n_layers
    p[K.RF_H] = n_heads
    p[K.RF_HKV] = n_kv
    p[K.RF_DHEAD] = d_head
    p[K.RF_DKV] = n_kv * d_head
    p[K.RF_DFF_MOE] = d_ff_moe
    p[K.RF_DFF_DENSE] = d_ff_dense
    p[K.RF_NMAT] = 2.0
    p[K.RF_N_MOE] = float(n_moe)
    p[K.RF_N_DENSE] = float(n_dense)
    p[K.RF_E] = float(mc.num_local_experts)
    p[K.RF_K] = float(mc.num_experts_per_tok)
    p[K.RF_BPP] = mc.bytes_per_param
    p[K.RF_WBPP] = wbpp
    p[K.RF_TP] = float(tp)
    p[K.RF_PEAK_FLOPS] = peak
    p[K.RF_PEAK_BW] = hc.bw_peak_tbs * 1e12
    p[K.RF_MFU_PREFILL] = hc.mfu_prefill
    p[K.RF_MFU_DECODE] = hc.mfu_decode
    return p


def _pack_crossmodel(beta: Sequence[float], mc: ModelConfig, tp: int) -> np.ndarray:
    if tp <= 0:
        raise BlisConfigError(f"--tp: crossmodel needs TP > 0, got {tp}")
    for name, v in (
        ("num_hidden_layers", mc.num_layers),
        ("num_attention_heads", mc.num_heads),
        ("hidden_size", mc.hidden_dim),
    ):
        if v <= 0:
            raise BlisConfigError(f"crossmodel needs {name} > 0, got {v}")
    if len(beta) < 4:
        raise BlisConfigError(f"--beta-coeffs: crossmodel needs at least 4 betas, got {len(beta)}")
    _check_coeffs("--beta-coeffs", beta)
    head_dim = float(mc.hidden_dim) / float(mc.num_heads)
    kv_heads = mc.num_kv_heads if mc.num_kv_heads != 0 else mc.num_heads
    p = np.zeros(K.CM_SIZE, dtype=np.float64)
    p[0:4] = beta[:4]
    p[K.CM_L] = float(mc.num_layers)
    p[K.CM_KV_DIM_SCALED] = (float(mc.num_layers) * float(kv_heads) * head_dim / float(tp)) * 1e-6
    p[K.CM_IS_MOE] = 1.0 if mc.num_local_experts > 0 else 0.0
    p[K.CM_IS_TP] = 1.0 if tp > 1 else 0.0
    return p


def _check_trained_arch(name: str, mc: ModelConfig, hc: HardwareCalib, tp: int) -> int:
    """Checks shared by trained-roofline / trained-physics; returns the resolved KV head count."""
    if tp <= 0:
        raise BlisConfigError(f"--tp: {name} needs TP > 0, got {tp}")
    for field_name, v in (
        ("num_hidden_layers", mc.num_layers),
        ("num_attention_heads", mc.num_heads),
        ("hidden_size", mc.hidden_dim),
        ("intermediate_size", mc.intermediate_dim),
    ):
        if v <= 0:
            raise BlisConfigError(f"{name} needs {field_name} > 0, got {v}")
    if mc.num_heads % tp != 0:
        raise BlisConfigError(
            f"--tp: {name} needs num_attention_heads ({mc.num_heads}) divisible by TP ({tp})"
        )
    kv_heads = mc.num_kv_heads if mc.num_kv_heads != 0 else mc.num_heads
    if kv_heads % tp != 0:
        raise BlisConfigError(
            f"--tp: {name} needs the KV head count ({kv_heads}) divisible by TP ({tp})"
        )
    if not _positive_finite(hc.tflops_peak):
        raise BlisConfigError(
            f"--hardware: {name} needs a positive TFlopsPeak, got {hc.tflops_peak}"
        )
    if not _positive_finite(hc.bw_peak_tbs):
        raise BlisConfigError(
            f"--hardware: {name} needs a positive BwPeakTBs, got {hc.bw_peak_tbs}"
        )
    return kv_heads


def _pack_trained_roofline(
    beta: Sequence[float], mc: ModelConfig, hc: HardwareCalib, tp: int
) -> np.ndarray:
    kv_heads = _check_trained_arch("trained-roofline", mc, hc, tp)
    if len(beta) < 7:
        raise BlisConfigError(
            f"--beta-coeffs: trained-roofline needs at least 7 betas, got {len(beta)}"
        )
    _check_coeffs("--beta-coeffs", beta)
    head_dim = mc.hidden_dim // mc.num_heads
    p = np.zeros(K.TR_SIZE, dtype=np.float64)
    p[0:7] = beta[:7]
    p[K.TR_L] = float(mc.num_layers)
    p[K.TR_D] = float(mc.hidden_dim)
    p[K.TR_DKV] = float(kv_heads * head_dim)
    p[K.TR_DH] = float(head_dim)
    p[K.TR_DFF] = float(mc.intermediate_dim)
    p[K.TR_TP] = float(tp)
    p[K.TR_KEFF] = float(max(1, mc.num_experts_per_tok))
    p[K.TR_HPG] = float(mc.num_heads) / float(tp)
    p[K.TR_IS_MOE] = 1.0 if mc.num_local_experts > 0 else 0.0
    p[K.TR_E] = float(mc.num_local_experts)
    p[K.TR_FLOPS_US] = hc.tflops_peak * 1e6
    p[K.TR_BW_US] = hc.bw_peak_tbs * 1e6
    return p


def _pack_trained_physics(
    alpha: Sequence[float], beta: Sequence[float], mc: ModelConfig, hc: HardwareCalib, tp: int
) -> np.ndarray:
    if len(beta) < 7:
        raise BlisConfigError(
            f"--beta-coeffs: trained-physics needs at least 7 betas, got {len(beta)}"
        )
    kv_heads = _check_trained_arch("trained-physics", mc, hc, tp)
    if mc.num_local_experts > 1 and mc.num_experts_per_tok <= 0:
        raise BlisConfigError(
            f"trained-physics: {mc.num_local_experts} experts but num_experts_per_tok must be > 0"
        )
    _check_coeffs("--alpha-coeffs", alpha)
    _check_coeffs("--beta-coeffs", beta)
    head_dim = mc.hidden_dim // mc.num_heads
    n_moe, n_dense = _layer_split(mc)
    d_ff = mc.intermediate_dim
    d_ff_moe = mc.moe_expert_ffn_dim if mc.moe_expert_ffn_dim > 0 else d_ff
    d_ff_dense = mc.dense_intermediate_dim if mc.dense_intermediate_dim > 0 else d_ff
    wbpp = mc.effective_weight_bytes_per_param()
    peak = hc.tflops_peak * 1e6
    if wbpp == 1.0 and hc.tflops_fp8 > 0:
        peak = hc.tflops_fp8 * 1e6
    p = np.zeros(K.TP_SIZE, dtype=np.float64)
    nb = min(10, len(beta))
    p[0:nb] = beta[:nb]
    p[K.TP_PREFILL_SPLIT] = 1.0 if len(beta) >= 9 else 0.0
    p[K.TP_DECODE_SPLIT] = 1.0 if len(beta) >= 10 else 0.0
    p[K.TP_L] = float(mc.num_layers)
    p[K.TP_D] = float(mc.hidden_dim)
    p[K.TP_DKV] = float(kv_heads * head_dim)
    p[K.TP_DH] = float(head_dim)
    p[K.TP_TP] = float(tp)
    p[K.TP_KEFF] = float(max(1, mc.num_experts_per_tok))
    p[K.TP_HPG] = float(mc.num_heads) / float(tp)
    p[K.TP_IS_MOE] = 1.0 if mc.num_local_experts > 1 else 0.0
    p[K.TP_E] = float(mc.num_local_experts)
    p[K.TP_N_MOE] = float(n_moe)
    p[K.TP_N_DENSE] = float(n_dense)
    p[K.TP_DFF_MOE] = float(d_ff_moe)
    p[K.TP_DFF_DENSE] = float(d_ff_dense)
    interleaved = mc.interleave_moe_layer_step > 0 and mc.num_local_experts > 1
    p[K.TP_MOE_SCALING] = 1.0 if interleaved else 0.0
    p[K.TP_WBPP] = wbpp
    p[K.TP_FLOPS_US] = peak
    p[K.TP_BW_US] = hc.bw_peak_tbs * 1e6
    p[K.TP_TP_FACTOR] = float(tp - 1) / float(tp)
    p[K.TP_AR_UNITS] = float(2 * n_dense + n_moe)
    return p


def pack_latency_params(
    backend: str,
    alpha: Sequence[float],
    beta: Sequence[float],
    model_config: ModelConfig | None,
    hardware: HardwareCalib | None,
    tp: int,
    warnings: list[str] | None = None,
) -> tuple[int, np.ndarray, np.ndarray]:
    """Validate as the reference's latency-model constructor does; return (code, alpha[3], params)."""
    if backend not in BACKEND_CODES:
        raise BlisConfigError(
            f"--latency-model: unknown backend {backend!r}; valid: {', '.join(VALID_BACKENDS)}"
        )
    warns = warnings if warnings is not None else []
    code = BACKEND_CODES[backend]
    alpha = [float(a) for a in alpha]
    beta = [float(b) for b in beta]
    if len(alpha) < 3:
        raise BlisConfigError(
            f"--alpha-coeffs: at least 3 alpha coefficients are needed, got {len(alpha)}"
        )
    _check_coeffs("--alpha-coeffs", alpha)
    mc = model_config if model_config is not None else ModelConfig()
    hc = hardware if hardware is not None else HardwareCalib()
    if code == Backend.ROOFLINE:
        if tp <= 0:
            raise BlisConfigError(f"--tp: roofline needs TP > 0, got {tp}")
        _validate_roofline(mc, hc, warns)
        params = _pack_roofline(mc, hc, tp)
    elif code == Backend.TRAINED_PHYSICS:
        params = _pack_trained_physics(alpha, beta, mc, hc, tp)
    elif code == Backend.BLACKBOX:
        warns.append(
            'the "blackbox" latency model is deprecated (the reference drops it); '
            "consider --latency-model trained-physics"
        )
        if len(beta) < 3:
            raise BlisConfigError(
                f"--beta-coeffs: blackbox needs at least 3 betas, got {len(beta)}"
            )
        _check_coeffs("--beta-coeffs", beta)
        params = np.array(beta[:3], dtype=np.float64)
    elif code == Backend.CROSSMODEL:
        params = _pack_crossmodel(beta, mc, tp)
    else:
        params = _pack_trained_roofline(beta, mc, hc, tp)
    return code, np.array(alpha[:3], dtype=np.float64), params


# --------------------------------------------------------------------------------------------
# resolution


def _all_zeros(values: Sequence[float] | None) -> bool:
    return not values or all(v == 0 for v in values)


def _check_flag_coeffs(flag: str, coeffs: Sequence[float]) -> None:
    for i, c in enumerate(coeffs):
        if math.isnan(c) or math.isinf(c) or c < 0:
            raise BlisConfigError(f"{flag}[{i}] must be a finite non-negative number, got {c}")


def _try_blackbox_kv_blocks(
    model: str,
    folder: str,
    defaults_path: str,
    hw_path: str,
    gpu: str,
    tp: int,
    block_size: int,
    util: float,
    current: int,
    warnings: list[str],
    infos: list[str],
) -> int | None:
    """Best-effort KV auto-calculation for blackbox; every failure is a warning (DELTA-23.4)."""

    def fail(why: str) -> None:
        warnings.append(f"--latency-model blackbox: {why}; using total-kv-blocks={current}")

    try:
        resolved = resolve_model_config(model, folder, defaults_path, warnings, infos)
    except BlisConfigError as exc:
        fail(f"no model config for the KV auto-calculation ({exc})")
        return None
    hf_path = os.path.join(resolved, "config.json")
    try:
        hf = parse_hf_config(hf_path)
    except BlisError as exc:
        fail(f"cannot parse {hf_path} ({exc})")
        return None
    mc, more_infos, more_warnings = apply_weight_precision_fallback(
        model_config_from_hf(hf), model, hf.raw
    )
    infos.extend(more_infos)
    warnings.extend(more_warnings)
    try:
        resolved_hw = resolve_hardware_config(hw_path, defaults_path)
    except BlisConfigError as exc:
        fail(f"no hardware config ({exc})")
        return None
    try:
        hc = get_hw_config(resolved_hw, gpu)
    except BlisError as exc:
        fail(f"cannot load the hardware config ({exc})")
        return None
    if hc.memory_gib <= 0:
        fail("the hardware config gives no GPU memory")
        return None
    try:
        params = extract_kv_capacity_params(hf)
        return calculate_kv_blocks(mc, hc, tp, block_size, util, params)
    except BlisConfigError as exc:
        fail(f"KV capacity auto-calculation failed ({exc})")
        return None


def resolve_latency(opts: LatencyOptions) -> LatencyConfig:
    """Resolve backend, coefficients, model/hardware, KV blocks and MaxModelLen from the flags."""
    warnings: list[str] = []
    infos: list[str] = []
    alpha: list[float] = [float(a) for a in opts.alpha_coeffs]
    beta: list[float] = [float(b) for b in opts.beta_coeffs]
    model = opts.model.lower()

    if opts.latency_model not in BACKEND_CODES:
        raise BlisConfigError(
            f"--latency-model: unknown backend {opts.latency_model!r}; valid options: {', '.join(VALID_BACKENDS)}"
        )
    # the reference lets "" through its name check and then resolves nothing (CLU OPEN-4);
    # blis_fast reads it as the default backend
    backend = opts.latency_model or "roofline"
    alpha_given = opts.given("alpha-coeffs")
    beta_given = opts.given("beta-coeffs")
    if alpha_given != beta_given:
        if alpha_given:
            raise BlisConfigError(
                "--alpha-coeffs requires --beta-coeffs (the two coefficient sets go together)"
            )
        raise BlisConfigError(
            "--beta-coeffs requires --alpha-coeffs (the two coefficient sets go together)"
        )
    _check_flag_coeffs("--alpha-coeffs", alpha)
    _check_flag_coeffs("--beta-coeffs", beta)
    if not opts.given("latency-model") and alpha_given and beta_given:
        backend = "blackbox"
        infos.append("--alpha-coeffs and --beta-coeffs given: using the blackbox latency model")

    u = opts.gpu_memory_utilization
    if u <= 0 or u > 1.0 or math.isnan(u) or math.isinf(u):
        raise BlisConfigError(
            f"--gpu-memory-utilization must be a finite value in (0, 1.0], got {u:f}"
        )
    block_size = opts.block_size_in_tokens
    if block_size <= 0:
        raise BlisConfigError(f"--block-size-in-tokens must be > 0, got {block_size}")

    defaults_path = (
        opts.defaults_filepath if opts.defaults_filepath else str(data_path("defaults.yaml"))
    )
    gpu, tp, vllm_version = opts.hardware, opts.tp, opts.vllm_version
    total_kv_blocks = opts.total_kv_blocks
    kv_source = "flag" if opts.given("total-kv-blocks") else "default"
    max_model_len = opts.max_model_len
    defaults_exists = os.path.exists(defaults_path)
    if not defaults_exists and opts.defaults_filepath is not None and opts.given(
            "defaults-filepath"):
        raise BlisInputError(f"--defaults-filepath: {defaults_path} does not exist")

    if defaults_exists:
        cfg = load_defaults(defaults_path)
        d_gpu, d_tp, d_version = get_default_specs(cfg, model)
        if tp == 0 and d_tp > 0:
            warnings.append(f"Finding default values of TP for model={model}")
            warnings.append(f"Using default tp={d_tp}")
            tp = d_tp
        if gpu == "" and d_gpu:
            warnings.append(f"Finding default values of hardware for model={model}")
            warnings.append(f"Using default GPU={d_gpu}")
            gpu = d_gpu
        if vllm_version == "" and d_version:
            warnings.append(f"Finding default values of vLLM version for model={model}")
            warnings.append(f"Using default vLLM version={d_version}")
            vllm_version = d_version

    folder = opts.model_config_folder
    hw_path = opts.hardware_config

    if backend in ANALYTICAL_BACKENDS:
        missing = []
        if gpu == "":
            missing.append("--hardware (GPU type)")
        if tp <= 0:
            missing.append("--tp (tensor parallelism)")
        if missing:
            hint = (
                " or use --latency-model blackbox with trained coefficients"
                if backend == "roofline"
                else ""
            )
            raise BlisConfigError(
                f"--latency-model {backend} needs {' and '.join(missing)}; defaults.yaml has no defaults "
                f"for model={model}: give the flags explicitly{hint}"
            )
        if backend == "roofline" and opts.given("latency-model") and beta_given:
            raise BlisConfigError(
                "--alpha-coeffs/--beta-coeffs cannot be combined with --latency-model roofline "
                "(roofline derives step times analytically; use --latency-model blackbox for coefficients)"
            )
        if backend == "roofline":
            if folder:
                infos.append("--latency-model: the explicit --model-config-folder is used")
            if hw_path:
                infos.append("--latency-model: the explicit --hardware-config is used")
        folder = resolve_model_config(model, folder, defaults_path, warnings, infos)
        hw_path = resolve_hardware_config(hw_path, defaults_path)
        if backend in _GLOBAL_COEFFS:
            attr, section, min_betas = _GLOBAL_COEFFS[backend]
            if defaults_exists:
                try:
                    gcfg: DefaultsConfig | None = load_defaults(defaults_path)
                except DefaultsReadError as exc:
                    warnings.append(f"--latency-model {backend}: {exc}")
                    gcfg = None
                coeffs = getattr(gcfg, attr) if gcfg is not None else None
                if coeffs is not None:
                    if not beta_given:
                        beta = list(coeffs.beta_coeffs or ())
                        infos.append(f"--latency-model: {backend} betas from {section}")
                    if not alpha_given:
                        alpha = list(coeffs.alpha_coeffs or ())
                        infos.append(f"--latency-model: {backend} alphas from {section}")
            if not beta_given and (len(beta) < min_betas or _all_zeros(beta)):
                raise BlisConfigError(
                    f"--beta-coeffs: --latency-model {backend} found no {section} in {defaults_path}; "
                    f"add that section or give --beta-coeffs (at least {min_betas} values)"
                )
            if backend != "crossmodel" and _all_zeros(alpha) and not alpha_given:
                warnings.append(
                    f"--latency-model {backend}: no alpha coefficients; queueing, post-decode and per-token "
                    "overheads are zero (TTFT/E2E may be underestimated)"
                )

    if backend == "blackbox":
        if not alpha_given and not beta_given:
            try:
                bcfg = load_defaults(defaults_path)
            except DefaultsReadError as exc:
                raise BlisInputError(f"--defaults-filepath: {exc}") from exc
            a, b = get_coefficients(bcfg, model, tp, gpu, vllm_version)
            alpha = list(a) if a is not None else []
            beta = list(b) if b is not None else []
        if not opts.given("total-kv-blocks"):
            blocks = _try_blackbox_kv_blocks(
                model,
                folder,
                defaults_path,
                hw_path,
                gpu,
                tp,
                block_size,
                u,
                total_kv_blocks,
                warnings,
                infos,
            )
            if blocks is not None:
                total_kv_blocks = blocks
                kv_source = "auto"
                infos.append(f"--latency-model blackbox: auto-calculated total-kv-blocks={blocks}")
        if _all_zeros(alpha) and _all_zeros(beta):
            raise BlisConfigError(
                f"--alpha-coeffs/--beta-coeffs: no trained blackbox coefficients for model={model}, GPU={gpu}, "
                f"TP={tp}; give --alpha-coeffs/--beta-coeffs or use --latency-model roofline, trained-physics, "
                "crossmodel or trained-roofline"
            )

    model_config: ModelConfig | None = None
    hardware: HardwareCalib | None = None
    if backend in ANALYTICAL_BACKENDS:
        hf_path = os.path.join(folder, "config.json")
        hf = parse_hf_config(hf_path)
        model_config = model_config_from_hf(hf)
        hardware = get_hw_config(hw_path, gpu)
        model_config, more_infos, more_warnings = apply_weight_precision_fallback(
            model_config, model, hf.raw
        )
        infos.extend(more_infos)
        warnings.extend(more_warnings)
        if backend == "trained-roofline" and model_config.weight_bytes_per_param > 0:
            warnings.append(
                "trained-roofline charges 2-byte weights (as in its training data); the quantized precision "
                f"({model_config.weight_bytes_per_param:.2f} bytes/param) only changes the KV capacity"
            )
        if backend == "roofline" and model_config.num_local_experts > 1:
            infos.append(
                f"--latency-model: MoE model ({model_config.num_local_experts} experts, "
                f"top-{model_config.num_experts_per_tok}); expert dispatch overhead is not modelled"
            )

        if not opts.given("total-kv-blocks"):
            try:
                kv_params = extract_kv_capacity_params(hf)
            except BlisConfigError as exc:
                warnings.append(
                    f"--latency-model: no KV capacity parameters ({exc}); using total-kv-blocks={total_kv_blocks} "
                    "(set --total-kv-blocks to override)"
                )
            else:
                if hardware.memory_gib <= 0:
                    warnings.append(
                        f"--latency-model: the hardware config gives no GPU memory; using "
                        f"total-kv-blocks={total_kv_blocks} (add MemoryGiB or set --total-kv-blocks)"
                    )
                else:
                    if kv_params.hidden_act == "":
                        infos.append(
                            "--latency-model: no hidden_act in config.json; assuming a SwiGLU MLP"
                        )
                    try:
                        blocks = calculate_kv_blocks(
                            model_config, hardware, tp, block_size, u, kv_params
                        )
                    except BlisConfigError as exc:
                        warnings.append(
                            f"--latency-model: KV capacity auto-calculation failed ({exc}); using "
                            f"total-kv-blocks={total_kv_blocks} (set --total-kv-blocks to override)"
                        )
                    else:
                        total_kv_blocks = blocks
                        kv_source = "auto"
                        infos.append(
                            f"--latency-model: auto-calculated total-kv-blocks={blocks} (GPU={hardware.memory_gib:.0f} "
                            f"GiB, TP={tp}, block_size={block_size}, MoE={kv_params.is_moe}, "
                            f"gpu-memory-utilization={u:.2f})"
                        )

        if not opts.given("max-model-len"):
            max_pos = hf.get_int("max_position_embeddings", 0)
            if max_pos > 0:
                max_model_len = max_pos
                model_type = hf.get_str("model_type")
                rope = hf.raw.get("rope_scaling")
                scaled, applied = apply_rope_scaling(max_pos, model_type, rope)
                if applied:
                    assert isinstance(rope, dict)
                    factor = rope.get("factor")
                    infos.append(
                        f"--latency-model: {_rope_type(rope)} rope_scaling factor {float(factor):.1f}: "
                        f"max-model-len {max_pos} -> {scaled}"
                    )
                    max_model_len = scaled
                elif "gemma3" in model_type:
                    infos.append(
                        "--latency-model: gemma3 max_position_embeddings is already scaled"
                    )
                elif rope is not None:
                    if isinstance(rope, dict):
                        if "factor" in rope:
                            warnings.append(
                                "--latency-model: rope_scaling.factor not applied (excluded rope type, invalid "
                                "factor or overflow); max_position_embeddings used as is"
                            )
                    else:
                        warnings.append(
                            "--latency-model: rope_scaling is not a JSON object; ignored"
                        )
                infos.append(
                    f"--latency-model: max-model-len={max_model_len} from max_position_embeddings"
                )

        if max_model_len > 0:
            blocks_needed = max_model_len // block_size
            if max_model_len % block_size != 0:
                blocks_needed += 1
            if blocks_needed > total_kv_blocks:
                capped = total_kv_blocks * block_size
                warnings.append(
                    f"--latency-model: max-model-len {max_model_len} exceeds the KV capacity ({total_kv_blocks} "
                    f"blocks x {block_size} tokens); capped to {capped} tokens"
                )
                max_model_len = capped

    if max_model_len < 0:
        raise BlisConfigError(f"--max-model-len must be >= 0, got {max_model_len}")

    code, alpha_arr, params = pack_latency_params(
        backend, alpha, beta, model_config, hardware, tp, warnings
    )
    return LatencyConfig(
        backend=backend,
        code=code,
        alpha=alpha_arr,
        beta=np.array(beta, dtype=np.float64),
        params=params,
        total_kv_blocks=int(total_kv_blocks),
        max_model_len=int(max_model_len),
        model=model,
        gpu=gpu,
        tp=tp,
        vllm_version=vllm_version,
        model_config=model_config,
        hardware=hardware,
        model_config_folder=folder if backend in ANALYTICAL_BACKENDS else "",
        hardware_config_path=hw_path if backend in ANALYTICAL_BACKENDS else "",
        kv_blocks_source=kv_source,
        warnings=warnings,
        infos=infos,
    )
