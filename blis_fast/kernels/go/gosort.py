"""Go's unstable ``sort.Slice`` (pattern-defeating quicksort, Go >= 1.24) over float64 keys.

The reference orders the per-request records of the results file by calling ``sort.Slice``
with ``Less(i, j) = arrived_at[i] < arrived_at[j]`` on a list already sorted by request ID
(ENG-7.6, CLU-7.24). The algorithm is deterministic (its "random" pattern breaker is an
xorshift seeded with the sub-slice length), so replaying it swap for swap gives the
reference's order of records with equal ``arrived_at`` (ENG-12.1 / CLU OPEN-2).

``go_sort_slice_order(keys)`` returns the permutation ``perm`` such that
``keys[perm]`` is the slice after Go's sort. Written from the algorithm's description
(pdqsort without BlockQuicksort, insertion sort for <= 12 elements, heapsort fallback after
``bits.Len(n)`` bad pivots); recursion on the smaller side is replaced by an explicit stack,
which does not change the result because sub-ranges are disjoint and the only element
outside a range that is read (``a-1``) is already in its final place.

The pattern breaker uses the xorshift shifts 13/7/17 of Go >= 1.24 (Go 1.19-1.23 used
13/17/5, golang/go#70144). Only the newer shifts reproduce the record order of every
parity case with tied arrivals (tests/test_output_results.py), which also tells that the
reference binary was built with Go >= 1.24 although its go.mod says 1.21.
"""

from __future__ import annotations

import numpy as np

from blis_fast.kernels.jit import njit

_MAX_INSERTION = 12
_SHORTEST_NINTHER = 50
_MAX_SWAPS = 12
_UNKNOWN, _INCREASING, _DECREASING = 0, 1, 2


@njit(cache=True)
def _swap(k, p, i, j):
    """Swap positions ``i`` and ``j`` of the key and permutation arrays."""
    t = k[i]
    k[i] = k[j]
    k[j] = t
    u = p[i]
    p[i] = p[j]
    p[j] = u


@njit(cache=True)
def _bits_len(x):
    """Number of bits needed to represent non-negative ``x`` (Go's bits.Len)."""
    n = 0
    while x > 0:
        n += 1
        x >>= 1
    return n


@njit(cache=True)
def _insertion_sort(k, p, a, b):
    """Insertion sort of ``[a, b)``."""
    for i in range(a + 1, b):
        j = i
        while j > a and k[j] < k[j - 1]:
            _swap(k, p, j, j - 1)
            j -= 1


@njit(cache=True)
def _sift_down(k, p, lo, hi, first):
    """Restore the max-heap property below ``lo`` in the heap based at ``first``."""
    root = lo
    while True:
        child = 2 * root + 1
        if child >= hi:
            return
        if child + 1 < hi and k[first + child] < k[first + child + 1]:
            child += 1
        if not (k[first + root] < k[first + child]):
            return
        _swap(k, p, first + root, first + child)
        root = child


@njit(cache=True)
def _heap_sort(k, p, a, b):
    """Heapsort of ``[a, b)``."""
    first = a
    hi = b - a
    i = (hi - 1) // 2
    while i >= 0:
        _sift_down(k, p, i, hi, first)
        i -= 1
    i = hi - 1
    while i >= 0:
        _swap(k, p, first, first + i)
        _sift_down(k, p, 0, i, first)
        i -= 1


@njit(cache=True)
def _partition(k, p, a, b, pivot):
    """Partition ``[a, b)`` around ``k[pivot]``; return (new pivot index, was partitioned)."""
    _swap(k, p, a, pivot)
    i = a + 1
    j = b - 1
    while i <= j and k[i] < k[a]:
        i += 1
    while i <= j and not (k[j] < k[a]):
        j -= 1
    if i > j:
        _swap(k, p, j, a)
        return j, True
    _swap(k, p, i, j)
    i += 1
    j -= 1
    while True:
        while i <= j and k[i] < k[a]:
            i += 1
        while i <= j and not (k[j] < k[a]):
            j -= 1
        if i > j:
            break
        _swap(k, p, i, j)
        i += 1
        j -= 1
    _swap(k, p, j, a)
    return j, False


@njit(cache=True)
def _partition_equal(k, p, a, b, pivot):
    """Split ``[a, b)`` into elements equal to the pivot, then greater ones."""
    _swap(k, p, a, pivot)
    i = a + 1
    j = b - 1
    while True:
        while i <= j and not (k[a] < k[i]):
            i += 1
        while i <= j and k[a] < k[j]:
            j -= 1
        if i > j:
            break
        _swap(k, p, i, j)
        i += 1
        j -= 1
    return i


@njit(cache=True)
def _partial_insertion_sort(k, p, a, b):
    """Try to finish an almost sorted range with few shifts; True if it is sorted."""
    i = a + 1
    for _ in range(5):
        while i < b and not (k[i] < k[i - 1]):
            i += 1
        if i == b:
            return True
        if b - a < 50:
            return False
        _swap(k, p, i, i - 1)
        if i - a >= 2:
            j = i - 1
            while j >= 1:  # the reference's lower bound is 1, not a+1
                if not (k[j] < k[j - 1]):
                    break
                _swap(k, p, j, j - 1)
                j -= 1
        if b - i >= 2:
            j = i + 1
            while j < b:
                if not (k[j] < k[j - 1]):
                    break
                _swap(k, p, j, j - 1)
                j += 1
    return False


