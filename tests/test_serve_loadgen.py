"""A load generator people run against vLLM, run against ``blis serve`` (issue 33, "Real
clients"): NVIDIA's ``aiperf`` (PyPI), installed once into its own cached environment
``~/.cache/blis_fast/aiperf-venv`` (built in place, never renamed: its console scripts name
the venv's python by path), with a small word-level tokenizer the test writes (aiperf needs
one to make prompts; nothing is downloaded from a model hub).

aiperf streams completions into a two-instance fleet at ``--speed 0.1`` (ten times slower than
real time, so a simulated TTFT of 50 ms takes 500 ms of wall time and the client's own
overhead, about 10 ms here, is small beside it), with ``--use-server-token-count`` (our
filler words are not its tokenizer's tokens). Its reported TTFT and ITL medians, times the
speed, must agree with the simulation's (the served trace's TTFT and per-request mean ITL)
within 5 %. The Prometheus scrape aiperf makes of ``/metrics`` parses, and the request
counter equals the requests served.

Marker ``realserver`` (left out of the default run, run by ``.ci/run`` after it): the first
run installs aiperf (about 140 packages, a few minutes); where that is impossible the test
says so in one line and skips.
"""

from __future__ import annotations

import csv
import json
import statistics
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from blis_fast.testing.serve_child import start_serve
from blis_fast.testing.vllm_server import _cache_lock, cache_root

pytestmark = pytest.mark.realserver

AIPERF = "aiperf==0.13.0"
MODEL = "qwen/qwen3-14b"
SPEED = 0.1
REQUESTS = 12

_TOKENIZER = """
import json, sys
from pathlib import Path
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
words = ["<unk>", "<s>", "</s>"] + [f"w{i}" for i in range(2000)]
tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
tok.decoder = decoders.WordPiece(prefix="##")
tok.save(str(out / "tokenizer.json"))
(out / "tokenizer_config.json").write_text(json.dumps({
    "tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "<unk>", "bos_token": "<s>",
    "eos_token": "</s>", "model_max_length": 1000000}))
"""


def _aiperf() -> tuple[Path, Path]:
    """aiperf's executable and the tokenizer folder, built once (skips if impossible)."""
    root = cache_root()
    venv, tok = root / "aiperf-venv", root / "aiperf-tokenizer"
    ready = venv / ".blis-ready"
    with _cache_lock(root):
        if not ready.is_file() or ready.read_text().strip() != AIPERF:
            print(f"installing {AIPERF} into {venv} (once)", file=sys.stderr)
            steps = [[sys.executable, "-m", "venv", "--clear", str(venv)],
                     [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", AIPERF]]
            for cmd in steps:
                res = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
                if res.returncode != 0:
                    tail = (res.stdout.strip().splitlines() or ["(no output)"])[-1]
                    pytest.skip(f"cannot install {AIPERF}: {tail}")
            ready.write_text(AIPERF + "\n")
        if not (tok / "tokenizer.json").is_file():
            subprocess.run([str(venv / "bin" / "python"), "-c", _TOKENIZER, str(tok)],
                           check=True)
    return venv / "bin" / "aiperf", tok


def test_aiperf_medians_agree_with_the_simulation(tmp_path):
    aiperf, tokenizer = _aiperf()
    prefix = str(tmp_path / "served")
    with start_serve(["--model", MODEL, "--num-instances", "2", "--port", "0", "--speed",
                      str(SPEED), "--log", "error", "--trace-output", prefix]) as server:
        base = server.url
        run = subprocess.run(
            [str(aiperf), "profile", "--model", MODEL, "--url", base, "--endpoint-type",
             "completions", "--streaming", "--use-server-token-count", "--tokenizer",
             str(tokenizer), "--request-count", str(REQUESTS), "--concurrency", "2",
             "--prompt-input-tokens-mean", "2000", "--prompt-input-tokens-stddev", "0",
             "--prompt-output-tokens-mean", "12", "--prompt-output-tokens-stddev", "0",
             "--extra-inputs", "ignore_eos:true", "--random-seed", "7",
             "--output-artifact-dir", str(tmp_path / "aiperf")],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600,
            cwd=tmp_path)
        assert run.returncode == 0, run.stdout[-2000:]
        with urllib.request.urlopen(base + "/metrics", timeout=30) as resp:
            text = resp.read().decode()
        code, rest = server.interrupt()
    assert code == 0, rest
    report = json.loads((tmp_path / "aiperf" / "profile_export_aiperf.json").read_text())
    with open(prefix + ".csv") as fh:
        rows = [r for r in csv.DictReader(fh) if int(r["output_tokens"]) > 1]
    served = [r for r in rows if r["status"] == "ok"]
    sim_ttft = statistics.median((int(r["first_chunk_time_us"]) - int(r["arrival_time_us"]))
                                 / 1e3 for r in served)
    sim_itl = statistics.median((int(r["last_chunk_time_us"]) - int(r["first_chunk_time_us"]))
                                / 1e3 / (int(r["output_tokens"]) - 1) for r in served)
    ttft = report["time_to_first_token"]["p50"] * SPEED
    itl = report["inter_token_latency"]["p50"] * SPEED
    print(f"TTFT median: aiperf {ttft:.3f} ms, simulation {sim_ttft:.3f} ms; ITL median: "
          f"aiperf {itl:.3f} ms, simulation {sim_itl:.3f} ms (simulated milliseconds)")
    assert ttft == pytest.approx(sim_ttft, rel=0.05)
    assert itl == pytest.approx(sim_itl, rel=0.05)
    success = sum(s.value for f in text_string_to_metric_families(text)
                  if f.name == "vllm:request_success" for s in f.samples)
    assert success == len(served) >= REQUESTS
