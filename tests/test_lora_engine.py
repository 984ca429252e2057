"""LoRA multi-adapter serving in the engine (spec lora.md, LORA-3..LORA-8; issue 31).

* the worked timeline LORA-4.10 (figures of the August reference, in the spec);
* hypothesis invariants on random replayed traces: an instance never holds more adapters than
  its capacity; an adapter pinned by a running request is never evicted; every load completes
  before a request of its adapter runs; loads and evictions agree with the counts reported;
* with LoRA inert, or active but named by no request, the outputs are those of a run without
  LoRA;
* the reference's stall (LORA-D1): reproduced with a warning when a deadline ends it, one
  clear error where nothing could.

Runs replay small hand-made traces (trace v2 with an ``adapter`` column), so every request's
arrival, lengths, deadline and adapter are exact.
"""

from __future__ import annotations

import contextlib
import io
import logging
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blis_fast.errors import BlisConfigError
from blis_fast.kernels.engine.lora import LoraEvent, LoraLog
from blis_fast.kernels.enums import RequestState
from blis_fast.options import build_options
from blis_fast.runner import execute_replay

MODEL = "meta-llama/llama-3.1-8b-instruct"
HEADER = ("trace_version: 2\ntime_unit: microseconds\nmode: generated\nwarm_up_requests: 0\n"
          "workload_seed: 1\n")
COLUMNS = ("request_id,client_id,tenant_id,slo_class,session_id,round_index,prefix_group,"
           "prefix_length,streaming,input_tokens,output_tokens,text_tokens,image_tokens,"
           "audio_tokens,video_tokens,reason_ratio,model,deadline_us,server_input_tokens,"
           "arrival_time_us,send_time_us,first_chunk_time_us,last_chunk_time_us,num_chunks,"
           "status,error_message,finish_reason,adapter")


def _write_trace(folder: Path, rows: list[tuple[int, int, int, int, str]]) -> tuple[str, str]:
    """A trace v2 of ``(arrival_us, input, output, deadline_us, adapter)`` rows."""
    lines = [COLUMNS]
    for k, (arrival, n_in, n_out, deadline, adapter) in enumerate(rows):
        lines.append(f"{k},c0,,,,0,,0,false,{n_in},{n_out},0,0,0,0,0,,{deadline},0,{arrival},"
                     f"{arrival},0,0,0,ok,,,{adapter}")
    header = folder / "t.yaml"
    data = folder / "t.csv"
    header.write_text(HEADER)
    data.write_text("\n".join(lines) + "\n")
    return str(header), str(data)


def _lora_file(folder: Path, capacity: int | None, ranks: dict[str, int],
               extra: str = "") -> str:
    """A --lora-config file: the capacity (None: not set) and the registry."""
    text = "lora:\n"
    if capacity is not None:
        text += f"  adapter_capacity: {capacity}\n"
    text += extra
    if ranks:
        text += "  adapters:\n" + "".join(f"    - id: {a}\n      rank: {r}\n"
                                          for a, r in ranks.items())
    path = folder / "lora.yaml"
    path.write_text(text)
    return str(path)


def _replay(header: str, data: str, **options):
    opts = dict(model=MODEL, trace_header=header, trace_data=data, latency_model="roofline",
                snapshot_refresh_interval=0, log="error", horizon=100_000_000)
    opts.update(options)
    with contextlib.redirect_stderr(io.StringIO()):
        return execute_replay(build_options(opts))


# ------------------------------------------------------------------ LORA-4.10


def test_worked_timeline_lora_4_10(tmp_path):
    """One rank-32 request at 1 s on a one-slot instance: the step that starts the 1532-µs
    load is empty (1 µs), the completion steps at once and admits it, and every step of its
    batch is 6 % slower (tier 32, k6 0.06); the same request without LoRA for comparison."""
    header, data = _write_trace(tmp_path, [(1_000_000, 100, 4, 0, "a0")])
    lora = _lora_file(tmp_path, 1, {"a0": 32})
    res = _replay(header, data, lora_config=lora).simulation
    assert res.step_time.tolist() == [1_000_000, 1_001_532, 1_004_771, 1_008_001, 1_011_232]
    assert res.step_duration.tolist() == [1, 3239, 3230, 3231, 3231]
    assert res.sched_delay_us.tolist() == [1532]
    assert res.ttft_us.tolist() == [4771]
    assert res.e2e_us.tolist() == [14463]
    assert res.adapter_loads.tolist() == [[1]] and res.adapter_evictions.tolist() == [[0]]
    plain = _replay(header, data).simulation  # the same request, no LoRA
    assert plain.sched_delay_us.tolist() == [0]
    assert plain.ttft_us.tolist() == [3056]
    assert plain.e2e_us.tolist() == [12202]


