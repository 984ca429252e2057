"""Timings on the machine at hand with PyTorch (the optional ``[profile]`` extra): GEMMs, a copy
(peak bandwidth), and whole forward steps of a Llama-style model, each the median of repeated
runs (CUDA: each captured in a CUDA graph and replayed, timed with events, as vLLM runs decode).

The forward is the one the bundled H100 profile was measured with (unfused RMSNorm, rotary,
SwiGLU; SDPA prefill; a batched matmul-softmax-matmul decode over each request's KV; logits for
the sampled tokens only), so a profile fitted to its steps predicts the same stack.
"""

from __future__ import annotations

import gc
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Dims", "Machine", "Timer", "forward_step", "machine", "time_copy", "time_gemm",
           "time_step", "weights_for"]


@dataclass(frozen=True)
class Dims:
    """A dense Llama-style model's shapes (``config.json`` names in ``to_config``)."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int

    def to_config(self, dtype: str) -> dict[str, Any]:
        """The model's ``config.json`` (what ``--model-config-folder`` reads)."""
        return {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                "hidden_size": self.hidden, "num_hidden_layers": self.layers,
                "num_attention_heads": self.heads, "num_key_value_heads": self.kv_heads,
                "head_dim": self.head_dim, "intermediate_size": self.ffn,
                "vocab_size": self.vocab, "hidden_act": "silu", "torch_dtype": dtype,
                "max_position_embeddings": 131072, "tie_word_embeddings": False}


@dataclass(frozen=True)
class Machine:
    """Where the timings run: the torch device, its dtype and a name for the profile."""

    torch: Any
    device: str
    dtype: Any
    dtype_name: str
    name: str


def machine(device: str = "auto") -> Machine:
    """CUDA (bf16) when there is a GPU and ``device`` allows it, else the CPU (float32)."""
    import torch  # optional dependency: the [profile] extra

    use_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    if use_cuda:
        torch.backends.cuda.matmul.allow_tf32 = False
        return Machine(torch, "cuda", torch.bfloat16, "bfloat16", torch.cuda.get_device_name(0))
    # one thread: OpenMP workers spin-waiting for a core another process holds turn a 10 us
    # matmul into milliseconds, and a single-threaded CPU profile is the one that repeats
    torch.set_num_threads(1)
    return Machine(torch, "cpu", torch.float32, "float32", "cpu")


class Timer:
    """Wall time of a callable after warm-up calls: on a GPU the median of ``reps`` CUDA graph
    replays timed with events; on the CPU the least of ``rounds`` medians of ``reps`` calls (a
    shared or virtual CPU has stretches twice as slow, and a round inside one says nothing
    about the code)."""

    def __init__(self, m: Machine, reps: int, rounds: int = 5, min_seconds: float = 0.5) -> None:
        self.m = m
        self.reps = reps
        self.rounds = rounds
        self.min_seconds = min_seconds  # CPU: rounds go on this long (slow stretches last ~1 s)

    def __call__(self, fn: Callable[[], Any]) -> float:
        torch = self.m.torch
        if self.m.device == "cuda":
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):
                    fn()
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                fn()
            for _ in range(3):
                graph.replay()
            times = []
            for _ in range(self.reps):
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                graph.replay()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) * 1e-3)
            return statistics.median(times)
        gc_was_on = gc.isenabled()
        gc.disable()  # as timeit does: a collection inside a timed call is not the call's cost
        try:
            return self._cpu(fn)
        finally:
            if gc_was_on:
                gc.enable()

    def _cpu(self, fn: Callable[[], Any]) -> float:
        for _ in range(2):
            fn()
        medians: list[float] = []
        start = time.perf_counter()
        while len(medians) < self.rounds or time.perf_counter() - start < self.min_seconds:
            times = []
            for _ in range(self.reps):
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
            medians.append(statistics.median(times))
        return min(medians)


def time_gemm(m: Machine, timer: Timer, rows: int, n: int, k: int) -> float:
    """Seconds of one ``rows x k`` by ``k x n`` GEMM."""
    torch = m.torch
    x = torch.randn(rows, k, device=m.device, dtype=m.dtype)
    w = torch.randn(n, k, device=m.device, dtype=m.dtype)
    return timer(lambda: x @ w.T)


def time_copy(m: Machine, timer: Timer, elements: int) -> float:
    """Seconds to copy ``elements`` elements (read and write: 2 x their bytes move)."""
    torch = m.torch
    src = torch.randn(elements, device=m.device, dtype=m.dtype)
    dst = torch.empty_like(src)
    return timer(lambda: dst.copy_(src))


class _Weights:
    """Random weights of a model (one KV cache per layer is made per step)."""

    def __init__(self, m: Machine, dims: Dims) -> None:
        torch = m.torch
        gen = torch.Generator(device=m.device).manual_seed(0)

        def w(*shape: int) -> Any:
            return (torch.randn(*shape, generator=gen, device=m.device) * 0.02).to(m.dtype)

        qkv = (dims.heads + 2 * dims.kv_heads) * dims.head_dim
        self.layers = [dict(qkv=w(qkv, dims.hidden), o=w(dims.hidden, dims.heads * dims.head_dim),
                            gate_up=w(2 * dims.ffn, dims.hidden), down=w(dims.hidden, dims.ffn),
                            norm1=torch.ones(dims.hidden, device=m.device, dtype=m.dtype),
                            norm2=torch.ones(dims.hidden, device=m.device, dtype=m.dtype))
                       for _ in range(dims.layers)]
        self.norm = torch.ones(dims.hidden, device=m.device, dtype=m.dtype)
        self.head = w(dims.vocab, dims.hidden)


