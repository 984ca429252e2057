"""The request-generation kernel (WL-5, WL-6.2, WL-14.3), as a merge of lazy client streams.

The reference generates every client's requests up to its cap, stable-sorts them all by
arrival and keeps the first ``maxRequests``. Each client draws from its own Go RNG stream, so
its output depends only on its own stream: this kernel advances the streams lazily and merges
them through a heap keyed by ``(arrival, client index, generation order)`` - exactly the order
of the reference's stable sort - and stops once ``maxRequests`` rows are out. Rows therefore
come out already sorted and truncated, and no stream is advanced further than its surviving
requests need. Draw order inside each stream is the reference's: arrival draws, then (for a
request that is generated) lengths and token ids, then the next arrival draws.

Samplers whose construction fails in the reference (multimodal sub-distributions, reason
ratio) make the reference fail as soon as the client generates its first request; the kernel
reproduces that by checking, in client order, whether such a client has a first arrival.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from blis_fast.kernels.gomath import go_max, go_min
from blis_fast.kernels.gorand import int31n, int63, new_source, seed_source
from blis_fast.kernels.hashing import block_digests, content_digest
from blis_fast.kernels.samplers import (
    ARRIVAL_FACTORY_POISSON,
    ARRIVAL_NORMALIZED_EXP,
    normalized_exp_intervals,
    sample_iat,
    sample_length_at,
)

STATUS_OK = 0
STATUS_NEGATIVE_LENGTH = 1
STATUS_SAMPLER_ERROR = 2

# per-client integer parameters (ci[k, CI_*])
CI_ACTIVE = 0
CI_ARR = 1
CI_IAT = 2
CI_NCOUNT = 3
CI_NDUR = 4
CI_GROUP = 5
CI_IN = 6
CI_OUT = 7
CI_MM = 8
CI_MM0 = 9  # text, image, image_count, audio, audio_count, video, video_count: 9..15
CI_RR = 16
CI_MT = 17
CI_ROUNDS = 18
CI_THINK = 19
CI_ACCUM = 20
CI_SINGLE = 21
CI_DROP = 22
CI_CAPR0 = 23
CI_FCAP = 24
CI_FCAP_OFF = 25
CI_WIN0 = 26
CI_WIN1 = 27
CI_CAP = 28
N_CI = 29
# per-client float parameters
CF_RATE = 0
CF_P1 = 1
CF_P2 = 2
N_CF = 3
# row columns
R_ARR = 0
R_IN = 1
R_OUT = 2
R_PRE = 3
R_CLIENT = 4
R_SESS = 5
R_ROUND = 6
R_TEXT = 7
R_IMAGE = 8
R_AUDIO = 9
R_VIDEO = 10
R_DROP = 11
N_R = 12


# --- small helpers ----------------------------------------------------------------------------
@njit(cache=True)
def _grow_1d(a, cap):
    """Copy of ``a`` with capacity ``cap`` (contents kept)."""
    b = np.empty(cap, dtype=a.dtype)
    b[: a.shape[0]] = a
    return b


@njit(cache=True)
def _grow_2d(a, cap):
    b = np.zeros((cap, a.shape[1]), dtype=a.dtype)
    b[: a.shape[0]] = a
    return b


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
def _compact_pool(pdig, pdoff, pdlen, plive, npend, need):
    """Copy the live pending digests into a fresh pool with room for ``need`` more."""
    live = 0
    for i in range(npend):
        if plive[i]:
            live += pdlen[i]
    cap = max(pdig.shape[0], 2 * (live + need))
    out = np.empty(cap, dtype=np.uint64)
    used = 0
    for i in range(npend):
        if plive[i]:
            ln = pdlen[i]
            out[used : used + ln] = pdig[pdoff[i] : pdoff[i] + ln]
            pdoff[i] = used
            used += ln
    return out, used


@njit(cache=True)
def _put_ids(buf, used, src, start, count):
    """Append ``src[start:start+count]`` to the int32 id buffer ``buf`` (grown as needed)."""
    if used + count > buf.shape[0]:
        buf = _grow_1d(buf, max(used + count, 2 * buf.shape[0]))
    for j in range(count):
        buf[used + j] = src[start + j]
    return buf, used + count


@njit(cache=True)
def _in_window(t, w0, w1, win_start, win_end):
    for w in range(w0, w1):
        if win_start[w] <= t < win_end[w]:
            return True
    return False


_VMAX_128000 = 2147483647 - (2147483648 % 128000)


@njit(cache=True)
def draw_token_ids(s, tok, start, count):
    """``count`` token ids ``Intn(128000)`` into ``tok[start:]`` (Go's Int31n, inlined).

    Same draws as ``gorand.int31n(s, 128000)`` repeated, with the generator's cursor kept in
    registers; between wrap-arounds of the two cursors the steps run without wrap checks.
    """
    tap = s[607]
    feed = s[608]
    i = start
    end = start + count
    while i < end:
        if tap == 0:  # wrap now: the next step reads index 606, as `tap -= 1; tap += 607`
            tap = 607
        if feed == 0:
            feed = 607
        for _ in range(min(tap, feed, end - i)):  # steps before a cursor wraps, <= 1 id each
            tap -= 1
            feed -= 1
            x = s[feed] + s[tap]
            s[feed] = x
            v = (x & 0x7FFFFFFFFFFFFFFF) >> 32
            if v <= _VMAX_128000:  # else rejected: the step is spent, no id
                tok[i] = v % 128000
                i += 1
    s[607] = tap
    s[608] = feed


@njit(cache=True)
def _skip_ids(s, count):
    """Advance ``s`` past ``count`` token-id draws (values discarded)."""
    tap = s[607]
    feed = s[608]
    for _ in range(count):
        while True:
            tap -= 1
            if tap < 0:
                tap += 607
            feed -= 1
            if feed < 0:
                feed += 607
            x = s[feed] + s[tap]
            s[feed] = x
            if (x & 0x7FFFFFFFFFFFFFFF) >> 32 <= _VMAX_128000:
                break
    s[607] = tap
    s[608] = feed


@njit(cache=True)
def _fill_digests(tok, total, bs, g, g_full, g_doff, g_dig, digests, nd):
    """Digests of the full blocks of ``tok[:total]`` at ``digests[nd:]``; group blocks reused."""
    nchunks = total // bs
    c0 = 0
    if g >= 0:
        c0 = min(g_full[g], nchunks)
        for c in range(c0):
            digests[nd + c] = g_dig[g_doff[g] + c]
    block_digests(tok, c0 * bs, bs, nchunks - c0, digests, nd + c0)
    return nchunks


@njit(cache=True)
def prefixes(wg, group_len, bs):
    """Group prefixes (first-appearance order) and the digests of their full blocks."""
    n_groups = group_len.shape[0]
    g_off = np.zeros(n_groups + 1, dtype=np.int64)
    for g in range(n_groups):
        g_off[g + 1] = g_off[g] + group_len[g]
    prefix_tok = np.empty(g_off[n_groups], dtype=np.int64)
    for i in range(g_off[n_groups]):
        prefix_tok[i] = int31n(wg, 128000)
    g_full = np.zeros(n_groups, dtype=np.int64)
    g_doff = np.zeros(n_groups + 1, dtype=np.int64)
    for g in range(n_groups):
        g_full[g] = group_len[g] // bs
        g_doff[g + 1] = g_doff[g] + g_full[g]
    g_dig = np.empty(g_doff[n_groups], dtype=np.uint64)
    for g in range(n_groups):
        for c in range(g_full[g]):
            g_dig[g_doff[g] + c] = content_digest(prefix_tok, g_off[g] + c * bs, bs)
    return g_off, prefix_tok, g_full, g_doff, g_dig


# --- heap of pending items: rows (arrival, client, seq, ref) ------------------------------------
@njit(cache=True)
def _h_less(h, i, j):
    if h[i, 0] != h[j, 0]:
        return h[i, 0] < h[j, 0]
    if h[i, 1] != h[j, 1]:
        return h[i, 1] < h[j, 1]
    return h[i, 2] < h[j, 2]


@njit(cache=True)
def _h_swap(h, i, j):
    for c in range(4):
        x = h[i, c]
        h[i, c] = h[j, c]
        h[j, c] = x


@njit(cache=True)
def _h_push(h, hn, t, k, seq, ref):
    if hn == h.shape[0]:
        h = _grow_2d(h, 2 * hn)
    h[hn, 0] = t
    h[hn, 1] = k
    h[hn, 2] = seq
    h[hn, 3] = ref
    i = hn
    while i > 0:
        p = (i - 1) // 2
        if _h_less(h, i, p):
            _h_swap(h, i, p)
            i = p
        else:
            break
    return h, hn + 1


@njit(cache=True)
def _h_pop(h, hn):
    t = h[0, 0]
    k = h[0, 1]
    ref = h[0, 3]
    hn -= 1
    if hn > 0:
        for c in range(4):
            h[0, c] = h[hn, c]
        i = 0
        while True:
            left = 2 * i + 1
            if left >= hn:
                break
            m = left
            if left + 1 < hn and _h_less(h, left + 1, left):
                m = left + 1
            if _h_less(h, m, i):
                _h_swap(h, m, i)
                i = m
            else:
                break
    return t, k, ref, hn


# --- arrivals ---------------------------------------------------------------------------------
@njit(cache=True)
def _next_iat(s, acode, iat_const, rate, p1, p2, iv, iv_off, iv_n, iv_i):
    """One inter-arrival draw; 0 = the normalized-exponential sampler is exhausted."""
    if acode == ARRIVAL_NORMALIZED_EXP:
        if iv_i >= iv_n:
            return np.int64(0), iv_i + 1
        return iv[iv_off + iv_i], iv_i + 1
    return sample_iat(s, acode, iat_const, rate, p1, p2), iv_i


@njit(cache=True)
def _advance(s, k, t, count, iv_i, ci, cf, win_start, win_end, horizon, iv, iv_off, iv_n):
    """Next arrival of a standard / multi-session client: (found, t, iv_i)."""
    acode = ci[k, CI_ARR]
    cap = ci[k, CI_CAP]
    w0 = ci[k, CI_WIN0]
    w1 = ci[k, CI_WIN1]
    has_win = w1 > w0
    last_end = np.int64(0)
    for w in range(w0, w1):
        if win_end[w] > last_end:
            last_end = win_end[w]
    while True:
        if not t < horizon:
            return False, t, iv_i
        if cap > 0 and count >= cap:
            return False, t, iv_i
        iat, iv_i = _next_iat(s, acode, ci[k, CI_IAT], cf[k, CF_RATE], cf[k, CF_P1],
                              cf[k, CF_P2], iv, iv_off, iv_n, iv_i)  # fmt: skip
        if iat == 0:
            return False, t, iv_i
        t += iat
        if t >= horizon:
            return False, t, iv_i
        if has_win and not _in_window(t, w0, w1, win_start, win_end):
            if t >= last_end:
                return False, t, iv_i
            continue
        return True, t, iv_i


@njit(cache=True)
def _single_start(s, k, ci, cf, win_start, win_end, horizon, iv, iv_off, iv_n):
    """Single-session start: (found, start, iv_i)."""
    iat, iv_i = _next_iat(s, ci[k, CI_ARR], ci[k, CI_IAT], cf[k, CF_RATE], cf[k, CF_P1],
                          cf[k, CF_P2], iv, iv_off, iv_n, 0)  # fmt: skip
    if iat == 0:
        return False, np.int64(0), iv_i
    w0 = ci[k, CI_WIN0]
    w1 = ci[k, CI_WIN1]
    start = iat
    if w1 > w0:
        start = win_start[w0] + iat
    if start >= horizon:
        return False, start, iv_i
    if w1 > w0 and not _in_window(start, w0, w1, win_start, win_end):
        return False, start, iv_i
    return True, start, iv_i


@njit(cache=True)
def _first_invalid_lazy(k, ci, s_code):
    """The sampler the reference builds (and fails on) at the client's first request, or -1."""
    if ci[k, CI_MT] != 0:
        s_rr = ci[k, CI_RR]
        if s_rr >= 0 and s_code[s_rr] < 0:
            return s_rr
        return -1
    if ci[k, CI_MM] == 0:
        return -1
    s_t = ci[k, CI_MM0]
    if s_t >= 0 and s_code[s_t] < 0:
        return s_t
    for m in range(3):
        s_size = ci[k, CI_MM0 + 1 + 2 * m]
        s_cnt = ci[k, CI_MM0 + 2 + 2 * m]
        if s_size >= 0 and s_cnt >= 0:
            if s_code[s_cnt] < 0:
                return s_cnt
            if s_code[s_size] < 0:
                return s_size
    return -1


@njit(cache=True)
def _always_negative(code, sp, off):
    """Whether every draw of a sampler is negative (the reference panics on the first one)."""
    if code == 0:  # gaussian with min == max < 0: no draw, no floor
        return sp[off + 2] == sp[off + 3] and sp[off + 2] < 0
    if code == 4:  # empirical: every bin negative (no floor)
        nb = np.int64(sp[off])
        if nb == 0:
            return False
        for i in range(nb):
            if sp[off + 1 + i] >= 0:
                return False
        return True
    return False


@njit(cache=True)
def _first_request_negative(k, ci, s_code, s_off, sp):
    """Whether the client's first request certainly has a negative length."""
    s_out = ci[k, CI_OUT]
    if _always_negative(s_code[s_out], sp, s_off[s_out]):
        return True
    if ci[k, CI_MT] == 0 and ci[k, CI_MM] != 0:
        return False
    s_in = ci[k, CI_IN]
    return _always_negative(s_code[s_in], sp, s_off[s_in])


@njit(cache=True)
def _error_result(status, k, sampler, g_off, prefix_tok):
    """The kernel's result tuple for an early failure (no rows)."""
    z = np.zeros(0, dtype=np.int64)
    return (np.int64(status), np.int64(k), np.int64(sampler), np.zeros((0, N_R), dtype=np.int64),
            np.zeros(0), np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.uint64), z, z,
            np.zeros(0, dtype=np.int32), z, z, g_off, prefix_tok, np.zeros(0, dtype=np.int32),
            np.zeros(1, dtype=np.int64))  # fmt: skip


