"""``blis profile``: measure a GPU profile on the machine it runs on.

Microbenchmarks with PyTorch (the ``[profile]`` extra): GEMMs over token counts and shapes
(the GEMM figures are fitted to them), a large copy (the bandwidth peak), and whole forward
steps of a small Llama-style model over prefill, cached-prefill, decode and mixed batches (the
attention, elementwise and fixed-cost figures are fitted to them, each prediction by the
engine's kernel; ``calibrate.py``). The peaks are the best rates measured unless given
(datasheet figures). On a CUDA GPU each timing is a CUDA graph replay; on a CPU ``--quick``
shapes keep the whole run to well under a minute.
"""

from __future__ import annotations

import datetime
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TextIO

import numpy as np
from scipy.optimize import least_squares

from blis_fast.config.gpu_profile import GpuProfile, bundled_profile, profile_from_dict
from blis_fast.config.model_config import HFConfig, ModelConfig, model_config_from_hf
from blis_fast.kernels.engine import latency_profiled as PF
from blis_fast.profiling.calibrate import GEMM_FITTED, fit_profile_to_steps, inside_bounds
from blis_fast.profiling.measure import (
    Dims,
    Machine,
    Timer,
    machine,
    time_copy,
    time_gemm,
    time_step,
    weights_for,
)
from blis_fast.sweep.progress import Progress
from blis_fast.version import __version__

__all__ = ["ProfilePlan", "ProfileRun", "plan_for", "run_profile"]


@dataclass(frozen=True)
class ProfilePlan:
    """What to time: GEMM shapes, copy sizes, the step models and their batches."""

    gemm_tokens: tuple[int, ...]
    gemm_shapes: tuple[tuple[int, int], ...]  # (N, K)
    copy_elements: tuple[int, ...]
    step_models: tuple[Dims, ...]  # two sizes: fixed costs apart from size-proportional ones
    step_cases: tuple[tuple[int, int, int, int], ...]  # (prefill, prefill ctx, decodes, ctx)
    reps: int


def plan_for(m: Machine, quick: bool, reps: int | None = None) -> ProfilePlan:
    """A GPU plan (1B-class shapes, a few minutes) or a CPU/quick one (tiny shapes, seconds)."""
    if quick or m.device == "cpu":
        return ProfilePlan(
            gemm_tokens=(1, 4, 16, 64, 256), gemm_shapes=((512, 512), (1536, 512), (512, 1536)),
            copy_elements=(4 << 20, 8 << 20),
            # one narrow model at two depths (per-layer apart from per-step costs) and a
            # wider one (costs that grow with the shapes)
            step_models=(Dims(hidden=64, layers=1, heads=4, kv_heads=2, head_dim=16, ffn=192,
                              vocab=512),
                         Dims(hidden=64, layers=4, heads=4, kv_heads=2, head_dim=16, ffn=192,
                              vocab=512),
                         Dims(hidden=128, layers=2, heads=8, kv_heads=2, head_dim=16, ffn=384,
                              vocab=1024)),
            step_cases=((16, 0, 0, 0), (64, 0, 0, 0), (256, 0, 0, 0), (32, 96, 0, 0),
                        (0, 0, 1, 64), (0, 0, 8, 128), (0, 0, 32, 256), (32, 0, 8, 128)),
            reps=reps or 9)
    return ProfilePlan(
        gemm_tokens=(1, 8, 32, 128, 512, 2048, 8192),
        gemm_shapes=((4096, 4096), (14336, 4096), (4096, 14336), (6144, 4096)),
        copy_elements=(128 << 20, 256 << 20),
        step_models=(Dims(hidden=2048, layers=8, heads=16, kv_heads=8, head_dim=128, ffn=8192,
                          vocab=32000),
                     Dims(hidden=4096, layers=4, heads=32, kv_heads=8, head_dim=128, ffn=14336,
                          vocab=128256)),
        step_cases=((16, 0, 0, 0), (128, 0, 0, 0), (512, 0, 0, 0), (2048, 0, 0, 0),
                    (4096, 0, 0, 0), (512, 1536, 0, 0), (0, 0, 1, 512), (0, 0, 16, 1024),
                    (0, 0, 64, 1024), (0, 0, 256, 512), (256, 0, 32, 1024)),
        reps=reps or 15)


