"""LoRA configuration (issue 31): the ``--lora-config`` file, ``defaults.yaml``'s block and the
flags resolved and validated in the reference's order and words (LORA-1.2..1.6), the HBM
reservation in the KV auto-calculation (LORA-6.2..6.4, figures of the reference's runs),
``--lora-scorer-weight`` (LORA-7.3), the workload ``adapter`` field and its check (LORA-1.7,
1.8), and the trace ``adapter`` column round trip (LORA-8.5, 1.9)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _cli import invoke

from blis_fast.config.defaults import load_defaults
from blis_fast.config.latency import resolve_latency
from blis_fast.config.lora import (
    LoRAAdapter,
    LoRAConfig,
    check_workload_adapters,
    compose_scorer_weight,
    resolve_lora,
)
from blis_fast.data import data_path
from blis_fast.errors import BlisConfigError, BlisInputError
from blis_fast.options import build_options
from blis_fast.policies.scorers import DEFAULT_PROFILE
from blis_fast.workload.generator import generate_workload
from blis_fast.workload.replay import load_trace_records, replay_workload
from blis_fast.workload.spec_yaml import parse_workload_spec
from blis_fast.workload.trace_v2 import TraceOutcome, build_trace_csv

MODEL = "meta-llama/llama-3.1-8b-instruct"
DEFAULTS = load_defaults(data_path("defaults.yaml")).lora
PREFIX = "Invalid LoRA configuration: LoRAConfig: "


def _resolve(tmp_path: Path, text: str | None = None, **flags) -> LoRAConfig:
    given = {"model": MODEL, **flags}
    if text is not None:
        path = tmp_path / "lora.yaml"
        path.write_text(text)
        given["lora_config"] = str(path)
    return resolve_lora(build_options(given), DEFAULTS)


def _refusal(tmp_path: Path, text: str | None = None, **flags) -> str:
    with pytest.raises((BlisConfigError, BlisInputError)) as err:
        _resolve(tmp_path, text, **flags)
    return str(err.value)


TWO = "  adapters:\n    - {id: a0, rank: 8}\n    - {id: a1, rank: 32}\n"


def test_no_file_no_flag_is_inert_with_the_default_coefficients(tmp_path):
    """LORA-1.3/1.4: the defaults' scalars and tiers, no capacity, no registry."""
    cfg = _resolve(tmp_path)
    assert not cfg.active and cfg.capacity is None and cfg.adapters == ()
    assert (cfg.load_base_latency_us, cfg.load_bandwidth_bytes_us,
            cfg.footprint_bytes_per_rank) == (1500.0, 2e6, 2e6)
    assert cfg.tiers == ((8, 0.02, 1.0), (16, 0.035, 1.0), (32, 0.06, 1.0))
    assert cfg.reserved_bytes() == 0


def test_precedence_file_then_defaults_then_flags(tmp_path):
    """LORA-1.3: the file's scalars win over the defaults, a given flag over both; a file
    naming one tier replaces every default tier (LORA-D11), k6 absent is 0."""
    cfg = _resolve(tmp_path, "lora:\n  adapter_capacity: 3\n  load_base_latency_us: 10\n"
                   "  step_overhead_tiers:\n    64: {k7: 2}\n" + TWO,
                   lora_load_bandwidth_bytes_us="1e3", lora_adapter_capacity=2)
    assert cfg.active and cfg.capacity == 2
    assert (cfg.load_base_latency_us, cfg.load_bandwidth_bytes_us,
            cfg.footprint_bytes_per_rank) == (10.0, 1e3, 2e6)
    assert cfg.tiers == ((64, 0.0, 2.0),)
    # LORA-4.3: 10 + ceil(2e6 * 32 / 1e3) = 64010 µs; an unregistered id loads in one tick
    assert cfg.load_ticks("a1") == 64010 and cfg.load_ticks("zz") == 1
    assert cfg.rank_of("a0") == 8 and cfg.rank_of("zz") == 0


def test_float_ints_are_truncated_and_quoted_numbers_refused(tmp_path):
    """LORA-1.2: go-yaml truncates a float in an int field; a quoted number is a string."""
    cfg = _resolve(tmp_path, "lora:\n  adapter_capacity: 2.7\n  adapters:\n"
                   "    - {id: a0, rank: 8.9}\n  step_overhead_tiers:\n    16.5: {k6: 0.1, k7: 1}\n")
    assert cfg.capacity == 2 and cfg.adapters == (LoRAAdapter("a0", 8),)
    assert cfg.tiers == ((16, 0.1, 1.0),)
    assert "expected an integer" in _refusal(tmp_path, 'lora:\n  adapter_capacity: "8"\n')


