"""``blis saturate``: the rate found by bisection meets the SLO, and a rate one tolerance above
it does not (checked by running ``blis_fast.run`` at both rates)."""

from __future__ import annotations

import polars as pl
import pytest
from _sweep import MODEL, invoke, write_spec

import blis_fast
from blis_fast.errors import BlisConfigError
from blis_fast.sweep.saturate import find_saturation, parse_slo

SPEC = f"""\
base:
  model: {MODEL}
  num_instances: 2
  num_requests: 300
grid:
  max_num_running_reqs: [32, 256]
"""
BASE = {"model": MODEL, "num_instances": 2, "num_requests": 300, "log": "error"}


def _ttft_p99(rate: float, mnr: int) -> float:
    return blis_fast.run(**BASE, rate=rate, max_num_running_reqs=mnr).summary["ttft_p99_ms"]


def test_bisection_finds_the_highest_rate_meeting_the_slo(tmp_path):
    spec = write_spec(tmp_path, SPEC)
    out = tmp_path / "sat.parquet"
    run = invoke(["saturate", str(spec), "--slo", "ttft_p99_ms<=200", "--low", "1",
                  "--high", "80", "--tolerance", "1", "--workers", "1", "--out", str(out)])
    assert run.code == 0, run.stderr
    assert run.stdout.startswith("SLO: ttft_p99_ms<=200\n") and "max_rate_per_sec" in run.stdout
    table = pl.read_parquet(out).sort("config_id")
    assert table["max_num_running_reqs"].to_list() == [32, 256]
    bounded, unbounded = table.row(0, named=True), table.row(1, named=True)
    # mnr 32 saturates inside the bracket: SLO holds at max_rate, fails just above
    low, high = bounded["max_rate_per_sec"], bounded["min_failing_rate_per_sec"]
    assert 1 < low < high <= low + 1 < 80
    assert _ttft_p99(low, 32) == bounded["ttft_p99_ms"] <= 200
    assert _ttft_p99(high, 32) > 200
    # bisection from [1, 80] to a bracket of width <= 1: the two ends, then 7 halvings
    assert bounded["runs"] == 2 + 7
    # mnr 256 still meets the SLO at the upper bound
    assert unbounded["max_rate_per_sec"] == 80.0 and unbounded["min_failing_rate_per_sec"] is None
    assert unbounded["runs"] == 2 and _ttft_p99(80, 256) == unbounded["ttft_p99_ms"] <= 200
    assert table["error"].null_count() == 2 and set(table["slo"]) == {"ttft_p99_ms<=200"}


def test_slo_failing_at_the_lower_bound_gives_no_rate(tmp_path):
    spec = write_spec(tmp_path, SPEC)
    table = pl.from_arrow(find_saturation(spec, [parse_slo("ttft_p99_ms<1"),
                                                 parse_slo("responses_per_sec>0")],
                                          1.0, 50.0, 2.0, workers=1))
    assert table["max_rate_per_sec"].to_list() == [None, None]
    assert table["min_failing_rate_per_sec"].to_list() == [1.0, 1.0]
    assert table["runs"].to_list() == [1, 1]
    assert table["ttft_p99_ms"].to_list() == [None, None]
    assert table["slo"][0] == "ttft_p99_ms<1 and responses_per_sec>0"


def test_slo_parsing():
    slo = parse_slo(" e2e_p99_ms >= 1.5e3 ")
    assert (slo.metric, slo.op, slo.bound) == ("e2e_p99_ms", ">=", 1500.0)
    assert slo.holds({"e2e_p99_ms": 1500.0}) and not slo.holds({"e2e_p99_ms": 1499.9})
    assert str(parse_slo("ttft_p99_ms<500")) == "ttft_p99_ms<500"
    for bad in ("ttft<=5", "ttft_p99_ms <= five", "ttft_p99_ms == 5", ""):
        with pytest.raises(BlisConfigError, match="--slo"):
            parse_slo(bad)
