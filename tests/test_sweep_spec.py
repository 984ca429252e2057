"""Sweep specs: expansion of grid/zip/random/seeds axes, configuration ids, and refusals.

A bad spec or a configuration ``blis run`` would refuse is one stderr line naming the key and
the file (with the line), exit 2, no traceback, nothing written.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _sweep import MODEL, invoke, write_spec

from blis_fast.errors import BlisConfigError, BlisInputError
from blis_fast.sweep.spec import config_id, load_sweep_plan, parse_sweep_spec

FULL = f"""\
base:
  model: {MODEL}
  num_requests: 200
grid:
  rate: [5, 10]
  routing_policy: [round-robin, least-loaded]
zip:
  prompt_tokens: [256, 512, 1024]
  output_tokens: [64, 128, 256]
random:
  samples: 4
  seed: 11
  params:
    max_num_running_reqs: {{int: [16, 256]}}
    gpu_memory_utilization: {{uniform: [0.8, 0.95]}}
    kv_transfer_bandwidth: {{loguniform: [1, 1000]}}
    scheduler: {{choice: [fcfs, sjf]}}
seeds: [1, 2]
"""


def test_axes_expand_as_a_product_with_seeds_fastest():
    plan = parse_sweep_spec(FULL, "full.yaml")
    assert len(plan.configs) == 2 * 2 * 3 * 4 * 2
    first, second = plan.configs[0].values, plan.configs[1].values
    assert (first["rate"], first["routing_policy"], first["prompt_tokens"]) == (
        5.0, "round-robin", 256)
    assert (first["seed"], second["seed"]) == (1, 2)
    assert {k: v for k, v in first.items() if k != "seed"} == {
        k: v for k, v in second.items() if k != "seed"}
    # zip varies its lists together, never crossed
    pairs = {(c.values["prompt_tokens"], c.values["output_tokens"]) for c in plan.configs}
    assert pairs == {(256, 64), (512, 128), (1024, 256)}
    # grid is the full product; the last configuration takes the last value of each axis
    assert {(c.values["rate"], c.values["routing_policy"]) for c in plan.configs} == {
        (5.0, "round-robin"), (5.0, "least-loaded"), (10.0, "round-robin"),
        (10.0, "least-loaded")}
    last = plan.configs[-1].values
    assert (last["rate"], last["routing_policy"], last["prompt_tokens"], last["seed"]) == (
        10.0, "least-loaded", 1024, 2)
    assert set(plan.varied) == {
        "rate", "routing_policy", "prompt_tokens", "output_tokens", "max_num_running_reqs",
        "gpu_memory_utilization", "kv_transfer_bandwidth", "scheduler", "seed"}
    assert "num_requests" in plan.columns and "num_requests" not in plan.varied


def test_random_axis_is_seeded_typed_and_in_range():
    plan = parse_sweep_spec(FULL, "full.yaml")
    again = parse_sweep_spec(FULL, "full.yaml")
    assert [c.values for c in plan.configs] == [c.values for c in again.configs]
    samples = {(c.values["max_num_running_reqs"], c.values["gpu_memory_utilization"],
                c.values["kv_transfer_bandwidth"], c.values["scheduler"]) for c in plan.configs}
    assert len(samples) == 4
    for mnr, gmu, bw, sched in samples:
        assert isinstance(mnr, int) and 16 <= mnr <= 256
        assert isinstance(gmu, float) and 0.8 <= gmu <= 0.95
        assert 1 <= bw <= 1000
        assert sched in ("fcfs", "sjf")
    other_seed = parse_sweep_spec(FULL.replace("seed: 11", "seed: 12"), "full.yaml")
    assert other_seed.configs[0].values != plan.configs[0].values


def test_seed_count_counts_up_from_the_default_seed_and_ids_are_deterministic():
    plan = parse_sweep_spec(f"base: {{model: {MODEL}}}\ngrid: {{rate: [1, 2]}}\nseeds: 3\n",
                            "s.yaml")
    assert [c.values["seed"] for c in plan.configs] == [42, 43, 44, 42, 43, 44]
    assert plan.configs[4].config_id == config_id(4, plan.configs[4].values)
    assert plan.configs[4].config_id.startswith("000004-")
    ids = [c.config_id for c in plan.configs]
    assert len(set(ids)) == len(ids) and ids == sorted(ids)
    # the hash part follows the values: the same values give the same id
    assert config_id(0, {"rate": 1.0, "seed": 1}) == config_id(0, {"seed": 1, "rate": 1.0})
    assert config_id(0, {"rate": 1.0}) != config_id(0, {"rate": 2.0})


def test_relative_input_paths_are_taken_from_the_spec_directory(tmp_path):
    plan = parse_sweep_spec(f"base: {{model: {MODEL}, workload_spec: w/spec.yaml}}\n",
                            str(tmp_path / "sweep.yaml"))
    assert plan.configs[0].values["workload_spec"] == "w/spec.yaml"
    assert plan.run_kwargs(plan.configs[0])["workload_spec"] == str(tmp_path / "w" / "spec.yaml")


BAD_SPECS = [
    # (spec text, expected line, words the message must contain)
    ("base: {model: m}\ngridd: {rate: [1]}\n", 2, ["'gridd'"]),
    ("base:\n  model: m\n  num_instance: 4\n", 3, ["'num_instance'"]),
    ("base:\n  model: m\n  num-instances: 4\n", 3, ["'num-instances'", "num_instances"]),
    ("base:\n  model: m\ngrid:\n  output_dir: [a, b]\n", 4, ["output_dir"]),
    ("base:\n  model: m\n  rate: 3\ngrid:\n  rate: [1, 2]\n", 5, ["'rate'", "line 3"]),
    ("base:\n  model: m\ngrid:\n  rate: [1, fast]\n", 4, ["grid.rate[1]", "--rate"]),
    ("base:\n  model: m\ngrid:\n  num_instances: [2, 2.5]\n", 4, ["num_instances[1]"]),
    ("base:\n  model: m\ngrid:\n  rate: []\n", 4, ["grid.rate"]),
    ("base:\n  model: m\nzip:\n  rate: [1, 2]\n  seed: [1]\n", 4, ["equal lengths"]),
    ("base:\n  model: m\nseeds: 0\n", 3, ["seeds"]),
    ("base:\n  model: m\n  seed: 1\nseeds: 2\n", 4, ["'seed'"]),
    ("random:\n  samples: 2\n  params:\n    rate: {normal: [1, 2]}\n", 4, ["'normal'"]),
    ("random:\n  samples: 2\n  params:\n    num_instances: {uniform: [1, 4]}\n", 4,
     ["--num-instances", "uniform"]),
    ("random:\n  samples: 2\n  params:\n    rate: {uniform: [5, 1]}\n", 4, ["low <= high"]),
    ("random:\n  samples: 2\n  params:\n    rate: {loguniform: [0, 1]}\n", 4, ["low must"]),
    ("random:\n  params:\n    rate: {uniform: [1, 5]}\n", 2, ["random.samples"]),
    ("random:\n  samples: 2\n  sead: 3\n", 3, ["'sead'"]),
    ("base: {model: m\n", 2, ["cannot parse sweep spec"]),
]


@pytest.mark.parametrize(("text", "line", "words"), BAD_SPECS,
                         ids=[f"line{c[1]}-{c[2][0]}" for c in BAD_SPECS])
def test_bad_spec_is_one_error_naming_file_line_and_key(text, line, words):
    with pytest.raises(BlisInputError) as info:
        parse_sweep_spec(text, "bad.yaml")
    message = str(info.value)
    assert message.startswith("bad.yaml:") or message.startswith("cannot parse sweep spec bad.yaml")
    assert f":{line}" in message or f"line {line}" in message, message
    for word in words:
        assert word in message, message
    assert "\n" not in message


def test_configuration_blis_run_refuses_names_the_key_its_line_and_the_configuration(tmp_path):
    spec = write_spec(tmp_path, f"base:\n  model: {MODEL}\n  num_requests: 50\ngrid:\n"
                                f"  rate: [1, 2]\n  routing_policy: [round-robin, fastest]\n")
    with pytest.raises(BlisConfigError) as info:
        load_sweep_plan(spec)
    message = str(info.value)
    assert message.startswith(f"{spec}:6: configuration 000001-"), message
    assert "routing_policy='fastest'" in message and "--routing-policy" in message
    spec = write_spec(tmp_path, f"base: {{model: {MODEL}, num_requests: 50}}\n"
                                f"zip: {{rate: [1, -2], num_instances: [1, 2]}}\n")
    with pytest.raises(BlisConfigError, match=r"sweep\.yaml:2: configuration 000001-\w+ "
                                              r"\(num_instances=2, rate=-2\.0\): --rate"):
        load_sweep_plan(spec)


CLI_REFUSALS = [
    ("base:\n  model: m\n  bogus_option: 1\n", [], "'bogus_option'"),
    (f"base:\n  model: {MODEL}\ngrid:\n  rate: [1, 0]\n", [], "--rate"),
    (f"base:\n  model: {MODEL}\ngrid:\n  scheduler: [fcfs, lifo]\n", [], "--scheduler"),
    (f"base:\n  model: {MODEL}\n  num_requests: 20\n", ["--workers", "0"], "--workers"),
    (f"base:\n  model: {MODEL}\n  num_requests: 20\n", ["--backend", "spark"], "--backend"),
    (f"base:\n  model: {MODEL}\n  num_requests: 20\n", ["--chunk-size", "0"], "--chunk-size"),
    (f"base:\n  model: {MODEL}\n  num_requests: 20\n", ["--ray-address", "x:1"],
     "--ray-address"),
]


@pytest.mark.parametrize(("text", "extra", "word"), CLI_REFUSALS,
                         ids=[c[2] for c in CLI_REFUSALS])
def test_cli_refusal_is_one_stderr_line_exit_2_and_writes_nothing(tmp_path, text, extra, word):
    spec = write_spec(tmp_path / "in", text)
    out = tmp_path / "out"
    run = invoke(["sweep", str(spec), "--out", str(out), *extra])
    assert run.code == 2, run
    assert "Traceback" not in run.stderr
    lines = run.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("blis: error:") and word in lines[0], run
    assert run.stdout == ""
    assert not out.exists()
    assert sorted(p.name for p in (tmp_path / "in").iterdir()) == ["sweep.yaml"]


def test_missing_spec_and_non_empty_out_dir_are_refused(tmp_path):
    run = invoke(["sweep", str(tmp_path / "nope.yaml"), "--out", str(tmp_path / "o")])
    assert run.code == 2 and run.stderr.count("\n") == 1 and "nope.yaml" in run.stderr
    assert not (tmp_path / "o").exists()
    spec = write_spec(tmp_path, f"base: {{model: {MODEL}, num_requests: 20}}\n")
    out = tmp_path / "busy"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    run = invoke(["sweep", str(spec), "--out", str(out)])
    assert run.code == 2 and run.stderr.count("\n") == 1 and "--resume" in run.stderr
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


def test_saturate_refuses_rate_in_the_spec_and_bad_slos(tmp_path):
    spec = write_spec(tmp_path, f"base: {{model: {MODEL}, num_requests: 20}}\n"
                                "grid: {rate: [1, 2]}\n")
    for argv, word in (
            ([str(spec), "--slo", "ttft_p99_ms<=500"], "'rate'"),
            ([str(spec), "--slo", "ttft_p99<=500"], "unknown metric"),
            ([str(spec), "--slo", "ttft_p99_ms=500"], "METRIC<=NUMBER"),
            ([str(spec), "--slo", "ttft_p99_ms<=inf"], "--slo"),
            ([str(spec), "--slo", "ttft_p99_ms<=5", "--low", "10", "--high", "5"], "--high"),
            ([str(spec), "--slo", "ttft_p99_ms<=5", "--tolerance", "0"], "--tolerance")):
        run = invoke(["saturate", *argv])
        assert run.code == 2, (argv, run)
        assert run.stderr.count("\n") == 1 and word in run.stderr, (argv, run)
        assert "Traceback" not in run.stderr


def test_infinite_rate_bound_is_refused():
    with pytest.raises(BlisInputError, match="low <= high"):
        parse_sweep_spec("random:\n  samples: 1\n  params:\n    rate: {uniform: [1, .inf]}\n",
                         "x.yaml")


def test_spec_paths_in_messages_are_the_given_path(tmp_path):
    spec = write_spec(tmp_path, "base:\n  model: m\n  nope: 1\n")
    with pytest.raises(BlisInputError, match=f"^{Path(spec)}:3: unknown option 'nope'"):
        load_sweep_plan(spec)


def test_a_new_random_distribution_is_one_table_entry(monkeypatch):
    """The docs/extending.md recipe: a ``logint`` entry makes ``{logint: [lo, hi]}`` valid."""
    import math as m

    from blis_fast.sweep import spec as S

    monkeypatch.setitem(S.RANDOM_DISTRIBUTIONS, "logint", S.RangeDistribution(
        frozenset({"int"}),
        lambda u, lo, hi: round(m.exp(m.log(lo) + (m.log(hi) - m.log(lo)) * u)),
        low_must_be_positive=True))
    plan = parse_sweep_spec("random:\n  samples: 20\n  params:\n"
                            "    max_num_running_reqs: {logint: [8, 512]}\n", "x.yaml")
    values = [c.values["max_num_running_reqs"] for c in plan.configs]
    assert all(isinstance(v, int) and 8 <= v <= 512 for v in values)
    assert min(values) < 64 < max(values)
