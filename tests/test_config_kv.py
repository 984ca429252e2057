"""KV-capacity auto-calculation (ENG-6.8, DELTA-23.5), against ``naive.kv_blocks``."""

from __future__ import annotations

import pytest
from naive import kv_blocks

from blis_fast.config.hardware import get_hw_config
from blis_fast.config.kv_capacity import (
    KVCapacityParams,
    calculate_kv_blocks,
    extract_kv_capacity_params,
    kv_bytes_per_token,
)
from blis_fast.config.model_config import (
    HFConfig,
    ModelConfig,
    model_config_from_hf,
    parse_hf_config,
)
from blis_fast.data import data_path
from blis_fast.errors import BlisConfigError


def _blocks(name: str, gpu: str = "H100", tp: int = 1, block: int = 16, util: float = 0.9) -> int:
    hf = parse_hf_config(data_path("model_configs") / name / "config.json")
    hc = get_hw_config(data_path("hardware_config.json"), gpu)
    return calculate_kv_blocks(
        model_config_from_hf(hf), hc, tp, block, util, extract_kv_capacity_params(hf)
    )


@pytest.mark.parametrize(
    ("name", "expected"),
    [("qwen2.5-7b-instruct", 61048), ("qwen3-14b", 15909), ("codellama-34b-instruct-hf", 1193)],
)
def test_delta_23_5_examples(name, expected):
    # DELTA-23.5: H100, TP 1, utilisation 0.9, block 16.
    assert _blocks(name) == expected


def test_parity_models_against_naive_formula():
    assert _blocks("llama-3.1-8b-instruct") == kv_blocks(
        32, 4096, 32, 8, 14336, 128256, 2.0, 80.0, 1, 16, 0.9
    )
    assert _blocks("llama-3.1-70b-instruct", "A100-80", 4) == kv_blocks(
        80, 8192, 64, 8, 28672, 128256, 2.0, 80.0, 4, 16, 0.9
    )
    assert _blocks("mixtral-8x7b-v0.1", "H100", 2) == kv_blocks(
        32, 4096, 32, 8, 14336, 32000, 2.0, 80.0, 2, 16, 0.9, moe=(8, 14336)
    )
    assert _blocks("llama-3.1-8b-instruct") == 26312
    assert _blocks("llama-3.1-70b-instruct", "A100-80", 4) == 121801
    assert _blocks("mixtral-8x7b-v0.1", "H100", 2) == 48956


def test_block_size_and_utilisation_scale():
    assert _blocks("qwen3-14b", block=32) == 15909 // 2
    assert _blocks("qwen3-14b", util=0.5) < _blocks("qwen3-14b")


def test_moe_params_and_errors():
    hf = parse_hf_config(data_path("model_configs") / "deepseek-v2-lite" / "config.json")
    p = extract_kv_capacity_params(hf)
    assert (p.is_moe, p.num_local_experts, p.moe_expert_ffn_dim, p.shared_expert_ffn_dim) == (
        True,
        64,
        1408,
        2816,
    )
    with pytest.raises(BlisConfigError, match="num_experts_per_tok=2"):
        extract_kv_capacity_params(HFConfig(raw={"num_experts_per_tok": 2}))
    assert extract_kv_capacity_params(
        HFConfig(raw={"tie_word_embeddings": True})
    ).tie_word_embeddings


def test_capacity_errors():
    mc = model_config_from_hf(
        parse_hf_config(data_path("model_configs") / "llama-3.1-70b-instruct" / "config.json")
    )
    l40s = get_hw_config(data_path("hardware_config.json"), "L40S")
    with pytest.raises(BlisConfigError, match="GiB"):  # 70B weights do not fit one 48 GiB GPU
        calculate_kv_blocks(mc, l40s, 1, 16, 0.9, KVCapacityParams(hidden_act="silu"))
    h100 = get_hw_config(data_path("hardware_config.json"), "H100")
    with pytest.raises(BlisConfigError, match="activation 'gelu'"):
        calculate_kv_blocks(mc, h100, 8, 16, 0.9, KVCapacityParams(hidden_act="gelu"))
    with pytest.raises(BlisConfigError, match="KV heads"):
        calculate_kv_blocks(mc, h100, 3, 16, 0.9, KVCapacityParams(hidden_act="silu"))


def test_kv_bytes_per_token_gqa_replication():
    mc = ModelConfig(num_layers=2, hidden_dim=64, num_heads=8, num_kv_heads=2, bytes_per_param=2.0)
    # 2 KV heads over TP 4: accepted, divided by TP (optimistic approximation)
    assert kv_bytes_per_token(mc, 4) == 2 * 2.0 * 8 * 2 * 2.0 / 4
