"""Random, valid ``blis run`` configurations for differential testing (seeded, reproducible).

A configuration is a dict ``{"id": str, "args": [flag, value, ...], "files": {name: text}}``:
``args`` omit the output flags (the runner adds them) and name files by their bare name (the
runner writes ``files`` into the run folder). Only flags and values the reference accepts are
drawn, except in the deliberately invalid configurations (``"invalid": true``), which both sides
must refuse; ``tests/test_differential_tool.py`` (and ``test_differential_offload.py``) check that
blis_fast accepts every valid one and refuses every invalid one with exit code 2. Four families:
'april' (flags of the April reference), 'august' (P/D pools and the autoscaler), 'lora' (LoRA
adapters) and 'offload' (the KV offload tier chain), the last three for the August reference. A
configuration may carry ``"blis_fast_args"``: flags only blis_fast is given (an opt-in that selects
the August rule the reference applies unasked).
"""

from __future__ import annotations

import random
from typing import Any

import yaml

# (model id, roofline TP choices, trained-physics TP choices): every bundled model_configs/
# folder but glm-5.2-fp8 (its size makes KV auto-sizing refuse most hardware); trained-physics
# needs the attention and KV head counts divisible by TP, hence its shorter lists.
MODELS: tuple[tuple[str, tuple[int, ...], tuple[int, ...]], ...] = (
    ("meta-llama/llama-3.1-8b-instruct", (1, 2, 4, 8), (1, 2, 4, 8)),
    ("codellama/codellama-34b-instruct-hf", (1, 2, 4, 8), (1, 2, 4, 8)),
    ("qwen/qwen3-14b", (1, 2, 4, 8), (1, 2, 4, 8)),
    ("qwen/qwen2.5-7b-instruct", (1, 2, 4, 8), (1, 2, 4)),
    ("redhatai/llama-4-scout-17b-16e-instruct-fp8-dynamic", (1, 2, 4, 8), (1, 2, 4, 8)),
    ("deepseek-ai/deepseek-v2-lite", (1, 2, 4, 8), (1, 2, 4, 8)),
    ("meta-llama/llama-2-7b-hf", (1, 2, 4, 8), (1, 2, 4, 8)),
    ("meta-llama/llama-3.1-70b-instruct", (2, 4, 8), (2, 4, 8)),
    ("mistralai/mistral-nemo-instruct-2407", (1, 2, 4, 8), (1, 2, 4, 8)),
    ("mistralai/mixtral-8x7b-v0.1", (1, 2, 4, 8), (1, 2, 4, 8)),
    ("qwen/qwen3-30b-a3b", (1, 2, 4, 8), (1, 2, 4)),
    ("01-ai/yi-34b", (1, 2, 4, 8), (1, 2, 4, 8)),
)
MODELS_WITH_DEFAULTS = frozenset({
    "meta-llama/llama-3.1-8b-instruct", "codellama/codellama-34b-instruct-hf", "qwen/qwen3-14b",
    "qwen/qwen2.5-7b-instruct", "redhatai/llama-4-scout-17b-16e-instruct-fp8-dynamic"})
"""Models with a ``defaults:`` entry in defaults.yaml (hardware and TP may be left out)."""
HARDWARE = ("H100", "A100-SXM", "A100-80", "L40S")
ROUTING = ("round-robin", "least-loaded", "always-busiest", "weighted")
SCORERS = ("prefix-affinity", "precise-prefix-cache", "no-hit-lru", "queue-depth",
           "kv-utilization", "load-balance", "active-requests", "running-requests", "load-aware",
           "vllm-dp")
SCHEDULERS = ("fcfs", "priority-fcfs", "reverse-priority", "sjf")
AUGUST_SCHEDULERS = ("fcfs", "sjf")
"""The August family's schedulers: the August reference flipped the priority schedulers' order
(lower value first, vLLM's convention) and blis_fast's engine keeps April's, so priority-fcfs and
reverse-priority would differ by design, not by a fault."""
PRIORITIES = ("constant", "slo-based", "inverted-slo")
PRESETS = ("chatbot", "contentgen", "summarization", "multidoc")
SLO_CLASSES = ("", "critical", "standard", "sheddable", "batch", "background")


def _flag(args: list[str], name: str, value: Any) -> None:
    args += [f"--{name}", str(value)]


