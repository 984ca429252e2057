"""Latency-model kernels: step time and alpha overheads of every backend (ENG-6, DELTA-3/16/17/20).

Each backend is an integer ``code``; its configuration is one float64 ``params`` array packed by
``blis_fast.config.latency.LatencyConfig`` (layouts below, index constants in this module).
Every formula keeps the reference's float64 evaluation order (left to right, no fused
multiply-add, no reassociation), so results are bit-identical to the Go simulator's.

Batch contract of ``step_time``: entries ``0..n-1`` of the four int64 arrays describe the
requests scheduled this step (those granted tokens, DELTA-3), in batch order. Entry ``i`` is a
**prefill** request iff ``progress[i] < input_len[i]``; otherwise a **decode** request iff
``output_len[i] > 0``; otherwise it is ignored (but still counts in the batch size of the trained
backends). ``new_tokens[i]`` is the request's NumNewTokens of the step.

``params`` layouts (index constants ``<PREFIX>_<NAME>``):

* BLACKBOX (``BB_``, 3): ``BETA0`` per-step µs, ``BETA1`` µs per prefill token, ``BETA2`` µs per
  decode token.
* ROOFLINE (``RF_``, 20): ``D`` hidden size, ``L`` layers, ``H`` attention heads, ``HKV`` KV heads
  (0 replaced by H), ``DHEAD`` = D/H (float division), ``DKV`` = HKV·DHEAD, ``DFF_MOE`` and
  ``DFF_DENSE`` (FFN widths of MoE and dense layers; intermediate size, or 4·D when absent),
  ``NMAT`` MLP matrix count (2), ``N_MOE`` / ``N_DENSE`` layer counts, ``E`` experts, ``K`` experts
  per token, ``BPP`` KV/compute bytes per element, ``WBPP`` effective weight bytes per parameter,
  ``TP``, ``PEAK_FLOPS`` (FLOP/s, the FP8 rate when WBPP is exactly 1 and the GPU has one),
  ``PEAK_BW`` (bytes/s), ``MFU_PREFILL``, ``MFU_DECODE``.
* CROSSMODEL (``CM_``, 8): ``BETA0..BETA3``, ``L`` layers, ``KV_DIM_SCALED`` = (L·HKV·(D/H)/TP)·1e-6,
  ``IS_MOE`` (1.0 when the model has experts), ``IS_TP`` (1.0 when TP > 1).
* TRAINED_ROOFLINE: the TRAINED_PHYSICS layout with BETA0..BETA6, ``N_MOE`` = L of width
  ``DFF_MOE`` = intermediate size, ``KEFF`` = max(1, experts per token), ``IS_MOE`` (experts > 0),
  ``WBPP`` 2, ``FLOPS_US`` TFlopsPeak·1e6, every other field 0 (its formula is trained-physics
  without the split, MoE-scaling and all-reduce terms).
* TRAINED_PHYSICS (``TP_``, 31): ``BETA0..BETA9`` (missing betas are 0), ``PREFILL_SPLIT`` /
  ``DECODE_SPLIT`` (1.0 when ≥ 9 / ≥ 10 betas were given), ``L``, ``D``, ``DKV``, ``DH``, ``TP``,
  ``KEFF``, ``HPG``, ``IS_MOE`` (experts > 1), ``E``, ``N_MOE``, ``N_DENSE``, ``DFF_MOE``,
  ``DFF_DENSE``, ``MOE_SCALING`` (1.0 for interleaved MoE), ``WBPP``, ``FLOPS_US`` (FP8-aware),
  ``BW_US``, ``TP_FACTOR`` = (TP−1)/TP, ``AR_UNITS`` = 2·N_DENSE + N_MOE.

``alpha`` is always float64[3]. All times are int64 microseconds (ticks).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from blis_fast.kernels.engine.latency_profiled import profiled_step
from blis_fast.kernels.go.gomath import INT64_MAX, INT64_MIN, go_max, go_min, go_pow
from blis_fast.kernels.jit import njit


class BackendT(NamedTuple):
    """Latency backends' kernel codes (ENG-6), beside their step functions; each backend has its
    ``params`` layout below and one entry in ``blis_fast/config/latency_backends.py``."""

    BLACKBOX: int = 0
    ROOFLINE: int = 1
    CROSSMODEL: int = 2
    TRAINED_ROOFLINE: int = 3
    TRAINED_PHYSICS: int = 4
    PROFILED: int = 5  # blis_fast's own (latency_profiled.py), not a reference backend


Backend = BackendT()


__all__ = [
    "Backend",
    "clamp_to_int64",
    "output_token_processing_time",
    "post_decode_fixed_overhead",
    "queueing_time",
    "step_time",
]

# BLACKBOX layout
BB_BETA0, BB_BETA1, BB_BETA2 = 0, 1, 2
BB_SIZE = 3

# ROOFLINE layout
RF_D, RF_L, RF_H, RF_HKV, RF_DHEAD, RF_DKV = 0, 1, 2, 3, 4, 5
RF_DFF_MOE, RF_DFF_DENSE, RF_NMAT, RF_N_MOE, RF_N_DENSE = 6, 7, 8, 9, 10
RF_E, RF_K, RF_BPP, RF_WBPP, RF_TP = 11, 12, 13, 14, 15
RF_PEAK_FLOPS, RF_PEAK_BW, RF_MFU_PREFILL, RF_MFU_DECODE = 16, 17, 18, 19
RF_SIZE = 20

# CROSSMODEL layout
CM_BETA0, CM_BETA1, CM_BETA2, CM_BETA3 = 0, 1, 2, 3
CM_L, CM_KV_DIM_SCALED, CM_IS_MOE, CM_IS_TP = 4, 5, 6, 7
CM_SIZE = 8

# TRAINED_PHYSICS layout, also TRAINED_ROOFLINE's: trained-roofline is trained-physics with
# every layer an "MoE" layer of the model's FFN width and k experts, 2-byte weights, no split
# prefill/decode terms, β7..β9 = 0 and no all-reduce units (config/latency_backends.py packs
# it so; each extra term then adds an exact 0.0, so the step times are the same to the bit)
TP_BETA0 = 0  # BETA0..BETA9 at 0..9
TP_PREFILL_SPLIT, TP_DECODE_SPLIT = 10, 11
TP_L, TP_D, TP_DKV, TP_DH, TP_TP, TP_KEFF, TP_HPG = 12, 13, 14, 15, 16, 17, 18
TP_IS_MOE, TP_E, TP_N_MOE, TP_N_DENSE, TP_DFF_MOE, TP_DFF_DENSE = 19, 20, 21, 22, 23, 24
TP_MOE_SCALING, TP_WBPP, TP_FLOPS_US, TP_BW_US, TP_TP_FACTOR, TP_AR_UNITS = 25, 26, 27, 28, 29, 30
TP_SIZE = 31

_TWO63 = 9.223372036854775808e18


@njit(cache=True, _nrt=False, error_model="numpy")
def clamp_to_int64(v: float) -> np.int64:
    """Go's clampToInt64: NaN or ≥ 2^63 → MaxInt64, else truncation toward zero."""
    if math.isnan(v) or v >= _TWO63:
        return np.int64(INT64_MAX)
    if v < -_TWO63:
        return np.int64(INT64_MIN)
    return np.int64(v)


