"""The ``profiled`` latency backend: a step's time from the work it does on a profiled GPU.

Not a reference backend (blis_fast's own, issue 27; documented rule by rule in
``docs/latency-profiled.md``). Per layer, every weight GEMM is timed from its shape as a smooth
roofline of its FLOPs and bytes, with the GPU profile's efficiencies; attention, elementwise work,
fixed per-layer and per-step costs and tensor-parallel all-reduces are added; the LM head runs
for sampled tokens only. The result is never below the step's physical floor (its FLOPs at peak
FLOP/s, its bytes at peak bandwidth), which :func:`profiled_work` also returns.

``params`` layout (``PF_`` index constants, float64), packed by
``blis_fast/config/gpu_profile.py``: the model per GPU (``HQ``/``HKV`` heads per GPU, FFN widths
per GPU, vocabulary per GPU), the GPU's peaks, the profile's efficiencies and byte counts.
Batch contract as ``step_time`` in ``latency.py``: a prefill request (progress < input length)
brings ``new_tokens`` tokens over ``progress`` cached ones; a decode request (else, with
outputs) one token over ``progress`` cached ones.
"""

from __future__ import annotations

import math

import numpy as np

from blis_fast.kernels.jit import njit

# model, per GPU
PF_L, PF_D, PF_HQ, PF_HKV, PF_DH, PF_DFF = 0, 1, 2, 3, 4, 5
PF_N_DENSE, PF_N_MOE, PF_E, PF_K, PF_DFF_MOE, PF_DFF_SHARED = 6, 7, 8, 9, 10, 11
PF_VOCAB, PF_WBYTES, PF_KVBYTES, PF_TP = 12, 13, 14, 15  # KVBYTES: the compute dtype's, of
# every activation and KV element
# GPU peaks
PF_PEAK_FLOPS, PF_PEAK_BW = 16, 17
# GEMM efficiencies: compute at large M, tokens at half of it, weight-streaming, overlap exponent
PF_G_COMPUTE, PF_G_HALF_M, PF_G_MEMORY, PF_G_OVERLAP = 18, 19, 20, 21
# attention
PF_A_PREFILL_COMPUTE, PF_A_CACHED_SCORE_BYTES, PF_A_DECODE_MEMORY, PF_A_DECODE_SCORE_BYTES = 22, 23, 24, 25
# elementwise (bytes per element per token and layer, at an efficiency)
PF_E_MEMORY, PF_E_HIDDEN, PF_E_QKV, PF_E_FFN, PF_E_KV_COPY, PF_E_KV_CONCAT = 26, 27, 28, 29, 30, 31
# fixed costs (µs) and interconnect
PF_FIX_LAYER_US, PF_FIX_STEP_US, PF_AR_BW, PF_AR_LATENCY_US = 32, 33, 34, 35
# MLP input matrices: 2 for a gated MLP (gate and up, SwiGLU), 1 otherwise
PF_MLP_INPUTS = 36
PF_G_LAUNCH_US = 37  # fixed time of every GEMM (launch and tail), µs
PF_SIZE = 38

@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _gemm(p, m, n, k, timed):
    """(seconds, FLOPs, bytes) of an M x K by K x N GEMM with M tokens: a fixed launch time plus
    the p-norm of its compute and memory times, compute efficiency rising with M (tile
    occupancy). Untimed (the floor guard's work only), the seconds are 0."""
    if m <= 0.0 or n <= 0.0 or k <= 0.0:
        return 0.0, 0.0, 0.0
    flops = 2.0 * m * n * k
    nbytes = n * k * p[PF_WBYTES] + (m * k + m * n) * p[PF_KVBYTES]
    if not timed:
        return 0.0, flops, nbytes
    eff = p[PF_G_COMPUTE] * m / (m + p[PF_G_HALF_M])
    compute = flops / (p[PF_PEAK_FLOPS] * eff)
    memory = nbytes / (p[PF_PEAK_BW] * p[PF_G_MEMORY])
    q = p[PF_G_OVERLAP]
    hi = max(compute, memory)
    lo = min(compute, memory)
    return p[PF_G_LAUNCH_US] * 1e-6 + hi * (1.0 + (lo / hi) ** q) ** (1.0 / q), flops, nbytes


