"""Workload-spec YAML loading, validation, precedence helpers, convert/compose (WL-1, WL-4, WL-12,
DELTA-47/54/55/58)."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import click
import numpy as np
import pytest
from click.testing import CliRunner

from blis_fast.config.yaml_scalars import resolve_plain
from blis_fast.errors import BlisConfigError, BlisInputError
from blis_fast.gonum import INT64_MAX
from blis_fast.workload.cli import register
from blis_fast.workload.convert import (
    compose_specs,
    convert_inference_perf,
    convert_preset,
    spec_yaml_for_stdout,
)
from blis_fast.workload.generator import generate_requests, generate_workload
from blis_fast.workload.precedence import (
    check_generation_bounded,
    resolve_horizon,
    resolve_max_requests,
    resolve_workload_seed,
)
from blis_fast.workload.spec_yaml import load_workload_spec, parse_workload_spec
from blis_fast.workload.validate import validate_spec
from blis_fast.workload.yaml_writer import marshal_spec, yaml_string

try:
    from tests.parity import CASES_DIR as CASES
    from tests.parity import adopted_case_ids
except ImportError:
    from parity import CASES_DIR as CASES
    from parity import adopted_case_ids

ROOT = Path(__file__).resolve().parents[1]

BASE = """\
version: "2"
seed: 7
aggregate_rate: 10.0
num_requests: 20
clients:
  - id: c1
    rate_fraction: 1.0
    arrival:
      process: poisson
    input_distribution:
      type: constant
      params:
        value: 10
    output_distribution:
      type: constant
      params:
        value: 5
"""


def _write(tmp_path: Path, text: str, name: str = "spec.yaml") -> str:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return str(p)


def _one_line(exc: BaseException) -> str:
    msg = str(exc)
    assert "\n" not in msg
    return msg


# --- strict parsing ---------------------------------------------------------------------------
def test_every_parity_spec_file_loads():
    """All workload specs of the parity cases decode (and policy bundles do not)."""
    n = 0
    for case in (CASES / name for name in adopted_case_ids()):
        args = json.loads((case / "case.json").read_text())["args"]
        not_specs = ("--policy-config", "--lora-config", "--trace-header",
                 "--kv-offload-config", "--defaults-filepath")  # other YAML inputs
        bundles = {args[k + 1] for k, a in enumerate(args[:-1]) if a in not_specs}
        for f in case.glob("*.yaml"):
            if f.name == "trace.yaml" or "routing" in f.name or "policy" in f.name:
                continue
            if f.name in bundles:
                continue
            if f.name in ("bad-unknown-key.yaml", "source.yaml", "observed.yaml"):
                continue
            spec = load_workload_spec(str(f))
            assert spec.version == "2"
            n += 1
    assert n >= 12


def test_unknown_key_names_file_line_and_key():
    """The parity case's unknown client key fails like yaml.v3 KnownFields(true), one line."""
    path = CASES / "invalid-workload-unknown-key" / "bad-unknown-key.yaml"
    with pytest.raises(BlisInputError) as ei:
        load_workload_spec(str(path))
    msg = _one_line(ei.value)
    assert str(path) in msg
    assert "line 23: field burstiness not found in type workload.ClientSpec" in msg
    assert "clients[0].burstiness" in msg


def test_wrong_type_names_file_line_and_key(tmp_path):
    """A quoted number in a float field is a type error naming line, Go type and key."""
    path = _write(tmp_path, BASE.replace("rate_fraction: 1.0", 'rate_fraction: "abc"'))
    with pytest.raises(BlisInputError) as ei:
        load_workload_spec(path)
    msg = _one_line(ei.value)
    assert path in msg and "line 7: cannot unmarshal !!str `abc` into float64" in msg
    assert "clients[0].rate_fraction" in msg
    path = _write(tmp_path, BASE.replace("clients:\n", "clients: 5\n", 1).split("  - id")[0])
    with pytest.raises(BlisInputError, match=r"line 5: cannot unmarshal !!int `5` into "
                                             r"\[\]workload\.ClientSpec"):
        load_workload_spec(path)
    path = _write(tmp_path, BASE.replace("seed: 7", "seed: averyverylongword"))
    with pytest.raises(BlisInputError, match=r"!!str `averyve\.\.\.` into int64"):
        load_workload_spec(path)


