"""``blis serve`` end to end (issue 33, "Fidelity", at the CI speed): the real command in a
child process, the official ``openai`` SDK streaming a small workload into it, Ctrl-C, then
``blis replay`` of the served trace with the same flags.

What must hold exactly: replay gives every request the TTFT and E2E the server aimed at (the
trace's first and last chunk times), to the microsecond. What the client measured on the wall
clock is never earlier than the simulated figure divided by the speed; by how much it is later
is pacing and HTTP overhead, printed here and bounded loosely (a bound near the issue's 2 ms
would fail by chance on a shared 2-core machine; ``bench/serve_bench.py`` measures it).
"""

from __future__ import annotations

import csv
import json
import statistics
import sys
import threading
import time

import pytest
from _cli import invoke

from blis_fast.testing.serve_child import ServeStartError, start_serve

MODEL = "qwen/qwen3-14b"
SPEED = 20.0
FLAGS = ["--model", MODEL, "--num-instances", "2", "--routing-policy", "least-loaded",
         "--log", "error"]
REQUESTS = [(0.0, 60, 24), (0.004, 220, 8), (0.01, 30, 40), (0.011, 500, 16),
            (0.03, 120, 30), (0.05, 80, 12), (0.052, 300, 20), (0.09, 40, 50)]
"""(send offset in wall seconds, prompt words, max_tokens)."""


def _client(base: str, out: list, at: float, words: int, max_tokens: int) -> None:
    import openai

    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
    client.models.list()  # the connection is open before the clock of the request starts
    time.sleep(max(0.0, at - time.monotonic()))
    sent = time.monotonic()
    first = last = None
    chunks = 0
    for chunk in client.completions.create(model=MODEL, prompt="word " * words,
                                           max_tokens=max_tokens, stream=True):
        now = time.monotonic()
        if chunk.choices and chunk.choices[0].text:
            first = first or now
            chunks += 1
        last = now
    out.append((-(-5 * words // 4), first - sent, last - sent, chunks, max_tokens))


def test_served_timings_replay_exactly(tmp_path):
    pytest.importorskip("openai", reason="the openai SDK is a dev dependency")
    prefix = str(tmp_path / "served")
    with start_serve([*FLAGS, "--port", "0", "--speed", str(SPEED), "--trace-output",
                      prefix]) as server:
        base = server.url
        results: list = []
        start = time.monotonic() + 1.0
        threads = [threading.Thread(target=_client, args=(base, results, start + at, w, mt))
                   for at, w, mt in REQUESTS]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        code, rest = server.interrupt()
    assert code == 0, rest
    assert "Traceback" not in rest and "trace written to" in rest
    assert len(results) == len(REQUESTS)
    assert all(chunks == mt for *_, chunks, mt in results)
    res_path = tmp_path / "replay.json"
    res = invoke(["replay", *FLAGS, "--trace-header", prefix + ".yaml", "--trace-data",
                  prefix + ".csv", "--results-path", str(res_path), "--horizon", "10000000000"])
    assert res.code == 0, res.stderr
    replayed = {r["request_id"]: r for r in json.loads(res_path.read_text())}
    with open(prefix + ".csv") as fh:
        served = list(csv.DictReader(fh))
    assert len(served) == len(REQUESTS)
    measured = {r[0]: r for r in results}  # by prompt tokens (the estimate: 5 chars a word)
    assert len(measured) == len(REQUESTS)
    lags = []
    for row in served:
        _, ttft, e2e, _, _ = measured[int(row["input_tokens"])]
        k, arrival = int(row["request_id"]), int(row["arrival_time_us"])
        sim_ttft = int(row["first_chunk_time_us"]) - arrival
        sim_e2e = int(row["last_chunk_time_us"]) - arrival
        assert (sim_ttft, sim_e2e) == (replayed[k]["ttft_us"], replayed[k]["e2e_us"])
        assert ttft >= sim_ttft / 1e6 / SPEED and e2e >= sim_e2e / 1e6 / SPEED
        lags += [ttft - sim_ttft / 1e6 / SPEED, e2e - sim_e2e / 1e6 / SPEED]
    print(f"wall lag behind the simulated instants: median {statistics.median(lags) * 1e3:.2f}"
          f" ms, max {max(lags) * 1e3:.2f} ms")
    assert statistics.median(lags) < 0.1


FAKE_SERVE = """
import signal, sys, time
def stop(*_):
    sys.stderr.write("blis serve: stopped\\n")
    sys.exit(0)
signal.signal(signal.SIGINT, stop)
say = sys.stderr.write
say("blis serve: prompt tokens estimated\\n")
say("blis serve: listening on http://127.0.0.1:1234 (model m, 2 instance(s), speed 1x)\\n")
sys.stderr.flush()
time.sleep(0.2)
say("blis serve: instance 0 on http://127.0.0.1:1235\\n")
sys.stderr.flush()
time.sleep(0.2)
say("blis serve: instance 1 on http://127.0.0.1:1236\\nlater\\n")
sys.stderr.flush()
time.sleep(60)
"""
"""A stand-in for ``blis serve``'s start-up lines: the instance lines come after a pause."""


def test_start_serve_waits_for_every_instance_line_then_hands_over_the_rest():
    with start_serve(["--instance-ports", "0"],
                     python=[sys.executable, "-c", FAKE_SERVE]) as child:
        assert child.url == "http://127.0.0.1:1234"
        assert child.instance_urls == ["http://127.0.0.1:1235", "http://127.0.0.1:1236"]
        assert child.startup.startswith("blis serve: prompt tokens estimated\n")
        code, rest = child.interrupt(10)
    assert code == 0
    assert rest == "later\nblis serve: stopped\n"


def test_start_serve_reports_a_server_that_never_listens():
    with pytest.raises(ServeStartError, match=r"exit 2\) before listening: .*bad flag"):
        start_serve([], python=[sys.executable, "-c",
                                "import sys; sys.stderr.write('bad flag\\n'); sys.exit(2)"])
    started = time.monotonic()
    with pytest.raises(ServeStartError, match="did not listen within 0.5 s"):
        start_serve([], python=[sys.executable, "-c", "import time; time.sleep(60)"],
                    timeout_s=0.5)
    assert time.monotonic() - started < 10  # the silent child was killed, not waited for