@pytest.mark.parametrize(("text", "fragment"), [
    ("lora:\n  capacity: 2\n", "unknown key 'capacity'"),
    ("other: 1\n", "unknown key 'other'"),
    ("lora:\n  adapters:\n    - {id: a, rank: 8, alias: b}\n", "unknown key 'alias'"),
    ("lora:\n  step_overhead_tiers:\n    8: {k6: 1, k8: 1}\n", "unknown key 'k8'"),
    ("", "the file is empty"),
])
def test_the_file_is_strict(tmp_path, text, fragment):
    message = _refusal(tmp_path, text)
    assert message.startswith("--lora-config: ") and fragment in message


@pytest.mark.parametrize("text", ["lora:\n", "lora: {}\n"])
def test_an_empty_block_is_valid_and_inert(tmp_path, text):
    assert not _resolve(tmp_path, text).active


def test_an_unreadable_file_names_the_flag(tmp_path):
    message = _refusal(tmp_path, lora_config=str(tmp_path / "missing.yaml"))
    assert message.startswith("--lora-config: cannot read ")


@pytest.mark.parametrize(("text", "flags", "message"), [
    # step 1 comes before the registry's own errors
    ("lora:\n  adapters:\n    - {id: '', rank: 0}\n", {"lora_adapter_capacity": 0},
     "adapter_capacity must be > 0 when adapters are declared, got 0"),
    ("lora:\n  adapter_capacity: -3\n", {}, None),  # no adapters: capacity <= 0 is inert
    ("lora:\n  adapters:\n    - {id: '', rank: 0}\n", {}, "adapter[0] has empty id"),
    ("lora:\n  adapters:\n    - {id: a, rank: 0}\n", {}, 'adapter "a" rank must be > 0, got 0'),
    ("lora:\n  adapters:\n    - {id: a, rank: 8}\n    - {id: a, rank: 8}\n", {},
     'duplicate adapter id "a"'),
    # the registry before the coefficients
    ("lora:\n  load_base_latency_us: -1\n  adapters:\n    - {id: a, rank: -1}\n", {},
     'adapter "a" rank must be > 0, got -1'),
    ("lora:\n  load_base_latency_us: -1\n", {},
     "load_base_latency_us must be finite and >= 0, got -1"),
    ("lora:\n  load_base_latency_us: .nan\n  load_bandwidth_bytes_us: 0\n", {},
     "load_base_latency_us must be finite and >= 0, got NaN"),
    (None, {"lora_load_bandwidth_bytes_us": 0},  # LORA-D12: fatal in a LoRA-free run
     "load_bandwidth_bytes_us must be finite and > 0 (divisor guard), got 0"),
    (None, {"lora_footprint_bytes_per_rank": "+Inf"},
     "footprint_bytes_per_rank must be finite and > 0, got +Inf"),
    ("lora:\n  step_overhead_tiers:\n    0: {k7: 1}\n", {},
     "step_overhead_tiers rank key must be > 0, got 0"),
    ("lora:\n  step_overhead_tiers:\n    8: {k6: -0.5, k7: 1}\n", {},
     "step_overhead_tiers[8].k6 must be finite and >= 0, got -0.5"),
    ("lora:\n  step_overhead_tiers:\n    8: {k6: 0.5}\n", {},
     "step_overhead_tiers[8].k7 must be finite and > 0 (divisor guard)"),
    # several bad tiers: blis_fast reports the lowest key (the reference: map order, LORA-D5)
    ("lora:\n  step_overhead_tiers:\n    32: {k7: 0}\n    16: {k7: -1}\n", {},
     "step_overhead_tiers[16].k7 must be finite and > 0 (divisor guard)"),
])
def test_validation_order_and_messages(tmp_path, text, flags, message):
    """LORA-1.5: the first failure wins, in the reference's order and words."""
    if message is None:
        assert not _resolve(tmp_path, text, **flags).active
        return
    expected = PREFIX + message
    for field in flags:  # blis_fast names the flag that set the refused value
        key = field.removeprefix("lora_")
        if message.startswith(f"{key} must"):
            expected += f" (set by --{field.replace('_', '-')})"
    assert _refusal(tmp_path, text, **flags) == expected