def test_adapters_block_of_the_timeline(tmp_path):
    """LORA-8.1/8.2: the block after timed_out_requests, TTFT percentiles in µs (ms x 1000)."""
    header, data = _write_trace(tmp_path, [(1_000_000, 100, 4, 0, "a0")])
    out = _replay(header, data, lora_config=_lora_file(tmp_path, 1, {"a0": 32}))
    block = out.summary["adapters"]
    assert list(out.summary)[-1] == "adapters"
    assert block == {"a0": {"load_count": 1, "eviction_count": 0, "ttft_p50_us": 4771.0,
                            "ttft_p99_us": 4771.0,
                            "throughput_tok_per_s": 4 / out.summary["vllm_estimated_duration_s"]}}


# ------------------------------------------------------------------ invariants


@st.composite
def lora_traces(draw):
    """A random trace over a few adapters (one maybe unregistered), its registry and the run's
    options: small KV caches (preemption), FCFS or SJF, timeouts, a finite horizon."""
    n_adapters = draw(st.integers(1, 5))
    names = [f"ad{k}" for k in range(n_adapters)]
    ranks = {a: draw(st.sampled_from([4, 8, 16, 32, 64])) for a in names}
    unregistered = draw(st.booleans())
    registry = {a: r for k, (a, r) in enumerate(ranks.items())
                if not (unregistered and k == n_adapters - 1)}
    if not registry:
        registry = dict(ranks)
    choices = names + [""]
    rows = []
    t = 0
    for _ in range(draw(st.integers(1, 40))):
        t += draw(st.integers(0, 6000))
        deadline = t + draw(st.integers(2_000, 400_000)) if draw(st.booleans()) else 0
        rows.append((t, draw(st.integers(1, 400)), draw(st.integers(1, 60)), deadline,
                     draw(st.sampled_from(choices))))
    options = dict(num_instances=draw(st.integers(1, 3)),
                   total_kv_blocks=draw(st.integers(24, 160)),
                   scheduler=draw(st.sampled_from(["fcfs", "sjf"])),
                   max_num_running_reqs=draw(st.integers(1, 16)),
                   routing_policy=draw(st.sampled_from(["round-robin", "least-loaded",
                                                        "weighted"])),
                   horizon=3_000_000)
    if options["routing_policy"] == "weighted":
        options["routing_scorers"] = draw(st.sampled_from(
            ["lora-affinity:1", "lora-affinity:2,queue-depth:1", "queue-depth:1"]))
    return rows, registry, draw(st.integers(1, 3)), options


