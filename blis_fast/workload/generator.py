"""Request generation from a workload spec (spec WL-5, WL-13, WL-14) into a RequestTable.

Python prepares per-client parameter arrays (rates, sampler codes, prefix groups); one Numba
kernel then replays the reference's random draws in its exact order and, while each request's
token ids exist in a scratch buffer, computes the content digests of its full blocks. Token
ids are never kept. Python finally sorts by arrival (stable), truncates and assigns deadlines.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from blis_fast.errors import BlisInputError
from blis_fast.kernels.gorand import (
    exp_float64,
    int31n,
    int63,
    new_source,
    norm_float64,
    subsystem_seed,
)
from blis_fast.kernels.hashing import content_digest
from blis_fast.workload.request_table import RequestTable
from blis_fast.workload.spec import (
    ARRIVAL_CODES,
    ARRIVAL_CONSTANT,
    DEFAULT_PREFIX_LENGTH,
    DEFAULT_TIMEOUT_US,
    DIST_CODES,
    DIST_CONSTANT,
    DIST_EXPONENTIAL,
    DIST_GAUSSIAN,
    DIST_REQUIRED_PARAMS,
    IMPLEMENTED_ARRIVALS,
    IMPLEMENTED_DISTS,
    ClientSpec,
    DistSpec,
    LifecycleSpec,
    WorkloadSpec,
    upgrade_v1_to_v2,
    validate_spec,
)

MAX_INT64 = (1 << 63) - 1
"""Default horizon (``--horizon`` unset)."""

MAX_TOKEN_ID = 128000
"""Vocabulary size of synthetic token ids (WL-13.1)."""

STATUS_OK = 0
STATUS_NEGATIVE_LENGTH = 1

N_DIST_PARAMS = 4


# --- numerics ----------------------------------------------------------------------------
@njit(cache=True)
def _go_round(x: float) -> float:
    """Go ``math.Round``: nearest integer, halves away from zero."""
    t = np.trunc(x)
    if abs(x - t) >= 0.5:
        t += math.copysign(1.0, x)
    return t


@njit(cache=True)
def _sample_length(s: np.ndarray, code: int, p: np.ndarray) -> int:
    """One token-length sample (WL-5.3); parameters already decoded into ``p``."""
    if code == DIST_GAUSSIAN:  # p = mean, std_dev, min (truncated), max (truncated)
        lo = p[2]
        hi = p[3]
        if lo == hi:
            return np.int64(lo)  # no draw and no floor
        v = norm_float64(s) * p[1] + p[0]
        c = min(hi, max(lo, v))
        r = np.int64(_go_round(c))
        return r if r >= 1 else 1
    if code == DIST_EXPONENTIAL:  # p = mean
        r = np.int64(_go_round(exp_float64(s) * p[0]))
        return r if r >= 1 else 1
    if code == DIST_CONSTANT:  # p = value (truncated)
        r = np.int64(p[0])
        return r if r >= 1 else 1
    return -(1 << 62)  # unreachable: codes are checked in Python


@njit(cache=True)
def _sample_iat(s: np.ndarray, code: int, iat_const: int, rate_us: float) -> int:
    """One inter-arrival time in µs, at least 1 (WL-5.2)."""
    if code == ARRIVAL_CONSTANT:
        return iat_const
    # ARRIVAL_POISSON
    iat = np.int64(exp_float64(s) / rate_us)
    return iat if iat >= 1 else 1


@njit(cache=True)
def _grow_i64(a: np.ndarray, cap: int) -> np.ndarray:
    """Copy of ``a`` with capacity ``cap``."""
    b = np.empty(cap, dtype=a.dtype)
    b[: a.shape[0]] = a
    return b


# --- generation kernel ---------------------------------------------------------------------
@njit(cache=True)
def _generate_kernel(
    wg_seed,
    group_len,
    client_group,
    client_active,
    arr_code,
    arr_iat,
    arr_rate,
    in_code,
    in_param,
    out_code,
    out_param,
    win_off,
    win_start,
    win_end,
    horizon,
    cap,
    block_size,
):
    """Replay the reference's draws (WL-14.3) and emit unsorted requests plus block digests."""
    wg = new_source(wg_seed)
    n_groups = group_len.shape[0]

    # 1. Group prefixes, first-appearance order, on the workload-gen stream.
    g_off = np.zeros(n_groups + 1, dtype=np.int64)
    for g in range(n_groups):
        g_off[g + 1] = g_off[g] + group_len[g]
    prefix_tok = np.empty(g_off[n_groups], dtype=np.int64)
    for i in range(g_off[n_groups]):
        prefix_tok[i] = int31n(wg, 128000)
    # Digests of the blocks lying entirely inside each prefix are shared by the group.
    g_full = np.zeros(n_groups, dtype=np.int64)
    g_doff = np.zeros(n_groups + 1, dtype=np.int64)
    for g in range(n_groups):
        g_full[g] = group_len[g] // block_size
        g_doff[g + 1] = g_doff[g] + g_full[g]
    g_dig = np.empty(g_doff[n_groups], dtype=np.uint64)
    for g in range(n_groups):
        for c in range(g_full[g]):
            g_dig[g_doff[g] + c] = content_digest(prefix_tok, g_off[g] + c * block_size, block_size)

    n_clients = client_group.shape[0]
    req_cap = 1024
    if cap > 0:
        req_cap = max(req_cap, min(cap * n_clients, 1 << 22))
    arrival = np.empty(req_cap, dtype=np.int64)
    in_len = np.empty(req_cap, dtype=np.int64)
    out_len = np.empty(req_cap, dtype=np.int64)
    pre_len = np.empty(req_cap, dtype=np.int64)
    client = np.empty(req_cap, dtype=np.int32)
    offsets = np.empty(req_cap + 1, dtype=np.int64)
    offsets[0] = 0
    dig_cap = req_cap * 16
    digests = np.empty(dig_cap, dtype=np.uint64)
    scratch = np.empty(8192, dtype=np.int64)
    n = 0
    nd = 0

    for k in range(n_clients):
        if not client_active[k]:
            continue  # rate <= 0: skipped, and no client seed is drawn
        cs = new_source(int63(wg))
        g = client_group[k]
        plen = group_len[g] if g >= 0 else 0
        has_windows = win_off[k + 1] > win_off[k]
        last_end = np.int64(0)
        for w in range(win_off[k], win_off[k + 1]):
            if win_end[w] > last_end:
                last_end = win_end[w]
        t = np.int64(0)
        count = 0
        while t < horizon:
            if cap > 0 and count >= cap:
                break
            iat = _sample_iat(cs, arr_code[k], arr_iat[k], arr_rate[k])
            if iat >= horizon - t:  # t + iat >= horizon, without overflow
                break
            t += iat
            if has_windows:
                active = False
                for w in range(win_off[k], win_off[k + 1]):
                    if win_start[w] <= t < win_end[w]:
                        active = True
                        break
                if not active:
                    if t >= last_end:
                        break
                    continue
            ilen = _sample_length(cs, in_code[k], in_param[k])
            olen = _sample_length(cs, out_code[k], out_param[k])
            if ilen < 0 or olen < 0:
                return (
                    STATUS_NEGATIVE_LENGTH,
                    arrival[:0],
                    in_len[:0],
                    out_len[:0],
                    pre_len[:0],
                    client[:0],
                    offsets[:1],
                    digests[:0],
                )
            total = plen + ilen + olen
            if total > scratch.shape[0]:
                scratch = np.empty(max(total, 2 * scratch.shape[0]), dtype=np.int64)
            if plen > 0:
                scratch[:plen] = prefix_tok[g_off[g] : g_off[g] + plen]
            for i in range(plen, total):
                scratch[i] = int31n(cs, 128000)

            if n == req_cap:
                req_cap *= 2
                arrival = _grow_i64(arrival, req_cap)
                in_len = _grow_i64(in_len, req_cap)
                out_len = _grow_i64(out_len, req_cap)
                pre_len = _grow_i64(pre_len, req_cap)
                client = _grow_i64(client, req_cap)
                offsets = _grow_i64(offsets, req_cap + 1)
            nchunks = total // block_size
            if nd + nchunks > dig_cap:
                dig_cap = max(2 * dig_cap, nd + nchunks)
                digests = _grow_i64(digests, dig_cap)
            c0 = 0
            if g >= 0:
                c0 = g_full[g]
                for c in range(c0):
                    digests[nd + c] = g_dig[g_doff[g] + c]
            for c in range(c0, nchunks):
                digests[nd + c] = content_digest(scratch, c * block_size, block_size)
            nd += nchunks

            arrival[n] = t
            in_len[n] = plen + ilen
            out_len[n] = olen
            pre_len[n] = plen
            client[n] = k
            offsets[n + 1] = nd
            n += 1
            count += 1
    return (
        STATUS_OK,
        arrival[:n],
        in_len[:n],
        out_len[:n],
        pre_len[:n],
        client[:n],
        offsets[: n + 1],
        digests[:nd],
    )