def test_active_without_coefficients_is_refused(tmp_path):
    """LORA-1.5 step 6, reachable with a defaults file that has no ``lora:`` block."""
    path = tmp_path / "lora.yaml"
    path.write_text("lora:\n  adapter_capacity: 1\n" + TWO)
    opts = build_options({"model": MODEL, "lora_config": str(path)})
    with pytest.raises(BlisConfigError) as err:
        resolve_lora(opts, None)
    assert str(err.value) == PREFIX + (
        "load_base_latency_us, load_bandwidth_bytes_us, and footprint_bytes_per_rank must all "
        "be set when adapters are declared with a positive capacity")


def test_cost_model_bounds(tmp_path):
    """LORA-1.6 (active configs only): a load latency past 1e15 µs, a reservation past 1e18."""
    head = "Invalid LoRA configuration (HBM reservation): lora.NewCostModel: "
    text = "lora:\n  adapter_capacity: 1\n  adapters:\n    - {id: big, rank: 1000000000}\n"
    assert _refusal(tmp_path, text, lora_load_bandwidth_bytes_us=1e-3) == head + (
        'adapter "big" rank 1000000000 yields an unusable load latency (2.0000000000000015e+18 µs) — reduce rank '
        "or footprint_bytes_per_rank")
    wide = "lora:\n  adapter_capacity: 2\n  adapters:\n    - {id: w, rank: 1000000}\n"
    assert _refusal(tmp_path, wide, lora_footprint_bytes_per_rank=1e12) == head + (
        "static HBM reservation (capacity 2 × footprint_bytes_per_rank 1e+12 × max rank "
        "1000000 = 2e+18 bytes) is unusable — reduce adapter_capacity, "
        "footprint_bytes_per_rank, or the maximum declared rank")
    # without capacity the same registry is inert and unchecked
    assert not _resolve(tmp_path, "lora:\n  adapters:\n    - {id: big, rank: 1000000000}\n",
                        lora_load_bandwidth_bytes_us=1e-3).active


@pytest.mark.parametrize(("tp", "capacity", "footprint", "rank", "blocks"), [
    (1, 0, 2e6, 32, 26312),
    (1, 1, 2e6, 32, 26282),
    (1, 2, 2e6, 32, 26251),
    (1, 4, 2.095e8, 64, 739),
    (2, 0, 2e6, 32, 125278),
    (2, 6, 3.38e8, 64, 1499),
])
def test_reservation_shrinks_the_auto_calculated_kv_blocks(tp, capacity, footprint, rank, blocks):
    """LORA-6.2: the reference's figures for llama-3.1-8b on H100 (0.9 utilisation)."""
    cfg = LoRAConfig(capacity=capacity or None, load_base_latency_us=1500.0,
                     load_bandwidth_bytes_us=2e6, footprint_bytes_per_rank=footprint,
                     adapters=(LoRAAdapter("small", 8), LoRAAdapter("big", rank)))
    opts = build_options({"model": MODEL, "latency_model": "roofline", "tp": tp})
    latency = resolve_latency(opts, cfg)
    assert latency.total_kv_blocks == blocks
    assert latency.lora_reserved_bytes == (int(capacity * footprint * rank) if capacity else 0)
    reserved = [m for m in latency.infos if "GPU HBM for LoRA adapters" in m]
    assert len(reserved) == (1 if capacity else 0)


def test_reservation_beyond_the_gpu_is_fatal_and_explicit_blocks_skip_it():
    """LORA-6.4 (the case lora-invalid-reservation-exceeds-hbm) and LORA-6.3 / LORA-D10."""
    cfg = LoRAConfig(capacity=8, load_base_latency_us=1500.0, load_bandwidth_bytes_us=2e6,
                     footprint_bytes_per_rank=1e9, adapters=(LoRAAdapter("a", 64),))
    opts = build_options({"model": MODEL, "latency_model": "roofline"})
    with pytest.raises(BlisConfigError) as err:
        resolve_latency(opts, cfg)
    assert str(err.value) == (
        "--latency-model: KV capacity auto-calculation failed: CalculateKVBlocks: model overhead "
        "(497.44 GiB = 14.96 weights + 5.50 activation + 0.15 non-torch + 476.84 "
        "lora-adapter-reservation) exceeds available GPU memory (72.00 GiB = 80.0 GiB × 90% "
        "util × 1 GPUs). Minimum GPUs required per instance: 7")
    explicit = build_options({"model": MODEL, "latency_model": "roofline",
                              "total_kv_blocks": 5000})
    latency = resolve_latency(explicit, cfg)
    assert latency.total_kv_blocks == 5000
    assert any(m.startswith("--total-kv-blocks set explicitly (5000 blocks); the static LoRA "
                            "adapter HBM reservation (476.84 GiB) is NOT applied")
               for m in latency.warnings)


