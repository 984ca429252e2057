"""Latency-backend resolution (spec ENG-10.4 as amended by DELTA-20/22/23/25/26).

``resolve_latency(RunOptions) -> LatencyConfig`` turns the latency-related flags into the
backend, its coefficients, the model/hardware description, the KV-cache size and the maximum
model length, in the reference's order of checks (first failure wins):

1. lower-case the model; check the backend name; alpha/beta given together; the flags' own
   checks (``options.CHECK_ORDER["latency"]``: α/β values finite and ≥ 0,
   ``--gpu-memory-utilization`` in (0, 1], ``--block-size-in-tokens`` > 0); coefficients
   without ``--latency-model`` select ``blackbox``.
2. GPU, TP and vLLM version default from ``defaults:`` when the defaults file exists
   (the warnings name what was taken).
3. Analytical backends (``policies.latency_backends``): GPU and TP required; explicit
   ``roofline`` with coefficients is an error; model config folder and hardware file
   (``config.model_resolution``); global α/β from the backend's ``defaults.yaml`` section
   unless given.
4. Blackbox: α/β from the first matching ``models:`` entry unless given; KV blocks
   auto-calculated when possible (failures only warn); all-zero coefficients are an error.
5. Analytical backends: parse config.json, hardware entry, weight-precision fallback, KV blocks
   (``--total-kv-blocks`` → auto-calculation → the flag's default with a warning), MaxModelLen
   from ``max_position_embeddings`` with rope scaling, then capped to the KV capacity.
6. ``--max-model-len`` ≥ 0 (``options.CHECK_ORDER["latency-end"]``).

The kernel parameters are then packed by the backend's entry (with the checks the reference
makes when it builds the latency model). Warnings and informational messages are returned on
the result, never printed.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from blis_fast.config.defaults import (
    DefaultsConfig,
    DefaultsReadError,
    get_coefficients,
    get_default_specs,
    load_defaults,
)
from blis_fast.config.hardware import HardwareCalib, get_hw_config
from blis_fast.config.kv_capacity import (
    KVCapacityParams,
    calculate_kv_blocks,
    extract_kv_capacity_params,
)
from blis_fast.config.model_config import (
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
from blis_fast.data import data_path
from blis_fast.errors import BlisConfigError, BlisError, BlisInputError
from blis_fast.kernels import latency as K
from blis_fast.options import check_options
from blis_fast.policies.latency_backends import LATENCY_BACKENDS, check_coefficients

__all__ = [
    "LatencyConfig",
    "pack_latency_params",
    "resolve_latency",
]


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
    kv_params: KVCapacityParams | None = None  # set when extracted (per-pool KV, AS-2.4)
    warnings: list[str] = field(default_factory=list)
    infos: list[str] = field(default_factory=list)

    @property
    def output_token_time(self) -> int:
        """Per-output-token processing time (µs) the backend charges (ITL samples)."""
        return int(K.output_token_processing_time(self.code, self.alpha))

    @property
    def post_decode_overhead(self) -> int:
        """Fixed time (µs) after a request's last decode step."""
        return int(K.post_decode_fixed_overhead(self.code, self.alpha))


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
    if backend and backend not in LATENCY_BACKENDS:
        raise BlisConfigError(f"--latency-model: unknown backend {backend!r}; valid: "
                              + ", ".join(LATENCY_BACKENDS.valid_names()))
    entry = LATENCY_BACKENDS[backend]
    alpha = [float(a) for a in alpha]
    beta = [float(b) for b in beta]
    if len(alpha) < 3:
        raise BlisConfigError(
            f"--alpha-coeffs: at least 3 alpha coefficients are needed, got {len(alpha)}"
        )
    check_coefficients("--alpha-coeffs", alpha)
    mc = model_config if model_config is not None else ModelConfig()
    hc = hardware if hardware is not None else HardwareCalib()
    params = entry.pack(alpha, beta, mc, hc, tp, warnings if warnings is not None else [])
    return entry.code, np.array(alpha[:3], dtype=np.float64), params