@njit(cache=True)
def _gather_csr(offsets, digests, order):
    """Reorder CSR rows by ``order`` (a permutation of a prefix of the rows)."""
    m = order.shape[0]
    new_off = np.empty(m + 1, dtype=np.int64)
    new_off[0] = 0
    for i in range(m):
        r = order[i]
        new_off[i + 1] = new_off[i] + offsets[r + 1] - offsets[r]
    out = np.empty(new_off[m], dtype=np.uint64)
    for i in range(m):
        r = order[i]
        a = offsets[r]
        b = offsets[r + 1]
        base = new_off[i]
        for j in range(b - a):
            out[base + j] = digests[a + j]
    return new_off, out


# --- Python side ----------------------------------------------------------------------------
def _windows_overlap(a: LifecycleSpec | None, b: LifecycleSpec | None) -> bool:
    """Whether two clients can be active together (no windows = always on)."""
    if a is None or not a.windows or b is None or not b.windows:
        return True
    return any(
        wa.start_us < wb.end_us and wb.start_us < wa.end_us for wa in a.windows for wb in b.windows
    )


def normalize_rate_fractions(clients: list[ClientSpec], aggregate_rate: float) -> list[float]:
    """Per-client rates in requests/µs (WL-5.1; per co-active phase when lifecycles exist)."""
    has_lifecycle = any(c.lifecycle is not None and c.lifecycle.windows for c in clients)
    if not has_lifecycle:
        total = 0.0
        for c in clients:
            total += c.rate_fraction
        if total == 0:
            return [0.0] * len(clients)
        return [aggregate_rate * (c.rate_fraction / total) / 1e6 for c in clients]
    rates = [0.0] * len(clients)
    for i, ci in enumerate(clients):
        if ci.rate_fraction <= 0:
            continue
        co_active = 0.0
        for cj in clients:
            if cj.rate_fraction > 0 and _windows_overlap(ci.lifecycle, cj.lifecycle):
                co_active += cj.rate_fraction
        if co_active == 0:
            continue
        rates[i] = aggregate_rate * (ci.rate_fraction / co_active) / 1e6
    return rates


