"""Runs that can never finish stop at once with one line (issue 29 item 3).

The reference simulator, given a KV cache too small for the requests it must hold, preempts and
re-admits the same requests (or takes empty steps) until it is killed; blis_fast used to do the
same while its step log grew without bound. Each kind found by the differential runs is run
here as ``blis run`` in a subprocess under a memory limit: it must end within 10 s with exit
code 2, one ``blis: error`` line naming ``--total-kv-blocks``, no traceback, no output file,
and a peak resident memory under 1 GB. The rules that stop them are proven (see
``kernels/engine/event_loop.py: _never_finishes``, ``step.py: skip_idle_steps``,
``kernels/engine/livelock.py``); the property test checks that runs which do finish are never
stopped, and the in-process tests that a deadline or a horizon keeps a run going.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import blis_fast
from blis_fast.errors import BlisConfigError
from blis_fast.kernels.engine.state import InstanceCounter

MODEL = ["--model", "meta-llama/llama-3.1-8b-instruct"]
TINY = [*MODEL, "--latency-model", "blackbox", "--num-requests", "5", "--rate", "10",
        "--total-kv-blocks", "20", "--prompt-tokens", "200", "--output-tokens", "400",
        "--timeout", "-1"]
PD_SHARED = [*MODEL, "--num-requests", "100", "--rate", "100", "--num-instances", "1",
             "--prefill-decode-instances", "1", "--pd-decider", "always", "--output-tokens",
             "100", "--timeout", "-1"]
LIVELOCKS = {
    # request_0 needs 69 blocks (2 + 1096 tokens) of 20: preempted and re-admitted forever
    "plain tiny KV": (TINY, "request request_0 needs 69 KV blocks to finish but instance_0 has 20"),
    "tiny KV with a CPU tier": ([*TINY, "--kv-cpu-blocks", "40"],
                                "request request_0 needs 69 KV blocks"),
    # every request fits alone, but a waiting decode sub-request's reservation (10 of 20
    # blocks) starves the two that thrash ahead of it in the queue: a cycle of states
    "P/D shared pod, decode reservations starve the running requests": (
        [*PD_SHARED, "--total-kv-blocks", "20", "--prompt-tokens", "100"],
        "keeps preempting and re-admitting the same requests"),
    # three such pods (17 of 200 complete by 50 s and by 500 s): every stepping pod must be
    # proven to cycle before the run stops
    "three P/D shared pods thrashing": (
        [*MODEL, "--num-requests", "200", "--rate", "100", "--num-instances", "3",
         "--prefill-decode-instances", "3", "--pd-decider", "always", "--output-tokens", "100",
         "--timeout", "-1", "--total-kv-blocks", "20", "--prompt-tokens", "100"],
        "keeps preempting and re-admitting the same requests"),
    # the pod's KV is all reserved for queued decode sub-requests: empty steps forever
    "P/D shared pod, queue stuck behind reservations": (
        [*PD_SHARED, "--total-kv-blocks", "30", "--prompt-tokens", "250"],
        "waits for KV blocks that nothing will ever free"),
}
GIB = 1 << 30


def _run_limited(args: list[str], cwd) -> tuple[int, str, float, int]:
    """``blis run ARGS`` in a subprocess (address space capped at 6 GiB, killed after 120 s):
    exit code, stderr, wall seconds and peak resident memory in bytes of the run's own process
    (``RUSAGE_SELF`` at exit: the rusage ``wait4`` returns also holds the peak of any process
    the run reaped, such as a cold start's background compile)."""

    def limits() -> None:
        hard = resource.getrlimit(resource.RLIMIT_AS)[1]
        cap = 6 * GIB if hard == resource.RLIM_INFINITY else min(6 * GIB, hard)
        resource.setrlimit(resource.RLIMIT_AS, (cap, hard))

    rss_path = cwd / "maxrss.txt"
    code = ("import atexit, resource, sys; from blis_fast.cli import console_main; "
            f"atexit.register(lambda: open({str(rss_path)!r}, 'w').write("
            "str(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss))); "
            "sys.argv[0] = 'blis'; console_main()")
    err_path = cwd / "stderr.txt"
    with open(err_path, "wb") as err:
        started = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-c", code, "run", *args], cwd=cwd,
                                stdout=subprocess.DEVNULL, stderr=err, preexec_fn=limits)
        killer = threading.Timer(120, proc.kill)
        killer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            killer.cancel()
        wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    # killed (the timer) or crashed before its exit handlers: wait4's figure
    peak_kib = int(rss_path.read_text()) if rss_path.exists() else usage.ru_maxrss
    return proc.returncode, err_path.read_text(), wall, peak_kib * 1024


