"""Latency kernels: step times and alpha overheads (ENG-6.2..6.6, DELTA-3, DELTA-16/17/20)."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from naive import roofline_step_time

from blis_fast.config.latency import pack_latency_params, resolve_latency
from blis_fast.config.model_config import ModelConfig
from blis_fast.kernels.engine import latency as K
from blis_fast.kernels.engine.latency import Backend

try:
    from tests._parity_latency import (
        CASES_DIR,
        LATENCY_CASES,
        latency_options,
        lone_requests,
        options_for,
    )
except ImportError:  # tests/ run as a plain folder (not a package)
    from _parity_latency import (
        CASES_DIR,
        LATENCY_CASES,
        latency_options,
        lone_requests,
        options_for,
    )

needs_parity = pytest.mark.skipif(not CASES_DIR.is_dir(), reason="parity cases not available")

LLAMA8 = "meta-llama/llama-3.1-8b-instruct"


def _batch(*reqs):
    """(progress, new_tokens, input_len, output_len) tuples → the kernel's four int64 arrays."""
    cols = list(zip(*reqs, strict=True)) if reqs else [(), (), (), ()]
    return [np.array(c, dtype=np.int64) for c in cols]


def step(cfg_or_code, params=None, *reqs):
    if params is None:
        code, params = cfg_or_code.code, cfg_or_code.params
    else:
        code = cfg_or_code
    arrs = _batch(*reqs)
    return int(K.step_time(code, params, len(reqs), *arrs))


# ---------------------------------------------------------------------------------- blackbox


def test_blackbox_worked_example():
    # ENG-A: beta = [1000, 10, 5], alpha = [100, 1, 100]; 20-token prompt, 5 output tokens.
    beta = np.array([1000.0, 10.0, 5.0])
    alpha = np.array([100.0, 1.0, 100.0])
    assert step(Backend.BLACKBOX, beta, (0, 20, 20, 5)) == 1200
    assert step(Backend.BLACKBOX, beta, (20, 1, 20, 5)) == 1005
    assert K.queueing_time(Backend.BLACKBOX, alpha, 20) == 120
    assert K.output_token_processing_time(Backend.BLACKBOX, alpha) == 100
    assert K.post_decode_fixed_overhead(Backend.BLACKBOX, alpha) == 0


def test_blackbox_mixed_and_edge_batches():
    beta = np.array([1000.0, 10.0, 5.0])
    # prefill 20 + decode 1 + decode 1 + an ignored entry (prompt done, no outputs)
    assert (
        step(Backend.BLACKBOX, beta, (0, 20, 20, 5), (30, 1, 10, 40), (11, 1, 10, 3), (7, 3, 7, 0))
        == 1210
    )
    assert step(Backend.BLACKBOX, beta) == 1000  # DELTA-3.4: empty scheduled list → beta0
    assert step(Backend.BLACKBOX, np.zeros(3)) == 1  # floored at 1
    assert step(Backend.BLACKBOX, np.array([0.9, 0.0, 0.0])) == 1
    assert (
        step(Backend.BLACKBOX, np.array([1e300, 1e300, 0.0]), (0, 10**6, 10**6, 1)) == 2**63 - 1
    )  # clamp


def test_clamp_to_int64():
    assert K.clamp_to_int64(math.nan) == 2**63 - 1
    assert K.clamp_to_int64(9.223372036854775808e18) == 2**63 - 1
    assert K.clamp_to_int64(1234.99) == 1234
    assert K.clamp_to_int64(-0.5) == 0


# ---------------------------------------------------------------------------------- roofline


@pytest.fixture(scope="module")
def roofline8b():
    return resolve_latency(latency_options(model=LLAMA8))


def _roofline_reference(cfg, reqs):
    """The plain-Python roofline step (``naive.roofline_step_time``) on ``cfg``'s packed
    dense-model figures."""
    p = cfg.params
    return roofline_step_time(
        p[K.RF_D], p[K.RF_L], p[K.RF_H], p[K.RF_HKV], p[K.RF_DFF_DENSE], p[K.RF_BPP],
        p[K.RF_TP], p[K.RF_PEAK_FLOPS], p[K.RF_MFU_PREFILL], p[K.RF_MFU_DECODE], p[K.RF_PEAK_BW],
        reqs)


