"""``blis fit``: recovery of known coefficients, calibrate agreement, determinism, bad input."""

from __future__ import annotations

import json
import math
import shlex

import pytest

from blis_fast.testing.synthetic_trace import make_observed_trace
from tests._cli import invoke

MODEL = "meta-llama/llama-3.1-8b-instruct"
ALPHA = (2000.0, 1.0, 0.0)
BETA = (6000.0, 8.0, 150.0)
WORKLOAD = dict(num_requests=200, prompt_tokens=300, prompt_tokens_stdev=150, output_tokens=60,
                output_tokens_stdev=30)


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    """A busy trace (12 req/s) to fit and a light one (4 req/s) to predict, 3% timing noise."""
    tmp = tmp_path_factory.mktemp("fit")
    busy = make_observed_trace(tmp / "busy", alpha=ALPHA, beta=BETA, rate=12, seed=5,
                               noise_seed=2, **WORKLOAD)
    light = make_observed_trace(tmp / "light", alpha=ALPHA, beta=BETA, rate=4, seed=3,
                                noise_seed=1, **WORKLOAD)
    return busy, light


@pytest.fixture(scope="module")
def fitted(traces, tmp_path_factory):
    (bh, bd), (lh, ld) = traces
    out = tmp_path_factory.mktemp("fitout")
    res = invoke(["fit", "--trace-header", bh, "--trace-data", bd, "--holdout", f"{lh}:{ld}",
                  "--model", MODEL, "--seed", "0", "--out-coeffs", str(out / "c.json"),
                  "--report", str(out / "r.json"), "--plot", str(out / "fit.png")])
    assert res.code == 0, res.stderr
    assert (out / "fit.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return res, json.loads((out / "c.json").read_text()), json.loads((out / "r.json").read_text())


def test_fit_recovers_step_coefficients_and_predicts_another_load(fitted):
    res, coeffs, report = fitted
    alpha, beta = coeffs["alpha_coeffs"], coeffs["beta_coeffs"]
    # The per-step cost sets ITL and E2E: within 5%. The per-decode-token slope is seen only
    # through the batch-size spread of one load: within 30%.
    # α0/α1/β1 only shape TTFT, which the step cycle's phase blurs; they are not asserted.
    assert beta[0] == pytest.approx(BETA[0], rel=0.05)
    assert beta[2] == pytest.approx(BETA[2], rel=0.30)
    assert alpha[2] == 0.0 and all(c > 0 for c in (alpha[0], alpha[1], beta[1]))
    holdout = report["holdout"][0]["calibration"]["metrics"]
    print(f"\nrecovered alpha {alpha} beta {beta}; holdout E2E MAPE "
          f"{holdout['e2e']['request_level']['mape']:.4f}, TTFT "
          f"{holdout['ttft']['request_level']['mape']:.4f}")
    assert holdout["e2e"]["request_level"]["mape"] <= 0.03
    assert report["coefficients"][3]["lower"] <= beta[0] <= report["coefficients"][3]["upper"]
    assert len(report["losses"]) >= 10 and report["loss"] == min(report["losses"])
    assert res.stdout.startswith("--latency-model blackbox --alpha-coeffs ")


def test_calibrate_of_the_fitted_model_reports_the_fit_figures(fitted, traces, tmp_path):
    res, _, report = fitted
    (bh, bd), _ = traces
    sim = tmp_path / "sim.json"
    replay = invoke(["replay", "--trace-header", bh, "--trace-data", bd, "--model", MODEL,
                     "--results-path", str(sim), *shlex.split(res.stdout)])
    assert replay.code == 0, replay.stderr
    cal = invoke(["calibrate", "--trace-header", bh, "--trace-data", bd, "--sim-results",
                  str(sim), "--report", str(tmp_path / "cal.json")])
    assert cal.code == 0, cal.stderr
    metrics = json.loads((tmp_path / "cal.json").read_text())["metrics"]
    mine = report["traces"][0]["calibration"]["metrics"]
    for name in ("ttft", "e2e"):
        assert metrics[name]["request_level"] == mine[name]["request_level"]
    # the loss is the weighted mean of those MAPEs (equal weights, no ITL file)
    assert report["loss"] == pytest.approx((metrics["ttft"]["request_level"]["mape"]
                                            + metrics["e2e"]["request_level"]["mape"]) / 2,
                                           rel=1e-12)


def test_fit_is_deterministic_for_a_seed(traces):
    from blis_fast.fit.optimize import fit
    from blis_fast.fit.problem import load_fit_trace

    (bh, bd), _ = traces
    ft = load_fit_trace(bh, bd)
    weights = {"ttft": 1.0, "itl": 1.0, "e2e": 1.0}
    runs = [fit([ft], {"model": MODEL}, weights, max_evaluations=80, time_limit_s=600, seed=7)
            for _ in range(2)]
    assert runs[0].coefficients == runs[1].coefficients
    assert runs[0].losses == runs[1].losses and len(runs[0].losses) == 80
    assert runs[0].stopped == "max-evaluations"


@pytest.mark.parametrize(("extra", "needle"), [
    (["--weight-e2e", "-1"], "--weight-e2e"),
    (["--max-evaluations", "0"], "--max-evaluations"),
    (["--time-limit", "abc"], "--time-limit"),
    (["--holdout", "only-one-part"], "--holdout"),
    (["--latency-model", "roofline"], "--latency-model"),
    (["--loss", "mse"], "--loss"),
    (["--starts", "0"], "--starts"),
    (["--workers", "x"], "--workers"),
    (["--backend", "slurm"], "--backend"),
    (["--trace-header", "missing.yaml", "--trace-data", "missing.csv"], "--trace-header"),
])
def test_bad_input_is_one_line_exit_2_nothing_written(traces, tmp_path, extra, needle):
    (bh, bd), _ = traces
    base = ["fit", "--model", MODEL, "--out-coeffs", str(tmp_path / "c.json"),
            "--report", str(tmp_path / "r.json")]
    if "--trace-header" not in extra:
        base += ["--trace-header", bh, "--trace-data", bd]
    res = invoke(base + extra)
    assert res.code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], res.stderr
    assert list(tmp_path.iterdir()) == []


