"""Multi-turn sessions in the generation kernel (WL-6.2, WL-6.4, DELTA-46/49).

A session is drawn whole when its start is popped: every round's lengths, ids and reason
ratio, in the reference's order. Round 0 becomes a row at once; a later round waits in the
heap as a *pending round* (its row, ratio, digests and ids kept in append-only pools) until
its arrival is popped. Rounds past the horizon or outside the client's windows are drawn but
not emitted. Closed-loop conversion marks later rounds dropped (their ids are skipped, not
hashed) and keeps what blueprints need of round 0.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from blis_fast.kernels.arrivals import in_window
from blis_fast.kernels.buffers import grow_1d, grow_2d
from blis_fast.kernels.generation_layout import (
    GEN_ROW_COLS,
    ROUND0_COLS,
    PendingRounds,
    SessionBuffers,
)
from blis_fast.kernels.generation_layout import GenClientCol as C
from blis_fast.kernels.generation_layout import GenCount as N
from blis_fast.kernels.generation_layout import GenStatus as S
from blis_fast.kernels.generation_layout import Round0Col as R0
from blis_fast.kernels.generation_rows import (
    close_row,
    draw_length,
    grow_row_data,
    push,
    short_of_room,
    write_row,
)
from blis_fast.kernels.gomath import go_max, go_min
from blis_fast.kernels.gorand import int63
from blis_fast.kernels.token_ids import draw_token_ids, fill_block_digests, skip_token_ids

NO_MODAL = (0, 0, 0, 0)
"""Multimodal counts of a session round (sessions are text only)."""


# --- pending rounds -----------------------------------------------------------------------------
@njit(cache=True)
def new_pending(keep_ids):
    """Empty pending rounds (256 slots; the free list is as long as the slot arrays)."""
    return PendingRounds(np.zeros((256, GEN_ROW_COLS), dtype=np.int64),
                         np.zeros(256, dtype=np.float64), np.zeros(256, dtype=np.int64),
                         np.zeros(256, dtype=np.int64), np.zeros(256, dtype=np.bool_),
                         np.zeros(256, dtype=np.int64), np.zeros(256, dtype=np.int64),
                         np.empty(256, dtype=np.int64), np.empty(4096, dtype=np.uint64),
                         np.empty(1024 if keep_ids else 0, dtype=np.int32))  # fmt: skip


@njit(cache=True)
def _pending_short(pend, cnt, n_digests, n_ids):
    """Whether parking a round needs a new slot array, pool room or id room."""
    if cnt[N.FREE] == 0 and cnt[N.PENDING] == pend.rows.shape[0]:
        return True
    if cnt[N.POOL_DIGESTS] + n_digests > pend.digests.shape[0]:
        return True
    return cnt[N.POOL_IDS] + n_ids > pend.ids.shape[0]


@njit(cache=True)
def _compact_pool(pend, npend, need):
    """Copy the live pending digests into a fresh pool with room for ``need`` more."""
    live = 0
    for i in range(npend):
        if pend.live[i]:
            live += pend.dig_len[i]
    out = np.empty(max(pend.digests.shape[0], 2 * (live + need)), dtype=np.uint64)
    used = 0
    for i in range(npend):
        if pend.live[i]:
            ln = pend.dig_len[i]
            out[used : used + ln] = pend.digests[pend.dig_off[i] : pend.dig_off[i] + ln]
            pend.dig_off[i] = used
            used += ln
    return out, used


@njit(cache=True)
def _grow_pending(pend, cnt, n_digests, n_ids):
    """Pending rounds with a free slot, room for ``n_digests`` digests (the live ones
    compacted first) and ``n_ids`` ids."""
    p = pend
    if cnt[N.FREE] == 0 and cnt[N.PENDING] == pend.rows.shape[0]:
        c = 2 * pend.rows.shape[0]
        p = PendingRounds(grow_2d(p.rows, c), grow_1d(p.ratio, c), grow_1d(p.dig_off, c),
                          grow_1d(p.dig_len, c), grow_1d(p.live, c), grow_1d(p.ids_off, c),
                          grow_1d(p.ids_len, c), grow_1d(p.free, c), p.digests, p.ids)  # fmt: skip
    pool = p.digests
    if cnt[N.POOL_DIGESTS] + n_digests > pool.shape[0]:
        pool, used = _compact_pool(p, cnt[N.PENDING], n_digests)
        cnt[N.POOL_DIGESTS] = used
    ids = p.ids
    if cnt[N.POOL_IDS] + n_ids > ids.shape[0]:
        ids = grow_1d(ids, max(cnt[N.POOL_IDS] + n_ids, 2 * ids.shape[0]))
    return PendingRounds(p.rows, p.ratio, p.dig_off, p.dig_len, p.live, p.ids_off, p.ids_len,
                         p.free, pool, ids)  # fmt: skip


@njit(cache=True)
def _park_round(cfg, pend, cnt, tok, total, g, keep, ratio, n_ids):
    """Store a later round (digests of ``tok[:total]``, ids ``tok[:n_ids]``; room made
    beforehand) in a free slot; returns the slot."""
    if cnt[N.FREE] > 0:
        cnt[N.FREE] -= 1
        slot = pend.free[cnt[N.FREE]]
    else:
        slot = cnt[N.PENDING]
        cnt[N.PENDING] = slot + 1
    pend.live[slot] = True
    npd = cnt[N.POOL_DIGESTS]
    pend.dig_off[slot] = npd
    if keep:
        npd += fill_block_digests(tok, total, cfg.block_size, g, cfg.prefixes.full_blocks,
                                         cfg.prefixes.digest_off, cfg.prefixes.digests, pend.digests, npd)
    cnt[N.POOL_DIGESTS] = npd
    pend.dig_len[slot] = npd - pend.dig_off[slot]
    pend.ratio[slot] = ratio
    used = cnt[N.POOL_IDS]
    pend.ids_off[slot] = used
    if cfg.keep_ids and keep:
        for j in range(n_ids):
            pend.ids[used + j] = tok[j]
        cnt[N.POOL_IDS] = used + n_ids
    pend.ids_len[slot] = cnt[N.POOL_IDS] - used
    return slot


@njit(cache=True)
def emit_pending_round(ref, keep_ids, out, pend, cnt):
    """Copy pending round ``ref`` out as the next row (room made beforehand), free its slot."""
    ln = pend.dig_len[ref]
    nd = cnt[N.DIGESTS]
    out.digests[nd : nd + ln] = pend.digests[pend.dig_off[ref] : pend.dig_off[ref] + ln]
    cnt[N.DIGESTS] = nd + ln
    out.rows[cnt[N.ROWS]] = pend.rows[ref]
    close_row(out.ratio, out.offsets, out.input_ids, out.input_off, cnt, pend.ratio[ref],
              keep_ids, pend.ids[pend.ids_off[ref] :], pend.ids_len[ref])  # fmt: skip
    pend.free[cnt[N.FREE]] = ref  # the free list is as long as the slot arrays
    cnt[N.FREE] += 1
    pend.live[ref] = False


# --- one session --------------------------------------------------------------------------------
@njit(cache=True)
def _open_session(s, sess, ns):
    """Draw session ``ns``'s id (room made beforehand) and clear its round-0 capture."""
    sess.keys[ns] = int63(s)
    sess.round0[ROUND0_COLS * ns + R0.OFFSET] = -1
    sess.round0[ROUND0_COLS * ns + R0.INPUT] = 0
    sess.round0[ROUND0_COLS * ns + R0.OUTPUT] = 0


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