def test_roofline_against_transcription(roofline8b):
    rng = random.Random(5)
    for _ in range(200):
        reqs = []
        for _ in range(rng.randint(1, 6)):
            inp = rng.randint(1, 5000)
            if rng.random() < 0.5:
                pi = rng.randint(0, inp - 1)
                reqs.append((pi, rng.randint(1, inp - pi), inp, rng.randint(1, 500)))
            else:
                reqs.append((inp + rng.randint(0, 500), 1, inp, rng.randint(1, 600)))
        assert step(roofline8b, None, *reqs) == _roofline_reference(roofline8b, reqs)


def test_roofline_decode_sums_match_per_request_functions():
    """The decode loop's hoisted terms give the per-request functions' float64 sums exactly."""
    rng = np.random.default_rng(7)
    for _ in range(300):
        p = np.zeros(K.RF_SIZE)
        p[K.RF_D] = rng.choice([1024.0, 4096.0, 7168.0, 3000.3])
        p[K.RF_L] = float(rng.integers(1, 100))
        p[K.RF_H] = rng.choice([7.0, 32.0, 64.0])
        p[K.RF_HKV] = rng.choice([1.0, 8.0])
        p[K.RF_DHEAD] = p[K.RF_D] / p[K.RF_H]
        p[K.RF_DKV] = p[K.RF_HKV] * p[K.RF_DHEAD]
        moe = rng.random() < 0.5
        p[K.RF_DFF_MOE], p[K.RF_DFF_DENSE] = 1408.0, rng.choice([11008.0, 14336.0])
        p[K.RF_NMAT] = rng.choice([2.0, 3.0])
        p[K.RF_N_MOE] = float(rng.integers(1, 60)) if moe else 0.0
        p[K.RF_N_DENSE] = float(rng.integers(0, 4)) if moe else p[K.RF_L]
        p[K.RF_E], p[K.RF_K] = (64.0, 6.0) if moe else (0.0, 0.0)
        p[K.RF_BPP], p[K.RF_WBPP] = rng.choice([1.0, 2.0]), rng.choice([0.5, 1.0, 2.0])
        p[K.RF_TP] = rng.choice([1.0, 2.0, 8.0])
        p[K.RF_PEAK_FLOPS], p[K.RF_MFU_DECODE] = 9.895e14, rng.random() + 0.01
        n = int(rng.integers(1, 200))
        inp = rng.integers(1, 4000, n)
        out = rng.integers(0, 2000, n)
        prog = inp + rng.integers(-50, 2000, n)
        compute, dynamic = 1e-4, 1e8
        for i in range(n):
            if prog[i] >= inp[i] and out[i] > 0:
                f = K._rf_flops(p, prog[i], 1)
                compute += f / p[K.RF_TP] / (p[K.RF_PEAK_FLOPS] * p[K.RF_MFU_DECODE])
                dynamic += K._rf_dynamic_bytes(p, prog[i], 1) / p[K.RF_TP]
        got = K._rf_add_decodes(p, n, prog, inp, out, 1e-4, 1e8)
        assert got == (compute, dynamic)


def test_roofline_regimes(roofline8b):
    assert step(roofline8b) == 1  # empty batch: 0, floored to 1
    one_decode = step(roofline8b, None, (512, 1, 512, 100))
    # a lone decode is memory bound: ~10.2 GB of weights (2-matrix MLP) at 3.35 TB/s ≈ 3.05 ms
    assert 3000 < one_decode < 3200
    # prefill requests are accumulated before decode requests, whatever the batch order
    a = (0, 300, 300, 10)
    b = (900, 1, 800, 10)
    assert step(roofline8b, None, a, b) == step(roofline8b, None, b, a)


def test_roofline_fp8_peak_selection(roofline8b):
    # ENG-6.4 step 2 / DELTA-19: weights of exactly 1 byte use the FP8 peak when the GPU has one.
    mc = roofline8b.model_config
    fp8 = ModelConfig(**{**mc.__dict__, "weight_bytes_per_param": 1.0})
    _, _, p = pack_latency_params("roofline", [0, 0, 0], [], fp8, roofline8b.hardware, 1)
    assert p[K.RF_PEAK_FLOPS] == 1979.0e12
    w4 = ModelConfig(**{**mc.__dict__, "weight_bytes_per_param": 0.5})
    _, _, p = pack_latency_params("roofline", [0, 0, 0], [], w4, roofline8b.hardware, 1)
    assert p[K.RF_PEAK_FLOPS] == 989.5e12


