"""The once-per-run warnings about misleading reference behaviour in P/D runs (issue 14 item 2,
README "known reference behaviour"): each appears exactly once where the behaviour occurs and
not in a neighbouring configuration where it does not."""

from __future__ import annotations

import logging

import pytest

import blis_fast

BASE = {"model": "meta-llama/llama-3.1-8b-instruct", "num_instances": 2,
        "prefill_instances": 1, "decode_instances": 1, "pd_decider": "always",
        "num_requests": 40, "rate": 10.0}
NO_POOLS = {"model": BASE["model"], "num_instances": 2, "num_requests": 40, "rate": 10.0}
KV_DROPS = {**BASE, "num_instances": 4, "prefill_instances": 3, "rate": 40.0,
            "num_requests": 150, "total_kv_blocks": 900}

CASES = [
    # (id, fragment, triggering options, neighbouring options)
    ("D1-shared-round-robin", "share one round-robin counter",
     {**BASE, "num_instances": 4, "prefill_instances": 2, "decode_instances": 2},
     {**BASE, "num_instances": 4, "prefill_instances": 1, "decode_instances": 3}),
    ("D2-projected-as-completed", "as if completed", KV_DROPS,
     {**KV_DROPS, "total_kv_blocks": 20000}),
    ("D3-dropped-at-decode-kv", '"Dropped at Decode KV" in the P/D block is always 0', KV_DROPS,
     {**KV_DROPS, "total_kv_blocks": 20000}),
    ("D4-scheduling-delay", "covers only the wait before prefill", BASE,
     {**BASE, "pd_decider": "never"}),
    ("D5-trace-output", "--trace-output writes the 40 disaggregated requests", "TRACE", BASE),
    ("D6-past-deadline", "after their deadline",
     {**BASE, "timeout": 1, "pd_transfer_bandwidth": 0.005}, {**BASE, "timeout": 1}),
    ("D7-transfer-at-step-start", "report a TTFT shorter than their own prefill", BASE,
     {**BASE, "pd_transfer_bandwidth": 2.0, "pd_transfer_base_latency": 1.5}),
    ("D8-pool-hardware", "--decode-hardware L40S changes the decode pool's KV capacity",
     {**BASE, "decode_hardware": "L40S"}, BASE),
    ("D10-pool-backend", "--decode-latency-model roofline times the decode pool with the "
     "coefficients resolved for --latency-model trained-physics",
     {**BASE, "latency_model": "trained-physics", "decode_latency_model": "roofline"},
     {**BASE, "latency_model": "trained-physics", "decode_latency_model": "trained-physics"}),
    ("D11-pool-scorers-without-pools", "--decode-routing-scorers has no effect without P/D pools",
     {**NO_POOLS, "decode_routing_scorers": "queue-depth:1"},
     {**BASE, "decode_routing_scorers": "queue-depth:1"}),
]


def _warnings(opts: dict, caplog, tmp_path) -> list[str]:
    if opts == "TRACE":
        opts = {**BASE, "trace_output": str(tmp_path / "trace")}
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="blis_fast"):
        blis_fast.run(**opts)
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize(("fragment", "trigger", "neighbour"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_warning_once_where_it_happens(fragment, trigger, neighbour, caplog, tmp_path):
    hits = [m for m in _warnings(trigger, caplog, tmp_path) if fragment in m]
    assert len(hits) == 1, hits
    assert not [m for m in _warnings(neighbour, caplog, tmp_path) if fragment in m]


def test_the_counts_in_the_warnings_are_the_runs(caplog, tmp_path):
    res = blis_fast.run(**KV_DROPS, log="error")
    from blis_fast.kernels.cluster.pd import PDCounter

    dropped = int(res.simulation.pd.counters[PDCounter.DROPPED_AT_DECODE_KV])
    assert dropped > 0 and res.summary["dropped_unservable"] >= dropped
    text = " ".join(_warnings(KV_DROPS, caplog, tmp_path))
    assert f"the {dropped} requests dropped for lack of KV" in text