# --- the kernel -------------------------------------------------------------------------------
@njit(cache=True)
def generate_kernel(wg_seed, group_len, ci, cf, s_code, s_off, sp, win_start, win_end,
                    horizon, block_size, fcap_total, max_requests, keep_ids):  # fmt: skip
    """Replay the reference's draws and emit the first ``max_requests`` rows in final order.

    Returns (status, err_client, err_sampler, rows, ratio, offsets, digest_buffer, sess_val,
    sess_r0, r0_tok, first_in, fcap_tok, g_off, prefix_tok, in_ids, in_off); the digests are
    ``digest_buffer[:offsets[-1]]``. With ``keep_ids`` != 0 the input token ids of every row
    are kept (``in_ids[in_off[i]:in_off[i + 1]]``, group prefix included; empty for rows the
    conversion drops) for ``blis observe``, which builds prompts from them (OBS-4.3);
    otherwise ``in_off`` stays zero.
    """
    wg = new_source(wg_seed)
    bs = block_size
    g_off, prefix_tok, g_full, g_doff, g_dig = prefixes(wg, group_len, bs)
    n_clients = ci.shape[0]
    limit = max_requests

    # ---- client streams, first arrivals -------------------------------------------------
    act = np.full(n_clients, -1, dtype=np.int64)
    n_act = 0
    for k in range(n_clients):
        if ci[k, CI_ACTIVE] != 0:
            act[k] = n_act
            n_act += 1
    st = np.empty((max(n_act, 1), 609), dtype=np.int64)
    cl_t = np.zeros(n_clients, dtype=np.int64)
    cl_count = np.zeros(n_clients, dtype=np.int64)
    cl_iv_i = np.zeros(n_clients, dtype=np.int64)
    iv_off = np.zeros(n_clients, dtype=np.int64)
    iv_n = np.zeros(n_clients, dtype=np.int64)
    iv = np.zeros(16, dtype=np.int64)
    iv_used = 0
    h = np.zeros((max(16, 2 * n_act), 4), dtype=np.int64)
    hn = 0
    seq = 0
    status = STATUS_OK
    err_k = -1
    err_s = -1
    for k in range(n_clients):
        a = act[k]
        if a < 0:
            continue  # rate <= 0: skipped, and no client seed is drawn
        s = st[a]
        seed_source(s, int63(wg))
        acode = ci[k, CI_ARR]
        if acode == ARRIVAL_NORMALIZED_EXP:
            sub = new_source(int63(s))
            vals = normalized_exp_intervals(sub, ci[k, CI_NCOUNT], ci[k, CI_NDUR])
            if iv_used + vals.shape[0] > iv.shape[0]:
                iv = _grow_1d(iv, max(2 * iv.shape[0], iv_used + vals.shape[0]))
            iv[iv_used : iv_used + vals.shape[0]] = vals
            iv_off[k] = iv_used
            iv_n[k] = vals.shape[0]
            iv_used += vals.shape[0]
        elif acode == ARRIVAL_FACTORY_POISSON:
            int63(s)  # the factory's sub-stream seed; the Poisson sampler draws from s
        if s_code[ci[k, CI_IN]] < 0:
            return _error_result(STATUS_SAMPLER_ERROR, k, ci[k, CI_IN], g_off, prefix_tok)
        if s_code[ci[k, CI_OUT]] < 0:
            return _error_result(STATUS_SAMPLER_ERROR, k, ci[k, CI_OUT], g_off, prefix_tok)
        lazy = _first_invalid_lazy(k, ci, s_code)
        neg = lazy < 0 and _first_request_negative(k, ci, s_code, s_off, sp)
        single = ci[k, CI_MT] != 0 and ci[k, CI_SINGLE] != 0
        if lazy >= 0 or neg:
            probe = s.copy()
            if single:
                found, _t, _i = _single_start(probe, k, ci, cf, win_start, win_end, horizon,
                                              iv, iv_off[k], iv_n[k])  # fmt: skip
            else:
                found, _t, _i = _advance(probe, k, np.int64(0), 0, 0, ci, cf, win_start,
                                         win_end, horizon, iv, iv_off[k], iv_n[k])  # fmt: skip
            if found:
                st_code = STATUS_SAMPLER_ERROR if lazy >= 0 else STATUS_NEGATIVE_LENGTH
                return _error_result(st_code, k, lazy, g_off, prefix_tok)
        if single:
            found, t0, iv_i = _single_start(s, k, ci, cf, win_start, win_end, horizon, iv,
                                            iv_off[k], iv_n[k])  # fmt: skip
            cl_count[k] = -1  # no further sessions
        else:
            found, t0, iv_i = _advance(s, k, np.int64(0), 0, 0, ci, cf, win_start, win_end,
                                       horizon, iv, iv_off[k], iv_n[k])  # fmt: skip
        cl_iv_i[k] = iv_i
        cl_t[k] = t0
        if found:
            h, hn = _h_push(h, hn, t0, k, seq, -1)
            seq += 1

    # ---- outputs --------------------------------------------------------------------------
    cap0 = 1024
    if limit > 0:
        cap0 = max(cap0, min(limit, 1 << 22))
    rows = np.zeros((cap0, N_R), dtype=np.int64)
    ratio = np.zeros(cap0, dtype=np.float64)
    offsets = np.zeros(cap0 + 1, dtype=np.int64)
    digests = np.empty(cap0 * 8, dtype=np.uint64)
    # pending session rounds (round >= 1), their digests in an append-only pool
    prow = np.zeros((256, N_R), dtype=np.int64)
    pratio = np.zeros(256, dtype=np.float64)
    pdoff = np.zeros(256, dtype=np.int64)
    pdlen = np.zeros(256, dtype=np.int64)
    plive = np.zeros(256, dtype=np.bool_)
    pdig = np.empty(4096, dtype=np.uint64)
    npend = 0
    npd = 0
    free = np.empty(256, dtype=np.int64)  # recycled pending slots
    nfree = 0
    sess_val = np.empty(256, dtype=np.int64)
    sess_r0 = np.empty(256 * 3, dtype=np.int64)  # (offset into r0_tok, input len, output len)
    r0_tok = np.empty(1024, dtype=np.int32)
    first_in = np.full(n_clients, -1, dtype=np.int64)
    fcap_tok = np.zeros(fcap_total, dtype=np.int64)
    tok = np.empty(8192, dtype=np.int64)
    ctx = np.empty(1024, dtype=np.int64)
    want_ids = keep_ids != 0
    in_ids = np.empty(4096 if want_ids else 0, dtype=np.int32)
    in_off = np.zeros(cap0 + 1 if want_ids else 1, dtype=np.int64)
    n_ids = 0
    p_ids = np.empty(1024 if want_ids else 0, dtype=np.int32)  # pending rounds' ids, append-only
    p_idoff = np.zeros(256, dtype=np.int64)
    p_idlen = np.zeros(256, dtype=np.int64)
    np_ids = 0
    n = 0
    nd = 0
    ns = 0
    nr0 = 0

    while hn > 0:
        if limit > 0 and n >= limit:
            break
        t, k, ref, hn = _h_pop(h, hn)
        if n == rows.shape[0]:
            cap = 2 * n
            rows = _grow_2d(rows, cap)
            ratio = _grow_1d(ratio, cap)
            offsets = _grow_1d(offsets, cap + 1)
            if want_ids:
                in_off = _grow_1d(in_off, cap + 1)
        if ref >= 0:
            # a pending session round: copy it out
            ln = pdlen[ref]
            if nd + ln > digests.shape[0]:
                digests = _grow_1d(digests, _digest_capacity(digests.shape[0], nd + ln, nd, n,
                                                             limit))  # fmt: skip
            digests[nd : nd + ln] = pdig[pdoff[ref] : pdoff[ref] + ln]
            nd += ln
            rows[n] = prow[ref]
            ratio[n] = pratio[ref]
            offsets[n + 1] = nd
            if want_ids:
                in_ids, n_ids = _put_ids(in_ids, n_ids, p_ids, p_idoff[ref], p_idlen[ref])
                in_off[n + 1] = n_ids
            n += 1
            if nfree == free.shape[0]:
                free = _grow_1d(free, 2 * nfree)
            free[nfree] = ref
            nfree += 1
            plive[ref] = False
            continue

        s = st[act[k]]
        g = ci[k, CI_GROUP]
        plen = group_len[g] if g >= 0 else 0
        w0 = ci[k, CI_WIN0]
        w1 = ci[k, CI_WIN1]
        has_win = w1 > w0
        s_in = ci[k, CI_IN]
        s_out = ci[k, CI_OUT]
        if plen > tok.shape[0]:
            tok = np.empty(2 * plen, dtype=np.int64)
        if plen > 0:
            tok[:plen] = prefix_tok[g_off[g] : g_off[g] + plen]

        if ci[k, CI_MT] != 0:
            # ---- one session (GenerateReasoningRequests), all rounds drawn ----
            rounds = ci[k, CI_ROUNDS]
            think = ci[k, CI_THINK]
            accum = ci[k, CI_ACCUM] != 0
            drop = ci[k, CI_DROP] != 0
            s_rr = ci[k, CI_RR]
            sid = int63(s)
            if ns == sess_val.shape[0]:
                sess_val = _grow_1d(sess_val, 2 * ns)
                sess_r0 = _grow_1d(sess_r0, 6 * ns)
            sess_val[ns] = sid
            sess_r0[3 * ns] = -1
            sess_r0[3 * ns + 1] = 0
            sess_r0[3 * ns + 2] = 0
            cur = t
            ctx_len = 0
            emitting = True
            for r in range(rounds):
                ilen = sample_length_at(s, s_code[s_in], sp, s_off[s_in])
                olen = sample_length_at(s, s_code[s_out], sp, s_off[s_out])
                if ilen < 0 or olen < 0:
                    status = STATUS_NEGATIVE_LENGTH
                    break
                keep = not (drop and r > 0)
                body_ctx = ctx_len if (accum and r > 0) else 0
                total = plen + body_ctx + ilen + olen
                if keep:
                    if total > tok.shape[0]:
                        tok = _grow_1d(tok, max(total, 2 * tok.shape[0]))
                    if body_ctx > 0:
                        tok[plen : plen + body_ctx] = ctx[:body_ctx]
                    draw_token_ids(s, tok, plen + body_ctx, ilen + olen)
                else:
                    _skip_ids(s, ilen + olen)
                rv = 0.0
                if s_rr >= 0:
                    pct = sample_length_at(s, s_code[s_rr], sp, s_off[s_rr])
                    rv = go_min(1.0, go_max(0.0, float(pct) / 100.0))
                emit = False
                if emitting:
                    if cur >= horizon:
                        emitting = False
                    elif not has_win or _in_window(cur, w0, w1, win_start, win_end):
                        emit = True
                if emit:
                    if r == 0:
                        nch = total // bs
                        if nd + nch > digests.shape[0]:
                            digests = _grow_1d(digests, _digest_capacity(
                                digests.shape[0], nd + nch, nd, n, limit))  # fmt: skip
                        nd += _fill_digests(tok, total, bs, g, g_full, g_doff, g_dig,
                                            digests, nd)  # fmt: skip
                        row = rows[n]
                        ratio[n] = rv
                        offsets[n + 1] = nd
                        if want_ids:
                            in_ids, n_ids = _put_ids(in_ids, n_ids, tok, 0, plen + ilen)
                            in_off[n + 1] = n_ids
                        n += 1
                    else:
                        if nfree > 0:
                            nfree -= 1
                            slot = free[nfree]
                        else:
                            if npend == prow.shape[0]:
                                prow = _grow_2d(prow, 2 * npend)
                                pratio = _grow_1d(pratio, 2 * npend)
                                pdoff = _grow_1d(pdoff, 2 * npend)
                                pdlen = _grow_1d(pdlen, 2 * npend)
                                plive = _grow_1d(plive, 2 * npend)
                                p_idoff = _grow_1d(p_idoff, 2 * npend)
                                p_idlen = _grow_1d(p_idlen, 2 * npend)
                            slot = npend
                            npend += 1
                        plive[slot] = False
                        nch = total // bs if keep else 0
                        if npd + nch > pdig.shape[0]:
                            pdig, npd = _compact_pool(pdig, pdoff, pdlen, plive, npend, nch)
                        plive[slot] = True
                        pdoff[slot] = npd
                        if keep:
                            npd += _fill_digests(tok, total, bs, g, g_full, g_doff, g_dig,
                                                 pdig, npd)  # fmt: skip
                        pdlen[slot] = npd - pdoff[slot]
                        pratio[slot] = rv
                        p_idoff[slot] = np_ids
                        if want_ids and keep:
                            p_ids, np_ids = _put_ids(p_ids, np_ids, tok, 0,
                                                     plen + body_ctx + ilen)  # fmt: skip
                        p_idlen[slot] = np_ids - p_idoff[slot]
                        row = prow[slot]
                        h, hn = _h_push(h, hn, cur, k, seq, slot)
                        seq += 1
                    row[R_ARR] = cur
                    row[R_IN] = plen + body_ctx + ilen
                    row[R_OUT] = olen
                    row[R_PRE] = plen
                    row[R_CLIENT] = k
                    row[R_SESS] = ns
                    row[R_ROUND] = r
                    row[R_TEXT] = 0
                    row[R_IMAGE] = 0
                    row[R_AUDIO] = 0
                    row[R_VIDEO] = 0
                    row[R_DROP] = 0 if keep else 1
                    if r == 0:
                        in_total = plen + ilen
                        if ci[k, CI_CAPR0] != 0:
                            need = nr0 + in_total + olen
                            if need > r0_tok.shape[0]:
                                r0_tok = _grow_1d(r0_tok, max(need, 2 * r0_tok.shape[0]))
                            r0_tok[nr0:need] = tok[: in_total + olen]
                            sess_r0[3 * ns] = nr0
                            sess_r0[3 * ns + 1] = in_total
                            sess_r0[3 * ns + 2] = olen
                            nr0 = need
                        fc = ci[k, CI_FCAP]
                        if fc > 0 and first_in[k] < 0:
                            first_in[k] = in_total
                            m = min(fc, in_total)
                            off = ci[k, CI_FCAP_OFF]
                            fcap_tok[off : off + m] = tok[:m]
                if accum and not drop:
                    need = ctx_len + ilen + olen
                    if need > ctx.shape[0]:
                        ctx = _grow_1d(ctx, max(need, 2 * ctx.shape[0]))
                    ctx[ctx_len:need] = tok[plen + body_ctx : plen + body_ctx + ilen + olen]
                    ctx_len = need
                cur += think
                cur += olen
            ns += 1
            if status != STATUS_OK:
                break
            if cl_count[k] < 0:
                continue  # single session: no further sessions
            cl_count[k] += rounds
        else:
            # ---- one standard request ----
            tt = 0
            ti = 0
            ta = 0
            tv = 0
            if ci[k, CI_MM] != 0:
                s_t = ci[k, CI_MM0]
                if s_t >= 0:
                    tt = sample_length_at(s, s_code[s_t], sp, s_off[s_t])
                for m in range(3):
                    s_size = ci[k, CI_MM0 + 1 + 2 * m]
                    s_cnt = ci[k, CI_MM0 + 2 + 2 * m]
                    acc = 0
                    if s_size >= 0 and s_cnt >= 0:
                        cnt = sample_length_at(s, s_code[s_cnt], sp, s_off[s_cnt])
                        for _ in range(cnt):
                            acc += sample_length_at(s, s_code[s_size], sp, s_off[s_size])
                    if m == 0:
                        ti = acc
                    elif m == 1:
                        ta = acc
                    else:
                        tv = acc
                ilen = tt + ti + ta + tv
                if ilen == 0:
                    ilen = 1
                if ilen < 0:
                    status = STATUS_NEGATIVE_LENGTH
                    break
                if plen + ilen > tok.shape[0]:
                    tok = _grow_1d(tok, max(plen + ilen, 2 * tok.shape[0]))
                draw_token_ids(s, tok, plen, ilen)
                olen = sample_length_at(s, s_code[s_out], sp, s_off[s_out])
                if olen < 0:
                    status = STATUS_NEGATIVE_LENGTH
                    break
                total = plen + ilen + olen
                if total > tok.shape[0]:
                    tok = _grow_1d(tok, max(total, 2 * tok.shape[0]))
                draw_token_ids(s, tok, plen + ilen, olen)
            else:
                ilen = sample_length_at(s, s_code[s_in], sp, s_off[s_in])
                olen = sample_length_at(s, s_code[s_out], sp, s_off[s_out])
                if ilen < 0 or olen < 0:
                    status = STATUS_NEGATIVE_LENGTH
                    break
                total = plen + ilen + olen
                if total > tok.shape[0]:
                    tok = _grow_1d(tok, max(total, 2 * tok.shape[0]))
                draw_token_ids(s, tok, plen, ilen + olen)
            nch = total // bs
            if nd + nch > digests.shape[0]:
                digests = _grow_1d(digests, _digest_capacity(digests.shape[0], nd + nch, nd, n,
                                                             limit))  # fmt: skip
            nd += _fill_digests(tok, total, bs, g, g_full, g_doff, g_dig, digests, nd)
            row = rows[n]
            row[R_ARR] = t
            row[R_IN] = plen + ilen
            row[R_OUT] = olen
            row[R_PRE] = plen
            row[R_CLIENT] = k
            row[R_SESS] = -1
            row[R_ROUND] = 0
            row[R_TEXT] = tt
            row[R_IMAGE] = ti
            row[R_AUDIO] = ta
            row[R_VIDEO] = tv
            row[R_DROP] = 0
            ratio[n] = 0.0
            offsets[n + 1] = nd
            if want_ids:
                in_ids, n_ids = _put_ids(in_ids, n_ids, tok, 0, plen + ilen)
                in_off[n + 1] = n_ids
            n += 1
            cl_count[k] += 1

        # ---- the client's next arrival ----
        found, t_next, iv_i = _advance(s, k, cl_t[k], cl_count[k], cl_iv_i[k], ci, cf,
                                       win_start, win_end, horizon, iv, iv_off[k], iv_n[k])  # fmt: skip
        cl_t[k] = t_next
        cl_iv_i[k] = iv_i
        if found:
            h, hn = _h_push(h, hn, t_next, k, seq, -1)
            seq += 1

    return (np.int64(status), np.int64(err_k), np.int64(err_s), rows[:n], ratio[:n],
            offsets[: n + 1], digests,
            sess_val[:ns], sess_r0[: 3 * ns], r0_tok[:nr0], first_in, fcap_tok, g_off,
            prefix_tok, in_ids[:n_ids], in_off[: n + 1] if want_ids else in_off)  # fmt: skip


