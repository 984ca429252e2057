"""Per-pool latency backends and routing scorers of P/D runs (PD-1.7, PD-1.8, PD-2.3, PD-2.9,
PD-2.11): a pool's backend times that pool's steps with the global coefficients, a pool's
scorer list routes that pool with its own Go-rand stream, and bad values are refused in the
reference's order with one line."""

from __future__ import annotations

import numpy as np
import pytest

import blis_fast
from blis_fast.kernels.cluster.pd import ParentField
from blis_fast.kernels.go.gorand import intn, new_source, subsystem_seed

MODEL = "meta-llama/llama-3.1-8b-instruct"
WORKLOAD = {"model": MODEL, "num_requests": 12, "rate": 2.0, "seed": 42, "log": "error"}
# defaults.yaml trained_physics_coefficients' betas; zero alphas make roofline's overheads
# (which read the global alphas, PD-1.8) the same as a plain roofline run's
TRAINED_ZERO_ALPHA = {"latency_model": "trained-physics", "alpha_coeffs": "0,0,0",
                      "beta_coeffs": "0.152128,0.0,1.36252915,0.752037,32.09546717,"
                                     "4.41684444,126.024825,481.8613888,0.0,1.94710771"}
ONE_PLUS_ONE = {"num_instances": 2, "prefill_instances": 1, "decode_instances": 1}


def _run(**opts):
    return blis_fast.run(**WORKLOAD, **opts).simulation


def _steps(sim, instance: int) -> np.ndarray:
    """(start, duration) of every step of ``instance``, in log order."""
    mine = sim.step_instance == instance
    return np.stack([sim.step_time[mine], sim.step_duration[mine]], axis=1)


@pytest.mark.parametrize("layout", [
    ONE_PLUS_ONE,
    # a shared-role pod takes the decode pool's backend ("decode wins", PD-1.7)
    {"num_instances": 2, "prefill_instances": 1, "prefill_decode_instances": 1},
], ids=["decode-pod", "shared-pod"])
def test_a_decode_pool_backend_times_its_requests_as_a_plain_run_of_that_backend(layout):
    # decider never: every request runs whole on the one decode-capable instance, so its
    # figures are a one-instance run's; the pool's roofline must give the plain roofline run's
    plain = _run(num_instances=1, latency_model="roofline")
    pooled = _run(**layout, **TRAINED_ZERO_ALPHA, pd_decider="never",
                  decode_latency_model="roofline")
    unpooled = _run(**layout, **TRAINED_ZERO_ALPHA, pd_decider="never")
    n = WORKLOAD["num_requests"]
    assert (plain.e2e_us > 0).all()
    assert np.array_equal(pooled.ttft_us[:n], plain.ttft_us)
    assert np.array_equal(pooled.e2e_us[:n], plain.e2e_us)
    assert np.array_equal(_steps(pooled, 1), _steps(plain, 0))
    assert not np.array_equal(unpooled.e2e_us[:n], plain.e2e_us)  # trained-physics differs


def test_a_prefill_pool_backend_changes_the_prefill_steps_only():
    # every request disaggregated: the prefill instance's steps depend on nothing the decode
    # pool does, so with --prefill-latency-model roofline they are an all-roofline run's
    all_roofline = _run(**ONE_PLUS_ONE, pd_decider="always", latency_model="roofline")
    pooled = _run(**ONE_PLUS_ONE, **TRAINED_ZERO_ALPHA, pd_decider="always",
                  prefill_latency_model="roofline")
    unpooled = _run(**ONE_PLUS_ONE, **TRAINED_ZERO_ALPHA, pd_decider="always")
    assert len(_steps(all_roofline, 0)) >= WORKLOAD["num_requests"] // 2
    assert np.array_equal(_steps(pooled, 0), _steps(all_roofline, 0))
    assert not np.array_equal(_steps(unpooled, 0), _steps(all_roofline, 0))
    assert np.array_equal(_steps(pooled, 1), _steps(unpooled, 1))  # decode: trained-physics
    assert not np.array_equal(_steps(pooled, 1), _steps(all_roofline, 1))


def test_the_pool_streams_have_the_published_seeds():
    assert subsystem_seed(42, "prefill-router") == 8584023086213245529
    assert subsystem_seed(42, "decode-router") == 5565281222138756221
    assert subsystem_seed(42, "router") == -6855704586828941970