# ----------------------------------------------------------------------------- blackbox


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _token_totals(n, progress, new_tokens, input_len, output_len):
    """New prefill tokens and new decode tokens of the first ``n`` scheduled requests (a
    request with no outputs never counts as decoding)."""
    prefill = np.int64(0)
    decode = np.int64(0)
    for i in range(n):
        if progress[i] < input_len[i]:
            prefill += new_tokens[i]
        elif output_len[i] > 0:
            decode += new_tokens[i]
    return prefill, decode


@njit(cache=True, _nrt=False, error_model="numpy")
def _blackbox_step(params, n, progress, new_tokens, input_len, output_len) -> np.int64:
    prefill, decode = _token_totals(n, progress, new_tokens, input_len, output_len)
    t = 0.0
    t += params[BB_BETA0]
    t += params[BB_BETA1] * float(prefill)
    t += params[BB_BETA2] * float(decode)
    return max(np.int64(1), clamp_to_int64(t))


# ----------------------------------------------------------------------------- roofline


@njit(cache=True, _nrt=False, error_model="numpy")
def _rf_flops(p, seq_len, new_tokens) -> float:
    """Transformer FLOPs of one request (attention + MLP), as calculateTransformerFlops."""
    d = p[RF_D]
    n_layers = p[RF_L]
    n_heads = p[RF_H]
    d_head = p[RF_DHEAD]
    d_kv = p[RF_DKV]
    seq = float(seq_len)
    new_t = float(new_tokens)

    qkv = 2 * new_t * (d * d + 2 * d * d_kv)
    proj = 2 * new_t * d * d
    gemm = (qkv + proj) * n_layers
    eff_ctx = seq
    if new_t > 1:
        eff_ctx = seq + (new_t - 1) / 2.0
    attn = 4 * n_heads * new_t * eff_ctx * d_head
    rope = 2 * new_t * d
    vector = (5 * n_heads * new_t * eff_ctx) + rope
    gemm += attn * n_layers
    sram = vector * n_layers

    n_mat = p[RF_NMAT]
    n_moe = p[RF_N_MOE]
    n_dense = p[RF_N_DENSE]
    if n_moe > 0:
        mlp_moe = 2 * new_t * (n_mat * d * p[RF_DFF_MOE]) * p[RF_K]
        gemm += mlp_moe * n_moe
    if n_dense > 0:
        mlp_dense = 2 * new_t * (n_mat * d * p[RF_DFF_DENSE])
        gemm += mlp_dense * n_dense
    return gemm + sram


