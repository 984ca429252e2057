"""Fit a GPU profile's figures to measured single-step times (how the bundled H100 profile was
made: ``python -m blis_fast.profiling.calibrate gpu_profiles/measured/h100-steps.json --base H100``;
``docs/latency-profiled.md`` gives the method).

Two least-squares fits on the log of predicted/measured, every prediction made by the engine's
own kernels: the GEMM figures on the GEMM-only timings (``gemm_us_median``), then, those fixed,
the attention, elementwise and fixed-cost figures on the whole steps (``us_median``). The peaks
stay as given (datasheets).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from blis_fast.config.gpu_profile import GpuProfile, bundled_profile, pack_profile_params
from blis_fast.config.latency_backends import layer_split
from blis_fast.config.model_config import ModelConfig, model_config_from_hf, parse_hf_config
from blis_fast.data import data_path
from blis_fast.files import write_output_file
from blis_fast.kernels.engine import latency_profiled as PF

__all__ = ["FITTED", "GEMM_FITTED", "calibrate", "inside_bounds", "fit_gemm_to_steps", "fit_profile_to_steps",
           "step_batch"]

GEMM_FITTED: tuple[tuple[str, str, float, float], ...] = (
    ("gemm", "compute_efficiency", 0.001, 1.0),
    ("gemm", "half_efficiency_tokens", 0.0, 4096.0),
    ("gemm", "memory_efficiency", 0.001, 1.0),
    ("gemm", "overlap_exponent", 1.0, 16.0),
    ("gemm", "launch_us", 0.0, 1000.0),
)
FITTED: tuple[tuple[str, str, float, float], ...] = (
    # (section, key, lower, upper) of the figures a step fit adjusts
    ("attention", "prefill_compute_efficiency", 0.001, 1.0),
    ("attention", "cached_prefill_bytes_per_score", 0.0, 2000.0),
    ("attention", "decode_memory_efficiency", 0.001, 1.0),
    ("attention", "decode_bytes_per_score", 0.0, 2000.0),
    ("elementwise", "bytes_per_hidden", 0.0, 2000.0),
    ("elementwise", "bytes_per_qkv", 0.0, 2000.0),
    ("fixed_us", "per_layer", 0.0, 20000.0),
    ("fixed_us", "per_step", 0.0, 5000.0),
)


def step_batch(row: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A measured row (one prompt chunk of ``prefill_tokens`` over ``prefill_ctx`` cached
    tokens, plus ``decode_batch`` decodes of ``decode_ctx`` context) as the engine's batch."""
    prog, new, inp, out = [], [], [], []
    if row["prefill_tokens"]:
        prog.append(row["prefill_ctx"])
        new.append(row["prefill_tokens"])
        inp.append(row["prefill_ctx"] + row["prefill_tokens"])
        out.append(1)
    for _ in range(row["decode_batch"]):
        prog.append(row["decode_ctx"])
        new.append(1)
        inp.append(row["decode_ctx"] - 1)
        out.append(1)
    arrays = tuple(np.array(v, dtype=np.int64) for v in (prog, new, inp, out))
    return arrays  # type: ignore[return-value]


def _with(profile: GpuProfile, fitted: Sequence[tuple[str, str, float, float]],
          values: Sequence[float]) -> GpuProfile:
    figures = dict(profile.figures)
    for (section, key, _lo, _hi), v in zip(fitted, values, strict=True):
        figures[(section, key)] = float(v)
    return replace(profile, figures=figures)


Models = str | Path | Mapping[str, ModelConfig]
"""Where the rows' models come from: a folder of ``<model>/config.json``, or the configs."""


def _models(rows: Sequence[dict], model_configs: Models) -> Mapping[str, ModelConfig]:
    if isinstance(model_configs, Mapping):
        return model_configs
    models: dict[str, ModelConfig] = {}
    for row in rows:
        if row["model"] not in models:
            hf = parse_hf_config(Path(model_configs) / row["model"] / "config.json")
            models[row["model"]] = model_config_from_hf(hf)
    return models


