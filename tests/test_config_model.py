"""HF config.json parsing and hardware table (ENG-6.7, ENG-6.9, DELTA-18, DELTA-19, DELTA-25)."""

from __future__ import annotations

import json

import pytest

from blis_fast.config.hardware import get_hw_config, load_hardware_table
from blis_fast.config.model_config import (
    HFConfig,
    ModelConfig,
    apply_weight_precision_fallback,
    infer_weight_bytes_from_model_name,
    is_hf_config,
    model_config_from_hf,
    parse_hf_config,
    parse_quantization_config,
)
from blis_fast.config.model_resolution import apply_rope_scaling
from blis_fast.data import data_path
from blis_fast.errors import BlisConfigError, BlisInputError

PARITY_MODELS = (
    "llama-3.1-8b-instruct",
    "llama-3.1-70b-instruct",
    "mixtral-8x7b-v0.1",
    "qwen3-14b",
)


def _mc(name: str) -> ModelConfig:
    return model_config_from_hf(parse_hf_config(data_path("model_configs") / name / "config.json"))


def test_every_bundled_config_parses():
    folders = sorted(p.parent.name for p in data_path("model_configs").glob("*/config.json"))
    assert set(PARITY_MODELS) <= set(folders)
    assert len(folders) >= 13
    for name in folders:
        raw = (data_path("model_configs") / name / "config.json").read_bytes()
        assert is_hf_config(raw), name
        mc = _mc(name)
        assert (
            mc.num_layers > 0 and mc.hidden_dim > 0 and mc.num_heads > 0 and mc.bytes_per_param > 0
        ), name


def test_dense_llama():
    mc = _mc("llama-3.1-8b-instruct")
    assert (mc.num_layers, mc.hidden_dim, mc.num_heads, mc.num_kv_heads) == (32, 4096, 32, 8)
    assert (mc.intermediate_dim, mc.vocab_size, mc.bytes_per_param) == (14336, 128256, 2.0)
    assert mc.num_local_experts == 0 and mc.weight_bytes_per_param == 0.0
    assert mc.effective_weight_bytes_per_param() == 2.0


def test_mixtral_experts():
    mc = _mc("mixtral-8x7b-v0.1")
    assert (mc.num_local_experts, mc.num_experts_per_tok, mc.moe_expert_ffn_dim) == (8, 2, 0)


def test_expert_count_fallbacks_and_shared_experts():
    qwen_moe = _mc("qwen3-30b-a3b")  # num_experts
    assert (
        qwen_moe.num_local_experts,
        qwen_moe.moe_expert_ffn_dim,
        qwen_moe.num_experts_per_tok,
    ) == (128, 768, 8)
    ds = _mc("deepseek-v2-lite")  # n_routed_experts + n_shared_experts x moe_intermediate_size
    assert (ds.num_local_experts, ds.shared_expert_ffn_dim) == (64, 2 * 1408)


def test_text_config_pivot_and_compressed_tensors():
    # DELTA-18, DELTA-25: llama-4 style multimodal config, fields read from text_config.
    hf = parse_hf_config(
        data_path("model_configs") / "llama-4-scout-17b-16e-instruct-fp8-dynamic" / "config.json"
    )
    assert hf.get_str("model_type") == "llama4_text"
    mc = model_config_from_hf(hf)
    assert (mc.num_layers, mc.hidden_dim, mc.num_local_experts, mc.num_experts_per_tok) == (
        48,
        5120,
        16,
        1,
    )
    assert (mc.interleave_moe_layer_step, mc.dense_intermediate_dim, mc.intermediate_dim) == (
        1,
        16384,
        8192,
    )
    assert mc.weight_bytes_per_param == 1.0  # config_groups.group_0.weights.num_bits = 8


def test_dtype_key_and_fp8_method():
    mc = _mc("glm-5.2-fp8")  # "dtype" instead of "torch_dtype"; quant_method fp8
    assert mc.bytes_per_param == 2.0 and mc.weight_bytes_per_param == 1.0
    assert mc.num_local_experts == 256


def test_json_typing_rules(tmp_path):
    cfg = {
        "num_hidden_layers": 2.9,  # numbers truncate
        "hidden_size": "64",  # strings are not numbers
        "num_attention_heads": 4,
        "num_kv_heads": 2,  # Falcon spelling
        "ffn_hidden_size": 100,
        "torch_dtype": "float8",  # unknown dtype → 0
        "num_local_experts": 1,
        "num_experts": True,  # booleans are not numbers
    }
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    mc = model_config_from_hf(parse_hf_config(p))
    assert (mc.num_layers, mc.hidden_dim, mc.num_kv_heads, mc.intermediate_dim) == (2, 0, 2, 100)
    assert mc.bytes_per_param == 0.0 and mc.num_local_experts == 1


def test_malformed_configs(tmp_path):
    p = tmp_path / "config.json"
    p.write_text("[1, 2]")
    with pytest.raises(BlisInputError):
        parse_hf_config(p)
    p.write_text('{"hidden_size": NaN}')
    with pytest.raises(BlisInputError):
        parse_hf_config(p)
    with pytest.raises(BlisInputError):
        parse_hf_config(tmp_path / "absent.json")


