"""Invariants of the KV offload tier chain on whole runs (issue 32; spec kv-offload.md).

Random small runs of the chain's CPU tier, then with 1-2 secondary tiers:
workloads with shared prefix groups and accumulating multi-turn sessions, a GPU cache small
enough to evict, a CPU budget in bytes (whole blocks or not, down to one block), prompt-only
offload on or off, 1-3 instances, chunked prefill, sometimes a horizon that stops the run
mid-way. The run's end state is read from the KV state the engine built (captured as
tests/test_invariants.py does): its counters (``CpuMeta``) and its tables.

Properties:

(a) conservation: every request is completed, dropped, timed out or still in the system; with
    no horizon none is left; GPU blocks in use + free = the cache on every instance (free
    counter = live free-list entries, in use = referenced), all free at the end; the CPU tier's
    slots in use + free = its capacity = ``cpu_bytes_to_use // per_block_bytes`` (KVO-3.2), its
    LRU list holds every resident block once, and every block it ever stored is resident or
    was evicted (mirrors = resident + evictions);
(b) a block is never on the GPU and being fetched at once: without a secondary tier no fetch
    is ever in flight (no CPU slot waits for a promotion, KVO-4.2 state -1; no promotion fired
    or failed; no transfer time pending, KVO-5.6), and a reload fills a GPU block only for a
    key the GPU lacks (KVO-5.2), so the GPU prefix table maps each key to one block that holds
    it; the CPU tier holds each key once and its key table indexes exactly its resident slots
    (a reloaded block may be taken back from the free list before any request uses it, so
    reloads are not bounded by GPU hits);
(c) nothing is pinned without a secondary tier, so a mirror is never refused (KVO-4.3) and the
    KV Thrashing Rate is 0 (KVO-10.2); the counters only grow: a run stopped by a horizon
    reports at most the mirrors, evictions, reloads and GPU hits of the same run stopped
    later, and every request it completed ends identically in the longer run;
(d) no offload configured changes nothing: ``kv_offload_config=""`` is the run without the
    option, byte for byte (stdout, metrics file, Parquet); a chain whose CPU tier never served a
    block leaves every request's result as the GPU-only run has it;
(e) determinism: the same chain run twice gives byte-identical stdout and metrics file and
    equal Parquet tables;
(f) with secondary tiers (``SimulationResult.kv_offload``): CPU slots in use = ready + pinned
    + promoting, every tier write follows a new CPU store, bytes add up to whole blocks per
    transfer, reads never exceed the promotions fired, and the KV Thrashing Rate is refused /
    attempted promotions;
(g) the per-request records (requests.parquet's kv_* columns) add up to the instances' counts:
    CPU-tier reloads per request sum to each instance's reloads, deferral episodes to its
    deferrals, and the blocks promotions landed for requests plus those still being read to
    the blocks its promotions reserved; a request never deferred waited no time.
"""

from __future__ import annotations

import contextlib
import io
import json
import tempfile
from collections import Counter
from pathlib import Path
from unittest import mock

import numpy as np
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import blis_fast
from blis_fast.engine import packing
from blis_fast.kernels.kv.kv_layout import BlockField, CpuMeta, KVConfig, KVMeta

