"""``blis plot``: the PNG has the asked pixel size and the plotted series are the data.

The data is a hand-made sweep directory (summary rows with seeds to average and a failed row
to leave out; per-request partitions), so the expected series are known exactly.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from _sweep import invoke

from blis_fast.errors import BlisInputError
from blis_fast.sweep.plot import load_requests, load_summary, plot_cdf, plot_lines


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR"
    return struct.unpack(">II", head[16:24])


@pytest.fixture
def sweep_dir(tmp_path) -> Path:
    """Summary: 2 instance counts x 2 policies x rates 10/20/30 x seeds 1/2, plus a failed row;
    requests: 3 configurations with known TTFTs."""
    rows = []
    for n in (2, 4):
        for pol in ("least-loaded", "round-robin"):
            for rate in (30.0, 10.0, 20.0):  # not in x order: the plot sorts
                for seed in (1, 2):
                    ttft = rate * (2 if pol == "round-robin" else 1) / n + seed
                    rows.append({"num_instances": n, "routing_policy": pol, "rate": rate,
                                 "seed": seed, "ttft_p99_ms": ttft, "error": None})
    rows.append({"num_instances": 2, "routing_policy": "round-robin", "rate": 20.0, "seed": 3,
                 "ttft_p99_ms": None, "error": "BlisRuntimeError: boom"})
    frame = pl.DataFrame(rows).with_row_index("i").select(
        pl.format("{}-cfg", pl.col("i").cast(pl.String).str.zfill(6)).alias("config_id"),
        pl.exclude("i"))
    (tmp_path / "summary").mkdir()
    frame[:10].write_parquet(tmp_path / "summary" / "part-a.parquet")
    frame[10:].write_parquet(tmp_path / "summary" / "part-b.parquet")
    for cid, ttfts in (("000000-cfg", [5.0, 1.0, 3.0]), ("000006-cfg", [2.0, 8.0]),
                       ("000001-cfg", [4.0, None])):
        part = tmp_path / "requests" / f"config_id={cid}"
        part.mkdir(parents=True)
        pl.DataFrame({"request_id": [f"request_{i}" for i in range(len(ttfts))],
                      "ttft_ms": ttfts}).write_parquet(part / "requests.parquet")
    return tmp_path


def test_lines_are_the_seed_means_per_policy_and_facet(sweep_dir):
    result = plot_lines(load_summary(sweep_dir), "rate", "ttft_p99_ms", by="routing_policy",
                        facet="num_instances")
    expected = {}
    for n in (2, 4):
        for pol in ("least-loaded", "round-robin"):
            xs = np.array([10.0, 20.0, 30.0])
            expected[f"num_instances={n}, routing_policy={pol}"] = (
                xs, xs * (2 if pol == "round-robin" else 1) / n + 1.5)
    assert list(result.series) == list(expected)
    for name, (xs, ys) in expected.items():
        np.testing.assert_array_equal(result.series[name][0], xs)
        np.testing.assert_allclose(result.series[name][1], ys, rtol=1e-15)
    # what is drawn is the returned series: panel per instance count, line per policy
    panels = [ax for ax in result.figure.axes if ax.get_visible()]
    assert [ax.get_title() for ax in panels] == ["num_instances=2", "num_instances=4"]
    drawn = [line.get_xydata() for ax in panels for line in ax.lines]
    for xy, (xs, ys) in zip(drawn, result.series.values(), strict=True):
        np.testing.assert_array_equal(xy, np.column_stack([xs, ys]))


def test_cli_png_has_the_asked_pixel_size(sweep_dir, tmp_path):
    out = tmp_path / "p.png"
    run = invoke(["plot", str(sweep_dir), "--x", "rate", "--y", "ttft_p99_ms", "--by",
                  "routing_policy", "-o", str(out)])
    assert run.code == 0, run.stderr
    assert run.stdout == f"{out}: 2 series\n"
    assert png_size(out) == (800, 500)
    small = tmp_path / "small.png"
    run = invoke(["plot", str(sweep_dir), "--x", "rate", "--y", "ttft_p99_ms", "--where",
                  "num_instances=4", "--where", "routing_policy=round-robin", "--width", "6",
                  "--height", "4", "--dpi", "50", "--logy", "-o", str(small)])
    assert run.code == 0, run.stderr
    assert png_size(small) == (300, 200)


def test_where_keeps_matching_rows_only(sweep_dir):
    from blis_fast.sweep.plot import filter_rows

    frame = filter_rows(load_summary(sweep_dir), ["num_instances=4", "rate=20"])
    assert frame.height == 4 and set(frame["num_instances"]) == {4}
    result = plot_lines(frame, "rate", "ttft_p99_ms", by="routing_policy")
    assert {k: v[1].tolist() for k, v in result.series.items()} == {
        "routing_policy=least-loaded": [6.5], "routing_policy=round-robin": [11.5]}


def test_cdf_from_sweep_requests_joined_with_the_configuration(sweep_dir, tmp_path):
    requests = load_requests(sweep_dir)
    assert requests.height == 7 and "routing_policy" in requests.columns
    result = plot_cdf(requests, "ttft_ms", by="routing_policy")
    # configs 0 and 1 are least-loaded (the null TTFT of config 1 is left out), 6 round-robin
    xs, ys = result.series["routing_policy=least-loaded"]
    np.testing.assert_array_equal(xs, [1.0, 3.0, 4.0, 5.0])
    np.testing.assert_array_equal(ys, [0.25, 0.5, 0.75, 1.0])
    xs, ys = result.series["routing_policy=round-robin"]
    np.testing.assert_array_equal(xs, [2.0, 8.0])
    np.testing.assert_array_equal(ys, [0.5, 1.0])
    out = tmp_path / "cdf.png"
    run = invoke(["plot", str(sweep_dir), "--cdf", "ttft_ms", "--by", "rate", "-o", str(out)])
    assert run.code == 0, run.stderr
    assert png_size(out) == (800, 500)


def test_cdf_of_a_single_requests_file(sweep_dir):
    path = sweep_dir / "requests" / "config_id=000000-cfg" / "requests.parquet"
    result = plot_cdf(load_requests(path), "ttft_ms")
    xs, ys = result.series["ttft_ms"]
    np.testing.assert_array_equal(xs, [1.0, 3.0, 5.0])
    np.testing.assert_array_equal(ys, [1 / 3, 2 / 3, 1.0])


@pytest.mark.parametrize(("args", "word"), [
    (["--x", "rate", "--y", "ttft_p999_ms"], "'ttft_p999_ms'"),
    (["--x", "rate", "--y", "ttft_p99_ms", "--by", "policy"], "'policy'"),
    (["--x", "rate"], "--y"),
    (["--cdf", "ttft_ms", "--x", "rate"], "--cdf"),
    (["--x", "rate", "--y", "ttft_p99_ms", "--where", "rate~20"], "--where"),
    (["--x", "rate", "--y", "ttft_p99_ms", "--dpi", "0"], "--dpi"),
], ids=["y", "by", "no-y", "cdf-and-x", "where", "dpi"])
def test_bad_plot_request_is_one_line_exit_2_and_no_file(sweep_dir, tmp_path, args, word):
    out = tmp_path / "bad.png"
    run = invoke(["plot", str(sweep_dir), *args, "-o", str(out)])
    assert run.code == 2 and "Traceback" not in run.stderr
    assert run.stderr.count("\n") == 1 and word in run.stderr, run
    assert not out.exists()


def test_plot_of_a_directory_without_a_sweep_is_refused(tmp_path):
    run = invoke(["plot", str(tmp_path), "--x", "rate", "--y", "ttft_p99_ms", "-o",
                  str(tmp_path / "x.png")])
    assert run.code == 2 and "no sweep summary" in run.stderr
    run = invoke(["plot", str(tmp_path), "--cdf", "ttft_ms", "-o", str(tmp_path / "x.png")])
    assert run.code == 2 and "--requests" in run.stderr


def test_logx_draws_a_base_2_axis_and_refuses_values_not_above_zero(sweep_dir):
    frame = load_summary(sweep_dir)
    result = plot_lines(frame, "rate", "ttft_p99_ms", by="routing_policy", logx=True)
    axis = result.figure.axes[0]
    assert axis.get_xscale() == "log" and axis.get_yscale() == "linear"
    with pytest.raises(BlisInputError, match="--logx: 'rate' has values <= 0"):
        plot_lines(frame.with_columns(pl.col("rate") - 10), "rate", "ttft_p99_ms", logx=True)
