"""Evolution benchmarks: the workloads, cluster configurations, seeds and fitness a candidate
policy is scored on, loaded from a small YAML file (or the built-in default)."""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from blis_fast.errors import BlisConfigError
from blis_fast.files import check_yaml_limits, read_input_text

MODEL = "meta-llama/llama-3.1-8b-instruct"

FITNESS_KINDS = ("goodput", "weights")

BASELINES = {"scorer": {"routing_policy": "least-loaded"},
             "admission": {"admission_policy": "always-admit"},
             "scheduler": {"scheduler": "fcfs"}}
"""The built-in policy each target is compared with in the feedback, unless the benchmark
names its own ``baseline`` options."""


def _client(cid: str, fraction: float, prefix: int, arrival: dict, input_mean: float,
            output_mean: float, slo: str) -> dict:
    """One client of an inline workload spec (gaussian inputs, exponential outputs)."""
    client: dict[str, Any] = {
        "id": cid, "slo_class": slo, "rate_fraction": fraction, "streaming": True,
        "arrival": arrival,
        "input_distribution": {"type": "gaussian", "params": {
            "mean": input_mean, "std_dev": input_mean / 4, "min": 16, "max": 4 * input_mean}},
        "output_distribution": {"type": "exponential", "params": {"mean": output_mean}},
    }
    if prefix:
        client["prefix_group"] = f"{cid}-prompt"
        client["prefix_length"] = prefix
    return client


def _spec(rate: float, clients: list[dict]) -> dict:
    return {"version": "2", "seed": 1, "category": "language", "aggregate_rate": rate,
            "num_requests": 2000, "clients": clients}


DEFAULT_BENCHMARK: dict[str, Any] = {
    "name": "default",
    "model": MODEL,
    "clusters": [{"name": "4x", "num_instances": 4}],
    "seeds": [1, 2],
    "fitness": {"kind": "goodput", "ttft_ms": 50.0, "e2e_ms": 4000.0},
    "tiny_requests": 60,
    "workloads": [
        {"name": "bursty-prefix", "spec": _spec(420.0, [
            _client("heavy", 0.5, 512, {"process": "gamma", "cv": 3.0}, 400, 120, "batch"),
            _client("light", 0.25, 384, {"process": "poisson"}, 200, 60, "standard"),
            _client("realtime", 0.25, 0, {"process": "poisson"}, 80, 30, "critical")])},
        {"name": "shared-prompt", "spec": _spec(600.0, [
            _client("chat", 0.8, 256, {"process": "poisson"}, 64, 128, "standard"),
            _client("unique", 0.2, 0, {"process": "poisson"}, 512, 256, "batch")])},
        {"name": "many-prefixes", "spec": _spec(650.0, [
            _client(f"tenant{k}", 0.25, 320, {"process": "gamma", "cv": 2.0}, 160, 80,
                    "standard") for k in range(4)])},
    ],
}
"""3 workloads x 2 seeds, 2,000 requests each, on 4 instances; fitness = SLO goodput."""


@dataclass(frozen=True)
class Workload:
    """One workload: a name, run options, and an optional inline workload spec."""

    name: str
    options: dict[str, Any] = field(default_factory=dict)
    spec: dict[str, Any] | None = None