MODEL = "meta-llama/llama-3.1-8b-instruct"
BS = 16
BLOCK_BYTES = 2_097_152  # llama-3.1-8b, TP 1, 16-token blocks (KVO-3.2)
SETTINGS = dict(deadline=None, database=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _gauss(mean: int) -> tuple[dict, int]:
    """A bounded gaussian length distribution and its maximum."""
    top = 2 * mean
    return ({"type": "gaussian", "params": {"mean": mean, "std_dev": mean // 3,
                                            "min": max(1, mean // 4), "max": top}}, top)


@st.composite
def chain_runs(draw, sessions: bool = True) -> dict:
    """A small chain run: workload spec, options and the ``kv_offload:`` block; ``sessions``
    False keeps to prefix-group clients."""
    clients, need = [], 0
    for c in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["prefix", "prefix", "session"] if sessions else ["prefix"]))
        inp, in_max = _gauss(draw(st.integers(16, 128 if kind == "session" else 256)))
        out, out_max = _gauss(draw(st.integers(2, 48)))
        client = {"id": f"c{c}", "rate_fraction": 1.0, "arrival": {"process": "poisson"},
                  "input_distribution": inp, "output_distribution": out}
        tokens = in_max + out_max
        if kind == "prefix":
            client["prefix_group"] = f"p{draw(st.integers(0, 2))}"
            client["prefix_length"] = draw(st.sampled_from([64, 128, 256]))
            tokens += client["prefix_length"]
        else:
            rounds = draw(st.integers(2, 3))
            client["reasoning"] = {
                "reason_ratio_distribution": {"type": "constant", "params": {"value": 0}},
                "multi_turn": {"max_rounds": rounds,
                               "think_time_us": draw(st.sampled_from([0, 50_000, 200_000])),
                               "context_growth": "accumulate"}}
            tokens = rounds * (in_max + out_max)
        clients.append(client)
        need = max(need, tokens)
    spec = {"version": "2", "seed": draw(st.integers(1, 10_000)), "category": "language",
            "aggregate_rate": draw(st.sampled_from([4.0, 10.0, 25.0, 60.0])),
            "num_requests": draw(st.integers(10, 40)), "clients": clients}
    instances = draw(st.integers(1, 3))
    opts: dict = dict(
        model=MODEL, latency_model="roofline", snapshot_refresh_interval=0, log="error",
        seed=draw(st.integers(1, 100_000)), num_instances=instances,
        total_kv_blocks=-(-need // BS) + draw(st.integers(2, 60)))
    if instances > 1:
        routing = draw(st.sampled_from(["round-robin", "least-loaded", "weighted"]))
        opts["routing_policy"] = routing
        if routing == "weighted":
            opts["routing_scorers"] = "prefix-affinity:3,queue-depth:1"
    if draw(st.booleans()):
        opts["long_prefill_token_threshold"] = draw(st.sampled_from([32, 64, 128]))
    # a tiny tier (constant LRU eviction) or one that keeps prefixes the GPU evicted
    cpu_blocks = draw(st.one_of(st.integers(1, 6), st.integers(150, 500),
                                st.integers(150, 500)))
    block = {"cpu_bytes_to_use": cpu_blocks * BLOCK_BYTES
             + draw(st.sampled_from([0, 0, 1, BLOCK_BYTES - 1])),
             "offload_prompt_only": draw(st.booleans())}
    return {"spec": spec, "opts": opts, "offload": block, "cpu_blocks": cpu_blocks}


class _Capture:
    """Keeps the KV state the engine builds (``packing.new_kv_state``)."""

    def __init__(self) -> None:
        self.kv = None
        self._real = packing.new_kv_state

    def __call__(self, *args, **kwargs):
        self.kv = self._real(*args, **kwargs)
        return self.kv


def _run(run: dict, folder: Path, offload: bool = True, **extra):
    """The run (files under ``folder``) and the KV state it ended with."""
    spec = folder / "wl.yaml"
    spec.write_text(yaml.safe_dump(run["spec"], sort_keys=False))
    opts = {**run["opts"], "workload_spec": str(spec), **extra}
    if offload:
        path = folder / "offload.yaml"
        path.write_text(yaml.safe_dump({"kv_offload": run["offload"]}, sort_keys=False))
        opts["kv_offload_config"] = str(path)
    cap = _Capture()
    with mock.patch.object(packing, "new_kv_state", cap), \
            contextlib.redirect_stderr(io.StringIO()):
        res = blis_fast.run(**opts)
    return res, cap.kv


def _live_free(kv, i: int) -> int:
    """Live entries of instance ``i``'s free ring (a stale entry is a block taken off it)."""
    mask = kv.free_ring.shape[1] - 1
    live = 0
    for pos in range(int(kv.meta[i, KVMeta.HEAD]), int(kv.meta[i, KVMeta.TAIL])):
        b = int(kv.free_ring[i, pos & mask])
        if (kv.blk[i, b, BlockField.FREE] == 1
                and kv.blk[i, b, BlockField.POS] == pos & ((1 << 31) - 1)):
            live += 1
    return live


def _cpu_lru(kv, i: int) -> list[int]:
    """Instance ``i``'s CPU slots on the LRU list, oldest first."""
    slots, s = [], int(kv.cpu_meta[i, CpuMeta.HEAD])
    while s >= 0 and len(slots) <= kv.cpu_hash.shape[1]:
        slots.append(s)
        s = int(kv.cpu_nxt[i, s])
    return slots


def _gpu_hashes(kv, i: int, total: int) -> np.ndarray:
    """The 64-bit hash each GPU block of instance ``i`` holds (0: none)."""
    lo = kv.blk[i, :total, BlockField.HASH_LO].astype(np.uint32).astype(np.uint64)
    hi = kv.blk[i, :total, BlockField.HASH_HI].astype(np.uint32).astype(np.uint64)
    return (hi << np.uint64(32)) | lo


def _check_table(table: np.ndarray, held: np.ndarray, resident: list[int] | None = None) -> None:
    """Every entry of a key table (``[size, 2]`` key, value; key 0 = empty) names a distinct
    block or slot that holds its key; with ``resident``, exactly those slots are entered."""
    used = table[:, 0] != 0
    keys, values = table[used, 0], table[used, 1].astype(np.int64)
    assert len(set(values.tolist())) == len(values)
    assert ((values >= 0) & (values < held.shape[0])).all()
    assert (held[values] == keys).all()
    if resident is not None:
        assert sorted(values.tolist()) == sorted(resident)


def _check_run(run: dict, res, kv, finite: bool) -> None:
    """Properties (a), (b) and (c) on one run's end state."""
    s = res.summary
    left = s["still_queued"] + s["still_running"]
    assert (s["completed_requests"] + s["dropped_unservable"] + s["timed_out_requests"] + left
            == s["injected_requests"])
    if not finite:
        assert left == 0
    cap = int(kv.cfg[KVConfig.CPU_CAPACITY])
    assert cap == run["offload"]["cpu_bytes_to_use"] // BLOCK_BYTES == run["cpu_blocks"]
    assert "KV Thrashing Rate" not in res.stdout or "KV Thrashing Rate: 0.0000" in res.stdout
    for i in range(run["opts"]["num_instances"]):
        # GPU: in use + free = the cache; nothing held once every request is done
        total = int(kv.meta[i, KVMeta.TOTAL])
        free = int(kv.meta[i, KVMeta.FREE])
        assert free == _live_free(kv, i)
        refs = kv.blk[i, :total, BlockField.REF]
        assert (refs >= 0).all()
        in_use = int((refs > 0).sum())
        assert in_use + free == total
        assert ((refs > 0) == (kv.blk[i, :total, BlockField.FREE] == 0)).all()
        if not finite:
            assert in_use == 0
        # CPU: in use + free slots = capacity; every resident block ready, on the LRU once
        cm = kv.cpu_meta[i]
        used = int(cm[CpuMeta.USED])
        assert used + int(cm[CpuMeta.FREE_TOP]) == cap
        lru = _cpu_lru(kv, i)
        assert len(lru) == len(set(lru)) == used == int(cm[CpuMeta.EVICTABLE])
        assert (kv.cpu_ref[i, lru] == 0).all()  # no pin, no promotion in flight (KVO-4.2)
        keys = kv.cpu_hash[i, lru]
        assert len(set(keys.tolist())) == used
        # stored blocks are resident or evicted; none refused, none lost
        assert int(cm[CpuMeta.MIRRORS]) == used + int(cm[CpuMeta.EVICTIONS])
        assert int(cm[CpuMeta.MIRROR_SKIPPED]) == 0
        assert int(cm[CpuMeta.PROMO_FIRED]) == int(cm[CpuMeta.PROMO_FAILED]) == 0
        assert int(cm[CpuMeta.PENDING]) == 0  # reloads cost no time (KVO-5.6, KVO-D1)
        # the key tables agree with what they index: the GPU prefix table maps each key to a
        # block holding it (a reload fills only a block for a key the GPU lacks, KVO-5.2),
        # the CPU table each resident key to its slot
        _check_table(kv.ht[i], _gpu_hashes(kv, i, total))
        _check_table(kv.cpu_ht[i], kv.cpu_hash[i], resident=lru)
    _check_request_records(res, kv, run["opts"]["num_instances"])


def _check_request_records(res, kv, n_inst: int) -> None:
    """(g) on one run's end state."""
    sim = res.simulation
    routed = sim.instance >= 0

    def per_instance(values: np.ndarray) -> np.ndarray:
        assert (values >= 0).all() and values[~routed].sum() == 0
        return np.bincount(sim.instance[routed], weights=values[routed],
                           minlength=n_inst).astype(np.int64)

    assert (per_instance(sim.kv_cpu_reloads) == kv.cpu_meta[:n_inst, CpuMeta.HITS]).all()
    chain, f = sim.kv_chain_requests, sim.kv_offload
    assert (per_instance(chain.deferrals) == f.deferrals_started).all()
    assert (chain.fetch_wait_us >= 0).all() and (chain.fetch_wait_us[chain.deferrals == 0] == 0).all()
    promoting = (kv.cpu_ref[:n_inst] == -1).sum(axis=1)
    assert (per_instance(chain.promoted_blocks) + promoting
            == kv.cpu_meta[:n_inst, CpuMeta.PROMO_BLOCKS]).all()


@settings(max_examples=30, **SETTINGS)
@given(run=chain_runs(), horizon=st.one_of(st.none(), st.integers(300_000, 4_000_000)))
def test_chain_runs_conserve_requests_and_blocks(run, horizon) -> None:
    """(a), (b), (c) at the end of a run, or wherever a horizon stops it."""
    with tempfile.TemporaryDirectory() as tmp:
        extra = {} if horizon is None else {"horizon": horizon}
        res, kv = _run(run, Path(tmp), **extra)
    _check_run(run, res, kv, finite=horizon is not None)


def _completed(sim) -> dict[tuple[int, int], Counter]:
    """Per (arrival, input length) of the run's requests, its completed requests' (instance,
    TTFT, E2E) counts (empty when none completed)."""
    table = sim.table
    out: dict[tuple[int, int], Counter] = {}
    for r in range(table.arrival_us.shape[0]):
        seen = out.setdefault((int(table.arrival_us[r]), int(table.input_len[r])), Counter())
        if sim.e2e_us[r] >= 0:
            seen[(int(sim.instance[r]), int(sim.ttft_us[r]), int(sim.e2e_us[r]))] += 1
    return out


def _figures(kv) -> np.ndarray:
    """Per instance: CPU mirrors, CPU evictions, reloads from the CPU tier, GPU hits."""
    return np.stack([kv.cpu_meta[:, CpuMeta.MIRRORS], kv.cpu_meta[:, CpuMeta.EVICTIONS],
                     kv.cpu_meta[:, CpuMeta.HITS], kv.meta[:, KVMeta.HITS]])


def _reloads(kv) -> np.ndarray:
    """Blocks each instance reloaded from the CPU tier (KVO-5.2)."""
    return kv.cpu_meta[:, CpuMeta.HITS]


@settings(max_examples=8, **SETTINGS)
@given(run=chain_runs(sessions=False), cut=st.integers(200_000, 2_000_000))
def test_counters_only_grow_and_completed_requests_keep_their_results(run, cut) -> None:
    """(c): the run stopped at ``cut``, at ``2 cut`` and not at all: mirrors, evictions,
    reloads and GPU hits never decrease, and what completed early ends identically later.
    Prefix-group clients only: a horizon also bounds the workload, and a multi-turn session's
    later rounds draw other lengths under another horizon (GPU-only runs too), which would
    change the batches of the requests beside them."""
    with tempfile.TemporaryDirectory() as tmp:
        runs = [_run(run, Path(tmp), horizon=h) for h in (cut, 2 * cut)]
        runs.append(_run(run, Path(tmp)))
    figures = [_figures(kv) for _, kv in runs]
    for early, late in zip(figures, figures[1:], strict=False):
        assert (early <= late).all(), (early, late)
    # a shorter run generates fewer requests, so a request is known by its arrival and input
    # length; one the longer run also has must end there as it did
    ended = [_completed(res.simulation) for res, _ in runs]
    for early, late in zip(ended, ended[1:], strict=False):
        for key, outcomes in early.items():
            if key in late:
                assert outcomes <= late[key], (key, outcomes, late[key])


def _outputs(res_folder: Path) -> tuple[bytes, dict]:
    """The metrics file's bytes and the Parquet tables of a run's output folder."""
    import pyarrow.parquet as pq

    tables = {p.name: pq.read_table(p).replace_schema_metadata(None)
              for p in sorted((res_folder / "out").glob("*.parquet"))}
    return (res_folder / "m.json").read_bytes(), tables


@settings(max_examples=6, **SETTINGS)
@given(run=chain_runs())
def test_no_offload_configured_changes_nothing(run) -> None:
    """(d): ``kv_offload_config=""`` is the run without the option, byte for byte; and when the
    chain's CPU tier served no block, every request ends as in the GPU-only run."""
    with tempfile.TemporaryDirectory() as tmp:
        folders = [Path(tmp) / "a", Path(tmp) / "b"]
        outs = []
        for folder, extra in zip(folders, ({}, {"kv_offload_config": ""}), strict=True):
            folder.mkdir()
            res, _ = _run(run, folder, offload=False, metrics_path=str(folder / "m.json"),
                          output_dir=str(folder / "out"), **extra)
            outs.append((res.stdout, *_outputs(folder)))
        assert outs[0][:2] == outs[1][:2]
        assert outs[0][2].keys() == outs[1][2].keys()
        assert all(outs[0][2][k].equals(outs[1][2][k]) for k in outs[0][2])
        plain = res.simulation
        chain, kv = _run(run, Path(tmp))
    if int(_reloads(kv).sum()) == 0:
        for name in ("e2e_us", "ttft_us", "instance", "preemptions", "sched_delay_us"):
            np.testing.assert_array_equal(getattr(chain.simulation, name),
                                          getattr(plain, name), err_msg=name)


def _fixed(gpu: int, cpu: int, instances: int = 2) -> dict:
    """A fixed run: three clients, each with its own 256-token prefix group, 40 requests."""
    clients = [{"id": f"g{g}", "rate_fraction": 1.0, "arrival": {"process": "poisson"},
                "input_distribution": _gauss(100)[0], "output_distribution": _gauss(20)[0],
                "prefix_group": f"p{g}", "prefix_length": 256} for g in range(3)]
    return {"spec": {"version": "2", "seed": 3, "category": "language", "aggregate_rate": 20.0,
                     "num_requests": 40, "clients": clients},
            "opts": dict(model=MODEL, latency_model="roofline", snapshot_refresh_interval=0,
                         log="error", seed=5, num_instances=instances,
                         routing_policy="round-robin", total_kv_blocks=gpu),
            "offload": {"cpu_bytes_to_use": cpu * BLOCK_BYTES + 7}, "cpu_blocks": cpu}


def test_prefixes_come_back_from_the_cpu_tier_and_the_invariants_hold() -> None:
    """(a)-(c) on a fixed run whose GPU evicts the prefixes the CPU tier keeps: blocks are
    reloaded (KVO-5.2) and the hit rate rises above the GPU-only run's."""
    run = _fixed(gpu=60, cpu=300)
    with tempfile.TemporaryDirectory() as tmp:
        chain, kv = _run(run, Path(tmp))
        plain, _ = _run(run, Path(tmp), offload=False)
    assert int(_reloads(kv).min()) > 0
    _check_run(run, chain, kv, finite=False)

    def hit_rate(stdout: str) -> float:
        return float(stdout.split("Cache Hit Rate: ")[1].split()[0])

    assert hit_rate(chain.stdout) > hit_rate(plain.stdout)


def test_a_chain_that_never_reloads_keeps_the_gpu_only_results() -> None:
    """(d) on a fixed run where the GPU never evicts (the cache holds everything): the chain's
    CPU tier mirrors blocks but serves none, and stdout is the GPU-only run's."""
    run = _fixed(gpu=5000, cpu=40)
    with tempfile.TemporaryDirectory() as tmp:
        chain, kv = _run(run, Path(tmp))
        plain, _ = _run(run, Path(tmp), offload=False)
    assert int(kv.cpu_meta[:, CpuMeta.MIRRORS].sum()) > 0
    assert int(_reloads(kv).sum()) == 0
    assert chain.stdout == plain.stdout
    _check_run(run, chain, kv, finite=False)


@settings(max_examples=3, **SETTINGS)
@given(run=chain_runs())
def test_chain_runs_are_deterministic(run) -> None:
    """(e): two runs of the same chain configuration give the same bytes and tables."""
    with tempfile.TemporaryDirectory() as tmp:
        outs = []
        for name in ("a", "b"):
            folder = Path(tmp) / name
            folder.mkdir()
            res, _ = _run(run, folder, metrics_path=str(folder / "m.json"),
                          output_dir=str(folder / "out"))
            outs.append((res.stdout, *_outputs(folder)))
    assert outs[0][:2] == outs[1][:2]
    assert json.loads(outs[0][1])  # a metrics file was written
    assert outs[0][2].keys() == outs[1][2].keys() and outs[0][2]
    assert all(outs[0][2][k].equals(outs[1][2][k]) for k in outs[0][2])


# ------------------------------------------------------------------ with secondary tiers

TIER_DEVICES = ({"device_class": "nvme_gen4"}, {"device_class": "sata_ssd"},
                {"device_class": "s3"},
                {"read_bandwidth": 300.0, "write_bandwidth": 200.0, "base_latency": 40.0})


@settings(max_examples=12, **SETTINGS)
@given(run=chain_runs(), tiers=st.lists(st.tuples(st.sampled_from(TIER_DEVICES), st.booleans(),
                                                  st.integers(1, 4)), min_size=1, max_size=2))
def test_tiered_chain_runs_account_for_every_transfer(run, tiers) -> None:
    """With 1-2 secondary tiers (KVO-4..7): every request is accounted for and GPU blocks are
    conserved as above; CPU slots in use = ready (on the LRU list) + pinned by writes +
    awaiting a promotion; every tier write follows a new CPU store (a tier never starts more
    writes than the CPU tier stored blocks, KVO-4.4); a write is one block and a read whole
    blocks (bytes add up to the per-tier counts); reads started never exceed the promotions
    fired; the printed KV Thrashing Rate is refused / attempted promotions (KVO-10.2)."""
    run = _with_tiers(run, tiers)
    with tempfile.TemporaryDirectory() as tmp:
        res, kv = _run(run, Path(tmp))
    _check_tiered(run, res, kv)


def _with_tiers(run: dict, tiers: list[tuple[dict, bool, int]]) -> dict:
    """``run`` with secondary tiers (device figures, O_DIRECT, servers per direction)."""
    return {**run, "offload": {**run["offload"], "secondary_tiers": [
        {"type": "fs", "root_dir": f"/mnt/t{n}", "direct_io": direct, "n_read_threads": servers,
         "n_write_threads": servers, **device}
        for n, (device, direct, servers) in enumerate(tiers)]}}


def test_a_tier_serves_back_what_a_small_cpu_tier_evicted() -> None:
    """A fixed run whose 8-block CPU tier cannot keep the prefixes the GPU evicts: NVMe gives
    them back by promotions (KVO-5.4), deferred admissions wait for them (KVO-7), and the
    transfer accounting holds."""
    run = _with_tiers(_fixed(gpu=60, cpu=8), [({"device_class": "nvme_gen4"}, True, 2)])
    with tempfile.TemporaryDirectory() as tmp:
        res, kv = _run(run, Path(tmp))
    f = res.simulation.kv_offload
    assert int(f.promotions_fired.min()) > 0 and int(f.tier_reads.min()) > 0
    assert int(f.deferrals_started.sum()) > 0
    chain = res.simulation.kv_chain_requests
    assert chain.promoted_blocks.sum() > 0 and chain.fetch_wait_us.max() > 0
    _check_tiered(run, res, kv)


def _check_tiered(run: dict, res, kv) -> None:
    """The accounting of a finished run with secondary tiers (see the test above)."""
    tiers = run["offload"]["secondary_tiers"]
    s = res.summary
    assert s["still_queued"] + s["still_running"] == 0
    assert (s["completed_requests"] + s["dropped_unservable"] + s["timed_out_requests"]
            == s["injected_requests"])
    f = res.simulation.kv_offload
    cap = int(kv.cfg[KVConfig.CPU_CAPACITY])
    for i in range(run["opts"]["num_instances"]):
        total = int(kv.meta[i, KVMeta.TOTAL])
        free = int(kv.meta[i, KVMeta.FREE])
        assert free == _live_free(kv, i) == total  # every request ended: nothing held
        cm = kv.cpu_meta[i]
        used = int(cm[CpuMeta.USED])
        assert used + int(cm[CpuMeta.FREE_TOP]) == cap
        lru = _cpu_lru(kv, i)
        assert len(lru) == len(set(lru)) == int(cm[CpuMeta.EVICTABLE])
        assert (kv.cpu_ref[i, lru] == 0).all()
        slots = np.flatnonzero(np.isin(np.arange(cap), kv.cpu_free[i, :int(cm[CpuMeta.FREE_TOP])],
                                       invert=True))
        assert len(slots) == used
        off_list = np.setdiff1d(slots, lru)
        assert (kv.cpu_ref[i, off_list] != 0).all()  # pinned (> 0) or promoting (-1)
        assert (kv.cpu_ref[i, slots] >= -1).all()
        _check_table(kv.cpu_ht[i], kv.cpu_hash[i], resident=slots.tolist())
        per_block = BLOCK_BYTES
        for t in range(len(tiers)):
            assert int(f.tier_writes[i, t]) <= int(f.cpu_mirrors[i])
            assert int(f.tier_bytes_written[i, t]) == int(f.tier_writes[i, t]) * per_block
            assert int(f.tier_bytes_read[i, t]) % per_block == 0
            assert int(f.tier_bytes_read[i, t]) >= int(f.tier_reads[i, t]) * per_block
        assert int(f.tier_reads[i].sum()) <= int(f.promotions_fired[i])
    _check_request_records(res, kv, run["opts"]["num_instances"])
    fired, failed = int(f.promotions_fired.sum()), int(f.promotions_failed.sum())
    if "KV Thrashing Rate" in res.stdout and run["opts"]["num_instances"] == 1:
        rate = failed / (fired + failed) if fired + failed else 0.0
        assert f"KV Thrashing Rate: {rate:.4f}" in res.stdout

