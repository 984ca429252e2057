"""Fit against a real vLLM server (CPU build, tiny model): observe two loads, fit on one,
predict the other.

Marker ``realserver`` (CI's real-server command). Skipped with the reason when vLLM cannot be
installed or started. One server serves every observation.

The design keeps the machine's own drift out of the comparison: the two loads are observed in
alternating segments (8, 2, 8, 2 requests/s, after a discarded warm-up segment), the fit uses
both 8 requests/s segments and the held-out figures pool both 2 requests/s segments, so a
background job that slows the server for a while weighs on both loads alike.

A segment whose chunks reached the client in bursts (more than 30 % of the inter-chunk gaps
under 0.2 ms: the API process or the client was starved of CPU and vLLM merged its outputs;
5-20 % under a load average of 5 on this 2-core machine, 96-99 % when the engine had only one
OpenMP thread, whatever the load) is
a measurement of the machine's load, not of the server: it is observed again, up to three
times, and the test is skipped, saying so, when the machine never lets a clean one through.
The same holds for a segment during which other processes kept more than a quarter of a core
busy (``blis_fast.testing.foreign_cpu``: the machine's busy time minus this process's and the
server's): under a load average of ~6 one run here measured a held-out mean-E2E error of
10.7 %, against 5-6 % on a quiet machine.

Finally the server itself must hold still: on a quiet machine one server run measured a median
ITL 19 % higher in one 2 requests/s segment than in the other (2435 against 2047 µs, and
1950-2120 µs at 8 requests/s), which no latency model fitted on one load can follow. When the
two segments of either load differ by more than 10 % in median ITL, the whole round is
observed again (up to three rounds), and the test is skipped, saying so, if none holds still.
"""

from __future__ import annotations

import time

import pytest

from blis_fast.testing.foreign_cpu import ForeignCpu
from blis_fast.testing.vllm_server import MODEL_NAME, VllmServer, VllmUnavailable

BURST_GAP_US = 200
BURST_SHARE = 0.30
FOREIGN_CORES = 0.25
DRIFT_MAX = 0.10
ATTEMPTS = 3

pytestmark = pytest.mark.realserver

REPLAY_MODEL = "meta-llama/llama-3.1-8b-instruct"
WORKLOAD = dict(prompt_tokens=64, prompt_tokens_stdev=24, prompt_tokens_min=16,
                prompt_tokens_max=128, output_tokens=24, output_tokens_stdev=8,
                output_tokens_min=8, output_tokens_max=48)
SEGMENTS = (("warmup", 8.0, 12), ("rate8a", 8.0, 80), ("rate2a", 2.0, 40), ("rate8b", 8.0, 80),
            ("rate2b", 2.0, 40))


@pytest.fixture(scope="module")
def observed(tmp_path_factory):
    """Traces (header, data, itl) of each segment, observed one after another on one server;
    a set whose same-load segments disagree is observed again (module docstring)."""
    server = VllmServer()
    try:
        server.start()
    except VllmUnavailable as exc:
        pytest.skip(f"real vLLM server unavailable: {exc}")
    try:
        for round_index in range(1, ATTEMPTS + 1):
            out = _observe_set(server, tmp_path_factory.mktemp(f"fit-real-{round_index}"))
            drift = max(_drift(out, "rate8a", "rate8b"), _drift(out, "rate2a", "rate2b"))
            print(f"\nround {round_index}: same-load segments differ by {drift * 100:.0f}% in "
                  f"median ITL")
            if drift <= DRIFT_MAX:
                return out
        pytest.skip(f"the server's median ITL moved by {drift * 100:.0f}% between segments of "
                    f"the same load in the last of {ATTEMPTS} rounds (at most "
                    f"{DRIFT_MAX * 100:.0f}% allowed): it did not hold still long enough to "
                    f"compare two loads")
    finally:
        server.stop()


def _observe_set(server: VllmServer, tmp) -> dict[str, tuple[str, str, str]]:
    """One round of the segments; a segment timed on a busy machine is observed again."""
    from blis_fast.observe.command import ObserveOptions, run_observe

    out = {}
    for seed, (name, rate, count) in enumerate(SEGMENTS, start=11):
        paths = (str(tmp / f"{name}.yaml"), str(tmp / f"{name}.csv"),
                 str(tmp / f"{name}.itl.csv"))
        opts = ObserveOptions(
            server_url=server.url, model=MODEL_NAME, rate=rate, seed=seed, record_itl=True,
            timeout=120, trace_header=paths[0], trace_data=paths[1], itl_output=paths[2],
            num_requests=count,
            given=frozenset({"rate", "seed", "record_itl", "timeout", "itl_output",
                             "num_requests", *WORKLOAD}), **WORKLOAD,
        )
        for attempt in range(1, ATTEMPTS + 1):
            t0 = time.perf_counter()
            foreign = ForeignCpu()
            foreign.start()
            run_observe(opts)
            others = foreign.share()
            share = _burst_share(paths[2])
            print(f"\nobserved {name} ({count} requests at {rate:g}/s) in "
                  f"{time.perf_counter() - t0:.1f} s, {share * 100:.0f}% of gaps < "
                  f"{BURST_GAP_US} us, other processes {others:.2f} cores, median ITL "
                  f"{_median_itl(paths[1]):.0f} us (attempt {attempt})")
            if (share <= BURST_SHARE and others <= FOREIGN_CORES) or name == "warmup":
                break
        else:
            pytest.skip(f"segment {name}: {share * 100:.0f}% of the inter-chunk gaps under "
                        f"{BURST_GAP_US} us and other processes busy {others:.2f} cores in "
                        f"the last of {ATTEMPTS} attempts; the machine is too busy to time "
                        f"a server")
        out[name] = paths
    return out


