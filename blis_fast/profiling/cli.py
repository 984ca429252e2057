"""``blis profile``: the click command (the work is ``profiler.py``)."""

from __future__ import annotations

import json
import sys

import click

from blis_fast.errors import BlisInputError
from blis_fast.files import OutputPlan

__all__ = ["profile_command", "register"]


@click.command("profile")
@click.option("--out", "out_path", required=True, metavar="FILE",
              help="write the measured GPU profile (JSON) here; --gpu-profile reads it")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto",
              show_default=True, help="what to profile (auto: the CUDA GPU if there is one)")
@click.option("--quick", is_flag=True, help="tiny shapes (the CPU always uses them)")
@click.option("--reps", type=click.IntRange(3, 1000), default=None,
              help="timed repetitions of each measurement (median kept)  [default: 9 on the "
                   "CPU, 15 on a GPU]")
@click.option("--gpu-name", default="", metavar="NAME",
              help="the profile's GPU name (default: the device's)")
@click.option("--peak-tflops", type=click.FloatRange(0, min_open=False), default=0.0,
              metavar="FLOAT", help="datasheet dense BF16 TFLOP/s  [default: the best measured]")
@click.option("--peak-bandwidth-tbs", type=click.FloatRange(0), default=0.0, metavar="FLOAT",
              help="datasheet memory bandwidth, TB/s  [default: the best measured]")
@click.option("--plot", "plot_path", default=None, metavar="FILE",
              help="also draw measured vs fitted GEMM efficiency (PNG)")
def profile_command(out_path: str, device: str, quick: bool, reps: int | None, gpu_name: str,
                    peak_tflops: float, peak_bandwidth_tbs: float, plot_path: str | None) -> None:
    """Measure a GPU profile of this machine for --latency-model profiled (GEMM, copy and
    forward-step timings with PyTorch, the [profile] extra; see docs/latency-profiled.md)."""
    import importlib.util  # lazy: blis --help must stay light

    if importlib.util.find_spec("torch") is None:
        raise BlisInputError("blis profile needs PyTorch: pip install 'blis_fast[profile]'")
    if device == "cuda":
        import torch  # optional dependency, checked above

        if not torch.cuda.is_available():
            raise BlisInputError("--device cuda: PyTorch sees no CUDA GPU here")
    with OutputPlan() as plan:
        plan.check_file(out_path, "--out")
        if plot_path:
            plan.check_file(plot_path, "--plot")
        # lazy: PyTorch, SciPy and the kernels load only for this command
        from blis_fast.profiling.profiler import plot_gemm_fit, run_profile

        run = run_profile(device=device, quick=quick, reps=reps, gpu_name=gpu_name,
                          peak_tflops=peak_tflops, peak_bandwidth_tbs=peak_bandwidth_tbs)
        plan.stage_text(out_path, "--out", json.dumps(run.profile.to_dict(), indent=2) + "\n")
        if plot_path:
            plan.stage(plot_path, "--plot", lambda tmp: plot_gemm_fit(run, tmp))
        plan.commit()
    sys.stderr.write(f"blis profile: wrote {out_path} (GPU {run.profile.gpu})\n")


def register(main_group: click.Group) -> None:
    """Add ``profile`` to the ``blis`` command group."""
    main_group.add_command(profile_command)
