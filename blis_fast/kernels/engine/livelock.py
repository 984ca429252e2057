"""Cycle detection for runs that can never finish (issue 29): an instance whose whole state
comes back, unchanged, while nothing but steps happens anywhere repeats itself forever.

Why this is sound. Between two events that are not steps (arrivals, admissions, routings, KV
transfers, timeouts, request-left events: every completion pushes one, every drop happens in
one) the simulation is closed: each instance's step is a deterministic function of that
instance's own state - its wait queue (order and each request's progress and block list), its
running batch, its KV cache (blocks, their hashes and reference counts, the free list's order,
the prefix table, the CPU tier's LRU store) - provided the queue's order does not depend on the clock (constant
priorities, no user scheduler key), there is no autoscaler and no closed-loop follow-up
pending, and the horizon is infinite (timeouts and arrivals are events, so none is
pending when the heap holds steps only). Counters, clocks, ITL samples and step-log links are
outputs: they never steer a step. So if instance ``i`` is twice in the same state with only
its own steps in between and no other event anywhere, it goes through the same steps again
and again, and can never complete a request (a completion would have been an event). When
every instance that still steps is in such a proven cycle, nothing outside them can ever
happen either, and the run never ends - the reference loops on the same configuration until
it is killed.

The state is compared through a 128-bit fingerprint of exactly that state (two independent
64-bit hash chains; the prefix table as an order-free sum, since lookups depend only on its
contents), taken after a step that left the batch empty with requests waiting (a head
request that preempted itself; in a finishing run this is rare, and never while any other
event is pending). Brent's algorithm finds a cycle of any length with one stored fingerprint
per instance. The only way to stop a run that would finish is a 128-bit hash collision.
Nothing here allocates; the cost is one comparison per step plus, at those rare points, one
pass over the instance's queue and cache.
"""

from __future__ import annotations

import numpy as np

from blis_fast.kernels.engine.batch import Priority, Scheduler
from blis_fast.kernels.engine.state import (
    ConfigSlot,
    HotField,
    InstanceCounter,
    LoopSlot,
    QueueField,
)
from blis_fast.kernels.enums import Event, Livelock
from blis_fast.kernels.go.gomath import INT64_MAX
from blis_fast.kernels.hashing import splitmix64
from blis_fast.kernels.jit import njit
from blis_fast.kernels.kv import kvcache as kvc
from blis_fast.kernels.kv.kv_layout import POS_MASK, BlockField, BlockList, CpuMeta

_SEED_B = np.uint64(0x9E3779B97F4A7C15)
_ODD = np.uint64(0xD6E8FEB86659FD93)


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _mix(a, b, x):
    """Both hash chains after value ``x``."""
    v = np.uint64(x)
    return splitmix64(a ^ v), splitmix64((b + v) * _ODD)


@njit(cache=True, _nrt=False, error_model="numpy")
def _mix_request(a, b, rs, kv, r):
    """Fold request ``r``'s state that steers steps: row, lifecycle, progress, granted and
    computed tokens, TTFT flag, P/D role, output budget, block list and its blocks."""
    a, b = _mix(a, b, r)
    a, b = _mix(a, b, rs.state[r])
    a, b = _mix(a, b, rs.hot[r, HotField.PROGRESS])
    a, b = _mix(a, b, rs.hot[r, HotField.NEW_TOKENS])
    a, b = _mix(a, b, rs.hot[r, HotField.COMPUTED])
    a, b = _mix(a, b, rs.hot[r, HotField.TTFT_SET])
    a, b = _mix(a, b, rs.pd_sub[r])
    a, b = _mix(a, b, rs.max_out[r])
    for c in range(BlockList.MIX + 1):
        a, b = _mix(a, b, kv.req[r, c])
    off = kv.req[r, BlockList.OFFSET]
    for k in range(kv.req[r, BlockList.COUNT]):
        a, b = _mix(a, b, kv.pool[off + k])
    return a, b


@njit(cache=True, _nrt=False, error_model="numpy")
def fingerprint(rs, ins, kv, i):
    """The 128-bit fingerprint (two uint64) of instance ``i``'s state that steers its steps."""
    a = np.uint64(i)
    b = _SEED_B
    a, b = _mix(a, b, ins.batch_len[i])
    for q in range(ins.batch_len[i]):
        a, b = _mix_request(a, b, rs, kv, ins.batch[i, q])
    a, b = _mix(a, b, ins.wq[i, QueueField.LEN])
    r = ins.wq[i, QueueField.HEAD]
    while r >= 0:
        a, b = _mix_request(a, b, rs, kv, r)
        r = rs.wq_next[r]
    total = kv.meta[i, kvc.KVMeta.TOTAL]
    for blk in range(total):
        for f in (BlockField.REF, BlockField.TOKENS, BlockField.FREE, BlockField.HASH_LO,
                  BlockField.HASH_HI):
            a, b = _mix(a, b, kv.blk[i, blk, f])
    a, b = _mix(a, b, kv.meta[i, kvc.KVMeta.FREE])
    mask = kv.free_ring.shape[1] - 1
    for p in range(kv.meta[i, kvc.KVMeta.HEAD], kv.meta[i, kvc.KVMeta.TAIL]):
        blk = kv.free_ring[i, p & mask]
        if kv.blk[i, blk, BlockField.FREE] == 1 and kv.blk[i, blk, BlockField.POS] == (p & POS_MASK):
            a, b = _mix(a, b, blk)
    table_a = np.uint64(0)
    table_b = np.uint64(0)
    for s in range(kv.ht.shape[1]):
        key = kv.ht[i, s, 0]
        if key != 0:
            pa, pb = _mix(splitmix64(key), _SEED_B ^ key, kv.ht[i, s, 1])
            table_a += pa
            table_b += pb
    a, b = _mix(a, b, table_a)
    a, b = _mix(a, b, table_b)
    if kv.cfg[kvc.KVConfig.TIERED] != 0:
        a, b = _mix_cpu_tier(a, b, kv, i)
    return a, b


