"""64-bit block hashing for the KV prefix cache and prefix-aware routing.

The reference chains SHA-256 hex digests over each full block's token ids (ENG-5.3). Only
equality of those digests matters, so the project keeps two 64-bit numbers instead:
a *content digest* per block-aligned chunk of a request's token sequence (computed once,
while the token ids exist), and a *chain hash* ``chain(prev, content)`` that plays the role of
``HashBlock(prev, tokens)``. Equal token prefixes give equal chains; distinct ones collide with
probability ~2^-64 per pair. ``tests/test_hashing.py`` checks the equality structure against
SHA-256 on real workloads.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_M3 = np.uint64(0xFF51AFD7ED558CCD)
_S30 = np.uint64(30)
_S27 = np.uint64(27)
_S31 = np.uint64(31)
_S33 = np.uint64(33)

EMPTY_HASH = np.uint64(0)


@njit(cache=True, _nrt=False, error_model="numpy")
def splitmix64(x: np.uint64) -> np.uint64:
    """Finalizer of SplitMix64: a bijective, well-mixing 64-bit function."""
    z = x + _GOLDEN
    z = (z ^ (z >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


@njit(cache=True, _nrt=False, error_model="numpy")
def content_digest(tokens, start, length) -> np.uint64:
    """Digest of ``tokens[start:start+length]`` (one full block of token ids)."""
    h = np.uint64(length) * _M3
    for i in range(start, start + length):
        h = splitmix64(h ^ np.uint64(tokens[i]))
    return h


@njit(cache=True, _nrt=False, error_model="numpy")
def chain_hash(prev, content) -> np.uint64:
    """Hash of a block given the previous block's hash (``EMPTY_HASH`` for the first block)."""
    h = splitmix64(np.uint64(prev) * _M1 ^ splitmix64(np.uint64(content) + _M2))
    if h == EMPTY_HASH:  # reserve 0 for "no hash"
        h = _GOLDEN
    return h
