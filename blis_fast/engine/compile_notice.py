"""Tell the user, before it happens, that a cold start is compiling the Numba kernels."""

from __future__ import annotations

import logging

log = logging.getLogger("blis_fast")


def _has_cached_overload(dispatcher) -> bool:
    """True when Numba's on-disk cache holds a current compiled version of ``dispatcher``."""
    try:
        if dispatcher.overloads:
            return True
        return bool(dispatcher._cache._cache_file._load_index())
    except Exception:  # noqa: BLE001 - a private Numba API; no notice rather than a crash
        return True


def notify_if_compiling() -> None:
    """Log one warning line when the simulation or workload kernels must be compiled first."""
    from blis_fast.kernels.engine import simulate
    from blis_fast.workload.generator import _generate_kernel

    if not all(_has_cached_overload(d) for d in (simulate, _generate_kernel)):
        log.warning("compiling the simulation kernels (first run after install or upgrade; "
                    "this takes about a minute, later runs start at once)")