def _kernel_cache() -> dict[str, int]:
    """Numba's on-disk cache of the package's kernels: index file -> modification time."""
    root = Path(blis_fast.__file__).parent
    return {str(p): p.stat().st_mtime_ns for p in root.rglob("__pycache__/*.nbi")}


@pytest.mark.parametrize("kind", list(LIVELOCKS))
def test_livelocked_run_stops_with_one_line(kind, tmp_path):
    args, reason = LIVELOCKS[kind]
    out = tmp_path / "metrics.json"
    cache = _kernel_cache()
    rc, err, wall, peak = _run_limited([*args, "--metrics-path", str(out)], tmp_path)
    if "compiling the simulation kernels" in err or _kernel_cache() != cache:
        # the run compiled kernels (announced, or a part the cache lacked; LLVM's memory
        # counts in its peak): time and measure the warm run
        rc, err, wall, peak = _run_limited([*args, "--metrics-path", str(out)], tmp_path)
    errors = [line for line in err.splitlines() if line.startswith("blis: error:")]
    assert rc == 2, err[-2000:]
    assert "Traceback" not in err
    assert len(errors) == 1 and errors[0] == err.splitlines()[-1]
    assert errors[0].startswith("blis: error: --total-kv-blocks: the run can never finish: ")
    assert reason in errors[0]
    assert "--max-model-len" in errors[0]
    assert not out.exists()
    assert wall < 10.0, f"{kind}: {wall:.1f} s"
    assert peak < GIB, f"{kind}: peak RSS {peak / 2**20:.0f} MiB"


def _args(argv: list[str]) -> dict:
    """blis_fast.run keywords from CLI arguments."""
    return {argv[k][2:].replace("-", "_"): argv[k + 1] for k in range(0, len(argv), 2)}


def test_cpu_tier_thrash_that_never_ends():
    """With a CPU tier, two requests that each fit the 14-block cache alone (93 and 107
    tokens) preempt each other forever after 2 of 16 complete: with a 50 s horizon and a
    500 s one the same 2 complete while the preemptions grow tenfold; with no horizon the cycle
    detector stops the run."""
    kw = dict(model=MODEL[1], latency_model="blackbox", num_requests=16, rate=50.0,
              block_size_in_tokens=8, **_lengths(35, 50), total_kv_blocks=14,
              max_model_len=112, timeout=-1, seed=16, kv_cpu_blocks=64,
              kv_transfer_bandwidth=100.0, log="error")
    kw |= dict(prompt_tokens_stdev=17, prompt_tokens_max=71, output_tokens_stdev=25,
               output_tokens_max=101)
    short = blis_fast.run(horizon=50_000_000, **kw).summary
    long = blis_fast.run(horizon=500_000_000, **kw).summary
    assert short["completed_requests"] == long["completed_requests"] == 2
    assert long["preemption_count"] > 9 * short["preemption_count"] > 0
    with pytest.raises(BlisConfigError, match="keeps preempting and re-admitting the same"):
        blis_fast.run(**kw)


