"""The request-generation kernel (WL-5, WL-6.2, WL-14.3), as a merge of lazy client streams.

The reference generates every client's requests up to its cap, stable-sorts them all by
arrival and keeps the first ``maxRequests``. Each client draws from its own Go RNG stream, so
its output depends only on its own stream: this kernel advances the streams lazily and merges
them through a heap keyed by ``(arrival, client index, generation order)`` - exactly the order
of the reference's stable sort - and stops once ``maxRequests`` rows are out. Rows therefore
come out already sorted and truncated, and no stream is advanced further than its surviving
requests need. Draw order inside each stream is the reference's: arrival draws, then (for a
request that is generated) lengths and token ids, then the next arrival draws.

Stages of ``generate_kernel``:

1. ``group_prefixes`` (``token_ids.py``): the prefix groups' ids and block digests;
2. ``start_client_streams`` (``arrivals.py``): seeds, first arrivals, and the failures the
   reference meets at a client's first request;
3. ``_merge_streams``: pops the heap and emits each item - one standard request (its draws
   inline, ``_draw_multimodal_request`` for a multimodal one), a whole multi-turn session
   (``emit_session``, ``generation_sessions.py``: round 0 at once, later rounds parked), or a
   parked round whose arrival came (copied out, ``release_slot``); after a request or a
   session it draws the client's next arrival (``next_arrival``);
4. ``_result``: the :class:`GenerationResult`.

Layouts and status codes: ``generation_layout.py``; rows, heap and growth:
``generation_rows.py``.
"""

from __future__ import annotations

import numpy as np

from blis_fast.kernels.buffers import copy_range, grow_1d
from blis_fast.kernels.generation.arrivals import next_arrival, start_client_streams
from blis_fast.kernels.generation.generation_layout import (
    GEN_ROW_COLS,
    ROUND0_COLS,
    GenConfig,
    GenerationResult,
    RowBuffers,
    SessionBuffers,
)
from blis_fast.kernels.generation.generation_layout import GenClientCol as C
from blis_fast.kernels.generation.generation_layout import GenCount as N
from blis_fast.kernels.generation.generation_layout import GenStatus as S
from blis_fast.kernels.generation.generation_layout import PendCol as P
from blis_fast.kernels.generation.generation_rows import (
    close_row,
    draw_length,
    grow_heap,
    grow_row_data,
    grow_rows,
    new_heap,
    pop,
    push,
    short_of_room,
    tie_shift,
    write_row,
)
from blis_fast.kernels.generation.generation_sessions import emit_session, new_pending, release_slot
from blis_fast.kernels.generation.token_ids import (
    draw_token_ids,
    fill_block_digests,
    group_prefixes,
)
from blis_fast.kernels.go.gorand import new_source
from blis_fast.kernels.jit import njit


@njit(cache=True)
def _new_row_buffers(limit, keep_ids):
    """Row buffers sized for ``limit`` rows (at most 2^22 up front), 8 digests a row."""
    cap0 = 1024
    if limit > 0:
        cap0 = max(cap0, min(limit, 1 << 22))
    return RowBuffers(np.zeros((cap0, GEN_ROW_COLS), dtype=np.int64),
                      np.zeros(cap0, dtype=np.float64), np.zeros(cap0 + 1, dtype=np.int64),
                      np.empty(cap0 * 8, dtype=np.uint64),
                      np.empty(4096 if keep_ids else 0, dtype=np.int32),
                      np.zeros(cap0 + 1 if keep_ids else 1, dtype=np.int64))


@njit(cache=True)
def _new_session_buffers(n_clients, prefix_capture_len):
    return SessionBuffers(np.empty(256, dtype=np.int64),
                          np.empty(256 * ROUND0_COLS, dtype=np.int64),
                          np.empty(1024, dtype=np.int32), np.full(n_clients, -1, dtype=np.int64),
                          np.zeros(prefix_capture_len, dtype=np.int64),
                          np.empty(1024, dtype=np.int64))


# --- one standard request -----------------------------------------------------------------------
@njit(cache=True, _nrt=False, error_model="numpy")
def _modality_tokens(s, k, ci, size_col, count_col, code, off, params):
    """Tokens of one modality: a count draw, then that many size draws (0 if unset)."""
    s_size = ci[k, size_col]
    s_cnt = ci[k, count_col]
    total = 0
    if s_size >= 0 and s_cnt >= 0:
        for _ in range(draw_length(s, s_cnt, code, off, params)):
            total += draw_length(s, s_size, code, off, params)
    return total


@njit(cache=True, _nrt=False, error_model="numpy")
def _multimodal_lengths(s, k, ci, code, off, params):
    """Multimodal input length (WL-6.1; an all-zero sum counts as one token) and the
    (text, image, audio, video) counts."""
    text = 0
    if ci[k, C.MM_TEXT] >= 0:
        text = draw_length(s, ci[k, C.MM_TEXT], code, off, params)
    image = _modality_tokens(s, k, ci, C.MM_IMAGE, C.MM_IMAGE_COUNT, code, off, params)
    audio = _modality_tokens(s, k, ci, C.MM_AUDIO, C.MM_AUDIO_COUNT, code, off, params)
    video = _modality_tokens(s, k, ci, C.MM_VIDEO, C.MM_VIDEO_COUNT, code, off, params)
    ilen = text + image + audio + video
    return (ilen if ilen != 0 else 1), (text, image, audio, video)