def test_duplicate_key_is_reported(tmp_path):
    """yaml.v3 uniqueKeys: the first repeated key, at its repetition, with the first line."""
    path = _write(tmp_path, BASE + "seed: 9\n")
    with pytest.raises(BlisInputError) as ei:
        load_workload_spec(path)
    msg = _one_line(ei.value)
    assert 'line 18: mapping key "seed" already defined at line 2' in msg and path in msg


def test_syntax_error_and_empty_file(tmp_path):
    """YAML syntax errors and an empty document are one-line errors."""
    with pytest.raises(BlisInputError, match=r"yaml: line \d+"):
        load_workload_spec(_write(tmp_path, "a: [1, 2\n"))
    with pytest.raises(BlisInputError, match=r"EOF$"):
        load_workload_spec(_write(tmp_path, "# nothing\n"))
    with pytest.raises(BlisInputError, match="reading workload spec: open"):
        load_workload_spec(str(tmp_path / "missing.yaml"))


@pytest.mark.parametrize(
    ("plain", "tag", "value"),
    [
        ("1e3", "!!float", 1000.0),
        ("0x10", "!!int", 16),
        ("0o17", "!!int", 15),
        ("017", "!!int", 15),
        ("08", "!!float", 8.0),
        ("1_000", "!!int", 1000),
        (".5", "!!float", 0.5),
        ("+.inf", "!!float", float("inf")),
        ("~", "!!null", None),
        ("yes", "!!str", "yes"),
        ("True", "!!bool", True),
        ("2001-12-14", "!!timestamp", "2001-12-14"),
        ("abc", "!!str", "abc"),
    ],
)
def test_yaml_v3_scalar_resolution(plain, tag, value):
    """Plain scalars resolve with yaml.v3's YAML 1.2 rules (not PyYAML's 1.1 ones)."""
    assert resolve_plain(plain) == (tag, value)


def test_decoding_coercions(tmp_path):
    """yaml.v3 coercions: any scalar into strings, floats truncated into ints, 1.1 bools."""
    text = BASE.replace("id: c1", "id: 123\n    streaming: yes\n    timeout: 2.9e6")
    text = text.replace("seed: 7", "seed: 0x10").replace("version: \"2\"", "version: 2")
    text += "    reasoning:\n      multi_turn:\n        max_rounds: 2.7\n"
    spec = parse_workload_spec(textwrap.dedent(text), "x.yaml")
    c = spec.clients[0]
    assert spec.seed == 16 and spec.version == "2" and c.id == "123" and c.streaming is True
    assert c.timeout == 2_900_000 and c.reasoning.multi_turn.max_rounds == 2
    nul = parse_workload_spec(BASE.replace("rate_fraction: 1.0", "rate_fraction: ~"), "y")
    assert nul.clients[0].rate_fraction == 0.0
    with pytest.raises(BlisInputError, match="cannot unmarshal !!str `nope` into bool"):
        parse_workload_spec(BASE.replace("id: c1", "id: c1\n    streaming: nope"), "z")


def test_anchors_and_merge_keys(tmp_path):
    """Aliases and ``<<`` merges work; explicit keys win over merged ones."""
    text = """\
    aggregate_rate: 5
    clients:
      - &base
        id: a
        rate_fraction: 1
        arrival: {process: poisson}
        input_distribution: {type: constant, params: {value: 3}}
        output_distribution: {type: constant, params: {value: 4}}
      - <<: *base
        id: b
    """
    spec = parse_workload_spec(textwrap.dedent(text), "m.yaml")
    assert [c.id for c in spec.clients] == ["a", "b"]
    assert spec.clients[1].input_dist.params == {"value": 3.0}


def test_v1_upgrade_maps_client_slo_names_only():
    """WL-4.2: v1 client SLO names are upgraded; cohorts are not (and then fail validation)."""
    text = BASE.replace('version: "2"', 'version: "1"').replace("id: c1", "id: c1\n    slo_class: realtime")
    spec = parse_workload_spec(text, "v1.yaml")
    assert spec.version == "2" and spec.clients[0].slo_class == "critical"
    v2 = parse_workload_spec(BASE.replace("id: c1", "id: c1\n    slo_class: realtime"), "v2.yaml")
    with pytest.raises(BlisInputError, match=r'client\[0\]: unknown slo_class "realtime"'):
        validate_spec(v2)