# trained-physics: the published coefficients moved by known factors are the truth; the fit
# starts from the published ones (physics_start) and must find the scale and the split.
PHYSICS_FACTORS = {0: 2.0, 1: 1.5, 3: 3.0, 5: 2.0, 8: 2.0, 9: 4.0, 12: 2.5}


@pytest.fixture(scope="module")
def physics_traces(tmp_path_factory):
    from blis_fast.fit.optimize import physics_start

    truth = list(physics_start({}))
    for k, factor in PHYSICS_FACTORS.items():
        truth[k] *= factor
    tmp = tmp_path_factory.mktemp("fit-physics")
    made = [make_observed_trace(tmp / name, alpha=tuple(truth[:3]), beta=tuple(truth[3:]),
                                rate=rate, seed=seed, noise_seed=noise_seed,
                                latency_model="trained-physics", **WORKLOAD)
            for name, rate, seed, noise_seed in (("busy", 12, 5, 2), ("light", 4, 3, 1))]
    return truth, made


def test_trained_physics_fit_finds_the_scale_and_predicts_another_load(physics_traces, tmp_path):
    truth, ((bh, bd), (lh, ld)) = physics_traces
    res = invoke(["fit", "--trace-header", bh, "--trace-data", bd, "--holdout", f"{lh}:{ld}",
                  "--model", MODEL, "--latency-model", "trained-physics",
                  "--report", str(tmp_path / "r.json"), "--out-coeffs", str(tmp_path / "c.json")])
    assert res.code == 0, res.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    coeffs = json.loads((tmp_path / "c.json").read_text())
    assert coeffs["latency_model"] == report["latency_model"] == "trained-physics"
    assert len(coeffs["alpha_coeffs"]) == 3 and len(coeffs["beta_coeffs"]) == 10
    fitted = coeffs["alpha_coeffs"] + coeffs["beta_coeffs"]
    free = [c["name"] for c in report["coefficients"] if c["fitted"]]
    assert free == ["alpha0", "alpha1", "beta0", "beta2", "beta5", "beta6", "beta9"]
    for k, c in enumerate(report["coefficients"]):  # fixed ones keep the published value
        if not c["fitted"]:
            assert fitted[k] == c["initial"]
    # the queueing delay and the weight-loading factor (what a decode step of an 8B model on
    # one GPU mostly is) are seen directly: within 10 %
    assert fitted[0] == pytest.approx(truth[0], rel=0.10)
    assert fitted[5] == pytest.approx(truth[5], rel=0.10)
    holdout = report["holdout"][0]["calibration"]["metrics"]
    print(f"\ntrained-physics fit: holdout E2E MAPE {holdout['e2e']['request_level']['mape']:.4f}"
          f", {len(report['losses'])} evaluations")
    assert holdout["e2e"]["request_level"]["mape"] <= 0.03
    assert res.stdout.startswith("--latency-model trained-physics --alpha-coeffs ")


