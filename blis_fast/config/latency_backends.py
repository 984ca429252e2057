"""Latency backends (ENG-10.4, DELTA-16/20/21/22/25): one ``register`` per backend.

An entry says what the backend needs: whether it is analytical (model config.json and hardware
file required), which ``defaults.yaml`` section holds its global coefficients and how many
betas it needs, how its inputs are resolved (``resolve``: coefficients, model and hardware, KV
blocks, max-model-len, with its own checks and messages, from the stages of
``config/latency_inputs.py``) and how its kernel parameters are packed from the coefficients
and the model and hardware descriptions (with the checks the reference makes when it builds
the model; the layouts are documented in ``blis_fast/kernels/engine/latency.py``, whose
``step_time`` runs it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from blis_fast.config import latency_inputs as LI
from blis_fast.config.defaults import (
    COEFFICIENT_SECTIONS,
    CROSSMODEL_SECTION,
    TRAINED_PHYSICS_SECTION,
    TRAINED_ROOFLINE_SECTION,
)
from blis_fast.config.gpu_profile import (
    bundled_profile,
    hardware_from_profile,
    load_gpu_profile,
    pack_profiled,
    require_profile,
)
from blis_fast.config.hardware import HardwareCalib, load_hardware_table
from blis_fast.config.latency_inputs import LatencyInputs
from blis_fast.config.model_config import HFConfig, ModelConfig
from blis_fast.errors import BlisConfigError
from blis_fast.kernels.engine import latency as K
from blis_fast.kernels.engine.latency import Backend as BackendCode
from blis_fast.policies.registry import Registry

Packer = Callable[[Sequence[float], Sequence[float], ModelConfig, HardwareCalib, int, list[str]],
                  np.ndarray]
"""(alpha, beta, model config, hardware, TP, warnings) -> the kernel's ``params``."""

Resolver = Callable[["Backend", LatencyInputs], None]
"""(the backend's entry, its inputs so far) -> nothing: fills in the inputs or raises."""


@dataclass(frozen=True)
class Coefficients:
    """Global α/β of a backend in ``defaults.yaml``: the section and the betas it must hold."""

    section: str  # one of defaults.COEFFICIENT_SECTIONS (the file's known keys)
    min_betas: int

    def __post_init__(self) -> None:
        if self.section not in COEFFICIENT_SECTIONS:
            raise ValueError(f"latency backend coefficients: {self.section!r} is not a known "
                             "defaults.yaml section; add it to config/defaults.py "
                             "COEFFICIENT_SECTIONS")


@dataclass(frozen=True)
class Backend:
    """One latency backend."""

    name: str
    code: int
    pack: Packer
    analytical: bool = True  # needs the model's config.json and the hardware file
    coefficients: Coefficients | None = None  # global α/β from defaults.yaml unless given
    alpha_optional: bool = False  # all-zero α is expected (no warning about zero overheads)
    resolve: Resolver | None = None  # None: resolve_analytical if analytical, else the flags' α/β

    def inputs_resolver(self) -> Resolver | None:
        """The resolver of this backend's inputs (None: the flags' coefficients as given)."""
        if self.resolve is not None:
            return self.resolve
        return resolve_analytical if self.analytical else None


def check_coefficients(flag: str, coeffs: Sequence[float]) -> None:
    """The reference's coefficient checks when it builds a latency model: finite, >= 0."""
    for i, c in enumerate(coeffs):
        if math.isnan(c):
            raise BlisConfigError(f"{flag}[{i}] is NaN")
        if math.isinf(c):
            raise BlisConfigError(f"{flag}[{i}] is infinite")
        if c < 0:
            raise BlisConfigError(f"{flag}[{i}] must be non-negative, got {c}")


def _positive_finite(v: float) -> bool:
    return v > 0 and not math.isnan(v) and not math.isinf(v)


def layer_split(mc: ModelConfig) -> tuple[int, int]:
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


def _roofline_params(mc: ModelConfig, hc: HardwareCalib, tp: int) -> np.ndarray:
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
    n_moe, n_dense = layer_split(mc)
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


