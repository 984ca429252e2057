"""Array-backed binary min-heap of simulation events.

Every event of the run (cluster and instance events alike) lives in one heap keyed by
``(time, tie)``. ``tie`` packs, from most to least significant: instance-vs-cluster bit,
instance index, event priority and a global sequence number, so popping in key order
reproduces the reference's two-level ordering exactly (CLU-1.5/1.6, ENG-1.2): cluster events
before instance events at one tick, the lowest instance index first, then (priority, seq).
"""

from __future__ import annotations

import numpy as np

from blis_fast.kernels.jit import njit

# Bit layout of the tie key.
SEQ_BITS = 40
INSTANCE_BITS = 18
PRIO_SHIFT = SEQ_BITS  # 4 bits of priority (offset so cluster priorities are >= 0)
INST_SHIFT = SEQ_BITS + 4  # INSTANCE_BITS bits of instance index
INSTANCE_BIT = SEQ_BITS + 4 + INSTANCE_BITS  # bit 62: set for instance events
MAX_INSTANCES = 1 << INSTANCE_BITS
"""Instances a run may have: indices 0..MAX_INSTANCES-1 fit the tie key (checked before a run)."""
MAX_EVENT_SEQ = 1 << SEQ_BITS
"""Events a run may push: the loop stops with an error status before a sequence number overflows."""

# heap arrays: times, ties, kinds, payloads (request or instance index)


@njit(cache=True, _nrt=False, error_model="numpy")
def make_tie(is_instance, instance, priority, seq):
    """Pack the ordering fields of one event into its tie key."""
    tie = np.int64(seq)
    tie |= np.int64(priority) << PRIO_SHIFT
    tie |= np.int64(instance) << INST_SHIFT
    if is_instance:
        tie |= np.int64(1) << INSTANCE_BIT
    return tie


@njit(cache=True, _nrt=False, error_model="numpy")
def tie_instance(tie):
    """Instance index stored in a tie key."""
    return (tie >> INST_SHIFT) & np.int64(MAX_INSTANCES - 1)


@njit(cache=True, _nrt=False, error_model="numpy")
def tie_is_instance(tie):
    """True when the tie key belongs to an instance event."""
    return (tie >> INSTANCE_BIT) & np.int64(1) == 1


@njit(cache=True, _nrt=False, error_model="numpy")
def _less(times, ties, a, b):
    if times[a] != times[b]:
        return times[a] < times[b]
    return ties[a] < ties[b]


@njit(cache=True, _nrt=False, error_model="numpy")
def _swap(times, ties, kinds, payloads, a, b):
    t = times[a]
    times[a] = times[b]
    times[b] = t
    k = ties[a]
    ties[a] = ties[b]
    ties[b] = k
    e = kinds[a]
    kinds[a] = kinds[b]
    kinds[b] = e
    p = payloads[a]
    payloads[a] = payloads[b]
    payloads[b] = p


@njit(cache=True, _nrt=False, error_model="numpy")
def heap_push(times, ties, kinds, payloads, size, time, tie, kind, payload):
    """Insert one event; returns the new size (caller guarantees capacity)."""
    i = size
    times[i] = time
    ties[i] = tie
    kinds[i] = kind
    payloads[i] = payload
    while i > 0:
        parent = (i - 1) >> 1
        if _less(times, ties, i, parent):
            _swap(times, ties, kinds, payloads, i, parent)
            i = parent
        else:
            break
    return size + 1


@njit(cache=True, _nrt=False, error_model="numpy")
def heap_pop(times, ties, kinds, payloads, size):
    """Remove the smallest event (it is moved to index ``size - 1``); returns the new size."""
    last = size - 1
    _swap(times, ties, kinds, payloads, 0, last)
    n = last
    i = 0
    while True:
        left = 2 * i + 1
        if left >= n:
            break
        smallest = left
        right = left + 1
        if right < n and _less(times, ties, right, left):
            smallest = right
        if _less(times, ties, smallest, i):
            _swap(times, ties, kinds, payloads, i, smallest)
            i = smallest
        else:
            break
    return n
