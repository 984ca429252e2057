"""Sweeps: many ``blis run`` configurations from one spec, run in parallel, stored as Parquet.

``spec`` parses, expands and validates a sweep spec; ``run`` drives a sweep (``execute`` runs
the tasks locally or on Ray, ``worker`` is what a task runs, ``store`` writes the output
directory, ``progress`` reports); ``saturate`` bisects the highest rate meeting an SLO;
``plot`` draws a sweep's results; ``cli`` holds the ``blis sweep|saturate|plot`` commands.

``run_sweep``, ``load_sweep_plan`` and ``find_saturation`` are importable from here; they are
loaded on first use, so ``blis`` does not import pyarrow and polars just to list its commands.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["BACKENDS", "find_saturation", "load_sweep_plan", "run_sweep"]

BACKENDS = ("local", "ray")
"""Where sweep tasks run (``--backend``); here so the CLI does not import the executor
(``concurrent.futures.process`` and ``multiprocessing``: 30 ms of every ``blis`` start)."""

_HOMES = {"run_sweep": "blis_fast.sweep.run", "load_sweep_plan": "blis_fast.sweep.spec",
          "find_saturation": "blis_fast.sweep.saturate"}


def __getattr__(name: str) -> Any:
    """The public functions, imported from their modules on first access (PEP 562)."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'blis_fast.sweep' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