def _check_invariants(res, capacity: int) -> None:
    """The invariants of the module docstring, read from the run's adapter log and requests."""
    table = res.table
    names = table.adapter_names
    events = res.adapter_events
    if events is None:  # no request has an adapter: LoRA did not run
        assert table.adapter_idx is None or (table.adapter_idx < 0).all()
        return
    n_inst = res.counters.shape[0]
    loads = np.zeros((n_inst, len(names)), np.int64)
    evictions = np.zeros_like(loads)
    resident: list[set[int]] = [set() for _ in range(n_inst)]
    for _tick, i, a, kind in events.tolist():
        if kind == LoraEvent.LOADED:
            resident[i].add(a)
            loads[i, a] += 1
            assert len(resident[i]) <= capacity  # LORA-3.1
        else:
            assert a in resident[i]
            resident[i].discard(a)
            evictions[i, a] += 1
    assert (loads == res.adapter_loads).all() and (evictions == res.adapter_evictions).all()
    idx = table.adapter_idx
    admitted = res.sched_delay_us >= 0
    admit_at = table.arrival_us + res.sched_delay_us
    end = np.where(res.e2e_us >= 0, table.arrival_us + res.e2e_us, np.iinfo(np.int64).max)
    timed_out = res.timed_out
    end = np.where(timed_out, table.deadline_us, end)
    for r in np.flatnonzero(admitted & (idx >= 0)).tolist():
        i, a = int(res.instance[r]), int(idx[r])
        mine = events[(events[:, LoraLog.INSTANCE] == i) & (events[:, LoraLog.ADAPTER] == a)
                      & (events[:, LoraLog.TICK] <= admit_at[r])]
        # every load completes before a request of its adapter runs (LORA-4.5)
        assert mine.shape[0] > 0 and mine[-1, LoraLog.KIND] == LoraEvent.LOADED, r
        # an adapter pinned by an admitted, unfinished request is never evicted (LORA-3.3/3.4)
        evicted = events[(events[:, LoraLog.INSTANCE] == i) & (events[:, LoraLog.ADAPTER] == a)
                         & (events[:, LoraLog.KIND] == LoraEvent.EVICTED)]
        ticks = evicted[:, LoraLog.TICK]
        assert not ((ticks >= admit_at[r]) & (ticks < end[r])).any(), r


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(case=lora_traces())
def test_lora_invariants(case, tmp_path):
    rows, registry, capacity, options = case
    header, data = _write_trace(tmp_path, rows)
    res = _replay(header, data, lora_config=_lora_file(tmp_path, capacity, registry),
                  **options).simulation
    _check_invariants(res, capacity)
    assert (res.state != RequestState.NEW).all()  # each routed and accounted for


def test_invariants_see_a_thrashing_run(tmp_path):
    """The checks are not vacuous: a one-slot instance alternating two adapters loads and
    evicts many times (every eviction between two requests' runs)."""
    rows = [(k * 20_000, 50, 5, 0, f"ad{k % 2}") for k in range(10)]
    header, data = _write_trace(tmp_path, rows)
    res = _replay(header, data, lora_config=_lora_file(tmp_path, 1, {"ad0": 8, "ad1": 16})
                  ).simulation
    _check_invariants(res, 1)
    assert res.adapter_loads.tolist() == [[5, 5]]
    assert res.adapter_evictions.tolist() == [[5, 4]]


# ------------------------------------------------------------------ inert


def test_inert_or_unused_lora_changes_nothing(tmp_path):
    """LORA-0.3/INV-6: with no adapter on any request, a declared registry with or without a
    capacity gives the stdout of a run without LoRA."""
    header, data = _write_trace(tmp_path, [(k * 3000, 200, 30, 0, "") for k in range(30)])
    base = _replay(header, data, num_instances=2, total_kv_blocks=100).stdout
    for capacity in (None, 2):
        lora = _lora_file(tmp_path, capacity, {"a0": 8, "a1": 32})
        out = _replay(header, data, num_instances=2, total_kv_blocks=100, lora_config=lora,
                      routing_policy="weighted", routing_scorers="queue-depth:1")
        ref = _replay(header, data, num_instances=2, total_kv_blocks=100,
                      routing_policy="weighted", routing_scorers="queue-depth:1")
        assert out.stdout == ref.stdout
        assert out.simulation.adapter_loads is None
    assert "adapters" not in base


def test_inert_lora_reports_adapters_with_zero_counts(tmp_path):
    """LORA-0.3/2.2: adapters declared without a capacity: no gate, no factor, but the ids
    and their TTFTs are reported with zero loads."""
    rows = [(k * 3000, 100, 10, 0, "a0" if k % 2 else "") for k in range(6)]
    header, data = _write_trace(tmp_path, rows)
    out = _replay(header, data, lora_config=_lora_file(tmp_path, None, {"a0": 8}))
    plain = _replay(header, data)
    assert out.simulation.ttft_us.tolist() == plain.simulation.ttft_us.tolist()
    block = out.summary["adapters"]
    assert list(block) == ["a0"] and block["a0"]["load_count"] == 0
    assert block["a0"]["ttft_p50_us"] > 0


# ------------------------------------------------------------------ LORA-D1


STALL_ROWS = [(0, 100, 200, 0, "a0"), (10, 60, 200, 0, "a0"), (20_000, 20, 10, 700_000, "a1"),
              (30_000, 24, 12, 0, "")]