@dataclass
class ProfileRun:
    """A measured profile and what it was fitted to (for the plot and the tests)."""

    profile: GpuProfile
    gemm_points: list[tuple[int, int, int, float]] = field(default_factory=list)  # M, N, K, s
    step_rows: list[dict] = field(default_factory=list)
    models: dict[str, ModelConfig] = field(default_factory=dict)


def _gemm_params(profile: GpuProfile, abytes: float) -> np.ndarray:
    """A ``profiled`` params row holding only what one GEMM's time reads."""
    p = np.zeros(PF.PF_SIZE, dtype=np.float64)
    p[PF.PF_PEAK_FLOPS] = profile.figure("peaks", "tflops_bf16") * 1e12
    p[PF.PF_PEAK_BW] = profile.figure("peaks", "bandwidth_tbs") * 1e12
    p[PF.PF_WBYTES] = p[PF.PF_KVBYTES] = abytes
    p[PF.PF_G_COMPUTE] = profile.figure("gemm", "compute_efficiency")
    p[PF.PF_G_HALF_M] = profile.figure("gemm", "half_efficiency_tokens")
    p[PF.PF_G_MEMORY] = profile.figure("gemm", "memory_efficiency")
    p[PF.PF_G_OVERLAP] = profile.figure("gemm", "overlap_exponent")
    p[PF.PF_G_LAUNCH_US] = profile.figure("gemm", "launch_us")
    return p


def _with_figures(profile: GpuProfile, values: dict[tuple[str, str], float]) -> GpuProfile:
    return replace(profile, figures={**profile.figures, **values})


def _fit_gemm(profile: GpuProfile, points: Sequence[tuple[int, int, int, float]],
              abytes: float) -> GpuProfile:
    def residuals(x: np.ndarray) -> list[float]:
        prof = _with_figures(profile, {(s, k): float(v) for (s, k, *_), v in zip(GEMM_FITTED, x, strict=True)})
        p = _gemm_params(prof, abytes)
        return [math.log(PF.gemm_seconds(p, m, n, k) / t) for m, n, k, t in points]

    start = [inside_bounds(profile.figure(s, k), lo, hi) for s, k, lo, hi in GEMM_FITTED]
    fit = least_squares(residuals, start, bounds=([f[2] for f in GEMM_FITTED], [f[3] for f in GEMM_FITTED]),
                        diff_step=1e-3, x_scale="jac")
    return _with_figures(profile, {(s, k): round(float(v), 4)
                                   for (s, k, *_), v in zip(GEMM_FITTED, fit.x, strict=True)})