# --- validation -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (("aggregate_rate: 10.0", "aggregate_rate: -5"),
         r"aggregate_rate must be positive, got -5\.000000 \(.*spec\.yaml, line 3\)$"),
        (("aggregate_rate: 10.0", "aggregate_rate: .nan"), "aggregate_rate must be a finite number, got NaN"),
        (("rate_fraction: 1.0", "rate_fraction: 0"), r"client\[0\]\.rate_fraction must be positive, got 0\.000000"),
        (("process: poisson", "process: bursty"), r'client\[0\]: unknown arrival process "bursty"'),
        (("process: poisson", "process: weibull\n      cv: 20"), r"client\[0\]: weibull CV must be in \[0\.01, 10\.4\], got 20\.000000"),
        (("process: poisson", "process: gamma\n      cv: -1"), r"client\[0\]\.cv must be positive, got -1\.000000"),
        (("type: constant", "type: uniform"), r'client\[0\]\.input_distribution: unknown distribution type "uniform"'),
        (("value: 10", "value: .inf"), r"client\[0\]\.input_distribution\.params\.value must be a finite number, got \+Inf"),
        (("id: c1", "id: c1\n    prefix_length: -1"), r"client\[0\]: prefix_length must be non-negative, got -1"),
        (("id: c1", "id: c1\n    timeout: -3"), r"client\[0\]: timeout must be non-negative, got -3"),
        (("id: c1", "id: c1\n    concurrency: 2"), r"client\[0\]: concurrency and rate_fraction are mutually exclusive"),
        (("id: c1", "id: c1\n    concurrency: -2"), r"client\[0\]: concurrency must be non-negative, got -2"),
        (("id: c1", "id: c1\n    think_time_us: -2"), r"client\[0\]: think_time_us must be non-negative, got -2"),
        (("id: c1", "id: c1\n    lifecycle: {windows: []}"), r"client\[0\]: lifecycle specified with no windows"),
        (("id: c1", "id: c1\n    lifecycle: {windows: [{start_us: 5, end_us: 5}]}"),
         r"client\[0\]: lifecycle\.windows\[0\] has end_us \(5\) <= start_us \(5\)"),
        (("id: c1", "id: c1\n    reasoning: {multi_turn: {max_rounds: 0}}"),
         r"client\[0\]: reasoning\.multi_turn\.max_rounds must be >= 1, got 0"),
    ],
)
def test_validation_messages(tmp_path, edit, message):
    """WL-4.5 + DELTA-55 checks, with the reference's wording and the spec's file/line."""
    path = _write(tmp_path, BASE.replace(*edit))
    spec = load_workload_spec(path)
    with pytest.raises(BlisInputError) as ei:
        generate_requests(spec, max_requests=5)
    msg = _one_line(ei.value)
    assert msg.startswith("invalid workload spec: ")
    assert re.search(message, msg), msg
    assert path in msg


