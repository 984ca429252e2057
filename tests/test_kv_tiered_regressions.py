"""Regressions of the tiered (GPU + CPU) KV cache against figures of the reference.

A reload from the CPU tier can leave a request's block list out of step with the tokens it is
given next (commits that a failed allocation does not undo, a queued request that keeps its
committed blocks): the reference then writes the new tokens into blocks after the list's end,
so those blocks hash their real contents, not the block-aligned chunks at their list index.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from _cli import invoke

from blis_fast.kernels.kv import kvcache as kvc

# request_21 is the first request whose end differs when the hashes follow the list index
CHUNKED_PREEMPTION_RUN = [
    "run", "--model", "01-ai/yi-34b", "--hardware", "H100", "--tp", "4",
    "--total-kv-blocks", "1488", "--long-prefill-token-threshold", "64",
    "--kv-cpu-blocks", "1619", "--rate", "320.21", "--num-requests", "40",
]


def test_chunked_prefill_reloads_under_preemption_match_the_reference(tmp_path: Path) -> None:
    """Reference (b563c440): 202 preemptions, vllm_estimated_duration_s 5.658007."""
    out = tmp_path / "results.json"
    run = invoke([*CHUNKED_PREEMPTION_RUN, "--metrics-path", str(out)])
    assert run.code == 0, run.stderr[-2000:]
    results = json.loads(out.read_text())
    assert results["completed_requests"] == 40
    assert results["preemption_count"] == 202
    assert results["vllm_estimated_duration_s"] == pytest.approx(5.658007, rel=1e-6)


# ---------------------------------------------------------------- the rule on a small cache

BS = 16
CHUNKS = 10  # both requests: the same 160 input tokens (equal chunk digests), no output


def _shared_prefix_cache():
    """A tiered cache of 64 blocks holding two requests with identical token sequences."""
    digests = np.arange(1, CHUNKS + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    lengths = np.full(2, CHUNKS * BS, np.int64)
    return kvc.new_kv_state(1, 64, BS, np.array([0, CHUNKS, 2 * CHUNKS], np.int64),
                            np.concatenate([digests, digests]), lengths,
                            np.zeros(2, np.int64), cpu_blocks=8, reload_ticks=1)


def _write(kv, r: int, start: int, end: int) -> None:
    """AllocateKVBlocks of prefill tokens [start, end) for request ``r`` (must succeed)."""
    none = np.zeros(CHUNKS, np.int64)
    assert kvc.allocate(kv, 0, r, start, end, True, CHUNKS * BS, none, 0, np.zeros_like(none))


def _prefix_hits(kv) -> int:
    """Leading blocks of request 1's input found in the cache (GetCachedBlocks)."""
    return int(kvc.cached_blocks(kv, 0, 1, CHUNKS * BS, np.zeros(CHUNKS, np.int64)))


def test_tokens_written_in_step_with_the_list_are_prefix_hits() -> None:
    kv = _shared_prefix_cache()
    _write(kv, 0, 0, 70)
    _write(kv, 0, 70, 128)  # fills the partial fifth block, then 3 more blocks from 80
    assert _prefix_hits(kv) == 8


def test_tokens_written_behind_the_list_end_hash_their_own_contents() -> None:
    """After a reload kept commits, the reference retries with the request's progress (64)
    while its list already ends at 96: blocks 7..10 hold tokens 64..127, chained after chunk 5,
    so no other request finds them (before the fix they were registered as chunks 6..9)."""
    kv = _shared_prefix_cache()
    _write(kv, 0, 0, 96)
    _write(kv, 0, 64, 128)
    assert int(kv.req[0, kvc.BlockList.COUNT]) == 10
    assert _prefix_hits(kv) == 6


def test_a_partial_block_continued_from_elsewhere_is_no_chunk() -> None:
    """A list ending at 70 (a partial fifth block) given tokens from 96: the fifth block holds
    64..69 then 96..105, the sixth 106..121; neither is chunk 4 or 5."""
    kv = _shared_prefix_cache()
    _write(kv, 0, 0, 70)
    _write(kv, 0, 96, 128)
    assert int(kv.req[0, kvc.BlockList.COUNT]) == 7
    assert _prefix_hits(kv) == 4


def test_decode_fast_path_only_continues_the_last_run() -> None:
    kv = _shared_prefix_cache()
    _write(kv, 0, 0, 70)
    assert not kvc.append_decode_token_fast(kv, 0, 0, 96)  # elsewhere: the general path
    assert kvc.append_decode_token_fast(kv, 0, 0, 70)
    assert int(kv.req[0, kvc.BlockList.LAST]) == 7