def run_profile(device: str = "auto", quick: bool = False, reps: int | None = None,
                gpu_name: str = "", peak_tflops: float = 0.0, peak_bandwidth_tbs: float = 0.0,
                stream: TextIO | None = sys.stderr) -> ProfileRun:
    """Measure this machine's profile (``gpu_name`` names it; peaks measured unless given)."""
    m = machine(device)
    plan = plan_for(m, quick, reps)
    timer = Timer(m, plan.reps, min_seconds=1.0)
    abytes = float(m.torch.tensor([], dtype=m.dtype).element_size())
    total = (len(plan.gemm_tokens) * len(plan.gemm_shapes) + len(plan.copy_elements)
             + len(plan.step_cases) * len(plan.step_models))
    progress = Progress(total, 0, stream, label="blis profile", line_interval_s=2.0,
                        unit="timings")
    points = []
    for n, k in plan.gemm_shapes:
        for tokens in plan.gemm_tokens:
            points.append((tokens, n, k, time_gemm(m, timer, tokens, n, k)))
            progress.advance(1)
    bandwidth = 0.0
    for elements in plan.copy_elements:
        seconds = time_copy(m, timer, elements)
        bandwidth = max(bandwidth, 2 * elements * abytes / seconds)
        progress.advance(1)
    flops = max(2.0 * t * n * k / s for t, n, k, s in points)

    base = bundled_profile("H100")  # the shapes start from the measured H100's
    assert base is not None
    figures = dict(base.figures)
    figures[("peaks", "tflops_bf16")] = round((peak_tflops or flops / 1e12), 6)
    figures[("peaks", "tflops_fp8")] = 0.0
    figures[("peaks", "bandwidth_tbs")] = round((peak_bandwidth_tbs or bandwidth / 1e12), 6)
    if m.device == "cuda":
        figures[("peaks", "memory_gib")] = round(m.torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
    else:
        figures.pop(("peaks", "memory_gib"), None)
    when = datetime.date.today().isoformat()
    name = gpu_name or m.name
    profile = GpuProfile(gpu=name, source="measured", figures=figures, description=(
        f"measured by blis profile {__version__} on {m.name} ({m.device}, {m.dtype_name}, torch "
        f"{m.torch.__version__}) on {when}; peaks: "
        + ("given" if peak_tflops else "the best GEMM rate measured") + " FLOP/s, "
        + ("given" if peak_bandwidth_tbs else "the best copy rate measured") + " bandwidth; "
        "interconnect: the H100 profile's, not measured"))
    profile = _fit_gemm(profile, points, abytes)

    rows = []
    models = {}
    for j, dims in enumerate(plan.step_models):
        name = f"profile-model-{j}"
        models[name] = model_config_from_hf(HFConfig(raw=dims.to_config(m.dtype_name)))
        weights = weights_for(m, dims)
        for prefill, ctx, decodes, decode_ctx in plan.step_cases:
            seconds = time_step(m, timer, dims, weights, (prefill, ctx, decodes, decode_ctx))
            rows.append(dict(model=name, prefill_tokens=prefill, prefill_ctx=ctx,
                             decode_batch=decodes, decode_ctx=decode_ctx,
                             us_median=seconds * 1e6))
            progress.advance(1)
        del weights
    progress.close()
    profile = fit_profile_to_steps(profile, rows, models)
    data = profile.to_dict()
    for section in ("attention", "elementwise", "fixed_us"):
        data[section] = {k: round(v, 4) for k, v in data[section].items()}
    return ProfileRun(profile=profile_from_dict(data, "measured"), gemm_points=points,
                      step_rows=rows, models=models)


def plot_gemm_fit(run: ProfileRun, path: str) -> None:
    """Measured vs fitted GEMM efficiency (achieved / peak FLOP/s) by token count, one line per
    shape, to a PNG."""
    import matplotlib  # optional: only --plot needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    abytes = next(iter(run.models.values())).bytes_per_param if run.models else 2.0
    p = _gemm_params(run.profile, abytes)
    peak = p[PF.PF_PEAK_FLOPS]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for n, k in sorted({(n, k) for _, n, k, _ in run.gemm_points}):
        pts = sorted((t, s) for t, nn, kk, s in run.gemm_points if (nn, kk) == (n, k))
        tokens = [t for t, _ in pts]
        measured = [2 * t * n * k / s / peak for t, s in pts]
        fitted = [2 * t * n * k / PF.gemm_seconds(p, t, n, k) / peak for t in tokens]
        line = ax.plot(tokens, measured, "o", label=f"N={n} K={k} measured")[0]
        ax.plot(tokens, fitted, "-", color=line.get_color(), label=f"N={n} K={k} fitted")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens (M)")
    ax.set_ylabel("achieved / peak FLOP/s")
    ax.set_title(f"GEMM efficiency: {run.profile.gpu}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120, format="png")
    plt.close(fig)