def test_empty_client_list_and_mixing_rules(tmp_path):
    """No source at all; concurrency mixed with multi-turn (DELTA-47.5); cohort checks."""
    path = _write(tmp_path, "aggregate_rate: 5\nclients: []\n")
    with pytest.raises(BlisInputError) as ei:
        generate_requests(load_workload_spec(path), max_requests=5)
    msg = _one_line(ei.value)
    assert "at least one client, cohort, or servegen_data path required" in msg
    assert path in msg and "line 2" in msg
    mixed = BASE + (
        "  - id: u\n"
        "    concurrency: 2\n"
        "    input_distribution: {type: constant, params: {value: 1}}\n"
        "    output_distribution: {type: constant, params: {value: 1}}\n"
        "  - id: m\n"
        "    rate_fraction: 1\n"
        "    arrival: {process: poisson}\n"
        "    input_distribution: {type: constant, params: {value: 1}}\n"
        "    output_distribution: {type: constant, params: {value: 1}}\n"
        "    reasoning: {multi_turn: {max_rounds: 2}}\n"
    )
    with pytest.raises(BlisInputError, match="cannot be mixed"):
        generate_workload(parse_workload_spec(mixed, "mix.yaml"), max_requests=5)
    cohort = BASE + textwrap.dedent("""\
    cohorts:
      - id: co
        population: 0
        rate_fraction: 1
        arrival: {process: poisson}
        input_distribution: {type: constant, params: {value: 1}}
        output_distribution: {type: constant, params: {value: 1}}
    """)
    with pytest.raises(BlisInputError, match=r"cohort\[0\]: population must be positive, got 0"):
        generate_requests(parse_workload_spec(cohort, "co.yaml"), max_requests=5)
    with pytest.raises(BlisInputError, match=r"cohort\[0\]: diurnal peak_hour must be 0-23"):
        generate_requests(parse_workload_spec(cohort.replace("population: 0", "population: 2\n    diurnal: {peak_hour: 30, peak_to_trough_ratio: 2}"), "co.yaml"), max_requests=5)


def test_sampler_errors_at_generation(tmp_path):
    """Required params are checked when the sampler is built (WL-4.5), with the client id."""
    spec = parse_workload_spec(BASE.replace("value: 10", "mean: 10"), "s.yaml")
    with pytest.raises(BlisInputError, match=r'^client "c1" input distribution: distribution '
                                             r'requires parameter "value"$'):
        generate_requests(spec, max_requests=5)
    emp = BASE.replace("type: constant\n      params:\n        value: 10",
                       'type: empirical\n      params:\n        "ten": 1')
    with pytest.raises(BlisInputError, match=r'empirical PDF key "ten" is not an integer: '
                                             r"expected integer"):
        generate_requests(parse_workload_spec(emp, "e.yaml"), max_requests=5)
    mm = BASE.replace("id: c1", "id: c1\n    multimodal:\n      text_distribution: {type: zipf}")
    with pytest.raises(BlisInputError, match=r'client "c1" multimodal: text distribution: unknown '
                                             r'distribution type "zipf"'):
        generate_requests(parse_workload_spec(mm, "mm.yaml"), max_requests=5)
    # the same invalid sampler is harmless when the client never generates a request
    assert generate_requests(parse_workload_spec(mm, "mm.yaml"), horizon=1).n == 0


def test_source_exclusivity(tmp_path):
    """clients, servegen_data and inference_perf are mutually exclusive (WL-4.6)."""
    text = BASE + "servegen_data:\n  path: /nowhere\n"
    with pytest.raises(BlisInputError, match=r"workload sources \{clients, servegen_data\} are "
                                             "mutually exclusive"):
        generate_requests(parse_workload_spec(text, "x.yaml"), max_requests=5)


# --- precedence helpers -----------------------------------------------------------------------
def test_precedence_helpers():
    """WL-1.2 - WL-1.4."""
    assert resolve_workload_seed(5, 42, False) == 5
    assert resolve_workload_seed(5, 42, True) == 42
    assert resolve_horizon(1000, INT64_MAX, False) == 1000
    assert resolve_horizon(1000, 77, True) == 77
    assert resolve_horizon(0, INT64_MAX, False) == INT64_MAX
    assert resolve_max_requests(500, 100, False) == 500
    assert resolve_max_requests(500, 0, True) == 0
    check_generation_bounded(10, INT64_MAX)
    check_generation_bounded(0, 1000)
    with pytest.raises(BlisConfigError, match="requires either num_requests or --horizon"):
        check_generation_bounded(0, INT64_MAX)


# --- convert / compose ------------------------------------------------------------------------
CHATBOT_YAML = """\
version: "2"
seed: 0
category: language
clients:
    - id: preset-chatbot
      tenant_id: ""
      slo_class: ""
      rate_fraction: 1
      arrival:
        process: constant
      input_distribution:
        type: gaussian
        params:
            max: 800
            mean: 256
            min: 2
            std_dev: 100
      output_distribution:
        type: gaussian
        params:
            max: 1024
            mean: 256
            min: 1
            std_dev: 100
      streaming: false
aggregate_rate: 20
num_requests: 50
"""


