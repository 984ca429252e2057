"""Token ids of a closed-loop follow-up round (WL-6.5, DELTA-48) and its block digests."""

from __future__ import annotations

import numpy as np
from numba import njit

from blis_fast.kernels import gorand
from blis_fast.kernels.hashing import content_digest

VOCAB = 128000  # sim/simulator.go MaxTokenID: token ids are Intn(128000)


@njit(cache=True)
def draw_token_ids(state, count):
    """``count`` token ids ``Intn(128000)`` from a Go RNG state (``GenerateRandomTokenIDs``)."""
    ids = np.empty(count, np.int64)
    for k in range(count):
        ids[k] = gorand.intn(state, VOCAB)
    return ids


@njit(cache=True)
def block_digests(tokens, block_size):
    """Content digests of the full ``block_size``-token blocks of ``tokens`` (aligned at 0)."""
    n = tokens.shape[0] // block_size
    out = np.empty(n, np.uint64)
    for c in range(n):
        out[c] = content_digest(tokens, c * block_size, block_size)
    return out
