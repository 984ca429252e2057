"""Synthetic token ids (WL-13.1) and the block digests made from them while they exist.

A token id is ``Intn(128000)`` of the drawing stream. The generators, the replay loader and
the closed-loop session driver draw ids here; only the content digests of full blocks outlive
the draw (``kernels/hashing.py``).
"""

from __future__ import annotations

import numpy as np

from blis_fast.kernels.generation.generation_layout import GroupPrefixes
from blis_fast.kernels.go.gorand import FEED_INDEX, REGISTER_LEN, TAP_INDEX, int31n
from blis_fast.kernels.hashing import block_digests, content_digest
from blis_fast.kernels.jit import njit

TOKEN_VOCAB = 128000
"""Vocabulary size of synthetic token ids (WL-13.1)."""

_VMAX_VOCAB = 2147483647 - (2147483648 % TOKEN_VOCAB)
"""Largest accepted 31-bit draw of ``Int31n(TOKEN_VOCAB)`` (Go rejects larger ones)."""


@njit(cache=True, _nrt=False, error_model="numpy")
def draw_token_ids(s, tok, start, count):
    """``count`` token ids ``Intn(128000)`` into ``tok[start:]`` (Go's Int31n, inlined).

    Same draws as ``gorand.int31n(s, 128000)`` repeated, with the generator's cursor kept in
    registers; between wrap-arounds of the two cursors the steps run without wrap checks.
    """
    tap = s[TAP_INDEX]
    feed = s[FEED_INDEX]
    i = start
    end = start + count
    while i < end:
        if tap == 0:  # wrap now: the next step reads index 606, as `tap -= 1; tap += 607`
            tap = REGISTER_LEN
        if feed == 0:
            feed = REGISTER_LEN
        for _ in range(min(tap, feed, end - i)):  # steps before a cursor wraps, <= 1 id each
            tap -= 1
            feed -= 1
            x = s[feed] + s[tap]
            s[feed] = x
            v = (x & 0x7FFFFFFFFFFFFFFF) >> 32
            if v <= _VMAX_VOCAB:  # else rejected: the step is spent, no id
                tok[i] = v % TOKEN_VOCAB
                i += 1
    s[TAP_INDEX] = tap
    s[FEED_INDEX] = feed


@njit(cache=True, _nrt=False, error_model="numpy")
def skip_token_ids(s, count):
    """Advance ``s`` past ``count`` token-id draws (values discarded)."""
    tap = s[TAP_INDEX]
    feed = s[FEED_INDEX]
    for _ in range(count):
        while True:
            tap -= 1
            if tap < 0:
                tap += REGISTER_LEN
            feed -= 1
            if feed < 0:
                feed += REGISTER_LEN
            x = s[feed] + s[tap]
            s[feed] = x
            if (x & 0x7FFFFFFFFFFFFFFF) >> 32 <= _VMAX_VOCAB:
                break
    s[TAP_INDEX] = tap
    s[FEED_INDEX] = feed


@njit(cache=True)
def group_prefixes(wg, group_len, bs):
    """Group prefixes (first-appearance order) drawn from ``wg``, and their block digests."""
    n_groups = group_len.shape[0]
    g_off = np.zeros(n_groups + 1, dtype=np.int64)
    for g in range(n_groups):
        g_off[g + 1] = g_off[g] + group_len[g]
    prefix_tok = np.empty(g_off[n_groups], dtype=np.int64)
    for i in range(g_off[n_groups]):
        prefix_tok[i] = int31n(wg, TOKEN_VOCAB)
    g_full = np.zeros(n_groups, dtype=np.int64)
    g_doff = np.zeros(n_groups + 1, dtype=np.int64)
    for g in range(n_groups):
        g_full[g] = group_len[g] // bs
        g_doff[g + 1] = g_doff[g] + g_full[g]
    g_dig = np.empty(g_doff[n_groups], dtype=np.uint64)
    for g in range(n_groups):
        for c in range(g_full[g]):
            g_dig[g_doff[g] + c] = content_digest(prefix_tok, g_off[g] + c * bs, bs)
    return GroupPrefixes(g_off, prefix_tok, g_full, g_doff, g_dig)


@njit(cache=True, _nrt=False, error_model="numpy")
def fill_block_digests(tok, total, bs, g, g_full, g_doff, g_dig, digests, nd):
    """Digests of the full blocks of ``tok[:total]`` at ``digests[nd:]``; the blocks of group
    ``g``'s prefix (``g`` >= 0) are copied from its precomputed digests (the ``full_blocks``,
    ``digest_off`` and ``digests`` of a GroupPrefixes). Returns the count."""
    nchunks = total // bs
    c0 = 0
    if g >= 0:
        c0 = min(g_full[g], nchunks)
        for c in range(c0):
            digests[nd + c] = g_dig[g_doff[g] + c]
    block_digests(tok, c0 * bs, bs, nchunks - c0, digests, nd + c0)
    return nchunks