def test_scorer_weight_composition():
    """LORA-7.3: appended last to the flag/bundle profile or the default profile; refused when
    not finite and positive or when the profile already names lora-affinity; a warning (and
    no check) with another routing policy."""
    cfg = LoRAConfig(scorer_weight=2.0)
    scorers, warning = compose_scorer_weight(cfg, "weighted", (), DEFAULT_PROFILE)
    assert scorers == (*DEFAULT_PROFILE, ("lora-affinity", 2.0)) and warning is None
    scorers, _ = compose_scorer_weight(cfg, "weighted", (("queue-depth", 1.0),), DEFAULT_PROFILE)
    assert scorers == (("queue-depth", 1.0), ("lora-affinity", 2.0))
    assert compose_scorer_weight(LoRAConfig(), "weighted", (), DEFAULT_PROFILE) == ((), None)
    for weight, text in ((0.0, "0"), (-1.0, "-1"), (float("nan"), "NaN"), (float("inf"), "+Inf")):
        with pytest.raises(BlisConfigError) as err:
            compose_scorer_weight(LoRAConfig(scorer_weight=weight), "weighted", (),
                                  DEFAULT_PROFILE)
        assert str(err.value) == ("Invalid --lora-scorer-weight: weight must be a finite "
                                  f"positive number, got {text}")
    with pytest.raises(BlisConfigError, match="already present in the scorer profile"):
        compose_scorer_weight(cfg, "weighted", (("lora-affinity", 1.0),), DEFAULT_PROFILE)
    scorers, warning = compose_scorer_weight(LoRAConfig(scorer_weight=0.0), "round-robin", (),
                                             DEFAULT_PROFILE)
    assert scorers == () and warning == ('--lora-scorer-weight has no effect when routing policy '
                                         "is \"round-robin\" (only applies to 'weighted')")


def test_workload_references():
    """LORA-1.8: clients then cohorts in spec order; base_model against the entry's own model."""
    cfg = LoRAConfig(capacity=1, adapters=(LoRAAdapter("a0", 8, MODEL), LoRAAdapter("a1", 8)))
    check_workload_adapters(cfg, [("client", "c", MODEL, "a0"), ("client", "d", "", "a1"),
                                  ("client", "e", "", "")])

    def refusal(cfg, entries):
        with pytest.raises(BlisConfigError) as err:
            check_workload_adapters(cfg, entries)
        return str(err.value)

    assert refusal(None, [("client", "c", "", "a0")]) == (
        'LoRA workload validation: client "c" references adapter "a0" but no adapters are '
        "declared")
    assert refusal(cfg, [("client", "c", "", "a9"), ("cohort", "h", "", "zz")]) == (
        'LoRA workload validation: client "c" references unknown adapter "a9" (not in registry)')
    # LORA-D8: an absent model does not match a declared base model, even if --model does
    assert refusal(cfg, [("cohort", "h", "", "a0")]) == (
        'LoRA workload validation: cohort "h" model "" does not match adapter "a0" base model '
        f'"{MODEL}"')


SPEC = """\
version: "2"
seed: 5
aggregate_rate: 50.0
num_requests: 40
clients:
  - id: plain
    rate_fraction: 0.3
    arrival: {process: poisson}
    input_distribution: {type: constant, params: {value: 40}}
    output_distribution: {type: constant, params: {value: 5}}
  - id: tuned
    rate_fraction: 0.4
    adapter: "ad,1"
    arrival: {process: poisson}
    input_distribution: {type: constant, params: {value: 40}}
    output_distribution: {type: constant, params: {value: 5}}
cohorts:
  - id: crowd
    population: 2
    rate_fraction: 0.3
    adapter: ad2
    arrival: {process: poisson}
    input_distribution: {type: constant, params: {value: 40}}
    output_distribution: {type: constant, params: {value: 5}}
"""


def _adapters_of(table) -> list[str]:
    return [table.adapter(i) for i in range(table.n)]


