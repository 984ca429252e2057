"""Fit against a real vLLM server (CPU build, tiny model): observe two loads, fit on one,
predict the other.

Marker ``realserver_fit`` (``python -m pytest -m realserver_fit``), outside CI's real-server
command: in the lone-clone CI runs of 2026-11-25 it failed one run in three (held-out mean E2E
error 12.4 %, the CPU server's drift between segments again), so it is not yet the steady
acceptance check the fit issue asks for. Skipped with the reason when vLLM cannot be
installed or started. One server serves every observation.

The design keeps the server's own drift out of the comparison: the two loads are observed in
four alternations of short segments (8, 2, 8, 2, ... requests/s, after a discarded warm-up
segment), the fit uses every 8 requests/s segment and the held-out figures pool every
2 requests/s one. The CPU server's speed wanders by ±5-10 % from one segment to the next (its
median ITL, same load, quiet machine: 1698-2118 µs across runs, up to 19 % apart within one
run), and with two segments per load that alone decided whether the held-out error passed
10 % (runs at 4.9-7.3 % and at 12.8-13.7 %); four per load average it out.

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
A check that the segments of one load agree was tried and dropped: the server drifts smoothly
(2070 → 1720 µs over one minute), so same-load segments spread by 20-40 % while interleaving
still puts both loads on the same footing (eight such rounds: held-out mean E2E error 4.8-8.8 %).
"""

from __future__ import annotations

import time

import pytest

from blis_fast.testing.foreign_cpu import ForeignCpu
from blis_fast.testing.vllm_server import MODEL_NAME, VllmServer, VllmUnavailable

BURST_GAP_US = 200
BURST_SHARE = 0.30
FOREIGN_CORES = 0.25
ATTEMPTS = 3

pytestmark = pytest.mark.realserver_fit

REPLAY_MODEL = "meta-llama/llama-3.1-8b-instruct"
WORKLOAD = dict(prompt_tokens=64, prompt_tokens_stdev=24, prompt_tokens_min=16,
                prompt_tokens_max=128, output_tokens=24, output_tokens_stdev=8,
                output_tokens_min=8, output_tokens_max=48)
ROUNDS = 4  # alternations of the two loads: a segment's own speed level averages out
SEGMENTS = (("warmup", 8.0, 12),
            *((name, rate, count) for k in range(ROUNDS)
              for name, rate, count in ((f"rate8-{k}", 8.0, 40), (f"rate2-{k}", 2.0, 20))))
FIT_SEGMENTS = tuple(f"rate8-{k}" for k in range(ROUNDS))
HELD_SEGMENTS = tuple(f"rate2-{k}" for k in range(ROUNDS))


@pytest.fixture(scope="module")
def observed(tmp_path_factory):
    """Traces (header, data, itl) of each segment, observed one after another on one server."""
    server = VllmServer()
    try:
        server.start()
    except VllmUnavailable as exc:
        pytest.skip(f"real vLLM server unavailable: {exc}")
    try:
        return _observe_set(server, tmp_path_factory.mktemp("fit-real"))
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

    train = [load(name) for name in FIT_SEGMENTS]
    held = [load(name) for name in HELD_SEGMENTS]
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
