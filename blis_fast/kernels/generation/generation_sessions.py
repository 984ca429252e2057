"""Multi-turn sessions in the generation kernel (WL-6.2, WL-6.4, DELTA-46/49).

A session is drawn whole when its start is popped: every round's lengths, ids and reason
ratio, in the reference's order. Round 0 becomes a row at once; a later round waits in the
heap as a *pending round* (its row, ratio, digests and ids kept in append-only pools) until
its arrival is popped. Rounds past the horizon or outside the client's windows are drawn but
not emitted. Closed-loop conversion marks later rounds dropped (their ids are skipped, not
hashed) and keeps what blueprints need of round 0. Per-round helpers take arrays (cost model:
``generation_rows``).
"""

from __future__ import annotations

import numpy as np

from blis_fast.kernels.buffers import copy_range, grow_1d, grow_2d
from blis_fast.kernels.generation.arrivals import in_window
from blis_fast.kernels.generation.generation_layout import (
    GEN_ROW_COLS,
    PEND_COLS,
    ROUND0_COLS,
    PendingRounds,
    SessionBuffers,
)
from blis_fast.kernels.generation.generation_layout import GenClientCol as C
from blis_fast.kernels.generation.generation_layout import GenCount as N
from blis_fast.kernels.generation.generation_layout import GenStatus as S
from blis_fast.kernels.generation.generation_layout import PendCol as P
from blis_fast.kernels.generation.generation_layout import Round0Col as R0
from blis_fast.kernels.generation.generation_rows import (
    close_row,
    draw_length,
    grow_row_data,
    push,
    short_of_room,
    write_row,
)
from blis_fast.kernels.generation.token_ids import (
    draw_token_ids,
    fill_block_digests,
    skip_token_ids,
)
from blis_fast.kernels.go.gomath import go_max, go_min
from blis_fast.kernels.go.gorand import int63
from blis_fast.kernels.jit import njit

NO_MODAL = (0, 0, 0, 0)
"""Multimodal counts of a session round (sessions are text only)."""


# --- pending rounds -----------------------------------------------------------------------------
@njit(cache=True)
def new_pending(keep_ids):
    """Empty pending rounds (256 slots)."""
    return PendingRounds(np.zeros((256, GEN_ROW_COLS), dtype=np.int64),
                         np.zeros(256, dtype=np.float64),
                         np.zeros((256, PEND_COLS), dtype=np.int64), np.empty(256, dtype=np.int64),
                         np.empty(4096, dtype=np.uint64),
                         np.empty(1024 if keep_ids else 0, dtype=np.int32))


@njit(cache=True, _nrt=False, error_model="numpy")
def _pending_short(rows, digests, ids, cnt, n_digests, n_ids):
    """Whether parking a round needs more slots, pool room or id room (PendingRounds arrays)."""
    if cnt[N.FREE] == 0 and cnt[N.PENDING] == rows.shape[0]:
        return True
    if cnt[N.POOL_DIGESTS] + n_digests > digests.shape[0]:
        return True
    return cnt[N.POOL_IDS] + n_ids > ids.shape[0]


@njit(cache=True)
def _grow_pending(pend, cnt, n_digests, n_ids):
    """Pending rounds with a free slot, room for ``n_digests`` digests (the live ones
    compacted into a fresh pool first) and ``n_ids`` ids."""
    p = pend
    if cnt[N.FREE] == 0 and cnt[N.PENDING] == p.rows.shape[0]:
        c = 2 * p.rows.shape[0]
        p = PendingRounds(grow_2d(p.rows, c), grow_1d(p.ratio, c), grow_2d(p.info, c),
                          grow_1d(p.free, c), p.digests, p.ids)
    pool = p.digests
    if cnt[N.POOL_DIGESTS] + n_digests > pool.shape[0]:
        live = 0
        for i in range(cnt[N.PENDING]):
            if p.info[i, P.LIVE]:
                live += p.info[i, P.DIG_LEN]
        pool = np.empty(max(pool.shape[0], 2 * (live + n_digests)), dtype=np.uint64)
        used = 0
        for i in range(cnt[N.PENDING]):
            if p.info[i, P.LIVE]:
                ln = p.info[i, P.DIG_LEN]
                copy_range(pool, used, p.digests, p.info[i, P.DIG_OFF], ln)
                p.info[i, P.DIG_OFF] = used
                used += ln
        cnt[N.POOL_DIGESTS] = used
    ids = p.ids
    if cnt[N.POOL_IDS] + n_ids > ids.shape[0]:
        ids = grow_1d(ids, max(cnt[N.POOL_IDS] + n_ids, 2 * ids.shape[0]))
    return PendingRounds(p.rows, p.ratio, p.info, p.free, pool, ids)