def test_adapters_ride_on_rows_and_round_trip_through_the_trace(tmp_path):
    """LORA-1.7: every request of a client or cohort member carries its adapter, without
    changing generation; LORA-8.5/1.9: the trailing column is written and replayed."""
    spec = parse_workload_spec(SPEC, source="wl.yaml")
    table = generate_workload(spec, max_requests=40).table
    plain = generate_workload(parse_workload_spec(
        SPEC.replace('    adapter: "ad,1"\n', "").replace("    adapter: ad2\n", ""),
        source="wl.yaml"), max_requests=40).table
    assert np.array_equal(table.arrival_us, plain.arrival_us)
    assert np.array_equal(table.chunk_digests, plain.chunk_digests)
    assert plain.adapter_idx is None and plain.adapter_names == ()
    ids = [table.clients[k]["id"] for k in table.client_idx.tolist()]
    expected = ["" if c == "plain" else "ad,1" if c == "tuned" else "ad2" for c in ids]
    assert _adapters_of(table) == expected and {"ad,1", "ad2", ""} <= set(expected)
    assert table.adapter_names[0] == next(a for a in expected if a)  # first-seen order

    n = table.n
    outcome = TraceOutcome(np.zeros(n, np.int8), np.full(n, 10, np.int64), np.zeros(n, np.int64))
    csv_text = build_trace_csv(table, outcome)
    header, first = csv_text.splitlines()[:2]
    assert header.endswith(",finish_reason,adapter")
    assert first.endswith("," + ('"ad,1"' if expected[0] == "ad,1" else expected[0]))
    assert "adapter" not in build_trace_csv(plain, outcome).splitlines()[0]
    path = tmp_path / "t.csv"
    path.write_text(csv_text)
    replayed = replay_workload(load_trace_records(str(path)), 1, 16).table
    assert _adapters_of(replayed) == expected
    # the column is found by its name and trimmed (LORA-8.5)
    lines = csv_text.splitlines()
    path.write_text("\n".join([lines[0].replace(",adapter", ", adapter ")]
                              + [line + " " if line.endswith("ad2") else line
                                 for line in lines[1:]]) + "\n")
    assert _adapters_of(replay_workload(load_trace_records(str(path)), 1, 16).table) == expected


def test_cli_refuses_with_one_line_and_exit_2(tmp_path):
    """A bad LoRA configuration: one stderr line naming the problem, exit 2, no output file."""
    lora = tmp_path / "lora.yaml"
    lora.write_text("lora:\n  adapter_capacity: 2\n  adapters:\n    - {id: a0, rank: 8}\n")
    out = tmp_path / "results.json"
    res = invoke(["run", "--model", MODEL, "--log", "error", "--lora-config", str(lora),
                  "--lora-adapter-capacity", "0", "--metrics-path", str(out)])
    assert res.code == 2 and res.stdout == ""
    assert res.stderr.count("\n") == 1 and "adapter_capacity must be > 0" in res.stderr
    assert not out.exists()


def test_pd_pools_apply_the_reservation_even_with_explicit_blocks(tmp_path):
    """LORA-6.3 / LORA-D10: an explicit --total-kv-blocks keeps the global count (with a
    warning) while each P/D pool's auto-calculation subtracts the reservation: TP 2 pools of
    llama-3.1-8b on H100 get the reference's 1,499 blocks with 6 x 3.38e8 x 64."""
    from blis_fast.runner import prepare

    lora = tmp_path / "lora.yaml"
    lora.write_text("lora:\n  adapter_capacity: 6\n  footprint_bytes_per_rank: 3.38e8\n"
                    "  adapters:\n    - {id: a, rank: 64}\n")
    opts = build_options({"model": MODEL, "latency_model": "roofline", "num_instances": 2,
                          "total_kv_blocks": 5000, "prefill_instances": 1,
                          "decode_instances": 1, "prefill_tp": 2, "decode_tp": 2,
                          "num_requests": 2, "lora_config": str(lora), "log": "error"})
    prepared = prepare(opts)
    assert prepared.engine.options.total_kv_blocks == 5000
    assert prepared.engine.instance_kv_blocks == (1499, 1499)
    assert prepared.engine.lora is not None and prepared.engine.lora.active


def test_node_pools_apply_the_reservation(tmp_path):
    """LORA-6.3: the node-pool per-instance auto-calculation subtracts it too (80 GiB H100:
    26,282 blocks with 1 x 2e6 x 32, as the global calculation)."""
    from blis_fast.config.autoscale import resolve_autoscale
    from blis_fast.config.policy_bundle import load_policy_bundle

    bundle = tmp_path / "bundle.yaml"
    bundle.write_text("node_pools:\n  - {name: s, gpu_type: H100, gpus_per_node: 1, "
                      "gpu_memory_gib: 80, initial_nodes: 2, max_nodes: 2}\n")
    opts = build_options({"model": MODEL, "policy_config": str(bundle)})
    cfg = LoRAConfig(capacity=1, load_base_latency_us=1500.0, load_bandwidth_bytes_us=2e6,
                     footprint_bytes_per_rank=2e6, adapters=(LoRAAdapter("a", 32),))
    setup = resolve_autoscale(opts, load_policy_bundle(str(bundle)), resolve_latency(opts, cfg))
    assert setup.label_blocks == [26282]
