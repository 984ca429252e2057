"""P/D flags (PD-1.2): the reference's checks in its order and with its texts, for ``blis run``
and ``blis replay``; the pool layout by index."""

from __future__ import annotations

import pytest

from blis_fast.config.pd import PDConfig, check_construction, topology_error, validate_pd
from blis_fast.errors import BlisConfigError
from blis_fast.options import build_options
from blis_fast.policies import family

BASE = {"model": "meta-llama/llama-3.1-8b-instruct", "num_instances": 4}


def _validate(replay: bool = False, **given):
    return validate_pd(build_options({**BASE, **given}), replay)


@pytest.mark.parametrize(("given", "message"), [
    ({"prefill_instances": -1, "decode_instances": -2}, "--prefill-instances must be >= 0, got -1"),
    ({"decode_instances": -2}, "--decode-instances must be >= 0, got -2"),
    ({"prefill_decode_instances": -3}, "--prefill-decode-instances must be >= 0, got -3"),
    # the decider before the topology
    ({"pd_decider": "sometimes", "prefill_instances": 9},
     'Unknown PD decider "sometimes". Valid: always, never, prefix-threshold'),
    ({"encode_instances": -1},
     "Invalid PD pool topology: encode-instances must be >= 0, got -1"),
    ({"encode_instances": 1},
     "Invalid PD pool topology: encode-instances (1) requires a decode-capable pool"),
    ({"prefill_instances": 1},
     "Invalid PD pool topology: both --prefill-instances and --decode-instances must be set "
     "when PD disaggregation is enabled without shared-role pods (got prefill=1, decode=0)"),
    ({"prefill_instances": 2, "decode_instances": 2, "prefill_decode_instances": 1},
     "Invalid PD pool topology: prefill-instances (2) + decode-instances (2) + "
     "prefill-decode-instances (1) + encode-instances (0) = 5 exceeds num-instances (4)"),
    ({"prefill_instances": 1, "decode_instances": 1, "pd_transfer_bandwidth": "NaN"},
     "--pd-transfer-bandwidth must be a finite positive number, got NaN"),
    ({"prefill_instances": 1, "decode_instances": 1, "pd_transfer_bandwidth": "+Inf"},
     "--pd-transfer-bandwidth must be a finite positive number, got +Inf"),
    ({"prefill_instances": 1, "decode_instances": 1, "pd_transfer_base_latency": -0.5},
     "--pd-transfer-base-latency must be a finite non-negative number, got -0.500000"),
    ({"pd_decider": "prefix-threshold", "pd_prefix_threshold": -5},
     "--pd-prefix-threshold must be >= 0, got -5"),
    ({"encode_decider": "bogus"}, 'Unknown encode decider "bogus". Valid: always, multimodal, '
                                  "never"),
    ({"encode_decider": "always"},
     '--encode-decider="always" requires --encode-instances > 0 (the encode pool is disabled)'),
    ({"prefill_instances": 1, "decode_instances": 1, "prefill_tp": 0, "decode_tp": -1},
     "--prefill-tp must be > 0, got 0"),
    ({"prefill_instances": 1, "decode_instances": 1, "decode_latency_model": "fast"},
     '--decode-latency-model "fast" is not a recognized backend; valid: blackbox,'),
    ({"prefill_instances": 1, "decode_instances": 1, "decode_max_model_len": -4},
     "--decode-max-model-len must be > 0 when set, got -4"),
    ({"prefill_routing_scorers": "bogus:1"},
     "Invalid --prefill-routing-scorers: unknown scorer 'bogus'"),
])
def test_a_bad_pd_flag_is_refused_with_the_reference_text(given, message):
    with pytest.raises(BlisConfigError) as err:
        _validate(**given)
    assert str(err.value).startswith(message)


def test_pure_shared_pods_skip_the_transfer_checks_as_the_reference_does():
    pd = _validate(prefill_decode_instances=2, pd_transfer_bandwidth=-1, pd_decider="always")
    assert pd.on and pd.bandwidth_gbps == -1
    assert pd.warnings == (
        "with --prefill-instances=0 and --prefill-decode-instances=2 the decider acts on the "
        "shared pods; per-pool flags are ignored and --pd-transfer-bandwidth/"
        "--pd-transfer-base-latency are not checked (reference behaviour)",)