def test_convert_preset_yaml():
    """``convert preset`` output, in yaml.v3's layout (4-space indent, sorted params)."""
    preset = {"prompt_tokens": 256, "prompt_tokens_stdev": 100, "prompt_tokens_min": 2,
              "prompt_tokens_max": 800, "output_tokens": 256, "output_tokens_stdev": 100,
              "output_tokens_min": 1, "output_tokens_max": 1024}
    spec = convert_preset("chatbot", 20.0, 50, preset)
    assert spec_yaml_for_stdout(spec) == CHATBOT_YAML
    spec = convert_preset("x", 1.0, 1, {**preset, "prefix_tokens": 64})
    text = marshal_spec(spec)
    assert "      prefix_group: shared\n      prefix_length: 64\n" in text
    # the output reads back to the same spec
    again = parse_workload_spec(text, "again.yaml")
    assert again.clients[0].input_dist.params == spec.clients[0].input_dist.params


def test_yaml_scalar_styles():
    """Strings that would read back as another type are double-quoted, indicators single."""
    assert yaml_string("") == '""'
    assert yaml_string("2") == '"2"'
    assert yaml_string("yes") == '"yes"'
    assert yaml_string("a: b") == "'a: b'"
    assert yaml_string("-") == "'-'"
    assert yaml_string("prompt-0") == "prompt-0"
    assert yaml_string("1e3") == '"1e3"'


def test_compose_weights_and_concurrency_only(tmp_path):
    """WL-12 scaling by spec rate; DELTA-58 zero total concatenates unscaled."""
    a = parse_workload_spec(BASE, "a.yaml")
    b = parse_workload_spec(BASE.replace("aggregate_rate: 10.0", "aggregate_rate: 30"), "b.yaml")
    merged = compose_specs([a, b])
    assert merged.aggregate_rate == 40.0 and merged.seed == 0 and merged.num_requests == 0
    assert [c.rate_fraction for c in merged.clients] == [0.25, 0.75]
    conc = BASE.replace("aggregate_rate: 10.0", "aggregate_rate: 0").replace(
        "rate_fraction: 1.0", "concurrency: 3")
    c1 = parse_workload_spec(conc, "c.yaml")
    merged = compose_specs([c1, c1])
    assert merged.aggregate_rate == 0 and [c.concurrency for c in merged.clients] == [3, 3]
    assert "concurrency: 3" in spec_yaml_for_stdout(merged)
    zero = BASE.replace("aggregate_rate: 10.0", "aggregate_rate: 0")
    with pytest.raises(BlisInputError, match="^generated spec is invalid: "):
        spec_yaml_for_stdout(compose_specs([parse_workload_spec(zero, "z")]))


def test_convert_inference_perf_expands_clients():
    """``convert inference-perf`` on the parity example: 90 poisson clients with windows."""
    path = CASES / "c4-scorer-precise-prefix-inference-perf" / "inference-perf-shared-prefix.yaml"
    spec = convert_inference_perf(str(path))
    assert len(spec.clients) == 90 and spec.aggregate_rate == 28.0 and spec.seed == 42
    text = spec_yaml_for_stdout(spec)
    assert text.startswith('version: "2"\nseed: 42\ncategory: language\nclients:\n'
                           "    - id: stage-0-prompt-0-user-0\n")
    assert "        windows:\n            - start_us: 600000000\n              end_us: 1200000000\n" in text
    assert text.endswith("aggregate_rate: 28\n")


def test_cli_subcommands_register(tmp_path):
    """``register`` adds convert/compose to a click group; output goes to stdout."""

    @click.group()
    def grp() -> None:
        pass

    register(grp)
    a = _write(tmp_path, BASE, "a.yaml")
    res = CliRunner().invoke(grp, ["compose", "--from", a, "--from", a])
    assert res.exit_code == 0, res.output
    assert res.output.startswith('version: "2"\nseed: 0\ncategory: ""\nclients:\n')
    assert "      rate_fraction: 0.5\n" in res.output and res.output.endswith("aggregate_rate: 20\n")
    res = CliRunner().invoke(grp, ["convert", "preset", "--name", "chatbot", "--rate", "0"])
    assert isinstance(res.exception, BlisConfigError)
    assert "--rate must be a finite value > 0, got 0" in str(res.exception)
    res = CliRunner().invoke(grp, ["convert", "preset", "--name", "chatbot", "--rate", "20",
                                   "--num-requests", "50"])
    assert res.exit_code == 0 and res.output == CHATBOT_YAML