def inside_bounds(value: float, lo: float, hi: float) -> float:
    """A fit's start: ``value`` moved just inside its bounds (a start on a bound can stay
    there, its one-sided derivative pointing out)."""
    return min(max(value, lo + (hi - lo) * 1e-3), hi - (hi - lo) * 1e-3)


def _least_squares(base: GpuProfile, fitted: Sequence[tuple[str, str, float, float]],
                   residuals) -> GpuProfile:
    start = [inside_bounds(base.figure(s, k), lo, hi) for s, k, lo, hi in fitted]
    fit = least_squares(residuals, start, bounds=([f[2] for f in fitted], [f[3] for f in fitted]),
                        diff_step=1e-3, x_scale="jac")
    return _with(base, fitted, fit.x)


def fit_gemm_to_steps(base: GpuProfile, rows: Sequence[dict],
                      model_configs: Models) -> GpuProfile:
    """``base`` with its :data:`GEMM_FITTED` figures fitted to the rows' GEMM-only timings
    (``gemm_us_median``: every layer's weight GEMMs over the step's tokens, and the LM head)."""
    rows = [r for r in rows if r.get("gemm_us_median")]
    models = _models(rows, model_configs)

    def residuals(values: np.ndarray) -> list[float]:
        prof = _with(base, GEMM_FITTED, values)
        params = {m: pack_profile_params(mc, prof, 1, layer_split(mc)) for m, mc in models.items()}
        out = []
        for row in rows:
            tokens = row["prefill_tokens"] + row["decode_batch"]
            sampled = (1 if row["prefill_tokens"] else 0) + row["decode_batch"]
            t = PF.weight_gemm_seconds(params[row["model"]], tokens, sampled) * 1e6
            out.append(math.log(t / row["gemm_us_median"]))
        return out

    return _least_squares(base, GEMM_FITTED, residuals)


def fit_profile_to_steps(base: GpuProfile, rows: Sequence[dict],
                         model_configs: Models) -> GpuProfile:
    """``base`` with its :data:`FITTED` figures fitted to ``rows`` (measured steps with
    ``model``, the batch fields and ``us_median``; a model is a folder of ``model_configs``)."""
    models = _models(rows, model_configs)
    batches = [step_batch(r) for r in rows]

    def residuals(values: np.ndarray) -> list[float]:
        prof = _with(base, FITTED, values)
        params = {m: pack_profile_params(mc, prof, 1, layer_split(mc)) for m, mc in models.items()}
        out = []
        for row, batch in zip(rows, batches, strict=True):
            # the kernel's unrounded time: step_time's whole microseconds would hide the
            # finite differences of the fit
            seconds, _, _ = PF.profiled_work(params[row["model"]], len(batch[0]), *batch)
            out.append(math.log(max(seconds * 1e6, 1.0) / row["us_median"]))
        return out

    return _least_squares(base, FITTED, residuals)


def calibrate(base: GpuProfile, rows: Sequence[dict], model_configs: Models) -> GpuProfile:
    """Both fits in order: the GEMM figures, then the rest of the step."""
    rows = [r for r in rows if "error" not in r]
    return fit_profile_to_steps(fit_gemm_to_steps(base, rows, model_configs), rows, model_configs)


def main(argv: Sequence[str] | None = None) -> int:
    """``calibrate STEPS.json --base GPU [--out FILE]``: print (or write) the fitted profile."""
    parser = argparse.ArgumentParser(prog="python -m blis_fast.profiling.calibrate",
                                     description=main.__doc__)
    parser.add_argument("steps")
    parser.add_argument("--base", required=True, help="bundled GPU profile to start from")
    parser.add_argument("--out", help="write the profile here (default: stdout)")
    args = parser.parse_args(argv)
    base = bundled_profile(args.base)
    if base is None:
        parser.error(f"--base: no bundled profile {args.base!r}")
    rows = json.loads(Path(args.steps).read_text())["results"]
    fitted = calibrate(base, rows, data_path("model_configs")).to_dict()
    for section, key, *_ in (*GEMM_FITTED, *FITTED):
        fitted[section][key] = round(fitted[section][key], 4)
    text = json.dumps(fitted, indent=2) + "\n"
    if args.out:
        write_output_file(args.out, "--out", text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
