"""blis_fast: a fast, deterministic discrete-event simulator of LLM inference serving clusters.

A NumPy/Numba re-implementation of BLIS (inference-sim/inference-sim) that reproduces the
reference's numbers for the same inputs. Start with :func:`blis_fast.run` or the ``blis`` CLI;
:func:`blis_fast.step_time` gives the latency model's time of one engine step of a batch.
"""

from __future__ import annotations

from blis_fast.errors import BlisConfigError, BlisError, BlisInputError, BlisRuntimeError
from blis_fast.version import __version__

__all__ = ["BlisConfigError", "BlisError", "BlisInputError", "BlisRuntimeError", "rerun", "run",
           "step_time", "__version__"]


def run(**options):
    """Run one simulation with the options of ``blis run``; see :func:`blis_fast.api.run`."""
    from blis_fast.api import run as _run  # lazy: import blis_fast must not load numba

    return _run(**options)


def step_time(**options):
    """The latency model's time (µs) of one engine step of ``batch=[(progress, new_tokens,
    input_len, output_len), ...]`` (or a list for ``batches=``), resolved as ``blis run`` with
    the same options resolves it; see :func:`blis_fast.api.step_time`."""
    from blis_fast.api import step_time as _step_time  # lazy: import blis_fast must not load numba

    return _step_time(**options)


def rerun(path, **overrides):
    """Re-run the simulation that wrote a Parquet file, from the options its metadata records;
    see :func:`blis_fast.api.rerun`."""
    from blis_fast.api import rerun as _rerun  # lazy: import blis_fast must not load numba

    return _rerun(path, **overrides)