def _length_flags(rng: random.Random, args: list[str]) -> None:
    """Prompt/output length distribution flags (mean and stdev within [min, max])."""
    for kind, lo, hi in (("prompt", 16, 2048), ("output", 4, 512)):
        if rng.random() < 0.7:
            mean = rng.randint(lo, hi)
            low = 2  # blis run's default --*-tokens-min
            _flag(args, f"{kind}-tokens", mean)
            if rng.random() < 0.5:
                low = rng.randint(2, max(2, mean // 2))
                _flag(args, f"{kind}-tokens-min", low)
                _flag(args, f"{kind}-tokens-max", rng.randint(mean, 4 * mean))
            # the reference wants the stdev, like the mean, within [min, max]
            _flag(args, f"{kind}-tokens-stdev", rng.randint(low, max(low, mean // 2)))


def _dist(rng: random.Random, lo: int, hi: int, heavy: bool = False) -> dict[str, Any]:
    """A spec length distribution (gaussian, exponential or constant; with ``heavy`` also
    pareto-lognormal and inline empirical PDFs)."""
    mean = rng.randint(lo, hi)
    kinds = ("gaussian", "exponential", "constant") + (
        ("pareto_lognormal", "empirical") * 2 if heavy else ())
    kind = rng.choice(kinds)
    if kind == "pareto_lognormal":
        return {"type": "pareto_lognormal", "params": {
            "alpha": round(rng.uniform(1.2, 3.0), 2), "xm": max(1, mean // 4),
            "mu": round(rng.uniform(2.0, 6.0), 2), "sigma": round(rng.uniform(0.2, 1.2), 2),
            "mix_weight": round(rng.uniform(0.0, 1.0), 2)}}
    if kind == "empirical":
        bins = sorted(rng.sample(range(lo, hi + 1), rng.randint(1, 5)))
        return {"type": "empirical",
                "params": {str(b): round(rng.uniform(0.05, 1.0), 3) for b in bins}}
    if kind == "gaussian":
        return {"type": "gaussian", "params": {"mean": mean, "std_dev": rng.randint(0, mean // 2),
                                               "min": max(1, mean // 4), "max": mean * 3}}
    if kind == "exponential":
        return {"type": "exponential", "params": {"mean": mean}}
    return {"type": "constant", "params": {"value": mean}}


def _arrival(rng: random.Random) -> dict[str, Any]:
    process = rng.choice(("poisson", "constant", "gamma", "weibull"))
    out: dict[str, Any] = {"process": process}
    if process in ("gamma", "weibull") and rng.random() < 0.7:
        out["cv"] = round(rng.uniform(0.3, 3.0), 2)
    return out


def _client(rng: random.Random, i: int, multi_turn: bool, groups: list[str],
            extended: bool = False) -> dict[str, Any]:
    client: dict[str, Any] = {
        "id": f"client-{i}", "tenant_id": f"tenant-{rng.randint(0, 2)}",
        "slo_class": rng.choice(SLO_CLASSES), "rate_fraction": round(rng.uniform(0.1, 1.0), 2),
        "streaming": rng.random() < 0.5, "arrival": _arrival(rng),
        "input_distribution": _dist(rng, 16, 1024, extended),
        "output_distribution": _dist(rng, 4, 256, extended)}
    if extended and rng.random() < 0.3:  # per-client deadline, µs (0 = none)
        client["timeout"] = rng.choice((0, 200_000, 1_000_000, 5_000_000))
    if groups and rng.random() < 0.5:
        client["prefix_group"] = rng.choice(groups)
        if rng.random() < 0.7:
            client["prefix_length"] = rng.choice((16, 64, 200, 512))
    if multi_turn:
        client["reasoning"] = {
            "reason_ratio_distribution": {
                "type": "gaussian", "params": {"mean": 0, "std_dev": 0, "min": 0, "max": 0}},
            "multi_turn": {"max_rounds": rng.randint(1, 4),
                           "think_time_us": rng.choice((0, 100_000, 500_000)),
                           "context_growth": rng.choice(("", "accumulate"))}}
        if rng.random() < 0.6:
            client["closed_loop"] = rng.random() < 0.5
    if rng.random() < 0.15:
        start = rng.randint(0, 2_000_000)
        client["lifecycle"] = {"windows": [{"start_us": start,
                                            "end_us": start + rng.randint(1_000_000, 20_000_000)}]}
    return client


def _cohort(rng: random.Random, i: int) -> dict[str, Any]:
    cohort: dict[str, Any] = {
        "id": f"cohort-{i}", "population": rng.randint(1, 5),
        "tenant_id": f"tenant-c{i}", "slo_class": rng.choice(SLO_CLASSES),
        "rate_fraction": round(rng.uniform(0.1, 1.0), 2), "arrival": _arrival(rng),
        "input_distribution": _dist(rng, 16, 512), "output_distribution": _dist(rng, 4, 128)}
    shape = rng.choice(("", "spike", "diurnal", "drain"))
    if shape == "spike":
        cohort["spike"] = {"start_time_us": rng.randint(0, 3_000_000),
                           "duration_us": rng.randint(500_000, 5_000_000)}
    elif shape == "diurnal":
        cohort["diurnal"] = {"peak_hour": rng.randint(0, 23),
                             "peak_to_trough_ratio": round(rng.uniform(1.0, 5.0), 2)}
    elif shape == "drain":
        cohort["drain"] = {"start_time_us": rng.randint(0, 3_000_000),
                           "ramp_duration_us": rng.randint(500_000, 5_000_000)}
    return cohort


def workload_spec(rng: random.Random, max_requests: int = 200,
                  extended: bool = False) -> dict[str, Any]:
    """A random v2 workload spec: rate clients (optionally multi-turn, open or closed loop,
    with prefix groups and lifecycles) and cohorts, or concurrency clients alone."""
    spec: dict[str, Any] = {"version": "2", "seed": rng.randint(1, 10_000),
                            "num_requests": rng.randint(5, max_requests)}
    if rng.random() < 0.15:
        spec["clients"] = [{"id": f"users-{i}", "concurrency": rng.randint(1, 8),
                            "think_time_us": rng.choice((0, 50_000, 300_000)),
                            "input_distribution": _dist(rng, 16, 1024),
                            "output_distribution": _dist(rng, 4, 256)}
                           for i in range(rng.randint(1, 2))]
        return spec
    spec["aggregate_rate"] = round(rng.uniform(1.0, 80.0), 1)
    groups = [f"group-{g}" for g in range(rng.randint(0, 2))]
    multi_turn = rng.random() < 0.35
    spec["clients"] = [_client(rng, i, multi_turn and rng.random() < 0.8, groups, extended)
                       for i in range(rng.randint(1, 3))]
    if rng.random() < 0.25:
        spec["cohorts"] = [_cohort(rng, i) for i in range(rng.randint(1, 2))]
    if rng.random() < 0.15:
        spec["horizon"] = rng.randint(2_000_000, 30_000_000)
    return spec


FAMILIES = ("april", "august", "lora", "offload")
"""Configuration families: 'april' (flags of the April reference ``b563c440``), 'august' (P/D
pools and the autoscaler, flags and bundle keys of the August reference ``f90a1e3a``), 'lora'
(LoRA multi-adapter serving) and 'offload' (the KV offload tier chain), the last two also for
the August reference."""
INVALID_SHARE = 0.06
"""Share of April-family configurations that are deliberately invalid (both sides must refuse)."""
FITNESS_KEYS = ("throughput", "tokens_per_sec", "p99_ttft", "p50_ttft", "mean_ttft", "p99_e2e",
                "p50_e2e", "mean_e2e")
VLLM_VERSIONS = ("vllm/vllm-openai:v0.8.4", "vllm/vllm-openai:v0.10.1.1",
                 "vllm/vllm-openai:v0.11.0")
_ROWS: list[dict[str, Any]] = []


def large_requests(max_requests: int) -> int:
    """The request count of the occasional large draw: 15 x ``max_requests``, at most 3000."""
    return max(max_requests, min(3000, 15 * max_requests))


def _coefficient_row(rng: random.Random) -> dict[str, Any]:
    """A fitted ``models:`` row of the project's bundled defaults.yaml (model, GPU, TP, vLLM
    version): ``--vllm-version`` picks among a model's rows."""
    if not _ROWS:
        from pathlib import Path

        text = (Path(__file__).resolve().parents[2] / "defaults.yaml").read_text()
        _ROWS.extend(yaml.safe_load(text)["models"])
    return rng.choice(_ROWS)


def _admission(rng: random.Random, args: list[str], files: dict[str, str]) -> None:
    """An admission policy (flags, or a policy bundle for tier-shed / gaie-legacy options) and
    sometimes an admission latency."""
    policy = rng.choice(("", "token-bucket", "reject-all", "tier-shed", "gaie-legacy"))
    if policy == "token-bucket":
        _flag(args, "admission-policy", "token-bucket")
        _flag(args, "token-bucket-capacity", rng.choice((2000, 10_000, 50_000)))
        _flag(args, "token-bucket-refill-rate", rng.choice((500, 5000, 20_000)))
    elif policy in ("tier-shed", "gaie-legacy") and rng.random() < 0.5:
        admission: dict[str, Any] = {"policy": policy}
        if policy == "tier-shed":
            admission["tier_shed_threshold"] = rng.choice((0, 1, 4, 16))
            admission["tier_shed_min_priority"] = rng.choice((-2, 0, 3, 4))
        else:
            admission["gaie_qd_threshold"] = rng.choice((1.0, 5.0, 20.0))
            admission["gaie_kv_threshold"] = rng.choice((0.3, 0.8, 1.0))
        files["policy.yaml"] = yaml.safe_dump({"admission": admission}, sort_keys=False)
        _flag(args, "policy-config", "policy.yaml")
    elif policy:
        _flag(args, "admission-policy", policy)
    if rng.random() < 0.3:
        _flag(args, "admission-latency", rng.choice((0, 100, 1000, 5000)))


def _extended_flags(rng: random.Random, args: list[str], instances: int) -> None:
    """Routing latency, cache-signal delay, fitness weights, GPU memory utilisation and the
    (validated, ignored) offload threshold."""
    if instances > 1 and rng.random() < 0.4:
        _flag(args, "routing-latency", rng.choice((0, 50, 500, 3000)))
    if instances > 1 and rng.random() < 0.4:
        _flag(args, "cache-signal-delay", rng.choice((0, 10_000, 50_000, 200_000)))
    if rng.random() < 0.3:
        keys = rng.sample(FITNESS_KEYS, rng.randint(1, 3))
        _flag(args, "fitness-weights", ",".join(f"{k}:{rng.choice((0.2, 0.5, 1, 2))}"
                                                for k in keys))
    if rng.random() < 0.3:
        _flag(args, "gpu-memory-utilization", rng.choice((0.5, 0.7, 0.85, 0.95, 1.0)))
    if rng.random() < 0.2:
        _flag(args, "kv-offload-threshold", rng.choice((0, 0.5, 0.9, 1)))


INVALID_FLAGS: tuple[tuple[str, str], ...] = (
    ("--gpu-memory-utilization", "1.5"), ("--gpu-memory-utilization", "0"),
    ("--kv-offload-threshold", "1.5"), ("--cache-signal-delay", "-1"),
    ("--routing-latency", "-5"), ("--admission-latency", "-5"),
    ("--fitness-weights", "throughput:-1"), ("--fitness-weights", "throughput"),
    ("--admission-policy", "nope"), ("--routing-policy", "nope"), ("--scheduler", "nope"),
    ("--priority-policy", "nope"), ("--num-instances", "0"), ("--max-num-running-reqs", "0"),
    ("--latency-model", "nope"), ("--token-bucket-capacity", "-1"),
)
"""Flag values both references refuse."""
INVALID_SPECS: tuple[dict[str, Any], ...] = (
    {"type": "nope", "params": {"mean": 10}},
    {"type": "pareto_lognormal", "params": {"alpha": 2.0, "xm": 10}},  # parameters missing
    {"type": "empirical", "params": {}},
    {"type": "empirical", "params": {"ten": 1.0}},
)
"""Input distributions of a workload spec that both references refuse."""


def invalid_config(rng: random.Random, config_id: str) -> dict[str, Any]:
    """A small configuration with one deliberately invalid input (a flag value, a distribution
    of the workload spec or a negative per-client timeout); both sides must refuse it."""
    args = ["--model", "meta-llama/llama-3.1-8b-instruct", "--num-requests", "8",
            "--seed", str(rng.randint(1, 1000))]
    files: dict[str, str] = {}
    kind = rng.choice(("flag", "flag", "spec"))
    if kind == "flag":
        flag, value = rng.choice(INVALID_FLAGS)
        if flag == "--token-bucket-capacity":
            args += ["--admission-policy", "token-bucket"]
        if flag in ("--routing-latency", "--cache-signal-delay"):
            args += ["--num-instances", "2"]
        args += [flag, value]
    else:
        client: dict[str, Any] = {"id": "c", "rate_fraction": 1.0, "arrival": {"process": "poisson"},
                                  "input_distribution": _dist(rng, 16, 256),
                                  "output_distribution": _dist(rng, 4, 64)}
        if rng.random() < 0.25:
            client["timeout"] = -rng.randint(1, 1000)
        else:
            client[rng.choice(("input_distribution", "output_distribution"))] = dict(
                rng.choice(INVALID_SPECS))
        spec = {"version": "2", "seed": 1, "num_requests": 8, "aggregate_rate": 10.0,
                "clients": [client]}
        files["workload.yaml"] = yaml.safe_dump(spec, sort_keys=False)
        args = args[:2] + ["--workload-spec", "workload.yaml"]
    return {"id": config_id, "args": args, "files": files, "invalid": True}


AUGUST_MODELS = ("meta-llama/llama-3.1-8b-instruct", "meta-llama/llama-3.1-8b-instruct",
                 "qwen/qwen3-14b", "mistralai/mistral-nemo-instruct-2407",
                 "qwen/qwen3-30b-a3b", "qwen/qwen2.5-7b-instruct")
"""Models of the August family (two with an explicit ``head_dim`` in config.json)."""
GPU_MEMORY_GIB = {"H100": 80, "A100-80": 80, "A100-SXM": 80, "L40S": 48}


def _node_pools(rng: random.Random, needed: int) -> list[dict[str, Any]]:
    """One or two node pools with at least ``needed`` GPUs in all (first-fit placement)."""
    pools = []
    for n in range(rng.choice((1, 1, 2))):
        gpu = rng.choice(("H100", "H100", "A100-80"))
        per_node = rng.choice((1, 2, 4, 8))
        nodes = max(1, -(-needed // per_node)) + rng.randint(0, 2)
        pools.append({"name": f"pool{n}", "gpu_type": gpu, "gpus_per_node": per_node,
                      "gpu_memory_gib": GPU_MEMORY_GIB[gpu], "initial_nodes": nodes,
                      "max_nodes": nodes + rng.randint(0, 2)})
    return pools


def _autoscaler(rng: random.Random) -> dict[str, Any]:
    """An ``autoscaler`` bundle section: the saturation analyzer's defaults or custom values."""
    section: dict[str, Any] = {
        "interval_us": rng.choice((7_000, 20_000, 50_000, 130_000, 500_000, 1_000_000)),
        "scale_up_stabilization_window_us": rng.choice((0, 0, 60_000, 500_000)),
        "scale_down_stabilization_window_us": rng.choice((0, 300_000, 2_000_000, 8_000_000))}
    if rng.random() < 0.4:
        delay = rng.choice((0.0, 0.05, 0.5))
        section["hpa_scrape_delay"] = {"mean": delay, "stddev": round(delay / 2, 3)}
    if rng.random() < 0.5:  # custom analyzer thresholds (else the defaults 0.8/0.8/0.4/512)
        up = rng.choice((0.6, 0.8, 0.9))
        section["analyzer"] = {"kv_cache_threshold": rng.choice((0.5, 0.8, 1.0)),
                               "scale_up_threshold": up,
                               "scale_down_boundary": rng.choice((0.2, 0.4)),
                               "avg_input_tokens": rng.choice((128, 512, 2048))}
    return section


def august_config(rng: random.Random, config_id: str, max_requests: int = 200
                  ) -> dict[str, Any]:
    """A P/D and/or autoscaler configuration for the August reference: prefill/decode/shared
    pools with per-pool TP, hardware and scorers, KV transfer settings; node pools, instance
    lifecycle and the autoscaler (saturation or custom analyzer) in a policy bundle; an explicit
    snapshot refresh (the two references' defaults differ)."""
    args: list[str] = []
    files: dict[str, str] = {}
    model = rng.choice(AUGUST_MODELS)
    _flag(args, "model", model)
    _flag(args, "latency-model", "roofline")
    tp = rng.choice((1, 1, 2))
    _flag(args, "hardware", "H100")
    _flag(args, "tp", tp)
    _flag(args, "seed", rng.randint(1, 100_000))
    # blis_fast refuses P/D pools together with node pools or the autoscaler (the instances it
    # adds would serve no pool), so the two are drawn apart
    kind = rng.choice(("pd", "pd", "autoscaler", "autoscaler", "autoscaler"))
    instances = 0
    if kind == "pd":
        prefill, decode = rng.randint(1, 3), rng.randint(1, 3)
        shared = rng.choice((0, 0, 1))
        instances = prefill + decode + shared
        _flag(args, "num-instances", instances)
        _flag(args, "prefill-instances", prefill)
        _flag(args, "decode-instances", decode)
        if shared:
            _flag(args, "prefill-decode-instances", shared)
        decider = rng.choice(("always", "always", "prefix-threshold", "never"))
        _flag(args, "pd-decider", decider)
        if decider == "prefix-threshold":
            _flag(args, "pd-prefix-threshold", rng.choice((16, 128, 512)))
        if rng.random() < 0.4:
            _flag(args, "prefill-tp", rng.choice((1, 2)))
        if rng.random() < 0.4:
            _flag(args, "decode-tp", rng.choice((1, 2)))
        if rng.random() < 0.2:
            _flag(args, "decode-hardware", "A100-80")
        if rng.random() < 0.5:
            _flag(args, "pd-transfer-bandwidth", rng.choice((5, 25, 100)))
            _flag(args, "pd-transfer-base-latency", rng.choice((0, 0.05, 1)))
        if rng.random() < 0.3:
            args.append("--pd-transfer-contention")
        if rng.random() < 0.3:
            _flag(args, "routing-policy", "weighted")
            _flag(args, "prefill-routing-scorers", "queue-depth:1,kv-utilization:1")
            _flag(args, "decode-routing-scorers", rng.choice(("load-balance:1", "queue-depth:2")))
    else:
        instances = rng.randint(1, 4)
        _flag(args, "num-instances", instances)
        if instances > 1:
            _flag(args, "routing-policy", rng.choice(ROUTING))
    bundle: dict[str, Any] = {}
    if kind == "autoscaler":
        bundle["node_pools"] = _node_pools(rng, instances * tp + rng.randint(0, 4) * tp)
        loading = rng.choice((0.0, 0.2, 0.5, 2.0))
        bundle["instance_lifecycle"] = {
            "loading_delay": {"mean": loading, "stddev": round(loading / 4, 3)},
            "warm_start_initial_instances": rng.random() < 0.8}
    if kind == "autoscaler":
        bundle["autoscaler"] = _autoscaler(rng)
    if bundle:
        files["policy.yaml"] = yaml.safe_dump(bundle, sort_keys=False)
        _flag(args, "policy-config", "policy.yaml")
    _flag(args, "snapshot-refresh-interval", rng.choice((0, 0, 13_000, 50_000, 100_000)))
    if rng.random() < 0.2:
        _flag(args, "scheduler", rng.choice(AUGUST_SCHEDULERS))
    if rng.random() < 0.2:
        _flag(args, "total-kv-blocks", rng.choice((2000, 5000, 20_000)))
    spec = workload_spec(rng, max_requests) if rng.random() < 0.3 else None
    if spec is not None:  # the August reference wants slo_class on every entry or on none
        entries = spec.get("clients", []) + spec.get("cohorts", [])
        every = rng.random() < 0.5
        for entry in entries:
            if every:
                entry["slo_class"] = entry.get("slo_class") or rng.choice(SLO_CLASSES[1:])
            else:
                entry.pop("slo_class", None)
    if spec is not None:
        # no multi-turn sessions: blis_fast has none with P/D yet, and elsewhere it follows the
        # April reference's session timing, which the August build changed (rounds of an
        # open-loop session wait for the previous one there), a delta outside this family
        for client in spec["clients"]:
            client.pop("closed_loop", None)
            client.pop("reasoning", None)
        if kind == "pd" and any("concurrency" in client for client in spec["clients"]):
            spec = None
    if spec is not None:
        files["workload.yaml"] = yaml.safe_dump(spec, sort_keys=False)
        _flag(args, "workload-spec", "workload.yaml")
    else:
        _flag(args, "num-requests", rng.randint(20, max(20, max_requests)))
        _flag(args, "rate", rng.choice((5, 10, 30, 60, 120)))
        _flag(args, "prompt-tokens", rng.choice((128, 400, 1024, 2048)))
        _flag(args, "output-tokens", rng.choice((16, 100, 300)))
        if rng.random() < 0.3:
            _flag(args, "prefix-tokens", rng.choice((64, 256, 1024)))
    return {"id": config_id, "args": args, "files": files, "family": "august"}


LORA_MODELS: tuple[tuple[str, tuple[int, ...]], ...] = (
    ("meta-llama/llama-3.1-8b-instruct", (1, 1, 2)),
    ("meta-llama/llama-3.1-8b-instruct", (1, 2)),
    ("qwen/qwen3-14b", (1, 2)),
    ("mistralai/mistral-nemo-instruct-2407", (1, 2)),
    ("qwen/qwen2.5-7b-instruct", (1, 2)))
"""(model, TP choices) of the LoRA family: dense models (spec lora.md LORA-10.6: the two
references' KV auto-calculations agree on dense models; the reservation is a term on top)."""
LORA_RANKS = (8, 16, 32, 64)
LORA_TIER_KEYS = (4, 8, 16, 24, 32, 48, 64)
LORA_INVALID_SHARE = 0.06
"""Share of LoRA-family configurations that are deliberately invalid (both sides must refuse)."""
LORA_INVALID_KINDS = ("capacity-zero-file", "capacity-zero-flag", "unknown-adapter",
                      "affinity-twice", "affinity-duplicate", "rank-zero", "duplicate-id",
                      "bandwidth-zero", "base-model-mismatch", "scorer-weight-zero")
"""The invalid LoRA configurations (LORA-1.5, 1.8, 7.3 and the scorer list's duplicate check)."""


def _lora_registry(rng: random.Random, model: str) -> list[dict[str, Any]]:
    """1-8 adapters with ranks 8..64 (the usual powers of two or any integer), some with a
    ``base_model`` (the run's model: LORA-1.8 compares it with the client's ``model:``)."""
    adapters = []
    for i in range(rng.choice((1, 2, 3, 4, 5, 6, 8))):
        rank = rng.choice(LORA_RANKS) if rng.random() < 0.7 else rng.randint(8, 64)
        adapter: dict[str, Any] = {"id": f"ad{i}", "rank": rank}
        if rng.random() < 0.2:
            adapter["base_model"] = model
        adapters.append(adapter)
    return adapters


def _lora_file(rng: random.Random, adapters: list[dict[str, Any]],
               capacity: int | None) -> dict[str, Any]:
    """A ``--lora-config`` file: capacity (absent when None), the registry, sometimes its own
    cost scalars and step-overhead tiers (with or without ``k6``)."""
    block: dict[str, Any] = {}
    if capacity is not None:
        block["adapter_capacity"] = capacity
    if rng.random() < 0.3:
        block["load_base_latency_us"] = rng.choice((0.0, 200.0, 1500.0, 5000.0))
    if rng.random() < 0.3:
        block["load_bandwidth_bytes_us"] = rng.choice((5.0e4, 5.0e5, 2.0e6, 1.0e7))
    if rng.random() < 0.3:
        block["footprint_bytes_per_rank"] = rng.choice((1.0e5, 1.0e6, 2.0e6, 8.0e6))
    if rng.random() < 0.3:
        tiers: dict[int, dict[str, float]] = {}
        for key in sorted(rng.sample(LORA_TIER_KEYS, rng.randint(1, 3))):
            tier: dict[str, float] = {"k7": rng.choice((0.5, 1.0, 2.0))}
            if rng.random() < 0.7:
                tier["k6"] = rng.choice((0.0, 0.02, 0.05, 0.1, 0.3))
            tiers[key] = tier
        block["step_overhead_tiers"] = tiers
    block["adapters"] = adapters
    return {"lora": block}


def _lora_flags(rng: random.Random, args: list[str]) -> None:
    """Sometimes the scalar ``--lora-*`` flags on top of the file (they win, LORA-1.3)."""
    if rng.random() < 0.25:
        _flag(args, "lora-adapter-capacity", rng.randint(1, 4))
    if rng.random() < 0.2:
        _flag(args, "lora-load-base-latency-us", rng.choice(("0", "800", "1500", "8000")))
    if rng.random() < 0.2:
        _flag(args, "lora-load-bandwidth-bytes-us", rng.choice(("5e4", "1e6", "2e6", "1.5e7")))
    if rng.random() < 0.2:
        _flag(args, "lora-footprint-bytes-per-rank", rng.choice(("1e5", "1e6", "2e6", "4e6")))


def _lora_workload(rng: random.Random, adapters: list[dict[str, Any]], model: str,
                   max_requests: int) -> dict[str, Any]:
    """A v2 workload spec whose clients and cohorts carry adapters of the registry (some carry
    none: base-model traffic); multi-turn sessions closed-loop only; ``slo_class`` on every
    entry or on none (the August reference refuses a mix)."""
    ids = [a["id"] for a in adapters]
    with_base = {a["id"] for a in adapters if "base_model" in a}
    spec: dict[str, Any] = {"version": "2", "seed": rng.randint(1, 10_000),
                            "num_requests": rng.randint(20, max(20, max_requests))}
    if rng.random() < 0.12:  # closed-loop virtual users with adapters
        spec["clients"] = [{"id": f"users-{i}", "concurrency": rng.randint(1, 6),
                            "think_time_us": rng.choice((0, 50_000, 300_000)),
                            "input_distribution": _dist(rng, 16, 1024),
                            "output_distribution": _dist(rng, 4, 256)}
                           for i in range(rng.randint(1, 3))]
    else:
        spec["aggregate_rate"] = round(rng.uniform(2.0, 60.0), 1)
        groups = [f"group-{g}" for g in range(rng.randint(0, 2))]
        multi_turn = rng.random() < 0.25
        spec["clients"] = [_client(rng, i, multi_turn and rng.random() < 0.7, groups)
                           for i in range(rng.choice((1, 2, 3, 3, 4, 5, 6)))]
        for client in spec["clients"]:
            client.pop("closed_loop", None)
            if "reasoning" not in client:
                continue
            if rng.random() < 0.5:  # closed loop is the default; open-loop rounds are timed
                client["closed_loop"] = True  # differently by the August build (README)
            if client["reasoning"]["multi_turn"]["context_growth"] == "accumulate":
                # the April reference, which blis_fast follows, puts the prefix in front of
                # every accumulated round again; the August build keeps it once (#1445)
                client.pop("prefix_group", None)
                client.pop("prefix_length", None)
        if rng.random() < 0.3:
            spec["cohorts"] = [_cohort(rng, i) for i in range(rng.randint(1, 2))]
        if rng.random() < 0.15:
            spec["horizon"] = rng.randint(5_000_000, 30_000_000)
    entries = spec["clients"] + spec.get("cohorts", [])
    order = rng.sample(ids, len(ids))  # mostly distinct adapters per entry: churn
    for n, entry in enumerate(entries):
        if n == 0 or rng.random() < 0.7:
            entry["adapter"] = order[n % len(order)] if rng.random() < 0.8 else rng.choice(ids)
            if entry["adapter"] in with_base or rng.random() < 0.1:
                entry["model"] = model
    every = rng.random() < 0.5
    for entry in entries:
        if every:
            entry["slo_class"] = entry.get("slo_class") or rng.choice(SLO_CLASSES[1:])
        else:
            entry.pop("slo_class", None)
    return spec


def _lora_invalid(rng: random.Random, kind: str, args: list[str], lora: dict[str, Any],
                  spec: dict[str, Any]) -> None:
    """Make a valid LoRA configuration invalid by ``kind`` (one of LORA_INVALID_KINDS)."""
    block = lora["lora"]
    adapters = block["adapters"]
    if kind == "capacity-zero-file":
        block["adapter_capacity"] = rng.choice((0, -1))
        while "--lora-adapter-capacity" in args:
            n = args.index("--lora-adapter-capacity")
            del args[n:n + 2]
    elif kind == "capacity-zero-flag":
        _flag(args, "lora-adapter-capacity", 0)
    elif kind == "unknown-adapter":
        spec["clients"][-1]["adapter"] = "ghost"
    elif kind in ("affinity-twice", "affinity-duplicate", "scorer-weight-zero"):
        for flag in ("--routing-policy", "--routing-scorers", "--lora-scorer-weight"):
            while flag in args:
                n = args.index(flag)
                del args[n:n + 2]
        if "--num-instances" not in args:
            _flag(args, "num-instances", 2)
        _flag(args, "routing-policy", "weighted")
        if kind == "affinity-twice":
            _flag(args, "routing-scorers", "queue-depth:1,lora-affinity:2")
            _flag(args, "lora-scorer-weight", 1)
        elif kind == "affinity-duplicate":
            _flag(args, "routing-scorers", "lora-affinity:1,queue-depth:1,lora-affinity:2")
        else:
            _flag(args, "lora-scorer-weight", rng.choice(("0", "-1")))
    elif kind == "rank-zero":
        rng.choice(adapters)["rank"] = 0
    elif kind == "duplicate-id":
        adapters.append({"id": adapters[0]["id"], "rank": rng.choice(LORA_RANKS)})
    elif kind == "bandwidth-zero":
        _flag(args, "lora-load-bandwidth-bytes-us", "0")
    elif kind == "base-model-mismatch":
        client = spec["clients"][0]
        for adapter in adapters:
            if adapter["id"] == client["adapter"]:
                adapter["base_model"] = "some/other-model"
        client["model"] = client.get("model", "")


def lora_config(rng: random.Random, config_id: str, max_requests: int = 200,
                invalid: str | None = None) -> dict[str, Any]:
    """A LoRA configuration for the August reference, where parity with the April engine is
    meaningful (spec lora.md section 10): a ``--lora-config`` (capacity, adapters of ranks
    8..64, optional ``base_model``, sometimes custom tiers), sometimes the ``--lora-*`` flags
    on top, a workload spec whose clients and cohorts carry adapters, 1-4 instances with
    round-robin / least-loaded / weighted routing (``lora-affinity`` among the scorers or
    ``--lora-scorer-weight``), an explicit snapshot refresh, FCFS or SJF (never the priority
    schedulers, LORA-10.4), sometimes ``--timeout`` and ``--total-kv-blocks``, roofline or
    trained-physics named explicitly. Never P/D, autoscaler or open-loop sessions. About 6 %
    are deliberately invalid (LORA_INVALID_KINDS): both sides must refuse them; ``invalid``
    names the kind to make (``""``: a valid one), None draws."""
    args: list[str] = []
    files: dict[str, str] = {}
    if invalid is None:
        invalid = rng.choice(LORA_INVALID_KINDS) if rng.random() < LORA_INVALID_SHARE else ""
    model, tps = rng.choice(LORA_MODELS)
    _flag(args, "model", model)
    _flag(args, "latency-model", rng.choice(("roofline", "roofline", "trained-physics")))
    _flag(args, "hardware", "H100")
    _flag(args, "tp", rng.choice(tps))
    _flag(args, "seed", rng.randint(1, 100_000))
    instances = rng.choice((1, 1, 2, 2, 3, 4))
    if instances > 1 or rng.random() < 0.2:
        _flag(args, "num-instances", instances)
    if instances > 1:
        routing = rng.choice(("round-robin", "least-loaded", "weighted", "weighted"))
        _flag(args, "routing-policy", routing)
        if routing == "weighted":
            how = rng.choice(("scorers", "weight", "weight-default", "bundle"))
            others = rng.sample(("queue-depth", "kv-utilization", "load-balance",
                                 "precise-prefix-cache", "prefix-affinity"), rng.randint(0, 2))
            scorers = [f"{s}:{rng.randint(1, 3)}" for s in others]
            if how == "scorers":
                scorers.insert(rng.randint(0, len(scorers)), f"lora-affinity:{rng.randint(1, 4)}")
                _flag(args, "routing-scorers", ",".join(scorers))
            elif how == "weight":
                if scorers:
                    _flag(args, "routing-scorers", ",".join(scorers))
                _flag(args, "lora-scorer-weight", rng.choice(("0.5", "1", "2", "3")))
            elif how == "weight-default":  # appended to the default profile (LORA-7.3)
                _flag(args, "lora-scorer-weight", rng.choice(("1", "2")))
            else:
                bundle = {"routing": {"policy": "weighted", "scorers": [
                    {"name": name, "weight": rng.randint(1, 3)}
                    for name in ["lora-affinity", *others]]}}
                files["policy.yaml"] = yaml.safe_dump(bundle, sort_keys=False)
                _flag(args, "policy-config", "policy.yaml")
        elif rng.random() < 0.15:  # warns only: no effect outside weighted routing
            _flag(args, "lora-scorer-weight", rng.choice(("1", "0")))
    _flag(args, "snapshot-refresh-interval", rng.choice((0, 0, 10_000, 50_000, 100_000)))
    scheduler = rng.choice(AUGUST_SCHEDULERS) if rng.random() < 0.4 else "fcfs"
    if scheduler != "fcfs" or rng.random() < 0.2:
        _flag(args, "scheduler", scheduler)
    if scheduler == "sjf" and rng.random() < 0.5:  # preemption under SJF: LORA-D1 can show
        blocks = rng.choice((200, 400))
    else:
        blocks = rng.choice((200, 400, 1000, 5000, 20_000)) if rng.random() < 0.25 else 0
    if blocks:
        _flag(args, "total-kv-blocks", blocks)
    if scheduler == "sjf" and blocks:
        # SJF with preemption can stall for good (LORA-D1: a cold head, every slot pinned by a
        # preempted request); the reference then never ends and blis_fast stops with an error,
        # so these always carry deadlines, which end the stall
        _flag(args, "timeout", rng.choice((1, 2)))
    elif rng.random() < 0.2:
        _flag(args, "timeout", rng.choice((1, 2, 5, 30)))
    if rng.random() < 0.1:
        _flag(args, "max-num-running-reqs", rng.choice((4, 16)))

    adapters = _lora_registry(rng, model)
    capacity = None if rng.random() < 0.1 else rng.choice((1, 1, 2, 2, 3, 4))
    lora = _lora_file(rng, adapters, capacity)
    _lora_flags(rng, args)
    spec = _lora_workload(rng, adapters, model, max_requests)
    if invalid:
        _lora_invalid(rng, invalid, args, lora, spec)
    files["lora.yaml"] = yaml.safe_dump(lora, sort_keys=False)
    files["workload.yaml"] = yaml.safe_dump(spec, sort_keys=False)
    _flag(args, "lora-config", "lora.yaml")
    _flag(args, "workload-spec", "workload.yaml")
    return {"id": config_id, "args": args, "files": files, "family": "lora",
            **({"invalid": True, "invalid_kind": invalid} if invalid else {})}


# ---------------------------------------------------------------------------------------------
# The offload family (issue 32, spec kv-offload.md): the August reference's tier chain


OFFLOAD_MODELS: tuple[tuple[str, tuple[int, ...], int], ...] = (
    ("meta-llama/llama-3.1-8b-instruct", (1, 1, 2), 131_072),
    ("meta-llama/llama-3.1-8b-instruct", (1, 2), 131_072),
    ("qwen/qwen3-14b", (1, 2), 163_840),
    ("mistralai/mistral-nemo-instruct-2407", (1, 2), 163_840),
    ("qwen/qwen2.5-7b-instruct", (1, 2), 57_344))
"""(model, TP choices, KV bytes per token at TP 1) of the offload family: dense models whose KV
heads split evenly at TP 2, two of them with an explicit ``head_dim`` (the August rule, KVO-3.1:
mistral-nemo's 128 where April's hidden/heads gives 160). The byte figures are checked against
blis_fast's derivation by tests/test_differential_offload.py."""
OFFLOAD_TIER_MODES = ("all", "cpu")
"""``--offload-tiers``: 'all' draws secondary tiers in about half the chain configurations,
'cpu' never (the chain's CPU tier only, what blis_fast simulates today)."""
OFFLOAD_DEVICE_CLASSES = ("nvme_gen4", "nvme_gen3", "sata_ssd", "cpu_dram", "s3")
"""defaults.yaml's shipped ``kv_offload_devices:`` classes (KVO-2.4)."""
CUSTOM_DEVICES_CASE = "kvo-ramp-custom-device"
"""The parity case whose defaults.yaml, config.json and hardware_config.json a configuration
with custom device classes (ramp, jitter, buffered twins) copies, its device table redrawn."""
OFFLOAD_INVALID_SHARE = 0.07
OFFLOAD_INVALID_KINDS = (
    "cpu-below-one-block", "blocks-per-chunk-2", "block-size-two-blocks", "arc",
    "store-threshold-2", "store-threshold-negative", "both-models", "block-size-not-multiple",
    "block-size-and-chunk", "cpu-bytes-missing", "cpu-bytes-zero", "tokens-per-hash-zero",
    "eviction-unknown", "unknown-key", "null-block")
"""Invalid offload configurations both references refuse (KVO-1.3, KVO-2, KVO-3.2/3.3: the
reference panics, exit 2, on the last three of KVO-D3; blis_fast refuses them in one line)."""
OFFLOAD_TIER_INVALID_KINDS = (
    "tier-obj", "tier-no-type", "tier-direct-io-missing", "tier-unknown-class",
    "tier-no-triple", "tier-root-missing", "tier-threads-zero", "tier-bad-locality",
    "tier-bandwidth-zero")
"""Invalid secondary tiers (KVO-2.5), drawn only with ``--offload-tiers all``."""


def offload_block_bytes(model: str, tp: int, block_tokens: int = 16) -> int:
    """KV bytes of one GPU block on one TP rank for an OFFLOAD_MODELS model (KVO-3.1)."""
    per_token = next(b for m, _, b in OFFLOAD_MODELS if m == model)
    return per_token // tp * block_tokens


def _bounded(rng: random.Random, lo: int, hi: int) -> tuple[dict[str, Any], int]:
    """A length distribution with a hard maximum (gaussian within [min, max] or constant), so
    that every request fits the GPU cache; returns it and its maximum."""
    mean = rng.randint(lo, hi)
    if rng.random() < 0.2:
        return {"type": "constant", "params": {"value": mean}}, mean
    top = 2 * mean
    return ({"type": "gaussian", "params": {"mean": mean, "std_dev": rng.randint(0, mean // 2),
                                            "min": max(1, mean // 4), "max": top}}, top)


def _offload_workload(rng: random.Random, max_requests: int) -> tuple[dict[str, Any], int]:
    """A v2 workload spec where offload matters: clients sharing prefix groups, multi-turn
    sessions that accumulate their context (closed loop: the August build times open-loop
    rounds differently), plain clients, sometimes closed-loop virtual users; every length
    bounded. Returns the spec and the most tokens one request can need (input + output)."""
    spec: dict[str, Any] = {"version": "2", "seed": rng.randint(1, 10_000),
                            "num_requests": rng.randint(20, max(20, max_requests))}
    need = 0
    if rng.random() < 0.1:  # closed-loop virtual users
        spec["clients"] = []
        for i in range(rng.randint(1, 3)):
            inp, in_max = _bounded(rng, 32, 768)
            out, out_max = _bounded(rng, 4, 128)
            spec["clients"].append({"id": f"users-{i}", "concurrency": rng.randint(1, 8),
                                    "think_time_us": rng.choice((0, 50_000, 300_000)),
                                    "input_distribution": inp, "output_distribution": out})
            need = max(need, in_max + out_max)
        return spec, need
    spec["aggregate_rate"] = round(rng.uniform(1.0, 40.0), 1)
    groups = [f"p{g}" for g in range(rng.randint(1, 4))]
    clients = []
    for i in range(rng.choice((1, 2, 3, 3, 4, 5, 6))):
        kind = rng.choice(("prefix", "prefix", "prefix", "session", "session", "plain"))
        inp, in_max = _bounded(rng, 16, 512 if kind == "session" else 1024)
        out, out_max = _bounded(rng, 4, 128)
        client: dict[str, Any] = {
            "id": f"c{i}", "rate_fraction": round(rng.uniform(0.1, 1.0), 2),
            "arrival": _arrival(rng), "input_distribution": inp, "output_distribution": out}
        tokens = in_max + out_max
        if kind == "prefix":
            client["prefix_group"] = rng.choice(groups)
            length = rng.choice((64, 128, 256, 512, 1024))
            client["prefix_length"] = length
            tokens += length
        elif kind == "session":
            rounds = rng.randint(2, 5)
            growth = rng.choice(("accumulate", "accumulate", ""))
            client["reasoning"] = {
                "reason_ratio_distribution": {"type": "constant", "params": {"value": 0}},
                "multi_turn": {"max_rounds": rounds,
                               "think_time_us": rng.choice((0, 100_000, 400_000)),
                               "context_growth": growth}}
            if rng.random() < 0.5:  # closed loop is the default
                client["closed_loop"] = True
            if growth == "accumulate":
                tokens = rounds * (in_max + out_max)
        if rng.random() < 0.3:
            client["streaming"] = rng.random() < 0.5
        clients.append(client)
        need = max(need, tokens)
    spec["clients"] = clients
    if rng.random() < 0.15:
        spec["horizon"] = rng.randint(5_000_000, 60_000_000)
    return spec, need


def _offload_tier(rng: random.Random, classes: tuple[str, ...]) -> dict[str, Any]:
    """One secondary ``fs`` tier (KVO-2.5): a device class (sometimes with an explicit figure
    over it) or an explicit triple; O_DIRECT or buffered; sometimes thread counts and the inert
    ``locality`` / ``enable_kv_events``."""
    tier: dict[str, Any] = {"type": "fs", "root_dir": rng.choice(("/mnt/kv", "/mnt/nvme0", "s3"))}
    tier["direct_io"] = rng.random() < 0.6
    if rng.random() < 0.75:
        tier["device_class"] = rng.choice(classes)
        if rng.random() < 0.2:
            key = rng.choice(("read_bandwidth", "write_bandwidth", "base_latency"))
            tier[key] = rng.choice((100.0, 800.0, 2500.0)) if key != "base_latency" else 40.0
    else:
        tier["read_bandwidth"] = rng.choice((300.0, 1000.0, 3500.0, 7000.0, 20000.0))
        tier["write_bandwidth"] = rng.choice((250.0, 1000.0, 3000.0, 5000.0))
        tier["base_latency"] = rng.choice((0.0, 1.0, 80.0, 150.0, 30000.0))
    if rng.random() < 0.3:
        tier["n_read_threads"] = rng.choice((1, 2, 4, 16))
        tier["n_write_threads"] = rng.choice((1, 2, 4, 16))
    if rng.random() < 0.1:
        tier["locality"] = rng.choice(("LOCAL", "REMOTE"))
    if rng.random() < 0.1:
        tier["enable_kv_events"] = rng.random() < 0.5
    return tier


def _custom_devices(rng: random.Random) -> tuple[dict[str, str], tuple[str, ...]]:
    """Files of a run with custom device classes (queue-depth ramp, seeded jitter, buffered
    twins): the CUSTOM_DEVICES_CASE parity case's defaults.yaml with a redrawn
    ``kv_offload_devices:`` table, its config.json and hardware_config.json; and the classes."""
    from pathlib import Path

    case = Path(__file__).resolve().parents[1] / "reference_cases" / "cases" / CUSTOM_DEVICES_CASE
    text = (case / "defaults.yaml").read_text()
    head, _, tail = text.partition("kv_offload_devices:")
    version = tail[tail.index("\nversion:"):]
    lines = ["kv_offload_devices:",
             "  nvme_gen4: {read_bandwidth: 7.0e3, write_bandwidth: 5.0e3, base_latency: 80.0}",
             "  sata_ssd: {read_bandwidth: 5.5e2, write_bandwidth: 5.0e2, base_latency: 150.0}"]
    names = ["nvme_gen4", "sata_ssd"]
    for n in range(rng.randint(1, 3)):
        fields = {"read_bandwidth": rng.choice((500.0, 2000.0, 4000.0, 7000.0)),
                  "write_bandwidth": rng.choice((400.0, 1500.0, 3000.0)),
                  "base_latency": rng.choice((1.0, 90.0, 200.0, 5000.0))}
        if rng.random() < 0.5:
            fields["saturation_queue_depth"] = rng.choice((0, 1, 2, 4, 8, 16))
            fields["single_transfer_fraction"] = rng.choice((0.1, 0.25, 0.5, 1.0))
        if rng.random() < 0.4:
            fields["latency_jitter_stddev"] = rng.choice((0.05, 0.2, 0.4, 1.0))
        if rng.random() < 0.4:
            for key in rng.sample(("read_bandwidth", "write_bandwidth", "base_latency",
                                   "saturation_queue_depth", "single_transfer_fraction",
                                   "latency_jitter_stddev"), rng.randint(1, 3)):
                value = fields.get(key, 4 if key == "saturation_queue_depth" else 0.3)
                fields[f"buffered_{key}"] = (value if key == "saturation_queue_depth"
                                             else round(float(value) * rng.choice((0.5, 2.0)), 3))
        name = f"dev{n}"
        names.append(name)
        lines.append(f"  {name}: {{{', '.join(f'{k}: {v}' for k, v in fields.items())}}}")
    files = {"defaults.yaml": head + "\n".join(lines) + version,
             "config.json": (case / "config.json").read_text(),
             "hardware_config.json": (case / "hardware_config.json").read_text()}
    return files, tuple(names)


def _offload_invalid(rng: random.Random, kind: str, block: dict[str, Any], args: list[str],
                     per_block: int, gpu_block: int) -> dict[str, Any] | None:
    """Make a valid offload configuration invalid by ``kind``; returns the new ``kv_offload``
    block (None: the file's block is null)."""
    tiers = block.get("secondary_tiers") or []
    if kind.startswith("tier-") and not tiers:
        tiers = block["secondary_tiers"] = [{"type": "fs", "root_dir": "/mnt/kv",
                                             "direct_io": True, "device_class": "nvme_gen4"}]
    tier = tiers[rng.randrange(len(tiers))] if tiers else {}
    if kind in ("blocks-per-chunk-2", "block-size-two-blocks", "block-size-not-multiple",
                "block-size-and-chunk"):
        block.pop("block_size", None)
        block.pop("blocks_per_chunk", None)
    if kind == "cpu-below-one-block":
        block["cpu_bytes_to_use"] = rng.choice((1, per_block // 2, per_block - 1))
    elif kind == "blocks-per-chunk-2":
        block["blocks_per_chunk"] = rng.choice((2, 4))
    elif kind == "block-size-two-blocks":
        block["block_size"] = 2 * gpu_block
    elif kind == "arc":
        block["eviction_policy"] = "arc"
    elif kind == "store-threshold-2":
        block["store_threshold"] = rng.choice((2, 3))
    elif kind == "store-threshold-negative":
        block["store_threshold"] = -1
    elif kind == "both-models":
        _flag(args, "kv-cpu-blocks", rng.choice((50, 400)))
    elif kind == "block-size-not-multiple":
        block["block_size"] = gpu_block + gpu_block // 2
    elif kind == "block-size-and-chunk":
        block["block_size"], block["blocks_per_chunk"] = gpu_block, 1
    elif kind == "cpu-bytes-missing":
        del block["cpu_bytes_to_use"]
    elif kind == "cpu-bytes-zero":
        block["cpu_bytes_to_use"] = rng.choice((0, -per_block))
    elif kind == "tokens-per-hash-zero":
        block["tokens_per_hash"] = 0
    elif kind == "eviction-unknown":
        block["eviction_policy"] = "fifo"
    elif kind == "unknown-key":
        block["cpu_bytes"] = block["cpu_bytes_to_use"]
    elif kind == "null-block":
        return None
    elif kind == "tier-obj":
        tier["type"] = "obj"
    elif kind == "tier-no-type":
        del tier["type"]
    elif kind == "tier-direct-io-missing":
        del tier["direct_io"]
    elif kind == "tier-unknown-class":
        tier["device_class"] = "optane"
    elif kind == "tier-no-triple":
        for key in ("device_class", "write_bandwidth", "base_latency"):
            tier.pop(key, None)
        tier["read_bandwidth"] = 1000.0
    elif kind == "tier-root-missing":
        tier["root_dir"] = ""
    elif kind == "tier-threads-zero":
        tier[rng.choice(("n_read_threads", "n_write_threads"))] = 0
    elif kind == "tier-bad-locality":
        tier["locality"] = "NEAR"
    elif kind == "tier-bandwidth-zero":
        tier[rng.choice(("read_bandwidth", "write_bandwidth"))] = 0.0
    return block


def offload_config(rng: random.Random, config_id: str, max_requests: int = 200,
                   tiers: str = "all", invalid: str | None = None) -> dict[str, Any]:
    """A KV offload configuration for the August reference (spec kv-offload.md): mostly a
    ``--kv-offload-config`` file (a CPU budget in bytes, whole blocks or not, down to one block;
    ``offload_prompt_only`` on/off; the inert and the accepted-but-fixed keys; with ``tiers``
    'all' also 1-3 secondary ``fs`` tiers of shipped or custom device classes), in about one
    draw in seven the ``--kv-cpu-blocks`` tier with the August reload rule, which blis_fast
    takes as the ``--kv-cpu-reload always`` opt-in (``blis_fast_args``); a workload with shared
    prefixes and multi-turn sessions, a GPU cache small enough to evict, 1-4 instances with
    prefix-aware or other routing, an explicit snapshot refresh, FCFS or SJF, roofline or
    trained-physics named explicitly. About 7 % are invalid (OFFLOAD_INVALID_KINDS, with 'all'
    also OFFLOAD_TIER_INVALID_KINDS): both sides must refuse them; ``invalid`` names the kind
    (``""``: a valid one), None draws."""
    if tiers not in OFFLOAD_TIER_MODES:
        raise ValueError(f"unknown offload tier mode {tiers!r}; valid: "
                         f"{', '.join(OFFLOAD_TIER_MODES)}")
    kinds = OFFLOAD_INVALID_KINDS + (OFFLOAD_TIER_INVALID_KINDS if tiers == "all" else ())
    if invalid is None:
        invalid = rng.choice(kinds) if rng.random() < OFFLOAD_INVALID_SHARE else ""
    args: list[str] = []
    files: dict[str, str] = {}
    blis_fast_args: list[str] = []
    model, tps, _ = rng.choice(OFFLOAD_MODELS)
    tp = rng.choice(tps)
    custom = tiers == "all" and model == OFFLOAD_MODELS[0][0] and rng.random() < 0.1
    _flag(args, "model", model)
    _flag(args, "latency-model", rng.choice(("roofline", "roofline", "trained-physics")))
    _flag(args, "hardware", "H100")
    _flag(args, "tp", tp)
    _flag(args, "seed", rng.randint(1, 100_000))
    classes = OFFLOAD_DEVICE_CLASSES
    if custom:
        device_files, classes = _custom_devices(rng)
        files.update(device_files)
        args += ["--defaults-filepath", "defaults.yaml", "--model-config-folder", ".",
                 "--hardware-config", "hardware_config.json"]
    instances = rng.choice((1, 1, 2, 2, 3, 4))
    if instances > 1 or rng.random() < 0.2:
        _flag(args, "num-instances", instances)
    if instances > 1:
        routing = rng.choice(("round-robin", "least-loaded", "weighted", "weighted"))
        _flag(args, "routing-policy", routing)
        if routing == "weighted" and rng.random() < 0.7:
            chosen = rng.sample(("prefix-affinity", "precise-prefix-cache", "queue-depth",
                                 "kv-utilization", "load-balance"), rng.randint(1, 3))
            _flag(args, "routing-scorers", ",".join(f"{s}:{rng.randint(1, 3)}" for s in chosen))
    _flag(args, "snapshot-refresh-interval", rng.choice((0, 0, 10_000, 50_000, 100_000)))
    block_tokens = 16
    if rng.random() < 0.1:
        block_tokens = rng.choice((8, 32))
        _flag(args, "block-size-in-tokens", block_tokens)
    spec, need = _offload_workload(rng, max_requests)
    need_blocks = -(-need // block_tokens) + 2
    gpu = 0
    if rng.random() < 0.9:  # else the auto-sized cache: the GPU never evicts, the tier is idle
        # mostly small enough that prefixes leave the GPU between their uses (the CPU tier
        # then serves them back), sometimes large enough that it never does
        gpu = max(need_blocks + rng.randint(0, 40),
                  rng.choice((64, 100, 150, 200, 200, 300, 300, 500, 1000, 4000))
                  * 16 // block_tokens)
        _flag(args, "total-kv-blocks", gpu)
    scheduler = "sjf" if rng.random() < 0.2 else "fcfs"
    if scheduler != "fcfs" or rng.random() < 0.2:
        _flag(args, "scheduler", scheduler)
    legacy = not invalid and rng.random() < 0.15
    if gpu and (scheduler == "sjf" or legacy or gpu < 2 * need_blocks):
        # a cache that holds few of the largest requests can cycle for good: preempted
        # requests re-admitted in the same order (blis_fast detects the cycle and stops with an
        # error, the reference loops until killed), SJF's stall (LORA-D1), the CPU tier's
        # reload commits starving the batch (tests/test_invariants.py TIERED_LIVELOCK):
        # deadlines end them
        _flag(args, "timeout", rng.choice((2, 5, 10)))
    elif rng.random() < 0.25:
        _flag(args, "timeout", rng.choice((1, 2, 5, 30)))
    if rng.random() < 0.2:
        _flag(args, "long-prefill-token-threshold", rng.choice((64, 256, 512)))
    if rng.random() < 0.15:
        _flag(args, "max-num-running-reqs", rng.choice((2, 8, 32)))
    if rng.random() < 0.1:
        _flag(args, "max-num-scheduled-tokens", rng.choice((512, 2048)))
    files["workload.yaml"] = yaml.safe_dump(spec, sort_keys=False)
    _flag(args, "workload-spec", "workload.yaml")
    per_block = offload_block_bytes(model, tp, block_tokens)
    ref_gpu = gpu or 2000
    size = rng.random()
    if size < 0.15:  # a tiny tier: constant LRU eviction
        cpu_blocks = rng.randint(1, 3)
    elif size < 0.35:
        cpu_blocks = rng.randint(4, 64)
    elif size < 0.7:
        cpu_blocks = rng.randint(64, 600)
    else:  # room for more than the GPU holds
        cpu_blocks = rng.randint(ref_gpu, 4 * ref_gpu)
    if legacy and not custom:  # the April tier under August's rule (KVO-9.1): the opt-in
        _flag(args, "kv-cpu-blocks", cpu_blocks)
        if rng.random() < 0.7:
            _flag(args, "kv-transfer-bandwidth", rng.choice((1, 4, 8, 20, 100)))
        if rng.random() < 0.5:
            _flag(args, "kv-transfer-base-latency", rng.choice((0, 10, 20, 50)))
        if rng.random() < 0.2:
            _flag(args, "kv-offload-threshold", rng.choice((0, 0.5, 0.9)))
        blis_fast_args = ["--kv-cpu-reload", "always"]
        return {"id": config_id, "args": args, "files": files, "family": "offload",
                "blis_fast_args": blis_fast_args}
    remainder = rng.choice((0, 0, 1, rng.randint(1, per_block - 1), per_block - 1))
    block: dict[str, Any] = {"cpu_bytes_to_use": cpu_blocks * per_block + remainder}
    if rng.random() < 0.6:
        block["offload_prompt_only"] = rng.random() < 0.5
    if rng.random() < 0.15:
        block["store_threshold"] = rng.choice((0, 1))
    if rng.random() < 0.1:
        if rng.random() < 0.5:
            block["block_size"] = block_tokens
        else:
            block["blocks_per_chunk"] = 1
    if rng.random() < 0.1:
        block["tokens_per_hash"] = rng.choice((1, 16, 64, 256))
    if rng.random() < 0.1:
        block["eviction_policy"] = "lru"
    if rng.random() < 0.1:
        block["self_describing_kv_events"] = rng.random() < 0.5
    if tiers == "all" and rng.random() < (0.9 if custom else 0.5):
        block["secondary_tiers"] = [_offload_tier(rng, classes)
                                    for _ in range(rng.choice((1, 1, 2, 3)))]
    if rng.random() < 0.15:  # the legacy flags do nothing for the chain (KVO-1.4)
        _flag(args, rng.choice(("kv-transfer-bandwidth", "kv-transfer-base-latency")),
              rng.choice((5, 50)))
    out: dict[str, Any] | None = block
    if invalid:
        out = _offload_invalid(rng, invalid, block, args, per_block, block_tokens)
    files["offload.yaml"] = ("kv_offload:\n" if out is None
                             else yaml.safe_dump({"kv_offload": out}, sort_keys=False))
    _flag(args, "kv-offload-config", "offload.yaml")
    return {"id": config_id, "args": args, "files": files, "family": "offload",
            **({"invalid": True, "invalid_kind": invalid} if invalid else {})}


def generate_config(rng: random.Random, config_id: str, max_requests: int = 200,
                    family: str = "april", offload_tiers: str = "all") -> dict[str, Any]:
    """One random configuration (see the module docstring for its shape) of at most
    ``max_requests`` requests (``--num-requests`` or the spec's ``num_requests``; the large
    draws of the extended families up to ``large_requests(max_requests)``); ``family`` is
    'april' (the April reference's flags), 'august' (P/D and autoscaler), 'lora' or 'offload'
    (``offload_tiers``: OFFLOAD_TIER_MODES)."""
    if family == "offload":
        return offload_config(rng, config_id, max_requests, offload_tiers)
    if family == "august":
        return august_config(rng, config_id, max_requests)
    if family == "lora":
        return lora_config(rng, config_id, max_requests)
    if family != "april":
        raise ValueError(f"unknown family {family!r}; valid: {', '.join(FAMILIES)}")
    if rng.random() < INVALID_SHARE:
        return invalid_config(rng, config_id)
    args: list[str] = []
    files: dict[str, str] = {}
    extended = rng.random() < 0.5  # the flags the first version of this generator lacked
    model, roofline_tps, physics_tps = rng.choice(MODELS)
    latency = rng.choices(("roofline", "blackbox", "trained-physics"), (6, 2, 2))[0]
    row = _coefficient_row(rng) if extended and rng.random() < 0.2 else None
    if row is not None:  # a fitted blackbox row of defaults.yaml, chosen by its vLLM version
        _flag(args, "model", row["id"])
        _flag(args, "hardware", row["GPU"])
        _flag(args, "tp", row["tensor_parallelism"])
        _flag(args, "latency-model", "blackbox")
        _flag(args, "vllm-version", row["vllm_version"])
        latency = "row"
    else:
        _flag(args, "model", model)
    tps = physics_tps if latency == "trained-physics" else roofline_tps
    if latency != "row" and (model not in MODELS_WITH_DEFAULTS or rng.random() < 0.5):
        _flag(args, "hardware", rng.choice(HARDWARE))
        _flag(args, "tp", rng.choice(tps))
    if latency == "blackbox":
        _flag(args, "latency-model", "blackbox")
        _flag(args, "alpha-coeffs", f"{rng.randint(500, 5000)},{rng.uniform(0.5, 8):.3f},"
                                    f"{rng.randint(500, 5000)}")
        _flag(args, "beta-coeffs", f"{rng.randint(2000, 9000)},{rng.uniform(1, 40):.3f},"
                                   f"{rng.uniform(0.5, 10):.3f}")
    elif latency == "trained-physics" or (latency != "row" and rng.random() < 0.2):
        _flag(args, "latency-model", latency)
    _flag(args, "seed", rng.randint(1, 100_000))

    instances = rng.choice((1, 1, 2, 3, 4, 5, 6, 7, 8))
    if instances > 1 or rng.random() < 0.1:
        _flag(args, "num-instances", instances)
    if instances > 1:
        routing = rng.choice(ROUTING)
        _flag(args, "routing-policy", routing)
        if routing == "weighted" and rng.random() < 0.8:
            chosen = rng.sample(SCORERS, rng.randint(1, 3))
            _flag(args, "routing-scorers", ",".join(f"{s}:{rng.randint(1, 5)}" for s in chosen))
        if rng.random() < 0.3:
            _flag(args, "snapshot-refresh-interval", rng.choice((10_000, 50_000, 100_000)))
    if extended:
        _admission(rng, args, files)
        _extended_flags(rng, args, instances)
    elif rng.random() < 0.2:
        _flag(args, "admission-policy", "token-bucket")
        _flag(args, "token-bucket-capacity", rng.choice((2000, 10_000, 50_000)))
        _flag(args, "token-bucket-refill-rate", rng.choice((500, 5000, 20_000)))
    if rng.random() < 0.4:
        _flag(args, "scheduler", rng.choice(SCHEDULERS))
    if rng.random() < 0.3:
        _flag(args, "priority-policy", rng.choice(PRIORITIES))

    block_size = 16
    if rng.random() < 0.1:
        block_size = rng.choice((8, 32))
        _flag(args, "block-size-in-tokens", block_size)
    max_len = 0
    if rng.random() < 0.15:
        max_len = rng.choice((512, 1024, 2048, 4096))
        _flag(args, "max-model-len", max_len)
    if rng.random() < 0.4:
        least = -(-max_len // block_size)
        _flag(args, "total-kv-blocks", max(least, rng.choice((32, 64, 128, 256, 400, 1000, 5000))))
    if rng.random() < 0.15:
        _flag(args, "kv-cpu-blocks", rng.choice((50, 200, 1000)))
        if rng.random() < 0.5:
            _flag(args, "kv-transfer-bandwidth", rng.choice((5, 20, 100)))
            _flag(args, "kv-transfer-base-latency", rng.choice((0, 10, 50)))
    if rng.random() < 0.2:
        _flag(args, "long-prefill-token-threshold", rng.choice((32, 64, 256, 512)))
    if rng.random() < 0.25:
        _flag(args, "max-num-running-reqs", rng.choice((1, 2, 4, 8, 32)))
    if rng.random() < 0.25:
        _flag(args, "max-num-scheduled-tokens", rng.choice((128, 512, 1024, 4096)))

    if extended and rng.random() < 0.1:
        max_requests = large_requests(max_requests)
    source = rng.choices(("distribution", "preset", "concurrency", "spec"),
                         (5, 1, 1, 6 if extended else 3))[0]
    if source == "spec":
        files["workload.yaml"] = yaml.safe_dump(workload_spec(rng, max_requests, extended),
                                                sort_keys=False)
        _flag(args, "workload-spec", "workload.yaml")
        if rng.random() < 0.3:
            _flag(args, "num-requests", rng.randint(5, max_requests))
    else:
        _flag(args, "num-requests", rng.randint(5, max_requests))
        if source == "concurrency":
            _flag(args, "concurrency", rng.randint(1, 16))
            if rng.random() < 0.6:
                _flag(args, "think-time-ms", rng.choice((0, 50, 200, 1000)))
        else:
            _flag(args, "rate", rng.choice((0.5, 2, 5, 10, 20, 50, 100, 300)))
        if source == "preset":
            _flag(args, "workload", rng.choice(PRESETS))
        else:
            _length_flags(rng, args)
            if rng.random() < 0.2:
                _flag(args, "prefix-tokens", rng.choice((16, 64, 256, 1024)))
    if rng.random() < 0.2:
        _flag(args, "timeout", rng.choice((1, 2, 5, 30, -1)))
    if rng.random() < 0.15:
        _flag(args, "horizon", rng.randint(1_000_000, 60_000_000))
    if rng.random() < 0.1:
        _flag(args, "trace-level", "decisions")
        if rng.random() < 0.5:
            _flag(args, "counterfactual-k", rng.randint(1, 3))
        if rng.random() < 0.5:
            args.append("--summarize-trace")
    return {"id": config_id, "args": args, "files": files}


def generate_configs(seed: int, count: int, max_requests: int = 200,
                     family: str = "april", offload_tiers: str = "all"
                     ) -> list[dict[str, Any]]:
    """``count`` configurations of ``family`` drawn from ``seed`` (the same seed gives the same
    list); ``offload_tiers`` ('all' or 'cpu') restricts the offload family's tiers."""
    if max_requests < 5:
        raise ValueError(f"max_requests must be >= 5, got {max_requests}")
    rng = random.Random(seed)
    prefix = {"april": "s", "august": "a", "lora": "l", "offload": "o"}.get(family, family[:1])
    return [generate_config(rng, f"{prefix}{seed}-{i}", max_requests, family, offload_tiers)
            for i in range(count)]


def option_fields(args: list[str]) -> dict[str, Any]:
    """``args`` as ``blis_fast.options.build_options`` input (field name -> CLI string)."""
    from parity import BOOL_FLAGS, case_flags  # tests/parity.py (tests/ is on sys.path)

    return {flag[2:].replace("-", "_"): (True if flag in BOOL_FLAGS else value)
            for flag, value in case_flags(args).items()}