@njit(cache=True)
def concurrency_kernel(crng_seed, u_client, u_arrival, ci, s_code, s_off, sp, group_len, g_off,
                       prefix_tok, block_size, keep_ids):  # fmt: skip
    """DELTA-47 seeds: per user, a user stream from ``crng``, one request, a blueprint seed.

    With ``keep_ids`` != 0 each seed's input token ids are kept as in ``generate_kernel``.
    """
    crng = new_source(crng_seed)
    m = u_client.shape[0]
    rows = np.zeros((m, N_R), dtype=np.int64)
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
        s_in = ci[k, CI_IN]
        s_out = ci[k, CI_OUT]
        ilen = sample_length_at(us, s_code[s_in], sp, s_off[s_in])
        olen = sample_length_at(us, s_code[s_out], sp, s_off[s_out])
        if ilen < 0 or olen < 0:
            return STATUS_NEGATIVE_LENGTH, rows, offsets, digests[:0], bp_seed, in_ids, in_off
        g = ci[k, CI_GROUP]
        plen = group_len[g] if g >= 0 else 0
        total = plen + ilen + olen
        if total > tok.shape[0]:
            tok = np.empty(max(total, 2 * tok.shape[0]), dtype=np.int64)
        if plen > 0:
            tok[:plen] = prefix_tok[g_off[g] : g_off[g] + plen]
        draw_token_ids(us, tok, plen, ilen + olen)
        nch = total // block_size
        if nd + nch > digests.shape[0]:
            digests = _grow_1d(digests, max(digests.shape[0] + digests.shape[0] // 2, nd + nch))
        block_digests(tok, 0, block_size, nch, digests, nd)
        nd += nch
        rows[i, R_ARR] = u_arrival[i]
        rows[i, R_IN] = plen + ilen
        rows[i, R_OUT] = olen
        rows[i, R_PRE] = plen
        rows[i, R_CLIENT] = k
        rows[i, R_SESS] = -1
        offsets[i + 1] = nd
        if keep_ids != 0:
            in_ids, n_ids = _put_ids(in_ids, n_ids, tok, 0, plen + ilen)
        in_off[i + 1] = n_ids
        bp_seed[i] = int63(crng)
    return STATUS_OK, rows, offsets, digests[:nd], bp_seed, in_ids[:n_ids], in_off


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
