"""Evolve benchmark files and limits as a hostile user writes them (issue 28 item 7): every
nonsense value is refused with one line naming the key (nothing truncated, defaulted or
merged), a benchmark the simulator refuses is a bad benchmark (exit 2), not the candidate's
failure, and random mutations of a benchmark never get past the loader as anything but a
valid benchmark or a BlisError."""

from __future__ import annotations

import copy
import json
import math
from typing import Any

import pytest
import yaml
from _cli import invoke
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blis_fast.errors import BlisConfigError, BlisError
from blis_fast.evolve.adapters import INITIAL_PROGRAMS
from blis_fast.evolve.benchmark import (
    DEFAULT_BENCHMARK,
    Benchmark,
    benchmark_from_dict,
    load_benchmark,
)


def _valid() -> dict[str, Any]:
    data = copy.deepcopy(DEFAULT_BENCHMARK)
    data["seeds"] = [1]
    data["workloads"] = data["workloads"][:2]
    for w in data["workloads"]:
        w["options"] = {"num_requests": 40}
    return data


def _set(path: tuple, value: Any) -> dict[str, Any]:
    data = _valid()
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return data


NONSENSE = [
    (("fitness", "ttft_ms"), math.nan, "fitness.ttft_ms"),
    (("fitness", "e2e_ms"), math.inf, "fitness.e2e_ms"),
    (("fitness", "ttft_ms"), True, "fitness.ttft_ms"),
    (("fitness", "ttft_ms"), -5.0, "fitness.ttft_ms"),
    (("fitness", "ttft_ms"), 1e300, "fitness.ttft_ms"),
    (("fitness", "ttft_ms"), "50", "fitness.ttft_ms"),
    (("fitness", "slack"), 1, "fitness: unknown key 'slack'"),
    (("fitness",), None, "fitness.kind"),
    (("fitness",), {"kind": "weights", "weights": "p99_ttft:nan"}, "fitness.weights"),
    (("workloads", 0, "options", "num_requests"), 2.5, "workloads[0].options"),
    (("workloads", 0, "options", "num_requests"), True, "workloads[0].options"),
    (("workloads", 0, "options", "bogus"), 1, "unknown option 'bogus'"),
    (("workloads", 0, "options", "metrics_path"), "x.json", "workloads[0].options.metrics_path"),
    (("workloads", 0, "options", "seed"), 3, "workloads[0].options.seed"),
    (("workloads", 0, "options"), [1], "workloads[0].options"),
    (("workloads", 1, "name"), "bursty-prefix", "workloads[1].name"),
    (("workloads", 1, "name"), "", "workloads[1].name"),
    (("workloads", 0, "spec"), "text", "workloads[0].spec"),
    (("workloads", 0, "spec_file"), "w.yaml", "spec or spec_file, not both"),
    (("workloads",), [], "workloads"),
    (("clusters",), [], "clusters"),
    (("clusters",), None, "clusters"),
    (("clusters",), [{"name": "a", "num_instances": 2}, {"name": "a", "num_instances": 3}],
     "clusters[1].name"),
    (("clusters",), [{"name": "a", "num_instances": 1.5}], "clusters[0]"),
    (("clusters",), [{"name": "a", "output_dir": "/tmp/x"}], "clusters[0].output_dir"),
    (("seeds",), [], "seeds"),
    (("seeds",), [1, 1], "seeds"),
    (("seeds",), [1.5], "seeds[0]"),
    (("seeds",), [True], "seeds[0]"),
    (("seeds",), [-1], "seeds[0]"),
    (("seeds",), [1 << 70], "seeds[0]"),
    (("tiny_requests",), 60.5, "tiny_requests"),
    (("tiny_requests",), 0, "tiny_requests"),
    (("tiny_requests",), 10**12, "tiny_requests"),
    (("baseline",), {"num_instances": 2.5}, "baseline: num_instances"),
    (("baseline",), "least-loaded", "baseline"),
    (("name",), ["x"], "name"),
    (("model",), None, "model"),
    (("extra",), 1, "unknown key 'extra'"),
]


@pytest.mark.parametrize(("path", "value", "names"), NONSENSE,
                         ids=[f"{'.'.join(map(str, p))}={v!r}"[:60] for p, v, _ in NONSENSE])
