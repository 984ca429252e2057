"""Pack a run's configuration and workload into arrays, run the kernel, unpack the results."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from blis_fast.errors import BlisRuntimeError
from blis_fast.kernels import engine as K
from blis_fast.kernels.kvcache import (
    C_EVICT,
    C_MIRROR,
    C_MISS,
    M_HITS,
    M_MISSES,
    new_kv_state,
)

INT64_MAX = (1 << 63) - 1

ADMISSION_CODES = {"": K.ADM_ALWAYS, "always-admit": K.ADM_ALWAYS, "reject-all": K.ADM_REJECT_ALL}
ROUTING_CODES = {"": K.ROUTE_ROUND_ROBIN, "round-robin": K.ROUTE_ROUND_ROBIN}
PRIORITY_CODES = {"": K.PRIO_CONSTANT, "constant": K.PRIO_CONSTANT,
                  "slo-based": K.PRIO_SLO_BASED, "inverted-slo": K.PRIO_INVERTED_SLO}
SCHEDULER_CODES = {"": K.SCHED_FCFS, "fcfs": K.SCHED_FCFS,
                   "priority-fcfs": K.SCHED_PRIORITY_FCFS, "sjf": K.SCHED_SJF,
                   "reverse-priority": K.SCHED_REVERSE_PRIORITY}


@dataclass
class EngineConfig:
    """Everything the kernel needs besides the workload (resolved, validated values)."""

    num_instances: int = 1
    horizon: int = INT64_MAX
    total_kv_blocks: int = 1_000_000
    block_size: int = 16
    max_running_reqs: int = 256
    max_scheduled_tokens: int = 2048
    long_prefill_token_threshold: int = 0
    max_model_len: int = 0
    kv_cpu_blocks: int = 0
    kv_transfer_bandwidth: float = 100.0
    kv_transfer_base_latency: int = 0
    admission_latency: int = 0
    routing_latency: int = 0
    admission_policy: str = "always-admit"
    routing_policy: str = "round-robin"
    priority_policy: str = "constant"
    scheduler: str = "fcfs"
    latency_code: int = 0
    latency_params: np.ndarray = field(default_factory=lambda: np.zeros(1))
    alpha: np.ndarray = field(default_factory=lambda: np.zeros(3))
    output_token_time: int = 0
    post_decode_overhead: int = 0


@dataclass
class SimulationResult:
    """Raw per-request, per-instance and per-step results of one run."""

    config: EngineConfig
    # per request
    state: np.ndarray
    instance: np.ndarray
    registered: np.ndarray
    ttft_us: np.ndarray  # -1 when no first token
    e2e_us: np.ndarray  # -1 unless completed
    itl_sum_us: np.ndarray
    itl_count: np.ndarray
    sched_delay_us: np.ndarray  # -1 when never admitted
    length_capped: np.ndarray
    # per instance
    counters: np.ndarray  # int64 [N, K_SIZE]
    kv_integral: np.ndarray
    wait_queue_sum: np.ndarray  # [N, 2] sum of per-step wait-queue lengths, number of steps
    cache_hit_rate: np.ndarray
    thrashing_rate: np.ndarray
    still_queued: np.ndarray  # per instance, wait-queue length at the end
    still_running: np.ndarray  # per instance, running-batch size at the end
    rejected_admission: int
    rejected_routing: int
    # per step
    step_time: np.ndarray
    step_instance: np.ndarray
    step_duration: np.ndarray
    step_queue: np.ndarray
    step_running: np.ndarray
    step_kv_used: np.ndarray
    step_itl_count: np.ndarray

    @property
    def sim_ended_us(self) -> np.ndarray:
        """Per-instance SimEndedTime = min(clock, horizon)."""
        return np.minimum(self.counters[:, K.K_CLOCK], self.config.horizon)


def id_rank_of(n: int) -> np.ndarray:
    """Rank of ``request_<i>`` ids in byte-wise string order (scheduler tie-breaks)."""
    ids = np.array([f"request_{i}" for i in range(n)])
    order = np.argsort(ids, kind="stable")
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n, dtype=np.int64)
    return rank


def run_engine(table, cfg: EngineConfig) -> SimulationResult:
    """Simulate ``table`` (a RequestTable) under ``cfg``."""
    n = table.n
    n_inst = cfg.num_instances
    max_batch = max(1, min(cfg.max_running_reqs, max(n, 1)))
    ic = np.zeros(K.IC_SIZE, dtype=np.int64)
    ic[K.IC_N_INST] = n_inst
    ic[K.IC_HORIZON] = cfg.horizon
    ic[K.IC_MAX_RUNNING] = cfg.max_running_reqs
    ic[K.IC_MAX_TOKENS] = cfg.max_scheduled_tokens
    ic[K.IC_LONG_PREFILL] = cfg.long_prefill_token_threshold
    ic[K.IC_MAX_MODEL_LEN] = cfg.max_model_len
    ic[K.IC_ADM_LATENCY] = cfg.admission_latency
    ic[K.IC_ROUTE_LATENCY] = cfg.routing_latency
    ic[K.IC_ADMISSION] = ADMISSION_CODES[cfg.admission_policy]
    ic[K.IC_ROUTING] = ROUTING_CODES[cfg.routing_policy]
    ic[K.IC_PRIORITY] = PRIORITY_CODES[cfg.priority_policy]
    ic[K.IC_SCHEDULER] = SCHEDULER_CODES[cfg.scheduler]
    ic[K.IC_LATENCY_CODE] = cfg.latency_code
    ic[K.IC_OUTPUT_TOKEN_TIME] = cfg.output_token_time
    ic[K.IC_POST_DECODE] = cfg.post_decode_overhead

    input_len = np.ascontiguousarray(table.input_len, dtype=np.int64)
    output_len = np.ascontiguousarray(table.output_len, dtype=np.int64)
    reload_ticks = 0
    if cfg.kv_cpu_blocks > 0:
        reload_ticks = cfg.kv_transfer_base_latency + int(
            math.ceil(float(cfg.block_size) / cfg.kv_transfer_bandwidth))
    kv = new_kv_state(n_inst, cfg.total_kv_blocks, cfg.block_size,
                      np.ascontiguousarray(table.chunk_offsets, dtype=np.int64),
                      np.ascontiguousarray(table.chunk_digests, dtype=np.uint64),
                      input_len, output_len, cfg.kv_cpu_blocks, reload_ticks)
    rs = K.new_req_state(n, table.max_output_len)
    ins = K.new_inst_state(n_inst, max_batch)
    lg = K.new_step_log(max(1024, 4 * n), max(1024, 2 * n))
    status, lg = K.simulate(
        ic, np.ascontiguousarray(cfg.latency_params, dtype=np.float64),
        np.ascontiguousarray(cfg.alpha, dtype=np.float64),
        np.ascontiguousarray(table.arrival_us, dtype=np.int64), input_len, output_len,
        np.ascontiguousarray(table.deadline_us, dtype=np.int64), id_rank_of(n), rs, ins, kv, lg)
    if status != K.STATUS_OK:
        raise BlisRuntimeError(f"simulation kernel failed with status {status}")

    hits = kv.meta[:, M_HITS]
    total = hits + kv.meta[:, M_MISSES] + kv.cpu_meta[:, C_MISS]
    with np.errstate(invalid="ignore", divide="ignore"):
        hit_rate = np.where(total > 0, hits / np.maximum(total, 1), 0.0)
        mirrors = kv.cpu_meta[:, C_MIRROR]
        thrash = np.where(mirrors > 0, kv.cpu_meta[:, C_EVICT] / np.maximum(mirrors, 1), 0.0)
    steps = int(lg.sizes[0])
    completed = rs.state == K.ST_COMPLETED
    return SimulationResult(
        config=cfg,
        state=rs.state,
        instance=rs.inst,
        registered=rs.registered,
        ttft_us=np.where(rs.has_ttft == 1, rs.ttft, -1),
        e2e_us=np.where(completed, rs.e2e, -1),
        itl_sum_us=rs.itl_sum,
        itl_count=rs.itl_cnt,
        sched_delay_us=np.where(rs.has_sched == 1, rs.sched_delay, -1),
        length_capped=rs.capped,
        counters=ins.cnt,
        kv_integral=ins.kv_integral,
        wait_queue_sum=ins.wq_sum,
        cache_hit_rate=hit_rate,
        thrashing_rate=thrash,
        still_queued=ins.wq[:, 2].copy(),
        still_running=ins.batch_len.copy(),
        rejected_admission=int(ins.rejected[0]),
        rejected_routing=int(ins.rejected[1]),
        step_time=lg.time[:steps].copy(),
        step_instance=lg.inst[:steps].copy(),
        step_duration=lg.dur[:steps].copy(),
        step_queue=lg.queue[:steps].copy(),
        step_running=lg.running[:steps].copy(),
        step_kv_used=lg.kv_used[:steps].copy(),
        step_itl_count=lg.itl_count[:steps].copy(),
    )