@njit(cache=True, _nrt=False, error_model="numpy")
def _rf_weights(p, new_tokens) -> float:
    """Weight bytes touched by a pass over ``new_tokens`` tokens (MoE: expected unique experts)."""
    d = p[RF_D]
    n_layers = p[RF_L]
    attn_per_layer = d * (d + 2 * p[RF_DKV]) + (d * d)
    n_mat = p[RF_NMAT]
    n_moe = p[RF_N_MOE]
    n_dense = p[RF_N_DENSE]
    moe_w = 0.0
    if n_moe > 0:
        per_layer = n_mat * d * p[RF_DFF_MOE]
        e = p[RF_E]
        k = p[RF_K]
        prob_not_selected = (e - k) / e
        n_eff = e * (1.0 - go_pow(prob_not_selected, float(new_tokens), False))
        moe_w = per_layer * n_eff * n_moe
    dense_w = 0.0
    if n_dense > 0:
        per_layer_d = n_mat * d * p[RF_DFF_DENSE]
        dense_w = per_layer_d * n_dense
    total_mlp = moe_w + dense_w
    return ((attn_per_layer * n_layers) + total_mlp) * p[RF_WBPP]


@njit(cache=True, _nrt=False, error_model="numpy")
def _rf_dynamic_bytes(p, seq_len, new_tokens) -> float:
    """(total − weights) bytes of one request: KV growth, KV reads and activations."""
    n_layers = p[RF_L]
    d = p[RF_D]
    bpp = p[RF_BPP]
    new_t = float(new_tokens)
    weights = _rf_weights(p, new_tokens)
    kv_per_token = 2 * n_layers * p[RF_HKV] * p[RF_DHEAD] * bpp
    growth = kv_per_token * new_t
    access = kv_per_token * float(seq_len)
    act = n_layers * d * bpp * new_t
    total = weights + growth + access + act
    return total - weights


@njit(cache=True, _nrt=False, error_model="numpy")
def _rf_add_decodes(p, n, progress, input_len, output_len, compute_s, dynamic_bytes):
    """Add every decode request's compute time and dynamic bytes, in batch order.

    The same float64 operations, in the same order, as ``_rf_flops(p, seq, 1)`` and
    ``_rf_dynamic_bytes(p, seq, 1)`` per request; the ones that do not depend on the request's
    sequence length are done once, and a division by a tensor parallelism of exactly 1.0
    (which returns its dividend unchanged) is skipped.
    """
    new_t = 1.0
    d = p[RF_D]
    n_layers = p[RF_L]
    n_heads = p[RF_H]
    d_head = p[RF_DHEAD]
    tp = p[RF_TP]
    # _rf_flops: the terms without the sequence length
    qkv = 2 * new_t * (d * d + 2 * d * p[RF_DKV])
    proj = 2 * new_t * d * d
    gemm0 = (qkv + proj) * n_layers
    attn_k = 4 * n_heads * new_t
    vector_k = 5 * n_heads * new_t
    rope = 2 * new_t * d
    n_mat = p[RF_NMAT]
    n_moe = p[RF_N_MOE]
    n_dense = p[RF_N_DENSE]
    moe_term = 0.0
    if n_moe > 0:
        moe_term = (2 * new_t * (n_mat * d * p[RF_DFF_MOE]) * p[RF_K]) * n_moe
    dense_term = 0.0
    if n_dense > 0:
        dense_term = (2 * new_t * (n_mat * d * p[RF_DFF_DENSE])) * n_dense
    per_s = p[RF_PEAK_FLOPS] * p[RF_MFU_DECODE]
    # _rf_dynamic_bytes: the terms without the sequence length
    bpp = p[RF_BPP]
    weights = _rf_weights(p, 1)
    kv_per_token = 2 * n_layers * p[RF_HKV] * d_head * bpp
    weights_growth = weights + kv_per_token * new_t
    act = n_layers * d * bpp * new_t
    for i in range(n):
        if progress[i] >= input_len[i] and output_len[i] > 0:
            seq = float(progress[i])
            gemm = gemm0 + (attn_k * seq * d_head) * n_layers
            if n_moe > 0:
                gemm += moe_term
            if n_dense > 0:
                gemm += dense_term
            f = gemm + ((vector_k * seq) + rope) * n_layers
            dyn = ((weights_growth + kv_per_token * seq) + act) - weights
            if tp == 1.0:
                compute_s += f / per_s
                dynamic_bytes += dyn
            else:
                compute_s += f / tp / per_s
                dynamic_bytes += dyn / tp
    return compute_s, dynamic_bytes


