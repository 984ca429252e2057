"""pytest-benchmark timings of the bench cases, in-process through ``blis_fast.run`` (warm).

Excluded from the default test run (``addopts`` deselects the ``bench`` marker); run with::

    python -m pytest bench -m bench

Each test first runs its case once untimed (kernels loaded from the Numba cache, or compiled),
then times ``rounds`` runs. The assertions use the median of our own ``perf_counter`` timings,
so they also hold under ``--benchmark-disable``. Peak RSS of case (c) is measured on a separate
``blis run`` process (``os.wait4``'s ``ru_maxrss``), since the in-process peak would include this
pytest process.
"""

from __future__ import annotations

import statistics
import time

import pytest
from run_bench import CASES, MB, QUICKSTART_STDOUT, find_blis, run_blis

import blis_fast

pytestmark = pytest.mark.bench

ROUNDS = 3


def _kwargs(args: list[str]) -> dict[str, str]:
    """CLI args (``--flag value`` pairs) as ``blis_fast.run`` keyword arguments."""
    assert len(args) % 2 == 0, args
    return {args[i][2:].replace("-", "_"): args[i + 1] for i in range(0, len(args), 2)}


def _bench(benchmark, key: str) -> tuple[float, object]:
    """Warm up, then time ``ROUNDS`` in-process runs of case ``key``; median seconds, last result."""
    kwargs = _kwargs(CASES[key].args)
    blis_fast.run(**kwargs)  # warm-up: kernels in memory, data files read once
    times: list[float] = []
    last: list[object] = []

    def once():
        start = time.perf_counter()
        result = blis_fast.run(**kwargs)
        times.append(time.perf_counter() - start)
        last[:] = [result]
        return result

    benchmark.extra_info["case"] = key
    benchmark.extra_info["args"] = " ".join(CASES[key].args)
    benchmark.pedantic(once, rounds=ROUNDS, iterations=1, warmup_rounds=0)
    median = statistics.median(times)
    benchmark.extra_info["median_wall_s"] = median
    return median, last[0]


def test_a_quickstart_warm(benchmark):
    median, result = _bench(benchmark, "a")
    if QUICKSTART_STDOUT.is_file():
        assert result.stdout == QUICKSTART_STDOUT.read_text()
    target = CASES["a"].max_wall_s
    assert median < target, f"quick start median {median:.3f} s, target < {target} s"


def test_b_10k_4_instances(benchmark):
    median, result = _bench(benchmark, "b")
    assert result.summary["injected_requests"] == 10000


def test_c_100k_16_instances(benchmark):
    median, result = _bench(benchmark, "c")
    assert result.summary["injected_requests"] == 100000
    target = CASES["c"].max_wall_s
    assert median < target, f"100k/16-instance median {median:.3f} s, target < {target} s"


def test_c_100k_16_instances_peak_rss(tmp_path):
    case = CASES["c"]
    blis = find_blis()
    warm = run_blis(blis, case.args, cwd=tmp_path, timeout_s=case.timeout_s)  # fills the cache
    assert warm.exit_code == 0, warm.stderr[-2000:]
    run = run_blis(blis, case.args, cwd=tmp_path, timeout_s=case.timeout_s)
    assert run.exit_code == 0, run.stderr[-2000:]
    peak_mb = run.peak_rss_bytes / MB
    assert peak_mb < case.max_rss_mb, f"peak RSS {peak_mb:.0f} MB, target < {case.max_rss_mb} MB"


def test_sweep_1000_configs_two_workers(tmp_path):
    """1,000 configurations (1,000 requests, 4 instances each) with --workers 2 in under 60 s,
    every metric present (``bench/sweep_bench.py``)."""
    import sweep_bench

    run = sweep_bench.run_once(tmp_path, find_blis())
    assert run.rows == sweep_bench.NUM_CONFIGS
    assert run.errors == 0
    assert run.null_metrics == 0
    assert run.wall_s < sweep_bench.MAX_WALL_S, f"sweep took {run.wall_s:.1f} s"


def test_evolve_default_benchmark_evaluation_warm():
    """One evaluation of the default evolution benchmark (3 workloads x 2 seeds, 2,000
    requests each) takes <= 2 s warm, in-process and contained (``bench/evolve_bench.py``)."""
    import evolve_bench

    for name, values in evolve_bench.measure(3).items():
        median = statistics.median(values)
        assert median <= evolve_bench.MAX_WARM_S, f"{name}: {median:.2f} s"