@njit(cache=True)
def _break_patterns(k, p, a, b):
    """Scatter three elements with the length-seeded xorshift generator."""
    length = b - a
    if length >= 8:
        r = np.uint64(length)
        modulus = np.uint64(1) << np.uint64(_bits_len(length))
        idx = a + (length // 4) * 2 - 1
        while idx <= a + (length // 4) * 2 + 1:
            r ^= r << np.uint64(13)
            r ^= r >> np.uint64(7)
            r ^= r << np.uint64(17)
            other = np.int64(r & (modulus - np.uint64(1)))
            if other >= length:
                other -= length
            _swap(k, p, idx, a + other)
            idx += 1


@njit(cache=True)
def _median(k, a, b, c, swaps):
    """Index of the median of three; counts the swaps it would make in ``swaps[0]``."""
    if k[b] < k[a]:
        swaps[0] += 1
        a, b = b, a
    if k[c] < k[b]:
        swaps[0] += 1
        b, c = c, b
    if k[b] < k[a]:
        swaps[0] += 1
        a, b = b, a
    return b


@njit(cache=True)
def _choose_pivot(k, a, b, swaps):
    """Pivot index and sortedness hint for ``[a, b)``."""
    n = b - a
    swaps[0] = 0
    i = a + n // 4 * 1
    j = a + n // 4 * 2
    c = a + n // 4 * 3
    if n >= 8:
        if n >= _SHORTEST_NINTHER:
            i = _median(k, i - 1, i, i + 1, swaps)
            j = _median(k, j - 1, j, j + 1, swaps)
            c = _median(k, c - 1, c, c + 1, swaps)
        j = _median(k, i, j, c, swaps)
    if swaps[0] == 0:
        return j, _INCREASING
    if swaps[0] == _MAX_SWAPS:
        return j, _DECREASING
    return j, _UNKNOWN


@njit(cache=True)
def _reverse_range(k, p, a, b):
    """Reverse ``[a, b)``."""
    i = a
    j = b - 1
    while i < j:
        _swap(k, p, i, j)
        i += 1
        j -= 1


@njit(cache=True)
def _pdqsort(k, p):
    """Sort ``k`` (carrying ``p`` along) exactly as Go's pdqsort_func does."""
    n = k.shape[0]
    # frames: a, b, limit, was_balanced, was_partitioned
    stack = np.empty((64 + 2 * _bits_len(n) + 8, 5), dtype=np.int64)
    top = 0
    stack[0, 0] = 0
    stack[0, 1] = n
    stack[0, 2] = _bits_len(n)
    stack[0, 3] = 1
    stack[0, 4] = 1
    top = 1
    swaps = np.zeros(1, dtype=np.int64)
    while top > 0:
        top -= 1
        a = stack[top, 0]
        b = stack[top, 1]
        limit = stack[top, 2]
        was_balanced = stack[top, 3] == 1
        was_partitioned = stack[top, 4] == 1
        while True:
            length = b - a
            if length <= _MAX_INSERTION:
                _insertion_sort(k, p, a, b)
                break
            if limit == 0:
                _heap_sort(k, p, a, b)
                break
            if not was_balanced:
                _break_patterns(k, p, a, b)
                limit -= 1
            pivot, hint = _choose_pivot(k, a, b, swaps)
            if hint == _DECREASING:
                _reverse_range(k, p, a, b)
                pivot = (b - 1) - (pivot - a)
                hint = _INCREASING
            if was_balanced and was_partitioned and hint == _INCREASING:
                if _partial_insertion_sort(k, p, a, b):
                    break
            if a > 0 and not (k[a - 1] < k[pivot]):
                a = _partition_equal(k, p, a, b, pivot)
                continue
            mid, already = _partition(k, p, a, b, pivot)
            was_partitioned = already
            left_len = mid - a
            right_len = b - mid
            balance_threshold = length // 8
            if top >= stack.shape[0]:
                bigger = np.empty((stack.shape[0] * 2, 5), dtype=np.int64)
                bigger[: stack.shape[0]] = stack
                stack = bigger
            if left_len < right_len:
                was_balanced = left_len >= balance_threshold
                stack[top, 0] = a
                stack[top, 1] = mid
                stack[top, 2] = limit
                stack[top, 3] = 1
                stack[top, 4] = 1
                top += 1
                a = mid + 1
            else:
                was_balanced = right_len >= balance_threshold
                stack[top, 0] = mid + 1
                stack[top, 1] = b
                stack[top, 2] = limit
                stack[top, 3] = 1
                stack[top, 4] = 1
                top += 1
                b = mid


@njit(cache=True)
def go_sort_slice_order(keys):
    """Permutation that Go's ``sort.Slice`` with ``Less = keys[i] < keys[j]`` applies."""
    k = keys.astype(np.float64).copy()
    p = np.arange(k.shape[0], dtype=np.int64)
    _pdqsort(k, p)
    return p
