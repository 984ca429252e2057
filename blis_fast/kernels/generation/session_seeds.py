"""Seeds of closed-loop sessions (DELTA-47): concurrency users' first requests, blueprint
seeds, and the regathering of block digests when seed rows join the generated ones."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from blis_fast.kernels.buffers import append_ids, copy_range, grow_1d
from blis_fast.kernels.generation.generation_layout import GEN_ROW_COLS, GenStatus
from blis_fast.kernels.generation.generation_layout import GenClientCol as C
from blis_fast.kernels.generation.generation_layout import GenRowCol as R
from blis_fast.kernels.generation.samplers import sample_length_at
from blis_fast.kernels.generation.token_ids import draw_token_ids
from blis_fast.kernels.go.gorand import int63, new_source
from blis_fast.kernels.hashing import block_digests
from blis_fast.kernels.jit import njit


class ConcurrencySeeds(NamedTuple):
    """One seed request per concurrency user, in user order."""

    status: int
    rows: np.ndarray  # (users, GEN_ROW_COLS)
    chunk_offsets: np.ndarray
    chunk_digests: np.ndarray
    blueprint_seed: np.ndarray  # per user: the seed of its session's own stream
    input_ids: np.ndarray  # int32, only with keep_ids
    input_off: np.ndarray


@njit(cache=True)
def concurrency_kernel(crng_seed, u_client, u_arrival, clients, prefix_off, prefix_tokens,
                       block_size, keep_ids):
    """DELTA-47 seeds: per user, a user stream from ``crng``, one request, a blueprint seed.

    ``clients`` is a ``ClientParams`` (its INPUT/OUTPUT sampler ids and groups are read);
    ``prefix_off``/``prefix_tokens`` the group prefixes of the generation run. With
    ``keep_ids`` != 0 each seed's input token ids are kept as in ``generate_kernel``.
    """
    crng = new_source(crng_seed)
    ci = clients.ints
    m = u_client.shape[0]
    rows = np.zeros((m, GEN_ROW_COLS), dtype=np.int64)
    offsets = np.zeros(m + 1, dtype=np.int64)
    bp_seed = np.zeros(m, dtype=np.int64)
    digests = np.empty(1024, dtype=np.uint64)
    tok = np.empty(8192, dtype=np.int64)
    in_ids = np.empty(0, dtype=np.int32)
    in_off = np.zeros(m + 1, dtype=np.int64)
    n_ids = 0
    nd = 0
    for i in range(m):
        k = u_client[i]
        us = new_source(int63(crng))
        s_in = ci[k, C.INPUT]
        s_out = ci[k, C.OUTPUT]
        sp = clients.sampler_params
        ilen = sample_length_at(us, clients.sampler_code[s_in], sp, clients.sampler_off[s_in])
        olen = sample_length_at(us, clients.sampler_code[s_out], sp, clients.sampler_off[s_out])
        if ilen < 0 or olen < 0:
            return ConcurrencySeeds(GenStatus.NEGATIVE_LENGTH, rows, offsets, digests[:0],
                                    bp_seed, in_ids, in_off)
        g = ci[k, C.GROUP]
        plen = clients.group_len[g] if g >= 0 else 0
        total = plen + ilen + olen
        if total > tok.shape[0]:
            tok = np.empty(max(total, 2 * tok.shape[0]), dtype=np.int64)
        if plen > 0:
            copy_range(tok, 0, prefix_tokens, prefix_off[g], plen)
        draw_token_ids(us, tok, plen, ilen + olen)
        nch = total // block_size
        if nd + nch > digests.shape[0]:
            digests = grow_1d(digests, max(digests.shape[0] + digests.shape[0] // 2, nd + nch))
        block_digests(tok, 0, block_size, nch, digests, nd)
        nd += nch
        rows[i, R.ARRIVAL] = u_arrival[i]
        rows[i, R.INPUT] = plen + ilen
        rows[i, R.OUTPUT] = olen
        rows[i, R.PREFIX] = plen
        rows[i, R.CLIENT] = k
        rows[i, R.SESSION] = -1
        offsets[i + 1] = nd
        if keep_ids != 0:
            in_ids, n_ids = append_ids(in_ids, n_ids, tok, 0, plen + ilen)
        in_off[i + 1] = n_ids
        bp_seed[i] = int63(crng)
    return ConcurrencySeeds(GenStatus.OK, rows, offsets, digests[:nd], bp_seed, in_ids[:n_ids],
                            in_off)


@njit(cache=True)
def int63_sequence(seed, count):
    """``count`` successive Int63 draws of ``NewSource(seed)``."""
    s = new_source(seed)
    out = np.empty(count, dtype=np.int64)
    for i in range(count):
        out[i] = int63(s)
    return out


@njit(cache=True)
def gather_two(seg_src, seg_off, seg_len, dig_a, dig_b, csr_off):
    """Concatenate digest segments taken from ``dig_a`` (src 0) or ``dig_b`` (src 1) in order."""
    out = np.empty(csr_off[-1], dtype=np.uint64)
    for i in range(seg_off.shape[0]):
        a = seg_off[i]
        b = csr_off[i]
        src = dig_a if seg_src[i] == 0 else dig_b
        for j in range(seg_len[i]):
            out[b + j] = src[a + j]
    return out