def _pack_crossmodel(alpha: Sequence[float], beta: Sequence[float], mc: ModelConfig,
                     hc: HardwareCalib, tp: int, warnings: list[str]) -> np.ndarray:
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
    check_coefficients("--beta-coeffs", beta)
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


def _physics_layout(mc: ModelConfig, kv_heads: int, head_dim: int, tp: int) -> np.ndarray:
    """A trained-physics parameter vector with the architecture fields both trained backends
    share (layers, widths, heads per GPU, TP, experts); the caller sets the rest."""
    p = np.zeros(K.TP_SIZE, dtype=np.float64)
    p[K.TP_L] = float(mc.num_layers)
    p[K.TP_D] = float(mc.hidden_dim)
    p[K.TP_DKV] = float(kv_heads * head_dim)
    p[K.TP_DH] = float(head_dim)
    p[K.TP_TP] = float(tp)
    p[K.TP_KEFF] = float(max(1, mc.num_experts_per_tok))
    p[K.TP_HPG] = float(mc.num_heads) / float(tp)
    p[K.TP_E] = float(mc.num_local_experts)
    return p


def _pack_trained_roofline(alpha: Sequence[float], beta: Sequence[float], mc: ModelConfig,
                           hc: HardwareCalib, tp: int, warnings: list[str]) -> np.ndarray:
    kv_heads = _check_trained_arch("trained-roofline", mc, hc, tp)
    if len(beta) < 7:
        raise BlisConfigError(
            f"--beta-coeffs: trained-roofline needs at least 7 betas, got {len(beta)}"
        )
    check_coefficients("--beta-coeffs", beta)
    head_dim = mc.hidden_dim // mc.num_heads
    # the trained-physics layout (kernels/engine/latency.py says why the step times are the same)
    p = _physics_layout(mc, kv_heads, head_dim, tp)
    p[0:7] = beta[:7]
    p[K.TP_IS_MOE] = 1.0 if mc.num_local_experts > 0 else 0.0
    p[K.TP_N_MOE] = float(mc.num_layers)
    p[K.TP_DFF_MOE] = float(mc.intermediate_dim)
    p[K.TP_WBPP] = 2.0
    p[K.TP_FLOPS_US] = hc.tflops_peak * 1e6
    p[K.TP_BW_US] = hc.bw_peak_tbs * 1e6
    return p


def _pack_trained_physics(alpha: Sequence[float], beta: Sequence[float], mc: ModelConfig,
                          hc: HardwareCalib, tp: int, warnings: list[str]) -> np.ndarray:
    if len(beta) < 7:
        raise BlisConfigError(
            f"--beta-coeffs: trained-physics needs at least 7 betas, got {len(beta)}"
        )
    kv_heads = _check_trained_arch("trained-physics", mc, hc, tp)
    if mc.num_local_experts > 1 and mc.num_experts_per_tok <= 0:
        raise BlisConfigError(
            f"trained-physics: {mc.num_local_experts} experts but num_experts_per_tok must be > 0"
        )
    check_coefficients("--alpha-coeffs", alpha)
    check_coefficients("--beta-coeffs", beta)
    head_dim = mc.hidden_dim // mc.num_heads
    n_moe, n_dense = layer_split(mc)
    d_ff = mc.intermediate_dim
    d_ff_moe = mc.moe_expert_ffn_dim if mc.moe_expert_ffn_dim > 0 else d_ff
    d_ff_dense = mc.dense_intermediate_dim if mc.dense_intermediate_dim > 0 else d_ff
    wbpp = mc.effective_weight_bytes_per_param()
    peak = hc.tflops_peak * 1e6
    if wbpp == 1.0 and hc.tflops_fp8 > 0:
        peak = hc.tflops_fp8 * 1e6
    p = _physics_layout(mc, kv_heads, head_dim, tp)
    nb = min(10, len(beta))
    p[0:nb] = beta[:nb]
    p[K.TP_PREFILL_SPLIT] = 1.0 if len(beta) >= 9 else 0.0
    p[K.TP_DECODE_SPLIT] = 1.0 if len(beta) >= 10 else 0.0
    p[K.TP_IS_MOE] = 1.0 if mc.num_local_experts > 1 else 0.0
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



