"""Rows, heap and growth of the request-generation kernel (the helpers its stages share).

Cost model of the per-request path (measured on this kernel: a NamedTuple of sixteen arrays
handed to a small jitted function costs about 18 ns a call more than two arrays, reference
counted or not; a reference-counted callee adds two atomic updates per array):

* helpers called per request or per round take the arrays they use, not NamedTuples, and
  only read and write preallocated arrays, so they compile with ``_nrt=False``;
* a helper that may replace a buffer (``grow_*``, reference counted, takes the NamedTuple) is
  called only under an explicit capacity check in its caller, and the caller unpacks the
  grown tuple again; the common path never rebuilds a tuple.
"""

from __future__ import annotations

import numpy as np

from blis_fast.kernels.buffers import grow_1d, grow_2d
from blis_fast.kernels.engine.heap import heap_pop, heap_push
from blis_fast.kernels.generation.generation_layout import GenCount as N
from blis_fast.kernels.generation.generation_layout import GenHeap, RowBuffers
from blis_fast.kernels.generation.generation_layout import GenRowCol as R
from blis_fast.kernels.generation.samplers import sample_length_at
from blis_fast.kernels.jit import njit


@njit(cache=True, _nrt=False, error_model="numpy")
def draw_length(s, sampler, code, off, params):
    """One draw of length sampler ``sampler`` (the ``sampler_*`` arrays of a ClientParams)."""
    return sample_length_at(s, code[sampler], params, off[sampler])


# --- output rows --------------------------------------------------------------------------------
@njit(cache=True)
def _digest_capacity(cur, need, nd, n, limit):
    """New capacity of the output digest buffer: the projected total once rows are known."""
    cap = cur + cur // 2
    if limit > 0 and n >= 64:
        projected = np.int64(float(nd) / float(n) * float(limit) * 1.02) + 1024
        if projected > cap:
            cap = projected
    return max(cap, need)


@njit(cache=True)
def grow_rows(out, keep_ids):
    """Row buffers with twice the rows (call when row ``cnt[ROWS]`` does not fit)."""
    cap = 2 * out.rows.shape[0]
    in_off = grow_1d(out.input_off, cap + 1) if keep_ids else out.input_off
    return RowBuffers(grow_2d(out.rows, cap), grow_1d(out.ratio, cap),
                      grow_1d(out.offsets, cap + 1), out.digests, out.input_ids, in_off)


@njit(cache=True, _nrt=False, error_model="numpy")
def short_of_room(digests, input_ids, cnt, n_digests, n_ids, keep_ids):
    """Whether row buffers lack room for ``n_digests`` more digests or ``n_ids`` input ids."""
    if cnt[N.DIGESTS] + n_digests > digests.shape[0]:
        return True
    return keep_ids and cnt[N.IDS] + n_ids > input_ids.shape[0]


@njit(cache=True)
def grow_row_data(out, cnt, n_digests, n_ids, limit):
    """Row buffers with room for ``n_digests`` more digests and ``n_ids`` more input ids."""
    nd = cnt[N.DIGESTS]
    digests = out.digests
    if nd + n_digests > digests.shape[0]:
        cap = _digest_capacity(digests.shape[0], nd + n_digests, nd, cnt[N.ROWS], limit)
        digests = grow_1d(digests, cap)
    ids = out.input_ids
    if cnt[N.IDS] + n_ids > ids.shape[0]:
        ids = grow_1d(ids, max(cnt[N.IDS] + n_ids, 2 * ids.shape[0]))
    return RowBuffers(out.rows, out.ratio, out.offsets, digests, ids, out.input_off)


@njit(cache=True, _nrt=False, error_model="numpy")
def close_row(ratio_buf, offsets, input_ids, input_off, cnt, ratio, keep_ids, ids, ids_start,
              n_ids):
    """Finish row ``cnt[ROWS]`` of the RowBuffers arrays: its ratio, digest end and input ids
    ``ids[ids_start:ids_start + n_ids]`` (room made beforehand)."""
    n = cnt[N.ROWS]
    ratio_buf[n] = ratio
    offsets[n + 1] = cnt[N.DIGESTS]
    if keep_ids:
        used = cnt[N.IDS]
        for j in range(n_ids):
            input_ids[used + j] = ids[ids_start + j]
        cnt[N.IDS] = used + n_ids
        input_off[n + 1] = used + n_ids
    cnt[N.ROWS] = n + 1


@njit(cache=True, _nrt=False, error_model="numpy")
def write_row(row, t, n_in, n_out, plen, k, session, rnd, modal, dropped):
    """Fill one request row; ``modal`` = (text, image, audio, video) token counts."""
    row[R.ARRIVAL] = t
    row[R.INPUT] = n_in
    row[R.OUTPUT] = n_out
    row[R.PREFIX] = plen
    row[R.CLIENT] = k
    row[R.SESSION] = session
    row[R.ROUND] = rnd
    row[R.TEXT] = modal[0]
    row[R.IMAGE] = modal[1]
    row[R.AUDIO] = modal[2]
    row[R.VIDEO] = modal[3]
    row[R.DROPPED] = dropped


# --- heap: kernels/engine/heap.py keyed (arrival, client << tie_shift | push count) ----------------------
@njit(cache=True)
def tie_shift(n_clients):
    """Bits left for the push counter once the client index takes the high bits of a tie."""
    bits = 0
    while (np.int64(1) << bits) < n_clients:
        bits += 1
    return 62 - bits


@njit(cache=True)
def new_heap(cap):
    return GenHeap(np.zeros(cap, dtype=np.int64), np.zeros(cap, dtype=np.int64),
                   np.zeros(cap, dtype=np.int8), np.zeros(cap, dtype=np.int64))


@njit(cache=True)
def grow_heap(heap, need):
    """The heap with room for ``need`` items."""
    cap = max(need, 2 * heap.times.shape[0])
    return GenHeap(grow_1d(heap.times, cap), grow_1d(heap.ties, cap), grow_1d(heap.kinds, cap),
                   grow_1d(heap.payloads, cap))


@njit(cache=True, _nrt=False, error_model="numpy")
def push(times, ties, kinds, payloads, cnt, t, k, ref, shift):
    """Push (arrival ``t``, client ``k``, pending slot ``ref`` or -1) on the GenHeap arrays;
    room made beforehand."""
    tie = (np.int64(k) << shift) | cnt[N.SEQ]
    cnt[N.SEQ] += 1
    cnt[N.HEAP] = heap_push(times, ties, kinds, payloads, cnt[N.HEAP], np.int64(t), tie,
                            np.int64(0), np.int64(ref))


@njit(cache=True, _nrt=False, error_model="numpy")
def pop(times, ties, kinds, payloads, cnt, shift):
    """Pop the earliest item of the GenHeap arrays: (arrival, client, pending slot or -1)."""
    n = heap_pop(times, ties, kinds, payloads, cnt[N.HEAP])
    cnt[N.HEAP] = n
    return times[n], ties[n] >> shift, payloads[n]
