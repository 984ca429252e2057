"""What ``blis serve``'s live simulation (``blis_fast/serve/live.py``) does to the engine state
between calls of the event loop: a request routed by the caller (:func:`route_to`), and a
request whose client went away (:func:`abort_request`), which leaves the simulation at once.

Both are called between calls of the event loop (``event_loop.run_events``), never inside it, so the
loop itself pays nothing for it. What the request held is given back as a vLLM engine gives it
back on an abort: its KV blocks (``kvcache.release``: full blocks stay in the prefix cache, as
after a completion), its place in the wait queue or the running batch, the instance's and the
tenant's in-flight counts; its pending events (the cluster pipeline's, its instance arrival,
its enqueue, its timeout) are taken off the heap, the others keep their order (the heap is
rebuilt from the remaining events: their keys are unique, so the pop order is unchanged).
"""

from __future__ import annotations

from blis_fast.kernels.cluster import admission as adm
from blis_fast.kernels.engine.batch import batch_remove, wq_remove
from blis_fast.kernels.engine.events import push_event
from blis_fast.kernels.engine.heap import heap_push
from blis_fast.kernels.engine.state import HotField, InstanceCounter, LoopSlot
from blis_fast.kernels.enums import Event, EventPriority, Registration, RequestState
from blis_fast.kernels.jit import njit
from blis_fast.kernels.kv import kvcache as kvc


@njit(cache=True, _nrt=False, error_model="numpy")
def _owns_event(kind, payload, r):
    """True for an event of request ``r`` itself (not a step, a load or a request-left)."""
    if payload != r:
        return False
    return (kind == Event.CLUSTER_ARRIVAL or kind == Event.ADMISSION or kind == Event.ROUTING
            or kind == Event.ARRIVAL or kind == Event.QUEUED or kind == Event.TIMEOUT)


@njit(cache=True, _nrt=False, error_model="numpy")
def _drop_events(heap, r):
    """Remove request ``r``'s own events from the heap; returns how many were removed."""
    size = heap.loop[LoopSlot.HEAP_SIZE]
    keep = 0
    for k in range(size):
        if not _owns_event(heap.kinds[k], heap.payloads[k], r):
            heap.times[keep] = heap.times[k]
            heap.ties[keep] = heap.ties[k]
            heap.kinds[keep] = heap.kinds[k]
            heap.payloads[keep] = heap.payloads[k]
            keep += 1
    if keep == size:
        return 0
    for k in range(keep):  # heapify in place: insert entry k into the heap of 0..k-1
        heap_push(heap.times, heap.ties, heap.kinds, heap.payloads, k, heap.times[k],
                  heap.ties[k], heap.kinds[k], heap.payloads[k])
    heap.loop[LoopSlot.HEAP_SIZE] = keep
    return size - keep


@njit(cache=True, _nrt=False, error_model="numpy")
def abort_request(rs, ins, kv, rt, heap, r):
    """Abort request ``r`` now; returns True when it was still in the simulation (then its
    state is ``RequestState.ABORTED``), False when it had already ended there (completed,
    timed out, dropped, rejected: nothing changes)."""
    state = rs.state[r]
    if (state == RequestState.COMPLETED or state == RequestState.TIMED_OUT
            or state == RequestState.DROPPED or state == RequestState.ABORTED):
        return False
    reg = rs.registered[r]
    if reg == Registration.REJECTED_ADMISSION or reg == Registration.REJECTED_ROUTING:
        return False
    _drop_events(heap, r)
    i = rs.inst[r]
    if reg == Registration.ROUTED and i >= 0:  # routed: counted in flight on its instance
        if state == RequestState.QUEUED:
            wq_remove(ins, rs, i, r)
        elif state == RequestState.RUNNING:
            batch_remove(ins, i, r)
        kvc.release(kv, i, r)
        rs.hot[r, HotField.COMPUTED] = 0
        ins.cnt[i, InstanceCounter.IN_FLIGHT] -= 1
        if ins.cnt[i, InstanceCounter.IN_FLIGHT] < 0:
            ins.cnt[i, InstanceCounter.IN_FLIGHT] = 0
        adm.on_done(rt, r)
    rs.state[r] = RequestState.ABORTED
    return True


@njit(cache=True, _nrt=False, error_model="numpy")
def route_to(rs, ins, rt, heap, r, i, t):
    """Request ``r`` routed to instance ``i`` by the caller at ``t`` (no admission, no router:
    an external router chose), as the routing decision books it (CLU-3): in flight on ``i``,
    the tenant's count, then its arrival at the instance at ``t``. The caller leaves room for
    one event in the heap."""
    ins.cnt[i, InstanceCounter.IN_FLIGHT] += 1
    adm.on_routed(rt, r)
    rs.inst[r] = i
    rs.registered[r] = Registration.ROUTED
    push_event(heap, t, True, i, EventPriority.ARRIVAL, Event.ARRIVAL, r)
