"""Client arrival streams of the request generator (WL-5.1, WL-5.2, WL-7.2, DELTA-50/52).

Each client with a positive rate gets its own Go RNG stream, seeded from the workload stream
in client order. Arrivals advance by inter-arrival draws and skip times outside the client's
lifecycle windows; a request cap or the horizon ends the stream. ``start_client_streams``
also reproduces the reference's failures at a client's first request (a sampler it cannot
build, a length that is certainly negative): it reports the first such client that has a
first arrival.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from blis_fast.kernels.buffers import copy_range
from blis_fast.kernels.generation.generation_layout import GenClientCol as C
from blis_fast.kernels.generation.generation_layout import GenRateCol as F
from blis_fast.kernels.generation.generation_layout import GenStatus
from blis_fast.kernels.generation.samplers import (
    ARRIVAL_FACTORY_POISSON,
    ARRIVAL_NORMALIZED_EXP,
    DIST_EMPIRICAL,
    DIST_GAUSSIAN,
    GAUSSIAN_MAX,
    GAUSSIAN_MIN,
    normalized_exp_intervals,
    sample_iat,
)
from blis_fast.kernels.go.gorand import STATE_LEN, int63, new_source, seed_source
from blis_fast.kernels.jit import njit


class ClientStreams(NamedTuple):
    """Per-client arrival state while generating."""

    rng: np.ndarray  # (active clients, STATE_LEN): the streams of active clients
    slot: np.ndarray  # per client: its row in ``rng``, -1 = inactive (no stream)
    t: np.ndarray  # last arrival drawn (µs)
    count: np.ndarray  # requests generated so far; -1 = a single session, no more
    iv_cursor: np.ndarray  # next normalized-exponential interval
    iv_off: np.ndarray  # the client's intervals: iv[iv_off:iv_off + iv_n]
    iv_n: np.ndarray
    iv: np.ndarray
    first_found: np.ndarray  # bool: the client has a first arrival


@njit(cache=True, _nrt=False, error_model="numpy")
def in_window(t, w0, w1, win_start, win_end):
    """Whether ``t`` lies in one of the windows ``w0 .. w1 - 1``."""
    for w in range(w0, w1):
        if win_start[w] <= t < win_end[w]:
            return True
    return False


@njit(cache=True, _nrt=False, error_model="numpy")
def _next_iat(s, k, ci, cf, iv, iv_off, iv_n, iv_i):
    """One inter-arrival draw; 0 = the normalized-exponential sampler is exhausted."""
    if ci[k, C.ARRIVAL] == ARRIVAL_NORMALIZED_EXP:
        if iv_i >= iv_n:
            return np.int64(0), iv_i + 1
        return iv[iv_off + iv_i], iv_i + 1
    return sample_iat(s, ci[k, C.ARRIVAL], ci[k, C.IAT], cf[k, F.RATE], cf[k, F.P1],
                      cf[k, F.P2]), iv_i


@njit(cache=True, _nrt=False, error_model="numpy")
def next_arrival(s, k, t, count, iv_i, ci, cf, win_start, win_end, horizon, iv, iv_off, iv_n):
    """Next arrival of a standard / multi-session client: (found, t, iv_i).

    ``ci``, ``cf`` and the window arrays are those of a ClientParams: called once per
    request, it takes arrays (see ``generation_rows``).
    """
    cap = ci[k, C.CAP]
    w0 = ci[k, C.WINDOW_FIRST]
    w1 = ci[k, C.WINDOW_END]
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
        iat, iv_i = _next_iat(s, k, ci, cf, iv, iv_off, iv_n, iv_i)
        if iat == 0:
            return False, t, iv_i
        t += iat
        if t >= horizon:
            return False, t, iv_i
        if has_win and not in_window(t, w0, w1, win_start, win_end):
            if t >= last_end:
                return False, t, iv_i
            continue
        return True, t, iv_i


@njit(cache=True, _nrt=False, error_model="numpy")
def single_session_start(s, k, clients, horizon, iv, iv_off, iv_n):
    """Start of a single-session client's one session: (found, start, iv_i)."""
    iat, iv_i = _next_iat(s, k, clients.ints, clients.rates, iv, iv_off, iv_n, 0)
    if iat == 0:
        return False, np.int64(0), iv_i
    w0 = clients.ints[k, C.WINDOW_FIRST]
    w1 = clients.ints[k, C.WINDOW_END]
    start = iat
    if w1 > w0:
        start = clients.window_start[w0] + iat
    if start >= horizon:
        return False, start, iv_i
    if w1 > w0 and not in_window(start, w0, w1, clients.window_start, clients.window_end):
        return False, start, iv_i
    return True, start, iv_i


@njit(cache=True)
def _first_invalid_lazy(k, clients):
    """The sampler the reference builds (and fails on) at the client's first request, or -1."""
    ci = clients.ints
    s_code = clients.sampler_code
    if ci[k, C.MULTI_TURN] != 0:
        s_rr = ci[k, C.REASON_RATIO]
        if s_rr >= 0 and s_code[s_rr] < 0:
            return s_rr
        return -1
    if ci[k, C.MULTIMODAL] == 0:
        return -1
    s_t = ci[k, C.MM_TEXT]
    if s_t >= 0 and s_code[s_t] < 0:
        return s_t
    for m in range(3):
        s_size = ci[k, C.MM_IMAGE + 2 * m]
        s_cnt = ci[k, C.MM_IMAGE_COUNT + 2 * m]
        if s_size >= 0 and s_cnt >= 0:
            if s_code[s_cnt] < 0:
                return s_cnt
            if s_code[s_size] < 0:
                return s_size
    return -1