@dataclass(frozen=True)
class Benchmark:
    """What a candidate is scored on: every (cluster, workload, seed) run, one fitness."""

    name: str
    model: str
    clusters: tuple[dict[str, Any], ...]
    workloads: tuple[Workload, ...]
    seeds: tuple[int, ...]
    fitness: dict[str, Any]
    baseline: dict[str, Any] | None = None
    tiny_requests: int = 60

    def to_dict(self) -> dict[str, Any]:
        """The YAML/JSON form (what ``load_benchmark`` reads back)."""
        out: dict[str, Any] = {
            "name": self.name, "model": self.model, "clusters": [dict(c) for c in self.clusters],
            "seeds": list(self.seeds), "fitness": dict(self.fitness),
            "tiny_requests": self.tiny_requests,
            "workloads": [{"name": w.name, **({"options": dict(w.options)} if w.options else {}),
                           **({"spec": copy.deepcopy(w.spec)} if w.spec else {})}
                          for w in self.workloads]}
        if self.baseline is not None:
            out["baseline"] = dict(self.baseline)
        return out

    def digest(self) -> str:
        """A hash of the definition (part of the evaluation cache key)."""
        text = json.dumps(self.to_dict(), sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def subset(self, workload_names: list[str]) -> Benchmark:
        """The same benchmark on the named workloads only (in the order given)."""
        by_name = {w.name: w for w in self.workloads}
        missing = [n for n in workload_names if n not in by_name]
        if missing:
            raise BlisConfigError(f"benchmark {self.name!r}: no workload named {missing[0]!r}")
        return Benchmark(self.name, self.model, self.clusters,
                         tuple(by_name[n] for n in workload_names), self.seeds, self.fitness,
                         self.baseline, self.tiny_requests)

    def tiny(self) -> Benchmark:
        """Stage 1 of a cascade: the first workload, first cluster and seed, a few requests."""
        first = self.workloads[0]
        return Benchmark(self.name + "-tiny", self.model, self.clusters[:1],
                         (Workload(first.name, {**first.options,
                                                "num_requests": self.tiny_requests},
                                   first.spec),), self.seeds[:1], self.fitness,
                         self.baseline, self.tiny_requests)


def _fail(where: str, msg: str) -> None:
    raise BlisConfigError(f"{where}: {msg}")


MAX_SLO_MS = 1e9
"""The largest SLO a goodput fitness accepts (about 11.6 days)."""
MAX_TINY_REQUESTS = 100_000
MAX_SEED = (1 << 63) - 1
REFUSED_OPTIONS = {"trace_output": "writes a file", "metrics_path": "writes a file",
                   "results_path": "writes a file", "output_dir": "writes files",
                   "seed": "the benchmark's seeds set it", "log": "the evaluator sets it"}
"""Run options a benchmark may not set, and why."""


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _check_keys(where: str, key: str, data: dict, known: set[str]) -> None:
    for k in data:
        if k not in known:
            _fail(where, f"{key}: unknown key {k!r} (expected one of {', '.join(sorted(known))})")


def _name(where: str, key: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > 200:
        _fail(where, f"{key}: expected a non-empty name (a string), got {value!r}"[:300])
    return value


def _run_options(where: str, key: str, value: Any, model: str) -> dict[str, Any]:
    """A mapping of ``blis run`` options, checked by the run's own option parser (names,
    types: a fractional or boolean count is refused, not truncated)."""
    from blis_fast.options import build_options  # lazy: the option table

    if not isinstance(value, dict):
        _fail(where, f"{key}: expected a mapping of run options, got {type(value).__name__}")
    for name in value:
        if not isinstance(name, str):
            _fail(where, f"{key}: option names are strings, got {name!r}"[:300])
        if name in REFUSED_OPTIONS:
            _fail(where, f"{key}.{name}: not allowed in a benchmark ({REFUSED_OPTIONS[name]})")
    _check_finite(where, key, value)
    try:
        build_options({"model": model, **value}, keywords=True)
    except BlisConfigError as exc:
        _fail(where, f"{key}: {exc}")
    return dict(value)


def _check_finite(where: str, key: str, value: Any, depth: int = 0) -> None:
    """Every number inside ``value`` is finite (the benchmark stays a JSON document)."""
    if isinstance(value, float) and not math.isfinite(value):
        _fail(where, f"{key}: expected a finite number, got {value!r}")
    if depth > 50:
        _fail(where, f"{key}: nested too deeply")
    if isinstance(value, dict):
        for k, v in value.items():
            _check_finite(where, f"{key}.{k}", v, depth + 1)
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            _check_finite(where, f"{key}[{i}]", v, depth + 1)


def _check_spec(where: str, key: str, spec: dict) -> None:
    """An inline (or read) workload spec through the run's own strict parser and validator,
    so a NaN rate or an unknown field is the benchmark's error at load time."""
    from blis_fast.errors import BlisInputError  # lazy: spec checks only
    from blis_fast.workload.spec_yaml import parse_workload_spec  # lazy: spec checks only
    from blis_fast.workload.validate import validate_spec  # lazy: spec checks only

    _check_finite(where, key, spec)
    try:
        text = yaml.safe_dump(spec, sort_keys=False)
    except (yaml.YAMLError, RecursionError, ValueError):
        _fail(where, f"{key}: not a plain mapping of YAML values")
    try:
        validate_spec(parse_workload_spec(text, key))
    except (BlisInputError, BlisConfigError) as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        _fail(where, f"{key}: {first}")


def _list(where: str, key: str, data: dict, default: list) -> list:
    """``data[key]``: absent gives ``default``; present, a non-empty list."""
    if key not in data:
        return list(default)
    value = data[key]
    if not isinstance(value, list) or not value:
        _fail(where, f"{key}: expected a non-empty list, got {value!r}"[:300])
    return value


def _fitness(where: str, data: dict) -> dict[str, Any]:
    fitness = data.get("fitness", {"kind": "goodput", "ttft_ms": 100.0, "e2e_ms": 4000.0})
    if not isinstance(fitness, dict) or fitness.get("kind") not in FITNESS_KINDS:
        _fail(where, f"fitness.kind: expected one of {', '.join(FITNESS_KINDS)}")
    if fitness["kind"] == "weights":
        # lazy: a weights fitness only
        from blis_fast.output.fitness import FITNESS_KEYS, parse_fitness_weights

        _check_keys(where, "fitness", fitness, {"kind", "weights"})
        if not isinstance(fitness.get("weights"), str):
            _fail(where, "fitness.weights: expected a string of key:value pairs")
        try:
            weights = parse_fitness_weights(fitness["weights"])
        except (BlisConfigError, ValueError) as exc:
            _fail(where, f"fitness.weights: {exc}")
        if not weights or any(k not in FITNESS_KEYS for k in weights):
            _fail(where, f"fitness.weights: expected key:value pairs of {', '.join(FITNESS_KEYS)}")
        if any(not math.isfinite(v) or v < 0 for v in weights.values()):
            _fail(where, "fitness.weights: each weight must be a finite number >= 0")
        return dict(fitness)
    _check_keys(where, "fitness", fitness, {"kind", "ttft_ms", "e2e_ms"})
    for key in ("ttft_ms", "e2e_ms"):
        value = fitness.get(key)
        if not _is_number(value) or not math.isfinite(value) or not 0 < value <= MAX_SLO_MS:
            _fail(where, f"fitness.{key}: expected a number of milliseconds in (0, "
                         f"{MAX_SLO_MS:g}], got {value!r}"[:300])
    return {"kind": "goodput", "ttft_ms": float(fitness["ttft_ms"]),
            "e2e_ms": float(fitness["e2e_ms"])}


def benchmark_from_dict(data: Any, where: str = "benchmark") -> Benchmark:
    """Validate a benchmark mapping strictly; each error is one line naming the file and key
    (no value is truncated, defaulted or merged: an empty list, a fractional count, a NaN or
    boolean SLO, a duplicate name or an unknown key is refused)."""
    if not isinstance(data, dict):
        _fail(where, "expected a mapping")
    known = {"name", "model", "clusters", "workloads", "seeds", "fitness", "baseline",
             "tiny_requests"}
    for key in data:
        if key not in known:
            _fail(where, f"unknown key {key!r} (expected one of {', '.join(sorted(known))})")
    name = _name(where, "name", data.get("name", "benchmark"))
    model = _name(where, "model", data.get("model", MODEL))
    if "workloads" not in data:
        _fail(where, "workloads: at least one workload is needed")
    workloads = []
    for i, w in enumerate(_list(where, "workloads", data, [])):
        if not isinstance(w, dict) or not isinstance(w.get("name"), str):
            _fail(where, f"workloads[{i}]: expected a mapping with a name")
        extra = set(w) - {"name", "options", "spec", "spec_file"}
        if extra:
            _fail(where, f"workloads[{i}]: unknown key {sorted(extra)[0]!r}")
        wname = _name(where, f"workloads[{i}].name", w["name"])
        if any(x.name == wname for x in workloads):
            _fail(where, f"workloads[{i}].name: {wname!r} is used by an earlier workload")
        if "spec" in w and "spec_file" in w:
            _fail(where, f"workloads[{i}]: give spec or spec_file, not both")
        if "spec" in w and not isinstance(w["spec"], dict):
            _fail(where, f"workloads[{i}].spec: expected a mapping (an inline workload spec)")
        if "spec_file" in w and (not isinstance(w["spec_file"], str) or not w["spec_file"]):
            _fail(where, f"workloads[{i}].spec_file: expected a path")
        spec = w.get("spec")
        if "spec_file" in w:
            base = Path(where).parent if where != "benchmark" else Path.cwd()
            path = base / str(w["spec_file"])
            try:  # the checked reader: no FIFO, device or huge file; UTF-8; YAML limits
                text = read_input_text(path)
                check_yaml_limits(text)
                spec = yaml.safe_load(text)
            except OSError as exc:
                _fail(where, f"workloads[{i}].spec_file: cannot read {path}: {exc.strerror}")
            except UnicodeDecodeError:
                _fail(where, f"workloads[{i}].spec_file: {path} is not UTF-8 text")
            except yaml.YAMLError as exc:
                _fail(where, f"workloads[{i}].spec_file: {path} is not valid YAML: "
                             f"{(str(exc).splitlines() or [''])[0]}")
        if spec is not None and not isinstance(spec, dict):
            _fail(where, f"workloads[{i}]: options and spec must be mappings")
        if spec is not None:
            _check_spec(where, f"workloads[{i}].spec", spec)
        options = _run_options(where, f"workloads[{i}].options", w.get("options", {}), model)
        if spec is not None and "workload_spec" in options:
            _fail(where, f"workloads[{i}].options.workload_spec: the workload has a spec")
        workloads.append(Workload(wname, options, spec))
    clusters = []
    for i, c in enumerate(_list(where, "clusters", data,
                                [{"name": "default", "num_instances": 4}])):
        if not isinstance(c, dict):
            _fail(where, f"clusters[{i}]: expected a mapping of run options")
        opts = {k: v for k, v in c.items() if k != "name"}
        cname = _name(where, f"clusters[{i}].name", c.get("name", f"cluster{i}"))
        if any(x.get("name", f"cluster{j}") == cname for j, x in enumerate(clusters)):
            _fail(where, f"clusters[{i}].name: {cname!r} is used by an earlier cluster")
        clusters.append({**({"name": c["name"]} if "name" in c else {}),
                         **_run_options(where, f"clusters[{i}]", opts, model)})
    seeds = _list(where, "seeds", data, [1])
    for i, seed in enumerate(seeds):
        if not _is_int(seed) or not 0 <= seed <= MAX_SEED:
            _fail(where, f"seeds[{i}]: expected an integer in [0, 2^63), got {seed!r}"[:300])
    if len(set(seeds)) != len(seeds):
        _fail(where, "seeds: a seed is listed twice")
    fitness = _fitness(where, data)
    baseline = data.get("baseline")
    if baseline is not None:
        baseline = _run_options(where, "baseline", baseline, model)
    tiny = data.get("tiny_requests", 60)
    if not _is_int(tiny) or not 1 <= tiny <= MAX_TINY_REQUESTS:
        _fail(where, f"tiny_requests: expected an integer in [1, {MAX_TINY_REQUESTS}], "
                     f"got {tiny!r}"[:300])
    return Benchmark(name, model, tuple(clusters), tuple(workloads), tuple(seeds), fitness,
                     baseline, tiny)


def default_benchmark() -> Benchmark:
    """The built-in benchmark (see ``DEFAULT_BENCHMARK``)."""
    return benchmark_from_dict(copy.deepcopy(DEFAULT_BENCHMARK), "default benchmark")


def load_benchmark(path: str | os.PathLike | None) -> Benchmark:
    """Read a benchmark YAML file; ``None`` gives the default benchmark."""
    if path is None:
        return default_benchmark()
    try:
        text = read_input_text(path)
        check_yaml_limits(text)  # depth and alias bounds before composing
        data = yaml.safe_load(text)
    except OSError as exc:
        raise BlisConfigError(f"--benchmark: cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise BlisConfigError(f"--benchmark: {path} is not UTF-8 text") from None
    except yaml.YAMLError as exc:
        first = str(exc).splitlines()[0]
        raise BlisConfigError(f"--benchmark: {path} is not valid YAML: {first}") from None
    return benchmark_from_dict(data, str(path))


def spec_file(spec: dict[str, Any], seed: int) -> str:
    """Write ``spec`` with ``seed`` to a content-addressed temporary file; return its path."""
    body = yaml.safe_dump({**spec, "seed": seed}, sort_keys=True)
    digest = hashlib.sha256(body.encode()).hexdigest()[:20]
    path = Path(tempfile.gettempdir()) / f"blis-evolve-{digest}.yaml"
    if not path.exists():
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(body)
        os.replace(tmp, path)
    return str(path)


def run_plan(bench: Benchmark) -> list[tuple[str, str, int, dict[str, Any]]]:
    """Every run of the benchmark: (cluster name, workload name, seed, run options)."""
    plan = []
    for ci, cluster in enumerate(bench.clusters):
        cname = str(cluster.get("name", f"cluster{ci}"))
        copts = {k: v for k, v in cluster.items() if k != "name"}
        for w in bench.workloads:
            for seed in bench.seeds:
                opts: dict[str, Any] = {"model": bench.model, "log": "error", **copts,
                                        **w.options}
                if w.spec is not None:
                    spec = dict(w.spec)
                    if "num_requests" in w.options:
                        spec["num_requests"] = w.options["num_requests"]
                        opts.pop("num_requests")
                    opts["workload_spec"] = spec_file(spec, seed)
                else:
                    opts["seed"] = seed
                plan.append((cname, w.name, seed, opts))
    return plan
