"""GPU profiles for the ``profiled`` latency backend: a small versioned JSON per GPU.

A profile holds the GPU's peaks (dense BF16 and FP8 FLOP/s, memory bandwidth), the efficiencies
its GEMMs, attention and elementwise kernels reach, fixed per-layer and per-step costs, and the
interconnect of tensor parallelism. Bundled ones live in ``gpu_profiles/`` (one file per GPU name
of ``hardware_config.json``); ``--gpu-profile FILE`` uses a user's own (``blis profile`` writes
one). Every figure is checked on load: one clear error names the file and the key.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from blis_fast.config.hardware import HardwareCalib
from blis_fast.config.kv_capacity import SWIGLU_FAMILY
from blis_fast.config.model_config import ModelConfig
from blis_fast.data import data_path
from blis_fast.errors import BlisConfigError, BlisInputError
from blis_fast.files import read_input_text
from blis_fast.kernels.engine import latency_profiled as PF

__all__ = ["FORMAT", "VERSION", "GpuProfile", "bundled_profile", "bundled_profile_names",
           "hardware_from_profile", "load_gpu_profile", "pack_profile_params", "pack_profiled",
           "profile_from_dict", "require_profile", "with_floor"]

FORMAT = "blis-gpu-profile"
VERSION = 1

# (section, key, the kernel slot, lower bound, upper bound or None); bounds are inclusive except
# that a lower bound of 0 on an efficiency is exclusive (an efficiency of 0 would divide by 0)
_FIELDS: tuple[tuple[str, str, int, float, float | None, bool], ...] = (
    # section, key, slot, low, high, low exclusive
    ("peaks", "tflops_bf16", PF.PF_PEAK_FLOPS, 0.0, None, True),
    ("peaks", "bandwidth_tbs", PF.PF_PEAK_BW, 0.0, None, True),
    ("gemm", "compute_efficiency", PF.PF_G_COMPUTE, 0.0, 1.0, True),
    ("gemm", "half_efficiency_tokens", PF.PF_G_HALF_M, 0.0, None, False),
    ("gemm", "memory_efficiency", PF.PF_G_MEMORY, 0.0, 1.0, True),
    ("gemm", "overlap_exponent", PF.PF_G_OVERLAP, 1.0, None, False),
    ("gemm", "launch_us", PF.PF_G_LAUNCH_US, 0.0, None, False),
    ("attention", "prefill_compute_efficiency", PF.PF_A_PREFILL_COMPUTE, 0.0, 1.0, True),
    ("attention", "cached_prefill_bytes_per_score", PF.PF_A_CACHED_SCORE_BYTES, 0.0, None, False),
    ("attention", "decode_memory_efficiency", PF.PF_A_DECODE_MEMORY, 0.0, 1.0, True),
    ("attention", "decode_bytes_per_score", PF.PF_A_DECODE_SCORE_BYTES, 0.0, None, False),
    ("elementwise", "memory_efficiency", PF.PF_E_MEMORY, 0.0, 1.0, True),
    ("elementwise", "bytes_per_hidden", PF.PF_E_HIDDEN, 0.0, None, False),
    ("elementwise", "bytes_per_qkv", PF.PF_E_QKV, 0.0, None, False),
    ("elementwise", "bytes_per_ffn", PF.PF_E_FFN, 0.0, None, False),
    ("elementwise", "prefill_kv_copy_bytes", PF.PF_E_KV_COPY, 0.0, None, False),
    ("elementwise", "cached_prefill_concat_bytes", PF.PF_E_KV_CONCAT, 0.0, None, False),
    ("fixed_us", "per_layer", PF.PF_FIX_LAYER_US, 0.0, None, False),
    ("fixed_us", "per_step", PF.PF_FIX_STEP_US, 0.0, None, False),
    ("interconnect", "allreduce_bandwidth_gbs", PF.PF_AR_BW, 0.0, None, True),
    ("interconnect", "allreduce_latency_us", PF.PF_AR_LATENCY_US, 0.0, None, False),
)
_OPTIONAL = {("peaks", "tflops_fp8"), ("peaks", "memory_gib")}
_SECTIONS = ("peaks", "gemm", "attention", "elementwise", "fixed_us", "interconnect")
_TOP = {"format", "version", "gpu", "aliases", "description", "sources", *_SECTIONS}


@dataclass(frozen=True)
class GpuProfile:
    """One GPU profile: its name, where it came from and its figures by (section, key)."""

    gpu: str
    source: str  # the file it was read from, or "bundled:<file>"
    figures: dict[tuple[str, str], float]
    aliases: tuple[str, ...] = ()  # other names of the same GPU in hardware_config.json
    description: str = ""

    def figure(self, section: str, key: str) -> float:
        """A figure of the profile (0.0 for an optional figure it does not give)."""
        return self.figures.get((section, key), 0.0)

    def to_dict(self) -> dict[str, Any]:
        """The profile as its JSON object (what ``blis profile`` writes)."""
        out: dict[str, Any] = {"format": FORMAT, "version": VERSION, "gpu": self.gpu,
                               "aliases": list(self.aliases), "description": self.description}
        for (section, key), value in self.figures.items():
            out.setdefault(section, {})[key] = value
        return out


def _number(where: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BlisInputError(f"{where} must be a number, got {value!r}")
    v = float(value)
    if math.isnan(v) or math.isinf(v):
        raise BlisInputError(f"{where} must be finite, got {value!r}")
    return v


def profile_from_dict(data: object, source: str) -> GpuProfile:
    """Check a profile's JSON object and return it; any problem raises one line naming ``source``
    and the key."""
    if not isinstance(data, dict):
        raise BlisInputError(f"GPU profile {source}: the top level must be a JSON object")
    if data.get("format") != FORMAT:
        raise BlisInputError(f"GPU profile {source}: \"format\" must be {FORMAT!r}, "
                             f"got {data.get('format')!r}")
    version = data.get("version")
    if version != VERSION or isinstance(version, bool):
        raise BlisInputError(f"GPU profile {source}: \"version\" must be {VERSION} (this blis_fast "
                             f"reads version {VERSION}), got {version!r}")
    unknown = sorted(set(data) - _TOP)
    if unknown:
        raise BlisInputError(f"GPU profile {source}: unknown key {unknown[0]!r}")
    gpu = data.get("gpu")
    if not isinstance(gpu, str) or not gpu:
        raise BlisInputError(f"GPU profile {source}: \"gpu\" must be a non-empty string")
    aliases = data.get("aliases", [])
    if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
        raise BlisInputError(f"GPU profile {source}: \"aliases\" must be a list of strings")
    figures: dict[tuple[str, str], float] = {}
    known = {(s, k) for s, k, *_ in _FIELDS} | _OPTIONAL
    for section in _SECTIONS:
        block = data.get(section)
        if not isinstance(block, dict):
            raise BlisInputError(f"GPU profile {source}: \"{section}\" must be a JSON object")
        for key in block:
            if (section, key) not in known:
                raise BlisInputError(f"GPU profile {source}: unknown key {section}.{key}")
    for section, key, _slot, low, high, low_open in _FIELDS:
        block = data[section]
        if key not in block:
            raise BlisInputError(f"GPU profile {source}: {section}.{key} is missing")
        v = _number(f"GPU profile {source}: {section}.{key}", block[key])
        if v < low or (low_open and v == low) or (high is not None and v > high):
            bound = (f"> {low:g}" if low_open else f">= {low:g}") + (
                f" and <= {high:g}" if high is not None else "")
            raise BlisInputError(f"GPU profile {source}: {section}.{key} must be {bound}, got {v!r}")
        figures[(section, key)] = v
    for section, key in sorted(_OPTIONAL):
        if key in data[section]:
            v = _number(f"GPU profile {source}: {section}.{key}", data[section][key])
            if v < 0:
                raise BlisInputError(f"GPU profile {source}: {section}.{key} must be >= 0, got {v!r}")
            figures[(section, key)] = v
    description = data.get("description", "")
    return GpuProfile(gpu=gpu, source=source, figures=figures, aliases=tuple(aliases),
                      description=description if isinstance(description, str) else "")


def load_gpu_profile(path: str | os.PathLike[str]) -> GpuProfile:
    """Read and check a GPU profile file (``--gpu-profile``)."""
    p = os.fspath(path)
    try:
        text = read_input_text(p)
    except (OSError, UnicodeDecodeError) as exc:
        raise BlisInputError(f"--gpu-profile: cannot read {p}: {exc}") from exc
    try:
        data = json.loads(text, parse_constant=_reject_constant)
    except ValueError as exc:
        raise BlisInputError(f"--gpu-profile: cannot parse {p}: {exc}") from exc
    return profile_from_dict(data, p)


def _reject_constant(name: str) -> float:
    raise ValueError(f"invalid JSON number {name}")


def _bundled_dir() -> Path:
    return data_path("gpu_profiles")


def bundled_profile_names() -> list[str]:
    """The GPU names with a bundled profile."""
    names = []
    for f in sorted(_bundled_dir().glob("*.json")):
        names.append(json.loads(f.read_text())["gpu"])
    return names


def bundled_profile(gpu: str) -> GpuProfile | None:
    """The bundled profile of the GPU named ``gpu`` in hardware_config.json, or None."""
    for f in sorted(_bundled_dir().glob("*.json")):
        profile = profile_from_dict(json.loads(f.read_text()), f"bundled:{f.name}")
        if gpu == profile.gpu or gpu in profile.aliases:
            return profile
    return None


def _per_gpu(count: float, tp: int) -> float:
    """A count split over ``tp`` GPUs (at least one per GPU: replicated KV heads)."""
    return max(1.0, count / tp)


def hardware_from_profile(profile: GpuProfile, path: str = "") -> HardwareCalib:
    """The hardware entry of a GPU known only from its profile (peaks and memory; the
    reference's MFU figures, which only roofline reads, stay 0)."""
    return HardwareCalib(tflops_peak=profile.figure("peaks", "tflops_bf16"),
                         tflops_fp8=profile.figure("peaks", "tflops_fp8"),
                         bw_peak_tbs=profile.figure("peaks", "bandwidth_tbs"),
                         memory_gib=profile.figure("peaks", "memory_gib"),
                         gpu=profile.gpu, profile_path=path)


def require_profile(hc: HardwareCalib) -> GpuProfile:
    """The profile of a resolved GPU: its ``--gpu-profile`` file, else the bundled one by name;
    none is an error naming the flag."""
    profile = load_gpu_profile(hc.profile_path) if hc.profile_path else bundled_profile(hc.gpu)
    if profile is None:
        raise BlisConfigError(
            f"--gpu-profile: no GPU profile for GPU {hc.gpu!r} (bundled: "
            f"{', '.join(bundled_profile_names())}); give --gpu-profile FILE (blis profile writes "
            "one) or a --hardware with a bundled profile")
    return profile


def pack_profiled(mc: ModelConfig, hc: HardwareCalib, tp: int,
                  layer_split: tuple[int, int]) -> np.ndarray:
    """The ``profiled`` kernel's params for a model on a resolved GPU (its profile found by
    :func:`require_profile`)."""
    return pack_profile_params(mc, require_profile(hc), tp, layer_split)


def pack_profile_params(mc: ModelConfig, profile: GpuProfile, tp: int,
                        layer_split: tuple[int, int]) -> np.ndarray:
    """The ``profiled`` kernel's params for a model on a profiled GPU (the layout in
    ``kernels/engine/latency_profiled.py``)."""
    if tp <= 0:
        raise BlisConfigError(f"--tp: profiled needs TP > 0, got {tp}")
    problems = []
    for name, v in (("num_hidden_layers", mc.num_layers), ("hidden_size", mc.hidden_dim),
                    ("num_attention_heads", mc.num_heads), ("vocab_size", mc.vocab_size)):
        if v <= 0:
            problems.append(f"{name} must be > 0, got {v}")
    if mc.intermediate_dim <= 0 and mc.num_local_experts <= 1:
        problems.append(f"intermediate_size must be > 0, got {mc.intermediate_dim}")
    if mc.num_local_experts > 1 and not 0 < mc.num_experts_per_tok <= mc.num_local_experts:
        problems.append(f"MoE: num_experts_per_tok must be in 1..{mc.num_local_experts}, "
                        f"got {mc.num_experts_per_tok}")
    if problems:
        raise BlisConfigError("--latency-model profiled: model config: " + "; ".join(problems))
    p = np.zeros(PF.PF_SIZE, dtype=np.float64)
    head_dim = mc.head_dim if mc.head_dim > 0 else mc.hidden_dim / mc.num_heads
    n_moe, n_dense = layer_split
    dense_ffn = mc.dense_intermediate_dim if (n_moe and mc.dense_intermediate_dim) else mc.intermediate_dim
    moe_ffn = mc.moe_expert_ffn_dim if mc.moe_expert_ffn_dim > 0 else mc.intermediate_dim
    wbytes = mc.effective_weight_bytes_per_param() or 2.0
    kv_bytes = mc.bytes_per_param or 2.0
    peak = profile.figure("peaks", "tflops_bf16")
    fp8 = profile.figure("peaks", "tflops_fp8")
    if wbytes <= 1.0 and fp8 > 0:
        peak = fp8
    p[PF.PF_L] = mc.num_layers
    p[PF.PF_D] = mc.hidden_dim
    p[PF.PF_HQ] = _per_gpu(mc.num_heads, tp)
    p[PF.PF_HKV] = _per_gpu(mc.num_kv_heads or mc.num_heads, tp)
    p[PF.PF_DH] = head_dim
    p[PF.PF_DFF] = dense_ffn / tp
    p[PF.PF_N_DENSE] = n_dense
    p[PF.PF_N_MOE] = n_moe
    p[PF.PF_E] = mc.num_local_experts if n_moe else 0
    p[PF.PF_K] = mc.num_experts_per_tok if n_moe else 0
    p[PF.PF_DFF_MOE] = moe_ffn / tp
    p[PF.PF_DFF_SHARED] = mc.shared_expert_ffn_dim / tp
    p[PF.PF_VOCAB] = mc.vocab_size / tp
    p[PF.PF_WBYTES] = wbytes
    p[PF.PF_KVBYTES] = kv_bytes
    p[PF.PF_TP] = tp
    p[PF.PF_MLP_INPUTS] = 2.0 if mc.hidden_act in SWIGLU_FAMILY else 1.0
    p[PF.PF_PEAK_FLOPS] = peak * 1e12
    p[PF.PF_PEAK_BW] = profile.figure("peaks", "bandwidth_tbs") * 1e12
    for section, key, slot, *_ in _FIELDS:
        if slot not in (PF.PF_PEAK_FLOPS, PF.PF_PEAK_BW):
            p[slot] = profile.figure(section, key)
    p[PF.PF_AR_BW] = profile.figure("interconnect", "allreduce_bandwidth_gbs") * 1e9
    return p


def _peaks_only(hc: HardwareCalib) -> GpuProfile:
    """A profile of the GPU's peaks alone (unit efficiencies, no extra bytes or fixed costs):
    what the physical floor of a step is measured against."""
    figures = {(section, key): (1.0 if high == 1.0 or key == "overlap_exponent" else 0.0)
               for section, key, _slot, _low, high, _open in _FIELDS}
    figures[("peaks", "tflops_bf16")] = hc.tflops_peak
    figures[("peaks", "tflops_fp8")] = hc.tflops_fp8
    figures[("peaks", "bandwidth_tbs")] = hc.bw_peak_tbs
    figures[("interconnect", "allreduce_bandwidth_gbs")] = 1.0
    return GpuProfile(gpu=hc.gpu, source="peaks", figures=figures)


def with_floor(params: np.ndarray, mc: ModelConfig, hc: HardwareCalib, tp: int,
               layer_split: tuple[int, int]) -> np.ndarray:
    """A backend's ``params`` row extended with its step-floor description at
    ``FLOOR_OFFSET`` (zeros there when the model or the GPU's peaks are unknown: no floor)."""
    row = np.zeros(PF.FLOOR_OFFSET + PF.PF_SIZE, dtype=np.float64)
    row[: len(params)] = params
    peaks = (hc.tflops_peak, hc.bw_peak_tbs)
    if tp > 0 and all(v > 0 and math.isfinite(v) for v in peaks):
        try:
            row[PF.FLOOR_OFFSET:] = pack_profile_params(mc, _peaks_only(hc), tp, layer_split)
        except BlisConfigError:  # no model to count the work of (e.g. blackbox without one)
            pass
    return row