def _draws(name: str, n_candidates: int, count: int) -> list[int]:
    rng = new_source(subsystem_seed(WORKLOAD["seed"], name))
    return [int(intn(rng, n_candidates)) for _ in range(count)]


TWO_PLUS_THREE = {"num_instances": 5, "prefill_instances": 2, "decode_instances": 3,
                  "pd_decider": "always", "routing_policy": "round-robin"}


def test_pool_scorers_route_their_pool_with_their_own_stream():
    n = WORKLOAD["num_requests"]
    shared = _run(**TWO_PLUS_THREE).pd.par
    # round-robin for both pools: one counter, every prefill on instance 1 (D1)
    assert shared[:, ParentField.PREFILL].tolist() == [1] * n
    assert shared[:, ParentField.DECODE].tolist() == [2, 4, 3] * (n // 3)
    # the decode pool's queue-depth: every idle decode queue ties, so each pick is the tie
    # broken by the decode-router stream; round-robin's counter now serves the prefills alone
    own = _run(**TWO_PLUS_THREE, decode_routing_scorers="queue-depth:1").pd.par
    assert own[:, ParentField.DECODE].tolist() == [2 + k for k in _draws("decode-router", 3, n)]
    assert own[:, ParentField.PREFILL].tolist() == [0, 1] * (n // 2)
    assert _draws("decode-router", 3, n) != _draws("router", 3, n)
    # likewise the prefill pool's, with the prefill-router stream
    own = _run(**TWO_PLUS_THREE, prefill_routing_scorers="queue-depth:1").pd.par
    assert own[:, ParentField.PREFILL].tolist() == _draws("prefill-router", 2, n)
    assert own[:, ParentField.DECODE].tolist() == [2, 3, 4] * (n // 3)


def test_shared_pods_follow_the_decode_scorers_and_the_trace_carries_their_scores(tmp_path):
    import polars as pl

    n = WORKLOAD["num_requests"]
    res = blis_fast.run(**WORKLOAD, num_instances=3, prefill_decode_instances=3,
                        pd_decider="never", routing_policy="least-loaded",
                        decode_routing_scorers="queue-depth:1", trace_level="decisions",
                        output_dir=str(tmp_path))
    sim = res.simulation
    assert sim.instance[:n].tolist() == _draws("decode-router", 3, n)
    scores = sim.decisions.routing_scores
    assert scores is not None and scores.shape == (n, 3)
    assert (scores == 1.0).all()  # queue-depth of idle queues, weight 1
    # decisions.parquet says which policy decided: the pool's weighted one, not least-loaded
    reasons = pl.read_parquet(tmp_path / "decisions.parquet").filter(
        pl.col("kind") == "routing")["reason"]
    assert reasons.len() == n and reasons.str.starts_with("weighted-scoring (score=1.000)").all()


def _cli(args: list[str], tmp_path, capsys) -> list[str]:
    from blis_fast.cli import main

    out = tmp_path / "results.json"
    with pytest.raises(SystemExit) as exc:
        main(["run", "--model", MODEL, "--num-instances", "2", "--prefill-instances", "1",
              "--decode-instances", "1", "--metrics-path", str(out), *args])
    assert exc.value.code == 2 and not out.exists()
    return capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize(("args", "message"), [
    (["--decode-routing-scorers", "queue-depth:x"],
     "Invalid --decode-routing-scorers: "),
    # the prefill list is parsed before the decode list
    (["--decode-routing-scorers", "bogus:1", "--prefill-routing-scorers", "nope:1"],
     "Invalid --prefill-routing-scorers: unknown scorer 'nope'"),
    # the latency backend names are checked before the scorer lists (PD-1.2 steps 10, 11)
    (["--prefill-routing-scorers", "nope:1", "--prefill-latency-model", "fast"],
     '--prefill-latency-model "fast" is not a recognized backend; valid: blackbox,'),
    # a pool backend takes the global coefficients: roofline's do not make a trained-physics
    (["--decode-latency-model", "trained-physics"],
     "--decode-latency-model trained-physics: --beta-coeffs: trained-physics needs at least 7 "
     "betas, got 3 (a pool's backend takes the coefficients resolved for --latency-model "
     "roofline)"),
])
def test_bad_pool_values_are_refused_with_one_line(args, message, tmp_path, capsys):
    lines = _cli(args, tmp_path, capsys)
    assert len(lines) == 1 and lines[0].startswith("blis: error: " + message), lines