@njit(cache=True)
def _capture_round0(k, cfg, sess, ns, cnt, tok, in_total, olen):
    """Keep what closed-loop blueprints need of round 0 (room made beforehand): its ids
    (accumulating sessions) and the client's first input prefix."""
    ci = cfg.clients.ints
    if ci[k, C.CAPTURE_ROUND0] != 0:
        nr0 = cnt[N.ROUND0_TOKENS]
        need = nr0 + in_total + olen
        sess.round0_tokens[nr0:need] = tok[: in_total + olen]
        sess.round0[ROUND0_COLS * ns + R0.OFFSET] = nr0
        sess.round0[ROUND0_COLS * ns + R0.INPUT] = in_total
        sess.round0[ROUND0_COLS * ns + R0.OUTPUT] = olen
        cnt[N.ROUND0_TOKENS] = need
    fc = ci[k, C.PREFIX_CAPTURE]
    if fc > 0 and sess.first_input[k] < 0:
        sess.first_input[k] = in_total
        m = min(fc, in_total)
        off = ci[k, C.PREFIX_CAPTURE_OFF]
        sess.prefix_capture[off : off + m] = tok[:m]


@njit(cache=True)
def _emitting(cur, k, cfg):
    """Whether a round starting at ``cur`` is inside the client's windows."""
    w0 = cfg.clients.ints[k, C.WINDOW_FIRST]
    w1 = cfg.clients.ints[k, C.WINDOW_END]
    return w1 <= w0 or in_window(cur, w0, w1, cfg.clients.window_start, cfg.clients.window_end)


