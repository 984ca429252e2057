"""The inputs of a latency backend while they are resolved, and the stages backends share.

``config.latency.resolve_latency`` selects the backend and fills :class:`LatencyInputs` with
the flags and the ``defaults:`` GPU/TP/vLLM version; the backend's entry in
``config/latency_backends.py`` then resolves the rest (its coefficients, model config and
hardware, KV blocks, max-model-len) with the stages below, in the reference's order of checks.
A stage reports through ``inputs.warnings``/``inputs.infos`` and raises on the first failure.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from blis_fast.config.defaults import (
    DefaultsConfig,
    DefaultsReadError,
    get_coefficients,
    load_defaults,
)
from blis_fast.config.hardware import HardwareCalib, get_hw_config
from blis_fast.config.kv_capacity import (
    KVCapacityParams,
    calculate_kv_blocks,
    extract_kv_capacity_params,
)
from blis_fast.config.lora import (
    explicit_blocks_warning,
    reservation_info,
    reservation_skipped_warning,
)
from blis_fast.config.model_config import (
    HFConfig,
    ModelConfig,
    apply_weight_precision_fallback,
    model_config_from_hf,
    parse_hf_config,
)
from blis_fast.config.model_resolution import (
    max_model_len_from_config,
    resolve_hardware_config,
    resolve_model_config,
)
from blis_fast.config.pd_mode import requested as pd_requested
from blis_fast.config.policy_bundle import load_policy_bundle
from blis_fast.errors import BlisConfigError, BlisError, BlisInputError


@dataclass
class LatencyInputs:
    """What one latency backend is resolved from, filled in stage by stage."""

    opts: Any  # the RunOptions (``given`` says which flags were set)
    backend: str
    model: str  # lower-cased
    alpha: list[float]
    beta: list[float]
    alpha_given: bool
    beta_given: bool
    defaults_path: str
    defaults_exists: bool
    gpu: str
    tp: int
    vllm_version: str
    folder: str  # model config folder (resolved by analytical backends)
    hw_path: str  # hardware file (resolved by analytical backends)
    block_size: int
    gpu_memory_utilization: float
    total_kv_blocks: int
    kv_source: str  # "flag", "default" or "auto"
    max_model_len: int
    model_config: ModelConfig | None = None
    hardware: HardwareCalib | None = None
    kv_params: KVCapacityParams | None = None
    warnings: list[str] = field(default_factory=list)
    infos: list[str] = field(default_factory=list)
    lora: Any = None  # the run's LoRAConfig (its HBM reservation shrinks the KV budget)


def all_zeros(values: Sequence[float] | None) -> bool:
    """True when no coefficient is given or all are zero (the reference's "not trained")."""
    return not values or all(v == 0 for v in values)


def require_gpu_and_tp(inp: LatencyInputs, hint: str = "") -> None:
    """An analytical backend needs a GPU and a TP (flags or ``defaults:``); ``hint`` ends the error."""
    missing = []
    if inp.gpu == "":
        missing.append("--hardware (GPU type)")
    if inp.tp <= 0:
        missing.append("--tp (tensor parallelism)")
    if missing:
        raise BlisConfigError(
            f"--latency-model {inp.backend} needs {' and '.join(missing)}; defaults.yaml has no defaults "
            f"for model={inp.model}: give the flags explicitly{hint}"
        )


def locate_model_and_hardware(inp: LatencyInputs) -> None:
    """The model config folder and hardware file: the flags, else beside the defaults file."""
    inp.folder = resolve_model_config(inp.model, inp.folder, inp.defaults_path, inp.warnings,
                                      inp.infos)
    inp.hw_path = resolve_hardware_config(inp.hw_path, inp.defaults_path)


def global_coefficients(inp: LatencyInputs, section: str, min_betas: int,
                        alpha_optional: bool) -> None:
    """α/β from the backend's ``defaults.yaml`` section unless given; too few betas is an error,
    no alphas a warning unless the backend expects none."""
    if inp.defaults_exists:
        try:
            cfg: DefaultsConfig | None = load_defaults(inp.defaults_path)
        except DefaultsReadError as exc:
            inp.warnings.append(f"--latency-model {inp.backend}: {exc}")
            cfg = None
        coeffs = cfg.coefficients.get(section) if cfg is not None else None
        if coeffs is not None:
            if not inp.beta_given:
                inp.beta = list(coeffs.beta_coeffs or ())
                inp.infos.append(f"--latency-model: {inp.backend} betas from {section}")
            if not inp.alpha_given:
                inp.alpha = list(coeffs.alpha_coeffs or ())
                inp.infos.append(f"--latency-model: {inp.backend} alphas from {section}")
    if not inp.beta_given and (len(inp.beta) < min_betas or all_zeros(inp.beta)):
        raise BlisConfigError(
            f"--beta-coeffs: --latency-model {inp.backend} found no {section} in {inp.defaults_path}; "
            f"add that section or give --beta-coeffs (at least {min_betas} values)"
        )
    if not alpha_optional and all_zeros(inp.alpha) and not inp.alpha_given:
        inp.warnings.append(
            f"--latency-model {inp.backend}: no alpha coefficients; queueing, post-decode and per-token "
            "overheads are zero (TTFT/E2E may be underestimated)"
        )


def load_model_and_hardware(inp: LatencyInputs,
                            hardware: HardwareCalib | None = None) -> tuple[HFConfig, ModelConfig]:
    """Parse config.json and the hardware entry (weight-precision fallback applied); the parsed
    config.json (for the KV and max-model-len stages) and the model config are returned.
    ``hardware`` replaces the hardware file's entry (a GPU known from its profile only)."""
    hf = parse_hf_config(os.path.join(inp.folder, "config.json"))
    model_config = model_config_from_hf(hf)
    inp.hardware = hardware if hardware is not None else get_hw_config(inp.hw_path, inp.gpu)
    model_config, more_infos, more_warnings = apply_weight_precision_fallback(
        model_config, inp.model, hf.raw
    )
    inp.model_config = model_config
    inp.infos.extend(more_infos)
    inp.warnings.extend(more_warnings)
    return hf, model_config


def august_kv_rule(opts: Any) -> bool:
    """Whether the run's KV capacity follows the August reference's rule (an explicit
    ``head_dim`` in config.json sizes KV bytes and K/V weights): runs in P/D mode or with the
    autoscaler or node pools, the features blis_fast takes from that reference. Plain runs keep
    the April rule (hidden/heads) that their parity cases follow."""
    if pd_requested(opts):
        return True
    if getattr(opts, "model_autoscaler_interval_us", 0) > 0:
        return True
    path = getattr(opts, "policy_config", "")
    if not path:
        return False
    try:
        bundle = load_policy_bundle(path)
    except BlisError:  # reported where the run loads the bundle
        return False
    a = bundle.autoscaler
    return bool(bundle.node_pools) or (a is not None and a.interval_us > 0)


def auto_kv_blocks(inp: LatencyInputs, hf: HFConfig) -> None:
    """KV blocks from the GPU memory unless ``--total-kv-blocks`` is given; a failure warns and
    keeps the flag's default. A LoRA adapter reservation (LORA-6.2, 6.3) is subtracted from
    the budget; with one, a failed calculation is fatal (LORA-6.4), as in the August
    reference, and an explicit or skipped calculation warns that it is not applied."""
    reserved = inp.lora.reserved_bytes() if inp.lora is not None else 0
    if inp.opts.given("total_kv_blocks"):
        _append(inp.warnings, explicit_blocks_warning(inp.lora, inp.total_kv_blocks))
        return
    try:
        inp.kv_params = kv_params = extract_kv_capacity_params(hf)
    except BlisConfigError as exc:
        inp.warnings.append(
            f"--latency-model: no KV capacity parameters ({exc}); using total-kv-blocks={inp.total_kv_blocks} "
            "(set --total-kv-blocks to override)"
        )
        _append(inp.warnings, reservation_skipped_warning(inp.lora, inp.total_kv_blocks))
        return
    mc, hc = inp.model_config, inp.hardware
    if mc is None or hc is None:  # load_model_and_hardware ran first
        return
    if hc.memory_gib <= 0:
        inp.warnings.append(
            f"--latency-model: the hardware config gives no GPU memory; using "
            f"total-kv-blocks={inp.total_kv_blocks} (add MemoryGiB or set --total-kv-blocks)"
        )
        _append(inp.warnings, reservation_skipped_warning(inp.lora, inp.total_kv_blocks))
        return
    if kv_params.hidden_act == "":
        inp.infos.append("--latency-model: no hidden_act in config.json; assuming a SwiGLU MLP")
    u, block_size = inp.gpu_memory_utilization, inp.block_size
    try:
        blocks = calculate_kv_blocks(mc, hc, inp.tp, block_size, u, kv_params,
                                     august_kv_rule(inp.opts), reserved)
    except BlisConfigError as exc:
        if reserved > 0:
            raise BlisConfigError(
                f"--latency-model: KV capacity auto-calculation failed: {exc}") from None
        inp.warnings.append(
            f"--latency-model: KV capacity auto-calculation failed ({exc}); using "
            f"total-kv-blocks={inp.total_kv_blocks} (set --total-kv-blocks to override)"
        )
        return
    inp.total_kv_blocks = blocks
    inp.kv_source = "auto"
    inp.infos.append(
        f"--latency-model: auto-calculated total-kv-blocks={blocks} (GPU={hc.memory_gib:.0f} "
        f"GiB, TP={inp.tp}, block_size={block_size}, MoE={kv_params.is_moe}, "
        f"gpu-memory-utilization={u:.2f})"
    )
    _append(inp.infos, reservation_info("--latency-model", inp.lora))


def _append(messages: list[str], message: str | None) -> None:
    if message is not None:
        messages.append(message)


def model_max_len(inp: LatencyInputs, hf: HFConfig) -> None:
    """MaxModelLen from config.json unless ``--max-model-len`` is given, capped to the KV capacity."""
    if not inp.opts.given("max_model_len"):
        inp.max_model_len = max_model_len_from_config(hf, inp.infos, inp.warnings)
    if inp.max_model_len <= 0:
        return
    blocks_needed = -(-inp.max_model_len // inp.block_size)
    if blocks_needed > inp.total_kv_blocks:
        capped = inp.total_kv_blocks * inp.block_size
        inp.warnings.append(
            f"--latency-model: max-model-len {inp.max_model_len} exceeds the KV capacity ({inp.total_kv_blocks} "
            f"blocks x {inp.block_size} tokens); capped to {capped} tokens"
        )
        inp.max_model_len = capped


def trained_coefficients(inp: LatencyInputs) -> None:
    """α/β of the first matching ``models:`` entry of the defaults file, unless given."""
    if inp.alpha_given or inp.beta_given:
        return
    try:
        cfg = load_defaults(inp.defaults_path)
    except DefaultsReadError as exc:
        raise BlisInputError(f"--defaults-filepath: {exc}") from exc
    a, b = get_coefficients(cfg, inp.model, inp.tp, inp.gpu, inp.vllm_version)
    inp.alpha = list(a) if a is not None else []
    inp.beta = list(b) if b is not None else []


def best_effort_kv_blocks(inp: LatencyInputs) -> None:
    """KV auto-calculation for a backend that needs no model config (DELTA-23.4): unless
    ``--total-kv-blocks`` is given, every failure is a warning that keeps the flag's default."""
    if inp.opts.given("total_kv_blocks"):
        return
    blocks = _kv_blocks_or_warn(inp)
    if blocks is not None:
        inp.total_kv_blocks = blocks
        inp.kv_source = "auto"
        inp.infos.append(f"--latency-model {inp.backend}: auto-calculated total-kv-blocks={blocks}")


def _kv_blocks_or_warn(inp: LatencyInputs) -> int | None:
    """The KV blocks from the model config and hardware, or None after a warning saying why not."""
    warnings, infos = inp.warnings, inp.infos

    def fail(why: str) -> None:
        warnings.append(
            f"--latency-model {inp.backend}: {why}; using total-kv-blocks={inp.total_kv_blocks}"
        )

    try:
        resolved = resolve_model_config(inp.model, inp.folder, inp.defaults_path, warnings, infos)
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
        model_config_from_hf(hf), inp.model, hf.raw
    )
    infos.extend(more_infos)
    warnings.extend(more_warnings)
    try:
        resolved_hw = resolve_hardware_config(inp.hw_path, inp.defaults_path)
    except BlisConfigError as exc:
        fail(f"no hardware config ({exc})")
        return None
    try:
        hc = get_hw_config(resolved_hw, inp.gpu)
    except BlisError as exc:
        fail(f"cannot load the hardware config ({exc})")
        return None
    if hc.memory_gib <= 0:
        fail("the hardware config gives no GPU memory")
        return None
    try:
        params = extract_kv_capacity_params(hf)
        return calculate_kv_blocks(mc, hc, inp.tp, inp.block_size, inp.gpu_memory_utilization,
                                   params, august_kv_rule(inp.opts))
    except BlisConfigError as exc:
        fail(f"KV capacity auto-calculation failed ({exc})")
        return None