@njit(cache=True)
def _draw_multimodal_request(s, k, ci, code, off, params, tok, plen):
    """Lengths and ids (after the prefix in ``tok``) of one multimodal request: (status,
    input length, output length, (text, image, audio, video), tok). Its input ids are drawn
    before its output length."""
    ilen, modal = _multimodal_lengths(s, k, ci, code, off, params)
    if ilen < 0:
        return S.NEGATIVE_LENGTH, ilen, ilen, modal, tok
    if plen + ilen > tok.shape[0]:
        tok = grow_1d(tok, max(plen + ilen, 2 * tok.shape[0]))
    draw_token_ids(s, tok, plen, ilen)
    olen = draw_length(s, ci[k, C.OUTPUT], code, off, params)
    if olen < 0:
        return S.NEGATIVE_LENGTH, ilen, olen, modal, tok
    if plen + ilen + olen > tok.shape[0]:
        tok = grow_1d(tok, max(plen + ilen + olen, 2 * tok.shape[0]))
    draw_token_ids(s, tok, plen + ilen, olen)
    return S.OK, ilen, olen, modal, tok


# --- the merge ----------------------------------------------------------------------------------
@njit(cache=True)
def _merge_streams(cfg, streams, out, sess, cnt, multi_turn_on):
    """Pop items in (arrival, client, push order) and emit them until the heap drains or
    ``cfg.limit`` rows are out: (status, out, sess). Works on the arrays of its NamedTuples,
    unpacked again whenever one grows (cost model: ``generation_rows``). ``multi_turn_on`` is
    None when no client is multi-turn: the session code is then left out of the compile."""
    ci, cf, code, soff, sp, win_start, win_end, group_len = cfg.clients
    p_off, p_tok, g_full, g_doff, g_dig = cfg.prefixes
    rng, slot, last_t, count, iv_cursor, iv_off, iv_n, iv, first_found = streams
    bs = cfg.block_size
    keep = cfg.keep_ids
    shift = cfg.tie_shift
    heap = new_heap(max(16, 2 * rng.shape[0]))
    times, ties, kinds, payloads = heap
    for k in range(ci.shape[0]):
        if first_found[k]:
            push(times, ties, kinds, payloads, cnt, last_t[k], k, -1, shift)
    pend = new_pending(keep)
    p_rows, p_ratio, p_info, p_free, p_digests, p_ids = pend
    tok = np.empty(8192, dtype=np.int64)
    rows, ratio, offsets, digests, ids, ids_off = out
    while cnt[N.HEAP] > 0:
        if cfg.limit > 0 and cnt[N.ROWS] >= cfg.limit:
            break
        t, k, ref = pop(times, ties, kinds, payloads, cnt, shift)
        if cnt[N.ROWS] == rows.shape[0]:
            out = grow_rows(out, keep)
            rows, ratio, offsets, digests, ids, ids_off = out
        if multi_turn_on is not None and ref >= 0:  # a pending session round
            ln = p_info[ref, P.DIG_LEN]
            nid = p_info[ref, P.IDS_LEN]
            if short_of_room(digests, ids, cnt, ln, nid, keep):
                out = grow_row_data(out, cnt, ln, nid, cfg.limit)
                rows, ratio, offsets, digests, ids, ids_off = out
            first = p_info[ref, P.DIG_OFF]
            nd = cnt[N.DIGESTS]
            copy_range(digests, nd, p_digests, first, ln)
            cnt[N.DIGESTS] = nd + ln
            rows[cnt[N.ROWS]] = p_rows[ref]
            close_row(ratio, offsets, ids, ids_off, cnt, p_ratio[ref], keep, p_ids,
                      p_info[ref, P.IDS_OFF], nid)
            release_slot(ref, p_info, p_free, cnt)
            continue
        multi_turn = ci[k, C.MULTI_TURN] != 0
        pushes = 1 + (ci[k, C.ROUNDS] if multi_turn else 0)
        if cnt[N.HEAP] + pushes > times.shape[0]:
            heap = grow_heap(heap, cnt[N.HEAP] + pushes)
            times, ties, kinds, payloads = heap
        s = rng[slot[k]]
        g = ci[k, C.GROUP]
        plen = group_len[g] if g >= 0 else 0
        if plen > tok.shape[0]:
            tok = grow_1d(tok, 2 * plen)
        if plen > 0:
            copy_range(tok, 0, p_tok, p_off[g], plen)
        if multi_turn_on is not None and multi_turn:
            status, out, sess, pend, tok = emit_session(s, k, t, cfg, out, sess, pend, heap, tok,
                                                        cnt, g, plen)
            rows, ratio, offsets, digests, ids, ids_off = out
            p_rows, p_ratio, p_info, p_free, p_digests, p_ids = pend
            if status != S.OK:
                return status, out, sess
            if count[k] < 0:
                continue  # single session: no further sessions
            count[k] += ci[k, C.ROUNDS]
        else:
            if ci[k, C.MULTIMODAL] != 0:
                status, ilen, olen, modal, tok = _draw_multimodal_request(s, k, ci, code, soff, sp,
                                                                          tok, plen)
                if status != S.OK:
                    return status, out, sess
            else:  # inline: the common path passes no buffer through a call
                modal = (0, 0, 0, 0)
                ilen = draw_length(s, ci[k, C.INPUT], code, soff, sp)
                olen = draw_length(s, ci[k, C.OUTPUT], code, soff, sp)
                if ilen < 0 or olen < 0:
                    return S.NEGATIVE_LENGTH, out, sess
                if plen + ilen + olen > tok.shape[0]:
                    tok = grow_1d(tok, max(plen + ilen + olen, 2 * tok.shape[0]))
                draw_token_ids(s, tok, plen, ilen + olen)
            nch = (plen + ilen + olen) // bs
            nid = plen + ilen if keep else 0
            if short_of_room(digests, ids, cnt, nch, nid, keep):
                out = grow_row_data(out, cnt, nch, nid, cfg.limit)
                rows, ratio, offsets, digests, ids, ids_off = out
            cnt[N.DIGESTS] += fill_block_digests(tok, plen + ilen + olen, bs, g, g_full, g_doff,
                                                 g_dig, digests, cnt[N.DIGESTS])
            write_row(rows[cnt[N.ROWS]], t, plen + ilen, olen, plen, k, -1, 0, modal, 0)
            close_row(ratio, offsets, ids, ids_off, cnt, 0.0, keep, tok, 0, nid)
            count[k] += 1
        found, t_next, iv_i = next_arrival(s, k, last_t[k], count[k], iv_cursor[k], ci, cf,
                                           win_start, win_end, cfg.horizon, iv, iv_off[k],
                                           iv_n[k])
        last_t[k] = t_next
        iv_cursor[k] = iv_i
        if found:
            push(times, ties, kinds, payloads, cnt, t_next, k, -1, shift)
    return S.OK, out, sess


