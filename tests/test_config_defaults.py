"""defaults.yaml: strict loading and lookups (ENG-10.2, ENG-10.3, DELTA-22..24)."""

from __future__ import annotations

import re

import pytest

from blis_fast.config.defaults import (
    COEFFICIENT_SECTIONS,
    get_coefficients,
    get_default_specs,
    get_hf_repo,
    load_defaults,
)
from blis_fast.config.latency_backends import LATENCY_BACKENDS, Coefficients
from blis_fast.data import data_path
from blis_fast.errors import BlisInputError


@pytest.fixture(scope="module")
def bundled():
    return load_defaults(data_path("defaults.yaml"))


def test_bundled_sections(bundled):
    # ENG-10.2 / DELTA-24: 30 default combinations, 4 presets, 111 models over 31 ids.
    assert len(bundled.defaults) == 30
    assert set(bundled.workloads) == {"chatbot", "contentgen", "summarization", "multidoc"}
    assert len(bundled.models) == 111
    assert len({m.id for m in bundled.models}) == 31
    assert bundled.version == "0.0.1"
    assert bundled.coefficients["trained_physics_coefficients"].alpha_coeffs == (15563.199579, 777.3455, 45.907545)
    assert len(bundled.coefficients["trained_physics_coefficients"].beta_coeffs) == 10
    assert bundled.coefficients["crossmodel_defaults"].beta_coeffs == (116.110, 1226.868, 19.943, 9445.157)
    assert bundled.coefficients["crossmodel_defaults"].alpha_coeffs == (13732.0, 0.0, 860.6)
    assert bundled.coefficients["trained_roofline_defaults"].beta_coeffs[0] == 0.7726491335309499
    assert bundled.coefficients["trained_roofline_defaults"].alpha_coeffs == (
        9315.338771116985,
        1849.5902371340574,
        1.7079389122469397,
    )


def test_presets(bundled):
    s = bundled.workloads["summarization"]
    assert (s.prompt_tokens, s.prompt_tokens_stdev, s.prompt_tokens_min, s.prompt_tokens_max) == (
        4096,
        500,
        100,
        8192,
    )
    assert (s.output_tokens, s.output_tokens_stdev, s.output_tokens_min, s.output_tokens_max) == (
        512,
        150,
        10,
        2048,
    )
    m = bundled.workloads["multidoc"]
    assert m.prefix_tokens == 0 and m.prompt_tokens == 10240


def test_default_specs(bundled):
    assert get_default_specs(bundled, "meta-llama/llama-3.1-8b-instruct") == (
        "H100",
        1,
        "vllm/vllm-openai:v0.11.0",
    )
    assert get_default_specs(bundled, "qwen/qwen3-14b") == ("H100", 1, "vllm/vllm-openai:v0.11.0")
    assert get_default_specs(bundled, "nobody/nothing") == ("", 0, "")
    assert (
        get_hf_repo(bundled, "meta-llama/llama-3.1-8b-instruct")
        == "meta-llama/Llama-3.1-8B-Instruct"
    )
    assert get_hf_repo(bundled, "openai/gpt-oss-20b") == ""


def test_coefficients_lookup(bundled):
    alpha, beta = get_coefficients(
        bundled, "meta-llama/llama-3.1-8b-instruct", 1, "H100", "vllm/vllm-openai:v0.11.0"
    )
    assert alpha == (10326.268121600151, 0.0, 0.0)
    assert beta == (6472.007648778123, 19.79721387814611, 304.4021040302657)
    # all four keys must match exactly
    assert get_coefficients(bundled, "meta-llama/llama-3.1-8b-instruct", 1, "H100", "v0.11.0") == (
        None,
        None,
    )
    assert get_coefficients(
        bundled, "meta-llama/llama-3.1-8b-instruct", 3, "H100", "vllm/vllm-openai:v0.11.0"
    ) == (
        None,
        None,
    )


def _write(tmp_path, text):
    p = tmp_path / "defaults.yaml"
    p.write_text(text)
    return p


def test_unknown_top_level_key_names_key_file_line(tmp_path):
    p = _write(tmp_path, "version: 0.0.1\nworkloads: {}\nbogus_section: 3\n")
    with pytest.raises(BlisInputError) as exc:
        load_defaults(p)
    msg = str(exc.value)
    assert "bogus_section" in msg and str(p) in msg and re.search(r":3:", msg)