@njit(cache=True)
def emit_session(s, k, t, cfg, out, sess, pend, heap, tok, cnt, g, plen):
    """All rounds of one session starting at ``t`` (WL-6.2); the heap has room for every
    round. Returns (status, out, sess, pend, tok)."""
    ci = cfg.clients.ints
    code = cfg.clients.sampler_code
    soff = cfg.clients.sampler_off
    sp = cfg.clients.sampler_params
    accum = ci[k, C.ACCUMULATE] != 0
    drop = ci[k, C.DROP_LATER_ROUNDS] != 0
    ns = cnt[N.SESSIONS]
    if ns == sess.keys.shape[0]:
        sess = _grow_sessions(sess, cnt, 0, 0)
    _open_session(s, sess, ns)
    cnt[N.SESSIONS] = ns + 1
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
        total = plen + body_ctx + ilen + olen
        if not keep:
            skip_token_ids(s, ilen + olen)
        else:
            if total > tok.shape[0]:
                tok = grow_1d(tok, max(total, 2 * tok.shape[0]))
            tok[plen : plen + body_ctx] = sess.context[:body_ctx]
            draw_token_ids(s, tok, plen + body_ctx, ilen + olen)
        rv = 0.0
        if ci[k, C.REASON_RATIO] >= 0:
            pct = draw_length(s, ci[k, C.REASON_RATIO], code, soff, sp)
            rv = go_min(1.0, go_max(0.0, float(pct) / 100.0))
        emitting = emitting and cur < cfg.horizon
        if emitting and _emitting(cur, k, cfg):
            n_in = plen + body_ctx + ilen
            if r == 0:
                if short_of_room(out.digests, out.input_ids, cnt, total // cfg.block_size, n_in,
                                 cfg.keep_ids):  # fmt: skip
                    out = grow_row_data(out, cnt, total // cfg.block_size, n_in, cfg.limit)
                cnt[N.DIGESTS] += fill_block_digests(tok, total, cfg.block_size, g, cfg.prefixes.full_blocks,
                                         cfg.prefixes.digest_off, cfg.prefixes.digests,
                                                     out.digests, cnt[N.DIGESTS])  # fmt: skip
                row = out.rows[cnt[N.ROWS]]
                close_row(out.ratio, out.offsets, out.input_ids, out.input_off, cnt, rv,
                          cfg.keep_ids, tok, n_in)  # fmt: skip
            else:
                nch = total // cfg.block_size if keep else 0
                nid = n_in if (cfg.keep_ids and keep) else 0
                if _pending_short(pend, cnt, nch, nid):
                    pend = _grow_pending(pend, cnt, nch, nid)
                slot = _park_round(cfg, pend, cnt, tok, total, g, keep, rv, nid)
                row = pend.rows[slot]
                push(heap.times, heap.ties, heap.kinds, heap.payloads, cnt, cur, k, slot,
                     cfg.tie_shift)  # fmt: skip
            write_row(row, cur, n_in, olen, plen, k, ns, r, NO_MODAL, 0 if keep else 1)
            if r == 0:
                n_r0 = n_in + olen if ci[k, C.CAPTURE_ROUND0] != 0 else 0
                if cnt[N.ROUND0_TOKENS] + n_r0 > sess.round0_tokens.shape[0]:
                    sess = _grow_sessions(sess, cnt, n_r0, 0)
                _capture_round0(k, cfg, sess, ns, cnt, tok, n_in, olen)
        if accum and not drop:
            if ctx_len + ilen + olen > sess.context.shape[0]:
                sess = _grow_sessions(sess, cnt, 0, ctx_len + ilen + olen)
            start = plen + body_ctx
            sess.context[ctx_len : ctx_len + ilen + olen] = tok[start : start + ilen + olen]
            ctx_len += ilen + olen
        cur += ci[k, C.THINK]
        cur += olen
    return S.OK, out, sess, pend, tok
