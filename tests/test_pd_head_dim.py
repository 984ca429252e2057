"""Which head dimension sizes KV (issue 29 item 1): the August reference (P/D transfers, P/D
pools, autoscaled node pools) reads config.json's explicit ``head_dim``; plain runs keep the
April reference's hidden/heads, which their parity cases follow.

mistral-nemo-instruct-2407: 40 layers, hidden 5120, 32 heads (hidden/heads = 160), 8 KV heads,
explicit head_dim 128, bf16. On an 80 GiB H100 at TP=1, block size 16, utilization 0.9 the
April rule gives 13,946 blocks and the August rule 17,512 (the issue's figures)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from blis_fast.config.autoscale import resolve_autoscale
from blis_fast.config.kv_capacity import (
    calculate_kv_blocks,
    extract_kv_capacity_params,
    kv_bytes_per_token,
    model_weight_bytes,
)
from blis_fast.config.latency import resolve_latency
from blis_fast.config.model_config import model_config_from_hf, parse_hf_config
from blis_fast.config.policy_bundle import load_policy_bundle
from blis_fast.errors import BlisConfigError
from blis_fast.options import build_options
from blis_fast.runner import prepare

ROOT = Path(__file__).resolve().parents[1]
NEMO = "mistralai/mistral-nemo-instruct-2407"
NEMO_CONFIG = ROOT / "model_configs" / "mistral-nemo-instruct-2407" / "config.json"
BASE = {"model": NEMO, "latency_model": "roofline", "hardware": "H100", "tp": "1",
        "num_requests": "4", "rate": "1", "seed": "42", "log": "error"}
APRIL_BLOCKS, AUGUST_BLOCKS = 13_946, 17_512
GIB = 1 << 30


def _nemo():
    hf = parse_hf_config(NEMO_CONFIG)
    return model_config_from_hf(hf), extract_kv_capacity_params(hf)


def _august_blocks_by_hand(memory_gib: float, tp: int = 1, block_size: int = 16,
                           util: float = 0.9) -> int:
    """The August rule written out from config.json's numbers (dense, SwiGLU, untied)."""
    layers, d, heads, kv_heads, head_dim = 40, 5120, 32, 8, 128
    vocab, inter, bpp = 131072, 14336, 2.0
    assert d // heads == 160  # the April rule's head dim
    per_block = int(layers * 2 * head_dim * kv_heads * bpp / tp * block_size)
    kv_dim = kv_heads * head_dim
    per_layer = d * (d + 2 * kv_dim) + d * d + 3 * d * inter + 2 * d
    weights = (vocab * d + layers * per_layer + vocab * d + d) * bpp
    non_torch = 0.15 if tp == 1 else 0.6 * tp
    overhead = int(weights) / GIB + 5.5 + non_torch
    return int((memory_gib * util * tp - overhead) * GIB) // per_block


def test_rules_on_the_config_numbers():
    mc, params = _nemo()
    assert mc.head_dim == 128 and mc.hidden_dim // mc.num_heads == 160
    april = kv_bytes_per_token(mc, 1)
    august = kv_bytes_per_token(mc, 1, explicit_head_dim=True)
    assert april == 40 * 2 * 160 * 8 * 2.0 and august == 40 * 2 * 128 * 8 * 2.0
    assert august / april == 128 / 160
    assert model_weight_bytes(mc, params, True) < model_weight_bytes(mc, params)
    hw = resolve_latency(build_options(BASE)).hardware
    assert calculate_kv_blocks(mc, hw, 1, 16, 0.9, params) == APRIL_BLOCKS
    assert calculate_kv_blocks(mc, hw, 1, 16, 0.9, params, True) == AUGUST_BLOCKS
    for mem in (80.0, 48.0, 40.0):
        assert calculate_kv_blocks(mc, replace(hw, memory_gib=mem), 1, 16, 0.9, params,
                                   True) == _august_blocks_by_hand(mem)


def test_explicit_head_dim_skips_the_divisibility_check_and_absent_falls_back():
    mc, _ = _nemo()
    odd = replace(mc, hidden_dim=5000)  # 5000 % 32 != 0
    with pytest.raises(BlisConfigError, match="not a multiple"):
        kv_bytes_per_token(odd, 1)
    assert kv_bytes_per_token(odd, 1, True) == kv_bytes_per_token(mc, 1, True)
    absent = replace(mc, head_dim=0)
    assert kv_bytes_per_token(absent, 1, True) == kv_bytes_per_token(mc, 1)
    with pytest.raises(BlisConfigError, match="head_dim must be >= 0"):
        kv_bytes_per_token(replace(mc, head_dim=-1), 1, True)


def test_plain_run_keeps_the_april_rule():
    prep = prepare(build_options(BASE))
    assert prep.latency.total_kv_blocks == APRIL_BLOCKS
    assert prep.engine.pd is None and prep.engine.autoscale is None


def test_pd_run_sizes_transfers_and_pool_kv_from_head_dim():
    pd_flags = {"num_instances": "2", "prefill_instances": "1", "decode_instances": "1"}
    prep = prepare(build_options({**BASE, **pd_flags}))
    mc, _ = _nemo()
    assert prep.engine.pd.block_bytes == 16 * 40 * 2 * 128 * 8 * 2.0
    assert prep.engine.pd.block_bytes / (16 * kv_bytes_per_token(mc, 1)) == 128 / 160
    # the global auto-calculation of a P/D run follows the August rule too
    assert prep.latency.total_kv_blocks == AUGUST_BLOCKS
    assert set(prep.engine.instance_kv_blocks) == {AUGUST_BLOCKS}
    # a prefill pool on other GPUs / TP: its own capacity, August rule
    prep2 = prepare(build_options({**BASE, **pd_flags, "prefill_tp": "2"}))
    hw = prep2.latency.hardware
    mc, params = _nemo()
    assert prep2.engine.pd.block_bytes == 16 * 40 * 2 * 128 * 8 * 2.0 / 2
    assert prep2.engine.instance_kv_blocks == (
        calculate_kv_blocks(mc, hw, 2, 16, 0.9, params, explicit_head_dim=True), AUGUST_BLOCKS)
    assert prep2.engine.instance_kv_blocks[0] == _august_blocks_by_hand(80.0, tp=2)


def _autoscale(tmp_path: Path, memory: float, **flags):
    path = tmp_path / "bundle.yaml"
    path.write_text("node_pools:\n  - {name: s, gpu_type: H100, gpus_per_node: 1, "
                    f"gpu_memory_gib: {memory}, initial_nodes: 2, max_nodes: 2}}\n")
    opts = build_options({**BASE, "policy_config": str(path), **flags})
    opts = replace(opts, model=opts.model.lower())
    latency = resolve_latency(opts)
    return latency, resolve_autoscale(opts, load_policy_bundle(str(path)), latency)


@pytest.mark.parametrize("memory", [80.0, 40.0])
def test_autoscaled_node_pools_use_head_dim(tmp_path, memory):
    latency, setup = _autoscale(tmp_path, memory)
    assert setup.label_blocks == [_august_blocks_by_hand(memory)]
    assert latency.total_kv_blocks == AUGUST_BLOCKS  # a node-pool run is an August context
    if memory == 80.0:
        assert setup.label_blocks == [AUGUST_BLOCKS]


def test_autoscaler_flag_alone_makes_the_global_capacity_august():
    opts = build_options({**BASE, "model_autoscaler_interval_us": "1000000"})
    assert resolve_latency(replace(opts, model=opts.model.lower())).total_kv_blocks == AUGUST_BLOCKS