@njit(cache=True, _nrt=False, error_model="numpy")
def _take_slot(free, info, cnt):
    """A pending slot (recycled first; room made beforehand), marked live."""
    if cnt[N.FREE] > 0:
        cnt[N.FREE] -= 1
        slot = free[cnt[N.FREE]]
    else:
        slot = cnt[N.PENDING]
        cnt[N.PENDING] = slot + 1
    info[slot, P.LIVE] = 1
    return slot


@njit(cache=True, _nrt=False, error_model="numpy")
def _park_tokens(slot, info, pool, ids, cnt, tok, n_digests, n_ids, bs, g, g_full, g_doff,
                 g_dig):
    """A parked round's digests (of ``tok``'s first ``n_digests`` blocks) and first ``n_ids``
    ids into the pools (room made beforehand)."""
    npd = cnt[N.POOL_DIGESTS]
    info[slot, P.DIG_OFF] = npd
    if n_digests > 0:
        npd += fill_block_digests(tok, n_digests * bs, bs, g, g_full, g_doff, g_dig, pool, npd)
    info[slot, P.DIG_LEN] = npd - info[slot, P.DIG_OFF]
    cnt[N.POOL_DIGESTS] = npd
    used = cnt[N.POOL_IDS]
    for j in range(n_ids):
        ids[used + j] = tok[j]
    info[slot, P.IDS_OFF] = used
    info[slot, P.IDS_LEN] = n_ids
    cnt[N.POOL_IDS] = used + n_ids


@njit(cache=True, _nrt=False, error_model="numpy")
def release_slot(ref, info, free, cnt):
    """Free pending slot ``ref`` once its round is out (the free list is as long as the slot
    arrays)."""
    free[cnt[N.FREE]] = ref
    cnt[N.FREE] += 1
    info[ref, P.LIVE] = 0


# --- one session --------------------------------------------------------------------------------
@njit(cache=True)
def _grow_sessions(sess, cnt, n_round0_tokens, n_context):
    """Session buffers with room for one more session, ``n_round0_tokens`` captured ids and a
    context of ``n_context`` ids."""
    ns = cnt[N.SESSIONS]
    keys = sess.keys
    round0 = sess.round0
    if ns == keys.shape[0]:
        keys = grow_1d(keys, 2 * ns)
        round0 = grow_1d(round0, 2 * ROUND0_COLS * ns)
    r0_tok = sess.round0_tokens
    need = cnt[N.ROUND0_TOKENS] + n_round0_tokens
    if need > r0_tok.shape[0]:
        r0_tok = grow_1d(r0_tok, max(need, 2 * r0_tok.shape[0]))
    ctx = sess.context
    if n_context > ctx.shape[0]:
        ctx = grow_1d(ctx, max(n_context, 2 * ctx.shape[0]))
    return SessionBuffers(keys, round0, r0_tok, sess.first_input, sess.prefix_capture, ctx)


@njit(cache=True, _nrt=False, error_model="numpy")
def _capture_round0(k, ci, sess, ns, cnt, tok, n_in, olen):
    """Keep what closed-loop blueprints need of round 0 (room made beforehand): its ids
    (accumulating sessions) and the client's first input prefix."""
    if ci[k, C.CAPTURE_ROUND0] != 0:
        nr0 = cnt[N.ROUND0_TOKENS]
        for j in range(n_in + olen):
            sess.round0_tokens[nr0 + j] = tok[j]
        sess.round0[ROUND0_COLS * ns + R0.OFFSET] = nr0
        sess.round0[ROUND0_COLS * ns + R0.INPUT] = n_in
        sess.round0[ROUND0_COLS * ns + R0.OUTPUT] = olen
        cnt[N.ROUND0_TOKENS] = nr0 + n_in + olen
    fc = ci[k, C.PREFIX_CAPTURE]
    if fc > 0 and sess.first_input[k] < 0:
        sess.first_input[k] = n_in
        off = ci[k, C.PREFIX_CAPTURE_OFF]
        for j in range(min(fc, n_in)):
            sess.prefix_capture[off + j] = tok[j]


@njit(cache=True, _nrt=False, error_model="numpy")
def _reason_ratio(s, k, ci, code, off, params):
    """The round's reason ratio draw (0 without a sampler), as a fraction in [0, 1]."""
    if ci[k, C.REASON_RATIO] < 0:
        return 0.0
    pct = draw_length(s, ci[k, C.REASON_RATIO], code, off, params)
    return go_min(1.0, go_max(0.0, float(pct) / 100.0))


