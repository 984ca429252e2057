"""Scheduling events on the one heap (``kernels/engine/heap.py``) with the loop's sequence counter:
shared by the cluster loop (``event_loop.py``) and the P/D handlers (``pd.py``)."""

from __future__ import annotations

from blis_fast.kernels.engine.heap import heap_push, make_tie
from blis_fast.kernels.engine.state import InstanceCounter, LoopSlot
from blis_fast.kernels.enums import Event, EventPriority
from blis_fast.kernels.jit import njit

CLUSTER = False
INSTANCE = True


@njit(cache=True, _nrt=False, error_model="numpy")
def push_event(heap, time, on_instance, i, priority, kind, payload):
    """Schedule an event with the next sequence number."""
    seq = heap.loop[LoopSlot.NEXT_SEQ]
    heap.loop[LoopSlot.NEXT_SEQ] = seq + 1
    heap.loop[LoopSlot.HEAP_SIZE] = heap_push(
        heap.times, heap.ties, heap.kinds, heap.payloads, heap.loop[LoopSlot.HEAP_SIZE], time,
        make_tie(on_instance, i, priority, seq), kind, payload)


@njit(cache=True, _nrt=False, error_model="numpy")
def schedule_step(heap, ins, i, t):
    """Schedule instance ``i``'s next step at ``t`` (at most one is ever pending)."""
    push_event(heap, t, INSTANCE, i, EventPriority.STEP, Event.STEP, i)
    ins.cnt[i, InstanceCounter.STEP_PENDING] = 1