def _lengths(prompt: int, output: int) -> dict:
    """Length flags of a distribution around ``prompt`` and ``output`` tokens."""
    return dict(prompt_tokens=prompt, prompt_tokens_stdev=max(1, prompt // 2),
                prompt_tokens_min=1, prompt_tokens_max=2 * prompt + 1, output_tokens=output,
                output_tokens_stdev=max(1, output // 2), output_tokens_min=1,
                output_tokens_max=2 * output + 1)


def _numbers(kw: dict) -> dict:
    return {k: (int(v) if v.lstrip("-").isdigit() else v) for k, v in kw.items()}


def test_a_deadline_or_a_horizon_ends_the_run():
    """The doomed request of the tiny-KV run leaves by timing out, or the horizon ends the
    run: the reference finishes both, so must blis_fast."""
    kw = _numbers(_args(TINY)) | {"log": "error"}
    timed = blis_fast.run(**(kw | {"timeout": 300}))
    assert timed.summary["completed_requests"] == 0
    assert timed.summary["timed_out_requests"] == 3
    assert timed.summary["preemption_count"] > 100
    bounded = blis_fast.run(**(kw | {"horizon": 20_000_000}))
    assert bounded.summary["completed_requests"] == 0
    assert bounded.summary["preemption_count"] > 50  # 20 s of the same requests thrashing
    with pytest.raises(BlisConfigError, match="the run can never finish"):
        blis_fast.run(**kw)


thrashed: list[bool] = []


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(2, 24), instances=st.integers(1, 2), rate=st.sampled_from([50.0, 500.0]),
       prompt=st.integers(1, 200), output=st.integers(30, 400), block=st.sampled_from([8, 16]),
       slack=st.integers(0, 12), scheduler=st.sampled_from(["fcfs", "sjf", "priority-fcfs"]),
       seed=st.integers(0, 99))
def test_runs_that_finish_are_never_stopped(n, instances, rate, prompt, output, block, slack,
                                            scheduler, seed):
    """Without P/D or a CPU tier, a request that fits its instance alone always finishes: the
    batch's head is never preempted by another request and gains tokens every step. With
    --max-model-len a block short of the cache every request fits alone, yet with a small cache
    the requests thrash (preemptions): no run may be stopped, and every request must end.
    (With a CPU tier that is not so: ``test_cpu_tier_thrash_that_never_ends``.)"""
    blocks = 4 + slack
    res = blis_fast.run(
        model=MODEL[1], latency_model="blackbox", num_requests=n, num_instances=instances,
        rate=rate, block_size_in_tokens=block, **_lengths(prompt, output),
        total_kv_blocks=blocks, max_model_len=blocks * block, timeout=-1, seed=seed,
        scheduler=scheduler, log="error")
    s = res.summary
    thrashed.append(s["preemption_count"] > 0)
    assert s["still_queued"] == 0 and s["still_running"] == 0
    assert (s["completed_requests"] + s["dropped_unservable"] + s["timed_out_requests"]
            == s["injected_requests"])


def test_the_finishing_runs_thrashed():
    """A good share of the property test's runs preempted (the rules met pressure)."""
    if not thrashed:
        pytest.skip("runs only after test_runs_that_finish_are_never_stopped")
    assert sum(thrashed) >= len(thrashed) // 4, thrashed


@settings(max_examples=8, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 30), pods=st.integers(1, 3), prompt=st.integers(1, 300),
       output=st.integers(1, 200), seed=st.integers(0, 99))
def test_pd_runs_with_room_are_never_stopped(n, pods, prompt, output, seed):
    """P/D shared pods with KV for every request at once (no pressure) always finish."""
    res = blis_fast.run(
        model=MODEL[1], num_requests=n, num_instances=pods, prefill_decode_instances=pods,
        pd_decider="always", rate=100.0, **_lengths(prompt, output),
        total_kv_blocks=5 * n * (prompt + output) // 16 + 64, timeout=-1, seed=seed,
        log="error")
    assert res.summary["completed_requests"] == n


def test_growth_past_the_memory_available_stops_with_one_line(monkeypatch):
    """A step log (or event heap) that would grow past the memory available stops the run
    with one line naming what to change, before the system kills it."""
    from blis_fast.engine import simulate
    from blis_fast.kernels.engine.state import new_instance_arrays, new_step_log

    ins = new_instance_arrays(2, 4)
    ins.cnt[:, InstanceCounter.PREEMPTIONS] = (700, 300)
    ins.cnt[:, InstanceCounter.COMPLETED] = (2, 1)
    lg = new_step_log(1024, 1024)
    monkeypatch.setattr(simulate, "available_memory", lambda: 3 * GIB)
    simulate._check_growth(3 * GIB, ins, lg)  # fits: nothing happens
    with pytest.raises(BlisConfigError) as caught:
        simulate._check_growth(3 * GIB + 1, ins, lg)
    assert str(caught.value) == (
        "--horizon: the run's step log outgrew the memory available (0 steps, 1000 preemptions "
        "and 3 completions so far; 3.0 GiB needed, 3.0 GiB available): give the KV cache more "
        "blocks (--total-kv-blocks; preemptions outnumber completions)")
