"""Regressions of the tiered (GPU + CPU) KV cache against figures of the reference.

A reload from the CPU tier can leave a request's block list out of step with the tokens it is
given next (commits that a failed allocation does not undo, a queued request that keeps its
committed blocks): the reference then writes the new tokens into blocks after the list's end,
so those blocks hash their real contents, not the block-aligned chunks at their list index.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _cli import invoke

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
