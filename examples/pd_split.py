"""Which prefill:decode split of a fixed GPU budget serves the most requests within an SLO?

For a budget of B single-GPU instances, runs every split P prefill + (B - P) decode
instances (every request disaggregated) and the ordinary B-instance cluster, and counts the
*goodput*: requests that completed with TTFT <= --ttft-slo ms and mean ITL <= --itl-slo ms,
per second of simulated time and per GPU. The counts come from requests.parquet's
``pd_outcome`` column, not from the latency distributions: the reference projects dropped and
timed-out disaggregated requests as if completed (README, known reference behaviour), so only
``completed`` (and ``local``) rows count. Prints a table and the best split; ``--plot`` draws
goodput per GPU against the split.

    python examples/pd_split.py [--budget 8] [--rate 300] [--num-requests 4000]
        [--ttft-slo 200] [--itl-slo 25] [--plot pd-split.png]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import polars as pl

import blis_fast

MODEL = "meta-llama/llama-3.1-8b-instruct"


def goodput(budget: int, prefill: int | None, rate: float, num_requests: int,
            ttft_slo_ms: float, itl_slo_ms: float) -> dict:
    """One configuration's goodput per GPU (``prefill`` None: the ordinary cluster)."""
    options = {"model": MODEL, "num_instances": budget, "rate": rate,
               "num_requests": num_requests, "routing_policy": "least-loaded", "log": "error"}
    if prefill is not None:
        options.update(prefill_instances=prefill, decode_instances=budget - prefill,
                       pd_decider="always")
    with tempfile.TemporaryDirectory() as out:
        res = blis_fast.run(output_dir=out, **options)
        df = pl.read_parquet(Path(out) / "requests.parquet")
    done = df.filter(pl.col("completed"))
    if prefill is not None:
        done = done.filter(pl.col("pd_outcome").is_in(["completed", "local"]))
    good = done.filter((pl.col("ttft_ms") <= ttft_slo_ms) & (pl.col("itl_ms") <= itl_slo_ms))
    seconds = res.summary["vllm_estimated_duration_s"]
    per_gpu = good.height / seconds / budget if seconds > 0 else 0.0
    return {"split": "ordinary" if prefill is None else f"{prefill}P+{budget - prefill}D",
            "prefill": prefill, "completed": done.height, "within_slo": good.height,
            "goodput_per_gpu": per_gpu}


def sweep_splits(budget: int = 8, rate: float = 300.0, num_requests: int = 4000,
                 ttft_slo_ms: float = 200.0, itl_slo_ms: float = 25.0) -> pl.DataFrame:
    """Every split of the budget, then the ordinary cluster, as one table."""
    rows = [goodput(budget, p, rate, num_requests, ttft_slo_ms, itl_slo_ms)
            for p in range(1, budget)]
    rows.append(goodput(budget, None, rate, num_requests, ttft_slo_ms, itl_slo_ms))
    return pl.DataFrame(rows)


def plot(table: pl.DataFrame, path: str) -> None:
    """Goodput per GPU against the number of prefill instances (the ordinary cluster dashed)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    splits = table.filter(pl.col("prefill").is_not_null())
    ordinary = table.filter(pl.col("prefill").is_null())["goodput_per_gpu"][0]
    fig = Figure(figsize=(6, 4))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.plot(splits["prefill"], splits["goodput_per_gpu"], marker="o", label="P/D split")
    ax.axhline(ordinary, linestyle="--", color="grey", label="ordinary cluster")
    ax.set_xlabel("prefill instances (the rest decode)")
    ax.set_ylabel("goodput (requests/s per GPU within SLO)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)


def main(argv: list[str] | None = None) -> pl.DataFrame:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=int, default=8)
    ap.add_argument("--rate", type=float, default=300.0)
    ap.add_argument("--num-requests", type=int, default=4000)
    ap.add_argument("--ttft-slo", type=float, default=200.0, help="ms")
    ap.add_argument("--itl-slo", type=float, default=25.0, help="ms")
    ap.add_argument("--plot", default="")
    args = ap.parse_args(argv)
    table = sweep_splits(args.budget, args.rate, args.num_requests, args.ttft_slo, args.itl_slo)
    with pl.Config(tbl_rows=-1):
        print(table)
    best = table.sort("goodput_per_gpu", descending=True).row(0, named=True)
    print(f"best: {best['split']} ({best['goodput_per_gpu']:.3f} requests/s per GPU within SLO)")
    if args.plot:
        plot(table, args.plot)
    return table


if __name__ == "__main__":
    main()