def test_roofline_moe_expected_experts():
    # DELTA-16: MoE weight traffic grows with the expected number of distinct experts.
    cfg = resolve_latency(
        latency_options(model="mistralai/mixtral-8x7b-v0.1", hardware="H100", tp=2)
    )
    p = cfg.params
    assert (p[K.RF_N_MOE], p[K.RF_N_DENSE], p[K.RF_E], p[K.RF_K]) == (32.0, 0.0, 8.0, 2.0)
    one = step(cfg, None, (100, 1, 100, 10))
    many = step(cfg, None, *[(100 + i, 1, 100, 10) for i in range(32)])
    assert many > one


def test_roofline_interleaved_layers():
    cfg = resolve_latency(
        latency_options(model="redhatai/llama-4-scout-17b-16e-instruct-fp8-dynamic")
    )
    p = cfg.params
    assert (p[K.RF_N_MOE], p[K.RF_N_DENSE], p[K.RF_DFF_MOE], p[K.RF_DFF_DENSE]) == (
        24.0,
        24.0,
        8192.0,
        16384.0,
    )
    assert p[K.RF_WBPP] == 1.0 and p[K.RF_PEAK_FLOPS] == 1979.0e12 and p[K.RF_TP] == 8.0


# ---------------------------------------------------------------------------------- crossmodel


def test_crossmodel_hand_checked():
    cfg = resolve_latency(latency_options(model=LLAMA8, latency_model="crossmodel"))
    p = cfg.params
    kv = (32.0 * 8.0 * 128.0 / 1.0) * 1e-6
    assert p[K.CM_KV_DIM_SCALED] == kv and p[K.CM_IS_MOE] == 0.0 and p[K.CM_IS_TP] == 0.0
    assert step(cfg) == int(116.11 * 32.0)  # DELTA-3.4: beta0·L + beta3·isTP
    expected = 116.11 * 32.0 + 1226.868 * 2.0 * kv + 19.943 * 102.0 * 0.0 + 9445.157 * 0.0
    assert step(cfg, None, (0, 100, 100, 5), (300, 1, 200, 5), (201, 1, 200, 5)) == int(expected)
    assert K.queueing_time(cfg.code, cfg.alpha, 1000) == 13732
    assert K.output_token_processing_time(cfg.code, cfg.alpha) == 860
    assert K.post_decode_fixed_overhead(cfg.code, cfg.alpha) == 0


# ---------------------------------------------------------------------------------- trained-roofline


def test_trained_roofline_hand_checked():
    cfg = resolve_latency(latency_options(model=LLAMA8, latency_model="trained-roofline"))
    b = cfg.params[:7]
    L, d, dkv, dh, dff, tp = 32.0, 4096.0, 1024.0, 128.0, 14336.0, 1.0
    F, Bw = 989.5e6, 3.35e6
    hpg = 32.0 / tp
    # one prefill of 64 new tokens of a 100-token prompt (context uses the full prompt, ENG-6.6)
    attn = 4 * hpg * 64.0 * (100.0 + 64.0 / 2) * dh
    pf_c = (
        L * 2 * 64.0 * d * (2 * d + 2 * dkv) / tp + L * attn + L * 64.0 * 1.0 * 6 * d * dff / tp
    ) / F
    pf_kv = L * 2 * (dkv / tp) * 64.0 * 2.0 / Bw
    w = (L * d * (2 * d + 2 * dkv) * 2.0 / tp + L * 1.0 * 3 * d * dff * 2.0 / tp) / Bw
    t = b[0] * max(pf_c, pf_kv) + b[1] * 0.0 + b[2] * w + b[3] * 0.0 + b[4] * L + b[5] * 1.0 + b[6]
    assert step(cfg, None, (36, 64, 100, 5)) == int(t)
    assert step(cfg) == 1  # empty batch
    assert K.queueing_time(cfg.code, cfg.alpha, 5000) == 9315  # alpha0 only
    assert K.post_decode_fixed_overhead(cfg.code, cfg.alpha) == 1849
    assert K.output_token_processing_time(cfg.code, cfg.alpha) == 1


# ---------------------------------------------------------------------------------- trained-physics


