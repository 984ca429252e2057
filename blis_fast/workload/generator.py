"""Request generation from a workload spec (WL-5, WL-6, WL-7, WL-13, WL-14, DELTA-46..59).

Python resolves the spec into per-client parameter arrays (rates, arrival processes, sampler
codes, prefix groups, lifecycle windows, session shapes); one Numba kernel then replays the
reference's random draws in its exact order and, while each request's token ids sit in a
scratch buffer, computes the content digests of its full blocks. Token ids are never kept,
except those the engine needs to continue closed-loop sessions (the blueprint prefix and, for
context-accumulating sessions, the round-0 input and output).

Public entry points:

* :func:`generate_requests` - the reference's ``GenerateRequests`` (every round of every
  pre-generated session, sorted, truncated);
* :func:`generate_workload` - the reference's ``GenerateWorkload``: closed-loop sessions are
  cut to round 0 and described by :class:`SessionBlueprint`\\ s, concurrency clients get their
  seed requests and blueprints, and the follow-up budget is computed;
The result types and the ``--timeout`` deadlines are in ``generated.py``, the seed / horizon /
request-cap precedence of WL-1.2 - WL-1.4 in ``precedence.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numba.core import types

from blis_fast.compile_notice import announce_if_compiling
from blis_fast.errors import BlisInputError
from blis_fast.gofmt import go_quote
from blis_fast.gonum import INT64_MAX
from blis_fast.kernels.generation.generation import generate_kernel
from blis_fast.kernels.generation.generation_layout import (
    ClientParams,
    GenStatus,
)
from blis_fast.kernels.generation.generation_layout import GenClientCol as C
from blis_fast.kernels.generation.generation_layout import GenRowCol as R
from blis_fast.kernels.generation.session_seeds import (
    concurrency_kernel,
    gather_two,
    int63_sequence,
)
from blis_fast.kernels.go.gorand import subsystem_seed
from blis_fast.workload.client_params import SamplerTable, resolve_clients
from blis_fast.workload.expand import expand_cohorts, expand_sources
from blis_fast.workload.generated import (
    GeneratedWorkload,
    SessionBlueprint,
)
from blis_fast.workload.request_table import RequestTable, adapter_columns
from blis_fast.workload.samplers import build_sampler
from blis_fast.workload.spec import (
    DEFAULT_TIMEOUT_US,
    ClientSpec,
    WorkloadSpec,
    has_multi_turn,
    is_closed_loop,
    upgrade_v1_to_v2,
)
from blis_fast.workload.validate import validate_spec

BLUEPRINT_SEED_OFFSET = 7919
CONCURRENCY_SEED_OFFSET = 10007



# --- Python side ------------------------------------------------------------------------------
def client_metadata(c: ClientSpec) -> dict[str, object]:
    """The per-client fields its requests carry (RequestTable.clients entry)."""
    mt = has_multi_turn(c)
    return {
        "id": c.id,
        "tenant_id": c.tenant_id,
        "slo_class": c.slo_class,
        "model": c.model,
        "prefix_group": "" if mt else c.prefix_group,
        "streaming": False if mt else bool(c.streaming),
    }


def _deadline_offsets(clients: list[ClientSpec]) -> tuple[np.ndarray, np.ndarray]:
    """computeDeadline offsets per client: (standard requests, session requests); 0 = none."""
    std = np.zeros(len(clients), dtype=np.int64)
    ses = np.zeros(len(clients), dtype=np.int64)
    for k, c in enumerate(clients):
        if c.timeout is None:
            ses[k] = DEFAULT_TIMEOUT_US
            std[k] = DEFAULT_TIMEOUT_US if is_closed_loop(c) else 0
        else:
            std[k] = ses[k] = int(c.timeout)
    return std, ses


def _deadlines(std, ses, client_idx, session_idx, arrival) -> np.ndarray:
    """Per-row deadlines (arrival + offset, wrapping like Go's int64; 0 when no timeout)."""
    if client_idx.size == 0:
        return np.zeros(0, dtype=np.int64)
    off = np.where(session_idx >= 0, ses[client_idx], std[client_idx])
    with np.errstate(over="ignore"):
        return np.where(off > 0, arrival + off, 0).astype(np.int64)


@dataclass
class _Raw:
    """GenerateRequests' result before table assembly (rows sorted and truncated)."""

    spec: WorkloadSpec
    clients: list[ClientSpec]
    rows: np.ndarray  # (n, GEN_ROW_COLS) int64
    ratio: np.ndarray
    offsets: np.ndarray
    digests: np.ndarray
    sess_val: np.ndarray
    sess_r0: np.ndarray
    r0_tok: np.ndarray
    first_in: np.ndarray
    fcap_tok: np.ndarray
    fcap_off: np.ndarray
    g_off: np.ndarray
    prefix_tok: np.ndarray
    group_of: np.ndarray
    group_len: np.ndarray
    samplers: SamplerTable
    params: ClientParams  # what the generation kernel read
    in_ids: np.ndarray
    in_off: np.ndarray


def _wrap64(v: int) -> int:
    v &= (1 << 64) - 1
    return v - (1 << 64) if v >= (1 << 63) else v


def _working_spec(spec: WorkloadSpec) -> tuple[WorkloadSpec, list[ClientSpec]]:
    """Expansion, upgrade and validation (WL-4.6) on a copy; the working client list."""
    work = expand_sources(spec)
    upgrade_v1_to_v2(work)
    try:
        validate_spec(work)
    except BlisInputError as exc:
        raise BlisInputError(f"invalid workload spec: {exc}") from None
    clients = list(work.clients)
    if work.cohorts:
        clients.extend(expand_cohorts(work.cohorts, work.seed))
    return work, clients


def _run(spec: WorkloadSpec, horizon: int, max_requests: int, block_size: int,
         conversion: bool, keep_ids: bool = False) -> _Raw:
    """GenerateRequests: every client's requests, merged in arrival order and truncated."""
    work, clients = _working_spec(spec)
    rc = resolve_clients(clients, work.aggregate_rate, max_requests, conversion)
    params = rc.params
    smp = rc.samplers
    multi_turn_on = True if params.ints[:, C.MULTI_TURN].any() else None
    announce_if_compiling(generate_kernel, lambda signature: (
        (signature[-1] == types.none) == (multi_turn_on is None)))
    res = generate_kernel(np.int64(subsystem_seed(work.seed, "workload-gen")), params,
                          np.int64(horizon), np.int64(block_size), np.int64(rc.prefix_capture_len),
                          np.int64(max_requests), np.int64(1 if keep_ids else 0), multi_turn_on)
    if res.status == GenStatus.SAMPLER_ERROR:
        raise smp.error(clients[res.err_client], res.err_sampler)
    if res.status == GenStatus.NEGATIVE_LENGTH:
        raise BlisInputError("a length distribution produced a negative token count")
    offsets = res.chunk_offsets
    digests = res.chunk_digests
    nd = int(offsets[-1])
    if digests.shape[0] > nd + nd // 4 + 1024:
        digests = digests[:nd].copy()  # do not keep a mostly empty growth buffer alive
    else:
        digests = digests[:nd]
    return _Raw(work, clients, res.rows, res.reason_ratio, offsets, digests, res.session_keys,
                res.round0, res.round0_tokens, res.first_input, res.prefix_capture,
                rc.prefix_capture_off, res.group_off, res.group_tokens, rc.group_of,
                params.group_len, smp, params,
                res.input_ids, res.input_off)


def _assemble(raw: _Raw, rows, ratio, offsets, digests, sess_names, block_size) -> RequestTable:
    """Build the RequestTable; ``sess_names`` maps a row's session key to its id string."""
    n = rows.shape[0]
    cidx = rows[:, R.CLIENT].astype(np.int32)
    skey = rows[:, R.SESSION]
    sessions: list[str] = []
    sidx = np.full(n, -1, dtype=np.int32)
    has = np.flatnonzero(skey >= 0)
    if has.shape[0]:
        uniq, first_pos, inv = np.unique(skey[has], return_index=True, return_inverse=True)
        by_first = np.argsort(first_pos, kind="stable")
        remap = np.empty(uniq.shape[0], dtype=np.int64)
        remap[by_first] = np.arange(uniq.shape[0])
        sessions = [sess_names(int(uniq[u])) for u in by_first]
        sidx[has] = remap[inv.reshape(-1)].astype(np.int32)
    arrival = np.ascontiguousarray(rows[:, R.ARRIVAL])
    std, ses = _deadline_offsets(raw.clients)
    adapter_idx, adapter_names = adapter_columns(cidx, [c.adapter for c in raw.clients])
    return RequestTable(
        arrival_us=arrival,
        input_len=np.ascontiguousarray(rows[:, R.INPUT]),
        output_len=np.ascontiguousarray(rows[:, R.OUTPUT]),
        max_output_len=np.ascontiguousarray(rows[:, R.OUTPUT]),
        deadline_us=_deadlines(std, ses, cidx, sidx, arrival),
        prefix_length=np.ascontiguousarray(rows[:, R.PREFIX]),
        client_idx=cidx,
        chunk_offsets=np.ascontiguousarray(offsets, dtype=np.int64),
        chunk_digests=np.ascontiguousarray(digests, dtype=np.uint64),
        clients=[client_metadata(c) for c in raw.clients],
        block_size=int(block_size),
        seed=int(raw.spec.seed),
        session_idx=sidx,
        round_index=np.ascontiguousarray(rows[:, R.ROUND]).astype(np.int32),
        text_tokens=np.ascontiguousarray(rows[:, R.TEXT]),
        image_tokens=np.ascontiguousarray(rows[:, R.IMAGE]),
        audio_tokens=np.ascontiguousarray(rows[:, R.AUDIO]),
        video_tokens=np.ascontiguousarray(rows[:, R.VIDEO]),
        reason_ratio=np.ascontiguousarray(ratio, dtype=np.float64),
        sessions=sessions,
        adapter_idx=adapter_idx,
        adapter_names=adapter_names,
    )


def _check_args(spec, horizon, max_requests, block_size) -> bool:
    """Argument checks of GenerateRequests; False when nothing is to be generated."""
    if block_size <= 0:
        raise BlisInputError(f"block size must be positive, got {block_size}")
    if horizon <= 0:
        return False
    if max_requests < 0:
        raise BlisInputError(f"maxRequests must be non-negative, got {max_requests}")
    return True


def _empty_table(spec: WorkloadSpec, block_size: int) -> RequestTable:
    clients = list(spec.clients) + expand_cohorts(spec.cohorts, spec.seed)
    return RequestTable.empty(block_size=block_size, seed=spec.seed,
                              clients=[client_metadata(c) for c in clients])


def generate_requests(
    spec: WorkloadSpec,
    horizon: int = INT64_MAX,
    max_requests: int = 0,
    block_size: int = 16,
) -> RequestTable:
    """The reference's ``GenerateRequests`` (WL-5, WL-6.2): all rounds of all sessions."""
    if not _check_args(spec, horizon, max_requests, block_size):
        return _empty_table(spec, block_size)
    raw = _run(spec, horizon, max_requests, block_size, conversion=False)
    vals = raw.sess_val
    return _assemble(raw, raw.rows, raw.ratio, raw.offsets, raw.digests,
                     lambda s: f"sess_{int(vals[s])}", block_size)


def generate_workload(
    spec: WorkloadSpec,
    horizon: int = INT64_MAX,
    max_requests: int = 0,
    block_size: int = 16,
    keep_token_ids: bool = False,
) -> GeneratedWorkload:
    """The reference's ``GenerateWorkload`` (WL-6.4, DELTA-47/49): requests and blueprints.

    The table holds the pre-generated requests (round 0 of closed-loop sessions, every
    round of open-loop sessions, non-session requests, concurrency seeds) sorted by arrival.
    ``spec`` is not modified. ``keep_token_ids`` also returns each row's input token ids.
    """
    if not _check_args(spec, horizon, max_requests, block_size):
        return GeneratedWorkload(_empty_table(spec, block_size), [], -1, [],
                                 [] if keep_token_ids else None)
    raw = _run(spec, horizon, max_requests, block_size, conversion=True,
               keep_ids=keep_token_ids)
    clients = raw.clients
    if not any(is_closed_loop(c) or c.concurrency > 0 for c in clients):
        vals = raw.sess_val
        table = _assemble(raw, raw.rows, raw.ratio, raw.offsets, raw.digests,
                          lambda s: f"sess_{int(vals[s])}", block_size)
        ids = _ids_of(raw.in_ids, raw.in_off, range(table.n)) if keep_token_ids else None
        return GeneratedWorkload(table, [], -1, clients, ids)

    plans = _session_plans(raw)
    n_seeds = sum(len(plan.names) for plan in plans)
    bp_seeds = int63_sequence(np.int64(_wrap64(raw.spec.seed + BLUEPRINT_SEED_OFFSET)), n_seeds)
    # keep round 0 of claimed sessions (= drop the flagged rows), everything else as is
    kept_pos = np.flatnonzero(raw.rows[:, R.DROPPED] == 0)
    users = _concurrency_users(clients, max_requests, kept_pos.shape[0])
    seeds = _concurrency_seeds(raw, users, block_size, keep_token_ids)
    merged = _merge_rows(raw, kept_pos, seeds)
    table = _assemble(raw, merged.rows, merged.ratio, merged.offsets, merged.digests,
                      _session_namer(raw, users), block_size)
    row_ids = None
    if keep_token_ids:
        ids = (_ids_of(raw.in_ids, raw.in_off, kept_pos.tolist())
               + _ids_of(seeds.input_ids, seeds.input_off, range(len(users.client))))
        row_ids = [ids[o] for o in merged.order.tolist()]
    final_row = _final_rows(merged.order, kept_pos, raw.rows.shape[0])
    blueprints = _closed_loop_blueprints(raw, plans, bp_seeds.tolist(), final_row, horizon)
    blueprints += _concurrency_blueprints(raw, users, seeds.blueprint_seeds,
                                          final_row.final_pos[kept_pos.shape[0]:], horizon)
    budget = -1
    if max_requests > 0 and users.total > 0:
        budget = max(0, int(max_requests) - table.n)
    return GeneratedWorkload(table, blueprints, budget, clients, row_ids)


def _ids_of(ids: np.ndarray, off: np.ndarray, rows_idx) -> list[np.ndarray]:
    """The token ids of the rows ``rows_idx`` of a CSR id buffer (views)."""
    return [ids[off[p] : off[p + 1]] for p in rows_idx]


@dataclass
class _SessionPlan:
    """A closed-loop multi-turn client's sessions: names sorted as strings, their round-0 rows
    (before the merge) in that order, and the group prefix its follow-ups carry."""

    client_idx: int
    client: ClientSpec
    prefix: np.ndarray
    names: list[str]
    rows: np.ndarray


def _check_blueprint_samplers(c: ClientSpec, what: str) -> None:
    """A client whose follow-ups are drawn later needs valid length distributions now."""
    for d, lab in ((c.input_dist, "input"), (c.output_dist, "output")):
        s = build_sampler(d)
        if not s.valid:
            raise BlisInputError(f"client {go_quote(c.id)} {lab} distribution{what}: {s.error}")


def _session_plans(raw: _Raw) -> list[_SessionPlan]:
    """Closed-loop multi-turn blueprints' plans, in client order. A client claims the round-0
    session rows whose client id equals its id (DELTA-49)."""
    rows, clients, vals = raw.rows, raw.clients, raw.sess_val
    r0_pos = np.flatnonzero((rows[:, R.SESSION] >= 0) & (rows[:, R.ROUND] == 0))
    r0_client = rows[r0_pos, R.CLIENT]
    id_code: dict[str, int] = {}
    code_of = np.array([id_code.setdefault(c.id, len(id_code)) for c in clients], dtype=np.int64)
    r0_code = code_of[r0_client] if r0_client.shape[0] else np.zeros(0, dtype=np.int64)
    by_code = np.argsort(r0_code, kind="stable")  # keeps table order within one id
    bounds = np.searchsorted(r0_code[by_code], np.arange(len(id_code) + 1))
    plans = []
    for ki, c in enumerate(clients):
        if not (is_closed_loop(c) and has_multi_turn(c)):
            continue
        _check_blueprint_samplers(c, " for blueprint")
        code = id_code[c.id]
        sel = r0_pos[by_code[bounds[code] : bounds[code + 1]]]
        prefix = np.zeros(0, dtype=np.int64)
        if c.prefix_group and c.prefix_length > 0 and sel.shape[0]:
            k0 = int(rows[sel[0], R.CLIENT])
            if raw.first_in[k0] >= c.prefix_length:
                off = raw.fcap_off[k0]
                prefix = raw.fcap_tok[off : off + c.prefix_length].copy()
        names = np.array([f"sess_{v}" for v in vals[rows[sel, R.SESSION]].tolist()])
        srt = np.argsort(names, kind="stable")
        plans.append(_SessionPlan(ki, c, prefix, names[srt].tolist(), sel[srt]))
    return plans


@dataclass
class _Users:
    """The concurrency clients' virtual users that get a seed request (in client order)."""

    client: list[int]  # client index of each user
    arrival: list[int]  # its seed request's arrival
    index: list[int]  # the user's number within its client
    total: int  # every concurrency client's users, cut by the request cap or not
    names: list[str]  # session ids


def _concurrency_users(clients: list[ClientSpec], max_requests: int, n_kept: int) -> _Users:
    """The users of concurrency clients, staggered over the think time, until the request cap
    (counting the ``n_kept`` pre-generated rows) is reached."""
    users = _Users([], [], [], 0, [])
    for ki, c in enumerate(clients):
        if c.concurrency <= 0:
            continue
        _check_blueprint_samplers(c, "")
        for u in range(c.concurrency):
            if max_requests > 0 and n_kept + len(users.client) >= max_requests:
                break
            arr = 0
            if c.think_time_us > 0 and c.concurrency > 1:
                prod = _wrap64(u * c.think_time_us)
                q = abs(prod) // c.concurrency
                arr = q if prod >= 0 else -q
            users.client.append(ki)
            users.arrival.append(arr)
            users.index.append(u)
            users.names.append(f"concurrency_{c.id}_user_{u}")
        users.total += c.concurrency
    return users


@dataclass
class _Seeds:
    """The concurrency users' seed requests, as the concurrency kernel drew them."""

    rows: np.ndarray  # (m, GEN_ROW_COLS), sessions numbered after the kernel's sessions
    offsets: np.ndarray  # CSR offsets into ``digests``
    digests: np.ndarray
    blueprint_seeds: np.ndarray  # each user's follow-up RNG seed
    input_ids: np.ndarray
    input_off: np.ndarray


def _concurrency_seeds(raw: _Raw, users: _Users, block_size: int, keep_ids: bool) -> _Seeds:
    """Draw every user's seed request, the users' clients' length samplers packed afresh."""
    clients = raw.clients
    ints = raw.params.ints.copy()
    extra = SamplerTable()
    for ki in sorted(set(users.client)):
        ints[ki, C.INPUT] = extra.add(clients[ki].input_dist, "input distribution")
        ints[ki, C.OUTPUT] = extra.add(clients[ki].output_dist, "output distribution")
    s_code, s_off, sp = extra.arrays()
    seed_params = raw.params._replace(ints=ints, sampler_code=s_code, sampler_off=s_off,
                                      sampler_params=sp)
    st, rows, off, dig, bp, ids, id_off = concurrency_kernel(
        np.int64(_wrap64(raw.spec.seed + CONCURRENCY_SEED_OFFSET)),
        np.asarray(users.client, dtype=np.int64), np.asarray(users.arrival, dtype=np.int64),
        seed_params, raw.g_off, raw.prefix_tok, np.int64(block_size),
        np.int64(1 if keep_ids else 0),
    )
    if st == GenStatus.NEGATIVE_LENGTH:
        raise BlisInputError("a length distribution produced a negative token count")
    rows = rows.copy()
    rows[:, R.SESSION] = int(raw.sess_val.shape[0]) + np.arange(len(users.client))
    return _Seeds(rows, off, dig, bp, ids, id_off)


@dataclass
class _Merged:
    """Kept rows then seed rows, stably sorted by arrival; ``order[i]`` is row i's source."""

    order: np.ndarray
    rows: np.ndarray
    ratio: np.ndarray
    offsets: np.ndarray
    digests: np.ndarray


def _merge_rows(raw: _Raw, kept_pos: np.ndarray, seeds: _Seeds) -> _Merged:
    """Merge the kept rows and the seed rows (stable by arrival) with their block digests."""
    rows, n_kept, m = raw.rows, kept_pos.shape[0], seeds.rows.shape[0]
    if m == 0:
        # Dropped rows carry no digests, so the kept rows' digests are the buffer as it is.
        order = np.arange(n_kept, dtype=np.int64)
        all_rows = rows if n_kept == rows.shape[0] else rows[kept_pos]
        all_ratio = raw.ratio if n_kept == rows.shape[0] else raw.ratio[kept_pos]
        csr_off = np.zeros(n_kept + 1, dtype=np.int64)
        np.cumsum(np.diff(raw.offsets)[kept_pos], out=csr_off[1:])
        return _Merged(order, all_rows, all_ratio, csr_off, raw.digests)
    all_rows = np.concatenate([rows[kept_pos], seeds.rows])
    all_ratio = np.concatenate([raw.ratio[kept_pos], np.zeros(m)])
    seg_src = np.concatenate([np.zeros(n_kept, dtype=np.int64), np.ones(m, dtype=np.int64)])
    seg_off = np.concatenate([raw.offsets[:-1][kept_pos], seeds.offsets[:-1]])
    seg_len = np.concatenate([np.diff(raw.offsets)[kept_pos], np.diff(seeds.offsets)])
    order = np.argsort(all_rows[:, R.ARRIVAL], kind="stable")
    csr_off = np.zeros(order.shape[0] + 1, dtype=np.int64)
    np.cumsum(seg_len[order], out=csr_off[1:])
    digests = gather_two(seg_src[order], seg_off[order], seg_len[order], raw.digests,
                         seeds.digests, csr_off)
    return _Merged(order, all_rows[order], all_ratio[order], csr_off, digests)


def _session_namer(raw: _Raw, users: _Users) -> Callable[[int], str]:
    """A row's session key -> its session id: the kernel's sessions, then the users'."""
    vals = raw.sess_val
    n_sess_kernel = int(vals.shape[0])

    def name(s: int) -> str:
        if s >= n_sess_kernel:
            return users.names[s - n_sess_kernel]
        return f"sess_{int(vals[s])}"

    return name


@dataclass
class _FinalRows:
    """Where a row lands in the final table: ``final_pos`` by merged position (kept rows first,
    then seeds), ``old_to_kept`` maps an original row to its kept position (-1 when dropped)."""

    final_pos: np.ndarray
    old_to_kept: np.ndarray

    def of_original(self, rows: np.ndarray) -> np.ndarray:
        """The final-table rows of (kept) original rows."""
        return self.final_pos[self.old_to_kept[rows]]


def _final_rows(order: np.ndarray, kept_pos: np.ndarray, n_rows: int) -> _FinalRows:
    """Invert the merge order (the rows of the sessions' round 0 in the final table)."""
    final_pos = np.empty(order.shape[0], dtype=np.int64)
    final_pos[order] = np.arange(order.shape[0])
    old_to_kept = np.full(n_rows, -1, dtype=np.int64)
    old_to_kept[kept_pos] = np.arange(kept_pos.shape[0])
    return _FinalRows(final_pos, old_to_kept)


def _closed_loop_blueprints(raw: _Raw, plans: list[_SessionPlan], seeds: list[int],
                            final_row: _FinalRows, horizon: int) -> list[SessionBlueprint]:
    """One blueprint per claimed closed-loop session (plan order, then session-id order)."""
    blueprints: list[SessionBlueprint] = []
    r0_info = raw.sess_r0.reshape(-1, 3)
    tok = raw.r0_tok
    for plan in plans:
        c, mt = plan.client, plan.client.reasoning.multi_turn
        s_in = build_sampler(c.input_dist)
        s_out = build_sampler(c.output_dist)
        r0_rows = final_row.of_original(plan.rows).tolist()
        accum = mt.context_growth == "accumulate"
        info = r0_info[raw.rows[plan.rows, R.SESSION]].tolist() if accum else None
        for q, sname in enumerate(plan.names):
            r0_in = r0_out = None
            if info is not None:
                o, li, lo = info[q]
                if o >= 0:
                    r0_in = tok[o : o + li]
                    r0_out = tok[o + li : o + li + lo]
            blueprints.append(SessionBlueprint(
                sname, c.id, plan.client_idx, seeds[len(blueprints)], mt.max_rounds, False,
                mt.context_growth, mt.think_time_us, c.timeout, int(horizon), s_in, s_out,
                plan.prefix, c.tenant_id, c.slo_class, c.model, r0_rows[q], r0_in, r0_out,
            ))
    return blueprints


def _concurrency_blueprints(raw: _Raw, users: _Users, seeds: np.ndarray,
                            seed_rows: np.ndarray, horizon: int) -> list[SessionBlueprint]:
    """One unlimited-rounds blueprint per concurrency user; ``seed_rows[i]`` is the final-table
    row of user i's seed request."""
    blueprints = []
    for i, ki in enumerate(users.client):
        c = raw.clients[ki]
        g = int(raw.group_of[ki])
        prefix = (raw.prefix_tok[raw.g_off[g] : raw.g_off[g + 1]].copy() if g >= 0
                  else np.zeros(0, dtype=np.int64))
        blueprints.append(SessionBlueprint(
            session_id=users.names[i], client_id=c.id, client_idx=ki, seed=int(seeds[i]),
            max_rounds=0, unlimited_rounds=True, context_growth="",
            think_time_us=c.think_time_us, timeout=c.timeout, horizon=int(horizon),
            input_sampler=build_sampler(c.input_dist), output_sampler=build_sampler(c.output_dist),
            prefix=prefix, tenant_id=c.tenant_id, slo_class=c.slo_class, model=c.model,
            round0_row=int(seed_rows[i]),
        ))
    return blueprints


__all__ = [
    "client_metadata",
    "generate_requests",
    "generate_workload",
]
