"""Token ids of replayed trace records, drawn as the reference does, reduced to block digests."""

from __future__ import annotations

import numpy as np

from blis_fast.kernels.generation.token_ids import draw_token_ids
from blis_fast.kernels.go import gorand
from blis_fast.kernels.hashing import block_digests
from blis_fast.kernels.jit import njit


@njit(cache=True)
def replay_digests(state, prefix_len, prefix_of, input_tokens, output_tokens, block_size,
                   own_stream):
    """Draw every record's ids as the reference does (WL-9.6, DELTA-63/65) and digest them.

    ``prefix_of[r]`` is the record's prefix group (-1 = none) and ``prefix_len[g]`` the group's
    recorded prefix length; the group prefixes are drawn first, in group order. Per record:
    input ids, then output ids; the sequence is prefix ++ input ++ output. A record with
    ``own_stream[r]`` (a closed-loop session's round 0) draws from a stream seeded by the next
    ``Int63`` of the main one, which its session then continues.
    Returns (chunk_offsets, chunk_digests, the own streams' states in row order, the group
    prefixes' token ids, their offsets).
    """
    n_groups = prefix_len.shape[0]
    p_off = np.zeros(n_groups + 1, np.int64)
    for g in range(n_groups):
        p_off[g + 1] = p_off[g] + prefix_len[g]
    prefixes = np.empty(p_off[n_groups], np.int64)
    draw_token_ids(state, prefixes, 0, p_off[n_groups])
    n = input_tokens.shape[0]
    offsets = np.zeros(n + 1, np.int64)
    max_len = 1
    n_own = 0
    for r in range(n):
        plen = prefix_len[prefix_of[r]] if prefix_of[r] >= 0 else 0
        total = plen + input_tokens[r] + output_tokens[r]
        offsets[r + 1] = offsets[r] + total // block_size
        max_len = max(max_len, total)
        n_own += own_stream[r]
    digests = np.empty(offsets[n], np.uint64)
    tok = np.empty(max_len, np.int64)
    streams = np.empty((n_own, state.shape[0]), np.int64)
    k_own = 0
    for r in range(n):
        src = state
        if own_stream[r]:
            streams[k_own] = gorand.new_source(gorand.int63(state))
            src = streams[k_own]
            k_own += 1
        plen = 0
        if prefix_of[r] >= 0:
            g = prefix_of[r]
            plen = prefix_len[g]
            for k in range(plen):
                tok[k] = prefixes[p_off[g] + k]
        draw_token_ids(src, tok, plen, input_tokens[r] + output_tokens[r])
        total = plen + input_tokens[r] + output_tokens[r]
        block_digests(tok, 0, block_size, total // block_size, digests, offsets[r])
    return offsets, digests, streams, prefixes, p_off