def _pack_blackbox(alpha: Sequence[float], beta: Sequence[float], mc: ModelConfig,
                   hc: HardwareCalib, tp: int, warnings: list[str]) -> np.ndarray:
    warnings.append(
        'the "blackbox" latency model is deprecated (the reference drops it); '
        "consider --latency-model trained-physics"
    )
    if len(beta) < 3:
        raise BlisConfigError(f"--beta-coeffs: blackbox needs at least 3 betas, got {len(beta)}")
    check_coefficients("--beta-coeffs", beta)
    return np.array(beta[:3], dtype=np.float64)


def _pack_roofline(alpha: Sequence[float], beta: Sequence[float], mc: ModelConfig,
                   hc: HardwareCalib, tp: int, warnings: list[str]) -> np.ndarray:
    if tp <= 0:
        raise BlisConfigError(f"--tp: roofline needs TP > 0, got {tp}")
    _validate_roofline(mc, hc, warnings)
    return _roofline_params(mc, hc, tp)


def analytical_names() -> str:
    """The analytical backends, as a sentence's list ("a, b or c")."""
    names = [b.name for b in LATENCY_BACKENDS if b.analytical]
    return ", ".join(names[:-1]) + " or " + names[-1]


def resolve_analytical(entry: Backend, inp: LatencyInputs) -> None:
    """An analytical backend's inputs: GPU and TP, model config folder and hardware file, global
    α/β (``entry.coefficients``), config.json and hardware entry, KV blocks, max-model-len."""
    hf, _ = _analytical_model(entry, inp)
    _finish_analytical(inp, hf)


def _analytical_model(entry: Backend, inp: LatencyInputs) -> tuple[HFConfig, ModelConfig]:
    """The stages of ``resolve_analytical`` up to the loaded model config (returned)."""
    LI.require_gpu_and_tp(inp)
    LI.locate_model_and_hardware(inp)
    if entry.coefficients is not None:
        LI.global_coefficients(inp, entry.coefficients.section, entry.coefficients.min_betas,
                               entry.alpha_optional)
    return LI.load_model_and_hardware(inp)


def _finish_analytical(inp: LatencyInputs, hf: HFConfig) -> None:
    """The stages of ``resolve_analytical`` after the model config: KV blocks, max-model-len."""
    LI.auto_kv_blocks(inp, hf)
    LI.model_max_len(inp, hf)


def _resolve_roofline(entry: Backend, inp: LatencyInputs) -> None:
    """Roofline: no coefficients (an explicit roofline with them is an error); MoE noted."""
    LI.require_gpu_and_tp(inp, " or use --latency-model blackbox with trained coefficients")
    if inp.opts.given("latency_model") and inp.beta_given:
        raise BlisConfigError(
            "--alpha-coeffs/--beta-coeffs cannot be combined with --latency-model roofline "
            "(roofline derives step times analytically; use --latency-model blackbox for coefficients)"
        )
    if inp.folder:
        inp.infos.append("--latency-model: the explicit --model-config-folder is used")
    if inp.hw_path:
        inp.infos.append("--latency-model: the explicit --hardware-config is used")
    LI.locate_model_and_hardware(inp)
    hf, mc = LI.load_model_and_hardware(inp)
    if mc.num_local_experts > 1:
        inp.infos.append(
            f"--latency-model: MoE model ({mc.num_local_experts} experts, "
            f"top-{mc.num_experts_per_tok}); expert dispatch overhead is not modelled"
        )
    _finish_analytical(inp, hf)


def _resolve_trained_roofline(entry: Backend, inp: LatencyInputs) -> None:
    """Trained-roofline: the analytical inputs, and a warning that quantized weights only change
    the KV capacity."""
    hf, mc = _analytical_model(entry, inp)
    if mc.weight_bytes_per_param > 0:
        inp.warnings.append(
            "trained-roofline charges 2-byte weights (as in its training data); the quantized precision "
            f"({mc.weight_bytes_per_param:.2f} bytes/param) only changes the KV capacity"
        )
    _finish_analytical(inp, hf)