def test_nonsense_is_refused_naming_the_key(path, value, names):
    with pytest.raises(BlisConfigError) as exc:
        benchmark_from_dict(_set(path, value), "bench.yaml")
    text = str(exc.value)
    assert text.startswith("bench.yaml: ") and names in text and "\n" not in text, text


def test_a_valid_benchmark_round_trips():
    bench = benchmark_from_dict(_valid(), "bench.yaml")
    again = benchmark_from_dict(bench.to_dict(), "again")
    assert again == bench and again.digest() == bench.digest()
    assert [w.name for w in bench.workloads] == ["bursty-prefix", "shared-prompt"]


def _files(tmp_path, bench: dict) -> tuple[str, str]:
    (tmp_path / "bench.yaml").write_text(yaml.safe_dump(bench))
    (tmp_path / "cand.py").write_text(INITIAL_PROGRAMS["scorer"])
    return str(tmp_path / "cand.py"), str(tmp_path / "bench.yaml")


def test_cli_refuses_a_nan_slo_in_one_line(tmp_path):
    cand, bench = _files(tmp_path, _valid())
    (tmp_path / "bench.yaml").write_text(
        (tmp_path / "bench.yaml").read_text().replace("ttft_ms: 50.0", "ttft_ms: .nan"))
    res = invoke(["evolve", "eval", cand, "--benchmark", bench])
    assert res.code == 2 and res.stdout == ""
    assert len(res.stderr.strip().splitlines()) == 1 and "fitness.ttft_ms" in res.stderr


@pytest.mark.parametrize("stage", ["full", "tiny"])
def test_a_benchmark_the_simulator_refuses_is_exit_2(tmp_path, stage):
    """Refused by the run itself (a negative routing latency passes the option parser): the
    benchmark's fault, one line naming the option, no record on stdout."""
    data = _valid()
    data["clusters"] = [{"name": "bad", "num_instances": 4, "routing_latency": -1}]
    cand, bench = _files(tmp_path, data)
    res = invoke(["evolve", "eval", cand, "--benchmark", bench, "--stage", stage,
                  "--timeout", "30"])
    assert res.code == 2 and res.stdout == "", res
    assert len(res.stderr.strip().splitlines()) == 1
    assert "--benchmark" in res.stderr and "--routing-latency must be >= 0" in res.stderr


@pytest.mark.parametrize(("flag", "value"), [
    ("--timeout", "nan"), ("--timeout", "inf"), ("--timeout", "1e300"), ("--timeout", "-1"),
    ("--memory-mb", "1000000000000000"), ("--memory-mb", "0"), ("--memory-mb", "1"),
])
def test_absurd_limits_are_refused(tmp_path, flag, value):
    cand, bench = _files(tmp_path, _valid())
    for command in (["evolve", "eval", cand, "--benchmark", bench],
                    ["evolve", "init", "openevolve", "--out", str(tmp_path / "oe")]):
        res = invoke([*command, flag, value])
        assert res.code == 2 and flag in res.stderr, res
        assert len(res.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "oe").exists()


# ------------------------------------------------------------ random mutation (property)

_HOSTILE_VALUES = [math.nan, math.inf, -math.inf, True, False, None, -1, 0, 2.5, 1e308,
                   10**30, "", "x", [], {}, [1, 1], {"a": 1}, [None], "-1", "1e400"]


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix] if prefix else []
    if isinstance(node, dict):
        for key, value in node.items():
            out += _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            out += _paths(value, (*prefix, i))
    return out


_BASE = _valid()
_BASE_TEXT = yaml.safe_dump(_BASE).encode()
_PATHS = _paths(_BASE)


def _mutated_structure(data: st.DataObject) -> dict[str, Any]:
    tree = copy.deepcopy(_BASE)
    for _ in range(data.draw(st.integers(1, 4))):
        path = data.draw(st.sampled_from(_PATHS))
        node = tree
        try:
            for key in path[:-1]:
                node = node[key]
            op = data.draw(st.sampled_from(["set", "delete", "rename"]))
            if op == "set":
                node[path[-1]] = data.draw(st.sampled_from(_HOSTILE_VALUES))
            elif op == "delete" and isinstance(node, dict):
                del node[path[-1]]
            elif op == "rename" and isinstance(node, dict):
                node[f"{path[-1]}_"] = node.pop(path[-1])
        except (KeyError, IndexError, TypeError):
            pass  # an earlier mutation removed the path
    return tree


