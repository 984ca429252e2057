"""Sweeps: many ``blis run`` configurations from one spec, run in parallel, stored as Parquet.

``spec`` parses, expands and validates a sweep spec; ``run`` drives a sweep (``execute`` runs
the tasks locally or on Ray, ``worker`` is what a task runs, ``store`` writes the output
directory, ``progress`` reports); ``saturate`` bisects the highest rate meeting an SLO;
``plot`` draws a sweep's results; ``cli`` holds the ``blis sweep|saturate|plot`` commands.
"""

from __future__ import annotations

__all__ = ["find_saturation", "load_sweep_plan", "run_sweep"]


def run_sweep(*args, **kwargs):
    """Run a sweep spec into an output directory; see :func:`blis_fast.sweep.run.run_sweep`."""
    from blis_fast.sweep.run import run_sweep as _run_sweep

    return _run_sweep(*args, **kwargs)


def load_sweep_plan(*args, **kwargs):
    """Parse, expand and validate a sweep spec; see :func:`blis_fast.sweep.spec.load_sweep_plan`."""
    from blis_fast.sweep.spec import load_sweep_plan as _load

    return _load(*args, **kwargs)


def find_saturation(*args, **kwargs):
    """Bisect the saturation rate per configuration; see
    :func:`blis_fast.sweep.saturate.find_saturation`."""
    from blis_fast.sweep.saturate import find_saturation as _find

    return _find(*args, **kwargs)
