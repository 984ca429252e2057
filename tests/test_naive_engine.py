"""blis_fast's engine against the plain-Python vLLM instance of ``naive.py`` (issue 11 item 5).

Hypothesis draws a request list (arrivals with bursts, input and output lengths, prefix groups
so that prefix hits happen, some deadlines) and a configuration (small KV pools so that
preemption happens, small token budgets, chunked prefill on or off, an optional max-model-len
and horizon, blackbox coefficients). blis_fast replays exactly those requests from a trace v2
(``blis replay``: arrivals, lengths and prefix groups come from the CSV; token ids are drawn
from the seed, and the twin is given the same ids by its own transcription of the reference's
draw, ``naive.replay_token_ids``). Both must agree exactly on every per-request figure (TTFT,
E2E, mean ITL, the sum and count of ITL samples, scheduling delay, length cap, which requests
have a record), on every number of the metrics JSON and on the cache hit rate.

Ids are drawn from 128000 values, so two requests' own tokens sometimes collide, most often
in a one-token block or in the block a prefix ends inside; the reference then shares the
block (its hash covers the ids only), and so must both sides.
"""

from __future__ import annotations

import contextlib
import csv
import io
import math
import tempfile
from dataclasses import replace
from pathlib import Path

import naive
import pytest
from _policies import policy_names
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from blis_fast.options import build_options
from blis_fast.runner import RunResult, execute_replay

MODEL = "meta-llama/llama-3.1-8b-instruct"
INT64_MAX = (1 << 63) - 1
TRACE_COLUMNS = (
    "request_id", "client_id", "tenant_id", "slo_class", "session_id", "round_index",
    "prefix_group", "prefix_length", "streaming", "input_tokens", "output_tokens",
    "text_tokens", "image_tokens", "audio_tokens", "video_tokens", "reason_ratio", "model",
    "deadline_us", "server_input_tokens", "arrival_time_us", "send_time_us",
    "first_chunk_time_us", "last_chunk_time_us", "num_chunks", "status", "error_message",
    "finish_reason")  # the 27 trace v2 columns (DELTA-60)
