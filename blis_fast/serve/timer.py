"""A wake-up at an exact monotonic instant for an asyncio loop: a Linux ``timerfd`` watched by
the loop's selector.

Why: ``blis serve`` paces each token at the wall-clock instant of its simulated time. asyncio's
own timers (``call_later``) reach the selector as a timeout that ``epoll`` rounds up to whole
milliseconds, so they fire up to 1 ms late; at ``--speed 20`` that is 20 simulated ms. The time
loop used to yield in a busy loop through its last millisecond instead, which kept one core
busy whenever a request was in flight: on a shared 2-core machine that core is the client's.
A ``timerfd`` armed at the absolute instant wakes ``epoll`` on the kernel's high-resolution
timer (tens of µs late, no CPU meanwhile). Linux only, through ``ctypes`` (the ``os`` module
has no timerfd before Python 3.13); :func:`open_timer` returns None elsewhere and the caller
keeps its fallback.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import math
import os
import sys
from collections.abc import Callable

CLOCK_MONOTONIC = 1  # time.monotonic()'s clock on Linux
TFD_NONBLOCK = os.O_NONBLOCK
TFD_CLOEXEC = 0o2000000
TFD_TIMER_ABSTIME = 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


class PreciseTimer:
    """One ``timerfd`` on ``loop``: :meth:`arm` at a ``time.monotonic()`` instant calls
    ``callback`` (on the loop) once it has passed; arming again replaces the instant."""

    def __init__(self, loop: asyncio.AbstractEventLoop, callback: Callable[[], None],
                 libc: ctypes.CDLL, fd: int) -> None:
        self._loop = loop
        self._callback = callback
        self._settime = libc.timerfd_settime
        self._fd = fd
        self._spec = _Itimerspec()
        loop.add_reader(fd, self._fired)

    def arm(self, when: float) -> None:
        """Fire at monotonic time ``when`` (seconds; at once if it has passed)."""
        ns = max(1, math.ceil(when * 1e9))  # a zero it_value would disarm the timer
        value = self._spec.it_value
        value.tv_sec, value.tv_nsec = divmod(ns, 1_000_000_000)
        if self._settime(self._fd, TFD_TIMER_ABSTIME, ctypes.byref(self._spec), None) != 0:
            raise OSError(ctypes.get_errno(), "timerfd_settime failed")

    def _fired(self) -> None:
        with contextlib.suppress(BlockingIOError, InterruptedError):
            os.read(self._fd, 8)  # the expiration count: read, so the fd is quiet again
        self._callback()

    def close(self) -> None:
        """Stop watching the timer and release it."""
        with contextlib.suppress(Exception):
            self._loop.remove_reader(self._fd)
        with contextlib.suppress(OSError):
            os.close(self._fd)


def open_timer(loop: asyncio.AbstractEventLoop,
               callback: Callable[[], None]) -> PreciseTimer | None:
    """A :class:`PreciseTimer` on ``loop``, or None where there is no timerfd (not Linux, a
    libc without it, a loop that cannot watch file descriptors)."""
    if not sys.platform.startswith("linux"):
        return None
    fd = -1
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.timerfd_create.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.timerfd_settime.argtypes = [ctypes.c_int, ctypes.c_int,
                                         ctypes.POINTER(_Itimerspec), ctypes.c_void_p]
        fd = libc.timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC)
        if fd < 0:
            return None
        return PreciseTimer(loop, callback, libc, fd)
    except (OSError, AttributeError, NotImplementedError, ValueError):
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)
        return None


__all__ = ["PreciseTimer", "open_timer"]
