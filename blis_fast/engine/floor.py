"""The physical-floor guard's one warning: steps a latency backend timed below their physical
floor (their FLOPs at the GPU's peak FLOP/s or their bytes at its peak bandwidth, every weight
matrix the model has; ``kernels/engine/latency_profiled.py: step_floor_us``), counted by the
engine per instance."""

from __future__ import annotations

from typing import Any

__all__ = ["floor_warning"]


def floor_warning(res: Any, backend: str) -> str | None:
    """One line naming the backend, how many steps fell below their floor and the worst ratio;
    None when none did (stdout is never changed)."""
    below = res.instance_count("BELOW_FLOOR")
    count = int(below.sum())
    if count == 0:
        return None
    worst = int(res.instance_count("FLOOR_WORST_PPM")[below > 0].min()) / 1e6
    steps = int(res.instance_count("STEPS").sum())
    return (f"--latency-model {backend}: {count} of {steps} steps took less than their physical "
            f"floor (the step's FLOPs at the GPU's peak FLOP/s or its bytes at peak bandwidth; "
            f"worst {worst:.2f}x of it): this backend undercounts the work there; "
            "--latency-model profiled never does")
