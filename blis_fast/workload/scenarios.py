"""Built-in workload scenarios (WL-8.3): ready-made specs for common capacity questions.

Library functions, as in the reference (no ``blis run`` flag selects them): each returns a v2
``language`` spec with the given seed and aggregate rate (req/s). Write one to a file with
:func:`blis_fast.workload.yaml_writer.marshal_spec` and pass it as ``--workload-spec``, or use
:func:`write_scenario`. Figures (client mix, distributions) are the reference's
``sim/workload/scenarios.go`` at inference-sim b563c440.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from blis_fast.workload.spec import ArrivalSpec, ClientSpec, DistSpec, WorkloadSpec
from blis_fast.workload.yaml_writer import marshal_spec


def _exp(mean: float) -> DistSpec:
    return DistSpec(type="exponential", params={"mean": float(mean)})


def _gauss(mean: float, std_dev: float, lo: float, hi: float) -> DistSpec:
    return DistSpec(type="gaussian", params={"mean": float(mean), "std_dev": float(std_dev),
                                             "min": float(lo), "max": float(hi)})


def _client(cid: str, tenant: str, slo: str, fraction: float, inp: DistSpec, out: DistSpec,
            *, arrival: ArrivalSpec | None = None, streaming: bool = False,
            prefix_group: str = "") -> ClientSpec:
    return ClientSpec(id=cid, tenant_id=tenant, slo_class=slo, rate_fraction=fraction,
                      arrival=arrival or ArrivalSpec(process="poisson"), input_dist=inp,
                      output_dist=out, streaming=streaming, prefix_group=prefix_group)


def _spec(seed: int, rate: float, clients: list[ClientSpec]) -> WorkloadSpec:
    return WorkloadSpec(version="2", seed=int(seed), category="language",
                        aggregate_rate=float(rate), clients=clients)


def bursty_traffic(seed: int, rate: float) -> WorkloadSpec:
    """One bursty batch client: gamma arrivals with CV 3.5, exponential lengths 512 in / 256 out."""
    return _spec(seed, rate, [
        _client("bursty-client", "tenant-A", "batch", 1.0, _exp(512), _exp(256),
                arrival=ArrivalSpec(process="gamma", cv=3.5)),
    ])


def unfair_tenants(seed: int, rate: float) -> WorkloadSpec:
    """A bulk tenant with 90% of the traffic and long requests beside a small realtime one."""
    return _spec(seed, rate, [
        _client("low-priority-bulk", "tenant-bulk", "batch", 0.9, _exp(1024), _exp(512)),
        _client("high-priority-realtime", "tenant-realtime", "critical", 0.1,
                _gauss(128, 50, 10, 2048), _exp(64), streaming=True),
    ])


def prefix_heavy(seed: int, rate: float) -> WorkloadSpec:
    """80% of the requests share a system prompt (prefix group of the default 50 tokens)."""
    return _spec(seed, rate, [
        _client("shared-prefix", "tenant-A", "batch", 0.8, _exp(256), _exp(128),
                prefix_group="system-prompt"),
        _client("unique-prefix", "tenant-B", "standard", 0.2, _exp(512), _exp(256)),
    ])


def mixed_slo(seed: int, rate: float) -> WorkloadSpec:
    """Realtime, interactive and batch traffic in roughly equal thirds."""
    return _spec(seed, rate, [
        _client("realtime", "tenant-rt", "critical", 0.33, _gauss(64, 20, 10, 256), _exp(32),
                streaming=True),
        _client("interactive", "tenant-int", "standard", 0.34, _gauss(256, 100, 32, 2048),
                _exp(128)),
        _client("batch", "tenant-batch", "batch", 0.33, _exp(1024), _exp(512)),
    ])


SCENARIOS: dict[str, Callable[[int, float], WorkloadSpec]] = {
    "bursty-traffic": bursty_traffic,
    "unfair-tenants": unfair_tenants,
    "prefix-heavy": prefix_heavy,
    "mixed-slo": mixed_slo,
}
"""The built-in scenarios by name."""


def write_scenario(name: str, path: str | Path, *, seed: int = 42, rate: float = 10.0,
                   num_requests: int = 0) -> Path:
    """Write scenario ``name`` as a workload-spec YAML file (usable with ``--workload-spec``)."""
    if name not in SCENARIOS:
        raise KeyError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}")
    spec = SCENARIOS[name](seed, rate)
    spec.num_requests = int(num_requests)
    out = Path(path)
    out.write_text(marshal_spec(spec), encoding="utf-8")
    return out
