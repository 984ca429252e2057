"""``RunOptions``: the value of every ``blis run`` flag, one typed field per row of
``blis_fast.options.RUN_OPTIONS`` (same names, order, defaults), under the rows' group headings,
plus the set of fields given explicitly. ``run``, ``replay``, the Python API and sweeps build it
with ``options.build_options``; ``blis observe`` and ``blis convert`` read the same rows.

The class below the marker line is generated from the table. After adding, removing or changing
a row (its flag, kind, default, help or group), regenerate it::

    python -m blis_fast.run_options_codegen

(``--check`` only reports whether the file is stale). ``tests/test_run_options_typed.py`` fails
while the file and the table disagree, and ``options.build_options`` refuses a class whose
fields or defaults differ from the rows. What a ``RunOptions`` does besides holding values is
hand-written in ``RunOptionsMethods`` above the marker. Import it as
``blis_fast.options.RunOptions`` (loaded on first use, so ``blis --help`` and the other
subcommands do not pay for building the class) or from here.
"""

from dataclasses import dataclass


class RunOptionsMethods:
    """The behaviour of ``RunOptions`` (hand-written; the generated dataclass inherits it)."""

    explicit: frozenset[str]

    def given(self, name: str) -> bool:
        """True when the flag (field name, e.g. ``"num_requests"``) was set explicitly."""
        return name in self.explicit


# ---- below: generated from RUN_OPTIONS by blis_fast.run_options_codegen; do not edit ----