@njit(cache=True, _nrt=False, error_model="numpy")
def _roofline_step(params, n, progress, new_tokens, input_len, output_len) -> np.int64:
    p = params
    tp = p[RF_TP]
    peak_flops = p[RF_PEAK_FLOPS]
    peak_bw = p[RF_PEAK_BW]
    n_prefill = 0
    n_decode = 0
    prefill_tokens = np.int64(0)
    for i in range(n):
        if progress[i] < input_len[i]:
            n_prefill += 1
            prefill_tokens += new_tokens[i]
        elif output_len[i] > 0:
            n_decode += 1
    if n_prefill == 0 and n_decode == 0:
        return np.int64(1)
    compute_s = 0.0
    dynamic_bytes = 0.0
    for i in range(n):  # prefill requests first, in batch order
        if progress[i] < input_len[i]:
            f = _rf_flops(p, progress[i], new_tokens[i])
            compute_s += f / tp / (peak_flops * p[RF_MFU_PREFILL])
            dynamic_bytes += _rf_dynamic_bytes(p, progress[i], new_tokens[i]) / tp
    if n_decode > 0:  # then decode requests (one token each)
        compute_s, dynamic_bytes = _rf_add_decodes(p, n, progress, input_len, output_len,
                                                   compute_s, dynamic_bytes)
    total_new = prefill_tokens + n_decode
    weight_bytes = _rf_weights(p, total_new) / tp
    memory_s = (weight_bytes + dynamic_bytes) / peak_bw
    micros = go_max(compute_s, memory_s) * 1e6
    return max(np.int64(1), clamp_to_int64(micros))


# ----------------------------------------------------------------------------- crossmodel


@njit(cache=True, _nrt=False, error_model="numpy")
def _crossmodel_step(params, n, progress, new_tokens, input_len, output_len) -> np.int64:
    prefill, decode = _token_totals(n, progress, new_tokens, input_len, output_len)
    p = params
    t = (
        p[CM_BETA0] * p[CM_L]
        + p[CM_BETA1] * float(decode) * p[CM_KV_DIM_SCALED]
        + p[CM_BETA2] * float(prefill + decode) * p[CM_IS_MOE]
        + p[CM_BETA3] * p[CM_IS_TP]
    )
    return max(np.int64(1), clamp_to_int64(t))


