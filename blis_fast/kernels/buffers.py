"""Growable kernel buffers: a copy with more room, contents kept (the generators' outputs grow
while rows are drawn, their final size unknown until the last draw)."""

from __future__ import annotations

import numpy as np

from blis_fast.kernels.jit import njit


@njit(cache=True, _nrt=False, error_model="numpy")
def copy_range(dst, dst_at, src, src_at, n):
    """``dst[dst_at:dst_at + n] = src[src_at:src_at + n]`` for 1-D arrays, as a loop: a slice
    assignment compiles NumPy's shape check and its error message (str of ints, joins), over a
    second of every cold compile that meets one."""
    for j in range(n):
        dst[dst_at + j] = src[src_at + j]


@njit(cache=True)
def grow_1d(a, cap):
    """Copy of ``a`` with capacity ``cap`` (contents kept, the rest uninitialised)."""
    b = np.empty(cap, dtype=a.dtype)
    copy_range(b, 0, a, 0, a.shape[0])
    return b


@njit(cache=True)
def grow_2d(a, cap):
    """Copy of the 2-D ``a`` with ``cap`` rows (contents kept, new rows zero)."""
    b = np.zeros((cap, a.shape[1]), dtype=a.dtype)
    for i in range(a.shape[0]):
        for j in range(a.shape[1]):
            b[i, j] = a[i, j]
    return b


@njit(cache=True)
def room(a, need):
    """``a``, or a copy with room for ``need`` items (at least twice as long)."""
    if need <= a.shape[0]:
        return a
    return grow_1d(a, max(need, 2 * a.shape[0]))


@njit(cache=True)
def append_ids(buf, used, src, start, count):
    """Append ``src[start:start+count]`` to the id buffer ``buf`` (grown as needed):
    (buffer, new used count)."""
    buf = room(buf, used + count)
    for j in range(count):
        buf[used + j] = src[start + j]
    return buf, used + count