def _all_zeros(values: Sequence[float] | None) -> bool:
    return not values or all(v == 0 for v in values)


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


def _analytical_names() -> str:
    """The analytical backends, as a sentence's list ("a, b or c")."""
    names = [b.name for b in LATENCY_BACKENDS if b.analytical]
    return ", ".join(names[:-1]) + " or " + names[-1]


def resolve_latency(opts: Any) -> LatencyConfig:
    """Resolve backend, coefficients, model/hardware, KV blocks and MaxModelLen from the
    flags of ``opts`` (a ``RunOptions``)."""
    warnings: list[str] = []
    infos: list[str] = []
    alpha: list[float] = [float(a) for a in opts.alpha_coeffs]
    beta: list[float] = [float(b) for b in opts.beta_coeffs]
    model = opts.model.lower()

    if opts.latency_model and opts.latency_model not in LATENCY_BACKENDS:
        raise BlisConfigError(
            f"--latency-model: unknown backend {opts.latency_model!r}; valid options: "
            + ", ".join(LATENCY_BACKENDS.valid_names())
        )
    # the reference lets "" through its name check and then resolves nothing (CLU OPEN-4);
    # blis_fast reads it as the default backend
    backend = opts.latency_model or LATENCY_BACKENDS.default_name
    alpha_given = opts.given("alpha_coeffs")
    beta_given = opts.given("beta_coeffs")
    if alpha_given != beta_given:
        if alpha_given:
            raise BlisConfigError(
                "--alpha-coeffs requires --beta-coeffs (the two coefficient sets go together)"
            )
        raise BlisConfigError(
            "--beta-coeffs requires --alpha-coeffs (the two coefficient sets go together)"
        )
    check_options(opts, "latency")
    if not opts.given("latency_model") and alpha_given and beta_given:
        backend = "blackbox"
        infos.append("--alpha-coeffs and --beta-coeffs given: using the blackbox latency model")
    entry = LATENCY_BACKENDS[backend]
    u = opts.gpu_memory_utilization
    block_size = opts.block_size_in_tokens

    defaults_path = opts.defaults_filepath or str(data_path("defaults.yaml"))
    gpu, tp, vllm_version = opts.hardware, opts.tp, opts.vllm_version
    total_kv_blocks = opts.total_kv_blocks
    kv_source = "flag" if opts.given("total_kv_blocks") else "default"
    max_model_len = opts.max_model_len
    defaults_exists = os.path.exists(defaults_path)
    if not defaults_exists and opts.given("defaults_filepath"):
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

    if entry.analytical:
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
        if backend == "roofline" and opts.given("latency_model") and beta_given:
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
        if entry.coefficients is not None:
            section, min_betas = entry.coefficients.section, entry.coefficients.min_betas
            if defaults_exists:
                try:
                    gcfg: DefaultsConfig | None = load_defaults(defaults_path)
                except DefaultsReadError as exc:
                    warnings.append(f"--latency-model {backend}: {exc}")
                    gcfg = None
                coeffs = gcfg.coefficients.get(section) if gcfg is not None else None
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
            if not entry.alpha_optional and _all_zeros(alpha) and not alpha_given:
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
        if not opts.given("total_kv_blocks"):
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
                f"TP={tp}; give --alpha-coeffs/--beta-coeffs or use --latency-model "
                + _analytical_names()
            )

    model_config: ModelConfig | None = None
    hardware: HardwareCalib | None = None
    kv_params: KVCapacityParams | None = None
    if entry.analytical:
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

        if not opts.given("total_kv_blocks"):
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

        if not opts.given("max_model_len"):
            max_model_len = max_model_len_from_config(hf, infos, warnings)

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

    check_options(opts, "latency-end")  # the flag's own value: nothing above changes a negative

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
        model_config_folder=folder if entry.analytical else "",
        hardware_config_path=hw_path if entry.analytical else "",
        kv_blocks_source=kv_source,
        kv_params=kv_params,
        warnings=warnings,
        infos=infos,
    )

