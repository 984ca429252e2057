"""Sweep progress on stderr: a redrawn bar on a terminal, a plain line every few seconds otherwise.

Shows configurations done / total, the rate of this run and the time left at that rate.
"""

from __future__ import annotations

import time
from typing import TextIO

__all__ = ["Progress", "format_duration"]

BAR_WIDTH = 24


def format_duration(seconds: float) -> str:
    """``1:02:03``, ``2:03`` or ``5s``."""
    s = int(round(seconds))
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    if h:
        return f"{h}:{m:02d}:{s:02d}"
    return f"{m}:{s:02d}" if m else f"{s}s"


class Progress:
    """Counts finished configurations and reports them on ``stream``."""

    def __init__(self, total: int, done: int, stream: TextIO | None, label: str = "sweep",
                 line_interval_s: float = 5.0, clock=time.monotonic, unit: str = "configs") -> None:
        self.total = total
        self.unit = unit
        self.done = done
        self.errors = 0
        self.stream = stream
        self.label = label
        self.clock = clock
        self.is_tty = bool(stream is not None and getattr(stream, "isatty", lambda: False)())
        self.interval = 0.1 if self.is_tty else line_interval_s
        self._start = clock()
        self._start_done = done
        self._last = -1e18

    def advance(self, n: int, errors: int = 0) -> None:
        """``n`` more configurations finished, ``errors`` of them failed."""
        self.done += n
        self.errors += errors
        now = self.clock()
        if now - self._last >= self.interval:
            self._last = now
            self._emit(final=False)

    def close(self) -> None:
        """Print the final state (and end the bar's line)."""
        self._emit(final=True)

    def line(self) -> str:
        """The current status text."""
        elapsed = max(self.clock() - self._start, 1e-9)
        ran = self.done - self._start_done
        rate = ran / elapsed
        left = self.total - self.done
        eta = format_duration(left / rate) if rate > 0 else "?"
        errs = f", {self.errors} failed" if self.errors else ""
        text = (f"{self.done}/{self.total} {self.unit}, {rate:.1f}/s, "
                f"elapsed {format_duration(elapsed)}, ETA {eta}{errs}")
        if self.is_tty:
            filled = BAR_WIDTH * self.done // max(self.total, 1)
            return f"{self.label} [{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {text}"
        return f"{self.label}: {text}"

    def _emit(self, final: bool) -> None:
        if self.stream is None:
            return
        if self.is_tty:
            self.stream.write("\r" + self.line() + "\x1b[K" + ("\n" if final else ""))
        else:
            self.stream.write(self.line() + "\n")
        self.stream.flush()
