"""The KV cache kernel against the dict-based prefix cache of ``naive.py`` (issue 11 item 5).

Hypothesis draws requests with shared prefixes and a sequence of operations as the engine
performs them (admission with the cached prefix, prefill chunks, decode tokens — through the
decode fast path or the general allocation —, release). After every operation the two must
agree on: whether the allocation succeeded, free and used block counts, the cumulative hit
rate, and for every request the blocks of the cached prefix it would hit now (so the block
ids, hence the LRU order of evictions, must be the same).

Only the cache's public entry points are used (``new_kv_state``, ``cached_blocks``,
``allocate``, ``append_decode_token_fast``, ``release``, ``free_blocks``, ``used_blocks``,
``hit_rate``). Block contents are named symbolically: a prefix group's tokens are shared by
its members, every other token belongs to its request; each distinct block-aligned chunk gets
its own content digest.
"""

from __future__ import annotations

import naive
import numpy as np
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from blis_fast.kernels.kv import kvcache as kvc

SETTINGS = dict(deadline=None, database=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


class Pair:
    """The kernel's cache and the twin, fed the same requests."""

    def __init__(self, total: int, bs: int, lengths: list[tuple[int, int, int, int]]) -> None:
        self.bs = bs
        self.reqs = []
        digest_of: dict[tuple, int] = {}
        offsets, digests = [0], []
        for k, (group, prefix, own, out) in enumerate(lengths):
            inp = [("prefix", group, j) for j in range(prefix)] + [("input", k, j)
                                                                    for j in range(own)]
            req = naive.Request(id=f"r{k}", arrival=0, input=inp,
                                output=[("output", k, j) for j in range(out)])
            self.reqs.append(req)
            seq = req.input + req.output
            for c in range(len(seq) // bs):
                chunk = tuple(seq[c * bs:(c + 1) * bs])
                digests.append(digest_of.setdefault(chunk, 0x9E3779B97F4A7C15 * (len(digest_of) + 1)
                                                    % (1 << 64)))
            offsets.append(len(digests))
        self.input_len = np.array([len(r.input) for r in self.reqs], dtype=np.int64)
        output_len = np.array([len(r.output) for r in self.reqs], dtype=np.int64)
        self.kv = kvc.new_kv_state(1, total, bs, np.array(offsets, dtype=np.int64),
                                   np.array(digests, dtype=np.uint64), self.input_len,
                                   output_len)
        self.twin = naive.PrefixCache(total, bs)
        self.scratch = np.zeros(total + 1, dtype=np.int64)
        self.cached = np.zeros(total + 1, dtype=np.int64)

    # ---- operations, each on both sides
    def kernel_cached(self, r: int) -> list[int]:
        n = kvc.cached_blocks(self.kv, 0, r, self.input_len[r], self.cached)
        return [int(b) for b in self.cached[:n]]

    def admit(self, r: int, chunk: int) -> bool:
        """Phase 2: the cached prefix, then a first chunk of the rest (maybe empty)."""
        req = self.reqs[r]
        hit = self.twin.cached_blocks(req.input)
        assert self.kernel_cached(r) == hit
        start = len(hit) * self.bs
        end = start + min(chunk, len(req.input) - start)
        ok = self.twin.allocate(req, start, end, hit)
        got = kvc.allocate(self.kv, 0, r, start, end, True, self.input_len[r], self.cached,
                           len(hit), self.scratch)
        assert bool(got) == ok, ("admit", r, start, end)
        if ok:
            req.progress = end
            req.state = "running"
        return ok

    def prefill(self, r: int, chunk: int) -> bool:
        req = self.reqs[r]
        end = req.progress + min(chunk, len(req.input) - req.progress)
        ok = self.twin.allocate(req, req.progress, end, [])
        got = kvc.allocate(self.kv, 0, r, req.progress, end, True, self.input_len[r],
                           self.cached, 0, self.scratch)
        assert bool(got) == ok, ("prefill", r, req.progress, end)
        if ok:
            req.progress = end
        return ok

    def decode(self, r: int, fast_first: bool) -> bool:
        """One output token; the engine tries the fast path first, then the general one."""
        req = self.reqs[r]
        pos = req.progress
        ok = self.twin.allocate(req, pos, pos + 1, [])
        got = fast_first and kvc.append_decode_token_fast(self.kv, 0, r, pos)
        if not got:
            got = kvc.allocate(self.kv, 0, r, pos, pos + 1, False, self.input_len[r],
                               self.cached, 0, self.scratch)
        assert bool(got) == ok, ("decode", r, pos)
        if ok:
            req.progress += 1
        return ok

    def release(self, r: int) -> None:
        req = self.reqs[r]
        self.twin.release(req.id)
        kvc.release(self.kv, 0, r)
        req.progress = 0
        req.state = "queued"

    def check(self) -> None:
        assert int(kvc.free_blocks(self.kv, 0)) == self.twin.free_blocks()
        assert int(kvc.used_blocks(self.kv, 0)) == self.twin.used_blocks()
        assert float(kvc.hit_rate(self.kv, 0)) == self.twin.hit_rate()
        for r, req in enumerate(self.reqs):
            assert self.kernel_cached(r) == self.twin.cached_blocks(req.input), req.id


@st.composite
def scenarios(draw):
    bs = draw(st.sampled_from([2, 3, 4]))
    total = draw(st.integers(3, 16))
    groups = [draw(st.integers(1, 3 * bs + 1)) for _ in range(draw(st.integers(1, 2)))]
    lengths = []
    for _ in range(draw(st.integers(2, 7))):
        g = draw(st.integers(-1, len(groups) - 1))
        prefix = groups[g] if g >= 0 else 0
        own = draw(st.integers(0 if prefix else 1, 3 * bs))
        lengths.append((g, prefix, own, draw(st.integers(0, 2 * bs + 1))))
    ops = draw(st.lists(st.tuples(st.integers(0, len(lengths) - 1), st.integers(0, 4),
                                  st.integers(1, 3 * bs), st.booleans()),
                        min_size=20, max_size=120))
    return total, bs, lengths, ops


def play(total: int, bs: int, lengths, ops) -> Pair:
    """Run ``ops`` on both caches: selector 0 releases the request; otherwise it advances
    (admission, a prefill chunk or a decode token, whichever is next for it; a finished
    request is released)."""
    pair = Pair(total, bs, lengths)
    pair.check()
    for r, selector, chunk, fast in ops:
        req = pair.reqs[r]
        started = req.state == "running"
        if selector == 0 or (started and req.progress >= len(req.input) + len(req.output)):
            if started:
                pair.release(r)
        elif not started:
            pair.admit(r, chunk)
        elif req.progress < len(req.input):
            pair.prefill(r, chunk)
        else:
            pair.decode(r, fast)
        pair.check()
    return pair


def test_prefix_hit_commits_the_cached_blocks() -> None:
    """Two members of one group: the second commits the first's two full prefix blocks
    and needs one block of its own."""
    pair = play(8, 4, [(0, 8, 2, 1), (0, 8, 3, 1)], [(0, 1, 10, False), (1, 1, 10, False)])
    assert pair.twin.hits == 2 and pair.twin.used_blocks() == 3 + 1  # shared prefix, own block


def test_released_blocks_are_evicted_last_block_first() -> None:
    """A released request's blocks go to the LRU tail last to first (ENG-5.5): the next
    allocation evicts its later blocks before its prefix, which stays a cache hit."""
    ops = [(0, 1, 12, False), (0, 0, 1, False), (1, 1, 8, False)]
    pair = play(4, 4, [(0, 8, 4, 0), (-1, 0, 8, 0), (0, 8, 0, 0)], ops)
    assert pair.twin.cached_blocks(pair.reqs[2].input) == [0, 1]  # prefix blocks survive


@settings(max_examples=200, **SETTINGS)
@given(case=scenarios())
@example(case=(4, 2, [(0, 3, 1, 3), (0, 3, 1, 3), (-1, 0, 5, 2)],
               [(0, 1, 2, False), (1, 1, 6, True), (0, 1, 2, False), (2, 1, 6, True),
                (1, 1, 1, True), (0, 0, 1, False), (2, 1, 1, True), (1, 1, 6, True)]))
def test_kv_cache_matches_the_prefix_table_twin(case) -> None:
    play(*case)
