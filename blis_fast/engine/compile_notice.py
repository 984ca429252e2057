"""Tell the user, before it happens, that a cold start is compiling the Numba kernels."""

from __future__ import annotations

import logging
import subprocess
import sys

log = logging.getLogger("blis_fast")


def _has_cached_overload(dispatcher, fits=lambda signature: True) -> bool:
    """True when Numba's on-disk cache holds a current compiled version of ``dispatcher`` for
    a signature (a tuple of argument types) that ``fits``: an entry whose whole key is the one
    Numba would look up (this code, this machine, these kernel sources), not a stale one."""
    try:
        if any(fits(tuple(signature)) for signature in dispatcher.overloads):
            return True  # loaded in this process already (a sweep's later runs)
        cache = dispatcher._cache
        codegen = dispatcher.targetctx.codegen()
        return any(fits(tuple(key[0])) and key == cache._index_key(key[0], codegen)
                   for key in cache._cache_file._load_index())
    except Exception:  # noqa: BLE001 - a private Numba API; no notice rather than a crash
        return True


def engine_variant(pd: bool, autoscaled: bool | None = None):
    """Whether a signature of the event loop is the variant with or without P/D (``pd``) and
    the autoscaler (``autoscaled``; None: either): their arguments are None without them."""
    from numba.core import types

    from blis_fast.kernels.event_loop import ASC_ARGUMENT, PD_ARGUMENT

    return lambda signature: ((signature[PD_ARGUMENT] != types.none) == pd
                              and (autoscaled is None
                                   or (signature[ASC_ARGUMENT] != types.none) == autoscaled))


_engine_warmup: subprocess.Popen | None = None
_announced = False


def _announce() -> None:
    """The notice, once per process."""
    global _announced
    if not _announced:
        _announced = True
        log.warning("compiling the simulation kernels (first run after install or upgrade, "
                    "or a new kind of run; this takes 20-40 s, later runs start at once)")


def announce_if_compiling(dispatcher, fits) -> None:
    """The notice, when ``dispatcher`` must compile for a signature that ``fits`` (a kernel
    whose variant is known only once its arguments are, as the generator's)."""
    if not _has_cached_overload(dispatcher, fits):
        _announce()


def notify_if_compiling(pd: bool = False) -> None:
    """Log one warning line when the simulation or workload kernels must be compiled first,
    and start compiling the engine (its P/D variant with ``pd``) in a second process while
    this one compiles the engine's parts the second would reach last, then the workload
    kernels (``engine/warmup.py``)."""
    global _engine_warmup
    from blis_fast.kernels.event_loop import run_events
    from blis_fast.kernels.generation import generate_kernel

    engine_ready = _has_cached_overload(run_events, engine_variant(pd))
    if engine_ready and _has_cached_overload(generate_kernel):
        return
    _announce()
    if not engine_ready and _engine_warmup is None:
        _engine_warmup = subprocess.Popen(
            [sys.executable, "-m", "blis_fast.engine.warmup"] + (["--pd"] if pd else []),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        from blis_fast.engine.warmup import compile_late_engine_parts

        try:
            compile_late_engine_parts(pd)  # what the second process would compile last
        except Exception:  # noqa: BLE001 - a head start only: the second process compiles it all
            log.debug("compiling the late engine parts failed", exc_info=True)


def wait_for_engine_compile() -> None:
    """Before the first simulation: let the second process finish writing the engine cache
    (compiling meanwhile what only the Python side calls, when buffers grow)."""
    global _engine_warmup
    if _engine_warmup is not None:
        from blis_fast.engine.warmup import compile_python_called_engine_parts

        try:
            compile_python_called_engine_parts()
        except Exception:  # noqa: BLE001 - a head start only: the run compiles what it needs
            log.debug("compiling the engine's growth kernels failed", exc_info=True)
        _engine_warmup.wait()
        _engine_warmup = None