def _dist_params(client_id: str, which: str, d: DistSpec) -> tuple[int, np.ndarray]:
    """Decode a DistSpec into (code, float64[4]) as the reference's sampler constructor does."""
    if d.type not in IMPLEMENTED_DISTS:
        raise BlisInputError(
            f'client "{client_id}" {which} distribution: type "{d.type}" is not supported yet'
        )
    for key in DIST_REQUIRED_PARAMS[d.type]:
        if key not in d.params:
            raise BlisInputError(
                f'client "{client_id}" {which} distribution: '
                f'distribution requires parameter "{key}"'
            )
    p = np.zeros(N_DIST_PARAMS, dtype=np.float64)
    if d.type == "gaussian":
        p[0] = d.params["mean"]
        p[1] = d.params["std_dev"]
        p[2] = float(math.trunc(d.params["min"]))
        p[3] = float(math.trunc(d.params["max"]))
    elif d.type == "exponential":
        p[0] = d.params["mean"]
    elif d.type == "constant":
        p[0] = float(math.trunc(d.params["value"]))
    return DIST_CODES[d.type], p


def _arrival_params(c: ClientSpec, rate_us: float) -> tuple[int, int, float]:
    """Decode a client's arrival process into (code, constant iat, floored rate) (WL-5.2)."""
    process = c.arrival.process
    if process not in IMPLEMENTED_ARRIVALS:
        raise BlisInputError(f'client "{c.id}": arrival process "{process}" is not supported yet')
    if rate_us < 1e-15:
        rate_us = 1e-15
    iat = 0
    if process == "constant":
        iat = max(1, math.trunc(1.0 / rate_us))
    return ARRIVAL_CODES[process], iat, rate_us


