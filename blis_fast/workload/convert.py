"""``blis convert`` and ``blis compose`` (WL-12, DELTA-58): specs built from presets, ServeGen
data, inference-perf specs or several spec files, written as YAML the way the reference's
yaml.v3 ``Marshal`` writes them (``yaml_writer.marshal_spec``).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from typing import Any

from blis_fast.errors import BlisConfigError, BlisInputError
from blis_fast.gofmt import go_pct_f, go_quote
from blis_fast.workload.expand import expand_inference_perf, load_servegen_clients
from blis_fast.workload.spec import (
    ArrivalSpec,
    ClientSpec,
    DistSpec,
    ServeGenDataSpec,
    WorkloadSpec,
)
from blis_fast.workload.spec_yaml import load_workload_spec
from blis_fast.workload.synthesis import validate_rate
from blis_fast.workload.validate import validate_spec
from blis_fast.workload.yaml_writer import marshal_spec


# --- conversions (sim/workload/convert.go) ------------------------------------------------------
def _preset_value(preset: Mapping[str, Any] | Any, key: str) -> int:
    if isinstance(preset, Mapping):
        return int(preset.get(key, 0) or 0)
    return int(getattr(preset, key, 0) or 0)


def convert_preset(name: str, rate: float, num_requests: int, preset: Any) -> WorkloadSpec:
    """``ConvertPreset``: client ``preset-<name>``, constant arrivals, gaussian lengths."""
    if math.isnan(rate) or math.isinf(rate) or rate <= 0:
        raise BlisInputError(f"rate must be a finite positive number, got {go_pct_f(rate)}")
    if num_requests <= 0:
        raise BlisInputError(f"num_requests must be positive, got {num_requests}")

    def gauss(prefix: str) -> DistSpec:
        return DistSpec("gaussian", {
            "mean": float(_preset_value(preset, f"{prefix}_tokens")),
            "std_dev": float(_preset_value(preset, f"{prefix}_tokens_stdev")),
            "min": float(_preset_value(preset, f"{prefix}_tokens_min")),
            "max": float(_preset_value(preset, f"{prefix}_tokens_max")),
        })

    prefix_tokens = _preset_value(preset, "prefix_tokens")
    client = ClientSpec(id=f"preset-{name}", rate_fraction=1.0, arrival=ArrivalSpec("constant"),
                        input_dist=gauss("prompt"), output_dist=gauss("output"),
                        prefix_length=prefix_tokens)
    if prefix_tokens > 0:
        client.prefix_group = "shared"
    return WorkloadSpec(version="2", category="language", aggregate_rate=float(rate),
                        num_requests=int(num_requests), clients=[client])


def convert_servegen(path: str) -> WorkloadSpec:
    """``ConvertServeGen``: clients from a ServeGen directory, ``aggregate_rate: 1`` placeholder."""
    if path == "":
        raise BlisInputError("ServeGen path must not be empty")
    try:
        clients = load_servegen_clients(ServeGenDataSpec(path=path))
    except ValueError as exc:
        raise BlisInputError(f"loading ServeGen data from {path}: {exc}") from None
    return WorkloadSpec(version="2", aggregate_rate=1.0, clients=clients)


def convert_inference_perf(path: str) -> WorkloadSpec:
    """``ConvertInferencePerf``: load a spec with ``inference_perf`` and expand it (version 2)."""
    if path == "":
        raise BlisInputError("inference-perf spec path must not be empty")
    try:
        spec = load_workload_spec(path)
    except BlisInputError as exc:
        raise BlisInputError(f"loading inference-perf spec from {path}: {exc}") from None
    if spec.inference_perf is None:
        raise BlisInputError(f"file {path} does not contain an inference_perf section")
    try:
        out = expand_inference_perf(spec.inference_perf, spec.seed)
    except ValueError as exc:
        raise BlisInputError(f"expanding inference-perf spec: {exc}") from None
    out.version = "2"
    return out


def compose_specs(specs: list[WorkloadSpec]) -> WorkloadSpec:
    """``ComposeSpecs`` (WL-12, DELTA-58): clients concatenated, fractions re-weighted by rate."""
    if not specs:
        raise BlisInputError("at least one spec file required")
    merged = WorkloadSpec(version="2", category=specs[0].category)
    total = 0.0
    for s in specs:
        total += s.aggregate_rate
    if math.isnan(total) or math.isinf(total):
        raise BlisInputError(f"compose: total aggregate rate is not finite: {go_pct_f(total)}")
    merged.aggregate_rate = total
    if total == 0:
        for s in specs:
            merged.clients.extend(copy.deepcopy(s.clients))
        return merged
    if total < 0:
        raise BlisInputError(
            f"compose: total aggregate rate must be non-negative, got {go_pct_f(total)}"
        )
    for s in specs:
        weight = s.aggregate_rate / total
        for c in s.clients:
            c2 = copy.deepcopy(c)
            c2.rate_fraction *= weight
            merged.clients.append(c2)
    return merged


def spec_yaml_for_stdout(spec: WorkloadSpec) -> str:
    """``writeSpecToStdout``: validate, then marshal (``generated spec is invalid: ...``)."""
    probe = copy.copy(spec)
    probe.source = ""
    try:
        validate_spec(probe)
    except BlisInputError as exc:
        raise BlisInputError(f"generated spec is invalid: {exc}") from None
    return marshal_spec(spec)


def check_preset_flags(rate: float, num_requests: int) -> None:
    """``blis convert preset`` flag checks (before the preset is looked up); ``--rate``'s is
    its ``blis run`` row's."""
    validate_rate(rate)
    if num_requests <= 0:
        raise BlisConfigError(f"--num-requests must be > 0, got {num_requests}")


def unknown_preset(name: str) -> BlisConfigError:
    """The reference's error for a preset missing from defaults.yaml."""
    return BlisConfigError(
        f"Unknown preset {go_quote(name)}. Check defaults.yaml for available workloads."
    )
