"""Random, valid ``blis run`` configurations for differential testing (seeded, reproducible).

A configuration is a dict ``{"id": str, "args": [flag, value, ...], "files": {name: text}}``:
``args`` omit the output flags (the runner adds them) and name files by their bare name (the
runner writes ``files`` into the run folder). Only flags and values the reference accepts are
drawn; ``tests/test_differential_tool.py`` checks that blis_fast accepts every one.
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


def _dist(rng: random.Random, lo: int, hi: int) -> dict[str, Any]:
    """A spec length distribution (gaussian, exponential or constant)."""
    mean = rng.randint(lo, hi)
    kind = rng.choice(("gaussian", "exponential", "constant"))
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


def _client(rng: random.Random, i: int, multi_turn: bool, groups: list[str]) -> dict[str, Any]:
    client: dict[str, Any] = {
        "id": f"client-{i}", "tenant_id": f"tenant-{rng.randint(0, 2)}",
        "slo_class": rng.choice(SLO_CLASSES), "rate_fraction": round(rng.uniform(0.1, 1.0), 2),
        "streaming": rng.random() < 0.5, "arrival": _arrival(rng),
        "input_distribution": _dist(rng, 16, 1024), "output_distribution": _dist(rng, 4, 256)}
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


def workload_spec(rng: random.Random, max_requests: int = 200) -> dict[str, Any]:
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
    spec["clients"] = [_client(rng, i, multi_turn and rng.random() < 0.8, groups)
                       for i in range(rng.randint(1, 3))]
    if rng.random() < 0.25:
        spec["cohorts"] = [_cohort(rng, i) for i in range(rng.randint(1, 2))]
    if rng.random() < 0.15:
        spec["horizon"] = rng.randint(2_000_000, 30_000_000)
    return spec


def generate_config(rng: random.Random, config_id: str, max_requests: int = 200
                    ) -> dict[str, Any]:
    """One random configuration (see the module docstring for its shape) of at most
    ``max_requests`` requests (``--num-requests`` or the spec's ``num_requests``)."""
    args: list[str] = []
    files: dict[str, str] = {}
    model, roofline_tps, physics_tps = rng.choice(MODELS)
    _flag(args, "model", model)
    latency = rng.choices(("roofline", "blackbox", "trained-physics"), (6, 2, 2))[0]
    tps = physics_tps if latency == "trained-physics" else roofline_tps
    if model not in MODELS_WITH_DEFAULTS or rng.random() < 0.5:
        _flag(args, "hardware", rng.choice(HARDWARE))
        _flag(args, "tp", rng.choice(tps))
    if latency == "blackbox":
        _flag(args, "latency-model", "blackbox")
        _flag(args, "alpha-coeffs", f"{rng.randint(500, 5000)},{rng.uniform(0.5, 8):.3f},"
                                    f"{rng.randint(500, 5000)}")
        _flag(args, "beta-coeffs", f"{rng.randint(2000, 9000)},{rng.uniform(1, 40):.3f},"
                                   f"{rng.uniform(0.5, 10):.3f}")
    elif latency == "trained-physics" or rng.random() < 0.2:
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
    if rng.random() < 0.2:
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

    source = rng.choices(("distribution", "preset", "concurrency", "spec"), (5, 1, 1, 3))[0]
    if source == "spec":
        files["workload.yaml"] = yaml.safe_dump(workload_spec(rng, max_requests),
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


def generate_configs(seed: int, count: int, max_requests: int = 200) -> list[dict[str, Any]]:
    """``count`` configurations drawn from ``seed`` (the same seed gives the same list)."""
    if max_requests < 5:
        raise ValueError(f"max_requests must be >= 5, got {max_requests}")
    rng = random.Random(seed)
    return [generate_config(rng, f"s{seed}-{i}", max_requests) for i in range(count)]



def option_fields(args: list[str]) -> dict[str, Any]:
    """``args`` as ``blis_fast.options.build_options`` input (field name -> CLI string)."""
    from parity import BOOL_FLAGS, case_flags  # tests/parity.py (tests/ is on sys.path)

    return {flag[2:].replace("-", "_"): (True if flag in BOOL_FLAGS else value)
            for flag, value in case_flags(args).items()}