def forward_step(m: Machine, dims: Dims, weights: _Weights, prefill: int, prefill_ctx: int,
                 decodes: int, decode_ctx: int) -> Callable[[], Any]:
    """A callable running one engine step: a prompt chunk of ``prefill`` tokens over
    ``prefill_ctx`` cached ones and ``decodes`` decode tokens over ``decode_ctx`` each."""
    torch = m.torch
    func = torch.nn.functional
    h, hkv, dh, d = dims.heads, dims.kv_heads, dims.head_dim, dims.hidden
    group, half = h // hkv, dh // 2
    dev, dt = m.device, m.dtype
    past_k = [torch.randn(prefill_ctx, hkv, dh, device=dev, dtype=dt) for _ in weights.layers]
    past_v = [torch.randn(prefill_ctx, hkv, dh, device=dev, dtype=dt) for _ in weights.layers]
    cache_k = [torch.randn(decodes, hkv, decode_ctx, dh, device=dev, dtype=dt) for _ in weights.layers]
    cache_v = [torch.randn(decodes, hkv, decode_ctx, dh, device=dev, dtype=dt) for _ in weights.layers]
    mask = None
    if prefill_ctx:
        rows = torch.arange(prefill, device=dev)[:, None]
        cols = torch.arange(prefill_ctx + prefill, device=dev)[None, :]
        mask = cols <= rows + prefill_ctx
    x0 = torch.randn(prefill + decodes, d, device=dev, dtype=dt) * 0.1
    pos = torch.cat([torch.arange(prefill_ctx, prefill_ctx + prefill, device=dev),
                     torch.full((decodes,), max(decode_ctx - 1, 0), device=dev, dtype=torch.long)])

    def run() -> Any:
        inv = 1.0 / (500000.0 ** (torch.arange(0, half, device=dev, dtype=torch.float32) / half))
        angle = pos.float()[:, None] * inv[None, :]
        angle = torch.cat([angle, angle], -1)
        cos, sin = angle.cos()[:, None, :].to(dt), angle.sin()[:, None, :].to(dt)
        x = x0
        for li, p in enumerate(weights.layers):
            y = func.rms_norm(x, (d,), p["norm1"], 1e-5)
            qkv = y @ p["qkv"].T
            qk = qkv[:, :(h + hkv) * dh].view(-1, h + hkv, dh)
            qk = qk * cos + torch.cat((-qk[..., half:], qk[..., :half]), -1) * sin
            q, k = qk[:, :h], qk[:, h:]
            v = qkv[:, (h + hkv) * dh:].view(-1, hkv, dh)
            outs = []
            if prefill:
                kp, vp = k[:prefill], v[:prefill]
                if prefill_ctx:
                    kp = torch.cat([past_k[li], kp], 0)
                    vp = torch.cat([past_v[li], vp], 0)
                kp = kp.repeat_interleave(group, dim=1).transpose(0, 1)[None]
                vp = vp.repeat_interleave(group, dim=1).transpose(0, 1)[None]
                qp = q[:prefill].transpose(0, 1)[None]
                if mask is not None:
                    o = func.scaled_dot_product_attention(qp, kp, vp, attn_mask=mask)
                else:
                    o = func.scaled_dot_product_attention(qp, kp, vp, is_causal=True)
                outs.append(o[0].transpose(0, 1).reshape(prefill, h * dh))
            if decodes:
                qd = q[prefill:].view(decodes, hkv, group, dh)
                cache_k[li][:, :, decode_ctx - 1] = k[prefill:]
                cache_v[li][:, :, decode_ctx - 1] = v[prefill:]
                scores = torch.matmul(qd, cache_k[li].transpose(-1, -2)) * (1.0 / math.sqrt(dh))
                probs = torch.softmax(scores.float(), dim=-1).to(dt)
                outs.append(torch.matmul(probs, cache_v[li]).reshape(decodes, h * dh))
            attn = outs[0] if len(outs) == 1 else torch.cat(outs, 0)
            x = x + attn @ p["o"].T
            y = func.rms_norm(x, (d,), p["norm2"], 1e-5)
            gate, up = (y @ p["gate_up"].T).chunk(2, dim=-1)
            x = x + (func.silu(gate) * up) @ p["down"].T
        sampled = ([x[prefill - 1:prefill]] if prefill else []) + ([x[prefill:]] if decodes else [])
        last = torch.cat(sampled, 0) if len(sampled) > 1 else sampled[0]
        return func.rms_norm(last, (d,), weights.norm, 1e-5) @ weights.head.T

    return run


def time_step(m: Machine, timer: Timer, dims: Dims, weights: _Weights, case: Sequence[int]) -> float:
    """Seconds of one step ``(prefill, prefill_ctx, decodes, decode_ctx)`` of the model."""
    prefill, prefill_ctx, decodes, decode_ctx = case
    with m.torch.inference_mode():
        return timer(forward_step(m, dims, weights, prefill, prefill_ctx, decodes, decode_ctx))


def weights_for(m: Machine, dims: Dims) -> _Weights:
    """The random weights of ``dims`` on the machine."""
    return _Weights(m, dims)