def test_parallel_searches_do_not_depend_on_the_worker_count(traces):
    from blis_fast.fit.optimize import fit
    from blis_fast.fit.problem import load_fit_trace

    (bh, bd), _ = traces
    ft = load_fit_trace(bh, bd)
    weights = {"ttft": 1.0, "itl": 1.0, "e2e": 1.0}
    here, pooled = (fit([ft], {"model": MODEL}, weights, max_evaluations=60, time_limit_s=600,
                        seed=3, starts=2, workers=workers) for workers in (1, 2))
    assert here.coefficients == pooled.coefficients and here.losses == pooled.losses
    assert len(here.search_losses) == 2 and len(here.losses) == 60
    assert here.loss == min(here.search_losses) == min(here.losses)
    # the second search starts elsewhere: its evaluations differ from the first's
    assert here.losses[:30] != here.losses[30:]


def _write_itl(header: str, data: str, path, burst_request: int,
               usage_chunk: bool = False) -> None:
    """An ITL file for a synthetic trace: each request's chunks evenly spaced from its first
    to its last chunk time, except ``burst_request``, whose chunks arrive 5 µs apart at the end
    (what a client starved of CPU records); with ``usage_chunk`` one more chunk 5 µs after the
    last token's (vLLM's usage chunk)."""
    import csv

    with open(data, newline="") as f:
        rows = list(csv.DictReader(f))
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["request_id", "chunk_index", "timestamp_us"])
        for row in rows:
            rid, n = int(row["request_id"]), int(row["output_tokens"])
            first, last = int(row["first_chunk_time_us"]), int(row["last_chunk_time_us"])
            for k in range(n):
                ts = last - 5 * (n - 1 - k) if rid == burst_request \
                    else first + (last - first) * k // max(n - 1, 1)
                out.writerow([rid, k, ts])
            if usage_chunk:
                out.writerow([rid, n, last + 5])


def test_a_burst_delivered_request_is_left_out_of_the_itl_metric(traces, tmp_path):
    from blis_fast.calibrate.pairing import pair_requests
    from blis_fast.fit.problem import load_fit_trace, metric_mapes, pair_trace, simulate

    (bh, bd), _ = traces
    itl = tmp_path / "busy.itl.csv"
    _write_itl(bh, bd, itl, burst_request=17)
    ft = load_fit_trace(bh, bd, str(itl))
    assert ft.left_out == {"burst": [17], "not_streamed": [], "client_late": []}
    sims = simulate(ft, {"model": MODEL}, "blackbox", ALPHA, BETA)
    # with the true coefficients the ITL error is the 3% timing noise ...
    assert metric_mapes(pair_trace(ft, sims))["itl"] < 0.10
    # ... while calibrate's pairing, which keeps the burst (a 5 µs real ITL), is off the scale
    raw = load_fit_trace(bh, bd)
    from blis_fast.calibrate.inputs import load_itl

    pairs = pair_requests(raw.trace.records, sims, warm_up=raw.warm_up, rtt_us=raw.rtt_us,
                          bandwidth_mbps=0.0, itl=load_itl(str(itl)))
    assert not metric_mapes(pairs)["itl"] < 1.0

    res = invoke(["fit", "--trace-header", bh, "--trace-data", bd, "--itl-data", str(itl),
                  "--model", MODEL, "--max-evaluations", "20", "--report",
                  str(tmp_path / "r.json")])
    assert res.code == 0, res.stderr
    assert ("1 request(s) left out of TTFT and ITL, E2E kept: 1 delivered in one burst (e.g. "
            "request 17)") in res.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["traces"][0]["left_out_of_ttft_itl"]["burst"] == [17]
    # a refused run still prints one line only: the notice comes after the checks
    bad = invoke(["fit", "--trace-header", bh, "--trace-data", bd, "--itl-data", str(itl),
                  "--model", MODEL, "--total-kv-blocks", "-5"])
    assert bad.code == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr


def _pairs(real: list[float], sim: list[float]):
    from blis_fast.calibrate.pairing import CalibrationPairs

    pairs = CalibrationPairs()
    for rid, (r, s) in enumerate(zip(real, sim, strict=True)):
        for metric in (pairs.ttft, pairs.itl, pairs.e2e):
            metric.add(rid, r, s)
    return pairs


def test_rms_log_error_is_symmetric_in_the_ratio_where_mape_is_not():
    from blis_fast.fit.problem import metric_errors

    real = [1000.0, 2500.0, 40000.0]
    for factor in (2.0, 0.5, 1.1, 1 / 1.1):
        errors = metric_errors(_pairs(real, [r * factor for r in real]), "rms-log")
        assert errors == pytest.approx({m: abs(math.log(factor)) for m in ("ttft", "itl", "e2e")},
                                       rel=1e-12)
    over = metric_errors(_pairs(real, [2 * r for r in real]), "mape")["e2e"]
    under = metric_errors(_pairs(real, [r / 2 for r in real]), "mape")["e2e"]
    assert (over, under) == pytest.approx((1.0, 0.5))
    # pairs with a real 0 drop out (as for MAPE); a sim 0 counts as 1 µs
    assert metric_errors(_pairs([0.0, 100.0], [5.0, 0.0]), "rms-log")["itl"] == \
        pytest.approx(math.log(100.0))


def test_on_a_server_at_two_speeds_mape_picks_the_faster_and_rms_log_the_middle():
    """Half the requests 22 % slower than the others (a server whose speed wanders): the best
    common scale of the predictions is the faster level under MAPE, the geometric mean of the
    two under the RMS log ratio (the reason ``--loss rms-log`` exists)."""
    import numpy as np

    from blis_fast.fit.problem import metric_errors

    real = [1000.0] * 20 + [1220.0] * 20
    scales = np.linspace(0.9, 1.3, 401)

    def best(loss: str) -> float:
        values = [metric_errors(_pairs(real, [1000.0 * k] * 40), loss)["e2e"] for k in scales]
        return float(scales[int(np.argmin(values))])

    assert best("mape") == pytest.approx(1.0, abs=1e-9)
    assert best("rms-log") == pytest.approx(math.sqrt(1.22), abs=0.001)


def test_cli_fits_with_the_rms_log_loss_and_reports_it(traces, tmp_path):
    from blis_fast.fit.problem import load_fit_trace, metric_errors, pair_trace, simulate

    (bh, bd), (lh, ld) = traces
    res = invoke(["fit", "--trace-header", bh, "--trace-data", bd, "--holdout", f"{lh}:{ld}",
                  "--model", MODEL, "--loss", "rms-log", "--max-evaluations", "60",
                  "--report", str(tmp_path / "r.json"), "--plot", str(tmp_path / "fit.svg")])
    assert res.code == 0, res.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["loss_function"] == "rms-log" and "loss (rms-log)" in res.stderr
    assert "RMS log ratio" in (tmp_path / "fit.svg").read_text()
    assert len(report["losses"]) == 60 and report["loss"] == min(report["losses"])
    # the reported loss is the weighted RMS log ratio of the fitted replay, not its MAPE
    ft = load_fit_trace(bh, bd)
    pairs = pair_trace(ft, simulate(ft, {"model": MODEL}, "blackbox", report["alpha_coeffs"],
                                    report["beta_coeffs"]))
    logs = metric_errors(pairs, "rms-log")
    assert report["loss"] == pytest.approx((logs["ttft"] + logs["e2e"]) / 2, rel=1e-12)
    assert report["loss"] != pytest.approx(
        sum(metric_errors(pairs, "mape")[m] for m in ("ttft", "e2e")) / 2, rel=1e-3)