@njit(cache=True, _nrt=False, error_model="numpy")
def _mix_cpu_tier(a, b, kv, i):
    """Fold instance ``i``'s CPU tier: its LRU order of (slot, hash), the free-slot stack
    and the transfer time the next step pays; the hash -> slot table is those pairs."""
    cm = kv.cpu_meta
    a, b = _mix(a, b, cm[i, CpuMeta.USED])
    a, b = _mix(a, b, cm[i, CpuMeta.PENDING])
    s = cm[i, CpuMeta.HEAD]
    while s >= 0:
        a, b = _mix(a, b, s)
        a, b = _mix(a, b, kv.cpu_hash[i, s])
        s = kv.cpu_nxt[i, s]
    top = cm[i, CpuMeta.FREE_TOP]
    a, b = _mix(a, b, top)
    for k in range(top):
        a, b = _mix(a, b, kv.cpu_free[i, k])
    return a, b


@njit(cache=True, _nrt=False, error_model="numpy")
def _closed(cfg, ins, kv, heap, n_inst):
    """Whether the run is closed: nothing but instance steps pending, the infinite horizon, no
    follow-up due, and steps whose course cannot depend on the clock (see the module)."""
    ints = cfg.ints
    if (ints[ConfigSlot.HORIZON] != INT64_MAX or ints[ConfigSlot.PRIORITY] != Priority.CONSTANT
            or ints[ConfigSlot.SCHEDULER] == Scheduler.CUSTOM
            or heap.loop[LoopSlot.PENDING_OUTCOMES] > 0):
        return False
    size = heap.loop[LoopSlot.HEAP_SIZE]
    if size > n_inst:
        return False
    for k in range(size):
        if heap.kinds[k] != Event.STEP:
            return False
    return True


@njit(cache=True, _nrt=False, error_model="numpy")
def check_cycle(cfg, rs, ins, kv, heap, i):
    """After a step of instance ``i`` that left its batch empty with requests waiting: one
    step of Brent's cycle search on the instance's fingerprints; True (and the loop's STOP_*
    slots set) when every instance still stepping is proven to cycle (the run never ends)."""
    n_inst = cfg.ints[ConfigSlot.N_INSTANCES]
    if not _closed(cfg, ins, kv, heap, n_inst):
        return False
    epoch = heap.loop[LoopSlot.OTHER_EVENTS] + 1
    a, b = fingerprint(rs, ins, kv, i)
    fa = np.int64(a)
    fb = np.int64(b)
    c = ins.cnt
    if c[i, InstanceCounter.CYCLE_EPOCH] != epoch:  # a new closed stretch: first fingerprint
        c[i, InstanceCounter.CYCLE_EPOCH] = epoch
        c[i, InstanceCounter.CYCLE_FP_A] = fa
        c[i, InstanceCounter.CYCLE_FP_B] = fb
        c[i, InstanceCounter.CYCLE_POWER] = 1
        c[i, InstanceCounter.CYCLE_LAM] = 0
        return False
    if fa == c[i, InstanceCounter.CYCLE_FP_A] and fb == c[i, InstanceCounter.CYCLE_FP_B]:
        c[i, InstanceCounter.CYCLE_PROVEN] = epoch
    else:
        lam = c[i, InstanceCounter.CYCLE_LAM] + 1
        if lam == c[i, InstanceCounter.CYCLE_POWER]:  # Brent: move the stored fingerprint
            c[i, InstanceCounter.CYCLE_FP_A] = fa
            c[i, InstanceCounter.CYCLE_FP_B] = fb
            c[i, InstanceCounter.CYCLE_POWER] = 2 * lam
            lam = 0
        c[i, InstanceCounter.CYCLE_LAM] = lam
        return False
    for j in range(n_inst):
        if c[j, InstanceCounter.STEP_PENDING] != 0 and c[j, InstanceCounter.CYCLE_PROVEN] != epoch:
            return False
    heap.loop[LoopSlot.STOP_KIND] = Livelock.CYCLE
    heap.loop[LoopSlot.STOP_ROW] = ins.wq[i, QueueField.HEAD]
    heap.loop[LoopSlot.STOP_INST] = i
    return True
