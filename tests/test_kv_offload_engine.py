"""The August KV offload tier chain in the engine (issue 32; spec kv-offload.md KVO-3..KVO-10).

The chain's CPU tier: sized in bytes (KVO-3.2), consulted before every GPU allocation
(KVO-5.1/5.2), reloads free of charge (KVO-5.6, defect KVO-D1, warned), mirroring clamped to
the prompt (KVO-8), ``KV Thrashing Rate`` 0 without promotions (KVO-10.2); its secondary tiers
(write-through, promotions, deferral: KVO-4.4..7, kernel-level in ``tests/test_kv_chain.py``)
through whole runs. The parity cases ``kvo-*`` check it against the reference; these tests
check its invariants on random inputs.
"""

from __future__ import annotations

import json
from pathlib import Path

import numba
import numpy as np
import pytest
from _cli import invoke
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_kv_cpu_reload import _spec  # the prefix-group workload both files run

import blis_fast
from blis_fast.kernels.kv import kvcache as kvc
from blis_fast.kernels.kv.hashtable import table_get
from blis_fast.kernels.kv.kv_layout import BlockField, CpuMeta, KVConfig

MODEL = "meta-llama/llama-3.1-8b-instruct"
BLOCK_BYTES = 2_097_152  # llama-3.1-8b, TP 1, 16-token blocks (KVO-3.2)
BS = 16


# kernels the engine links without a Python wrapper, called through small jitted shims
@numba.njit
def _mirror(kv, i, batch, n, input_len):
    kvc.mirror_to_cpu(kv, i, batch, n, input_len)


@numba.njit
def _block_hash(kv, i, b):
    return kvc.get_block_hash(kv, i, b)


@numba.njit
def _get(table, i, h):
    return table_get(table, i, h)


@numba.njit
def _pending(kv, i):
    return kvc.consume_pending_transfer(kv, i)


# ------------------------------------------------------------------ kernel-level invariants


