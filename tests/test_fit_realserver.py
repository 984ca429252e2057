"""Fit against a real vLLM server (CPU build, tiny model): observe one load in ten short
segments, fit on the even ones, predict the odd ones. Marker ``realserver_fit``, which CI's
real-server command (``-m realserver``) does not select: run it with ``python -m pytest -m
realserver_fit``. Skipped with the reason when vLLM cannot be installed or started. One server
serves every observation.

What the check asserts is what a fit is for (issue 30): its answer reproduces its own traces
(``converged``: the verdict ``blis fit`` prints, each mean within 15 %) and predicts fresh
observations of the same workload - the held-out E2E's mean and median within 10 %, its 90th
percentile within 20 %, the mean ITL within 10 % and the mean TTFT within 25 %, with no
observation-quality flag raised on any request. The default roofline's figures are printed
for information only (it happens to land near this tiny CPU model's E2E while missing its ITL
by ~30 % and its TTFT by ~90 %; an earlier design required the fit to beat its per-request
MAPE and failed by chance, 22.3 % against 22.0 %).

One load, not two. The bundled server keeps off the client's CPU (``vllm_server.server_cpus``),
which is what makes its observations clean (no request flagged), but on one core vLLM's worker
and engine-core processes busy-wait for each other's messages (their shared-memory queues spin
for a second after each read), and the server then answers a sparse stream *slower* than a busy
one: measured on one quiet run, 2 requests/s gave a mean TTFT of 53 ms and E2E of 152 ms where
8 requests/s gave 21 and 111 ms. No latency model holds a server that speeds up under load, so
a fit of both loads misses each by 8-17 % in opposite directions (the pooled figures then pass
or fail on the mix); with the server on both cores the loads were consistent (TTFT at 8/s
20-50 % above 2/s) but the client shared its core with the spinning processes and ran 50-135 ms
late, raising flags on 8-34 of 60 requests.

What makes the check steady on this 2-core machine, each measured on real observations:

* **The server's speed wanders.** Its median ITL moves by 10-20 % from one 3-second window to
  the next, with nothing else running. The load is therefore observed in ten short segments
  (24 requests at 8/s each, after a discarded warm-up); the even segments are joined into one
  training trace and the odd ones into one held-out trace (``_merged``), so both see the same
  slow and fast periods.
* **The fit's loss is the RMS log ratio** (``blis fit --loss rms-log``). MAPE charges an
  over-prediction more than an under-prediction of the same ratio, so on such a server it
  settles on the fast periods: with MAPE, three sessions of an earlier design gave held-out
  mean E2E errors of 3.2, 10.5 and 11.1 % (in-sample 9-11 % low); with the RMS log ratio 4.1,
  5.0 and 5.3 %.
* **The fit times ITL per output token.** vLLM streams one chunk per token plus a usage chunk
  µs after the last, and calibrate's ITL (the mean gap between consecutive chunks, a rule kept
  from the reference) counts that near-zero gap: it reads 1/n low for n output tokens (~4 %
  here). The fit divides the chunk gaps by the output tokens - 1 (``fit/problem.py``).
* **A segment timed on a busy machine is observed again.** More than 30 % of the inter-chunk
  gaps under 0.2 ms means the chunks reached the client in bursts; other processes keeping
  more than a quarter of a core busy (``blis_fast.testing.foreign_cpu``) moved the held-out
  error from 5-6 % to 10.7 % in one run. Up to three attempts; the test is skipped, saying so,
  when the machine never lets a clean one through.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from blis_fast.testing.foreign_cpu import ForeignCpu
from blis_fast.testing.vllm_server import MODEL_NAME, VllmServer, VllmUnavailable

BURST_GAP_US = 200
BURST_SHARE = 0.30
FOREIGN_CORES = 0.25
ATTEMPTS = 3
HELD_OUT_E2E = 0.10  # error of the held-out mean and median E2E, and of the mean ITL
HELD_OUT_P90_E2E = 0.20  # error of the held-out 90th-percentile E2E
HELD_OUT_TTFT = 0.25  # error of the held-out mean TTFT

pytestmark = pytest.mark.realserver_fit

REPLAY_MODEL = "meta-llama/llama-3.1-8b-instruct"
WORKLOAD = dict(prompt_tokens=64, prompt_tokens_stdev=24, prompt_tokens_min=16,
                prompt_tokens_max=128, output_tokens=24, output_tokens_stdev=8,
                output_tokens_min=8, output_tokens_max=48)
ROUNDS = 10  # segments of the load (module docstring)
SEGMENTS = (("warmup", 8.0, 12), *((f"rate8-{k}", 8.0, 24) for k in range(ROUNDS)))
FIT_SEGMENTS = tuple(f"rate8-{k}" for k in range(0, ROUNDS, 2))  # even segments: training
HELD_SEGMENTS = tuple(f"rate8-{k}" for k in range(1, ROUNDS, 2))  # odd segments, held out


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
            quality_columns=True,
            timeout=120, trace_header=paths[0], trace_data=paths[1], itl_output=paths[2],
            num_requests=count,
            given=frozenset({"rate", "seed", "record_itl", "quality_columns", "timeout",
                             "itl_output",
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


def _flagged(data_path: str) -> int:
    """Requests of a trace (written with ``--quality-columns``) that observe flagged."""
    import csv

    with open(data_path, newline="") as f:
        return sum(any(r[k] == "true" for k in ("burst", "not_streamed", "client_late"))
                   for r in csv.DictReader(f))


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


def _merged(segments: list[tuple[str, str, str]], prefix) -> tuple[str, str, str]:
    """One trace (header, data, itl) holding every request of ``segments`` in time order: ids
    renumbered, arrivals moved onto one clock (each segment's offset between send and planned
    arrival kept), the first segment's header. The fit then replays one trace per load instead
    of one per segment (a replay's fixed cost is most of an evaluation for 16 requests)."""
    import csv
    import shutil

    rows, chunks, fields = [], [], None
    starts = []
    for _header, data, itl in segments:
        with open(data, newline="") as f:
            reader = csv.DictReader(f)
            fields = reader.fieldnames
            seg = list(reader)
        starts.append(min(int(r["send_time_us"]) - int(r["arrival_time_us"]) for r in seg))
        with open(itl, newline="") as f:
            seg_chunks = list(csv.DictReader(f))
        rows.append(seg)
        chunks.append(seg_chunks)
    origin = min(starts)
    out_header, out_data, out_itl = (f"{prefix}.yaml", f"{prefix}.csv", f"{prefix}.itl.csv")
    shutil.copyfile(segments[0][0], out_header)
    next_id = 0
    with open(out_data, "w", newline="") as fd, open(out_itl, "w", newline="") as fi:
        data_out = csv.DictWriter(fd, fieldnames=fields)
        data_out.writeheader()
        itl_out = csv.writer(fi)
        itl_out.writerow(["request_id", "chunk_index", "timestamp_us"])
        for seg, seg_chunks, start in zip(rows, chunks, starts, strict=True):
            new_id = {}
            for r in seg:
                new_id[r["request_id"]] = str(next_id)
                r = dict(r, request_id=str(next_id),
                         arrival_time_us=str(int(r["arrival_time_us"]) + start - origin))
                data_out.writerow(r)
                next_id += 1
            for c in seg_chunks:
                itl_out.writerow([new_id[c["request_id"]], c["chunk_index"], c["timestamp_us"]])
    return out_header, out_data, out_itl


def _pooled(pairs_list) -> dict[str, tuple[float, float, float, float]]:
    """Per metric over all the pairs: request-level MAPE and the relative errors of the mean,
    the median and the 90th percentile (fractions)."""
    from blis_fast.calibrate.stats import mape_and_bias

    def rel(sim: float, real: float) -> float:
        return abs(sim - real) / real

    out = {}
    for metric in ("ttft", "itl", "e2e"):
        real = [v for p in pairs_list for v in getattr(p, metric).real]
        sim = [v for p in pairs_list for v in getattr(p, metric).sim]
        if real:
            out[metric] = (mape_and_bias(real, sim)[0],
                           rel(float(np.mean(sim)), float(np.mean(real))),
                           rel(float(np.percentile(sim, 50)), float(np.percentile(real, 50))),
                           rel(float(np.percentile(sim, 90)), float(np.percentile(real, 90))))
    return out


def _figures(pooled: dict[str, tuple[float, float, float, float]]) -> str:
    return ", ".join(f"{m} MAPE {mape * 100:.1f}% (error of the mean {mean * 100:.1f}%, p50 "
                     f"{p50 * 100:.1f}%, p90 {p90 * 100:.1f}%)"
                     for m, (mape, mean, p50, p90) in sorted(pooled.items()))


def test_fit_predicts_fresh_observations_of_its_load(observed, tmp_path):
    from blis_fast.fit.optimize import fit
    from blis_fast.fit.problem import load_fit_trace, pair_trace, sim_results, simulate
    from blis_fast.fit.report import start_loss
    from blis_fast.fit.verdict import judge
    from blis_fast.options import build_options
    from blis_fast.runner import execute_replay

    def load(names, prefix):
        return load_fit_trace(*_merged([observed[n] for n in names], tmp_path / prefix),
                              warmup_requests=0)

    flagged = {name: _flagged(observed[name][1]) for name in (*FIT_SEGMENTS, *HELD_SEGMENTS)}
    train = [load(FIT_SEGMENTS, "fit")]
    held = [load(HELD_SEGMENTS, "held")]
    base = {"model": REPLAY_MODEL}
    weights = {"ttft": 1.0, "itl": 1.0, "e2e": 1.0}
    result = fit(train, base, weights, max_evaluations=2000, time_limit_s=120, seed=0,
                 loss="rms-log")

    def fitted_pairs(traces):
        return [pair_trace(t, simulate(t, base, "blackbox", result.alpha, result.beta))
                for t in traces]

    def default_pairs(traces):  # the replay a user gets without fitting: no latency flags
        return [pair_trace(t, sim_results(execute_replay(build_options(
            dict(base, trace_header=t.header_path, trace_data=t.data_path, log="error"),
            keywords=True)).requests)) for t in traces]

    train_pairs = fitted_pairs(train)
    verdict = judge(train_pairs, weights, start_loss(result, train, base, weights),
                    result.loss)
    held_out = _pooled(fitted_pairs(held))
    default = _pooled(default_pairs(held))
    print(f"\nfit (rms-log): {len(result.losses)} evaluations, {result.seconds:.1f} s, loss "
          f"{result.loss:.4f}, alpha {result.alpha}, beta {result.beta}")
    print(verdict.line())
    print(f"flagged requests per segment: {flagged}")
    print(f"fit traces (even segments): {_figures(_pooled(train_pairs))}")
    print(f"held out (odd segments), fitted: {_figures(held_out)}")
    print(f"held out (odd segments), default roofline (for information): {_figures(default)}")
    # Observations the fit can trust: the quality check raised no flag on any request
    assert not any(flagged.values()), flagged
    # What the fit is for: its answer reproduces its own traces (the verdict blis fit prints)
    # and predicts fresh observations of the same workload: E2E's mean, median and tail
    assert verdict.fitted, verdict.line()
    _mape, mean_err, p50_err, p90_err = held_out["e2e"]
    assert mean_err <= HELD_OUT_E2E, _figures(held_out)
    assert p50_err <= HELD_OUT_E2E, _figures(held_out)
    assert p90_err <= HELD_OUT_P90_E2E, _figures(held_out)
    assert held_out["itl"][1] <= HELD_OUT_E2E, _figures(held_out)
    assert held_out["ttft"][1] <= HELD_OUT_TTFT, _figures(held_out)
