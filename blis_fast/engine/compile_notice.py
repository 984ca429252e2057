"""Tell the user, before it happens, that a cold start is compiling the Numba kernels."""

from __future__ import annotations

import logging
import subprocess
import sys

log = logging.getLogger("blis_fast")


def _has_cached_overload(dispatcher) -> bool:
    """True when Numba's on-disk cache holds a current compiled version of ``dispatcher``."""
    try:
        if dispatcher.overloads:
            return True
        return bool(dispatcher._cache._cache_file._load_index())
    except Exception:  # noqa: BLE001 - a private Numba API; no notice rather than a crash
        return True


_engine_warmup: subprocess.Popen | None = None


def notify_if_compiling() -> None:
    """Log one warning line when the simulation or workload kernels must be compiled first,
    and start compiling the engine in a second process (it is independent of the workload
    kernels this process compiles next); this process first compiles the engine's parts the
    second would reach last (``engine/warmup.py``)."""
    global _engine_warmup
    from blis_fast.kernels.event_loop import run_events
    from blis_fast.kernels.generation import generate_kernel

    engine_ready = _has_cached_overload(run_events)
    if engine_ready and _has_cached_overload(generate_kernel):
        return
    log.warning("compiling the simulation kernels (first run after install or upgrade; "
                "this takes 30-60 s, later runs start at once)")
    if not engine_ready and _engine_warmup is None:
        _engine_warmup = subprocess.Popen(
            [sys.executable, "-m", "blis_fast.engine.warmup"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        from blis_fast.engine.warmup import compile_late_engine_parts

        try:
            compile_late_engine_parts()  # what the second process would compile last
        except Exception:  # noqa: BLE001 - a head start only: the second process compiles it all
            log.debug("compiling the late engine parts failed", exc_info=True)


def wait_for_engine_compile() -> None:
    """Before the first simulation: let the second process finish writing the engine cache."""
    global _engine_warmup
    if _engine_warmup is not None:
        _engine_warmup.wait()
        _engine_warmup = None
