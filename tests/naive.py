"""Slow, obviously-right twins of what blis_fast computes fast (issue 11 item 5).

Stumpy keeps its naive references in ``tests/naive.py``; so does this project. Each twin is
written from the specification (the rule ids cited) or from the Go reference, in plain Python
(lists, dicts, loops), never from the code it checks: a twin copied from a kernel proves
nothing. Tests compare the package with these twins on hypothesis-drawn inputs.

The module is long on purpose: it is the one place every twin lives. Sections:

* Go ``strconv`` number parsing (``ParseFloat``/``ParseInt``), from the Go grammar;
* Go ``math`` and rounding helpers (``math.Round``, ``math.Pow``'s integer path);
* the reference's SHA-256 block hash (``HashBlock``);
* metric statistics (mean, percentile, distribution) and priority-inversion pairs;
* latency formulas (roofline step, KV-capacity auto-calculation);
* workload generation (the WL-5 loop and the WL-14 draw order);
* the KV cache: the LRU free list and a dict-based prefix cache (ENG-5, DELTA-13/14);
* one vLLM instance: events, queue order, batch formation, chunked prefill, preemption,
  completion, timeouts (ENG-1..4, ENG-7, DELTA-1..7).

The only package code twins use is the Go ``math/rand`` port (``blis_fast.kernels.go.gorand``,
checked against Go's own outputs in ``test_gorand.py``) and the 64-bit content digest that
names a block's tokens, so that generated workloads can be compared digest by digest.
"""

from __future__ import annotations

import hashlib
import heapq
import math
import re
import sys
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

INT64_MAX = (1 << 63) - 1
INF = math.inf
NAN = math.nan
ERR_SYNTAX = "invalid syntax"
ERR_RANGE = "value out of range"
S, R = ERR_SYNTAX, ERR_RANGE
VOCAB = 128000  # token ids are drawn in [0, VOCAB) (sim/simulator.go: MaxTokenID)


# ================================================================== Go strconv (ParseFloat, ParseInt)
# Go spec, "Floating-point literals" (ParseFloat also takes a sign, plain integers and the
# special names); underscores only between digits or after the 0x prefix. The twin never calls
# ``float(str)`` or ``float.fromhex``: exact rational arithmetic, then one correct rounding.
_DD = r"[0-9](?:_?[0-9])*"
_HD = r"[0-9a-fA-F](?:_?[0-9a-fA-F])*"
_TWIN_DEC = re.compile(
    rf"(?P<sign>[+-]?)(?:(?P<i>{_DD})(?:\.(?P<f>{_DD})?)?|\.(?P<f2>{_DD}))"
    rf"(?:[eE](?P<es>[+-]?)(?P<e>{_DD}))?", re.ASCII)
_TWIN_HEX = re.compile(
    rf"(?P<sign>[+-]?)0[xX](?:_?(?P<i>{_HD})(?:\.(?P<f>{_HD})?)?|\.(?P<f2>{_HD}))"
    rf"[pP](?P<es>[+-]?)(?P<e>{_DD})", re.ASCII)
_TWIN_INF = re.compile(r"[+-]?(?:inf|infinity)", re.ASCII | re.IGNORECASE)
_TWIN_NAN = re.compile(r"nan", re.ASCII | re.IGNORECASE)
_HUGE_EXPONENT = 20_000  # far past float64 range; Go saturates such exponents (atof.go)


def big_int(digits: str, base: int) -> int:
    """``int(digits, base)`` without CPython's 4300-digit guard (Go's tables have 10000)."""
    old = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        return int(digits, base)
    finally:
        sys.set_int_max_str_digits(old)


def parse_float(s: str) -> float | str:
    """Go's answer for ``ParseFloat(s, 64)``: a float, or the error text."""
    if _TWIN_NAN.fullmatch(s):
        return NAN
    if _TWIN_INF.fullmatch(s):
        return -INF if s.startswith("-") else INF
    m = _TWIN_DEC.fullmatch(s)
    radix, per_digit = 10, 1
    if m is None:
        m = _TWIN_HEX.fullmatch(s)
        radix, per_digit = 2, 4
        if m is None:
            return S
    ints = (m["i"] or "").replace("_", "")
    frac = (m["f"] or m["f2"] or "").replace("_", "")
    mant = big_int(ints + frac or "0", 16 if radix == 2 else 10)
    neg = m["sign"] == "-"
    exp = int((m["e"] or "0").replace("_", "")) * (-1 if m["es"] == "-" else 1)
    if mant == 0:
        return -0.0 if neg else 0.0
    exp -= per_digit * len(frac)
    magnitude = exp + mant.bit_length() * (1 if radix == 2 else 0.30103)  # ~log(value)
    if magnitude > _HUGE_EXPONENT:
        return R
    if magnitude < -_HUGE_EXPONENT:
        return -0.0 if neg else 0.0
    q = Fraction(mant) * Fraction(radix) ** exp
    try:
        value = float(q)  # int/int true division: correctly rounded, OverflowError past max
    except OverflowError:
        return R
    if math.isinf(value):
        return R
    return -value if neg else value


# Go spec, "Integer literals" (ParseInt with base 0 also takes a sign).
_TWIN_INT0 = re.compile(
    r"[+-]?(?:0|[1-9](?:_?[0-9])*|0[bB]_?[01](?:_?[01])*|0[oO]?_?[0-7](?:_?[0-7])*"
    r"|0[xX]_?[0-9a-fA-F](?:_?[0-9a-fA-F])*)", re.ASCII)
_TWIN_INT10 = re.compile(r"[+-]?[0-9]+", re.ASCII)
_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"