def _mutated_text(data: st.DataObject) -> bytes:
    base = bytearray(_BASE_TEXT)
    for _ in range(data.draw(st.integers(1, 6))):
        pos = data.draw(st.integers(0, len(base) - 1))
        op = data.draw(st.sampled_from(["flip", "insert", "delete"]))
        if op == "flip":
            base[pos] = data.draw(st.integers(0, 255))
        elif op == "insert":
            base[pos:pos] = data.draw(st.sampled_from(
                [b".nan", b"-", b"1e999", b"[]", b"{}", b"\n- ", b": ", b"&a ", b"*a", b"true",
                 b"\xff", b"\x00", b"0.5", b"99999999999999999999"]))
        else:
            del base[pos:pos + data.draw(st.integers(1, 30))]
    return bytes(base)


def _assert_sane(bench: Benchmark) -> None:
    names = [w.name for w in bench.workloads]
    assert names and len(set(names)) == len(names) and all(names)
    assert bench.clusters and bench.seeds and len(set(bench.seeds)) == len(bench.seeds)
    assert all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in bench.seeds)
    assert isinstance(bench.tiny_requests, int) and bench.tiny_requests >= 1
    if bench.fitness["kind"] == "goodput":
        assert all(math.isfinite(bench.fitness[k]) and bench.fitness[k] > 0
                   for k in ("ttft_ms", "e2e_ms"))
    for w in bench.workloads:
        n = w.options.get("num_requests", 1)
        assert isinstance(n, int | str) and not isinstance(n, bool | float)
    json.dumps(bench.to_dict(), allow_nan=False)


@settings(max_examples=300, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_random_mutations_are_valid_or_one_blis_error(data: st.DataObject, tmp_path) -> None:
    """Mutated structures and mutated YAML text of a valid benchmark: the loader returns a
    benchmark whose every figure is sane, or raises a one-line BlisError (never another
    exception)."""
    try:
        if data.draw(st.booleans()):
            bench = benchmark_from_dict(_mutated_structure(data), "bench.yaml")
        else:
            path = tmp_path / "bench.yaml"
            path.write_bytes(_mutated_text(data))
            bench = load_benchmark(str(path))
    except BlisError as exc:
        assert "\n" not in str(exc) and str(exc).strip(), repr(exc)
        return
    _assert_sane(bench)


@pytest.mark.parametrize(("timeout_s", "memory_mb"), [
    (math.nan, 512), (math.inf, 512), (1e300, 512), (0.0, 512), (True, 512), (10.0, 10**15),
    (10.0, 1), (10.0, 512.5),
])
def test_the_python_api_refuses_absurd_limits(tmp_path, timeout_s, memory_mb):
    from blis_fast.evolve.adapters import write_openevolve_files
    from blis_fast.evolve.sandbox import Evaluator, evaluate_contained

    bench = benchmark_from_dict(_valid(), "bench")
    source = INITIAL_PROGRAMS["scorer"]
    for call in (lambda: Evaluator("scorer", bench, timeout_s=timeout_s, memory_mb=memory_mb),
                 lambda: evaluate_contained(source, "scorer", bench, timeout_s=timeout_s,
                                            memory_mb=memory_mb),
                 lambda: write_openevolve_files(tmp_path / "oe", "scorer", bench,
                                                timeout_s=timeout_s, memory_mb=memory_mb)):
        with pytest.raises(BlisConfigError, match="timeout_s|memory_mb"):
            call()
    assert not (tmp_path / "oe").exists()


def test_the_evaluator_raises_on_a_benchmark_the_simulator_refuses():
    """Through the Python API (OpenEvolve's and GEPA's path) a refused benchmark raises
    instead of scoring every candidate -1."""
    from blis_fast.evolve.sandbox import Evaluator

    data = _valid()
    data["clusters"] = [{"name": "bad", "num_instances": 4, "routing_latency": -1}]
    evaluator = Evaluator("scorer", benchmark_from_dict(data, "bench"), timeout_s=30,
                          memory_mb=512, workers=1)
    with pytest.raises(BlisConfigError, match="--routing-latency must be >= 0"):
        evaluator.evaluate(INITIAL_PROGRAMS["scorer"], stage="tiny")
