"""CPU time the rest of the machine took while a real server was being measured (Linux).

A latency measurement on a shared 2-core machine says as much about the other jobs as about
the server. The real-server fit check uses this to tell a clean segment from one taken while
something else ran: busy time of every CPU (``/proc/stat``) minus the CPU of this process and
its descendants (the client and the vLLM server it started), over the segment's wall time.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

_PROC = Path("/proc")
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _machine_busy_s() -> float:
    """Busy seconds of all CPUs since boot: every /proc/stat column except idle and iowait."""
    fields = (_PROC / "stat").read_text().splitlines()[0].split()[1:]
    ticks = [int(v) for v in fields]
    # user nice system idle iowait irq softirq steal [guest guest_nice: already in user/nice]
    busy = ticks[0] + ticks[1] + ticks[2] + ticks[5] + ticks[6] + (ticks[7] if len(ticks) > 7
                                                                     else 0)
    return busy / _TICKS


def _tree_cpu_s(root_pid: int) -> float:
    """User+system seconds of ``root_pid`` and its live descendants (their own, not reaped)."""
    parent_of: dict[int, int] = {}
    cpu_of: dict[int, float] = {}
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        rest = stat[stat.rfind(")") + 2:].split()  # after "pid (comm) "
        pid = int(entry.name)
        parent_of[pid] = int(rest[1])
        # utime stime cutime cstime: the children's fields cover descendants that exited
        cpu_of[pid] = sum(int(v) for v in rest[11:15]) / _TICKS
    tree = {root_pid}
    grew = True
    while grew:
        grew = False
        for pid, ppid in parent_of.items():
            if ppid in tree and pid not in tree:
                tree.add(pid)
                grew = True
    return sum(cpu_of.get(pid, 0.0) for pid in tree)


class ForeignCpu:
    """Measure the CPU other processes used between ``start()`` and ``share()``.

    ``share()`` is that CPU time over the elapsed wall time, in cores (0.5 = half a core busy
    with something else the whole time). Only meaningful on Linux; elsewhere it reports 0.
    """

    def __init__(self) -> None:
        self.available = (_PROC / "stat").exists()
        self._t0 = self._busy0 = self._own0 = 0.0

    def _own(self) -> float:
        return _tree_cpu_s(os.getpid())

    def start(self) -> None:
        self._t0 = time.perf_counter()
        if self.available:
            self._busy0 = _machine_busy_s()
            self._own0 = self._own()

    def share(self) -> float:
        wall = time.perf_counter() - self._t0
        if not self.available or wall <= 0:
            return 0.0
        foreign = (_machine_busy_s() - self._busy0) - (self._own() - self._own0)
        return max(foreign, 0.0) / wall
