"""Layouts of the autoscaler's state (``kernels/cluster/autoscale.py``): the slots of its parameter,
variable and per-instance arrays, the signal record columns, and the :class:`AutoscaleState`
NamedTuple itself; kept apart from the kernels so that Python (``engine/fleet.py``, the
outputs) and the kernels read one definition."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from blis_fast.kernels.go.gomath import INT64_MIN


class AsParamT(NamedTuple):
    """Slots of ``AutoscaleState.par`` (float64: the resolved configuration)."""

    INTERVAL: int = 0  # µs; 0 = the autoscaler is off (pools only)
    UP_WINDOW: int = 1  # µs
    DOWN_WINDOW: int = 2
    SCRAPE_MEAN: int = 3  # s
    SCRAPE_STD: int = 4
    KV_THRESHOLD: int = 5  # effective analyzer thresholds
    UP_THRESHOLD: int = 6
    DOWN_BOUNDARY: int = 7
    AVG_INPUT: int = 8
    LOAD_MEAN: int = 9  # s
    LOAD_STD: int = 10
    SIZE: int = 11


AsParam = AsParamT()


class AsVarT(NamedTuple):
    """Slots of ``AutoscaleState.var`` (int64: configuration flags and the run's scalars)."""

    HAS_POOLS: int = 0
    MIN_REPLICAS: int = 1  # -1 = not given
    MAX_REPLICAS: int = 2
    COUNT: int = 3  # instances built so far (rows 0..COUNT-1)
    SEQ: int = 4  # autoscaled-id sequence (consumed even by failed placements)
    PENDING_ARRIVALS: int = 5  # ClusterArrival events pushed and not executed
    UP_FIRST: int = 6  # first tick of the current scale-up signal, INT64_MIN = none
    DOWN_FIRST: int = 7
    N_ACTUATIONS: int = 8  # decisions that passed the gate (``act`` row: this modulo its size)
    TICKING: int = 9  # 1 while ticks are scheduled
    FAILED_PLACEMENTS: int = 10
    NO_POOL_SCALE_UPS: int = 11  # scale-ups refused for want of a placement manager
    LAST_SERVING_DRAINED_AT: int = 12  # time a drain left no Active instance (-1 = never)
    LAST_SERVING_DRAINED: int = 13  # that instance
    TICKING_STOPPED_AT: int = 14  # -1 = never
    DRAIN_NOT_FOUND: int = 15  # scale-down steps that found no Active instance of the variant
    FIRST_FAILED_SEQ: int = 16
    LAST_FAILED_SEQ: int = 17
    SCALE_UPS: int = 18  # instances placed by the autoscaler
    SCALE_DOWNS: int = 19  # instances drained
    HORIZON_INF: int = 20  # 1 when the horizon is unbounded (the tick's termination guard)
    SKIPPED_UNREFRESHED: int = 21  # routable replicas a tick left out: no KV capacity seen yet
    LAST_SKIP_AT: int = 22  # the last tick that left one out (-1 = never)
    SIZE: int = 23


AsVar = AsVarT()


class AsInstT(NamedTuple):
    """Columns of ``AutoscaleState.inst`` (int64, one row per instance)."""

    STATE: int = 0  # Lifecycle
    KIND: int = 1  # InstanceKind
    NUMBER: int = 2  # startup index or autoscale sequence number
    ID_KEY: int = 3  # integer order = byte order of the ids (id_key)
    NODE: int = 4  # -1 without pools
    LABEL: int = 5  # GPU label id (labels sorted byte-wise)
    TP: int = 6  # the reference's TP degree (0 without pools)
    PLACED: int = 7  # µs; lifecycle times, -1 = never
    READY: int = 8
    DRAINED: int = 9
    TERMINATED: int = 10
    SIZE: int = 11


AsInst = AsInstT()


class AutoscaleState(NamedTuple):
    """The autoscaler's and the placement's state (``M`` instance rows, ``G`` GPUs)."""

    par: np.ndarray  # float64 [AsParam.SIZE]
    var: np.ndarray  # int64 [AsVar.SIZE]
    inst: np.ndarray  # int64 [M, AsInst.SIZE]
    cost: np.ndarray  # float64 [M]: cost_per_hour (orders variants)
    label_blocks: np.ndarray  # int64 [L]: KV blocks of an instance on this GPU label
    label_max_len: np.ndarray  # int64 [L]
    label_cost: np.ndarray  # float64 [L]
    node_label: np.ndarray  # int64 [nodes]
    node_free: np.ndarray  # int64 [nodes]
    node_gpu0: np.ndarray  # int64 [nodes + 1]: first GPU of each node
    gpu_owner: np.ndarray  # int64 [G]: instance holding the GPU, -1 = free
    act: np.ndarray  # int64 [R, 3]: a ring of the actuations in flight (delta, label, tp)
    act_sig: np.ndarray  # float64 [R, Signal.SIZE]: the passing tick's signal values
    sig: np.ndarray  # float64 [Signal.SIZE]: the last tick's signal values
    inst_sig: np.ndarray  # float64 [M, 2, Signal.SIZE]: what placed (0) / drained (1) it
    rng_scrape: np.ndarray  # Go rand source "autoscaler"
    rng_loading: np.ndarray  # Go rand source "instance-loading"
    # analyzer scratch, one row per variant (GPU label, TP)
    v_label: np.ndarray  # int64 [M]
    v_tp: np.ndarray
    v_count: np.ndarray
    v_order: np.ndarray
    v_supply: np.ndarray  # float64 [M]
    v_demand: np.ndarray
    v_cost: np.ndarray


class SignalT(NamedTuple):
    """Columns of the signal records (the analyzer's figures of a tick, in tokens)."""

    TICK: int = 0  # time of the tick whose decision passed (µs)
    SINCE: int = 1  # first tick of the signal (the window's start)
    SUPPLY: int = 2
    DEMAND: int = 3
    PENDING: int = 4  # supply of instances still loading
    AMOUNT: int = 5  # tokens required (scale-up) or spare (scale-down)
    DELTA: int = 6
    SIZE: int = 7


Signal = SignalT()
ACT_DELTA, ACT_LABEL, ACT_TP = 0, 1, 2
NO_TIME = np.int64(INT64_MIN)

__all__ = ["ACT_DELTA", "ACT_LABEL", "ACT_TP", "NO_TIME", "AsInst", "AsParam", "AsVar",
           "AutoscaleState", "Signal"]