def test_trained_physics_hand_checked():
    cfg = resolve_latency(latency_options(model=LLAMA8, latency_model="trained-physics"))
    b = cfg.params[:10]
    L, d, dkv, dh, tp = 32.0, 4096.0, 1024.0, 128.0, 1.0
    F, Bw = 989.5e6, 3.35e6
    hpg = 32.0
    # two decodes at contexts 500 and 700 (10-beta mode: both splits active)
    ctx, tdc = 1200.0, 2.0
    dc_c = (
        L * 2 * tdc * d * (2 * d + 2 * dkv) / tp
        + L * 4 * hpg * ctx * dh
        + 32.0 * tdc * 1 * 6 * d * 14336.0 / tp
    ) / F
    dc_kv = L * 2 * (dkv / tp) * 2.0 * (ctx + tdc) / Bw
    w = (L * d * (2 * d + 2 * dkv) * 2.0 / tp + 32.0 * 1 * 3 * d * 14336.0 * 2.0 / tp) / Bw
    t = (
        0.0
        + (b[1] * dc_c + b[9] * dc_kv)
        + b[2] * w
        + b[3] * 0.0
        + b[4] * L
        + b[5] * 2.0
        + b[6]
        + b[7] * 0.0 * 0.0
    )
    assert step(cfg, None, (500, 1, 400, 300), (700, 1, 650, 300)) == int(t)
    assert step(cfg) == 1
    assert K.queueing_time(cfg.code, cfg.alpha, 5000) == 15563
    assert K.post_decode_fixed_overhead(cfg.code, cfg.alpha) == 777
    assert K.output_token_processing_time(cfg.code, cfg.alpha) == 45


def test_trained_physics_tp_term_and_interleaving():
    scout = resolve_latency(
        latency_options(
            model="redhatai/llama-4-scout-17b-16e-instruct-fp8-dynamic",
            latency_model="trained-physics",
        )
    )
    p = scout.params
    assert p[K.TP_MOE_SCALING] == 1.0 and p[K.TP_N_MOE] == 24.0 and p[K.TP_AR_UNITS] == 2 * 24 + 24
    assert p[K.TP_TP_FACTOR] == 7 / 8 and p[K.TP_FLOPS_US] == 1979.0e6
    base = step(scout, None, (0, 10, 10, 2))
    # beta8 (0-based 7) charges every MoE layer of an interleaved model: 481.86 µs x 24
    assert base > 481.8613888 * 24


# ---------------------------------------------------------------------------------- parity goldens


@needs_parity
@pytest.mark.parametrize("case", LATENCY_CASES)
def test_lone_requests_match_reference(case):
    """TTFT (= queueing + prefill steps + alpha2) and, when alone throughout, E2E of requests the
    reference served with an otherwise idle instance equal the kernel's step times summed."""
    cfg = resolve_latency(options_for(case))
    found = lone_requests(case, cfg)
    assert found, "no request was alone on the instance"
    for item in found:
        assert item["ttft_us"] == item["ref_ttft_us"], item
        assert item["sched_us"] == item["ref_sched_us"], item
        if item["e2e_us"] is not None:
            assert item["e2e_us"] == item["ref_e2e_us"], item


@needs_parity
def test_quickstart_first_request_golden():
    # request_0 of quickstart-llama31-8b: 185-token prompt, roofline with alpha = 0, so its TTFT
    # (4.258 ms in results.json) is one prefill step; it is alone for its whole life.
    cfg = resolve_latency(options_for("quickstart-llama31-8b"))
    assert step(cfg, None, (0, 185, 185, 1208)) == 4258
    found = {x["id"]: x for x in lone_requests("quickstart-llama31-8b", cfg)}
    assert sum(1 for x in found.values() if x["e2e_us"] is not None) >= 3


@needs_parity
def test_blackbox_lowload_first_request_golden():
    # request_0: 609-token prompt; queueing 10326 µs (alpha0) + 6472.0076 + 19.7972·609 µs.
    cfg = resolve_latency(options_for("blackbox-default-lowload"))
    assert K.queueing_time(cfg.code, cfg.alpha, 609) == 10326
    assert step(cfg, None, (0, 609, 609, 496)) == 18528
    assert 10326 + 18528 + 0 == 28854  # ttft_ms 28.854 in results.json
