"""Numbers at the edges (issue 28 item 6): every float a command reads is finite and in a
range that keeps every integer derived from it in range, checked where it is parsed. A value
outside is one line on stderr naming the flag or key, exit 2, no traceback, no file written;
a value inside computes (a transfer that long never becomes the fastest)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from _cli import invoke
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blis_fast.options import RUN_OPTIONS

MODEL = "meta-llama/llama-3.1-8b-instruct"
BB = ["--alpha-coeffs", "100,1,100", "--beta-coeffs", "1000,10,5"]  # blackbox: no model config
RUN = ["run", "--model", MODEL, "--log", "error", "--num-requests", "3"]
PD = ["--prefill-instances", "1", "--decode-instances", "1", "--num-instances", "2"]


def refused(args: list[str], folder: Path, names: str | tuple[str, ...]) -> str:
    """``blis args`` in ``folder``: exit 2, one stderr line naming every one of ``names``,
    no traceback, nothing written in ``folder``."""
    before = sorted(os.listdir(folder))
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        res = invoke(args)
    finally:
        os.chdir(cwd)
    assert res.code == 2, res
    assert "Traceback" not in res.stderr and res.stderr.count("\n") == 1, res.stderr
    for name in (names,) if isinstance(names, str) else names:
        assert name in res.stderr, res.stderr
    assert sorted(os.listdir(folder)) == before, "a file was written"
    return res.stderr


@pytest.mark.parametrize(("args", "name"), [
    ([*PD, "--pd-transfer-bandwidth", "1e-300"], "--pd-transfer-bandwidth"),
    ([*PD, "--pd-transfer-bandwidth", "5e-324"], "--pd-transfer-bandwidth"),
    ([*PD, "--pd-transfer-base-latency", "1e300"], "--pd-transfer-base-latency"),
    (["--gpu-hour-cost", "1e308"], "--gpu-hour-cost"),
    (["--kv-cpu-blocks", "100", "--kv-transfer-bandwidth", "5e-324"], "--kv-transfer-bandwidth"),
], ids=["pd-bw", "pd-bw-denormal", "pd-base", "gpu-hour-cost", "kv-bw-denormal"])
def test_run_flags_whose_durations_or_cost_overflow_are_refused(args, name, tmp_path):
    refused([*RUN, *args, "--results-path", "r.json"], tmp_path, name)


def test_slow_but_representable_pd_transfer_is_slow_not_fastest(tmp_path):
    """Slow transfers in range compute as slow: 0.001 GB/s (1 MB/s) stretches E2E more than
    tenfold, and at 1e-6 GB/s both requests time out waiting for their KV (the reference's
    float-to-int conversion made a transfer beyond int64 the fastest, 1 µs)."""
    def result(bw: str) -> dict:
        path = tmp_path / f"{bw}.json"
        res = invoke([*RUN, *PD, "--pd-decider", "always", "--pd-transfer-bandwidth", bw,
                      "--num-requests", "2", "--results-path", str(path)])
        assert res.code == 0, res.stderr
        return json.loads(path.read_text())

    fast, slow, stuck = result("25"), result("0.001"), result("1e-6")
    assert fast["completed_requests"] == slow["completed_requests"] == 2
    assert slow["e2e_mean_ms"] > 10 * fast["e2e_mean_ms"]
    assert stuck["completed_requests"] == 0 and stuck["timed_out_requests"] == 2


def test_node_pool_price_and_memory_are_bounded(tmp_path):
    pool = ("node_pools:\n  - name: a\n    gpu_type: H100\n    gpus_per_node: 1\n"
            "    gpu_memory_gib: {mem}\n    initial_nodes: 1\n    max_nodes: 1\n"
            "    gpu_hour_cost: {cost}\n")
    (tmp_path / "cost.yaml").write_text(pool.format(mem=80, cost="1e308"))
    refused([*RUN, "--policy-config", "cost.yaml"], tmp_path, "gpu_hour_cost")
    (tmp_path / "mem.yaml").write_text(pool.format(mem=60000, cost=1))
    refused([*RUN, "--policy-config", "mem.yaml"], tmp_path, "gpu_memory_gib")


def test_pd_pool_kv_blocks_are_in_the_memory_estimate(tmp_path, monkeypatch):
    """--prefill-tp sizes the prefill pool's KV cache: it counts in the up-front estimate."""
    import blis_fast.runner as runner

    monkeypatch.setattr(runner, "available_memory", lambda: 2 << 30)
    refused([*RUN, *PD, "--prefill-tp", "32"], tmp_path, "--prefill-tp")


def test_fit_seed_below_zero_is_refused(tmp_path):
    refused(["fit", "--model", MODEL, "--trace-header", "h.yaml", "--trace-data", "d.csv",
             "--seed", "-1"], tmp_path, "--seed")


@pytest.fixture
def sweep_dir(tmp_path) -> Path:
    import polars as pl

    (tmp_path / "summary").mkdir()
    pl.DataFrame({"config_id": ["a", "b"], "rate": [1.0, 2.0], "ttft_p99_ms": [3.0, 4.0],
                  "error": [None, None]}).write_parquet(tmp_path / "summary" / "p.parquet")
    return tmp_path