def _cache(lengths: list[int], shared: int, gpu: int, cpu: int, prompt_only: bool):
    """One instance's chain-mode cache (reload first, free reloads) for requests of the given
    input lengths whose first ``shared`` blocks are one common prefix."""
    n_blocks = [-(-n // BS) for n in lengths]  # a partial last block has its digest too
    digests = []
    for r, n in enumerate(n_blocks):
        digests += [1000 + k if k < shared else 10_000 * (r + 1) + k for k in range(n)]
    offsets = np.concatenate([[0], np.cumsum(n_blocks)]).astype(np.int64)
    return kvc.new_kv_state(1, gpu, BS, offsets, np.array(digests, np.uint64) * np.uint64(7919),
                            np.array(lengths, np.int64), np.zeros(len(lengths), np.int64),
                            cpu_blocks=cpu, reload_ticks=0, reload_first=True,
                            prompt_only_mirror=prompt_only)


def _cpu_lru(kv) -> list[int]:
    """The CPU tier's slots in LRU order (oldest first)."""
    slots, s = [], int(kv.cpu_meta[0, CpuMeta.HEAD])
    while s >= 0:
        slots.append(s)
        s = int(kv.cpu_nxt[0, s])
    return slots


def _check(kv, allowed: set[int]) -> None:
    cap = int(kv.cfg[KVConfig.CPU_CAPACITY])
    lru = _cpu_lru(kv)
    used = int(kv.cpu_meta[0, CpuMeta.USED])
    # every CPU-resident block is ready and evictable (no pins without a secondary tier,
    # KVO-4.2): all of them are on the LRU list, each once, within the budget
    assert len(lru) == len(set(lru)) == used <= cap
    hashes = [int(kv.cpu_hash[0, s]) for s in lru]
    assert len(set(hashes)) == used
    for s, h in zip(lru, hashes, strict=True):
        assert _get(kv.cpu_ht, 0, np.uint64(h)) == s
    # only prompt blocks the mirror was allowed to offer reach the CPU tier (KVO-8.1)
    assert set(hashes) <= allowed
    # a block is on the GPU once: the prefix table maps each hash to one block holding it,
    # so a reload never duplicates a block the GPU already has (KVO-5.2)
    on_gpu = [b for b in range(kv.blk.shape[1])
              if (h := int(_block_hash(kv, 0, b))) != 0
              and _get(kv.ht, 0, np.uint64(h)) == b]
    gpu_hashes = [int(_block_hash(kv, 0, b)) for b in on_gpu]
    assert len(gpu_hashes) == len(set(gpu_hashes))
    assert kv.cpu_meta[0, CpuMeta.PENDING] == 0  # reloads are free (KVO-5.6, KVO-D1)


@settings(max_examples=120, deadline=None, derandomize=True)
@given(lengths=st.lists(st.integers(BS, 12 * BS), min_size=2, max_size=6),
       shared=st.integers(0, 4), gpu=st.integers(14, 40), cpu=st.integers(1, 12),
       clamp=st.lists(st.integers(0, 12 * BS), min_size=6, max_size=6),
       order=st.lists(st.integers(0, 5), min_size=1, max_size=20),
       prompt_only=st.booleans())
def test_cpu_tier_stays_consistent_and_mirrors_only_the_prompt(lengths, shared, gpu, cpu,
                                                               clamp, order, prompt_only):
    """Requests admitted one at a time (allocation consults the CPU tier first, KVO-5.1),
    mirrored after their step with a prompt length ``clamp`` (KVO-8.1), then released: the
    CPU tier stays a consistent LRU store within its budget, holds only blocks the mirror
    was allowed to offer (those inside the clamped prompt; every full block without the
    clamp), and the GPU never holds a block twice."""
    kv = _cache(lengths, shared, gpu, cpu, prompt_only)
    mirror_len = np.array([min(c, n) if prompt_only else n for c, n in zip(clamp, lengths, strict=False)],
                          np.int64)
    allowed: set[int] = set()
    scratch = np.zeros(16, np.int64)
    cached = np.zeros(16, np.int64)
    batch = np.zeros(1, np.int64)
    for q in order:
        r = q % len(lengths)
        n_in = lengths[r]
        n_cached = kvc.cached_blocks(kv, 0, r, n_in, cached)
        start = n_cached * BS
        if start >= n_in:
            continue
        if not kvc.allocate(kv, 0, r, start, n_in, True, n_in, cached, n_cached, scratch):
            kvc.release(kv, 0, r)
            _check(kv, allowed)
            continue
        batch[0] = r
        # the blocks the mirror may offer: the first ``clamp // BS`` of the request's list
        # (not always its prompt's chain: a reload can take over a block of the caller's own
        # cached prefix before it is committed, as the reference's does, KVO-5.2)
        off, count = kv.req[r, 0], kv.req[r, 1]
        listed = kv.pool[off:off + min(count, int(mirror_len[r]) // BS)]
        allowed |= {int(_block_hash(kv, 0, b)) for b in listed}
        _mirror(kv, 0, batch, 1, mirror_len)
        _check(kv, allowed)
        kvc.release(kv, 0, r)
        _check(kv, allowed)


def test_a_prefix_evicted_from_the_gpu_comes_back_from_the_cpu_tier_for_free():
    """KVO-5.2: request 1 shares request 0's 4-block prefix; request 0's blocks were taken
    over on the GPU, so request 1's allocation reloads the prefix from the CPU tier into free
    GPU blocks and counts them as GPU hits, with no transfer time charged (KVO-D1)."""
    kv = _cache([4 * BS, 4 * BS, 8 * BS], shared=4, gpu=8, cpu=8, prompt_only=True)
    scratch, cached = np.zeros(16, np.int64), np.zeros(16, np.int64)
    lens = np.array([4 * BS, 4 * BS, 8 * BS], np.int64)
    assert kvc.allocate(kv, 0, 0, 0, 4 * BS, True, 4 * BS, cached, 0, scratch)
    _mirror(kv, 0, np.array([0], np.int64), 1, lens)
    kvc.release(kv, 0, 0)
    assert kv.cpu_meta[0, CpuMeta.USED] == 4
    # request 2 (its own 8 blocks) takes every GPU block, the prefix's too
    assert kvc.allocate(kv, 0, 2, 0, 8 * BS, True, 8 * BS, cached, 0, scratch)
    kvc.release(kv, 0, 2)
    assert kvc.cached_blocks(kv, 0, 1, 4 * BS, cached) == 0
    hits = kv.meta[0, kvc.KVMeta.HITS]
    assert kvc.allocate(kv, 0, 1, 0, 4 * BS, True, 4 * BS, cached, 0, scratch)
    assert kv.meta[0, kvc.KVMeta.HITS] - hits == 4
    assert kv.cpu_meta[0, CpuMeta.HITS] == 4 and kv.cpu_meta[0, CpuMeta.PENDING] == 0
    assert _pending(kv, 0) == 0
    refs = [int(kv.blk[0, b, BlockField.REF]) for b in range(8)]
    assert sorted(refs) == [0] * 4 + [1] * 4


# ------------------------------------------------------------------ runs


def _offload(path: Path, cpu_blocks: int, prompt_only: bool = True) -> str:
    path.write_text(f"kv_offload:\n  cpu_bytes_to_use: {cpu_blocks * BLOCK_BYTES}\n"
                    f"  offload_prompt_only: {'true' if prompt_only else 'false'}\n")
    return str(path)


def _run(spec: str, gpu: int, offload: str | None):
    extra = {} if offload is None else {"kv_offload_config": offload}
    # roofline: the chain's block size in bytes comes from the model's config.json (KVO-3.1)
    return blis_fast.run(model=MODEL, latency_model="roofline", workload_spec=spec,
                         total_kv_blocks=gpu, log="error", **extra)


DRAWS = dict(seed=st.integers(0, 10_000), groups=st.integers(2, 4),
             prefix=st.sampled_from([128, 256]), cpu=st.integers(1, 300),
             rate=st.floats(2.0, 30.0))


@settings(max_examples=6, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(**DRAWS)
def test_while_the_gpu_never_evicts_the_chain_changes_nothing(tmp_path, seed, groups, prefix,
                                                              cpu, rate):
    """With room for every block, no block leaves the GPU, so the CPU tier never serves one:
    the run prints exactly what the run without ``--kv-offload-config`` prints."""
    spec = _spec(tmp_path / "wl.yaml", groups, prefix, rate, seed)
    offload = _offload(tmp_path / "off.yaml", cpu)
    assert _run(spec, 100_000, offload).stdout == _run(spec, 100_000, None).stdout


def _run_accounted(spec: str, gpu: int, offload: str):
    """One chain run, checked: it repeats exactly and every one of its 40 requests ends."""
    a = _run(spec, gpu, offload)
    assert _run(spec, gpu, offload).stdout == a.stdout
    s = a.summary
    assert s["still_queued"] == 0 and s["still_running"] == 0
    assert (s["completed_requests"] + s["dropped_unservable"] + s["timed_out_requests"]
            == s["injected_requests"] == 40)
    return a


@settings(max_examples=6, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(gpu=st.integers(60, 160), prompt_only=st.booleans(), **DRAWS)
def test_cpu_only_chain_runs_account_for_every_request(tmp_path, seed, groups, prefix, cpu,
                                                       rate, gpu, prompt_only):
    """Random CPU-only chain runs under GPU pressure: every request ends, the run repeats
    exactly, and KV Thrashing Rate is 0 (no promotions without a secondary tier, KVO-10.2)."""
    spec = _spec(tmp_path / "wl.yaml", groups, prefix, rate, seed)
    offload = _offload(tmp_path / "off.yaml", cpu, prompt_only)
    a = _run_accounted(spec, gpu, offload)
    assert "KV Thrashing Rate: 0.0000" in a.stdout or "KV Thrashing Rate" not in a.stdout


DEVICES = ("nvme_gen4", "sata_ssd", "nvme_gen3")


def _tiered(path: Path, cpu_blocks: int, n_tiers: int) -> str:
    tiers = "".join(f"    - {{type: fs, root_dir: /mnt/t{t}, direct_io: true, "
                    f"device_class: {DEVICES[t]}}}\n" for t in range(n_tiers))
    path.write_text(f"kv_offload:\n  cpu_bytes_to_use: {cpu_blocks * BLOCK_BYTES}\n"
                    f"  secondary_tiers:\n{tiers}")
    return str(path)


@settings(max_examples=5, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(gpu=st.integers(60, 160), n_tiers=st.integers(1, 3), **DRAWS)
def test_secondary_tier_transfers_add_up(tmp_path, seed, groups, prefix, cpu, rate, gpu,
                                         n_tiers):
    """Random chain runs with 1-3 secondary tiers (KVO-4.4, 5.4, 7): every request ends and
    the run repeats exactly; every tier write is one block and follows a new CPU store, so no
    tier starts more writes than the CPU tier stored blocks; every read is a granted promotion
    of whole blocks; the thrashing rate is refused over attempted promotions (KVO-10.2)."""
    spec = _spec(tmp_path / "wl.yaml", groups, prefix, rate, seed)
    offload = _tiered(tmp_path / "off.yaml", cpu, n_tiers)
    a = _run_accounted(spec, gpu, offload)
    f = a.simulation.kv_offload
    assert f.tier_writes.shape == (1, n_tiers)
    assert (f.tier_bytes_written == f.tier_writes * BLOCK_BYTES).all()
    assert (f.tier_writes <= f.cpu_mirrors[:, None]).all()
    assert (f.tier_bytes_read % BLOCK_BYTES == 0).all()
    assert (f.tier_bytes_read >= f.tier_reads * BLOCK_BYTES).all()
    assert (f.tier_reads.sum(axis=1) <= f.promotions_fired).all()
    assert (f.tier_queue_wait_us >= 0).all()
    attempts = int(f.promotions_fired.sum() + f.promotions_failed.sum())
    rate_text = a.stdout.split("KV Thrashing Rate: ")
    if attempts and len(rate_text) > 1:
        printed = float(rate_text[1].split()[0])
        assert abs(printed - int(f.promotions_failed.sum()) / attempts) <= 5e-5


def _hit_rate(stdout: str) -> float:
    return float(stdout.split("Cache Hit Rate: ")[1].split()[0])


def test_prefixes_the_gpu_lost_come_back_as_hits(tmp_path):
    """Three 256-token prefix groups on an 80-block GPU: with a 200-block CPU tier the
    prefixes the GPU evicted are reloaded at admission (KVO-5.2) and count as GPU hits
    (KVO-5.5), so the hit rate rises above the GPU-only run's."""
    spec = _spec(tmp_path / "wl.yaml", 3, 256, 20.0, 5)
    chain = _run(spec, 80, _offload(tmp_path / "off.yaml", 200)).stdout
    assert _hit_rate(chain) > _hit_rate(_run(spec, 80, None).stdout)
    assert "KV Thrashing Rate: 0.0000" in chain


def test_the_zero_cost_reload_is_warned_once(tmp_path):
    """KVO-D1 is reproduced and said once on stderr; a secondary tier is announced as not
    simulated yet."""
    off = _offload(tmp_path / "off.yaml", 50)
    res = invoke(["run", "--model", MODEL, "--num-requests", "5", "--kv-offload-config", off])
    assert res.code == 0
    assert res.stderr.count("CPU->GPU reloads cost no time") == 1
    assert "no capacity, no eviction" not in res.stderr
    (tmp_path / "tier.yaml").write_text(
        f"kv_offload:\n  cpu_bytes_to_use: {50 * BLOCK_BYTES}\n  secondary_tiers:\n"
        "    - {type: fs, root_dir: /mnt/kv, direct_io: true, device_class: nvme_gen4}\n")
    res = invoke(["run", "--model", MODEL, "--num-requests", "5", "--kv-offload-config",
                  str(tmp_path / "tier.yaml")])
    assert res.code == 0 and res.stderr.count("no capacity, no eviction") == 1


def test_pd_runs_refuse_the_chain(tmp_path):
    """The P/D kernels run no CPU tier (as --kv-cpu-blocks): refused in one line, exit 2,
    no output file."""
    off = _offload(tmp_path / "off.yaml", 50)
    out = tmp_path / "m.json"
    res = invoke(["run", "--model", MODEL, "--num-requests", "5", "--num-instances", "2",
                  "--prefill-instances", "1", "--decode-instances", "1",
                  "--kv-offload-config", off, "--metrics-path", str(out), "--log", "error"])
    assert res.code == 2 and res.stdout == "" and not out.exists()
    assert res.stderr.strip().splitlines()[-1] == (
        "blis: error: --kv-offload-config is not supported yet with P/D disaggregation")


def test_a_request_admitted_as_running_keeps_its_ended_deferral(tmp_path):
    """Deferral episodes outlive a request's running spell (KVO-7.4): a resolved request whose
    failed allocation left GPU blocks committed is next admitted as a running one, keeps its
    ended episode, and after a later preemption comes back without being deferred again. Under
    heavy preemption (146 preemptions, 47 promotions) every request's scheduling delay, TTFT
    and E2E equal the August reference's (blis@f90a1e3a; the differential tool's o4-139
    configuration shrunk); forgetting the episode once the request ran admitted request_6
    1 s early and request_5 0.45 s late."""
    (tmp_path / "wl.yaml").write_text(
        "version: '2'\nseed: 129\nnum_requests: 11\naggregate_rate: 25.7\nclients:\n"
        "- id: c2\n  rate_fraction: 0.51\n  arrival: {process: gamma, cv: 1.31}\n"
        "  input_distribution:\n    type: gaussian\n"
        "    params: {mean: 950, std_dev: 232, min: 237, max: 1900}\n"
        "  output_distribution: {type: constant, params: {value: 87}}\n")
    (tmp_path / "off.yaml").write_text(
        "kv_offload:\n  cpu_bytes_to_use: 754974721\n  offload_prompt_only: true\n"
        "  secondary_tiers:\n"
        "  - {type: fs, root_dir: /mnt/kv, direct_io: true, device_class: sata_ssd}\n")
    out = tmp_path / "m.json"
    res = invoke(["run", "--model", "mistralai/mistral-nemo-instruct-2407", "--latency-model",
                  "roofline", "--hardware", "H100", "--tp", "1",
                  "--snapshot-refresh-interval", "100000", "--total-kv-blocks", "185",
                  "--long-prefill-token-threshold", "64",
                  "--workload-spec", str(tmp_path / "wl.yaml"),
                  "--kv-offload-config", str(tmp_path / "off.yaml"), "--metrics-path", str(out)])
    assert res.code == 0, res.stderr
    got = json.loads(out.read_text())
    reference = {  # request: (scheduling delay, TTFT, E2E) in ms
        "request_3": (499.445, 720.852, 1205.966), "request_4": (370.778, 602.677, 1087.671),
        "request_5": (1647.581, 1767.206, 2216.901), "request_6": (2023.979, 2076.227, 2522.977),
        "request_7": (1459.131, 1526.765, 1976.22), "request_8": (930.741, 1014.125, 1521.138),
        "request_9": (927.699, 1016.316, 1523.292),
        "request_10": (2059.392, 2142.09, 2586.588)}
    rows = {r["requestID"]: r for r in got["requests"]}
    for rid, (delay, ttft, e2e) in reference.items():
        r = rows[rid]
        assert (r["scheduling_delay_ms"], r["ttft_ms"], r["e2e_ms"]) == pytest.approx(
            (delay, ttft, e2e), rel=1e-9), rid
    assert got["preemption_count"] == 146
    assert got["cache_hit_rate"] == pytest.approx(0.4486260454002389, rel=1e-9)