@njit(cache=True, inline="always")
def emit_session(s, k, t, cfg, out, sess, pend, heap, tok, cnt, g, plen):
    """All rounds of one session starting at ``t`` (WL-6.2); the heap has room for every
    round. Returns (status, out, sess, pend, tok). Inlined into its one caller (Numba IR):
    as a call it took and returned some thirty reference-counted arrays per session, 4% of a
    multi-turn workload's generation."""
    ci, _cf, code, soff, sp, win_start, win_end, _glen = cfg.clients
    _poff, _ptok, g_full, g_doff, g_dig = cfg.prefixes
    bs = cfg.block_size
    keep_ids = cfg.keep_ids
    w0 = ci[k, C.WINDOW_FIRST]
    w1 = ci[k, C.WINDOW_END]
    drop = ci[k, C.DROP_LATER_ROUNDS] != 0
    accum = ci[k, C.ACCUMULATE] != 0
    ns = cnt[N.SESSIONS]
    if ns == sess.keys.shape[0]:
        sess = _grow_sessions(sess, cnt, 0, 0)
    sess.keys[ns] = int63(s)
    sess.round0[ROUND0_COLS * ns + R0.OFFSET] = -1  # not captured
    sess.round0[ROUND0_COLS * ns + R0.INPUT] = 0
    sess.round0[ROUND0_COLS * ns + R0.OUTPUT] = 0
    cnt[N.SESSIONS] = ns + 1
    ctx = sess.context
    times, ties, kinds, payloads = heap
    rows, ratio, offsets, digests, ids, ids_off = out
    p_rows, p_ratio, p_info, p_free, p_digests, p_ids = pend
    cur = t
    ctx_len = 0
    emitting = True
    for r in range(ci[k, C.ROUNDS]):
        ilen = draw_length(s, ci[k, C.INPUT], code, soff, sp)
        olen = draw_length(s, ci[k, C.OUTPUT], code, soff, sp)
        if ilen < 0 or olen < 0:
            return S.NEGATIVE_LENGTH, out, sess, pend, tok
        keep = not (drop and r > 0)
        body_ctx = ctx_len if (accum and r > 0) else 0
        n_in = plen + body_ctx + ilen
        if keep:
            if n_in + olen > tok.shape[0]:
                tok = grow_1d(tok, max(n_in + olen, 2 * tok.shape[0]))
            copy_range(tok, plen, ctx, 0, body_ctx)
            draw_token_ids(s, tok, plen + body_ctx, ilen + olen)
        else:
            skip_token_ids(s, ilen + olen)
        rv = _reason_ratio(s, k, ci, code, soff, sp)
        emitting = emitting and cur < cfg.horizon
        if emitting and (w1 <= w0 or in_window(cur, w0, w1, win_start, win_end)):
            nch = (n_in + olen) // bs if keep else 0
            nid = n_in if (keep_ids and keep) else 0
            if r == 0:
                n_r0 = n_in + olen if ci[k, C.CAPTURE_ROUND0] != 0 else 0
                if short_of_room(digests, ids, cnt, nch, nid, keep_ids):
                    out = grow_row_data(out, cnt, nch, nid, cfg.limit)
                    rows, ratio, offsets, digests, ids, ids_off = out
                if cnt[N.ROUND0_TOKENS] + n_r0 > sess.round0_tokens.shape[0]:
                    sess = _grow_sessions(sess, cnt, n_r0, 0)
                    ctx = sess.context
                cnt[N.DIGESTS] += fill_block_digests(tok, n_in + olen, bs, g, g_full, g_doff,
                                                     g_dig, digests, cnt[N.DIGESTS])
                row = rows[cnt[N.ROWS]]
                close_row(ratio, offsets, ids, ids_off, cnt, rv, keep_ids, tok, 0, nid)
                _capture_round0(k, ci, sess, ns, cnt, tok, n_in, olen)
            else:
                if _pending_short(p_rows, p_digests, p_ids, cnt, nch, nid):
                    pend = _grow_pending(pend, cnt, nch, nid)
                    p_rows, p_ratio, p_info, p_free, p_digests, p_ids = pend
                slot = _take_slot(p_free, p_info, cnt)
                _park_tokens(slot, p_info, p_digests, p_ids, cnt, tok, nch, nid, bs, g, g_full,
                             g_doff, g_dig)
                p_ratio[slot] = rv
                row = p_rows[slot]
                push(times, ties, kinds, payloads, cnt, cur, k, slot, cfg.tie_shift)
            write_row(row, cur, n_in, olen, plen, k, ns, r, NO_MODAL, 0 if keep else 1)
        if accum and not drop:
            if ctx_len + ilen + olen > ctx.shape[0]:
                sess = _grow_sessions(sess, cnt, 0, ctx_len + ilen + olen)
                ctx = sess.context
            copy_range(ctx, ctx_len, tok, plen + body_ctx, ilen + olen)
            ctx_len += ilen + olen
        cur += ci[k, C.THINK]
        cur += olen
    return S.OK, out, sess, pend, tok