@pytest.mark.parametrize(("args", "name"), [
    (["--width", "inf"], "--width"),
    (["--height", "nan"], "--height"),
    (["--dpi", "1"], "--dpi"),
    (["--width", "300", "--height", "300"], "pixels"),
    (["-o", "p.xyz"], "--output"),
], ids=["width-inf", "height-nan", "dpi-1", "300x300in", "unknown-format"])
def test_plot_figures_out_of_range_are_refused(args, name, sweep_dir):
    out = [] if "-o" in args else ["-o", "p.png"]
    refused(["plot", ".", "--x", "rate", "--y", "ttft_p99_ms", *args, *out], sweep_dir, name)


def test_plot_scaling_window_that_makes_too_many_bins_is_refused(tmp_path):
    import polars as pl

    pl.DataFrame({"time_us": [0, 5_000_000], "routable_after": [1, 2]}).write_parquet(
        tmp_path / "scaling.parquet")
    pl.DataFrame({"arrival_us": [1_000_000]}).write_parquet(tmp_path / "requests.parquet")
    refused(["plot", ".", "--scaling", "--window", "1e-300", "-o", "p.png"], tmp_path,
            "--window")


EXTREMES = [0.0, -1.0, 5e-324, 1e-300, 1e300, 1e308, float("inf"), float("-inf"), float("nan")]
FLOAT_FLAGS = sorted(f"--{spec.flag}" for spec in RUN_OPTIONS if spec.kind == "float")
"""Every float flag of ``blis run`` (the option rows), so a new one is covered too."""
CONTEXT = {"--pd": PD, "--kv-": ["--kv-cpu-blocks", "50"],
           "--token-bucket": ["--admission-policy", "token-bucket"]}
"""The flags that make a flag count (a P/D topology, a CPU tier, the token bucket)."""


def _context(flag: str) -> list[str]:
    ctx = next((v for k, v in CONTEXT.items() if flag.startswith(k)), [])
    return ctx + ([] if flag.startswith("--pd") else BB)  # P/D sizes transfers from the model


@settings(max_examples=80, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flag=st.sampled_from(FLOAT_FLAGS),
       value=st.one_of(st.sampled_from(EXTREMES), st.floats(), st.floats(-1e-300, 1e-300)))
def test_extreme_floats_end_in_a_result_or_one_line(flag, value, tmp_path):
    """Any float (0, denormals, 1e+-300, infinities, NaN, negatives) given to a float flag of
    ``blis run`` ends in a result or in one line naming the flag, in bounded time."""
    start = time.monotonic()
    res = invoke([*RUN, "--num-requests", "2", *_context(flag), flag, repr(value)])
    assert time.monotonic() - start < 30
    assert "Traceback" not in res.stderr, res.stderr
    if res.code != 0:
        assert res.code == 2 and res.stderr.count("\n") == 1 and flag in res.stderr, res.stderr


@pytest.mark.parametrize("column", [9, 10], ids=["input_tokens", "output_tokens"])
def test_trace_row_of_int64_max_tokens_is_refused_before_drawing(column, tmp_path):
    """A row of 2^63-1 tokens once wrapped the token-id array's size to a negative number."""
    res = invoke([*RUN, *BB, "--trace-output", str(tmp_path / "src")])
    assert res.code == 0, res.stderr
    rows = (tmp_path / "src.csv").read_text().splitlines()
    fields = rows[1].split(",")
    fields[column] = str((1 << 63) - 1)
    rows[1] = ",".join(fields)
    (tmp_path / "src.csv").write_text("\n".join(rows) + "\n")
    refused(["replay", "--model", MODEL, "--log", "error", *BB, "--trace-header", "src.yaml",
             "--trace-data", "src.csv"], tmp_path, "--trace-data")


SPEC = """\
version: "2"
seed: 42
aggregate_rate: 10.0
num_requests: 5
clients:
  - id: "c1"
    rate_fraction: 1.0
    arrival: {process: poisson}
    input_distribution: {type: constant, params: {value: 100}}
    output_distribution: {type: exponential, params: {mean: MEAN}}
"""


@pytest.mark.parametrize("mean", ["9.2e18", "1e300", "16777217"])
def test_workload_spec_length_beyond_2_pow_24_tokens_is_refused(mean, tmp_path):
    """An exponential mean just under 2^63 once ended in numba's 'array is too big'
    traceback, and 1e300 drew 1-token outputs (float-to-int overflow)."""
    (tmp_path / "w.yaml").write_text(SPEC.replace("MEAN", mean))
    line = refused([*RUN, *BB, "--workload-spec", "w.yaml"], tmp_path,
                   ("output_distribution.params.mean", "w.yaml"))
    assert "2^24" in line


def test_distribution_flags_beyond_2_pow_24_tokens_name_the_flag(tmp_path):
    refused([*RUN, *BB, "--prompt-tokens", "20000000", "--prompt-tokens-max", "30000000"],
            tmp_path, "--prompt-tokens")
    res = invoke([*RUN, *BB, "--prompt-tokens-max", str((1 << 63) - 1)])  # a bound only caps
    assert res.code == 0, res.stderr


def test_block_size_is_bounded_where_it_is_parsed(tmp_path):
    # int64-max tokens per block used to hang the run (the block arithmetic overflowed)
    res = invoke(["run", "--model", "meta-llama/llama-3.1-8b-instruct", "--num-requests", "5",
                  "--block-size-in-tokens", "9223372036854775807",
                  "--metrics-path", str(tmp_path / "m.json")])
    assert res.code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "--block-size-in-tokens" in lines[0] and "2^24" in lines[0]
    assert "Traceback" not in res.stderr and not (tmp_path / "m.json").exists()
