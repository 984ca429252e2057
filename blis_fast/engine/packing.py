"""The kernel's input arrays from a run's request table and ``EngineConfig``: request inputs,
router-facing request metadata, the KV and router states, the config slots."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from blis_fast.engine.engine_config import EngineConfig
from blis_fast.kernels.cluster.admission import RouterParam
from blis_fast.kernels.cluster.pd import new_pd_state
from blis_fast.kernels.cluster.router_state import new_router_state, pool_router
from blis_fast.kernels.engine.lora import LoraState, new_lora_state
from blis_fast.kernels.engine.state import ConfigSlot, InstanceSlot, RequestInputs
from blis_fast.kernels.go.gorand import new_source, subsystem_seed
from blis_fast.kernels.kv.kv_chain import new_chain_state, new_station, station_rows
from blis_fast.kernels.kv.kv_layout import new_kv_state
from blis_fast.policies.deciders import DECIDERS
from blis_fast.policies.priority import DEFAULT_SLO_PRIORITY, SLO_PRIORITIES
from blis_fast.policies.routing import ROUTING
from blis_fast.policies.scorers import SCORERS


@dataclass
class Capacity:
    """Room reserved for follow-up requests; a run that outgrows it restarts with more."""

    rows: int = 0  # follow-up requests
    chunks: int = 0  # their chunk digests
    pool: int = 0  # their KV block-list slots
    max_chunks: int = 1  # chunks of the longest request

    def grown(self) -> Capacity:
        """Twice the room in every dimension."""
        return Capacity(2 * self.rows + 64, 2 * self.chunks + 1024, 2 * self.pool + 1024,
                         2 * self.max_chunks + 16)


def rank_of_ids(id_list) -> np.ndarray:
    """Rank of each id in byte-wise string order."""
    n = len(id_list)
    ids = np.array(id_list)
    order = np.argsort(ids, kind="stable")
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n, dtype=np.int64)
    return rank


def _pool_scorers(cfg: EngineConfig) -> list[tuple[tuple[str, float], ...]]:
    """The P/D pools' own scorer lists (prefill, decode) that a run routes with."""
    if not cfg.pd_on:
        return []
    return [s for s in (cfg.pd.prefill_scorers, cfg.pd.decode_scorers) if s]


def _decider_reads_cache(cfg: EngineConfig) -> bool:
    """True when the P/D prefix-threshold decider or a pool's scorers read the router's
    cache view."""
    return cfg.pd_on and (cfg.pd.decider == "prefix-threshold" or any(
        SCORERS.reads_cache(name for name, _ in s) for s in _pool_scorers(cfg)))


def _delayed_cache_signal(cfg: EngineConfig) -> bool:
    """True when the router reads frozen copies of the instance caches (DELTA-33)."""
    return cfg.options.cache_signal_delay > 0 and (
        (cfg.policies.routing == "weighted"
         and SCORERS.reads_cache(name for name, _ in cfg.scorers))
        or _decider_reads_cache(cfg))


def request_inputs(table, n: int, ids: list[str] | None) -> RequestInputs:
    """The kernel's per-request inputs for ``n`` rows (the table's, then room for follow-ups);
    ``ids`` ranks the scheduler's tie-break by request id (``None``: no scheduler reads it)."""
    return RequestInputs(
        arrival=pad(table.arrival_us, n, np.int64), input_len=pad(table.input_len, n, np.int64),
        output_len=pad(table.output_len, n, np.int64),
        deadline=pad(table.deadline_us, n, np.int64),
        id_rank=pad(rank_of_ids(ids), n, np.int64) if ids is not None else np.zeros(n, np.int64),
        session=np.full(n, -1, np.int32),
        adapter=(np.full(n, -1, np.int32) if table.adapter_idx is None
                 else pad(table.adapter_idx, n, np.int32, -1)))


def lora_state(cfg: EngineConfig, table, n_rows: int) -> LoraState | None:
    """The kernel's LoRA state (``kernels/engine/lora.py``), or None when LoRA is inert
    (LORA-0.2) or no request carries an adapter: then the engine compiles and runs without it
    (an active configuration no request uses changes nothing). Adapters are indexed as in
    ``table.adapter_names``; an id the registry lacks gets rank 0 and 1-tick loads (LORA-4.8)."""
    lcfg = cfg.lora
    if lcfg is None or not lcfg.active or table.adapter_idx is None or not table.adapter_names:
        return None
    names = table.adapter_names
    return new_lora_state(
        cfg.options.num_instances, n_rows, int(lcfg.capacity or 0),
        np.array([lcfg.rank_of(a) for a in names], np.int64),
        np.array([lcfg.load_ticks(a) for a in names], np.int64), tuple(lcfg.tiers))


