"""Helpers shared by the latency tests: options for latency resolution (from keywords or a parity
case's arguments), lone-request replay."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

from blis_fast.config.latency import LatencyConfig
from blis_fast.kernels.engine import latency as K
from blis_fast.options import RunOptions

CASES_DIR = Path(__file__).resolve().parent / "reference_cases" / "cases"

LATENCY_CASES = (
    "quickstart-llama31-8b",
    "roofline-llama70b-tp4-a100-summarization",
    "roofline-mixtral-moe-tp2",
    "roofline-qwen3-14b-contentgen",
    "trained-physics-llama31-8b",
    "blackbox-default-lowload",
    "mar-crossmodel-llama31-8b",
    "mar-trained-roofline-llama31-8b",
)

_FLAGS = {
    "--model": ("model", str),
    "--latency-model": ("latency_model", str),
    "--hardware": ("hardware", str),
    "--tp": ("tp", int),
    "--vllm-version": ("vllm_version", str),
    "--alpha-coeffs": ("alpha_coeffs", lambda s: [float(x) for x in s.split(",")]),
    "--beta-coeffs": ("beta_coeffs", lambda s: [float(x) for x in s.split(",")]),
    "--total-kv-blocks": ("total_kv_blocks", int),
    "--max-model-len": ("max_model_len", int),
    "--block-size-in-tokens": ("block_size_in_tokens", int),
    "--gpu-memory-utilization": ("gpu_memory_utilization", float),
}


def case_args(case: str) -> list[str]:
    """The CLI arguments of a parity case."""
    return json.loads((CASES_DIR / case / "case.json").read_text())["args"]


def latency_options(explicit=(), **values):
    """RunOptions with ``values`` and ``explicit`` (flag or field names) marked as given."""
    return RunOptions(**values, explicit=frozenset(
        name.lstrip("-").replace("-", "_") for name in explicit))


def options_for(case: str):
    """RunOptions built from a parity case's command line (latency flags only)."""
    args = case_args(case)
    kw: dict = {}
    explicit = set()
    i = 0
    while i < len(args):
        spec = _FLAGS.get(args[i])
        if spec is not None:
            kw[spec[0]] = spec[1](args[i + 1])
            explicit.add(args[i][2:])
            i += 2
        else:
            i += 1
    return latency_options(explicit, **kw)


def stderr_messages(case: str) -> list[str]:
    """The ``msg="..."`` texts of a case's stderr, in order."""
    out = []
    for line in (CASES_DIR / case / "stderr.txt").read_text().splitlines():
        start = line.find('msg="')
        if start >= 0:
            out.append(line[start + 5 : line.rfind('"')].replace('\\"', '"'))
    return out


def _arr(*xs: int) -> np.ndarray:
    return np.array(xs, dtype=np.int64)


def lone_steps(
    cfg: LatencyConfig, budget: int, input_len: int, output_len: int
) -> list[tuple[str, int]]:
    """Step kinds and durations of a request that has the instance to itself (no prefix hits)."""
    steps = []
    pi = 0
    while pi < input_len:
        n = min(input_len - pi, budget)
        d = K.step_time(
            cfg.code, cfg.params, 1, _arr(pi), _arr(n), _arr(input_len), _arr(output_len)
        )
        steps.append(("prefill", int(d)))
        pi += n
    for k in range(output_len - 1):
        d = K.step_time(
            cfg.code, cfg.params, 1, _arr(input_len + k), _arr(1), _arr(input_len), _arr(output_len)
        )
        steps.append(("decode", int(d)))
    return steps


def lone_requests(case: str, cfg: LatencyConfig, budget: int = 2048) -> list[dict]:
    """Requests of a case provably alone on the instance during their prefill (and maybe decode).

    A request qualifies when every other request either finished before it was queued
    (``arrival + e2e`` is an upper bound of a request's lifetime) or was queued strictly after the
    start of its last prefill step (``e2e_alone`` also: after the start of its last step).
    Returns dicts with the case's values and the replayed ones.
    """
    rows = list(csv.DictReader((CASES_DIR / case / "trace.csv").open()))
    res = {
        r["requestID"]: r
        for r in json.loads((CASES_DIR / case / "results.json").read_text())["requests"]
    }
    a2 = int(K.output_token_processing_time(cfg.code, cfg.alpha))
    post = int(K.post_decode_fixed_overhead(cfg.code, cfg.alpha))
    reqs = []
    for r in rows:
        rec = res[f"request_{r['request_id']}"]
        arrival = int(r["arrival_time_us"])
        inp, out = int(r["input_tokens"]), int(r["output_tokens"])
        qt = int(K.queueing_time(cfg.code, cfg.alpha, inp))
        end = arrival + round(rec["e2e_ms"] * 1000) if rec["e2e_ms"] else 1 << 62
        reqs.append({"rec": rec, "arrival": arrival, "end": end, "in": inp, "out": out, "qt": qt})
    found = []
    for i, q in enumerate(reqs):
        queued = q["arrival"] + q["qt"]
        others = [o for j, o in enumerate(reqs) if j != i and not o["end"] < queued]
        first_other = min((o["arrival"] + o["qt"] for o in others), default=1 << 62)
        steps = lone_steps(cfg, budget, q["in"], q["out"])
        starts = np.cumsum([0] + [d for _, d in steps])[:-1] + queued
        n_pf = sum(1 for kind, _ in steps if kind == "prefill")
        if not q["rec"]["ttft_ms"] or first_other <= starts[n_pf - 1]:
            continue
        ttft = q["qt"] + sum(d for _, d in steps[:n_pf]) + a2
        item = {
            "id": q["rec"]["requestID"],
            "ttft_us": ttft,
            "ref_ttft_us": round(q["rec"]["ttft_ms"] * 1000),
            "sched_us": q["qt"],
            "ref_sched_us": round(q["rec"]["scheduling_delay_ms"] * 1000),
            "e2e_us": None,
            "ref_e2e_us": round(q["rec"]["e2e_ms"] * 1000),
        }
        if q["rec"]["e2e_ms"] and first_other > starts[-1]:
            item["e2e_us"] = (
                ttft + sum(d + a2 for _, d in steps[n_pf:]) + (post if q["out"] > 0 else 0)
            )
        found.append(item)
    return found
