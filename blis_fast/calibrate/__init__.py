"""``blis calibrate``: hold the simulator's per-request predictions against an observed trace.

Inputs are a trace written by ``blis observe`` (header + CSV), the SimResult list of a
``blis replay --results-path`` of that trace and optionally the ``--record-itl`` chunk file.
:func:`calibrate` pairs them by request id and computes the report of the adopted reference
(CAL-1..CAL-5): per metric means, percentiles, MAPE, Pearson r, bias and a quality grade.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Calibration", "calibrate", "plot_calibration", "report_text", "summary_lines"]

# Public names and their modules, imported on first use so that ``blis --help`` and the other
# subcommands do not load NumPy and the trace loader.
_LAZY = {
    "Calibration": "blis_fast.calibrate.calibration",
    "calibrate": "blis_fast.calibrate.calibration",
    "plot_calibration": "blis_fast.calibrate.plot",
    "report_text": "blis_fast.calibrate.report",
    "summary_lines": "blis_fast.calibrate.report",
}


def __getattr__(name: str) -> Any:
    import importlib

    if name not in _LAZY:
        raise AttributeError(f"module 'blis_fast.calibrate' has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)