SETTINGS = dict(deadline=None, database=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
NAMES = policy_names()


# ------------------------------------------------------------------ the workload, both ways


def write_trace(folder: Path, rows: list[dict]) -> tuple[str, str]:
    """A trace v2 header and data file holding ``rows`` (request_id = row index)."""
    header = folder / "trace.yaml"
    header.write_text("trace_version: 2\ntime_unit: microseconds\nmode: generated\n"
                      "warm_up_requests: 0\n")
    data = folder / "trace.csv"
    with open(data, "w", newline="") as fh:
        out = csv.writer(fh, lineterminator="\n")
        out.writerow(TRACE_COLUMNS)
        for k, row in enumerate(rows):
            group = f"g{row['group']}" if row["group"] >= 0 else ""
            values = dict.fromkeys(TRACE_COLUMNS, "0")
            values.update(request_id=k, client_id="c", tenant_id="", slo_class="",
                          session_id="", prefix_group=group, prefix_length=row["prefix"],
                          streaming="false", input_tokens=row["input"],
                          output_tokens=row["output"], text_tokens=row["input"], model="",
                          deadline_us=row["deadline"], arrival_time_us=row["arrival"],
                          send_time_us=row["arrival"], status="ok", error_message="",
                          finish_reason="")
            out.writerow([values[c] for c in TRACE_COLUMNS])
    return str(header), str(data)


def twin_requests(rows: list[dict], seed: int = 42) -> list[naive.Request]:
    """The same requests for the twin, with the token ids ``blis replay --seed seed`` draws
    for them (``naive.replay_token_ids``): a group's prefix is shared by its members, and two
    requests' own ids collide now and then, as in the reference."""
    ids = naive.replay_token_ids(
        [(f"g{row['group']}" if row["group"] >= 0 else "", row["prefix"], row["input"],
          row["output"]) for row in rows], seed)
    return [naive.Request(id=f"request_{k}", arrival=row["arrival"], input=ids_in,
                          output=ids_out, deadline=row["deadline"],
                          max_output_len=row["output"])
            for k, (row, (ids_in, ids_out)) in enumerate(zip(rows, ids, strict=True))]


def replay(rows: list[dict], cfg: naive.InstanceConfig, seed: int = 42) -> RunResult:
    """blis_fast's ``blis replay`` of ``rows`` with ``cfg`` (through the replay entry point the
    CLI uses; the Python API has no replay keyword)."""
    with tempfile.TemporaryDirectory() as tmp:
        header, data = write_trace(Path(tmp), rows)
        opts = dict(model=MODEL, trace_header=header, trace_data=data, seed=seed,
                    latency_model="blackbox", alpha_coeffs=list(cfg.alpha),
                    beta_coeffs=list(cfg.beta), total_kv_blocks=cfg.total_blocks,
                    block_size_in_tokens=cfg.block_size,
                    max_num_running_reqs=cfg.max_running,
                    max_num_scheduled_tokens=cfg.max_scheduled_tokens,
                    long_prefill_token_threshold=cfg.long_prefill_threshold,
                    max_model_len=cfg.max_model_len, horizon=cfg.horizon,
                    scheduler=cfg.scheduler, priority_policy=cfg.priority_policy, log="error")
        with contextlib.redirect_stderr(io.StringIO()):
            return execute_replay(build_options(opts))


# ------------------------------------------------------------------ comparison


def per_request(res: RunResult) -> dict[str, dict]:
    """blis_fast's per-request records (RunResult.requests), absent figures as None."""
    cols = res.requests

    def num(x: float) -> float | None:
        return None if math.isnan(x) else float(x)

    out = {}
    for k, rid in enumerate(cols.request_id):
        delay = int(cols.scheduling_delay_us[k])
        out[str(rid)] = dict(ttft=num(cols.ttft_us[k]), e2e=num(cols.e2e_us[k]),
                             itl=num(cols.itl_us[k]), delay=None if delay < 0 else delay,
                             capped=bool(cols.length_capped[k]))
    return out


def twin_per_request(t: naive.InstanceResult) -> dict[str, dict]:
    """The twin's figures in the same shape (RequestTTFTs etc. are maps in the reference)."""
    out = {}
    for rid in t.registered:
        done = rid in t.e2e
        out[rid] = dict(ttft=float(t.ttft[rid]) if rid in t.ttft else None,
                        e2e=float(t.e2e[rid]) if done else None,
                        itl=t.itl_mean[rid] if done else None,
                        delay=t.sched_delay.get(rid), capped=rid in t.length_capped)
    return out


def assert_same(rows: list[dict], cfg: naive.InstanceConfig, seed: int = 42) -> naive.InstanceResult:
    """Run both on ``rows`` and compare everything; returns the twin's result."""
    twin = naive.Instance(cfg).run(twin_requests(rows, seed))
    res = replay(rows, cfg, seed)
    got, want = per_request(res), twin_per_request(twin)
    assert sorted(got) == sorted(want), "requests with a per-request record differ"
    for rid in want:
        assert got[rid] == want[rid], (rid, got[rid], want[rid])
    summary = twin.summary()
    blis = dict(res.summary)
    blis.setdefault("kv_allocation_failures", 0)  # omitted from the JSON when 0
    for key, value in summary.items():
        assert blis[key] == value, (key, blis[key], value)
    hit_rate = twin.hits / (twin.hits + twin.misses) if twin.hits + twin.misses else 0.0
    assert float(res.simulation.cache_hit_rate[0]) == hit_rate
    # ITL samples of each completed request's final attempt: their sum and how many
    sim = res.simulation
    for k, rid in enumerate(sim.table.id_strings()):
        if rid in twin.e2e:
            assert (int(sim.itl_sum_us[k]), int(sim.itl_count[k])) == (
                twin.itl_sum[rid], twin.itl_count[rid]), rid
    return twin


# ------------------------------------------------------------------ strategies


@st.composite
def configs(draw) -> naive.InstanceConfig:
    """Small caches and budgets (preemption, chunking, head-of-line blocking), blackbox, every
    scheduler and priority policy the package exposes (the twin must know each one)."""
    bs = draw(st.sampled_from([1, 2, 3, 4, 8]))
    total = draw(st.integers(3, 24))
    coef = st.one_of(st.integers(0, 20).map(float), st.floats(0.0, 20.0))
    alpha = (draw(st.sampled_from([0.0, 10.0, 500.0, 2000.5])), draw(coef) / 4,
             draw(st.sampled_from([0.0, 1.0, 100.0, 37.25])))
    beta = (draw(st.one_of(st.integers(1, 5000).map(float), st.floats(1.0, 5000.0))),
            draw(coef), draw(coef) * 2)
    max_len = draw(st.one_of(st.just(0), st.just(0), st.just(0),
                               st.integers(total * bs // 2, total * bs)))
    horizon = draw(st.one_of(st.just(INT64_MAX), st.just(INT64_MAX), st.integers(1, 200_000)))
    return naive.InstanceConfig(
        block_size=bs, total_blocks=total, max_running=draw(st.integers(1, 6)),
        max_scheduled_tokens=draw(st.one_of(st.integers(1, 64), st.just(2048))),
        long_prefill_threshold=draw(st.one_of(st.just(0), st.integers(1, 24))),
        max_model_len=max_len, alpha=alpha, beta=beta, horizon=horizon,
        scheduler=draw(st.sampled_from(NAMES["scheduler"])),
        priority_policy=draw(st.sampled_from(NAMES["priority"])))


@st.composite
def workloads(draw, cfg: naive.InstanceConfig, max_requests: int = 10) -> list[dict]:
    """Requests that each fit the cache alone (``ceil((input + output) / bs) <= blocks``, else
    the reference livelocks, ENG-4.4), now and then one whose input alone does not (dropped).
    Lengths are drawn against the cache size, so a few requests fill it."""
    room = cfg.total_blocks * cfg.block_size  # tokens of the whole cache
    groups = [draw(st.integers(1, min(3 * cfg.block_size + 1, room // 2)))
              for _ in range(draw(st.integers(0, 2)))]
    spread = draw(st.sampled_from([0, 0, 50, 3000, 40_000]))
    rows = []
    for _ in range(draw(st.integers(1, max_requests))):
        g = draw(st.integers(-1, len(groups) - 1))
        prefix = groups[g] if g >= 0 else 0
        if draw(st.integers(0, 39)) == 0:  # input alone larger than the cache: dropped
            inp = room - prefix + draw(st.integers(1, 2 * cfg.block_size))
            out = draw(st.integers(0, 5))
        else:
            inp = draw(st.integers(0 if prefix else 1, max(1, (room - prefix) // 2)))
            out = draw(st.integers(0, room - prefix - inp))
        arrival = draw(st.integers(0, spread))
        deadline = 0
        if draw(st.integers(0, 4)) == 0:
            deadline = arrival + draw(st.integers(1, 60_000))
        rows.append(dict(group=g, prefix=prefix, input=inp, output=out, arrival=arrival,
                         deadline=deadline))
    return rows


@st.composite
def cases(draw, max_requests: int = 10) -> tuple[naive.InstanceConfig, list[dict]]:
    """A configuration and its requests; now and then the horizon is put on (or next to) the
    time of an event of the unbounded run, where "at the horizon" and "past it" differ."""
    cfg = draw(configs())
    rows = draw(workloads(cfg, max_requests))
    if draw(st.integers(0, 3)) == 0:
        times = naive.Instance(replace(cfg, horizon=INT64_MAX)).run(twin_requests(rows)).event_times
        if times:
            at = draw(st.sampled_from(times)) + draw(st.sampled_from([-1, 0, 0, 1]))
            cfg = replace(cfg, horizon=max(1, at))
    return cfg, rows


# ------------------------------------------------------------------ tests


def _row(arrival, inp, out, group=-1, prefix=0, deadline=0) -> dict:
    return dict(group=group, prefix=prefix, input=inp, output=out, arrival=arrival,
                deadline=deadline)


WORKED = naive.InstanceConfig(block_size=16, total_blocks=1000, alpha=(100.0, 1.0, 100.0),
                              beta=(1000.0, 10.0, 5.0))


def test_worked_example_eng_a() -> None:
    """ENG-A (with DELTA-6): one request, 20 input and 5 output tokens, hand-traced."""
    twin = assert_same([_row(0, 20, 5)], WORKED)
    assert twin.ttft == {"request_0": 1420}
    assert twin.e2e == {"request_0": 1420 + 4 * 1105}
    assert twin.itl_mean == {"request_0": 1105.0}
    assert twin.sim_ended == 5340 and twin.counters["total_output_tokens"] == 5


def test_preemption_restarts_the_tail_request() -> None:
    """Four 4-token blocks, two requests: the later one is preempted when the earlier one's
    decode needs a block (ENG-4.4), re-prefills and gets a later TTFT (DELTA-4/5)."""
    cfg = naive.InstanceConfig(block_size=4, total_blocks=4, alpha=(0.0, 0.0, 0.0),
                               beta=(100.0, 1.0, 1.0))
    twin = assert_same([_row(0, 6, 6), _row(0, 6, 6)], cfg)
    assert twin.counters["preemption_count"] >= 1
    assert twin.preemptions["request_1"] >= 1 and twin.preemptions["request_0"] == 0
    assert twin.ttft["request_1"] > twin.ttft["request_0"]


def test_shared_prefix_hits() -> None:
    """A second request of the same prefix group reuses the first one's full prefix blocks."""
    twin = assert_same([_row(0, 3, 2, group=0, prefix=8), _row(5000, 3, 2, group=0, prefix=8)],
                       naive.InstanceConfig(block_size=4, total_blocks=20,
                                            beta=(100.0, 1.0, 1.0)))
    assert twin.hits == 2


def test_timeout_that_empties_the_batch_keeps_the_pending_step() -> None:
    """DELTA-2: A times out at 1500 while running alone (max one running request); B waits
    for the step already scheduled at 2000 instead of starting one at 1500. DELTA-1: A's
    timeout after it left is dropped without moving the clock (B's own is far later)."""
    cfg = naive.InstanceConfig(block_size=4, total_blocks=100, max_running=1,
                               beta=(1000.0, 0.0, 0.0))
    twin = assert_same([_row(0, 4, 10, deadline=1500), _row(0, 4, 2, deadline=900_000)], cfg)
    assert twin.counters["timed_out_requests"] == 1
    assert twin.sched_delay["request_1"] == 2000 and twin.ttft["request_1"] == 3000
    assert twin.sim_ended == 4000  # B's RequestLeft, not its cancelled timeout


BY_ARRIVAL = [0, 1, 4, 7, 10, 2, 5, 8, 11, 3, 6, 9]  # list order on equal arrivals
BY_ARRIVAL_THEN_ID = [0, 1, 10, 4, 7, 11, 2, 5, 8, 3, 6, 9]  # ids as bytes: 10 before 4
YOUNGEST_FIRST = [0, 3, 6, 9, 11, 2, 5, 8, 1, 10, 4, 7]
SHORTEST_FIRST = [0, 1, 7, 11, 5, 3, 9, 10, 4, 2, 8, 6]
QUEUE_ORDERS = {  # (scheduler, priority policy) -> admission order, worked out by hand
    **{("fcfs", p): BY_ARRIVAL for p in ("constant", "slo-based", "inverted-slo")},
    **{("sjf", p): SHORTEST_FIRST for p in ("constant", "slo-based", "inverted-slo")},
    ("priority-fcfs", "constant"): BY_ARRIVAL_THEN_ID,
    ("priority-fcfs", "slo-based"): BY_ARRIVAL_THEN_ID,  # oldest = highest priority
    ("priority-fcfs", "inverted-slo"): YOUNGEST_FIRST,
    ("reverse-priority", "constant"): BY_ARRIVAL_THEN_ID,
    ("reverse-priority", "slo-based"): YOUNGEST_FIRST,  # lowest priority = youngest
    ("reverse-priority", "inverted-slo"): BY_ARRIVAL_THEN_ID,
}


@pytest.mark.parametrize("priority", NAMES["priority"])
@pytest.mark.parametrize("scheduler", NAMES["scheduler"])
def test_queue_order_of_every_scheduler(scheduler: str, priority: str) -> None:
    """Eleven requests (inputs of 4 or 8 tokens, arrivals 10, 15 or 20) wait behind one
    running request, one admitted at a time: each scheduler orders them by its keys, ties by
    arrival then by id as bytes, re-sorting every step (ENG-4.1). Pairs this file has no
    hand-worked order for are still compared with the twin."""
    rows = [_row(0, 40, 3)] + [_row(10 + 5 * (k % 3), 4 + 4 * (k % 2), 2) for k in range(11)]
    cfg = naive.InstanceConfig(block_size=4, total_blocks=64, max_running=1,
                               beta=(100.0, 1.0, 1.0), scheduler=scheduler,
                               priority_policy=priority)
    twin = assert_same(rows, cfg)
    admitted = {int(rid.split("_")[1]): delay + rows[int(rid.split("_")[1])]["arrival"]
                for rid, delay in twin.sched_delay.items()}
    order = sorted(admitted, key=admitted.get)
    assert order == QUEUE_ORDERS.get((scheduler, priority), order)


# A random draw of the longer-lists test (2026-11-25): with seed 42, requests 7 and 9 draw the
# same id for their first own token, the one that completes the block the 5-token prefix
# leaves open, so request 7 hits request 9's second block (10 hits of 153 lookups, 9 if the
# twin's tokens never collide). Any change to the list moves the draws and the collision away.
COLLIDING_IDS_CASE = (
    naive.InstanceConfig(block_size=3, total_blocks=200, max_running=5,
                         max_scheduled_tokens=24, alpha=(0.0, 2.75, 0.0),
                         beta=(1.0, 0.0, 0.0)),
    [_row(0, i, o, group=0, prefix=5) for i, o in (
        (7, 51), (11, 44), (8, 19), (21, 0), (10, 12), (13, 28), (17, 10), (2, 51), (30, 10),
        (1, 57))])


@settings(max_examples=200, derandomize=True, **SETTINGS)
@given(case=cases())
@example(case=(naive.InstanceConfig(block_size=4, total_blocks=4, beta=(100.0, 1.0, 1.0)),
               [_row(0, 6, 6), _row(0, 6, 6), _row(10, 2, 3, deadline=400)]))
@example(case=COLLIDING_IDS_CASE)
def test_engine_matches_the_twin(case) -> None:
    cfg, rows = case
    assert_same(rows, cfg)


@pytest.mark.slow
@settings(max_examples=300, derandomize=True, **SETTINGS)
@given(case=cases(max_requests=30))
def test_engine_matches_the_twin_longer_lists(case) -> None:
    """Derandomized (a fixed example set) so that CI cannot pass or fail by luck."""
    cfg, rows = case
    assert_same(rows, cfg)


def test_drawn_ids_that_collide_share_the_block_across_the_prefix_end() -> None:
    """A prefix that ends mid-block (5 tokens, 3-token blocks) leaves one own token in the
    request's second block; with seed 48332 the replay draws the same id for it in both
    requests, so the second request finds both of its full input blocks cached: 2 hits, where
    seed 42 (different ids) gives 1. The reference hashes token ids, not who drew them:
    ``sim/kv/cache.go: GetCachedBlocks`` chains ``HashBlock`` over each full block's ids and
    ``AllocateKVBlocks`` counts a hit per cached block it commits (ENG-5.3/5.4), over the ids
    ``sim/workload/replay.go: LoadTraceV2Requests`` draws (WL-9.6, DELTA-63). The twin once
    named tokens symbolically and missed such hits (found as a one-hit difference on the
    10-request list in ``COLLIDING_IDS_CASE``)."""
    cfg = naive.InstanceConfig(block_size=3, total_blocks=20, beta=(100.0, 1.0, 1.0))
    rows = [_row(0, 1, 1, group=0, prefix=5), _row(0, 2, 1, group=0, prefix=5)]
    first, second = twin_requests(rows, seed=48332)
    assert first.input == second.input[:6]  # the drawn ids collide
    assert assert_same(rows, cfg, seed=48332).hits == 2
    first, second = twin_requests(rows, seed=42)
    assert first.input[5] != second.input[5]  # they do not
    assert assert_same(rows, cfg, seed=42).hits == 1