@pytest.mark.parametrize(("given", "warning", "replay_error"), [
    ({"pd_prefix_threshold": 8, "prefill_instances": 1, "decode_instances": 1,
      "pd_decider": "always"},
     '--pd-prefix-threshold=8 is ignored when --pd-decider="always" (only applies to the '
     "prefix-threshold decider)",
     '--pd-prefix-threshold=8 has no effect when --pd-decider="always"'),
    ({"pd_decider": "always"},
     '--pd-decider="always" has no effect because --prefill-instances=0 (disaggregation is '
     "disabled); set --prefill-instances and --decode-instances to enable",
     '--pd-decider="always" has no effect because --prefill-instances=0 (disaggregation is '
     "disabled); set --prefill-instances > 0 and --decode-instances > 0, or omit --pd-decider"),
    ({"decode_tp": 2},
     "per-pool hardware flags (--prefill-tp, --decode-tp, etc.) have no effect when "
     "--prefill-instances=0 (disaggregation is disabled)",
     "per-pool hardware flags (--prefill-tp, --decode-tp, etc.) have no effect when "
     "--prefill-instances=0 (disaggregation is disabled); either set"),
])
def test_no_effect_cases_warn_in_run_and_are_refused_in_replay(given, warning, replay_error):
    assert _validate(**given).warnings == (warning,)
    with pytest.raises(BlisConfigError) as err:
        _validate(replay=True, **given)
    assert str(err.value).startswith(replay_error)


def test_valid_flags_resolve_and_the_defaults_are_off():
    off = _validate()
    assert not off.on and off.warnings == () and off.decider == "never"
    pd = _validate(prefill_instances=1, decode_instances=2, prefill_decode_instances=1,
                   pd_decider="prefix-threshold", pd_prefix_threshold=128,
                   decode_routing_scorers="queue-depth:2,kv-utilization:1")
    assert pd.on and pd.threshold == 128 and pd.warnings == ()
    assert pd.decode_scorers == (("queue-depth", 2.0), ("kv-utilization", 1.0))
    assert pd.roles(6).tolist() == [1, 2, 2, 3, 0, 0]
    assert PDConfig(prefill=1, decode=1, encode=1).roles(4).tolist() == [1, 2, 4, 0]


def test_topology_allows_shared_pods_alone_and_refuses_half_pools():
    assert topology_error(0, 0, 2, 0, 2) is None
    assert topology_error(0, 0, 0, 0, 1) is None
    assert topology_error(0, 1, 1, 0, 2) is None
    assert topology_error(0, 1, 0, 0, 2).startswith("both --prefill-instances")


def test_contention_needs_pools_and_the_cpu_tier_is_refused():
    opts = build_options({**BASE, "pd_transfer_contention": "true"})
    with pytest.raises(BlisConfigError, match="^ClusterSimulator: PDTransferContention requires"):
        check_construction(opts, validate_pd(opts))
    opts = build_options({**BASE, "prefill_instances": 1, "decode_instances": 1,
                          "kv_cpu_blocks": 10})
    with pytest.raises(BlisConfigError, match="^--kv-cpu-blocks is not supported with P/D"):
        check_construction(opts, validate_pd(opts))


def test_deciders_come_from_their_registries():
    assert family("deciders").valid_names() == ("always", "never", "prefix-threshold")
    assert family("deciders").code("") == family("deciders").code("never") == 0
    assert family("encode_deciders").valid_names() == ("always", "multimodal", "never")


def test_the_cli_refuses_before_any_output(tmp_path, capsys):
    from blis_fast.cli import main

    out = tmp_path / "results.json"
    with pytest.raises(SystemExit) as exc:
        main(["run", "--model", BASE["model"], "--num-instances", "2", "--prefill-instances",
              "2", "--decode-instances", "1", "--metrics-path", str(out)])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and not out.exists()
    assert err.strip().splitlines() == [
        "blis: error: Invalid PD pool topology: prefill-instances (2) + decode-instances (1) + "
        "prefill-decode-instances (0) + encode-instances (0) = 3 exceeds num-instances (2)"]
