"""Three questions a capacity planner asks of a sweep, answered with polars.

Run the sweep of ``examples/sweep.yaml`` first, then point this script at its directory::

    blis sweep examples/sweep.yaml --out sweep-out
    python examples/sweep_questions.py sweep-out [--slo-ttft-p99-ms 200]
"""

from __future__ import annotations

import argparse

import polars as pl


def load(out_dir: str) -> pl.DataFrame:
    """The sweep's rows that ran (one per configuration)."""
    rows = pl.read_parquet(f"{out_dir}/summary/*.parquet")
    return rows.filter(pl.col("error").is_null())


def best_policy_per_rate(rows: pl.DataFrame) -> pl.DataFrame:
    """Q1: which routing policy has the lowest p99 TTFT (mean over seeds) at each load?"""
    per_policy = (rows.group_by("num_instances", "rate", "routing_policy")
                  .agg(pl.col("ttft_p99_ms").mean()))
    return (per_policy.sort("ttft_p99_ms")
            .group_by("num_instances", "rate", maintain_order=True).first()
            .sort("num_instances", "rate"))


def throughput_at_highest_rate(rows: pl.DataFrame) -> pl.DataFrame:
    """Q2: completed requests and output tokens per second at the highest offered rate."""
    top = rows.filter(pl.col("rate") == pl.col("rate").max())
    return (top.group_by("num_instances", "routing_policy")
            .agg(pl.col("rate").first(), pl.col("responses_per_sec").mean(),
                 pl.col("tokens_per_sec").mean())
            .sort("num_instances", "routing_policy"))


def slo_attainment(rows: pl.DataFrame, ttft_p99_ms: float) -> pl.DataFrame:
    """Q3: share of seeds meeting the SLO at each rate, and the highest rate all of them meet."""
    met = rows.with_columns((pl.col("ttft_p99_ms") <= ttft_p99_ms).alias("slo_met"))
    share = (met.group_by("num_instances", "routing_policy", "rate")
             .agg(pl.col("slo_met").mean().alias("share_met")))
    best = (share.filter(pl.col("share_met") == 1.0)
            .group_by("num_instances", "routing_policy")
            .agg(pl.col("rate").max().alias("max_rate_meeting_slo")))
    return (share.pivot("rate", index=["num_instances", "routing_policy"], values="share_met",
                        sort_columns=True)
            .join(best, on=["num_instances", "routing_policy"], how="left")
            .sort("num_instances", "routing_policy"))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--slo-ttft-p99-ms", type=float, default=200.0)
    args = parser.parse_args(argv)
    rows = load(args.out_dir)
    with pl.Config(tbl_rows=-1, tbl_cols=-1, tbl_width_chars=160):
        print("Q1 best routing policy by p99 TTFT at each rate:")
        print(best_policy_per_rate(rows))
        print("\nQ2 throughput at the highest rate:")
        print(throughput_at_highest_rate(rows))
        print(f"\nQ3 share of seeds with ttft_p99_ms <= {args.slo_ttft_p99_ms:g}, per rate:")
        print(slo_attainment(rows, args.slo_ttft_p99_ms))


if __name__ == "__main__":
    main()
