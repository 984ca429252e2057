"""Open-addressing hash tables keyed by 64-bit block hashes, and the walk of a request's leading
blocks through one.

A table is a ``uint64 [n_instances, size, 2]`` array (``size`` a power of two): per instance,
slots of (key, value) side by side, linear probing, key 0 = empty (block hashes are never 0,
see ``kernels/hashing.py``), deletion by backward shift (no tombstones). The KV cache's prefix
table and CPU store, the router's prefix-affinity index and its frozen copies of the caches all
use these functions.
"""

from __future__ import annotations

import numpy as np

from blis_fast.kernels.hashing import chain_hash
from blis_fast.kernels.jit import njit

KEY, VALUE = 0, 1
"""Columns of a table slot."""


@njit(cache=True, _nrt=False, error_model="numpy")
def table_get(table, i, h):
    """The value stored under key ``h`` in instance ``i``'s table, or -1."""
    mask = table.shape[1] - 1
    j = np.int64(h & np.uint64(mask))
    while True:
        k = table[i, j, KEY]
        if k == h:
            return np.int64(table[i, j, VALUE])
        if k == 0:
            return np.int64(-1)
        j = (j + 1) & mask


@njit(cache=True, _nrt=False, error_model="numpy")
def table_put(table, i, h, v):
    """Store ``v`` under key ``h`` (replacing its value if present)."""
    mask = table.shape[1] - 1
    j = np.int64(h & np.uint64(mask))
    while True:
        k = table[i, j, KEY]
        if k == h or k == 0:
            table[i, j, KEY] = h
            table[i, j, VALUE] = np.uint64(v)
            return
        j = (j + 1) & mask


@njit(cache=True, _nrt=False, error_model="numpy")
def table_del(table, i, h):
    """Remove key ``h`` if present; backward-shift deletion keeps probe chains intact."""
    mask = table.shape[1] - 1
    j = np.int64(h & np.uint64(mask))
    while True:
        k = table[i, j, KEY]
        if k == 0:
            return
        if k == h:
            break
        j = (j + 1) & mask
    hole = j
    j = (j + 1) & mask
    while table[i, j, KEY] != 0:
        home = np.int64(table[i, j, KEY] & np.uint64(mask))
        if (hole - home) & mask < (j - home) & mask:
            table[i, hole, KEY] = table[i, j, KEY]
            table[i, hole, VALUE] = table[i, j, VALUE]
            hole = j
        j = (j + 1) & mask
    table[i, hole, KEY] = 0


@njit(cache=True, _nrt=False, error_model="numpy")
def leading_matches(table, i, chunk_dig, base, n, out):
    """Walk a request's leading full blocks through instance ``i``'s table (ENG-5.3): chain the
    content digests ``chunk_dig[base:base + n]`` into block hashes and stop at the first hash
    the table does not hold. Writes the values found to ``out`` and returns how many."""
    prev = np.uint64(0)
    for k in range(n):
        h = chain_hash(prev, chunk_dig[base + k])
        v = table_get(table, i, h)
        if v < 0:
            return k
        out[k] = v
        prev = h
    return n