# ----------------------------------------------------------------------------- trained backends
# The trained-roofline and trained-physics backends share their batch sums and per-phase terms;
# each helper keeps the reference's float64 evaluation order for both.


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _trained_batch_sums(h_per_gpu, d_h, n, progress, new_tokens, input_len, output_len):
    """Prefill tokens, decode requests, decode context and the prefill attention sum over the
    scheduled requests: (total_prefill, total_decode, sum_ctx, prefill_attn)."""
    total_prefill = 0.0
    total_decode = 0.0
    sum_ctx = 0.0
    prefill_attn = 0.0
    for i in range(n):
        if progress[i] < input_len[i]:
            ti = float(new_tokens[i])
            si = float(input_len[i])
            total_prefill += ti
            prefill_attn += 4 * h_per_gpu * ti * (si + ti / 2) * d_h
        elif output_len[i] > 0:
            total_decode += 1
            sum_ctx += float(progress[i])
    return total_prefill, total_decode, sum_ctx, prefill_attn


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _proj_flops(n_layers, tokens, d, d_kv, tp) -> float:
    """Q/K/V/O projection FLOPs of ``tokens`` tokens on one GPU."""
    return n_layers * 2 * tokens * d * (2 * d + 2 * d_kv) / tp


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _ffn_flops(layers, tokens, k, d, dff, tp) -> float:
    """FFN FLOPs of ``tokens`` tokens through ``layers`` layers with ``k`` active experts."""
    return layers * tokens * k * 6 * d * dff / tp


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _phase_times(n_layers, d, d_kv, d_h, tp, h_per_gpu, flops_us, bw_us, sums, ffn_prefill,
                 ffn_decode):
    """Compute and KV-traffic times of the prefill and decode phases (0 for an empty phase):
    (t_pf_compute, t_pf_kv, t_dc_compute, t_dc_kv)."""
    total_prefill, total_decode, sum_ctx, prefill_attn = sums
    t_pf_compute = 0.0
    t_pf_kv = 0.0
    if total_prefill > 0:
        flops_proj = _proj_flops(n_layers, total_prefill, d, d_kv, tp)
        t_pf_compute = (flops_proj + n_layers * prefill_attn + ffn_prefill) / flops_us
        t_pf_kv = n_layers * 2 * (d_kv / tp) * total_prefill * 2.0 / bw_us
    t_dc_compute = 0.0
    t_dc_kv = 0.0
    if total_decode > 0:
        flops_proj = _proj_flops(n_layers, total_decode, d, d_kv, tp)
        flops_attn = n_layers * 4 * h_per_gpu * sum_ctx * d_h
        t_dc_compute = (flops_proj + flops_attn + ffn_decode) / flops_us
        t_dc_kv = n_layers * 2 * (d_kv / tp) * 2.0 * (sum_ctx + total_decode) / bw_us
    return t_pf_compute, t_pf_kv, t_dc_compute, t_dc_kv


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _active_experts(is_moe, experts, k_eff, tokens) -> float:
    """Experts whose weights a MoE step reads: min(E, max(k, tokens * k)); 1 for dense."""
    if is_moe == 0.0:
        return 1.0
    return go_min(experts, go_max(k_eff, tokens * k_eff))


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _attn_weight_bytes(n_layers, d, d_kv, bpp, tp) -> float:
    """Attention weight bytes on one GPU."""
    return n_layers * d * (2 * d + 2 * d_kv) * bpp / tp


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _ffn_weight_bytes(layers, experts, d, dff, bpp, tp) -> float:
    """FFN weight bytes of ``experts`` experts through ``layers`` layers on one GPU."""
    return layers * experts * 3 * d * dff * bpp / tp


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _physics_ffn_flops(p, tokens) -> float:
    """trained-physics FFN FLOPs: MoE layers with k active experts, dense layers with one."""
    flops = 0.0
    if p[TP_N_MOE] > 0:
        flops += _ffn_flops(p[TP_N_MOE], tokens, p[TP_KEFF], p[TP_D], p[TP_DFF_MOE], p[TP_TP])
    if p[TP_N_DENSE] > 0:
        flops += _ffn_flops(p[TP_N_DENSE], tokens, 1, p[TP_D], p[TP_DFF_DENSE], p[TP_TP])
    return flops


