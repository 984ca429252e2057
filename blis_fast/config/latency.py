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
3. Analytical backends (``config/latency_backends.py``): GPU and TP required; explicit
   ``roofline`` with coefficients is an error; model config folder and hardware file
   (``config.model_resolution``); global α/β from the backend's ``defaults.yaml`` section
   unless given.
4. Blackbox: α/β from the first matching ``models:`` entry unless given; KV blocks
   auto-calculated when possible (failures only warn); all-zero coefficients are an error.
5. Analytical backends: parse config.json, hardware entry, weight-precision fallback, KV blocks
   (``--total-kv-blocks`` → auto-calculation → the flag's default with a warning), MaxModelLen
   from ``max_position_embeddings`` with rope scaling, then capped to the KV capacity.
6. ``--max-model-len`` ≥ 0 (``options.CHECK_ORDER["latency-end"]``).

Steps 1, 2 and 6 are here; steps 3-5 are the backend's own: its entry in
``config/latency_backends.py`` resolves its inputs (``Backend.resolve``, by default the
analytical stages) from the shared stages of ``config.latency_inputs``, so a new backend is
its entry, not an edit here.

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

from blis_fast.config.defaults import DefaultsConfig, get_default_specs, load_defaults
from blis_fast.config.gpu_profile import with_floor
from blis_fast.config.hardware import HardwareCalib
from blis_fast.config.kv_capacity import KVCapacityParams
from blis_fast.config.latency_backends import LATENCY_BACKENDS, check_coefficients, layer_split
from blis_fast.config.latency_inputs import LatencyInputs
from blis_fast.config.model_config import ModelConfig
from blis_fast.data import data_path
from blis_fast.errors import BlisConfigError, BlisInputError
from blis_fast.kernels.engine import latency as K
from blis_fast.options import check_options

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
    lora_reserved_bytes: int = 0  # LoRA adapter HBM reserved per instance (pool KV, LORA-6.3)

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
    params = with_floor(params, mc, hc, tp, layer_split(mc))
    return entry.code, np.array(alpha[:3], dtype=np.float64), params


def _select_backend(opts: Any, infos: list[str]) -> tuple[str, bool, bool]:
    """The backend's name and whether α/β were given: name and pairing checks, the flags' own
    checks, then coefficients without ``--latency-model`` select ``blackbox``."""
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
    return backend, alpha_given, beta_given


def _inputs_from_flags(opts: Any, backend: str, alpha_given: bool, beta_given: bool,
                       infos: list[str]) -> LatencyInputs:
    """The inputs as the flags give them, GPU/TP/vLLM version defaulted from ``defaults:``."""
    defaults_path = opts.defaults_filepath or str(data_path("defaults.yaml"))
    defaults_exists = os.path.exists(defaults_path)
    if not defaults_exists and opts.given("defaults_filepath"):
        raise BlisInputError(f"--defaults-filepath: {defaults_path} does not exist")
    inp = LatencyInputs(
        opts=opts, backend=backend, model=opts.model.lower(),
        alpha=[float(a) for a in opts.alpha_coeffs], beta=[float(b) for b in opts.beta_coeffs],
        alpha_given=alpha_given, beta_given=beta_given,
        defaults_path=defaults_path, defaults_exists=defaults_exists,
        gpu=opts.hardware, tp=opts.tp, vllm_version=opts.vllm_version,
        folder=opts.model_config_folder, hw_path=opts.hardware_config,
        block_size=opts.block_size_in_tokens, gpu_memory_utilization=opts.gpu_memory_utilization,
        total_kv_blocks=opts.total_kv_blocks,
        kv_source="flag" if opts.given("total_kv_blocks") else "default",
        max_model_len=opts.max_model_len, infos=infos,
    )
    if defaults_exists:
        _default_specs(inp, load_defaults(defaults_path))
    return inp


def _default_specs(inp: LatencyInputs, cfg: DefaultsConfig) -> None:
    """TP, GPU and vLLM version not given take the model's ``defaults:`` entry (with warnings)."""
    model = inp.model
    d_gpu, d_tp, d_version = get_default_specs(cfg, model)
    if inp.tp == 0 and d_tp > 0:
        inp.warnings.append(f"Finding default values of TP for model={model}")
        inp.warnings.append(f"Using default tp={d_tp}")
        inp.tp = d_tp
    if inp.gpu == "" and d_gpu:
        inp.warnings.append(f"Finding default values of hardware for model={model}")
        inp.warnings.append(f"Using default GPU={d_gpu}")
        inp.gpu = d_gpu
    if inp.vllm_version == "" and d_version:
        inp.warnings.append(f"Finding default values of vLLM version for model={model}")
        inp.warnings.append(f"Using default vLLM version={d_version}")
        inp.vllm_version = d_version


def resolve_latency(opts: Any, lora: Any = None) -> LatencyConfig:
    """Resolve backend, coefficients, model/hardware, KV blocks and MaxModelLen from the
    flags of ``opts`` (a ``RunOptions``); the backend's registry entry resolves its inputs.
    ``lora`` (a resolved ``LoRAConfig``) reserves its adapters' HBM in the KV auto-calculation."""
    infos: list[str] = []
    backend, alpha_given, beta_given = _select_backend(opts, infos)
    inp = _inputs_from_flags(opts, backend, alpha_given, beta_given, infos)
    inp.lora = lora
    entry = LATENCY_BACKENDS[backend]
    resolver = entry.inputs_resolver()
    if resolver is not None:
        resolver(entry, inp)
    check_options(opts, "latency-end")  # the flag's own value: nothing above changes a negative
    code, alpha_arr, params = pack_latency_params(
        backend, inp.alpha, inp.beta, inp.model_config, inp.hardware, inp.tp, inp.warnings
    )
    return LatencyConfig(
        backend=backend,
        code=code,
        alpha=alpha_arr,
        beta=np.array(inp.beta, dtype=np.float64),
        params=params,
        total_kv_blocks=int(inp.total_kv_blocks),
        max_model_len=int(inp.max_model_len),
        model=inp.model,
        gpu=inp.gpu,
        tp=inp.tp,
        vllm_version=inp.vllm_version,
        model_config=inp.model_config,
        hardware=inp.hardware,
        model_config_folder=inp.folder if entry.analytical else "",
        hardware_config_path=inp.hw_path if entry.analytical else "",
        kv_blocks_source=inp.kv_source,
        kv_params=inp.kv_params,
        warnings=inp.warnings,
        infos=inp.infos,
        lora_reserved_bytes=lora.reserved_bytes() if lora is not None else 0,
    )