def instance_rank_of(n: int) -> np.ndarray:
    """Rank of ``instance_<i>`` ids in byte-wise string order (``instance_10`` < ``instance_2``)."""
    return rank_of_ids([f"instance_{i}" for i in range(n)])


@dataclass
class RequestMeta:
    """Router-facing request metadata, per client and per request."""

    client_priority: np.ndarray  # int64 SLO priority
    client_tenant: np.ndarray  # int64 tenant code (-1 = no budget)
    client_model_bad: np.ndarray  # int8, 1 when the client's model is not the served one
    tenant_budget: np.ndarray  # float64 in-flight cap per tenant code
    per_request: tuple  # (priority, sheddable, tenant, model_bad) of the table's rows


def request_metadata(table, cfg: EngineConfig, model: str) -> RequestMeta:
    """Per-request SLO priority, sheddable flag, tenant code and model-mismatch flag."""
    priorities = dict(SLO_PRIORITIES)
    priorities.update(cfg.policies.slo_priorities)
    clients = table.clients or [{}]
    client_prio = np.array([priorities.get(str(c.get("slo_class", "") or ""),
                                           DEFAULT_SLO_PRIORITY) for c in clients], np.int64)
    budgets = cfg.policies.tenant_budgets
    tenants = sorted(budgets)
    tenant_code = {t: k for k, t in enumerate(tenants)}
    client_tenant = np.array([tenant_code.get(str(c.get("tenant_id", "") or ""), -1)
                              for c in clients], dtype=np.int64)
    client_model_bad = np.array([1 if (c.get("model") or "") not in ("", model) else 0
                                 for c in clients], dtype=np.int8)
    cidx = table.client_idx if table.n else np.zeros(0, np.int32)
    capacity = max(1, cfg.options.num_instances * cfg.options.max_num_running_reqs)
    budget = np.array([budgets[t] * float(capacity) for t in tenants], np.float64)
    prio = client_prio[cidx]
    return RequestMeta(client_prio, client_tenant, client_model_bad, budget,
                        (prio, (prio < 0).astype(np.int8), client_tenant[cidx],
                         client_model_bad[cidx]))


def pad(values: np.ndarray, n: int, dtype, fill=0) -> np.ndarray:
    """``values`` as a contiguous ``dtype`` array of length ``n`` (extra rows = ``fill``); the
    array itself when it already is one (no room for follow-ups: nothing writes to it)."""
    if values.shape[0] == n:
        return np.ascontiguousarray(values, dtype=dtype)
    out = np.full(n, fill, dtype=dtype)
    out[: values.shape[0]] = values
    return out


def config_ints(cfg: EngineConfig, rt) -> np.ndarray:
    """``SimConfig.ints`` by ConfigSlot, with the router's slots: every value the options
    table, the policy registries and the latency part declare a slot for (``pack_slots``)."""
    ints = np.zeros(ConfigSlot.SIZE, dtype=np.int64)
    cfg.pack_slots({"ConfigSlot": ints, "RouterCfg": rt.rcfg, "RouterParam": rt.rfl})
    rt.tb_tokens[0] = rt.rfl[RouterParam.TB_CAPACITY]  # the token bucket starts full
    return ints


def instance_config(cfg: EngineConfig) -> np.ndarray:
    """``SimConfig.inst``: one row of InstanceSlot values per instance."""
    inst = np.zeros((cfg.options.num_instances, InstanceSlot.SIZE), np.int64)
    inst[:, InstanceSlot.MAX_MODEL_LEN] = cfg.max_model_len_per_instance()
    inst[:, InstanceSlot.LATENCY_CLASS] = cfg.latency_class_per_instance()
    inst[:, InstanceSlot.BACKEND] = cfg.backend_per_instance()
    inst[:, InstanceSlot.POST_DECODE] = cfg.post_decode_per_instance()
    return inst


def _scorer_arrays(scorers) -> tuple[np.ndarray, np.ndarray]:
    """A weighted policy's scorer codes and weights normalised to sum 1."""
    total_weight = 0.0
    for _, weight in scorers:
        total_weight += weight
    return (np.array([SCORERS.code(name) for name, _ in scorers], np.int64),
            np.array([weight / total_weight for _, weight in scorers], np.float64))