def _overflows_before_bad_char(body: str, base: int, underscores: bool) -> bool:
    """ParseUint's rule: an overflow met before the first bad character is a range error."""
    acc = 0
    for c in body:
        if c == "_" and underscores:
            continue
        if c.lower() not in _DIGITS[:base] or not c.isascii():
            return False
        acc = acc * base + _DIGITS.index(c.lower())
        if acc >= 1 << 64:
            return True
    return False


def parse_int(s: str, base: int) -> int | str:
    """Go's answer for ``ParseInt(s, base, 64)`` with base 0 or 10: an int or the error text."""
    body = s[1:] if s[:1] in ("+", "-") else s
    if base == 0:
        low = body[:2].lower()
        if len(body) >= 3 and low in ("0x", "0o", "0b"):
            real, digits = {"0x": 16, "0o": 8, "0b": 2}[low], body[2:]
        elif body.startswith("0"):
            real, digits = 8, body[1:]
        else:
            real, digits = 10, body
        if _overflows_before_bad_char(digits, real, underscores=True):
            return R
        if not _TWIN_INT0.fullmatch(s):
            return S
        text = body.replace("_", "")
        value = int(text[2:] if real != 10 and text[1:2].isalpha() else text, real)
    else:
        if _overflows_before_bad_char(body, 10, underscores=False):
            return R
        if not _TWIN_INT10.fullmatch(s):
            return S
        value = int(body)
    value = -value if s.startswith("-") else value
    return value if -(1 << 63) <= value < (1 << 63) else R


# ================================================================== Go math and rounding


def go_round(x: float) -> float:
    """Go's ``math.Round``: half away from zero."""
    t = math.trunc(x)
    if abs(x - t) >= 0.5:
        t += math.copysign(1.0, x)
    return t


def go_pow(x: float, y: float) -> float:
    """Go's ``math.Pow`` on its integer-exponent path (``|y|`` an integer below 2^63)."""
    if y == 0 or x == 1:
        return 1.0
    if y == 1:
        return x
    yi = float(int(abs(y)))
    a1, ae = 1.0, 0
    x1, xe = math.frexp(x)
    i = int(yi)
    while i != 0:
        if xe < -4096 or xe > 4096:
            ae += xe
            break
        if i & 1:
            a1 *= x1
            ae += xe
        x1 *= x1
        xe <<= 1
        if x1 < 0.5:
            x1 += x1
            xe -= 1
        i >>= 1
    if y < 0:
        a1, ae = 1 / a1, -ae
    try:  # Go's Ldexp: ±Inf past the largest exponent, 0 below the smallest
        return math.ldexp(a1, max(min(ae, 5000), -5000))
    except OverflowError:
        return math.inf


def clamp64(v: float) -> int:
    """``sim/latency/latency.go: clampToInt64``: NaN or >= 2^63 -> 2^63-1, else truncate."""
    if math.isnan(v) or v >= float(INT64_MAX):
        return INT64_MAX
    return int(v)


# ================================================================== block hash (ENG-5.3)


def go_hash_block(prev: str, tokens: Sequence[int]) -> str:
    """The reference's HashBlock: hex SHA-256 of the previous hex digest then "t|" per token."""
    h = hashlib.sha256()
    h.update(prev.encode())
    h.update("".join(f"{int(t)}|" for t in tokens).encode())
    return h.hexdigest()


# ================================================================== statistics (ENG-7.5, CLU-7.7)


def mean_ms(values: Sequence[float]) -> float:
    """``CalculateMean``: the sorted values summed left to right, / n, / 1000 (0 when empty)."""
    data = sorted(values)
    if not data:
        return 0.0
    s = 0.0
    for v in data:
        s += float(v)
    return (s / float(len(data))) / 1000


def percentile_ms(values: Sequence[float], p: float) -> float:
    """``CalculatePercentile``: linear interpolation between the ranks around p/100*(n-1), in
    ms; the difference is taken in the values' own type (int for ITLs)."""
    data = sorted(values)
    n = len(data)
    if n == 0:
        return 0.0
    rank = p / 100.0 * float(n - 1)
    lo, hi = int(math.floor(rank)), int(math.ceil(rank))
    if lo == hi:
        return float(data[lo]) / 1000
    if hi >= n:
        return float(data[n - 1]) / 1000
    return float(data[lo]) / 1000 + float(data[hi] - data[lo]) * (rank - float(lo)) / 1000


def distribution(values: Sequence[float]) -> tuple:
    """``NewDistribution`` (CLU-7.7): (mean, p50, p95, p99, min, max, count) in ticks."""
    if not values:
        return (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0)
    s = sorted(values)
    total = 0.0
    for v in s:
        total += v

    def pct(p: float) -> float:
        if len(s) == 1:
            return s[0]
        rank = p / 100.0 * float(len(s) - 1)
        lo, hi = int(math.floor(rank)), int(math.ceil(rank))
        if lo == hi:
            return s[lo]
        return s[lo] + (rank - float(lo)) * (s[hi] - s[lo])

    return (total / float(len(s)), pct(50), pct(95), pct(99), s[0], s[-1], len(s))


def inversion_pairs(values: Sequence[float]) -> int:
    """Pairs ``i < j`` with ``values[i] > 2 * values[j]`` (the priority-inversion count)."""
    return sum(1 for i in range(len(values)) for j in range(i + 1, len(values))
               if values[i] > values[j] * 2.0)


# ================================================================== latency formulas