@njit(cache=True, _nrt=False, error_model="numpy")
def _trained_physics_step(params, n, progress, new_tokens, input_len, output_len) -> np.int64:
    if n == 0:
        return np.int64(1)
    p = params
    n_layers = p[TP_L]
    d = p[TP_D]
    d_kv = p[TP_DKV]
    tp = p[TP_TP]
    n_moe = p[TP_N_MOE]
    n_dense = p[TP_N_DENSE]
    bw_us = p[TP_BW_US]
    sums = _trained_batch_sums(p[TP_HPG], p[TP_DH], n, progress, new_tokens, input_len,
                               output_len)
    total_prefill, total_decode = sums[0], sums[1]
    t_pf_compute, t_pf_kv, t_dc_compute, t_dc_kv = _phase_times(
        n_layers, d, d_kv, p[TP_DH], tp, p[TP_HPG], p[TP_FLOPS_US], bw_us, sums,
        _physics_ffn_flops(p, total_prefill), _physics_ffn_flops(p, total_decode))
    n_eff = _active_experts(p[TP_IS_MOE], p[TP_E], p[TP_KEFF], total_prefill + total_decode)
    bpp = p[TP_WBPP]
    bytes_attn = _attn_weight_bytes(n_layers, d, d_kv, bpp, tp)
    bytes_ffn = 0.0
    if n_moe > 0:
        bytes_ffn += _ffn_weight_bytes(n_moe, n_eff, d, p[TP_DFF_MOE], bpp, tp)
    if n_dense > 0:
        bytes_ffn += _ffn_weight_bytes(n_dense, 1, d, p[TP_DFF_DENSE], bpp, tp)
    t_weight = (bytes_attn + bytes_ffn) / bw_us

    t_tp = 0.0
    if tp > 1:
        total_tokens = total_prefill + total_decode
        t_tp = p[TP_AR_UNITS] * total_tokens * d * 2.0 * 2.0 * p[TP_TP_FACTOR] / bw_us

    if p[TP_PREFILL_SPLIT] != 0.0:
        prefill_term = p[TP_BETA0] * t_pf_compute + p[TP_BETA0 + 8] * t_pf_kv
    else:
        prefill_term = p[TP_BETA0] * go_max(t_pf_compute, t_pf_kv)
    if p[TP_DECODE_SPLIT] != 0.0:
        decode_term = p[TP_BETA0 + 1] * t_dc_compute + p[TP_BETA0 + 9] * t_dc_kv
    else:
        decode_term = p[TP_BETA0 + 1] * go_max(t_dc_compute, t_dc_kv)

    t = (
        prefill_term
        + decode_term
        + p[TP_BETA0 + 2] * t_weight
        + p[TP_BETA0 + 3] * t_tp
        + p[TP_BETA0 + 4] * n_layers
        + p[TP_BETA0 + 5] * float(n)
        + p[TP_BETA0 + 6]
        + p[TP_BETA0 + 7] * p[TP_MOE_SCALING] * n_moe
    )
    return max(np.int64(1), clamp_to_int64(t))


# ----------------------------------------------------------------------------- dispatch


@njit(cache=True, _nrt=False, error_model="numpy")
def step_time(
    code: int,
    params: np.ndarray,
    n: int,
    progress: np.ndarray,
    new_tokens: np.ndarray,
    input_len: np.ndarray,
    output_len: np.ndarray,
) -> np.int64:
    """The backend's StepTime (≥ 1 µs) over the first ``n`` scheduled requests; -1 for a code
    no backend has."""
    if code == Backend.BLACKBOX:
        return _blackbox_step(params, n, progress, new_tokens, input_len, output_len)
    if code == Backend.ROOFLINE:
        return _roofline_step(params, n, progress, new_tokens, input_len, output_len)
    if code == Backend.CROSSMODEL:
        return _crossmodel_step(params, n, progress, new_tokens, input_len, output_len)
    if code == Backend.TRAINED_ROOFLINE or code == Backend.TRAINED_PHYSICS:
        return _trained_physics_step(params, n, progress, new_tokens, input_len, output_len)
    if code == Backend.PROFILED:
        return profiled_step(params, n, progress, new_tokens, input_len, output_len)
    return np.int64(-1)  # unknown backend: the engine refuses such a code before it runs


@njit(cache=True, _nrt=False, error_model="numpy")
def is_known_backend(code: int) -> bool:
    """True for a backend code :func:`step_time` implements."""
    return 0 <= code < len(Backend)


@njit(cache=True, _nrt=False, error_model="numpy")
def queueing_time(code: int, alpha: np.ndarray, input_len: int) -> np.int64:
    """Arrival → queued delay: α0 + α1·input length, or α0 alone for the trained backends."""
    if code == Backend.TRAINED_ROOFLINE or code == Backend.TRAINED_PHYSICS:
        return clamp_to_int64(alpha[0])
    t = 0.0
    t += alpha[0]
    t += alpha[1] * float(input_len)
    return clamp_to_int64(t)


@njit(cache=True, _nrt=False, error_model="numpy")
def output_token_processing_time(code: int, alpha: np.ndarray) -> np.int64:
    """Per-output-token overhead α2 (added to TTFT once and to every ITL sample)."""
    return clamp_to_int64(alpha[2])


@njit(cache=True, _nrt=False, error_model="numpy")
def post_decode_fixed_overhead(code: int, alpha: np.ndarray) -> np.int64:
    """Fixed E2E overhead of requests with outputs: α1 for the trained backends, else 0."""
    if code == Backend.TRAINED_ROOFLINE or code == Backend.TRAINED_PHYSICS:
        return clamp_to_int64(alpha[1])
    return np.int64(0)