def router_state(cfg: EngineConfig, n: int, meta: RequestMeta, kv, room: Capacity):
    """The router's state for ``n`` request rows (scorers, per-request inputs); the policy
    codes and parameters are packed into its slots by ``config_ints``."""
    opts = cfg.options
    scorers = cfg.scorers
    codes, weights = _scorer_arrays(scorers)
    prio, sheddable, tenant, model_bad = (pad(a, n, a.dtype) for a in meta.per_request)
    return new_router_state(
        opts.num_instances, n,
        routing=ROUTING.code(cfg.policies.routing),
        cache_delay=opts.cache_signal_delay,
        counterfactual_k=opts.counterfactual_k,
        scorer_codes=codes,
        uses_cache_query=SCORERS.reads_cache(name for name, _ in scorers),
        decider_reads_cache=_decider_reads_cache(cfg),
        scorer_weights=weights,
        rng_state=new_source(subsystem_seed(opts.seed, "router")),
        trace=cfg.trace_decisions,
        trace_scores=cfg.pd_on and bool(cfg.pd.decode_scorers),
        req_priority=prio, req_sheddable=sheddable, req_tenant=tenant, req_model_bad=model_bad,
        tenant_budget=meta.tenant_budget,
        max_chunks=room.max_chunks,
        table_size=kv.ht.shape[1],
        admission_param_slots=RouterParam.SIZE,
    )


def kv_state(table, cfg: EngineConfig, inp: RequestInputs, room: Capacity):
    """Every instance's KV cache, with room for the follow-ups' digests and block lists."""
    opts = cfg.options
    n = inp.arrival.shape[0]
    chunk_off = pad(table.chunk_offsets, n + 1, np.int64, table.chunk_offsets[-1])
    chunk_dig = pad(table.chunk_digests, table.chunk_digests.shape[0] + room.chunks,
                     np.uint64)
    block_size = opts.block_size_in_tokens
    reload_ticks = 0
    cpu_blocks = opts.kv_cpu_blocks
    reload_first = opts.kv_cpu_reload == "always"
    prompt_only = False
    if cpu_blocks > 0:
        reload_ticks = opts.kv_transfer_base_latency + int(
            math.ceil(float(block_size) / opts.kv_transfer_bandwidth))
    elif cfg.kv_offload is not None:
        # the tier chain's CPU tier (KVO-3.2, KVO-5): consulted before every allocation,
        # reloads free of charge (KVO-5.6, KVO-D1), prompt-only mirroring (KVO-8)
        cpu_blocks = cfg.kv_offload.cpu_blocks
        reload_first = True
        prompt_only = cfg.kv_offload.offload_prompt_only
    return new_kv_state(opts.num_instances, cfg.kv_blocks_per_instance(), block_size, chunk_off,
                        chunk_dig, inp.input_len, inp.output_len, cpu_blocks,
                        reload_ticks, cfg.hash_decode_blocks,
                        log_changes=_delayed_cache_signal(cfg), pool_extra=room.pool,
                        chunk_capacity=chunk_dig.shape[0],
                        reload_first=reload_first, prompt_only_mirror=prompt_only)


def chain_state(cfg: EngineConfig, kv, room: Capacity, id_rank: np.ndarray):
    """The tier chain's secondary tiers for every instance (KVO-4..6), or None when the run has
    none (no ``--kv-offload-config``, or a chain of the CPU tier alone): the engine then
    compiles and runs no code of theirs. The transfer stations' jitter streams are seeded
    from ``--seed`` (KVO-6.6); the key table is sized for every block digest of the run;
    deferred requests advance in the order of ``id_rank`` (their ids' string order, KVO-7.3)."""
    offload = cfg.kv_offload
    if offload is None or not offload.tiers:
        return None
    tiers = offload.tiers
    n_inst = cfg.options.num_instances
    station = new_station(
        n_inst, [t.n_read_threads for t in tiers], [t.n_write_threads for t in tiers],
        [t.base_latency for t in tiers], [t.read_bandwidth for t in tiers],
        [t.write_bandwidth for t in tiers], [t.saturation_queue_depth for t in tiers],
        [t.single_transfer_fraction for t in tiers], [t.latency_jitter_stddev for t in tiers],
        station_rows(offload.cpu_blocks, len(tiers)),
        subsystem_seed(cfg.options.seed, "kv-offload"))
    return new_chain_state(n_inst, int(kv.chunk_dig.shape[0]), room.max_chunks,
                           offload.per_block_bytes, station, len(tiers), id_rank)