def test_total_kv_blocks_rejected_in_models(tmp_path):
    # DELTA-23.1: the key is gone from models: entries and strict parsing rejects it.
    text = (
        "models:\n"
        "  - id: a/b\n"
        "    GPU: H100\n"
        "    tensor_parallelism: 1\n"
        "    vllm_version: v1\n"
        "    alpha_coeffs: [1, 2, 3]\n"
        "    beta_coeffs: [1, 2, 3]\n"
        "    total_kv_blocks: 100\n"
    )
    p = _write(tmp_path, text)
    with pytest.raises(BlisInputError, match=r"defaults\.yaml:8: unknown key 'total_kv_blocks'"):
        load_defaults(p)


def test_nested_unknown_key_in_defaults_entry(tmp_path):
    p = _write(tmp_path, "defaults:\n  a/b:\n    GPU: H100\n    gpu_count: 2\n")
    with pytest.raises(BlisInputError, match=r":4: unknown key 'gpu_count'"):
        load_defaults(p)


def test_duplicate_key_rejected(tmp_path):
    p = _write(tmp_path, "version: a\nversion: b\n")
    with pytest.raises(BlisInputError, match=r":2: .*'version' already defined at line 1"):
        load_defaults(p)


def test_wrong_types_rejected(tmp_path):
    p = _write(tmp_path, "defaults:\n  a/b:\n    tensor_parallelism: four\n")
    with pytest.raises(BlisInputError, match=r":3: .*tensor_parallelism.*integer"):
        load_defaults(p)
    p = _write(tmp_path, "crossmodel_defaults:\n  beta_coeffs: [1, x, 3]\n")
    with pytest.raises(BlisInputError, match=r":2: .*beta_coeffs\[1\].*number"):
        load_defaults(p)


def test_empty_and_malformed_files(tmp_path):
    with pytest.raises(BlisInputError, match="empty"):
        load_defaults(_write(tmp_path, ""))
    with pytest.raises(BlisInputError, match="cannot parse"):
        load_defaults(_write(tmp_path, "defaults: [unclosed\n"))
    with pytest.raises(BlisInputError, match="cannot read"):
        load_defaults(tmp_path / "missing.yaml")


def test_null_sections_are_empty(tmp_path):
    cfg = load_defaults(_write(tmp_path, "defaults:\nmodels:\ncrossmodel_defaults:\n"))
    assert cfg.defaults == {} and cfg.models == () and "crossmodel_defaults" not in cfg.coefficients



def test_a_stored_parse_is_read_back_with_its_path(tmp_path, monkeypatch):
    """The parse of a defaults file is kept between runs (``blis_fast.stored``); a later load
    of the same content reads it instead of parsing, with its own path."""
    from blis_fast import stored
    from blis_fast.config import defaults as D

    text = data_path("defaults.yaml").read_text()
    first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
    first.write_text(text)
    second.write_text(text)
    kept = tmp_path / "kept.pickle"
    monkeypatch.setattr(stored, "_stored_path", lambda *_: str(kept))
    parsed = load_defaults(first)
    assert kept.is_file() and parsed.path == str(first)

    def no_parse(*_):
        raise AssertionError("parsed again")

    monkeypatch.setattr(D, "_parse", no_parse)
    again = load_defaults(second)
    assert again.path == str(second)
    assert again == D.replace(parsed, path=str(second))
    assert len(again.models) == 111


def test_parse_errors_are_never_kept(tmp_path, monkeypatch):
    from blis_fast import stored

    kept = tmp_path / "kept.pickle"
    monkeypatch.setattr(stored, "_stored_path", lambda *_: str(kept))
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nnope: 2\n")
    for _ in range(2):
        with pytest.raises(BlisInputError, match="nope"):
            load_defaults(bad)
    assert not kept.exists()


def test_each_coefficient_section_is_a_latency_backends_section():
    """The known coefficient sections of the file are the ones the backends' entries name."""
    named = {b.coefficients.section for b in LATENCY_BACKENDS if b.coefficients}
    assert named == set(COEFFICIENT_SECTIONS)
    with pytest.raises(ValueError, match="COEFFICIENT_SECTIONS"):
        Coefficients("unlisted_defaults", 1)
