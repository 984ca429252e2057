"""``blis serve``'s precise timer (``serve.timer``): a Linux timerfd on the event loop, so the
time loop wakes at a token's instant without the selector's millisecond rounding and without
spinning."""

from __future__ import annotations

import asyncio
import sys
import time

import pytest

from blis_fast.serve.timer import open_timer

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="timerfd is Linux's (elsewhere the loop spins its last ms)")


def test_fires_never_before_its_instant_and_rearming_replaces_it():
    async def main() -> tuple[list[float], list[float]]:
        loop = asyncio.get_running_loop()
        fired: list[float] = []
        woke = asyncio.Event()

        def tick() -> None:
            fired.append(time.monotonic())
            woke.set()

        timer = open_timer(loop, tick)
        assert timer is not None
        late = []
        try:
            for i in range(20):
                target = time.monotonic() + 0.001 + i * 1e-4
                woke.clear()
                timer.arm(target)
                await woke.wait()
                late.append(fired[-1] - target)
            # armed far, then re-armed near: fires once, at the near instant
            fired.clear()
            woke.clear()
            timer.arm(time.monotonic() + 5.0)
            near = time.monotonic() + 0.005
            timer.arm(near)
            await asyncio.wait_for(woke.wait(), 2.0)
            await asyncio.sleep(0.05)
            near_fired = list(fired)
            # an instant already past fires at once
            woke.clear()
            timer.arm(time.monotonic() - 1.0)
            await asyncio.wait_for(woke.wait(), 2.0)
        finally:
            timer.close()
        return late, [t - near for t in near_fired]

    late, near = asyncio.run(main())
    assert min(late) >= 0  # the kernel's clock is time.monotonic()'s: never early
    assert len(near) == 1 and near[0] >= 0


def test_a_closed_timer_is_quiet():
    async def main() -> int:
        loop = asyncio.get_running_loop()
        calls = []
        timer = open_timer(loop, lambda: calls.append(1))
        assert timer is not None
        timer.arm(time.monotonic() + 0.002)
        timer.close()
        await asyncio.sleep(0.02)
        return len(calls)

    assert asyncio.run(main()) == 0