@njit(cache=True, _nrt=False, error_model="numpy")
def _weight_gemms(p, tokens, sampled, timed):
    """(seconds, FLOPs, bytes, FFN activation width) of every weight GEMM of a step: each
    layer's QKV and O, its dense MLP (gate+up, down) or its MoE (router, the experts the tokens
    are expected to touch with their share of tokens, shared experts), and the LM head over the
    sampled tokens."""
    hq, hkv, dh, d = p[PF_HQ], p[PF_HKV], p[PF_DH], p[PF_D]
    qkv_s, qkv_f, qkv_b = _gemm(p, tokens, (hq + 2.0 * hkv) * dh, d, timed)
    o_s, o_f, o_b = _gemm(p, tokens, d, hq * dh, timed)
    layers = p[PF_N_DENSE] + p[PF_N_MOE]
    seconds = layers * (qkv_s + o_s)
    flops = layers * (qkv_f + o_f)
    nbytes = layers * (qkv_b + o_b)
    ffn_act = p[PF_DFF]
    if p[PF_N_DENSE] > 0.0:
        gu_s, gu_f, gu_b = _gemm(p, tokens, p[PF_MLP_INPUTS] * p[PF_DFF], d, timed)
        dn_s, dn_f, dn_b = _gemm(p, tokens, d, p[PF_DFF], timed)
        seconds += p[PF_N_DENSE] * (gu_s + dn_s)
        flops += p[PF_N_DENSE] * (gu_f + dn_f)
        nbytes += p[PF_N_DENSE] * (gu_b + dn_b)
    if p[PF_N_MOE] > 0.0:
        e, k = p[PF_E], p[PF_K]
        touched = e * (1.0 - (1.0 - k / e) ** tokens)
        per_expert = tokens * k / touched
        r_s, r_f, r_b = _gemm(p, tokens, e, d, timed)  # router
        gu_s, gu_f, gu_b = _gemm(p, per_expert, p[PF_MLP_INPUTS] * p[PF_DFF_MOE], d, timed)
        dn_s, dn_f, dn_b = _gemm(p, per_expert, d, p[PF_DFF_MOE], timed)
        sg_s, sg_f, sg_b = _gemm(p, tokens, p[PF_MLP_INPUTS] * p[PF_DFF_SHARED], d, timed)
        sd_s, sd_f, sd_b = _gemm(p, tokens, d, p[PF_DFF_SHARED], timed)
        seconds += p[PF_N_MOE] * (r_s + touched * (gu_s + dn_s) + sg_s + sd_s)
        flops += p[PF_N_MOE] * (r_f + touched * (gu_f + dn_f) + sg_f + sd_f)
        nbytes += p[PF_N_MOE] * (r_b + touched * (gu_b + dn_b) + sg_b + sd_b)
        if p[PF_N_DENSE] == 0.0:
            ffn_act = k * p[PF_DFF_MOE] + p[PF_DFF_SHARED]
    h_s, h_f, h_b = _gemm(p, sampled, p[PF_VOCAB], d, timed)
    return seconds + h_s, flops + h_f, nbytes + h_b, ffn_act


@njit(cache=True, _nrt=False, error_model="numpy")
def gemm_seconds(params, m, n, k) -> float:
    """The modelled time of one GEMM (M tokens, N outputs, K inputs) on the profiled GPU: what
    a GEMM microbenchmark measures, for fitting a profile's GEMM figures."""
    return _gemm(params, float(m), float(n), float(k), True)[0]


@njit(cache=True, _nrt=False, error_model="numpy")
def weight_gemm_seconds(params, tokens, sampled) -> float:
    """The modelled time of a step's weight GEMMs alone (``tokens`` through every layer,
    ``sampled`` through the LM head): what a GEMM-only timing measures, for fitting the GEMM
    figures of a profile."""
    return _weight_gemms(params, float(tokens), float(sampled), True)[0]


@njit(cache=True, _nrt=False, error_model="numpy")
def profiled_work(params, n, progress, new_tokens, input_len, output_len):
    """(seconds, FLOPs, bytes) of one step: the modelled time and the step's true work."""
    return _work(params, n, progress, new_tokens, input_len, output_len, True)


