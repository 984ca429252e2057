"""The Python API: ``blis_fast.run(...)`` takes the options of ``blis run`` as keyword arguments."""

from __future__ import annotations

from typing import Any

from blis_fast.options import build_options
from blis_fast.runner import RunResult, execute_run


def run(**options: Any) -> RunResult:
    """Run one simulation, exactly as ``blis run`` with the same options would.

    Keyword names are the CLI flags with ``_`` for ``-`` (``num_requests=1000``,
    ``latency_model="blackbox"``); values are Python numbers, strings or sequences. Options not
    given take the CLI defaults. Files are written only when asked for (``metrics_path``,
    ``trace_output``, ``output_dir``). Raises ``BlisConfigError``/``BlisInputError`` on bad input.
    """
    return execute_run(build_options(options))
