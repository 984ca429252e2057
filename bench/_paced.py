"""``python bench/_paced.py LAGS ARGS...``: ``blis ARGS...`` (``blis serve``) with its time loop
timed: for every token the server tells a stream, how long after the token's wall-clock
instant the loop had handed it on (written to the socket for a live stream, queued for its
handler otherwise), as a JSON list of µs in LAGS when the command ends
(``serve_bench.py --server-lag``). The split between the server's lag and the client's.
Also recorded: every garbage collection's generation and pause (µs) once serving has begun,
under the key ``gc``, and the monotonic instant the simulated clock read 0 (``clock0``: with it
a client on the same machine tells how long its request took to be stamped as arrived)."""

import gc
import json
import sys
import time

from blis_fast.cli import main
from blis_fast.serve import app

LAGS: list[int] = []
PAUSES: list[tuple[int, int]] = []
_started = [0.0]


_serving = [False]  # collections before the first hand-off are start-up's, not counted


def _gc_timer(phase: str, info: dict) -> None:
    if phase == "start":
        _started[0] = time.perf_counter()
    elif _serving[0]:
        PAUSES.append((info["generation"], int((time.perf_counter() - _started[0]) * 1e6)))


def _timed(dispatch):
    def run(self, emitted):
        _serving[0] = True
        dispatch(self, emitted)
        done = time.monotonic()
        for e in emitted:
            for t in e.tokens:
                LAGS.append(int((done - self.wall_of(t)) * 1e6))
    return run


CLOCK: list[float] = []  # the monotonic instant the simulated clock read 0


def _clocked(start):
    async def run(self):
        await start(self)
        CLOCK.append(self._start)
    return run


if __name__ == "__main__":
    out = sys.argv.pop(1)
    app.LiveServer._dispatch = _timed(app.LiveServer._dispatch)
    app.LiveServer.start = _clocked(app.LiveServer.start)
    gc.callbacks.append(_gc_timer)
    try:
        main(sys.argv[1:])
    except SystemExit:
        pass
    finally:
        with open(out, "w") as fh:
            json.dump({"lags": LAGS, "gc": PAUSES, "clock0": CLOCK[-1] if CLOCK else None}, fh)