def _resolve_blackbox(entry: Backend, inp: LatencyInputs) -> None:
    """Blackbox: α/β of the matching ``models:`` entry unless given, KV blocks when they can be
    computed (failures only warn); no trained coefficients is an error."""
    LI.trained_coefficients(inp)
    LI.best_effort_kv_blocks(inp)
    if LI.all_zeros(inp.alpha) and LI.all_zeros(inp.beta):
        raise BlisConfigError(
            f"--alpha-coeffs/--beta-coeffs: no trained blackbox coefficients for model={inp.model}, "
            f"GPU={inp.gpu}, TP={inp.tp}; give --alpha-coeffs/--beta-coeffs or use --latency-model "
            + analytical_names()
        )


def _pack_profiled(alpha: Sequence[float], beta: Sequence[float], mc: ModelConfig,
                   hc: HardwareCalib, tp: int, warnings: list[str]) -> np.ndarray:
    return pack_profiled(mc, hc, tp, layer_split(mc))


def _resolve_profiled(entry: Backend, inp: LatencyInputs) -> None:
    """Profiled: the analytical inputs without trained coefficients (α from --alpha-coeffs,
    else 0) and a GPU profile: --gpu-profile, else the bundled profile of --hardware. A GPU
    missing from the hardware file is described by its profile (peaks and memory)."""
    LI.require_gpu_and_tp(inp)
    if inp.beta_given:
        raise BlisConfigError("--beta-coeffs cannot be combined with --latency-model profiled "
                              "(its step times come from the GPU profile; --alpha-coeffs still "
                              "sets the queueing and output-token overheads)")
    LI.locate_model_and_hardware(inp)
    path = inp.opts.gpu_profile
    profile = load_gpu_profile(path) if path else bundled_profile(inp.gpu)
    hardware = None
    if profile is not None and inp.gpu not in load_hardware_table(inp.hw_path):
        hardware = hardware_from_profile(profile, path)
    hf, _ = LI.load_model_and_hardware(inp, hardware)
    assert inp.hardware is not None  # load_model_and_hardware set it
    inp.hardware = replace(inp.hardware, profile_path=path)
    profile = require_profile(inp.hardware)  # none for this GPU: said before the run
    inp.infos.append(f"--latency-model profiled: GPU profile {profile.gpu} ({profile.source})")
    _finish_analytical(inp, hf)


LATENCY_BACKENDS = Registry[Backend]("latency backend", flag="latency-model",
                                     slot="ConfigSlot.BACKEND")

LATENCY_BACKENDS.register(Backend("blackbox", BackendCode.BLACKBOX, _pack_blackbox, analytical=False,
                                  resolve=_resolve_blackbox))
LATENCY_BACKENDS.register(Backend("roofline", BackendCode.ROOFLINE, _pack_roofline,
                                  resolve=_resolve_roofline))
LATENCY_BACKENDS.register(Backend("trained-physics", BackendCode.TRAINED_PHYSICS, _pack_trained_physics,
                                  coefficients=Coefficients(TRAINED_PHYSICS_SECTION, 7)))
LATENCY_BACKENDS.register(Backend("crossmodel", BackendCode.CROSSMODEL, _pack_crossmodel,
                                  coefficients=Coefficients(CROSSMODEL_SECTION, 4),
                                  alpha_optional=True))
LATENCY_BACKENDS.register(Backend("trained-roofline", BackendCode.TRAINED_ROOFLINE, _pack_trained_roofline,
                                  coefficients=Coefficients(TRAINED_ROOFLINE_SECTION, 7),
                                  resolve=_resolve_trained_roofline))
LATENCY_BACKENDS.register(Backend("profiled", BackendCode.PROFILED, _pack_profiled,
                                  alpha_optional=True, resolve=_resolve_profiled))
