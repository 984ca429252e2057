"""The memory a run may use: what the machine can give this process now, capped.

The runner refuses configurations whose up-front arrays exceed it (``runner._check_memory``);
the engine refuses to grow the step log or the event heap past it (``simulate._check_growth``).
"""

from __future__ import annotations

import os

MEMORY_LIMIT_BYTES = 64 << 30
"""Refuse configurations whose up-front arrays alone would need more memory than this."""

def available_memory() -> int:
    """Bytes of memory the machine can give this process now (MemAvailable), capped at
    MEMORY_LIMIT_BYTES."""
    avail = 0
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    if avail <= 0:
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError):
            avail = MEMORY_LIMIT_BYTES
    return min(avail, MEMORY_LIMIT_BYTES)