# --- expansions: ServeGen, inference-perf ---------------------------------------------------------
def _servegen_dir(tmp_path: Path) -> Path:
    d = tmp_path / "sg"
    d.mkdir()
    (d / "chunk-0-trace.csv").write_text(
        "start_time,rate,cv,pattern\n0,2.0,1.5,Gamma\n600,5.0,2.5,Weibull\n1200,1.0,1,\n"
    )
    (d / "chunk-0-dataset.json").write_text(
        '{"0": {"input_tokens": "{}", "output_tokens": "{}"},'
        ' "600": {"input_tokens": "{100: 0.5, 200: 0.5,}", "output_tokens": "{10: 1e0}"}}'
    )
    (d / "chunk-1-trace.csv").write_text("0,0,1,Gamma\n")  # inactive chunk: skipped
    (d / "chunk-1-dataset.json").write_text("{}")
    return d


def test_servegen_native_data(tmp_path):
    """WL-8.2 + DELTA-57: best-rate window per chunk, empty-dict windows skipped, empirical PDFs."""
    from blis_fast.workload.convert import convert_servegen

    d = _servegen_dir(tmp_path)
    spec = convert_servegen(str(d))
    (c,) = spec.clients
    assert c.id == "servegen-chunk-0" and c.tenant_id == "chunk-0" and c.rate_fraction == 5.0
    assert c.arrival.process == "weibull" and c.arrival.cv == 2.5
    assert c.input_dist.params == {"100": 0.5, "200": 0.5} and c.output_dist.params == {"10": 1.0}
    text = spec_yaml_for_stdout(spec)
    assert 'aggregate_rate: 1\n' in text and '            "100": 0.5\n' in text
    run = parse_workload_spec(f"aggregate_rate: 4\nservegen_data:\n  path: {d}\n", "sg.yaml")
    t = generate_requests(run, max_requests=50)
    assert t.n == 50 and set(np.unique(t.output_len)) == {10}
    assert set(np.unique(t.input_len)) <= {100, 200}


def test_inference_perf_single_stage_exact_counts():
    """DELTA-53: one stage issues exactly trunc(rate*duration) requests (normalized sampler)."""
    text = textwrap.dedent("""\
    seed: 3
    inference_perf:
      stages: [{rate: 10, duration: 61}]
      shared_prefix: {num_unique_system_prompts: 3, num_users_per_system_prompt: 4,
                      system_prompt_len: 32, question_len: 20, output_len: 0}
    """)
    spec = parse_workload_spec(text, "ip.yaml")
    t = generate_requests(spec, horizon=10**12, max_requests=0)
    assert t.n == 610 and (t.output_len == 1).all() and (t.input_len == 52).all()
    per_client = np.bincount(t.client_idx, minlength=12)
    assert per_client.tolist() == [51] * 10 + [50] * 2
    assert t.arrival_us.max() <= 61_000_000


def test_inference_perf_multi_turn_blueprints():
    """Multi-turn inference-perf: one single-session closed-loop client per user (DELTA-53)."""
    text = textwrap.dedent("""\
    inference_perf:
      stages: [{rate: 4, duration: 10}]
      shared_prefix: {num_unique_system_prompts: 2, num_users_per_system_prompt: 3,
                      system_prompt_len: 16, question_len: 8, output_len: 4,
                      enable_multi_turn_chat: true}
    """)
    wl = generate_workload(parse_workload_spec(text, "mt.yaml"), horizon=10**12, max_requests=0)
    assert len(wl.sessions) == 6 and wl.table.n == 6 and wl.follow_up_budget == -1
    assert sorted(b.max_rounds for b in wl.sessions) == [6, 6, 7, 7, 7, 7]
    b = wl.sessions[0]
    assert b.think_time_us == 1_500_000 and b.context_growth == "" and len(b.prefix) == 16
    assert (wl.table.round_index == 0).all() and (wl.table.reason_ratio == 0.01).all()