def test_stall_reproduced_with_a_warning(tmp_path, caplog):
    """LORA-4.9: SJF puts a cold request before a preempted one that pins the only slot; the
    instance spins until the cold request's deadline (the reference's figures: 1 timeout,
    3 completions), and the run says so once on stderr."""
    header, data = _write_trace(tmp_path, STALL_ROWS)
    lora = _lora_file(tmp_path, 1, {"a0": 8, "a1": 8})
    with caplog.at_level(logging.WARNING, logger="blis_fast"):
        out = _replay(header, data, lora_config=lora, total_kv_blocks=20, scheduler="sjf",
                      horizon=1_500_000, log="warning")
    assert out.summary["timed_out_requests"] == 1 and out.summary["completed_requests"] == 3
    stalls = [r for r in caplog.records if "LORA-D1" in r.getMessage()]
    assert len(stalls) == 1 and "instance_0" in stalls[0].getMessage()


def test_endless_stall_is_one_clear_error(tmp_path):
    """Without the deadline and the horizon the reference spins forever: the run stops with one
    error naming --lora-adapter-capacity instead."""
    rows = [r[:3] + (0, r[4]) for r in STALL_ROWS]
    header, data = _write_trace(tmp_path, rows)
    lora = _lora_file(tmp_path, 1, {"a0": 8, "a1": 8})
    with pytest.raises(BlisConfigError) as err:
        _replay(header, data, lora_config=lora, total_kv_blocks=20, scheduler="sjf",
                horizon=2**63 - 1)
    message = str(err.value)
    assert message.startswith("--lora-adapter-capacity: the run can never finish")
    assert "\n" not in message


# ------------------------------------------------------------------ outputs


def test_metrics_file_and_parquet_carry_the_adapters(tmp_path):
    """LORA-8.1/8.4: in the metrics file the adapters block follows requests, each request has
    its adapter after model (none for the base model); adapters.parquet holds the blocks as
    rows and requests.parquet an adapter column (null for the base model)."""
    import pyarrow.parquet as pq

    rows = [(k * 4000, 80, 6, 0, ["a0", "a1", ""][k % 3]) for k in range(9)]
    header, data = _write_trace(tmp_path, rows)
    lora = _lora_file(tmp_path, 1, {"a0": 8, "a1": 16})
    out_dir = tmp_path / "out"
    run = _replay(header, data, lora_config=lora, metrics_path=str(tmp_path / "m.json"),
                  output_dir=str(out_dir), num_instances=2)
    text = (tmp_path / "m.json").read_text()
    assert text.index('"requests": [') < text.rindex('"e2e_ms"') < text.index('"adapters": {')
    assert text.count('"adapter": "a0"') == 3 and text.count('"adapter": "a1"') == 3
    table = pq.read_table(out_dir / "adapters.parquet").to_pylist()
    blocks = {(m["instance_id"], a): f for m in [*run.per_instance, run.summary]
              for a, f in m.get("adapters", {}).items()}
    assert {(r["instance_id"], r["adapter"]): {k: r[k] for k in r if k not in (
        "instance_id", "adapter")} for r in table} == blocks
    assert ("cluster", "a0") in blocks and blocks[("cluster", "a0")]["load_count"] >= 1
    requests = pq.read_table(out_dir / "requests.parquet").to_pydict()
    assert sorted(requests["adapter"], key=str) == sorted(["a0", "a1", None] * 3, key=str)


def test_pd_disaggregated_requests_bypass_lora(tmp_path):
    """LORA-2.4/D13: disaggregated sub-requests carry no adapter (no load anywhere, no
    per-instance block), yet the cluster block lists their adapter with zero loads; requests
    the decider keeps local load their adapter as usual."""
    rows = [(k * 4000, 80, 6, 0, ["a0", "a1"][k % 2]) for k in range(8)]
    header, data = _write_trace(tmp_path, rows)
    lora = _lora_file(tmp_path, 1, {"a0": 8, "a1": 16})
    pd = dict(num_instances=4, prefill_instances=2, decode_instances=2, lora_config=lora)
    split = _replay(header, data, pd_decider="always", **pd)
    assert split.simulation.adapter_loads.sum() == 0
    assert all("adapters" not in m for m in split.per_instance)
    block = split.summary["adapters"]
    assert sorted(block) == ["a0", "a1"] and block["a0"]["load_count"] == 0
    assert block["a0"]["ttft_p50_us"] > 0
    local = _replay(header, data, pd_decider="never", **pd)
    assert local.summary["adapters"]["a0"]["load_count"] >= 1