def _median_itl(data_path: str) -> float:
    """Median over the requests of a trace of (last chunk - first chunk) / (outputs - 1)."""
    import csv
    import statistics

    with open(data_path, newline="") as f:
        itls = [(int(r["last_chunk_time_us"]) - int(r["first_chunk_time_us"]))
                / (int(r["output_tokens"]) - 1)
                for r in csv.DictReader(f) if int(r["output_tokens"]) > 1]
    return statistics.median(itls) if itls else 0.0


def _drift(out: dict[str, tuple[str, str, str]], a: str, b: str) -> float:
    """Relative difference of two segments' median ITL (over the smaller)."""
    itl_a, itl_b = _median_itl(out[a][1]), _median_itl(out[b][1])
    return abs(itl_a - itl_b) / max(min(itl_a, itl_b), 1.0)


def _burst_share(itl_path: str) -> float:
    """Share of consecutive-chunk gaps under ``BURST_GAP_US`` in an ITL file."""
    import csv

    stamps: dict[str, list[tuple[int, int]]] = {}
    with open(itl_path, newline="") as f:
        for row in csv.DictReader(f):
            stamps.setdefault(row["request_id"], []).append(
                (int(row["chunk_index"]), int(row["timestamp_us"])))
    gaps = []
    for rows in stamps.values():
        times = [ts for _, ts in sorted(rows)]
        gaps += [b - a for a, b in zip(times[:-1], times[1:], strict=True)]
    return sum(g < BURST_GAP_US for g in gaps) / len(gaps) if gaps else 1.0


def _pooled(pairs_list) -> dict[str, tuple[float, float]]:
    """Per metric over all the pairs: (request-level MAPE, mean percent error), fractions."""
    from blis_fast.calibrate.stats import mape_and_bias

    out = {}
    for metric in ("ttft", "itl", "e2e"):
        real = [v for p in pairs_list for v in getattr(p, metric).real]
        sim = [v for p in pairs_list for v in getattr(p, metric).sim]
        if real:
            mean_real = sum(real) / len(real)
            out[metric] = (mape_and_bias(real, sim)[0],
                           abs(sum(sim) / len(sim) - mean_real) / mean_real)
    return out


def _figures(pooled: dict[str, tuple[float, float]]) -> str:
    return ", ".join(f"{m} MAPE {mape * 100:.1f}% (mean err {err * 100:.1f}%)"
                     for m, (mape, err) in sorted(pooled.items()))


def test_fit_on_one_load_predicts_the_other(observed):
    from blis_fast.fit.optimize import fit
    from blis_fast.fit.problem import load_fit_trace, pair_trace, sim_results, simulate
    from blis_fast.options import build_options
    from blis_fast.runner import execute_replay

    def load(name):
        return load_fit_trace(*observed[name], warmup_requests=0)

    train = [load("rate8a"), load("rate8b")]
    held = [load("rate2a"), load("rate2b")]
    base = {"model": REPLAY_MODEL}
    weights = {"ttft": 1.0, "itl": 1.0, "e2e": 1.0}
    result = fit(train, base, weights, max_evaluations=2000, time_limit_s=120, seed=0)

    def fitted_pairs(traces):
        return [pair_trace(t, simulate(t, base, "blackbox", result.alpha, result.beta))
                for t in traces]

    def default_pairs(traces):  # the replay a user gets without fitting: no latency flags
        return [pair_trace(t, sim_results(execute_replay(build_options(
            dict(base, trace_header=t.header_path, trace_data=t.data_path, log="error"),
            keywords=True)).requests)) for t in traces]

    fitted_train = _pooled(fitted_pairs(train))
    fitted = _pooled(fitted_pairs(held))
    default = _pooled(default_pairs(held))
    print(f"\nfit: {len(result.losses)} evaluations, {result.seconds:.1f} s, loss "
          f"{result.loss:.4f}, alpha {result.alpha}, beta {result.beta}")
    print(f"fit traces (8 req/s): {_figures(fitted_train)}")
    print(f"held out (2 req/s), fitted: {_figures(fitted)}")
    print(f"held out (2 req/s), default roofline: {_figures(default)}")
    assert fitted["e2e"][1] <= 0.10
    assert fitted["e2e"][0] < default["e2e"][0]