def roofline_step_time(d: float, L: float, H: float, hkv: float, dff: float, bpp: float,
                       tp: float, peak_flops: float, mfu_prefill: float, mfu_decode: float,
                       peak_bw: float, reqs: Sequence[tuple[int, int, int, int]]) -> int:
    """The roofline step of a dense model (ENG-6.4 + DELTA-16/17) for ``reqs`` =
    (progress, new tokens, input length, output length) per scheduled request."""
    dh = d / H
    dkv = hkv * dh

    def flops(s, t):
        t = float(t)
        gemm = (2 * t * (d * d + 2 * d * dkv) + 2 * t * d * d) * L
        ctx = s + (t - 1) / 2.0 if t > 1 else float(s)
        gemm += 4 * H * t * ctx * dh * L
        sram = (5 * H * t * ctx + 2 * t * d) * L
        gemm += 2 * t * (2 * d * dff) * L
        return gemm + sram

    def weights():
        return ((d * (d + 2 * dkv) + d * d) * L + (2 * d * dff) * L) * bpp

    def dyn(s, t):
        w = weights()
        kv = 2 * L * hkv * dh * bpp
        return (w + kv * t + kv * s + L * d * bpp * t) - w

    compute = 0.0
    dynamic = 0.0
    for s, t, inp, _out in reqs:
        if s < inp:
            compute += flops(s, t) / tp / (peak_flops * mfu_prefill)
            dynamic += dyn(s, t) / tp
    for s, _t, inp, out in reqs:
        if s >= inp and out > 0:
            compute += flops(s, 1) / tp / (peak_flops * mfu_decode)
            dynamic += dyn(s, 1) / tp
    memory = (weights() / tp + dynamic) / peak_bw
    return max(1, int(max(compute, memory) * 1e6))


def kv_blocks(L, d, H, hkv, inter, vocab, bpp, mem, tp, block, util, moe=None,
              tied=False) -> int:
    """KV blocks from GPU memory (ENG-6.8), ``moe`` = (experts, expert FFN dim) or None."""
    dh = d // H
    per_block = int(L * 2.0 * dh * hkv * bpp / tp * block)
    available = mem * util * tp
    if moe is None:
        mlp = 3 * d * inter
    else:
        experts, dexp = moe
        mlp = 3 * d * dexp * experts + experts * d
    params = (
        vocab * d
        + L * (d * (d + 2 * hkv * dh) + d * d + mlp + 2 * d)
        + (0 if tied else vocab * d)
        + d
    )
    weights = int(params * bpp)
    overhead = weights / 2**30 + (8.0 if moe else 5.5) + (0.15 if tp == 1 else 0.6) * tp
    return int((available - overhead) * 2**30) // per_block


# ================================================================== workload generation


def gaussian_length(s, mean: float, std: float, lo: float, hi: float) -> int:
    """A gaussian length draw of the distribution workload (WL-4): clamp, round, >= 1."""
    from blis_fast.kernels.go import gorand

    if lo == hi:
        return lo
    v = gorand.norm_float64(s) * std + mean
    return max(1, int(go_round(min(hi, max(lo, v)))))


def distribution_tokens(prefix_tokens: int, lengths: Sequence[tuple[float, float, float, float]],
                        seed: int, n: int) -> list[list[int]]:
    """Token ids (input ++ output) of the first ``n`` requests of a distribution workload, in
    the reference's draw order (WL-14): the prefix from the ``workload-gen`` stream, then per
    request from the client stream its input and output lengths and ids. ``lengths`` holds the
    (mean, stdev, min, max) of the prompt and the output."""
    from blis_fast.kernels.go import gorand

    (pm, ps, plo, phi), (om, osd, olo, ohi) = lengths
    wg = gorand.new_source(gorand.subsystem_seed(seed, "workload-gen"))
    prefix = [gorand.intn(wg, VOCAB) for _ in range(prefix_tokens)]
    client = gorand.new_source(gorand.int63(wg))
    out = []
    for _ in range(n):
        n_in = gaussian_length(client, pm, ps, plo, phi)
        n_out = gaussian_length(client, om, osd, olo, ohi)
        ids_in = [gorand.intn(client, VOCAB) for _ in range(n_in)]
        ids_out = [gorand.intn(client, VOCAB) for _ in range(n_out)]
        out.append(prefix + ids_in + ids_out)
    return out


def replay_token_ids(records: Sequence[tuple[str, int, int, int]],
                     seed: int) -> list[tuple[list[int], list[int]]]:
    """(input ids with the group prefix in front, output ids) of each trace record without a
    session, as ``blis replay`` draws them (WL-9.6 with DELTA-63) from one stream seeded with
    ``seed``: first each group's prefix, in the order the groups first appear among records
    with a group and a positive prefix length, as long as that first record says; then per
    record its input ids and its output ids. ``records`` holds (prefix group, "" for none,
    prefix length, input tokens, output tokens)."""
    from blis_fast.kernels.go import gorand

    s = gorand.new_source(seed)
    prefixes: dict[str, list[int]] = {}
    for group, plen, _inp, _out in records:
        if group and plen > 0 and group not in prefixes:
            prefixes[group] = [gorand.intn(s, VOCAB) for _ in range(plen)]
    out = []
    for group, _plen, inp, n_out in records:
        ids_in = [gorand.intn(s, VOCAB) for _ in range(inp)]
        ids_out = [gorand.intn(s, VOCAB) for _ in range(n_out)]
        out.append((prefixes.get(group, []) + ids_in, ids_out))
    return out


