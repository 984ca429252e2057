"""``blis fit``: fit a latency backend's coefficients to observed traces by simulation.

Every candidate set of coefficients is scored by replaying the observed traces in-process and
pairing the simulated requests with the observed ones exactly as ``blis calibrate`` does, so
the loss reported here and the MAPE of ``blis calibrate`` on the fitted model are the same.
"""

from __future__ import annotations

from typing import Any

__all__ = ["FitResult", "FitTrace", "fit", "load_fit_trace"]

_LAZY = {
    "FitResult": "blis_fast.fit.optimize",
    "fit": "blis_fast.fit.optimize",
    "FitTrace": "blis_fast.fit.problem",
    "load_fit_trace": "blis_fast.fit.problem",
}


def __getattr__(name: str) -> Any:
    import importlib

    if name not in _LAZY:
        raise AttributeError(f"module 'blis_fast.fit' has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)
