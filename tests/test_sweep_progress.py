"""Sweep progress: done/total, rate and ETA; a redrawn bar on a terminal, throttled lines else."""

from __future__ import annotations

import io

from blis_fast.sweep.progress import Progress, format_duration


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_plain_lines_every_interval_with_rate_and_eta():
    clock, out = FakeClock(), io.StringIO()
    bar = Progress(100, 20, out, line_interval_s=5.0, clock=clock)
    clock.now += 1
    bar.advance(10)  # first report at once
    clock.now += 1
    bar.advance(10)  # 1 s after the last line: quiet
    clock.now += 4
    bar.advance(20, errors=2)  # 5 s after: a line
    bar.close()
    lines = out.getvalue().splitlines()
    assert lines == [
        "sweep: 30/100 configs, 10.0/s, elapsed 1s, ETA 7s",
        "sweep: 60/100 configs, 6.7/s, elapsed 6s, ETA 6s, 2 failed",
        "sweep: 60/100 configs, 6.7/s, elapsed 6s, ETA 6s, 2 failed",
    ]


def test_terminal_bar_is_redrawn_in_place():
    clock, out = FakeClock(), Tty()
    bar = Progress(8, 0, out, clock=clock)
    clock.now += 2
    bar.advance(4)
    clock.now += 2
    bar.advance(4)
    bar.close()
    text = out.getvalue()
    assert text.count("\r") == 3 and text.endswith("\n") and text.count("\n") == 1
    assert "\rsweep [############............] 4/8 configs, 2.0/s, elapsed 2s, ETA 2s\x1b[K" in text
    assert "[########################] 8/8 configs" in text


def test_durations():
    assert [format_duration(s) for s in (0, 5.4, 65, 3725)] == ["0s", "5s", "1:05", "1:02:05"]