@njit(cache=True, _nrt=False, error_model="numpy")
def _work(params, n, progress, new_tokens, input_len, output_len, timed):
    """:func:`profiled_work`; untimed (the floor guard, every step of every backend) it skips
    the time terms and returns 0 seconds with the same FLOPs and bytes."""
    p = params
    hq, hkv, dh, d = p[PF_HQ], p[PF_HKV], p[PF_DH], p[PF_D]
    tokens = 0.0
    sampled = 0.0
    attn_s = 0.0  # per layer
    attn_flops = 0.0
    kv_bytes = 0.0
    copy_bytes = 0.0
    for i in range(n):
        if progress[i] < input_len[i]:
            t = float(new_tokens[i])
            ctx = float(progress[i])
            tokens += t
            if progress[i] + new_tokens[i] >= input_len[i]:
                sampled += 1.0
            f = 4.0 * hq * dh * (t * ctx + t * t / 2.0)
            attn_flops += f
            span = ctx + t
            kv_bytes += 2.0 * hkv * dh * span * p[PF_KVBYTES]
            if timed:
                attn_s += f / (p[PF_PEAK_FLOPS] * p[PF_A_PREFILL_COMPUTE])
                copy_bytes += p[PF_E_KV_COPY] * (hq + hkv) * dh * span
                if progress[i] > 0:
                    attn_s += p[PF_A_CACHED_SCORE_BYTES] * hq * t * span / p[PF_PEAK_BW]
                    copy_bytes += p[PF_E_KV_CONCAT] * hkv * dh * span
        elif output_len[i] > 0:
            ctx = float(progress[i])
            tokens += 1.0
            sampled += 1.0
            attn_flops += 4.0 * hq * dh * ctx
            kv = 2.0 * hkv * dh * ctx * p[PF_KVBYTES]
            kv_bytes += kv
            if timed:
                attn_s += ((kv + p[PF_A_DECODE_SCORE_BYTES] * hq * ctx)
                           / (p[PF_PEAK_BW] * p[PF_A_DECODE_MEMORY]))
    if tokens == 0.0:
        return 0.0, 0.0, 0.0

    gemm_s, gemm_f, gemm_b, ffn_act = _weight_gemms(p, tokens, sampled, timed)
    layers = p[PF_N_DENSE] + p[PF_N_MOE]
    flops = layers * attn_flops + gemm_f
    nbytes = layers * kv_bytes + gemm_b
    if not timed:
        return 0.0, flops, nbytes

    # elementwise bytes of one layer (norms, residuals, rotary, activation, KV copies)
    ew_bytes = (tokens * (p[PF_E_HIDDEN] * d + p[PF_E_QKV] * (hq + 2.0 * hkv) * dh
                          + p[PF_E_FFN] * ffn_act) + copy_bytes)
    ew_s = ew_bytes / (p[PF_PEAK_BW] * p[PF_E_MEMORY])
    allreduce_s = 0.0
    if p[PF_TP] > 1.0:
        share = 2.0 * (p[PF_TP] - 1.0) / p[PF_TP]
        allreduce_s = 2.0 * (p[PF_AR_LATENCY_US] * 1e-6
                             + share * tokens * d * p[PF_KVBYTES] / p[PF_AR_BW])

    per_layer_s = attn_s + ew_s + allreduce_s + p[PF_FIX_LAYER_US] * 1e-6
    seconds = layers * per_layer_s + gemm_s + p[PF_FIX_STEP_US] * 1e-6
    return seconds, flops, nbytes


@njit(cache=True, _nrt=False, error_model="numpy")
def physical_floor_seconds(params, flops, nbytes) -> float:
    """The least time the work can take: its FLOPs at peak FLOP/s or its bytes at peak bandwidth."""
    return max(flops / params[PF_PEAK_FLOPS], nbytes / params[PF_PEAK_BW])


FLOOR_OFFSET = 40
"""Where every backend's ``params`` row carries the step's physical-floor description (this
module's layout, peaks and model only; zeros when the backend has no model and GPU): above
the largest backend layout, so no backend reads it."""


@njit(cache=True, _nrt=False, error_model="numpy")
def step_floor_us(params, n, progress, new_tokens, input_len, output_len) -> float:
    """The physical floor (µs) of a step under any backend's ``params`` row (its work at the
    GPU's peaks, every weight matrix the model has), or -1.0 when the row describes none."""
    if params.shape[0] < FLOOR_OFFSET + PF_SIZE or params[FLOOR_OFFSET + PF_PEAK_FLOPS] <= 0.0:
        return -1.0
    work = params[FLOOR_OFFSET:]
    _, flops, nbytes = _work(work, n, progress, new_tokens, input_len, output_len, False)
    return physical_floor_seconds(work, flops, nbytes) * 1e6


@njit(cache=True, _nrt=False, error_model="numpy")
def profiled_step(params, n, progress, new_tokens, input_len, output_len) -> np.int64:
    """The backend's step time in µs (>= 1), never below the step's physical floor."""
    seconds, flops, nbytes = profiled_work(params, n, progress, new_tokens, input_len, output_len)
    floor = physical_floor_seconds(params, flops, nbytes)
    micros = max(seconds, floor) * 1e6
    if math.isnan(micros) or micros >= 9.2e18:
        return np.int64(9223372036854775807)
    return max(np.int64(1), np.int64(micros))
