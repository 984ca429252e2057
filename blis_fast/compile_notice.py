"""Tell the user, before it happens, that a cold start is compiling the Numba kernels, and let
a run wait for a compile started in the background (``engine/warmup.py`` registers it).

A leaf: the generator and the engine both announce through it, and neither needs the other or
the warm-up process for that."""

from __future__ import annotations

import logging
from collections.abc import Callable

log = logging.getLogger("blis_fast")


def has_cached_overload(dispatcher, fits=lambda signature: True) -> bool:
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


_background_compile: Callable[[], None] | None = None
_announced = False


def announce() -> None:
    """The notice, once per process."""
    global _announced
    if not _announced:
        _announced = True
        log.warning("compiling the simulation kernels (first run after install or upgrade, "
                    "or a new kind of run; this takes 20-40 s, later runs start at once)")


def announce_if_compiling(dispatcher, fits) -> None:
    """The notice, when ``dispatcher`` must compile for a signature that ``fits`` (a kernel
    whose variant is known only once its arguments are, as the generator's)."""
    if not has_cached_overload(dispatcher, fits):
        announce()


def start_background_compile(finish: Callable[[], None]) -> None:
    """Remember how to finish a compile running in the background (another process): the
    next :func:`finish_background_compile` calls ``finish`` once."""
    global _background_compile
    _background_compile = finish


def finish_background_compile() -> None:
    """Before the first simulation (or the sweep's first task): let the background compile
    finish writing the kernel cache, if one was started."""
    global _background_compile
    finish, _background_compile = _background_compile, None
    if finish is not None:
        finish()