@njit(cache=True)
def _result(status, err_client, err_sampler, out, sess, cnt, prefixes, keep_ids):
    """Pack the kernel's result (buffers cut to what was used)."""
    n = cnt[N.ROWS]
    ns = cnt[N.SESSIONS]
    return GenerationResult(np.int64(status), np.int64(err_client), np.int64(err_sampler),
                            out.rows[:n], out.ratio[:n], out.offsets[: n + 1], out.digests,
                            sess.keys[:ns], sess.round0[: ROUND0_COLS * ns],
                            sess.round0_tokens[: cnt[N.ROUND0_TOKENS]], sess.first_input,
                            sess.prefix_capture, prefixes.off, prefixes.tokens,
                            out.input_ids[: cnt[N.IDS]],
                            out.input_off[: n + 1] if keep_ids else out.input_off)


@njit(cache=True)
def generate_kernel(wg_seed, clients, horizon, block_size, prefix_capture_len, max_requests,
                    keep_ids, multi_turn_on):
    """Replay the reference's draws and emit the first ``max_requests`` rows in final order.

    ``clients`` is a :class:`ClientParams`; ``prefix_capture_len`` the length of the
    blueprint-prefix capture buffer. Returns a :class:`GenerationResult`. With ``keep_ids``
    != 0 the input token ids of every row are kept (``input_ids[input_off[i]:input_off[i +
    1]]``, group prefix included; empty for rows the conversion drops) for ``blis observe``,
    which builds prompts from them (OBS-4.3); otherwise ``input_off`` stays zero.
    ``multi_turn_on`` is None when no client is multi-turn (any other value otherwise): a
    workload without sessions compiles, and loads, a generator without their code (a
    quarter of the generator's cold compile).
    """
    wg = new_source(wg_seed)
    prefixes = group_prefixes(wg, clients.group_len, block_size)
    n_clients = clients.ints.shape[0]
    cnt = np.zeros(len(N), dtype=np.int64)
    status, err_k, err_s, streams = start_client_streams(wg, clients, horizon)
    if status != S.OK:
        return _result(status, err_k, err_s, _new_row_buffers(0, False),
                       _new_session_buffers(0, 0), cnt, prefixes, False)
    want_ids = keep_ids != 0
    cfg = GenConfig(clients, prefixes, horizon, block_size, max_requests, want_ids,
                    tie_shift(n_clients))
    out = _new_row_buffers(max_requests, want_ids)
    sess = _new_session_buffers(n_clients, prefix_capture_len)
    status, out, sess = _merge_streams(cfg, streams, out, sess, cnt, multi_turn_on)
    return _result(status, -1, -1, out, sess, cnt, prefixes, want_ids)
