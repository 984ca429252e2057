"""User policy hooks: the signatures of custom routing scorers, admission rules and scheduler
keys, and the built-in no-op implementations.

A hook is a Numba ``cfunc`` of one of the signatures below. The kernels take the three hooks
as first-class function arguments (``numba.types.FunctionType``), so one compiled, cached
kernel serves the built-in policies and any user function alike; a hook is only called when
its policy is selected (``custom`` scorer, admission policy or scheduler).

Scorer ``void(snapshots, request, out)``
    ``snapshots`` float64[n_instances, SNAP_COLS] — one row per instance, columns SNAP_*;
    ``request`` float64[REQ_COLS] — columns REQ_*; write one score per instance into
    ``out`` (values are clamped to [0, 1] and weighted like every built-in scorer).
Admission ``boolean(snapshots, request)``
    return True to admit the request.
Scheduler key ``float64(features)``
    ``features`` float64[KEY_COLS] — columns KEY_*, for a queued request at step time; the
    wait queue is stably sorted by (key ascending, arrival, request id) every step.
None of them is shown a request's output length (the reference's oracle boundary, INV-9).
"""

from __future__ import annotations

from numba import types

from blis_fast.kernels.jit import cfunc  # with the kernels' LLVM settings, before these compile

SNAP_QUEUE, SNAP_BATCH, SNAP_IN_FLIGHT, SNAP_KV_UTIL, SNAP_FREE_BLOCKS, SNAP_CACHED_BLOCKS, \
    SNAP_PREEMPTIONS = range(7)
SNAP_COLS = 7
REQ_INPUT_LEN, REQ_CLOCK, REQ_ARRIVAL, REQ_SLO_PRIORITY, REQ_INPUT_BLOCKS, REQ_INDEX = range(6)
REQ_COLS = 6
KEY_INPUT_LEN, KEY_ARRIVAL, KEY_WAIT, KEY_PRIORITY, KEY_SLO_PRIORITY, KEY_MAX_OUTPUT = range(6)
KEY_COLS = 6

SCORER_SIG = types.void(types.float64[:, ::1], types.float64[::1], types.float64[::1])
ADMISSION_SIG = types.boolean(types.float64[:, ::1], types.float64[::1])
SCHEDULER_KEY_SIG = types.float64(types.float64[::1])


@cfunc(SCORER_SIG, cache=True)
def no_scorer(snapshots, request, out):  # pragma: no cover - never called
    """Placeholder scorer: every instance scores 0."""
    for i in range(out.shape[0]):
        out[i] = 0.0


@cfunc(ADMISSION_SIG, cache=True)
def admit_all(snapshots, request):  # pragma: no cover - never called
    """Placeholder admission rule: admit."""
    return True


@cfunc(SCHEDULER_KEY_SIG, cache=True)
def zero_key(features):  # pragma: no cover - never called
    """Placeholder scheduler key: 0 for every request."""
    return 0.0
