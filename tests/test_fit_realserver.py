"""Fit against a real vLLM server (CPU build, tiny model): observe two loads, fit on one,
predict the other.

Marker ``realserver_fit`` (``python -m pytest -m realserver_fit``), not in CI's real-server
command: the held-out bound below is not steady yet. Skipped with the reason when vLLM cannot
be installed or started. One server serves both loads.

Measured on the shared 2-core machine (held-out mean-E2E error / E2E MAPE, default's MAPE):
3.9 % / 13.3 % (21.7 %), 9.0 % / 14.5 % (20.4 %); a third observation with the same command
line gave 17.5 % / 19.5 % (31.4 %). Four later runs on a quiet machine: two passed (2.4 % /
8.6 % vs 16.3 %; 3.0 % / 4.7 % vs 6.3 %), one missed the 10 % bound, one had a fitted E2E MAPE
not below the default's (the default roofline model of an H100 happens to be close for this
tiny CPU model). The bounds are kept as the issue states them.
"""

from __future__ import annotations

import time

import pytest

from blis_fast.testing.vllm_server import MODEL_NAME, VllmServer, VllmUnavailable

pytestmark = pytest.mark.realserver_fit

REPLAY_MODEL = "meta-llama/llama-3.1-8b-instruct"
WORKLOAD = dict(num_requests=60, prompt_tokens=64, prompt_tokens_stdev=24, prompt_tokens_min=16,
                prompt_tokens_max=128, output_tokens=24, output_tokens_stdev=8,
                output_tokens_min=8, output_tokens_max=48)


@pytest.fixture(scope="module")
def observed(tmp_path_factory):
    """Traces (header, data, itl) at 2 and 8 requests/s from one vLLM server."""
    from blis_fast.observe.command import ObserveOptions, run_observe

    server = VllmServer()
    try:
        server.start()
    except VllmUnavailable as exc:
        pytest.skip(f"real vLLM server unavailable: {exc}")
    tmp = tmp_path_factory.mktemp("fit-real")
    out = {}
    try:
        for rate in (2.0, 8.0):
            name = f"rate{int(rate)}"
            paths = (str(tmp / f"{name}.yaml"), str(tmp / f"{name}.csv"),
                     str(tmp / f"{name}.itl.csv"))
            opts = ObserveOptions(
                server_url=server.url, model=MODEL_NAME, rate=rate, seed=11, record_itl=True,
                timeout=120, trace_header=paths[0], trace_data=paths[1], itl_output=paths[2],
                given=frozenset({"rate", "seed", "record_itl", "timeout", "itl_output",
                                 *WORKLOAD}), **WORKLOAD,
            )
            t0 = time.perf_counter()
            run_observe(opts)
            print(f"\nobserved {name} in {time.perf_counter() - t0:.1f} s")
            out[name] = paths
    finally:
        server.stop()
    return out


def _figures(metrics: dict) -> str:
    return ", ".join(f"{m} MAPE {v['request_level']['mape'] * 100:.1f}% (mean err "
                     f"{v['workload_level']['mean_percent_error'] * 100:.1f}%)"
                     for m, v in sorted(metrics.items()))


def test_fit_on_one_load_predicts_the_other(observed):
    from blis_fast.calibrate.report import build_report
    from blis_fast.fit.optimize import fit
    from blis_fast.fit.problem import load_fit_trace, pair_trace, sim_results
    from blis_fast.fit.report import build_fit_report
    from blis_fast.options import build_options
    from blis_fast.runner import execute_replay

    train = load_fit_trace(*observed["rate8"], warmup_requests=0)
    held = load_fit_trace(*observed["rate2"], warmup_requests=0)
    base = {"model": REPLAY_MODEL}
    weights = {"ttft": 1.0, "itl": 1.0, "e2e": 1.0}
    result = fit([train], base, weights, max_evaluations=2000, time_limit_s=120, seed=0)
    report, _ = build_fit_report(result, [train], [held], base, weights)
    fitted = report["holdout"][0]["calibration"]["metrics"]
    default_sims = sim_results(execute_replay(build_options(
        dict(base, trace_header=held.header_path, trace_data=held.data_path, log="error"),
        keywords=True)).requests)
    default = build_report(pair_trace(held, default_sims))["metrics"]
    print(f"\nfit: {len(result.losses)} evaluations, {result.seconds:.1f} s, loss "
          f"{result.loss:.4f}, alpha {result.alpha}, beta {result.beta}")
    print(f"fit trace (8 req/s): {_figures(report['traces'][0]['calibration']['metrics'])}")
    print(f"held out (2 req/s), fitted: {_figures(fitted)}")
    print(f"held out (2 req/s), default roofline: {_figures(default)}")
    assert fitted["e2e"]["workload_level"]["mean_percent_error"] <= 0.10
    assert fitted["e2e"]["request_level"]["mape"] < default["e2e"]["request_level"]["mape"]
