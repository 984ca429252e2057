"""``--kv-cpu-reload always``: the August reference's rule for the ``--kv-cpu-blocks`` tier
(issue 32; spec kv-offload.md KVO-9.1, #1586): CPU-resident prefix blocks are reloaded before
every GPU allocation, not only after a failed one. The default (``on-failure``) keeps April's
rule, so every April tiered case is unchanged (tests/test_parity.py -k tiered).

Acceptance: the reference's ``kvo-legacy-*`` runs (tests/reference_cases/reference_changes/,
copied from the August reference's answers) match with the opt-in added, and differ without
it (the April answer)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from _cli import invoke
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from parity import HEAD_EXTRA_KEYS, _drop_keys, compare_results, compare_stdout

import blis_fast
from blis_fast.errors import BlisConfigError

CHANGES = Path(__file__).resolve().parent / "reference_cases" / "reference_changes"
MODEL = "meta-llama/llama-3.1-8b-instruct"
OPT_IN = ["--kv-cpu-reload", "always"]


def _run_change(case_id: str, workdir: Path, extra: list[str]) -> tuple[dict, str, Path]:
    src = CHANGES / case_id
    case = json.loads((src / "case.json").read_text())
    for item in src.iterdir():
        if item.name not in ("case.json", "stdout.txt", "stderr.txt", "results.json"):
            shutil.copy(item, workdir / item.name)
    cwd = Path.cwd()
    os.chdir(workdir)
    try:
        res = invoke([case["subcommand"], *case["args"], *extra, "--log", "error"])
    finally:
        os.chdir(cwd)
    assert res.code == 0, res.stderr
    return case, res.stdout, src


@pytest.mark.parametrize("case_id", ["kvo-legacy-cpu-tier-light-load",
                                     "kvo-legacy-cpu-tier-cluster"])
def test_legacy_cases_match_the_august_reference_with_the_opt_in(case_id, tmp_path):
    """KVO-9.1/9.3: stdout and the per-request file as the August reference printed them."""
    _, stdout, src = _run_change(case_id, tmp_path, OPT_IN)
    assert compare_stdout(stdout, (src / "stdout.txt").read_text(), head_extras=True) == []
    expected = _drop_keys(json.loads((src / "results.json").read_text()), set(HEAD_EXTRA_KEYS))
    actual = json.loads((tmp_path / "results.json").read_text())
    assert compare_results(actual, expected) == []


def test_without_the_opt_in_the_legacy_case_keeps_the_april_answer(tmp_path):
    """KVO-9.3: the April rule gives Cache Hit Rate 0.3726 on the light-load case (August
    0.5244), so the case fails for its own reason without the flag."""
    _, stdout, src = _run_change("kvo-legacy-cpu-tier-light-load", tmp_path, [])
    assert "Cache Hit Rate: 0.3726" in stdout
    assert "Cache Hit Rate: 0.5244" in (src / "stdout.txt").read_text()
    assert compare_stdout(stdout, (src / "stdout.txt").read_text(), head_extras=True) != []


def test_the_flag_is_checked_and_taken_by_the_api(tmp_path):
    res = invoke(["run", "--model", MODEL, "--kv-cpu-blocks", "10", "--kv-cpu-reload", "first",
                  "--metrics-path", str(tmp_path / "m.json")])
    assert res.code == 2 and res.stdout == "" and res.stderr.count("\n") == 1
    assert "--kv-cpu-reload must be one of on-failure, always, got 'first'" in res.stderr
    assert not (tmp_path / "m.json").exists()
    with pytest.raises(BlisConfigError, match="--kv-cpu-reload"):
        blis_fast.run(model=MODEL, kv_cpu_reload="sometimes", num_requests=2)


def test_without_a_cpu_tier_the_opt_in_warns_and_changes_nothing():
    res = invoke(["run", "--model", MODEL, "--num-requests", "5", "--kv-cpu-reload", "always"])
    base = invoke(["run", "--model", MODEL, "--num-requests", "5"])
    assert res.code == base.code == 0 and res.stdout == base.stdout
    assert "--kv-cpu-reload always has no effect without --kv-cpu-blocks" in res.stderr


def _spec(path: Path, groups: int, prefix: int, rate: float, seed: int) -> str:
    """A workload spec of ``groups`` clients, each with its own shared prefix: prefixes evicted
    from the GPU come back from the CPU tier."""
    lines = ['version: "2"', f"seed: {seed}", "category: language", f"aggregate_rate: {rate}",
             "num_requests: 40", "clients:"]
    for g in range(groups):
        lines += [f'  - id: "g{g}"', f"    rate_fraction: {1 / groups}",
                  "    arrival: {process: poisson}",
                  "    input_distribution: {type: gaussian, params: {mean: 128, std_dev: 32, "
                  "min: 16, max: 256}}",
                  "    output_distribution: {type: gaussian, params: {mean: 16, std_dev: 4, "
                  "min: 1, max: 32}}",
                  f'    prefix_group: "p{g}"', f"    prefix_length: {prefix}"]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _tiered(spec: str, gpu: int, cpu: int, reload: str):
    return blis_fast.run(model=MODEL, latency_model="blackbox", alpha_coeffs="100,1,100",
                         beta_coeffs="1000,10,5", workload_spec=spec, total_kv_blocks=gpu,
                         kv_cpu_blocks=cpu, kv_cpu_reload=reload, log="error")


DRAWS = dict(seed=st.integers(0, 10_000), groups=st.integers(2, 4),
             prefix=st.sampled_from([128, 256]), cpu=st.integers(1, 300),
             rate=st.floats(2.0, 30.0))


@settings(max_examples=10, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(gpu=st.integers(60, 160), **DRAWS)
def test_reload_first_runs_account_for_every_request(tmp_path, seed, groups, prefix, cpu, rate,
                                                      gpu):
    """Random tiered runs with the opt-in, prefixes going to the CPU tier and back: every
    request ends (completed, dropped or timed out; none left queued or running) and the run
    repeats exactly."""
    spec = _spec(tmp_path / "wl.yaml", groups, prefix, rate, seed)
    a = _tiered(spec, gpu, cpu, "always")
    assert _tiered(spec, gpu, cpu, "always").stdout == a.stdout
    s = a.summary
    assert s["still_queued"] == 0 and s["still_running"] == 0
    assert (s["completed_requests"] + s["dropped_unservable"] + s["timed_out_requests"]
            == s["injected_requests"] == 40)


@settings(max_examples=8, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(**DRAWS)
def test_both_rules_agree_while_the_gpu_never_evicts(tmp_path, seed, groups, prefix, cpu, rate):
    """With room for every block of the run, no hashed block ever leaves the GPU, so the CPU
    tier never holds a block the GPU lacks: the two rules give the same run, byte for byte
    (with 60 to 160 blocks they differ on these workloads, as the legacy cases show)."""
    spec = _spec(tmp_path / "wl.yaml", groups, prefix, rate, seed)
    assert _tiered(spec, 100_000, cpu, "always").stdout == _tiered(spec, 100_000, cpu,
                                                                   "on-failure").stdout
