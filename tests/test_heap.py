"""The event heap (``kernels/engine/heap.py``) pops keys in (time, tie) order, so any lexicographic key
packed into the tie comes out sorted: the cluster loop's (cluster first, instance, priority,
sequence) and the workload generator's (arrival, client, generation order) alike."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from blis_fast.kernels.engine.heap import heap_pop, heap_push

CLIENT_SHIFT = 40  # a generator's tie: client << 40 | generation order (order < 2^40)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 2**20), st.integers(0, 2**40 - 1)),
                min_size=1, max_size=300, unique_by=lambda k: k[2]),
       st.integers(0, 2**31))
def test_pops_follow_time_then_packed_key(keys, seed):
    n = len(keys)
    times = np.empty(n, np.int64)
    ties = np.empty(n, np.int64)
    kinds = np.zeros(n, np.int8)
    payloads = np.empty(n, np.int64)
    order = np.random.default_rng(seed).permutation(n)
    size = 0
    for k in order:
        t, client, seq = keys[k]
        size = heap_push(times, ties, kinds, payloads, size, t, (client << CLIENT_SHIFT) | seq,
                         0, k)
    popped = []
    while size:
        popped.append(int(payloads[0]))
        size = heap_pop(times, ties, kinds, payloads, size)
    assert [keys[k] for k in popped] == sorted(keys)