def with_prefill_rows(table):
    """The kernel's rows in P/D mode: the workload's requests, then one prefill sub-request
    per request (row ``r + n``: the same prompt, arrival, deadline, output budget and client,
    no outputs, its own copy of its prompt's block digests; id ``<id>_prefill``)."""
    from dataclasses import replace

    n = table.n
    # a prefill row reads the digests of its prompt's blocks only (the partial last one too)
    off = table.chunk_offsets
    bs = table.block_size
    keep = np.minimum(np.diff(off), (table.input_len + bs - 1) // bs)
    starts = off[:-1]
    idx = (np.repeat(starts - np.concatenate([[0], np.cumsum(keep)[:-1]]), keep)
           + np.arange(int(keep.sum())))
    total = int(off[-1])
    per_row = {name: np.concatenate([getattr(table, name), getattr(table, name)])
               for name in ("arrival_us", "input_len", "max_output_len", "deadline_us",
                            "prefix_length", "client_idx", "round_index", "text_tokens",
                            "image_tokens", "audio_tokens", "video_tokens", "reason_ratio",
                            "request_numbers")}
    return replace(
        table, **per_row,
        output_len=np.concatenate([table.output_len, np.zeros(n, np.int64)]),
        session_idx=np.concatenate([table.session_idx, np.full(n, -1, np.int32)]),
        adapter_idx=(None if table.adapter_idx is None  # prefill sub-requests: none (LORA-2.4)
                     else np.concatenate([table.adapter_idx, np.full(n, -1, np.int32)])),
        chunk_offsets=np.concatenate([off, total + np.cumsum(keep)]).astype(np.int64),
        chunk_digests=np.concatenate([table.chunk_digests, table.chunk_digests[idx]]),
        extra_ids=[f"{rid}_prefill" for rid in table.id_strings()])


def pool_routers(cfg: EngineConfig, rt) -> tuple:
    """The prefill and decode pools' policies (PD-2.3, PD-2.9, PD-2.11): a weighted policy
    of the pool's own scorers with its own Go-rand stream (``prefill-router`` /
    ``decode-router``), or the main router ``rt`` (packed already) when it has none."""
    out = []
    for pool in ("prefill", "decode"):
        scorers = getattr(cfg.pd, f"{pool}_scorers")
        if not scorers:
            out.append(rt)
            continue
        codes, weights = _scorer_arrays(scorers)
        out.append(pool_router(
            rt, codes, weights, new_source(subsystem_seed(cfg.options.seed, f"{pool}-router")),
            SCORERS.reads_cache(name for name, _ in scorers)))
    return tuple(out)


def pd_state(cfg: EngineConfig, parents, max_batch: int, inp: RequestInputs, ranked: bool,
             rt):
    """The kernel's P/D state for the workload ``parents`` (rows ``[0, n)``, prefill rows
    after them in ``inp``), its pools routed by ``pool_routers`` over the main router ``rt``
    (packed already); with a ranked scheduler, the id ranks of all three kinds of rows
    (request, ``_prefill``, ``_decode``) are made one order and written into ``inp``."""
    pdc = cfg.pd
    opts = cfg.options
    n = parents.n
    ids = parents.id_strings()
    roles = pdc.roles(opts.num_instances)
    dec_id_rank = None
    if ranked:
        rank = rank_of_ids(ids + [f"{rid}_prefill" for rid in ids]
                           + [f"{rid}_decode" for rid in ids])
        inp.id_rank[: 2 * n] = rank[: 2 * n]
        dec_id_rank = rank[2 * n:]
    return new_pd_state(
        n, max_batch, np.flatnonzero(roles & 1), np.flatnonzero(roles & 2),
        DECIDERS.code(pdc.decider), pdc.threshold, pdc.contention, opts.block_size_in_tokens,
        pdc.bandwidth_gbps * 1000.0, pdc.base_latency_ms * 1000.0, pdc.block_bytes,
        rank_of_ids([f"{rid}_prefill" for rid in ids]),
        rank_of_ids([f"{rid}_decode" for rid in ids]), dec_id_rank, *pool_routers(cfg, rt))
