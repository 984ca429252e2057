"""Observed traces made by the simulator itself: the ground truth of fit tests and benchmarks.

A generated workload is simulated with known coefficients; its exported trace v2 gets the
header ``blis observe`` writes and per-request TTFT and decode time scaled by seeded
multiplicative noise, so a fit must recover the coefficients from imperfect measurements.
"""

from __future__ import annotations

import csv
import io
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

import blis_fast
from blis_fast.observe.output import trace_header

__all__ = ["make_observed_trace"]


def make_observed_trace(prefix: str | Path, *, alpha: tuple[float, float, float],
                        beta: tuple[float, ...], noise: float = 0.03, noise_seed: int = 1,
                        model: str = "meta-llama/llama-3.1-8b-instruct",
                        latency_model: str = "blackbox", **workload: Any) -> tuple[str, str]:
    """Write ``<prefix>.yaml`` and ``<prefix>.csv`` and return their paths.

    ``workload`` holds ``blis_fast.run`` keywords (``num_requests``, ``rate``, ...); ``noise``
    is the standard deviation of the multiplicative error on TTFT and on E2E - TTFT.
    """
    with tempfile.TemporaryDirectory() as tmp:
        exported = Path(tmp) / "sim"
        blis_fast.run(model=model, latency_model=latency_model, alpha_coeffs=alpha,
                      beta_coeffs=beta, trace_output=str(exported), log="error", **workload)
        rows = list(csv.reader(io.StringIO((exported.with_suffix(".csv")).read_text())))
    head, body = rows[0], rows[1:]
    col = {name: k for k, name in enumerate(head)}
    rng = np.random.default_rng(noise_seed)
    for row in body:
        send = int(row[col["send_time_us"]])
        ttft = int(row[col["first_chunk_time_us"]]) - send
        decode = int(row[col["last_chunk_time_us"]]) - send - ttft
        ttft = max(1, round(ttft * (1.0 + noise * rng.standard_normal())))
        decode = max(0, round(decode * (1.0 + noise * rng.standard_normal())))
        row[col["first_chunk_time_us"]] = str(send + ttft)
        row[col["last_chunk_time_us"]] = str(send + ttft + decode)
        row[col["server_input_tokens"]] = row[col["input_tokens"]]
        row[col["num_chunks"]] = row[col["output_tokens"]]
        row[col["streaming"]] = "true"  # one chunk per token: a streamed observation
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows([head, *body])
    header_path, data_path = f"{prefix}.yaml", f"{prefix}.csv"
    Path(header_path).write_text(trace_header("2026-01-01T00:00:00Z", 0, noise_seed, "", "vllm",
                                              model, 0.0))
    Path(data_path).write_text(out.getvalue())
    return header_path, data_path
