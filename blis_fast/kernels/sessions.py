"""Draws of one closed-loop follow-up round (WL-6.5, DELTA-48) and its block digests."""

from __future__ import annotations

import numpy as np
from numba import njit

from blis_fast.kernels import gorand
from blis_fast.kernels.hashing import content_digest
from blis_fast.workload.samplers import sample_length

VOCAB = 128000  # sim/simulator.go MaxTokenID: token ids are Intn(128000)


@njit(cache=True)
def draw_round(state, in_code, in_params, out_code, out_params):
    """A follow-up's draws from its session's Go RNG, in the reference's order: input length,
    output length, input ids, output ids. Returns (new input ids, output ids)."""
    in_len = sample_length(state, in_code, in_params)
    out_len = sample_length(state, out_code, out_params)
    new_ids = np.empty(in_len, np.int64)
    for k in range(in_len):
        new_ids[k] = gorand.intn(state, VOCAB)
    out_ids = np.empty(out_len, np.int64)
    for k in range(out_len):
        out_ids[k] = gorand.intn(state, VOCAB)
    return new_ids, out_ids


@njit(cache=True)
def block_digests(tokens, block_size):
    """Content digests of the full ``block_size``-token blocks of ``tokens`` (aligned at 0)."""
    n = tokens.shape[0] // block_size
    out = np.empty(n, np.uint64)
    for c in range(n):
        out[c] = content_digest(tokens, c * block_size, block_size)
    return out