def _is_session_client(c: ClientSpec) -> bool:
    """isClosedLoop for standard clients: the explicit flag, else False (no multi-turn yet)."""
    return bool(c.closed_loop) if c.closed_loop is not None else False


def client_metadata(c: ClientSpec) -> dict[str, object]:
    """The per-client fields copied onto each request (RequestTable.clients entry)."""
    return {
        "id": c.id,
        "tenant_id": c.tenant_id,
        "slo_class": c.slo_class,
        "model": c.model,
        "prefix_group": c.prefix_group,
        "streaming": bool(c.streaming),
    }


def _deadlines(
    clients: list[ClientSpec], client_idx: np.ndarray, arrival: np.ndarray
) -> np.ndarray:
    """Per-request deadlines by WL-5.7's computeDeadline, vectorized per client."""
    offset = np.zeros(len(clients), dtype=np.int64)  # 0 = no deadline
    for k, c in enumerate(clients):
        if c.timeout is None:
            offset[k] = DEFAULT_TIMEOUT_US if _is_session_client(c) else 0
        else:
            offset[k] = int(c.timeout)
    off = offset[client_idx] if client_idx.size else np.zeros(0, dtype=np.int64)
    return np.where(off > 0, arrival + off, 0).astype(np.int64)


def generate_requests(
    spec: WorkloadSpec,
    horizon: int = MAX_INT64,
    max_requests: int = 0,
    block_size: int = 16,
) -> RequestTable:
    """Generate the workload of ``spec`` as the reference's GenerateRequests does (WL-5)."""
    if block_size <= 0:
        raise BlisInputError(f"block size must be positive, got {block_size}")
    clients = list(spec.clients)
    meta = [client_metadata(c) for c in clients]
    if horizon <= 0:
        return RequestTable.empty(block_size=block_size, seed=spec.seed, clients=meta)
    if max_requests < 0:
        raise BlisInputError(f"maxRequests must be non-negative, got {max_requests}")
    upgrade_v1_to_v2(spec)
    validate_spec(spec)
    meta = [client_metadata(c) for c in clients]  # after the SLO-class upgrade

    rates = normalize_rate_fractions(clients, spec.aggregate_rate)
    k = len(clients)
    group_index: dict[str, int] = {}
    group_len: list[int] = []
    client_group = np.full(k, -1, dtype=np.int64)
    for i, c in enumerate(clients):
        if not c.prefix_group:
            continue
        if c.prefix_group not in group_index:
            group_index[c.prefix_group] = len(group_len)
            group_len.append(c.prefix_length if c.prefix_length > 0 else DEFAULT_PREFIX_LENGTH)
        client_group[i] = group_index[c.prefix_group]

    active = np.zeros(k, dtype=np.bool_)
    arr_code = np.zeros(k, dtype=np.int64)
    arr_iat = np.zeros(k, dtype=np.int64)
    arr_rate = np.zeros(k, dtype=np.float64)
    in_code = np.zeros(k, dtype=np.int64)
    out_code = np.zeros(k, dtype=np.int64)
    in_param = np.zeros((k, N_DIST_PARAMS), dtype=np.float64)
    out_param = np.zeros((k, N_DIST_PARAMS), dtype=np.float64)
    win_off = np.zeros(k + 1, dtype=np.int64)
    win_start: list[int] = []
    win_end: list[int] = []
    for i, c in enumerate(clients):
        if c.lifecycle is not None:
            for w in c.lifecycle.windows:
                win_start.append(int(w.start_us))
                win_end.append(int(w.end_us))
        win_off[i + 1] = len(win_start)
        if rates[i] <= 0:
            continue
        active[i] = True
        arr_code[i], arr_iat[i], arr_rate[i] = _arrival_params(c, rates[i])
        in_code[i], in_param[i] = _dist_params(c.id, "input", c.input_dist)
        out_code[i], out_param[i] = _dist_params(c.id, "output", c.output_dist)

    # The reference caps each client at 2*maxRequests only to bound memory. A client's
    # (N+1)-th request arrives strictly after its own first N (IAT >= 1), so it can never
    # survive the final truncation to N; capping at N gives identical output, faster.
    cap = int(max_requests)

    status, arrival, in_len, out_len, pre_len, cidx, offsets, digests = _generate_kernel(
        np.int64(subsystem_seed(spec.seed, "workload-gen")),
        np.asarray(group_len, dtype=np.int64),
        client_group,
        active,
        arr_code,
        arr_iat,
        arr_rate,
        in_code,
        in_param,
        out_code,
        out_param,
        win_off,
        np.asarray(win_start, dtype=np.int64),
        np.asarray(win_end, dtype=np.int64),
        np.int64(horizon),
        np.int64(cap),
        np.int64(block_size),
    )
    if status == STATUS_NEGATIVE_LENGTH:
        raise BlisInputError("a length distribution produced a negative token count")

    order = np.argsort(arrival, kind="stable")
    if max_requests > 0 and order.shape[0] > max_requests:
        order = order[:max_requests]
    if order.shape[0] == arrival.shape[0] and bool(np.all(order == np.arange(order.shape[0]))):
        new_off, new_dig = offsets, digests  # already in arrival order (e.g. one client)
    else:
        arrival, in_len, out_len, pre_len, cidx = (
            a[order] for a in (arrival, in_len, out_len, pre_len, cidx)
        )
        new_off, new_dig = _gather_csr(offsets, digests, order)

    deadline = _deadlines(clients, cidx, arrival)
    return RequestTable(
        arrival_us=np.ascontiguousarray(arrival),
        input_len=np.ascontiguousarray(in_len),
        output_len=np.ascontiguousarray(out_len),
        max_output_len=np.ascontiguousarray(out_len).copy(),
        deadline_us=deadline,
        prefix_length=np.ascontiguousarray(pre_len),
        client_idx=np.ascontiguousarray(cidx, dtype=np.int32),
        chunk_offsets=np.ascontiguousarray(new_off),
        chunk_digests=np.ascontiguousarray(new_dig),
        clients=meta,
        block_size=int(block_size),
        seed=int(spec.seed),
    )


def apply_timeout(table: RequestTable, timeout_s: int) -> RequestTable:
    """Overwrite every deadline from ``--timeout`` seconds (DELTA-28): arrival + T*1e6, or 0 if T < 0."""
    if timeout_s == 0:
        raise ValueError("timeout 0 must be rejected by the caller (use a negative value)")
    if timeout_s > 0:
        deadline = table.arrival_us + np.int64(int(timeout_s) * 1_000_000)
    else:
        deadline = np.zeros(table.n, dtype=np.int64)
    return table.with_deadlines(deadline)