@pytest.fixture(scope="module")
def two_speed_traces(tmp_path_factory):
    """A server that runs some segments 25 % slower than others (every coefficient × 1.25),
    observed at 12 req/s to fit and 4 req/s to predict, each load in both speeds."""
    tmp = tmp_path_factory.mktemp("fit-two-speeds")
    made = {}
    for load, rate in (("busy", 12), ("light", 4)):
        for speed, factor in (("fast", 1.0), ("slow", 1.25)):
            made[load, speed] = make_observed_trace(
                tmp / f"{load}-{speed}", alpha=tuple(a * factor for a in ALPHA),
                beta=tuple(b * factor for b in BETA), rate=rate, seed=5 if load == "busy" else 3,
                noise_seed=2 if speed == "fast" else 4, **dict(WORKLOAD, num_requests=100))
    return made


def _pooled_mean_e2e_error(fit_result, traces) -> float:
    """|mean sim E2E - mean real E2E| / mean real E2E over every pair of ``traces``."""
    from blis_fast.fit.problem import pair_trace, simulate

    real, sim = [], []
    for ft in traces:
        pairs = pair_trace(ft, simulate(ft, {"model": MODEL}, "blackbox", fit_result.alpha,
                                        fit_result.beta))
        real += pairs.e2e.real
        sim += pairs.e2e.sim
    return abs(sum(sim) - sum(real)) / sum(real)


def test_rms_log_predicts_the_mean_of_a_server_at_two_speeds_where_mape_sits_low(
        two_speed_traces):
    """The case ``--loss rms-log`` is for: fitted on both speeds of the busy load, MAPE favours
    the fast speed and under-predicts the light load's mean E2E; the RMS log ratio lands
    between the speeds and predicts it within 5 % (measured: MAPE 19.8 %, RMS log 1.4 %)."""
    from blis_fast.fit.optimize import fit
    from blis_fast.fit.problem import load_fit_trace

    busy = [load_fit_trace(*two_speed_traces["busy", s]) for s in ("fast", "slow")]
    light = [load_fit_trace(*two_speed_traces["light", s]) for s in ("fast", "slow")]
    weights = {"ttft": 1.0, "itl": 1.0, "e2e": 1.0}
    errors = {loss: _pooled_mean_e2e_error(fit(busy, {"model": MODEL}, weights, loss=loss),
                                           light) for loss in ("mape", "rms-log")}
    print(f"\ntwo-speed server, held-out mean E2E error: {errors}")
    assert errors["rms-log"] <= 0.05
    assert errors["rms-log"] < errors["mape"] - 0.03


def test_the_fit_times_itl_per_output_token_not_per_chunk(traces, tmp_path):
    """vLLM's usage chunk arrives µs after the last token: calibrate's chunk-gap ITL counts that
    gap and reads (n-1)/n of the true per-token time; the fit divides the same gaps by the
    output tokens - 1, so the true coefficients match the ITL within the 3 % timing noise."""
    import numpy as np

    from blis_fast.calibrate.inputs import load_itl
    from blis_fast.calibrate.pairing import pair_requests
    from blis_fast.fit.problem import load_fit_trace, pair_trace, simulate

    (bh, bd), _ = traces
    itl = tmp_path / "busy.itl.csv"
    _write_itl(bh, bd, itl, burst_request=-1, usage_chunk=True)
    ft = load_fit_trace(bh, bd, str(itl))
    sims = simulate(ft, {"model": MODEL}, "blackbox", ALPHA, BETA)
    fit_pairs = pair_trace(ft, sims).itl
    ratio = np.asarray(fit_pairs.real) / np.asarray(fit_pairs.sim)
    assert abs(float(np.mean(ratio)) - 1.0) < 0.01
    calibrate = pair_requests(ft.trace.records, sims, warm_up=ft.warm_up, rtt_us=ft.rtt_us,
                              bandwidth_mbps=0.0, itl=load_itl(str(itl))).itl
    tokens = dict(zip(ft.trace.records.request_id.tolist(),
                      ft.trace.records.output_tokens.tolist(), strict=True))
    assert calibrate.request_id == fit_pairs.request_id
    for rid, cal, fitted in zip(calibrate.request_id, calibrate.real, fit_pairs.real,
                                strict=True):
        n = tokens[rid]
        assert cal == pytest.approx(fitted * (n - 1) / n, rel=1e-12)
