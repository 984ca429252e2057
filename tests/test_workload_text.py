"""One implementation of the workload side's text helpers: quoting, the YAML string rule and
the spec schema (issue 11, item 4)."""

from __future__ import annotations

import ast
import dataclasses

import yaml
from hypothesis import given
from hypothesis import strategies as st

from blis_fast.gofmt import go_quote
from blis_fast.observe.output import trace_header
from blis_fast.workload import spec as S
from blis_fast.workload.spec_yaml import SCHEMA, parse_workload_spec
from blis_fast.workload.yaml_writer import _double_quoted, marshal_spec, yaml_string

_NO_SURROGATES = st.text(st.characters(exclude_categories=("Cs",)), max_size=30)


@given(_NO_SURROGATES)
def test_go_quote_reads_back_as_the_string(s):
    """strconv.Quote's escapes are all Python literal escapes: the quote parses back to ``s``."""
    assert ast.literal_eval(go_quote(s)) == s


def test_go_quote_spells_go_escapes():
    assert go_quote('a"b\\c') == '"a\\"b\\\\c"'
    assert go_quote("\a\b\f\n\r\t\v") == '"\\a\\b\\f\\n\\r\\t\\v"'
    assert go_quote("\x00\x7f é") == '"\\x00\\x7f é"'
    assert go_quote("\u200b\U000e0001") == '"\\u200b\\U000e0001"'


_C1 = "".join(chr(c) for c in range(0x80, 0xA0))  # PyYAML refuses them raw; yaml.v3 reads them


@given(st.text(st.characters(min_codepoint=0, max_codepoint=0xD7FF, exclude_characters=_C1),
               max_size=30))
def test_yaml_double_quoted_reads_back_as_the_string(s):
    assert yaml.safe_load(_double_quoted(s)) == s


def test_yaml_double_quoted_spells_yaml_v3_escapes():
    assert _double_quoted('"\\\n\t\r\x01\x7f') == '"\\"\\\\\\n\\t\\r\\x01\\x7F"'


def test_observe_header_writes_strings_as_yaml_v3_does():
    """The observed trace's header uses the same string rule as ``blis convert`` (OBS-0.3)."""
    text = trace_header("2026-08-22T20:18:58Z", 0, 7, "a: b.yaml", "vllm", "yes", 0.0)
    assert 'created_at: "2026-08-22T20:18:58Z"' in text  # a timestamp reads back as one
    assert "workload_spec: 'a: b.yaml'" in text
    assert '    model: "yes"' in text  # a YAML 1.1 bool
    assert "    type: vllm" in text
    for value in ("meta-llama/Llama-3.1-8B-Instruct", "preset:chatbot", "/tmp/spec 1.yaml"):
        assert yaml_string(value) == value


def test_schema_is_derived_from_the_dataclasses():
    """Every YAML field of every struct comes from its dataclass field and tag."""
    go_name, cls, fields = SCHEMA["ClientSpec"]
    assert (go_name, cls) == ("workload.ClientSpec", S.ClientSpec)
    by_key = {f.key: f for f in fields}
    assert "arrival_factory" not in {f.attr for f in fields}  # not part of the YAML schema
    assert (by_key["input_distribution"].attr, by_key["input_distribution"].kind) == (
        "input_dist", "struct")
    assert (by_key["concurrency"].arg, by_key["concurrency"].omitempty) == ("int", True)
    assert (by_key["timeout"].kind, by_key["timeout"].arg) == ("opt_int", "int64")
    assert not SCHEMA["InferencePerfSpec"][2][1].omitempty  # shared_prefix: null when nil
    for _name, (_go, klass, fs) in SCHEMA.items():
        yaml_attrs = [f.name for f in dataclasses.fields(klass) if f.metadata.get("yaml", True)]
        assert [f.attr for f in fs] == yaml_attrs


def test_every_schema_field_round_trips():
    """A spec using every struct marshals and decodes back to itself."""
    dist = S.DistSpec("gaussian", {"mean": 10.0, "std_dev": 2.0, "min": 1.0, "max": 20.0})
    client = S.ClientSpec(
        id="c", tenant_id="t", slo_class="critical", model="m", rate_fraction=0.5,
        think_time_us=7, arrival=S.ArrivalSpec("weibull", 1.5), input_dist=dist,
        output_dist=dist, prefix_group="g", prefix_length=3, streaming=True,
        network=S.NetworkSpec(1.5, 100.0),
        lifecycle=S.LifecycleSpec([S.ActiveWindow(0, 10)]),
        multimodal=S.MultimodalSpec(text_dist=dist),
        reasoning=S.ReasoningSpec(dist, S.MultiTurnSpec(3, 5, "accumulate", True)),
        timeout=9, closed_loop=False)
    cohort = S.CohortSpec(id="h", population=2, rate_fraction=0.5, input_dist=dist,
                          output_dist=dist, diurnal=S.DiurnalSpec(3, 2.0),
                          spike=S.SpikeSpec(1, 2), drain=S.DrainSpec(3, 4))
    spec = S.WorkloadSpec(
        version="2", seed=5, category="language", clients=[client], cohorts=[cohort],
        aggregate_rate=10.0, horizon=100, num_requests=50,
        servegen_data=S.ServeGenDataSpec("p", 1, 2),
        inference_perf=S.InferencePerfSpec([S.StageSpec(2.0, 3)],
                                           S.SharedPrefixSpec(1, 2, 3, 4, 5, True)))
    back = parse_workload_spec(marshal_spec(spec))
    assert back == spec
