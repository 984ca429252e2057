"""The policy registries and the options table: what derives from them, and that their
declarations (kernel codes, config slots, checks) are consistent."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from blis_fast.cli_options import help_text
from blis_fast.config.policy_bundle import load_policy_bundle, select_policies
from blis_fast.engine import engine_config
from blis_fast.errors import BlisConfigError
from blis_fast.kernels.cluster.admission import Admission, AdmissionReason, RouterParam
from blis_fast.kernels.cluster.router_state import RouterCfg
from blis_fast.kernels.engine.batch import Priority
from blis_fast.kernels.engine.state import ConfigSlot
from blis_fast.kernels.enums import Routing, StatefulScorer
from blis_fast.options import (
    CHECK_ORDER,
    OPTIONS_BY_FLAG,
    RUN_OPTIONS,
    Check,
    RunOptions,
    build_options,
    check_options,
)
from blis_fast.policies import family
from blis_fast.policies.admission import ADMISSION, admission_params, admission_reasons
from blis_fast.policies.registry import Param, Policy
from blis_fast.policies.scorers import SCORERS, Scorer
from blis_fast.runner import prepare

MODEL = "meta-llama/llama-3.1-8b-instruct"
FAMILIES = ("admission", "routing", "scorers", "priority", "scheduler", "latency_backends",
            "deciders", "encode_deciders")


def _declared_slots() -> list[tuple[str, str]]:
    """(who, slot) of every kernel config slot the options table and the registries declare."""
    slots = [(f"--{spec.flag}", spec.slot) for spec in RUN_OPTIONS if spec.slot]
    slots += [(name, family(name).slot) for name in FAMILIES if family(name).slot]
    slots += [(p.key, p.slot) for p in admission_params()]
    return slots


def test_every_declared_slot_is_a_kernel_constant_used_once():
    seen: dict[tuple[str, int], str] = {}
    for who, slot in _declared_slots():
        array, constant = slot.split(".")
        index = getattr(engine_config.SLOT_ARRAYS[array], constant)  # AttributeError: no such slot
        assert (array, index) not in seen, f"{who} and {seen[array, index]} share {slot}"
        seen[array, index] = who
    assert len(seen) == len(_declared_slots()) >= 23


@pytest.mark.parametrize("name", FAMILIES)
def test_kernel_codes_are_distinct_within_a_family(name):
    registry = family(name)
    codes = [registry.code(n) for n in registry.entries]
    assert len(set(codes)) == len(codes)
    if name != "scorers":  # the flag's default is what an empty name means
        assert registry.codes()[""] == registry.code(registry.default_name)


def test_valid_names_and_help_come_from_the_registries():
    names = ADMISSION.valid_names()
    assert names == tuple(sorted(names)) and "custom" not in names  # a user-function entry
    assert {"always-admit", "gaie-legacy", "reject-all", "tier-shed", "token-bucket"} <= set(names)
    assert {"blackbox", "crossmodel", "roofline", "trained-physics", "trained-roofline"} <= set(
        family("latency_backends").valid_names())
    assert "custom" in SCORERS and "custom" not in SCORERS.valid_names()
    assert help_text(OPTIONS_BY_FLAG["scheduler"]) == (
        "instance scheduler: fcfs, priority-fcfs, reverse-priority, sjf; custom through the "
        "Python API")
    assert family("routing").codes() == {
        "": Routing.ROUND_ROBIN, "round-robin": Routing.ROUND_ROBIN,
        "least-loaded": Routing.LEAST_LOADED, "always-busiest": Routing.ALWAYS_BUSIEST,
        "weighted": Routing.WEIGHTED}
    assert family("priority").code("") == Priority.CONSTANT


def test_admission_reasons_cover_every_kernel_reason():
    """Every reason code the kernel can record has its decision-trace text (CLU-6)."""
    reasons = admission_reasons()
    codes = set(AdmissionReason)
    assert set(reasons) == codes
    assert (reasons[AdmissionReason.NONE], reasons[AdmissionReason.NO_TOKENS], reasons[AdmissionReason.GAIE],
            reasons[AdmissionReason.TENANT_BUDGET]) == ("", "insufficient tokens", "gaie-saturated",
                                                 "tenant-budget-shed")


def test_a_scorer_must_say_whether_it_reads_the_cache():
    with pytest.raises(TypeError, match="reads_cache"):
        Scorer("forgetful", function=object())  # type: ignore[call-arg]
    assert SCORERS.reads_cache(["precise-prefix-cache"]) and SCORERS.reads_cache(["custom"])
    assert not SCORERS.reads_cache(["queue-depth", "prefix-affinity"])


def test_scorer_codes_index_the_function_table():
    table = SCORERS.table("USER")
    for name, scorer in SCORERS.entries.items():
        code = SCORERS.code(name)
        if scorer.code >= 0:
            assert code == scorer.code < StatefulScorer.TABLE_BASE
        else:
            assert table[code - StatefulScorer.TABLE_BASE] is (scorer.function or "USER")


def test_check_order_names_each_checked_flag_once():
    listed = [flag for flags in CHECK_ORDER.values() for flag in flags]
    assert len(listed) == len(set(listed))
    assert set(listed) == {spec.flag for spec in RUN_OPTIONS if spec.checks}


def test_run_options_are_typed_frozen_and_default_from_the_table():
    opts = build_options({"num_requests": "0x10", "alpha_coeffs": "1,2,3"})
    assert opts.num_requests == 16 and opts.alpha_coeffs == (1.0, 2.0, 3.0)
    assert opts.given("num_requests") and not opts.given("rate")
    assert opts.total_kv_blocks == OPTIONS_BY_FLAG["total-kv-blocks"].default == 1_000_000
    assert isinstance(opts, RunOptions)
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.seed = 1  # type: ignore[misc]
    fields = {f.name: f.type for f in dataclasses.fields(RunOptions)}
    assert fields["num_requests"] is int and fields["rate"] is float


@pytest.mark.parametrize(("stage", "values", "message"), [
    ("workload", {"prefix_tokens": -1, "concurrency": -1},
     "--prefix-tokens must be >= 0, got -1"),
    ("workload", {"think_time_ms": 1 << 60}, "--think-time-ms 1152921504606846976 is beyond"),
    ("timeout", {"timeout": 0}, "--timeout must be positive (seconds) or negative to disable"),
    ("latency", {"beta_coeffs": (1.0, float("nan"))},
     "--beta-coeffs[1] must be a finite non-negative number, got nan"),
    ("kv-tier", {"kv_offload_threshold": 1.5},
     "--kv-offload-threshold must be a finite value in [0, 1], got 1.500000"),
    ("engine", {"num_instances": 0, "horizon": 0}, "num-instances must be >= 1"),
])
def test_check_options_reports_the_first_bad_flag_of_a_stage(stage, values, message):
    with pytest.raises(BlisConfigError) as err:
        check_options(RunOptions(**values), stage)
    assert str(err.value).startswith(message)
    check_options(RunOptions(), stage)  # the defaults pass every check


def test_a_new_admission_parameter_is_a_bundle_key_checked_merged_and_packed(
        monkeypatch, tmp_path):
    """The registry half of the admission recipe: one entry with one parameter makes a
    bundle key (decoded, checked on any bundle), a merged value and a packed kernel slot."""
    knob = Param("knob", float, "RouterParam.GAIE_QD", default=2.5,
                 bundle_check=Check(lambda v: v < 10, "{flag} must be < 10, got {value}"))
    monkeypatch.setitem(ADMISSION.entries, "knobbed",
                        Policy("knobbed", Admission.ALWAYS, params=(knob,)))
    bundle = tmp_path / "b.yaml"
    bundle.write_text("admission:\n  policy: knobbed\n  knob: 12\n")
    with pytest.raises(BlisConfigError, match="knob must be < 10, got 12.0"):
        load_policy_bundle(str(bundle))
    bundle.write_text("admission:\n  policy: knobbed\n  knob: 7\n")
    opts = build_options({"policy_config": str(bundle)})
    pol = select_policies(opts, None)
    assert pol.admission == "knobbed" and pol.params["knob"] == 7.0
    assert select_policies(RunOptions(), None).params["knob"] == 2.5


def test_engine_config_packs_every_slot_from_the_resolved_parts():
    p = prepare(build_options({"model": MODEL, "num_requests": 3, "log": "error",
                               "admission_latency": 17, "counterfactual_k": 9,
                               "admission_policy": "token-bucket",
                               "token_bucket_capacity": 123.0}))
    ic = np.zeros(ConfigSlot.SIZE, np.int64)
    rcfg = np.zeros(RouterCfg.SIZE, np.int64)
    rfl = np.zeros(RouterParam.SIZE, np.float64)
    p.engine.pack_slots({"ConfigSlot": ic, "RouterCfg": rcfg, "RouterParam": rfl})
    assert ic[ConfigSlot.ADMISSION_LATENCY] == 17 and ic[ConfigSlot.N_INSTANCES] == 1
    assert ic[ConfigSlot.MAX_MODEL_LEN] == p.latency.max_model_len > 0  # resolved, not the flag's 0
    assert ic[ConfigSlot.BACKEND] == p.latency.code
    assert rcfg[RouterCfg.COUNTERFACTUAL_K] == 1  # k capped at the instance count
    assert rcfg[RouterCfg.ADMISSION] == Admission.TOKEN_BUCKET
    assert rfl[RouterParam.TB_CAPACITY] == 123.0 and rfl[RouterParam.TB_REFILL] == 1000.0
    assert rfl[RouterParam.GAIE_QD] == 5.0 and rfl[RouterParam.GAIE_KV] == 0.8