@njit(cache=True)
def _always_negative(clients, sampler):
    """Whether every draw of a sampler is negative (the reference panics on the first one)."""
    code = clients.sampler_code[sampler]
    sp = clients.sampler_params
    off = clients.sampler_off[sampler]
    if code == DIST_GAUSSIAN:  # min == max < 0: no draw, no floor
        return sp[off + GAUSSIAN_MIN] == sp[off + GAUSSIAN_MAX] and sp[off + GAUSSIAN_MIN] < 0
    if code == DIST_EMPIRICAL:  # every bin negative (no floor)
        nb = np.int64(sp[off])
        if nb == 0:
            return False
        for i in range(nb):
            if sp[off + 1 + i] >= 0:
                return False
        return True
    return False


@njit(cache=True)
def _first_request_negative(k, clients):
    """Whether the client's first request certainly has a negative length."""
    ci = clients.ints
    if _always_negative(clients, ci[k, C.OUTPUT]):
        return True
    if ci[k, C.MULTI_TURN] == 0 and ci[k, C.MULTIMODAL] != 0:
        return False
    return _always_negative(clients, ci[k, C.INPUT])


@njit(cache=True)
def _first_arrival(s, k, clients, horizon, streams):
    """The client's first arrival (or single-session start): (found, t, iv cursor)."""
    ci = clients.ints
    iv = streams.iv
    if ci[k, C.MULTI_TURN] != 0 and ci[k, C.SINGLE_SESSION] != 0:
        return single_session_start(s, k, clients, horizon, iv, streams.iv_off[k],
                                    streams.iv_n[k])
    return next_arrival(s, k, np.int64(0), 0, 0, ci, clients.rates, clients.window_start,
                        clients.window_end, horizon, iv, streams.iv_off[k], streams.iv_n[k])


@njit(cache=True)
def start_client_streams(wg, clients, horizon):
    """Seed every active client's stream and draw its first arrival, in client order.

    Returns (status, client, sampler, streams): a failure at the first client whose first
    request the reference fails on (``GenStatus.SAMPLER_ERROR`` with the sampler id, or
    ``GenStatus.NEGATIVE_LENGTH``), else ``GenStatus.OK``.
    """
    ci = clients.ints
    s_code = clients.sampler_code
    n_clients = ci.shape[0]
    slot = np.full(n_clients, -1, dtype=np.int64)
    n_act = 0
    for k in range(n_clients):
        if ci[k, C.ACTIVE] != 0:
            slot[k] = n_act
            n_act += 1
    streams = ClientStreams(np.empty((max(n_act, 1), STATE_LEN), dtype=np.int64), slot,
                            np.zeros(n_clients, dtype=np.int64),
                            np.zeros(n_clients, dtype=np.int64),
                            np.zeros(n_clients, dtype=np.int64),
                            np.zeros(n_clients, dtype=np.int64),
                            np.zeros(n_clients, dtype=np.int64), np.zeros(16, dtype=np.int64),
                            np.zeros(n_clients, dtype=np.bool_))
    iv_used = 0
    for k in range(n_clients):
        if slot[k] < 0:
            continue  # rate <= 0: skipped, and no client seed is drawn
        s = streams.rng[slot[k]]
        seed_source(s, int63(wg))
        if ci[k, C.ARRIVAL] == ARRIVAL_NORMALIZED_EXP:
            vals = normalized_exp_intervals(new_source(int63(s)), ci[k, C.NORM_COUNT],
                                            ci[k, C.NORM_DURATION])
            iv = streams.iv
            if iv_used + vals.shape[0] > iv.shape[0]:
                grown = np.zeros(max(2 * iv.shape[0], iv_used + vals.shape[0]), dtype=np.int64)
                copy_range(grown, 0, iv, 0, iv_used)
                streams = ClientStreams(streams.rng, slot, streams.t, streams.count,
                                        streams.iv_cursor, streams.iv_off, streams.iv_n, grown,
                                        streams.first_found)
            copy_range(streams.iv, iv_used, vals, 0, vals.shape[0])
            streams.iv_off[k] = iv_used
            streams.iv_n[k] = vals.shape[0]
            iv_used += vals.shape[0]
        elif ci[k, C.ARRIVAL] == ARRIVAL_FACTORY_POISSON:
            int63(s)  # the factory's sub-stream seed; the Poisson sampler draws from s
        for sampler in (ci[k, C.INPUT], ci[k, C.OUTPUT]):
            if s_code[sampler] < 0:
                return GenStatus.SAMPLER_ERROR, k, sampler, streams
        lazy = _first_invalid_lazy(k, clients)
        if lazy >= 0 or _first_request_negative(k, clients):
            found, _t, _i = _first_arrival(s.copy(), k, clients, horizon, streams)
            if found:
                if lazy >= 0:
                    return GenStatus.SAMPLER_ERROR, k, lazy, streams
                return GenStatus.NEGATIVE_LENGTH, k, np.int64(-1), streams
        found, t0, iv_i = _first_arrival(s, k, clients, horizon, streams)
        if ci[k, C.MULTI_TURN] != 0 and ci[k, C.SINGLE_SESSION] != 0:
            streams.count[k] = -1  # no further sessions
        streams.iv_cursor[k] = iv_i
        streams.t[k] = t0
        streams.first_found[k] = found
    return GenStatus.OK, np.int64(-1), np.int64(-1), streams