@dataclass(frozen=True)
class RunOptions(RunOptionsMethods):
    """The value of every ``blis run`` flag (one attribute per row of RUN_OPTIONS) and the
    fields given explicitly (``explicit``)."""

    # Model and latency

    model: str = ""
    """--model: LLM name (required), e.g. meta-llama/llama-3.1-8b-instruct"""
    hardware: str = ""
    """--hardware: GPU type (default from defaults.yaml)"""
    tp: int = 0
    """--tp: tensor parallelism (default from defaults.yaml)"""
    vllm_version: str = ""
    """--vllm-version: vLLM version (default from defaults.yaml)"""
    latency_model: str = "roofline"
    """--latency-model: latency model (a name of the ``latency_backends`` registry)"""
    alpha_coeffs: tuple[float, ...] = (0.0, 0.0, 0.0)
    """--alpha-coeffs: alpha coefficients (comma-separated)"""
    beta_coeffs: tuple[float, ...] = (0.0, 0.0, 0.0)
    """--beta-coeffs: beta coefficients (comma-separated)"""
    model_config_folder: str = ""
    """--model-config-folder: folder holding the model's config.json"""
    hardware_config: str = ""
    """--hardware-config: hardware_config.json to use"""
    gpu_profile: str = ""
    """--gpu-profile: GPU profile JSON of --latency-model profiled (default: the bundled profile
    of --hardware; blis profile writes one)"""
    defaults_filepath: str = ""
    """--defaults-filepath: defaults.yaml to use (default: the bundled copy)"""
    max_model_len: int = 0
    """--max-model-len: max sequence length; 0 = derived or unlimited"""
    gpu_memory_utilization: float = 0.9
    """--gpu-memory-utilization: GPU memory fraction for the KV cache"""

    # KV cache and batching

    total_kv_blocks: int = 1_000_000
    """--total-kv-blocks: KV blocks per instance (default: derived)"""
    block_size_in_tokens: int = 16
    """--block-size-in-tokens: tokens per KV block"""
    max_num_running_reqs: int = 256
    """--max-num-running-reqs: max requests in a running batch"""
    max_num_scheduled_tokens: int = 2048
    """--max-num-scheduled-tokens: token budget per step"""
    long_prefill_token_threshold: int = 0
    """--long-prefill-token-threshold: chunked-prefill chunk size; 0 = off"""
    kv_cpu_blocks: int = 0
    """--kv-cpu-blocks: CPU-tier KV blocks; > 0 enables tiered KV"""
    kv_offload_threshold: float = 0.9
    """--kv-offload-threshold: deprecated; validated and ignored"""
    kv_transfer_bandwidth: float = 100.0
    """--kv-transfer-bandwidth: CPU->GPU transfer rate (tokens/tick)"""
    kv_transfer_base_latency: int = 0
    """--kv-transfer-base-latency: fixed ticks per reloaded block"""
    kv_cpu_reload: str = "on-failure"
    """--kv-cpu-reload: when the --kv-cpu-blocks tier is read back: on-failure (April: after a
    failed GPU allocation) or always (August #1586: before every allocation)"""
    kv_offload_config: str = ""
    """--kv-offload-config: YAML file with a top-level kv_offload: block: the August tier chain
    (CPU bytes, secondary fs tiers); excludes --kv-cpu-blocks"""

    # Simulation

    seed: int = 42
    """--seed: random seed"""
    horizon: int = 9_223_372_036_854_775_807
    """--horizon: horizon in ticks (µs): no request arrives later; a simulation stops there"""
    log: str = "warn"
    """--log: log level for stderr diagnostics"""

    # Cluster, admission and routing

    num_instances: int = 1
    """--num-instances: number of instances"""
    admission_policy: str = "always-admit"
    """--admission-policy: admission policy (a name of the ``admission`` registry)"""
    admission_latency: int = 0
    """--admission-latency: admission latency (µs)"""
    routing_latency: int = 0
    """--routing-latency: routing latency (µs)"""
    token_bucket_capacity: float = 10000.0
    """--token-bucket-capacity: token bucket capacity"""
    token_bucket_refill_rate: float = 1000.0
    """--token-bucket-refill-rate: token bucket refill (tokens/s)"""
    routing_policy: str = "round-robin"
    """--routing-policy: routing policy (a name of the ``routing`` registry)"""
    routing_scorers: str = ""
    """--routing-scorers: weighted-routing scorers, name:weight,..."""
    priority_policy: str = "constant"
    """--priority-policy: priority policy (a name of the ``priority`` registry)"""
    scheduler: str = "fcfs"
    """--scheduler: instance scheduler (a name of the ``scheduler`` registry)"""
    policy_config: str = ""
    """--policy-config: policy bundle YAML"""
    fitness_weights: str = ""
    """--fitness-weights: fitness weights, key:value,..."""
    trace_level: str = "none"
    """--trace-level: decision trace level: none or decisions"""
    counterfactual_k: int = 0
    """--counterfactual-k: counterfactual candidates per routing decision"""
    summarize_trace: bool = False
    """--summarize-trace: print the decision-trace summary"""
    snapshot_refresh_interval: int = 0
    """--snapshot-refresh-interval: routing snapshot refresh interval (µs)"""
    cache_signal_delay: int = 50_000
    """--cache-signal-delay: prefix-cache signal delay (µs)"""

    # Prefill/decode disaggregation (P/D)

    prefill_instances: int = 0
    """--prefill-instances: P/D: instances of the prefill pool"""
    decode_instances: int = 0
    """--decode-instances: P/D: instances of the decode pool"""
    prefill_decode_instances: int = 0
    """--prefill-decode-instances: P/D: shared-role instances (both pools)"""
    encode_instances: int = 0
    """--encode-instances: P/D: instances of the encode pool"""
    pd_decider: str = "never"
    """--pd-decider: P/D: which requests are disaggregated (a name of the ``deciders`` registry)"""
    pd_prefix_threshold: int = 16
    """--pd-prefix-threshold: P/D prefix-threshold decider: uncached prompt tokens above which a
    request is disaggregated"""
    pd_transfer_bandwidth: float = 25.0
    """--pd-transfer-bandwidth: P/D: KV transfer bandwidth (GB/s)"""
    pd_transfer_base_latency: float = 0.05
    """--pd-transfer-base-latency: P/D: fixed latency per KV transfer (ms)"""
    pd_transfer_contention: bool = False
    """--pd-transfer-contention: P/D: concurrent KV transfers share the bandwidth"""
    prefill_routing_scorers: str = ""
    """--prefill-routing-scorers: P/D: weighted scorers of the prefill pool, name:weight,..."""
    decode_routing_scorers: str = ""
    """--decode-routing-scorers: P/D: weighted scorers of the decode pool, name:weight,..."""
    prefill_tp: int = 0
    """--prefill-tp: P/D: tensor parallelism of the prefill pool"""
    decode_tp: int = 0
    """--decode-tp: P/D: tensor parallelism of the decode pool"""
    prefill_hardware: str = ""
    """--prefill-hardware: P/D: GPU of the prefill pool"""
    decode_hardware: str = ""
    """--decode-hardware: P/D: GPU of the decode pool"""
    prefill_latency_model: str = ""
    """--prefill-latency-model: P/D: latency model of the prefill pool"""
    decode_latency_model: str = ""
    """--decode-latency-model: P/D: latency model of the decode pool"""
    prefill_max_model_len: int = 0
    """--prefill-max-model-len: P/D: max model length of the prefill pool"""
    decode_max_model_len: int = 0
    """--decode-max-model-len: P/D: max model length of the decode pool"""
    encode_decider: str = "never"
    """--encode-decider: P/D: which requests go through the encode pool (a name of the
    ``encode_deciders`` registry)"""

    # Autoscaler and cost

    model_autoscaler_interval_us: float = 0.0
    """--model-autoscaler-interval-us: autoscaler tick interval (µs); 0 = off unless the policy
    bundle sets one"""
    gpu_hour_cost: float = 0.0
    """--gpu-hour-cost: price of one GPU-hour: prints the run's cost (node_pools[].gpu_hour_cost
    wins)"""

    # LoRA adapters

    lora_config: str = ""
    """--lora-config: YAML file with a top-level lora: block (adapter registry, capacity, costs)"""
    lora_adapter_capacity: int = 0
    """--lora-adapter-capacity: resident adapter slots per instance (applied only when given)"""
    lora_load_base_latency_us: float = 0.0
    """--lora-load-base-latency-us: fixed cold-load latency (µs; applied only when given, default
    from --lora-config or defaults.yaml)"""
    lora_load_bandwidth_bytes_us: float = 0.0
    """--lora-load-bandwidth-bytes-us: cold-load bandwidth (bytes/µs; applied only when given,
    default from --lora-config or defaults.yaml)"""
    lora_footprint_bytes_per_rank: float = 0.0
    """--lora-footprint-bytes-per-rank: adapter HBM bytes per rank unit (applied only when given,
    default from --lora-config or defaults.yaml)"""
    lora_scorer_weight: float = 0.0
    """--lora-scorer-weight: weight of the lora-affinity scorer appended to the weighted profile
    (applied only when given)"""

    # Workload

    workload: str = "distribution"
    """--workload: distribution or a preset name"""
    workload_spec: str = ""
    """--workload-spec: workload spec YAML"""
    rate: float = 1.0
    """--rate: requests per second"""
    num_requests: int = 100
    """--num-requests: number of requests"""
    concurrency: int = 0
    """--concurrency: closed-loop virtual users"""
    think_time_ms: int = 0
    """--think-time-ms: think time between a response and the next request"""
    prefix_tokens: int = 0
    """--prefix-tokens: shared prefix length"""
    prompt_tokens: int = 512
    """--prompt-tokens: mean prompt length"""
    prompt_tokens_stdev: int = 256
    """--prompt-tokens-stdev: prompt length standard deviation"""
    prompt_tokens_min: int = 2
    """--prompt-tokens-min: min prompt length"""
    prompt_tokens_max: int = 7000
    """--prompt-tokens-max: max prompt length"""
    output_tokens: int = 512
    """--output-tokens: mean output length"""
    output_tokens_stdev: int = 256
    """--output-tokens-stdev: output length standard deviation"""
    output_tokens_min: int = 2
    """--output-tokens-min: min output length"""
    output_tokens_max: int = 7000
    """--output-tokens-max: max output length"""
    timeout: int = 300
    """--timeout: per-request deadline (s); negative disables"""

    # Outputs

    trace_output: str = ""
    """--trace-output: export the workload as <prefix>.yaml + <prefix>.csv"""
    metrics_path: str = ""
    """--metrics-path: write the summary + per-request JSON here"""
    results_path: str = ""
    """--results-path: same as --metrics-path (the older name)"""
    output_dir: str = ""
    """--output-dir: write summary.parquet and requests.parquet here"""

    # blis replay

    trace_header: str = ""
    """--trace-header: replay: the trace v2 header YAML"""
    trace_data: str = ""
    """--trace-data: replay: the trace v2 data CSV"""
    session_mode: str = "fixed"
    """--session-mode: replay: fixed (trace arrivals) or closed-loop (follow-ups after
    completions)"""
    think_time_dist: str = ""
    """--think-time-dist: replay closed-loop: think time,
    lognormal:mu=..,sigma=..[,min=..,max=..] or constant:value=<time>"""

    # Given explicitly

    explicit: frozenset[str] = frozenset()
    """The fields set explicitly (by a flag, an API keyword, a sweep value or a recorded run);
    the others hold their defaults."""