def sampled_length(s, dist) -> int:
    """One length draw of a spec distribution (gaussian, exponential, constant; WL-4)."""
    from blis_fast.kernels.go import gorand

    p = dist.params
    if dist.type == "gaussian":
        lo, hi = math.trunc(p["min"]), math.trunc(p["max"])
        if lo == hi:
            return lo
        v = gorand.norm_float64(s) * p["std_dev"] + p["mean"]
        return max(1, int(go_round(min(float(hi), max(float(lo), v)))))
    if dist.type == "exponential":
        return max(1, int(go_round(gorand.exp_float64(s) * p["mean"])))
    if dist.type == "constant":
        return max(1, math.trunc(p["value"]))
    raise AssertionError(dist.type)


def generate_requests(spec, rates: Sequence[float], horizon: int, max_requests: int,
                      bs: int) -> list[tuple]:
    """The WL-5 generation loop with the reference's own 2N per-client cap: per request
    (arrival, client index, input length, output length, prefix length, chunk digests).
    ``rates`` are the clients' normalized rates (WL-3)."""
    import numpy as np

    from blis_fast.kernels.go import gorand as g
    from blis_fast.kernels.hashing import content_digest

    wg = g.new_source(g.subsystem_seed(spec.seed, "workload-gen"))
    prefixes: dict[str, list[int]] = {}
    for c in spec.clients:
        if c.prefix_group and c.prefix_group not in prefixes:
            n = c.prefix_length if c.prefix_length > 0 else 50
            prefixes[c.prefix_group] = [g.intn(wg, VOCAB) for _ in range(n)]
    reqs = []
    for ci, c in enumerate(spec.clients):
        if rates[ci] <= 0:
            continue
        cs = g.new_source(g.int63(wg))
        rate = max(rates[ci], 1e-15)
        t = count = 0
        while t < horizon:
            if max_requests > 0 and count >= 2 * max_requests:
                break
            if c.arrival.process == "constant":
                iat = max(1, math.trunc(1.0 / rate))
            else:
                iat = max(1, math.trunc(g.exp_float64(cs) / rate))
            t += iat
            if t >= horizon:
                break
            if c.lifecycle is not None:
                if not any(w.start_us <= t < w.end_us for w in c.lifecycle.windows):
                    if t >= max(w.end_us for w in c.lifecycle.windows):
                        break
                    continue
            ilen = sampled_length(cs, c.input_dist)
            olen = sampled_length(cs, c.output_dist)
            itok = [g.intn(cs, VOCAB) for _ in range(ilen)]
            otok = [g.intn(cs, VOCAB) for _ in range(olen)]
            pre = prefixes.get(c.prefix_group, []) if c.prefix_group else []
            seq = np.array(pre + itok + otok, dtype=np.int64)
            dig = [int(content_digest(seq, k * bs, bs)) for k in range(len(seq) // bs)]
            reqs.append((t, ci, len(pre) + ilen, olen, len(pre), dig))
            count += 1
    reqs.sort(key=lambda r: r[0])  # Python's sort is stable, like sort.SliceStable
    if max_requests > 0:
        reqs = reqs[:max_requests]
    return reqs


# ================================================================== KV cache (ENG-5, DELTA-13/14)


class LRUFreeList:
    """The free list as a plain Python list, least recently freed first (ENG-5.2)."""

    def __init__(self, blocks: int) -> None:
        self.order = list(range(blocks))

    def __len__(self) -> int:
        return len(self.order)

    def __contains__(self, block: int) -> bool:
        return block in self.order

    def pop(self) -> int:
        """The eviction victim: the head (-1 when empty)."""
        return self.order.pop(0) if self.order else -1

    def append(self, block: int) -> None:
        """A freed block goes to the tail."""
        self.order.append(block)

    def remove(self, block: int) -> None:
        """A free block taken into use again (a prefix hit) leaves wherever it is."""
        self.order.remove(block)


class ChainHashes:
    """``HashBlock(prev, tokens)`` without SHA-256: each distinct (previous hash, block tokens)
    pair gets the next integer, so two chains are equal exactly when their ints are. 0 is the
    empty hash ("" in the reference)."""

    def __init__(self) -> None:
        self._ids: dict[tuple, int] = {}

    def __call__(self, prev: int, tokens: Sequence[Hashable]) -> int:
        return self._ids.setdefault((prev, tuple(tokens)), len(self._ids) + 1)


@dataclass(eq=False)
class Block:
    """One KV block (``sim/kv/cache.go: KVBlock``)."""

    id: int
    ref: int = 0
    in_use: bool = False
    hash: int = 0  # 0 = none
    tokens: list = field(default_factory=list)


class PrefixCache:
    """A single-tier KV cache with prefix caching (``sim/kv/cache.go: KVCacheState``), with a
    dict from block hash to block, an OrderedDict as the LRU free list and per request the
    list of its blocks.

    A request is anything with ``id``, ``input``, ``output`` (token lists) and ``progress``
    (the reference's ProgressIndex, which decides prefill or decode).
    """

    def __init__(self, total_blocks: int, block_size: int,
                 hashes: ChainHashes | None = None) -> None:
        self.bs = block_size
        self.total = total_blocks
        self.blocks = [Block(b) for b in range(total_blocks)]
        self.request_map: dict[str, list[int]] = {}
        self.hash_to_block: dict[int, int] = {}
        self.free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(total_blocks))
        self.hits = 0
        self.misses = 0
        self.hash = hashes or ChainHashes()

    # ---- counters
    def free_blocks(self) -> int:
        return len(self.free)

    def used_blocks(self) -> int:
        return self.total - len(self.free)

    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0

    # ---- queries
    def cached_blocks(self, tokens: Sequence[Hashable]) -> list[int]:
        """GetCachedBlocks: the blocks of the longest cached run of leading full blocks."""
        found = []
        prev = 0
        for k in range(len(tokens) // self.bs):
            h = self.hash(prev, tokens[k * self.bs:(k + 1) * self.bs])
            if h not in self.hash_to_block:
                break
            found.append(self.hash_to_block[h])
            prev = h
        return found

    # ---- free list
    def _pop_free(self) -> Block:
        b, _ = self.free.popitem(last=False)
        blk = self.blocks[b]
        blk.tokens = []
        return blk

    def _take(self, blk: Block) -> None:
        blk.ref += 1
        if not blk.in_use:
            blk.in_use = True
            del self.free[blk.id]

    # ---- AllocateKVBlocks (check-then-act, DELTA-13)
    def allocate(self, req, start: int, end: int, cached: Sequence[int]) -> bool:
        """Write the tokens ``[start, end)`` of ``req`` (one output token in decode) after the
        end of its block list; False, changing nothing, when the free list cannot hold them."""
        bs = self.bs
        ids = self.request_map.get(req.id)
        if req.progress < len(req.input):  # prefill
            new_tokens = list(req.input[start:end])
            eff = len(new_tokens)
            if ids:
                spare = bs - len(self.blocks[ids[-1]].tokens)
                if 0 < spare < bs:
                    eff -= min(spare, eff)
            need = (eff + bs - 1) // bs if eff > 0 else 0
            from_free = sum(1 for b in cached if not self.blocks[b].in_use)
            if need + from_free > self.free_blocks():
                return False
        else:  # decode: exactly one output token
            new_tokens = [req.output[start - len(req.input)]]
            if ids:
                if len(self.blocks[ids[-1]].tokens) == bs and self.free_blocks() == 0:
                    return False
            elif self.free_blocks() == 0:
                return False
        done = 0
        while done < len(new_tokens):
            if req.id in self.request_map:
                ids = self.request_map[req.id]
                latest = self.blocks[ids[-1]]
            else:  # first allocation: commit the cached prefix blocks
                ids = self.request_map[req.id] = []
                for b in cached:
                    self._take(self.blocks[b])
                    self.hits += 1
                    ids.append(b)
                latest = self.blocks[ids[-1]] if ids else None
            if latest is not None and 0 < len(latest.tokens) < bs:  # fill the partial block
                take = new_tokens[done:done + bs - len(latest.tokens)]
                latest.tokens.extend(take)
                done += len(take)
                if len(latest.tokens) == bs:  # full: it joins the chain (decode too)
                    prev = self.blocks[ids[-2]].hash if len(ids) >= 2 else 0
                    latest.hash = self.hash(prev, latest.tokens)
                    self.hash_to_block[latest.hash] = latest.id
            else:
                remaining = len(new_tokens) - done
                prev = self.blocks[ids[-1]].hash if ids else 0
                for _ in range((remaining + bs - 1) // bs):
                    blk = self._pop_free()
                    if blk.hash:  # the evicted content leaves the table, whoever it maps to
                        self.hash_to_block.pop(blk.hash, None)
                        blk.hash = 0
                    blk.tokens = new_tokens[done:done + bs]
                    blk.ref = 1
                    blk.in_use = True
                    self.misses += 1
                    if len(blk.tokens) == bs and req.progress < len(req.input):
                        blk.hash = self.hash(prev, blk.tokens)
                        self.hash_to_block[blk.hash] = blk.id
                        prev = blk.hash
                    ids.append(blk.id)
                    done += len(blk.tokens)
        return True

    def release(self, req_id: str) -> None:
        """ReleaseKVBlocks: last block first, each freed block to the LRU tail (ENG-5.5)."""
        for b in reversed(self.request_map.pop(req_id, [])):
            blk = self.blocks[b]
            blk.ref -= 1
            if blk.ref == 0:
                blk.in_use = False
                self.free[b] = None


# ================================================================== one vLLM instance (ENG-1..4, ENG-7)

ARRIVAL, QUEUED, STEP, SCHEDULED, LEFT, TIMEOUT = range(6)  # event priorities (ENG-1.2)

PRIORITY_POLICIES = {  # request priority while queued, from its age (ENG-4.1)
    "constant": lambda age: 0.0,
    "slo-based": lambda age: 0.0 + 1e-6 * age,
    "inverted-slo": lambda age: 0.0 - 1e-6 * age,
}
SCHEDULER_KEYS = {  # the wait queue's stable sort key each step (ENG-4.1); None: keep order
    "fcfs": None,
    "priority-fcfs": lambda r: (-r.priority, r.arrival, r.id),
    "sjf": lambda r: (len(r.input), r.arrival, r.id),
    "reverse-priority": lambda r: (r.priority, r.arrival, r.id),
}


@dataclass(frozen=True)
class InstanceConfig:
    """The flags of one instance the twin models (blackbox latency, single-tier cache)."""

    block_size: int
    total_blocks: int
    max_running: int = 256
    max_scheduled_tokens: int = 2048
    long_prefill_threshold: int = 0
    max_model_len: int = 0
    alpha: tuple[float, float, float] = (0.0, 0.0, 0.0)
    beta: tuple[float, float, float] = (0.0, 0.0, 0.0)
    horizon: int = INT64_MAX
    scheduler: str = "fcfs"
    priority_policy: str = "constant"


@dataclass(eq=False)
class Request:
    """One request and its engine state (``sim/request.go: Request``)."""

    id: str
    arrival: int
    input: list
    output: list
    deadline: int = 0
    max_output_len: int = 0
    state: str = "queued"
    progress: int = 0
    num_new: int = 0
    priority: float = 0.0
    ttft_set: bool = False
    first_token_time: int = 0
    itl: list[int] = field(default_factory=list)
    length_capped: bool = False
    preemptions: int = 0


@dataclass
class InstanceResult:
    """What one run of the twin reports: the summary counters (named as in the metrics JSON),
    the per-request maps of ``sim/metrics.go: Metrics`` and the cache's hit/miss counters."""

    counters: dict[str, int]
    sim_ended: int
    registered: list[str]  # per-request records (injected, not dropped)
    ttft: dict[str, int]
    e2e: dict[str, int]
    itl_mean: dict[str, float]
    itl_sum: dict[str, int]
    itl_count: dict[str, int]
    sched_delay: dict[str, int]
    length_capped: set[str]
    preemptions: dict[str, int]
    all_itls: list[int]
    hits: int
    misses: int
    steps: int
    event_times: list[int]  # the time of every event executed, in order

    def summary(self) -> dict[str, float | int]:
        """The metrics JSON of ``SaveResults`` (ENG-7.4, DELTA-6/9): counters always, the
        latency statistics and throughputs only when a request completed."""
        out: dict[str, float | int] = dict(self.counters)
        duration = self.sim_ended / 1e6
        out["vllm_estimated_duration_s"] = duration
        stats = dict.fromkeys(
            ("responses_per_sec", "tokens_per_sec", "e2e_mean_ms", "e2e_p90_ms", "e2e_p95_ms",
             "e2e_p99_ms", "ttft_mean_ms", "ttft_p90_ms", "ttft_p95_ms", "ttft_p99_ms",
             "itl_mean_ms", "itl_p90_ms", "itl_p95_ms", "itl_p99_ms",
             "scheduling_delay_p99_ms"), 0.0)
        if self.counters["completed_requests"] > 0:
            for name, values in (("ttft", [float(v) for v in self.ttft.values()]),
                                 ("e2e", [float(v) for v in self.e2e.values()]),
                                 ("itl", list(self.all_itls))):
                stats[f"{name}_mean_ms"] = mean_ms(values)
                for p in (90, 95, 99):
                    stats[f"{name}_p{p}_ms"] = percentile_ms(values, p)
            stats["scheduling_delay_p99_ms"] = percentile_ms(
                [float(v) for v in self.sched_delay.values()], 99)
            if duration > 0:
                stats["responses_per_sec"] = self.counters["completed_requests"] / duration
                stats["tokens_per_sec"] = self.counters["total_output_tokens"] / duration
        out.update(stats)
        return out


class Instance:
    """One vLLM instance behind a one-instance cluster with always-admit and no pipeline
    latencies, as ``blis run``/``blis replay`` drive it (CLU-1.5, CLU-1.17).

    Scope: blackbox latency, single-tier KV cache, the schedulers and priority policies of
    ``SCHEDULER_KEYS`` and ``PRIORITY_POLICIES``. Rules: the event order of ENG-1.2 and
    CLU-1.6, enqueue guards ENG-3.4, the step ENG-2 with DELTA-2/3/4/6, queue order ENG-4.1,
    batch formation ENG-4.2-4.5 with DELTA-5 (preemption of the running batch's tail), the KV
    cache ENG-5 with DELTA-13/14, lazy timeout cancellation DELTA-1, metrics ENG-7.2.
    """

    def __init__(self, cfg: InstanceConfig) -> None:
        for table, name, where in ((SCHEDULER_KEYS, cfg.scheduler, "SCHEDULER_KEYS"),
                                   (PRIORITY_POLICIES, cfg.priority_policy, "PRIORITY_POLICIES")):
            if name not in table:
                raise KeyError(f"naive.Instance has no twin of {name!r}: add it to {where} in "
                               "tests/naive.py")
        self.cfg = cfg
        self.kv = PrefixCache(cfg.total_blocks, cfg.block_size)
        self.heap: list[tuple] = []
        self.seq = 0
        self.clock = 0
        self.wait: list[Request] = []
        self.running: list[Request] | None = []  # None: the reference's nil batch
        self.step_pending = False  # the reference's stepEvent != nil
        self.step_count = 0
        self.computed: dict[str, int] = {}  # the reference's ComputedTokens map
        self.budget = 0  # token budget left in the batch being formed
        self.preempted = False  # a preemption happened while forming this batch
        self.counters = dict.fromkeys(
            ("completed_requests", "still_queued", "still_running", "injected_requests",
             "total_input_tokens", "total_output_tokens", "preemption_count",
             "dropped_unservable", "length_capped_requests", "timed_out_requests",
             "kv_allocation_failures"), 0)
        self.registered: dict[str, None] = {}
        self.ttft: dict[str, int] = {}
        self.e2e: dict[str, int] = {}
        self.itl_mean: dict[str, float] = {}
        self.itl_sum: dict[str, int] = {}
        self.itl_count: dict[str, int] = {}
        self.sched_delay: dict[str, int] = {}
        self.all_itls: list[int] = []
        self.requests: list[Request] = []
        self.event_times: list[int] = []

    # ---- latency model (ENG-6.2, ENG-6.3)
    def queueing_time(self, req: Request) -> int:
        a = self.cfg.alpha
        t = 0.0
        t += a[0]
        t += a[1] * float(len(req.input))
        return clamp64(t)

    def output_token_time(self) -> int:
        return clamp64(self.cfg.alpha[2])

    def step_time(self, scheduled: list[Request]) -> int:
        prefill = decode = 0
        for r in scheduled:
            if r.progress < len(r.input):
                prefill += r.num_new
            elif r.output:
                decode += r.num_new
        b = self.cfg.beta
        t = 0.0
        t += b[0]
        t += b[1] * float(prefill)
        t += b[2] * float(decode)
        return max(1, clamp64(t))

    # ---- events
    def push(self, time: int, priority: int, kind: str, req: Request | None = None) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (time, priority, self.seq, kind, req))

    def run(self, requests: Sequence[Request]) -> InstanceResult:
        """Inject ``requests`` at their arrival times (list order among equal times) and run
        until nothing is left or the next event lies past the horizon."""
        self.requests = list(requests)
        arrivals = sorted(requests, key=lambda r: r.arrival)  # stable: list order on ties
        nxt = 0
        horizon = self.cfg.horizon
        while nxt < len(arrivals) or self.heap:
            c = arrivals[nxt].arrival if nxt < len(arrivals) else INF
            i = self.heap[0][0] if self.heap else INF
            if c <= i:  # cluster events first at equal times: arrival, admission, routing
                if c > horizon:
                    break
                req = arrivals[nxt]
                nxt += 1
                self.push(c, ARRIVAL, "arrival", req)
                self.registered[req.id] = None
                continue
            if i > horizon:
                break
            time, _prio, _seq, kind, req = heapq.heappop(self.heap)
            if kind == "timeout" and req.state == "completed":
                continue  # cancelled lazily: the clock does not move (DELTA-1)
            self.clock = time
            self.event_times.append(time)
            getattr(self, "on_" + kind)(time, req)
        return self.finish()

    def on_arrival(self, now: int, req: Request) -> None:
        self.push(now + self.queueing_time(req), QUEUED, "queued", req)

    def on_queued(self, now: int, req: Request) -> None:
        self.enqueue(req)
        if not self.step_pending and self.wait:
            self.push(now, STEP, "step")
            self.step_pending = True

    def on_scheduled(self, now: int, req: Request) -> None:
        pass

    def on_left(self, now: int, req: Request) -> None:
        pass

    def on_timeout(self, now: int, req: Request) -> None:
        if req.state in ("completed", "timed_out"):
            return
        was_running = req.state == "running"
        req.state = "timed_out"
        self.counters["timed_out_requests"] += 1
        self.kv.release(req.id)
        self.computed.pop(req.id, None)
        if was_running:
            self.running = [r for r in self.running if r is not req] or None
        elif req in self.wait:
            self.wait.remove(req)
        if not self.running and not self.step_pending and self.wait:
            self.push(now, STEP, "step")
            self.step_pending = True

    def drop(self, req: Request) -> None:
        self.counters["dropped_unservable"] += 1
        self.registered.pop(req.id, None)

    def enqueue(self, req: Request) -> None:
        """EnqueueRequest's guards in order (ENG-3.4), then the wait queue's tail."""
        m = self.cfg.max_model_len
        if req.max_output_len == 0 and m > 0 and len(req.input) < m:
            req.max_output_len = m - len(req.input)
        if req.max_output_len < 0:
            return self.drop(req)
        if m > 0:
            if len(req.input) >= m:
                return self.drop(req)
            if req.max_output_len > 0 and len(req.input) + req.max_output_len > m:
                return self.drop(req)
        bs = self.cfg.block_size
        if (len(req.input) + bs - 1) // bs > self.cfg.total_blocks:
            return self.drop(req)
        self.counters["total_input_tokens"] += len(req.input)
        if 0 < req.deadline <= self.clock:
            req.state = "timed_out"
            self.counters["timed_out_requests"] += 1
            return None
        self.wait.append(req)
        if 0 < req.deadline <= self.cfg.horizon:
            self.push(req.deadline, TIMEOUT, "timeout", req)
        return None

    # ---- the step (ENG-2)
    def on_step(self, now: int, _req: None) -> None:
        if self.running is None and not self.wait:
            self.step_pending = False
            return
        self.step_count += 1
        priority = PRIORITY_POLICIES[self.cfg.priority_policy]
        for r in self.wait:
            r.priority = priority(float(now - r.arrival))
        key = SCHEDULER_KEYS[self.cfg.scheduler]
        if key is not None:
            self.wait.sort(key=key)  # stable, as sort.SliceStable
        newly = self.form_batch()
        for req in newly:
            self.push(now, SCHEDULED, "scheduled", req)
            self.sched_delay[req.id] = now - req.arrival
        d = self.execute(now)
        remaining = self.complete(now, d)
        if remaining:
            self.running = remaining
            self.push(now + d, STEP, "step")
            self.step_pending = True
        else:
            self.running = None
            self.step_pending = False
            if self.wait:
                self.push(now + d, STEP, "step")
                self.step_pending = True

    def form_batch(self) -> list[Request]:
        """VLLMBatchFormation.FormBatch: running requests first (chunked prefill or one decode
        token each, preempting the batch's tail when the cache is full), then admissions from
        the head of the wait queue unless something was preempted. Returns the admitted."""
        cfg = self.cfg
        running = self.running if self.running is not None else []
        self.running = running
        self.budget = cfg.max_scheduled_tokens
        self.preempted = False
        for r in running:
            r.num_new = 0
        k = 0
        while k < len(running):
            if self.budget <= 0:
                break
            req = running[k]
            n = len(req.input) - req.progress
            if n > 0:  # prefill, maybe chunked
                if 0 < cfg.long_prefill_threshold < n:
                    n = cfg.long_prefill_threshold
                n = min(n, self.budget)
                if cfg.max_model_len > 0:
                    n = min(n, max(cfg.max_model_len - 1 - req.progress, 0))
                if not self.preempt_for_tokens(req, n):
                    break
                self.budget -= n
                req.num_new = n
                self.computed[req.id] = self.computed.get(req.id, 0) + n
            if req.progress >= len(req.input) and req.output:  # decode (the old progress)
                if not (cfg.max_model_len > 0 and req.progress + 1 > cfg.max_model_len - 1):
                    if not self.preempt_for_tokens(req, 1):
                        break
                    self.budget -= 1
                    req.num_new = 1
                    self.computed[req.id] = self.computed.get(req.id, 0) + 1
            k += 1
        newly = []
        while (len(running) < cfg.max_running and self.wait and self.budget > 0
               and not self.preempted):
            nxt = self.wait[0]
            cached = self.kv.cached_blocks(nxt.input)
            start = len(cached) * cfg.block_size
            n = len(nxt.input) - start
            if 0 < cfg.long_prefill_threshold < n:
                n = cfg.long_prefill_threshold
            n = min(n, self.budget)
            if cfg.max_model_len > 0:
                n = min(n, max(cfg.max_model_len - 1 - start, 0))
            if not self.kv.allocate(nxt, start, start + n, cached):
                break  # head-of-line blocking: no preemption for admissions
            self.wait.pop(0)
            running.append(nxt)
            newly.append(nxt)
            self.budget -= n
            nxt.state = "running"
            nxt.num_new = n
            self.computed[nxt.id] = n + start
        return newly

    def preempt_for_tokens(self, req: Request, n: int) -> bool:
        """Allocate ``n`` tokens for ``req``, evicting the running batch's last request until
        it fits; False when ``req`` itself was evicted or nothing is left to evict."""
        running = self.running
        while not self.kv.allocate(req, req.progress, req.progress + n, []):
            if not running:
                return False
            self.preempted = True
            victim = running.pop()
            self.counters["preemption_count"] += 1
            victim.preemptions += 1
            if victim.num_new > 0:
                self.budget += victim.num_new
                victim.num_new = 0
            victim.state = "queued"
            victim.progress = 0
            victim.itl = []
            victim.ttft_set = False
            self.kv.release(victim.id)
            self.computed.pop(victim.id, None)
            self.wait.insert(0, victim)
            if victim is req:
                return False
        return True

    def execute(self, now: int) -> int:
        """Step duration over the requests granted tokens (DELTA-3), then progress, ITL samples
        and first tokens (DELTA-4)."""
        scheduled = [r for r in self.running if r.num_new > 0]
        d = max(1, self.step_time(scheduled))
        otp = self.output_token_time()
        for r in self.running:
            if r.progress < len(r.input):
                r.progress = self.computed[r.id]
            elif r.num_new > 0:
                r.progress += 1
                r.itl.append(d + otp)
            if r.progress == len(r.input) and not r.ttft_set:
                r.ttft_set = True
                r.first_token_time = now + d + otp - r.arrival
                self.ttft[r.id] = r.first_token_time
        return d

    def complete(self, now: int, d: int) -> list[Request]:
        """processCompletions: normal completion (final token's KV, release) or the length
        cap; returns the requests that stay."""
        remaining = []
        m = self.cfg.max_model_len
        for r in self.running:
            n_in, n_out = len(r.input), len(r.output)
            if r.progress >= n_in + max(n_out, 1) - 1:
                r.state = "completed"
                if n_out > 0 and r.progress < n_in + n_out:
                    if not self.kv.allocate(r, r.progress, r.progress + 1, []):
                        self.counters["kv_allocation_failures"] += 1
                self.kv.release(r.id)
                self.push(now + d, LEFT, "left", r)
                self.record_completion(r)
            elif m > 0 and r.progress >= m - 1:
                self.counters["length_capped_requests"] += 1
                r.length_capped = True
                r.state = "completed"
                self.kv.release(r.id)
                self.push(now + d, LEFT, "left", r)
                self.record_completion(r)
            else:
                remaining.append(r)
        return remaining

    def record_completion(self, r: Request) -> None:
        """recordRequestCompletion (ENG-7.2 with DELTA-5/6)."""
        self.counters["completed_requests"] += 1
        k = r.progress - len(r.input)
        if k < len(r.output):
            k += 1
        if k > 0:
            self.counters["total_output_tokens"] += k
        itl_sum = sum(r.itl)
        self.e2e[r.id] = r.first_token_time + itl_sum  # blackbox: no post-decode overhead
        if r.output:
            n = len(r.itl) if r.length_capped else len(r.output)
            self.itl_mean[r.id] = float(itl_sum) / float(max(n - 1, 1))
        else:
            self.itl_mean[r.id] = 0.0
        self.itl_sum[r.id] = itl_sum
        self.itl_count[r.id] = len(r.itl)
        self.all_itls.extend(r.itl)

    def finish(self) -> InstanceResult:
        """Finalize (ENG-1.10) and the derived counters (ENG-7.4)."""
        c = self.counters
        c["still_queued"] = len(self.wait)
        c["still_running"] = len(self.running or [])
        c["injected_requests"] = (c["completed_requests"] + c["still_queued"]
                                  + c["still_running"] + c["dropped_unservable"]
                                  + c["timed_out_requests"])
        return InstanceResult(
            counters=dict(c), sim_ended=min(self.clock, self.cfg.horizon),
            registered=list(self.registered), ttft=self.ttft, e2e=self.e2e,
            itl_mean=self.itl_mean, itl_sum=self.itl_sum, itl_count=self.itl_count,
            sched_delay=self.sched_delay,
            length_capped={r.id for r in self.requests if r.length_capped},
            preemptions={r.id: r.preemptions for r in self.requests},
            all_itls=self.all_itls, hits=self.kv.hits, misses=self.kv.misses,
            steps=self.step_count, event_times=self.event_times)
