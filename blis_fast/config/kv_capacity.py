"""KV-cache capacity auto-calculation (spec ENG-6.8, DELTA-23).

Reproduces the reference's arithmetic exactly: per-token KV bytes in float64 (layers × 2 ×
head dim × KV heads × bytes per element, divided by TP), per-block bytes truncated after
multiplying by the block size, model weight parameters counted in 64-bit integers, and the
available budget in GiB as float64 before the final integer division.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from blis_fast.config.hardware import HardwareCalib
from blis_fast.config.model_config import HFConfig, ModelConfig, expert_count, shared_expert_ffn
from blis_fast.errors import BlisConfigError

__all__ = [
    "KVCapacityParams",
    "calculate_kv_blocks",
    "capacity_head_dim",
    "extract_kv_capacity_params",
    "kv_bytes_per_token",
    "model_weight_bytes",
]

_ACTIVATION_DENSE_GIB = 5.5
_ACTIVATION_MOE_GIB = 8.0
_NON_TORCH_TP1_GIB = 0.15
_NON_TORCH_TP_MULTI_GIB = 0.6
_GIB = 1 << 30
SWIGLU_FAMILY = frozenset({"silu", "swiglu", "geglu", ""})
"""Activations of gated MLPs (gate, up and down matrices; "" assumed gated)."""
_MASK64 = (1 << 64) - 1


def _i64(v: int) -> int:
    """Wrap an integer to int64 (Go's two's-complement overflow)."""
    v &= _MASK64
    return v - (1 << 64) if v >> 63 else v


def _trunc_i64(x: float) -> int:
    """Go ``int64(float64)`` for in-range values (truncation toward zero)."""
    return int(x)


@dataclass(frozen=True)
class KVCapacityParams:
    """Fields of config.json used only by the capacity estimate."""

    is_moe: bool = False
    num_local_experts: int = 0
    tie_word_embeddings: bool = False
    hidden_act: str = ""
    moe_expert_ffn_dim: int = 0
    shared_expert_ffn_dim: int = 0


def extract_kv_capacity_params(hf: HFConfig) -> KVCapacityParams:
    """ExtractKVCapacityParams: MoE layout, tying and activation; error for MoE without a count."""
    hidden_act = hf.get_str("hidden_act")
    tied = hf.get_bool("tie_word_embeddings")
    tie = bool(tied) if tied is not None else False
    n = expert_count(hf)
    if n > 1:
        moe_ffn = hf.get_int("moe_intermediate_size")
        shared = shared_expert_ffn(hf, moe_ffn, hf.get_int("intermediate_size"))
        return KVCapacityParams(True, n, tie, hidden_act, moe_ffn, shared)
    for key in ("n_shared_experts", "num_experts_per_tok"):
        v = hf.get_int(key)
        if v > 0:
            raise BlisConfigError(
                f"config.json looks like a mixture-of-experts model ({key}={v}) but gives no expert "
                "count, so its weight size cannot be estimated; set --total-kv-blocks explicitly"
            )
    return KVCapacityParams(False, 0, tie, hidden_act, 0, 0)


def capacity_head_dim(mc: ModelConfig, explicit_head_dim: bool) -> int:
    """The head dimension KV and weight capacity use: config.json's ``head_dim`` when
    ``explicit_head_dim`` and it is set (> 0; the August reference's rule, used by P/D and
    autoscaled runs), else hidden/heads (the April reference's rule, plain runs)."""
    if explicit_head_dim and mc.head_dim > 0:
        return mc.head_dim
    return mc.hidden_dim // mc.num_heads if mc.num_heads > 0 else 0


def kv_bytes_per_token(mc: ModelConfig, tp: int, explicit_head_dim: bool = False) -> float:
    """KVBytesPerToken: per-GPU KV bytes of one token (float64), validating the inputs.

    ``explicit_head_dim`` selects the August reference's rule (an explicit ``head_dim`` is used
    as is and hidden_size need not be a multiple of the heads); False keeps April's
    hidden/heads."""
    if tp <= 0:
        raise BlisConfigError(f"KV bytes per token: TP must be > 0, got {tp}")
    if mc.num_heads <= 0:
        raise BlisConfigError(
            f"KV bytes per token: num_attention_heads must be > 0, got {mc.num_heads}"
        )
    if mc.num_layers <= 0:
        raise BlisConfigError(
            f"KV bytes per token: num_hidden_layers must be > 0, got {mc.num_layers}"
        )
    if mc.hidden_dim <= 0:
        raise BlisConfigError(f"KV bytes per token: hidden_size must be > 0, got {mc.hidden_dim}")
    bpp = mc.bytes_per_param
    if bpp <= 0 or math.isnan(bpp) or math.isinf(bpp):
        raise BlisConfigError(
            f"KV bytes per token: bytes per parameter must be positive and finite, got {bpp}"
        )
    if explicit_head_dim and mc.head_dim < 0:
        raise BlisConfigError(f"KV bytes per token: head_dim must be >= 0, got {mc.head_dim}")
    explicit = explicit_head_dim and mc.head_dim > 0
    if not explicit and mc.hidden_dim % mc.num_heads != 0:
        raise BlisConfigError(
            f"KV bytes per token: hidden_size {mc.hidden_dim} is not a multiple of "
            f"num_attention_heads {mc.num_heads}"
        )
    kv_heads = mc.num_kv_heads
    if kv_heads < 0:
        raise BlisConfigError(f"KV bytes per token: KV heads must be >= 0, got {kv_heads}")
    if kv_heads == 0:
        kv_heads = mc.num_heads
    if kv_heads >= tp and kv_heads % tp != 0:
        raise BlisConfigError(
            f"KV bytes per token: {kv_heads} KV heads cannot be split evenly over TP={tp}"
        )
    head_dim = capacity_head_dim(mc, explicit_head_dim)
    per_token = float(mc.num_layers) * 2.0 * float(head_dim) * float(kv_heads) * bpp
    per_gpu = per_token / float(tp)
    if per_gpu <= 0:
        raise BlisConfigError(f"KV bytes per token: computed {per_gpu:.4f} bytes (expected > 0)")
    return per_gpu


def model_weight_bytes(mc: ModelConfig, params: KVCapacityParams,
                       explicit_head_dim: bool = False) -> int:
    """Total weight bytes with a 3-matrix (SwiGLU) MLP, as the capacity planner counts them
    (the K and V projections at the head dimension ``capacity_head_dim`` picks)."""
    d = mc.hidden_dim
    vocab = mc.vocab_size
    layers = mc.num_layers
    inter = mc.intermediate_dim
    kv_heads = mc.num_kv_heads if mc.num_kv_heads != 0 else mc.num_heads
    head_dim = capacity_head_dim(mc, explicit_head_dim)  # positive (checked by kv_bytes_per_token)
    kv_dim = _i64(kv_heads * head_dim)
    embeddings = _i64(vocab * d)
    attention = _i64(d * (d + 2 * kv_dim) + d * d)
    if params.is_moe and params.num_local_experts > 1:
        expert_ffn = params.moe_expert_ffn_dim if params.moe_expert_ffn_dim > 0 else inter
        mlp = _i64(3 * d * expert_ffn * params.num_local_experts)
        if params.shared_expert_ffn_dim > 0:
            mlp = _i64(mlp + 3 * d * params.shared_expert_ffn_dim)
        mlp = _i64(mlp + params.num_local_experts * d)
    else:
        mlp = _i64(3 * d * inter)
    norms = 2 * d
    per_layer = _i64(attention + mlp + norms)
    lm_head = 0 if params.tie_word_embeddings else embeddings
    total = _i64(embeddings + layers * per_layer + lm_head + d)
    return _trunc_i64(float(total) * mc.effective_weight_bytes_per_param())


def calculate_kv_blocks(
    mc: ModelConfig,
    hc: HardwareCalib,
    tp: int,
    block_size: int,
    gpu_memory_utilization: float,
    params: KVCapacityParams,
    explicit_head_dim: bool = False,
    reserved_bytes: int = 0,
) -> int:
    """CalculateKVBlocks: how many KV blocks fit beside weights, activations and runtime overhead.

    ``explicit_head_dim``: size KV bytes and the K/V projection weights from config.json's
    ``head_dim`` (the August reference: P/D and autoscaled runs); False keeps the April rule.
    ``reserved_bytes``: the static LoRA adapter HBM reservation (LORA-6.2), a fourth overhead
    term per instance, independent of TP; with one, a budget it exhausts is reported in the
    August reference's words (LORA-6.4)."""
    u = gpu_memory_utilization
    if u <= 0 or u > 1.0 or math.isnan(u) or math.isinf(u):
        raise BlisConfigError(f"KV capacity: GPU memory utilization must be in (0, 1.0], got {u}")
    if block_size <= 0:
        raise BlisConfigError(f"KV capacity: block size must be > 0, got {block_size}")
    if mc.intermediate_dim <= 0:
        raise BlisConfigError(
            f"KV capacity: intermediate size must be > 0, got {mc.intermediate_dim}"
        )
    if mc.vocab_size <= 0:
        raise BlisConfigError(f"KV capacity: vocab_size must be > 0, got {mc.vocab_size}")
    mem = hc.memory_gib
    if mem <= 0 or math.isnan(mem) or math.isinf(mem):
        raise BlisConfigError(f"KV capacity: GPU MemoryGiB must be positive and finite, got {mem}")
    w = mc.weight_bytes_per_param
    if w != 0 and (w < 0 or math.isnan(w) or math.isinf(w)):
        raise BlisConfigError(
            f"KV capacity: weight bytes per parameter must be positive when set, got {w}"
        )
    if params.hidden_act not in SWIGLU_FAMILY:
        raise BlisConfigError(
            f"KV capacity: activation {params.hidden_act!r} is not supported "
            "(only the SwiGLU family: silu, swiglu, geglu)"
        )
    per_token = kv_bytes_per_token(mc, tp, explicit_head_dim)
    per_block = _trunc_i64(per_token * float(block_size))
    if per_block <= 0:
        raise BlisConfigError(
            f"KV capacity: a block would hold {per_block} bytes (per token {per_token:.6f})"
        )
    available_gib = mem * u * float(tp)
    weights_gib = float(model_weight_bytes(mc, params, explicit_head_dim)) / float(_GIB)
    activation_gib = _ACTIVATION_MOE_GIB if params.is_moe else _ACTIVATION_DENSE_GIB
    non_torch_gib = (_NON_TORCH_TP1_GIB if tp == 1 else _NON_TORCH_TP_MULTI_GIB) * float(tp)
    if reserved_bytes > 0:
        return _blocks_with_reservation(hc, tp, u, per_block, available_gib, weights_gib,
                                        activation_gib, non_torch_gib,
                                        float(reserved_bytes) / float(_GIB))
    overhead_gib = weights_gib + activation_gib + non_torch_gib
    if overhead_gib >= available_gib:
        raise BlisConfigError(
            f"KV capacity: weights, activations and runtime overhead need {overhead_gib:.2f} GiB "
            f"({weights_gib:.2f} + {activation_gib:.2f} + {non_torch_gib:.2f}) but only "
            f"{available_gib:.2f} GiB are available ({mem:.1f} GiB x {u * 100:.0f}% x {tp} GPUs)"
        )
    allocatable_gib = available_gib - overhead_gib
    allocatable = _trunc_i64(allocatable_gib * float(_GIB))
    blocks = allocatable // per_block
    if blocks <= 0:
        raise BlisConfigError(
            f"KV capacity: no block fits ({allocatable_gib:.2f} GiB allocatable, {per_block} bytes per block)"
        )
    return blocks


def _blocks_with_reservation(hc: HardwareCalib, tp: int, u: float, per_block: int,
                             available_gib: float, weights_gib: float, activation_gib: float,
                             non_torch_gib: float, reserved_gib: float) -> int:
    """The block count with a LoRA reservation (LORA-6.2), its failures as the August
    reference words them (LORA-6.4: the minimum GPU count includes the reservation)."""
    overhead_gib = weights_gib + activation_gib + non_torch_gib + reserved_gib
    if overhead_gib >= available_gib:
        per_gpu_available = hc.memory_gib * u
        per_gpu_capacity = per_gpu_available - _NON_TORCH_TP_MULTI_GIB
        if per_gpu_capacity <= 0:
            raise BlisConfigError(
                f"CalculateKVBlocks: insufficient per-GPU capacity ({per_gpu_available:.2f} GiB "
                f"available - {_NON_TORCH_TP_MULTI_GIB:.2f} GiB non-torch overhead = "
                f"{per_gpu_capacity:.2f} GiB). Cannot fit model even with increased TP")
        min_tp = math.ceil((weights_gib + activation_gib + reserved_gib) / per_gpu_capacity)
        raise BlisConfigError(
            f"CalculateKVBlocks: model overhead ({overhead_gib:.2f} GiB = {weights_gib:.2f} weights "
            f"+ {activation_gib:.2f} activation + {non_torch_gib:.2f} non-torch + "
            f"{reserved_gib:.2f} lora-adapter-reservation) exceeds available GPU memory "
            f"({available_gib:.2f} GiB = {hc.memory_gib:.1f} GiB × {u * 100:.0f}% util × {tp} "
            f"GPUs). Minimum GPUs required per instance: {min_tp}")
    allocatable_gib = available_gib - overhead_gib
    blocks = _trunc_i64(allocatable_gib * float(_GIB)) // per_block
    if blocks <= 0:
        raise BlisConfigError(f"CalculateKVBlocks: computed 0 blocks (allocatable="
                              f"{allocatable_gib:.2f} GiB, per_block={per_block} bytes)")
    return blocks