def test_is_hf_config():
    assert is_hf_config(b'{"hidden_size": null}')
    assert is_hf_config(b'{"text_config": {"num_hidden_layers": 2}}')
    assert not is_hf_config(b'{"text_config": {"vocab_size": 2}}')
    assert not is_hf_config(b'{"error": "not found"}')
    assert not is_hf_config(b"{}")
    assert not is_hf_config(b"not json")


def test_quantization_config():
    assert parse_quantization_config({"bits": 4}) == 0.5
    assert parse_quantization_config({"bits": "8"}) == 1.0
    assert (
        parse_quantization_config({"bits": " 8", "quant_method": "gptq"}) == 0.0
    )  # Atoi is strict
    assert parse_quantization_config({"quant_method": "FP8"}) == 1.0
    groups = {"b": {"weights": {"num_bits": 8}}, "a": {"weights": {"num_bits": 4}}}
    assert (
        parse_quantization_config({"quant_method": "compressed-tensors", "config_groups": groups})
        == 0.5
    )
    assert parse_quantization_config({"quant_method": "awq"}) == 0.0


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("redhatai/llama-3.3-70b-instruct-quantized.w4a16", 0.5),
        ("redhatai/llama-3.3-70b-instruct-quantized.w8a8", 1.0),
        ("RedHatAI/phi-4-FP8-dynamic", 1.0),
        ("meta-llama/llama-4-maverick-17b-128e-instruct-fp8", 1.0),
        ("meta-llama/llama-3.1-8b-instruct", 0.0),
        ("acme/model-xfp8", 0.0),
        ("acme/w4a16", 0.5),
    ],
)
def test_weight_precision_from_name(name, expected):
    assert infer_weight_bytes_from_model_name(name) == expected


def test_weight_precision_fallback():
    mc = ModelConfig(bytes_per_param=2.0)
    out, infos, warnings = apply_weight_precision_fallback(mc, "org/model-w4a16", {})
    assert out.weight_bytes_per_param == 0.5 and infos and not warnings
    out, infos, warnings = apply_weight_precision_fallback(
        mc, "org/model", {"quantization_config": {}}
    )
    assert out.weight_bytes_per_param == 0.0 and warnings


def test_rope_scaling():
    # ENG-10.4.5
    assert apply_rope_scaling(131072, "llama", {"rope_type": "llama3", "factor": 8.0}) == (
        131072,
        False,
    )
    assert apply_rope_scaling(4096, "llama", {"type": "linear", "factor": 2}) == (8192, True)
    yarn = {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096}
    assert apply_rope_scaling(163840, "deepseek_v2", yarn) == (163840, True)
    assert apply_rope_scaling(8192, "gemma3_text", {"type": "linear", "factor": 8.0}) == (
        8192,
        False,
    )
    assert apply_rope_scaling(4096, "llama", {"type": "linear", "factor": 1.0}) == (4096, False)
    assert apply_rope_scaling(4096, "llama", {"type": "linear", "factor": "2"}) == (4096, False)
    assert apply_rope_scaling(4096, "llama", [1, 2]) == (4096, False)
    assert apply_rope_scaling(4096, "llama", None) == (4096, False)
    assert apply_rope_scaling(0, "llama", {"factor": 4.0}) == (0, False)


def test_hardware_table():
    # ENG-6.9 with DELTA-19 (L40S FP8)
    table = load_hardware_table(data_path("hardware_config.json"))
    assert set(table) == {"H100", "A100-SXM", "A100-80", "L40S"}
    h100 = table["H100"]
    assert (h100.tflops_peak, h100.tflops_fp8, h100.bw_peak_tbs) == (989.5, 1979.0, 3.35)
    assert (h100.mfu_prefill, h100.mfu_decode, h100.memory_gib) == (0.45, 0.30, 80.0)
    assert table["L40S"].tflops_fp8 == 1466.0 and table["L40S"].memory_gib == 48.0
    assert table["A100-80"] == table["A100-SXM"]


def test_hardware_parsing_rules(tmp_path):
    p = tmp_path / "hw.json"
    p.write_text('{"X": {"_comment": "c", "tflopspeak": 10, "BwPeakTBs": null, "MemoryGiB": 4}}')
    x = get_hw_config(p, "X")
    assert (x.tflops_peak, x.bw_peak_tbs, x.memory_gib) == (10.0, 0.0, 4.0)
    with pytest.raises(BlisConfigError, match=r"--hardware: GPU 'B200' .*available: X"):
        get_hw_config(p, "B200")
    p.write_text('{"X": {"TFlopsPeak": "fast"}}')
    with pytest.raises(BlisInputError):
        get_hw_config(p, "X")


def test_hfconfig_accessors():
    hf = HFConfig(raw={"a": 3.7, "b": "s", "c": True})
    assert hf.get_int("a") == 3 and hf.get_int("b", 9) == 9 and hf.get_bool("c") is True
    assert hf.get_str("a") == "" and hf.get_float("c") is None
