"""``blis_fast.step_time`` and ``blis step-time``: one engine step's time of a given batch.

The public step-time API (issue 27 item 4) must give what the engine itself charges: the
engine's kernel (``kernels.engine.latency.step_time``) over the batch, with the backend's
parameters resolved as ``blis run`` resolves them. The checks compare it with the kernel over
a real run's resolved parameters and with the step durations that run recorded, never with
typed numbers.
"""

from __future__ import annotations

import numpy as np
import pytest
from _cli import invoke

import blis_fast
from blis_fast.data import data_path
from blis_fast.errors import BlisConfigError, BlisInputError
from blis_fast.kernels.engine import latency as K

MODEL = "meta-llama/llama-3.1-8b-instruct"
H100 = dict(model=MODEL, hardware="H100", tp=1, log="error")
INPUT, OUTPUT = 128, 4
ONE_REQUEST = dict(num_requests=1, prompt_tokens=INPUT, prompt_tokens_stdev=INPUT,
                   prompt_tokens_min=INPUT, prompt_tokens_max=INPUT, output_tokens=OUTPUT,
                   output_tokens_stdev=OUTPUT, output_tokens_min=OUTPUT,
                   output_tokens_max=OUTPUT)
"""One request of exactly INPUT prompt and OUTPUT output tokens (the reference's range check
wants the standard deviation inside [min, max]; min = max pins the length)."""
BACKENDS = ("roofline", "trained-physics", "blackbox")


def _kernel(latency, batch) -> int:
    """The engine's step-time kernel over ``batch`` with a run's resolved backend."""
    cols = [np.array([entry[k] for entry in batch], dtype=np.int64) for k in range(4)]
    return int(K.step_time(latency.code, latency.params, len(batch), *cols))


@pytest.fixture(scope="module", params=BACKENDS)
def one_run(request):
    """A run of one request on H100 TP1 with the backend, and the backend's name."""
    result = blis_fast.run(**H100, latency_model=request.param, **ONE_REQUEST)
    table = result.prepared.table
    assert (int(table.input_len[0]), int(table.output_len[0])) == (INPUT, OUTPUT)
    return request.param, result


def test_prefill_step_equals_the_kernel_and_the_runs_first_step(one_run):
    backend, result = one_run
    batch = [(0, INPUT, INPUT, OUTPUT)]
    got = blis_fast.step_time(**H100, latency_model=backend, batch=batch)
    assert isinstance(got, int)
    assert got == _kernel(result.prepared.latency, batch)
    assert got == int(result.simulation.step_duration[0])


def test_decode_steps_equal_the_runs_later_steps(one_run):
    """The first output token comes with the prefill; each later one is a decode step of one
    new token at progress INPUT, INPUT+1, ..."""
    backend, result = one_run
    durations = [int(d) for d in result.simulation.step_duration]
    assert len(durations) == OUTPUT
    decodes = [[(INPUT + k, 1, INPUT, OUTPUT)] for k in range(OUTPUT - 1)]
    assert blis_fast.step_time(**H100, latency_model=backend, batches=decodes) == durations[1:]


def test_ttft_is_queueing_plus_the_first_step_plus_output_token_time(one_run):
    """TTFT as the engine composes it (``step.py: _advance_progress``): the request is queued
    after the backend's queueing time, the idle instance steps at once, and its first token
    comes at the step's end plus the per-output-token time (α2)."""
    backend, result = one_run
    lat = result.prepared.latency
    first_step = blis_fast.step_time(**H100, latency_model=backend,
                                     batch=[(0, INPUT, INPUT, OUTPUT)])
    row = result.requests_frame().row(0, named=True)
    queueing = int(K.queueing_time(lat.code, lat.alpha, INPUT))
    assert row["first_token_us"] - row["arrival_us"] == queueing + first_step + lat.output_token_time


def test_batches_resolves_once_and_matches_single_batches():
    batches = [[(0, 512, 512, 64)], [(512, 1, 512, 64)] * 8,
               [(0, 256, 512, 64), (600, 1, 512, 200), (300, 1, 100, 0)], []]
    times = blis_fast.step_time(**H100, batches=batches)
    assert isinstance(times, list) and all(isinstance(t, int) for t in times)
    assert times == [blis_fast.step_time(**H100, batch=b) for b in batches]
    assert blis_fast.step_time(**H100, batches=[]) == []
    assert blis_fast.step_time(**H100, batches=(tuple(batches[0]),)) == times[:1]


def test_numpy_batches_and_integers_are_accepted():
    plain = blis_fast.step_time(**H100, batch=[(0, 128, 128, 4), (200, 1, 128, 300)])
    assert blis_fast.step_time(**H100, batch=np.array([[0, 128, 128, 4], [200, 1, 128, 300]])) \
        == plain
    assert blis_fast.step_time(**H100, batch=[[np.int32(0), np.uint64(128), 128, 4],
                                              (200, 1, 128, 300)]) == plain


def test_options_resolve_as_a_run_resolves_them():
    """Explicit model config folder and hardware file: the same as their bundled defaults;
    another GPU or α/β coefficients change the time as they change a run."""
    batch = [(0, 1024, 1024, 16)]
    base = blis_fast.step_time(**H100, batch=batch)
    explicit = blis_fast.step_time(
        **H100, batch=batch, model_config_folder=str(data_path("model_configs")
                                                     / "llama-3.1-8b-instruct"),
        hardware_config=str(data_path("hardware_config.json")))
    assert explicit == base
    assert blis_fast.step_time(**{**H100, "hardware": "A100-80"}, batch=batch) != base
    coeffs = dict(alpha_coeffs=[100, 1, 100], beta_coeffs="1000,10,5")
    bb = blis_fast.step_time(**H100, batch=batch, **coeffs)
    run = blis_fast.run(**H100, **coeffs, **ONE_REQUEST)
    assert run.prepared.latency.backend == "blackbox"
    assert bb == _kernel(run.prepared.latency, batch)


@pytest.mark.parametrize("bad", [
    dict(gpu="H100"), dict(latency_model="no-such-backend"), dict(tp="two"),
    dict(alpha_coeffs=[1, 2, 3]), dict(alpha_coeffs=[1.0, None, 1.0], beta_coeffs=[1, 2, 3]),
    dict(model=""), dict(total_kv_blocks=0),
], ids=lambda d: ",".join(d))
def test_bad_options_fail_as_the_run_fails(bad):
    """Every run option is taken and checked as ``blis_fast.run`` takes it: same error class,
    same message."""
    options = {**H100, **bad}
    with pytest.raises(BlisConfigError) as run_error:
        blis_fast.run(**options)
    with pytest.raises(type(run_error.value)) as step_error:
        blis_fast.step_time(**options, batch=[(0, 1, 1, 1)])
    assert str(step_error.value) == str(run_error.value)


@pytest.mark.parametrize(("kwargs", "where"), [
    (dict(batch=[(0, 1, 1, 1), (0, -1, 1, 1)]), "batch[1]"),
    (dict(batch=[(0, 1, 1)]), "batch[0]"),
    (dict(batch=[(0, 1, 1, 1, 1)]), "batch[0]"),
    (dict(batch=[(0, 1.0, 1, 1)]), "batch[0]"),
    (dict(batch=[(0, True, 1, 1)]), "batch[0]"),
    (dict(batch=[(-1, 1, 1, 1)]), "batch[0]"),
    (dict(batch=[(0, 1, 2**63, 1)]), "batch[0]"),
    (dict(batch=["0:1:1:1"]), "batch[0]"),
    (dict(batch="0:1:1:1"), "batch"),
    (dict(batch=7), "batch"),
    (dict(batches=[[(0, 1, 1, 1)], [(0, 1, 1, 1), (0, 1, 1, -4)]]), "batches[1][1]"),
    (dict(batches=[(0, 1, 1, 1)]), "batches[0][0]"),
    (dict(batches=5), "batches"),
    (dict(), "step_time: give batch="),
    (dict(batch=[(0, 1, 1, 1)], batches=[]), "step_time: give batch="),
], ids=lambda v: repr(v)[:40])
def test_bad_batches_name_the_entry(kwargs, where):
    with pytest.raises(BlisInputError) as exc:
        blis_fast.step_time(**H100, **kwargs)
    message = str(exc.value)
    assert message.startswith(where) and "\n" not in message


def test_a_decode_heavy_batch_is_slower_than_one_decode():
    """Roofline: more decoding requests never make a step faster, and many make it slower."""
    sizes = [1, 2, 4, 8, 16, 32, 64, 128, 256]
    times = blis_fast.step_time(
        **H100, batches=[[(1024 + i, 1, 1024, 512) for i in range(n)] for n in sizes])
    assert times == sorted(times)
    assert times[-1] > times[0]
    mixed = blis_fast.step_time(**H100, batch=[(0, 512, 512, 64)] + [(1024, 1, 1024, 512)] * 64)
    assert mixed > blis_fast.step_time(**H100, batch=[(0, 512, 512, 64)])


# ---------------------------------------------------------------------------- the CLI

CLI = ["step-time", "--model", MODEL, "--hardware", "H100", "--tp", "1", "--log", "error"]


def test_cli_prints_one_row_per_batch():
    texts = ["0:128:128:4", "128:1:128:4,0:512:512:100", "0:256:512:1,512:1:512:20,300:1:100:0"]
    result = invoke([*CLI, *[arg for text in texts for arg in ("--batch", text)],
                     "--latency-model", "trained-physics"])
    assert result.code == 0, result.stderr
    assert result.stderr == ""
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["batch", "requests", "prefill_tokens", "decode_requests",
                                "step_time_us"]
    batches = [[tuple(int(v) for v in item.split(":")) for item in text.split(",")]
               for text in texts]
    times = blis_fast.step_time(**H100, latency_model="trained-physics", batches=batches)
    rows = [[int(cell) for cell in line.split()] for line in lines[1:]]
    assert [row[0] for row in rows] == [1, 2, 3]
    assert [row[4] for row in rows] == times
    assert [row[1:4] for row in rows] == [
        [len(b), sum(n for p, n, i, _ in b if p < i),
         sum(1 for p, _, i, o in b if p >= i and o > 0)] for b in batches]


def test_cli_takes_only_the_latency_flags():
    """Run flags that do not reach the latency backend are unknown to step-time."""
    result = invoke([*CLI, "--batch", "0:1:1:1", "--rate", "5"])
    assert result.code == 2 and "--rate" in result.stderr
    assert result.stderr.count("\n") == 1


@pytest.mark.parametrize(("args", "names"), [
    (["--batch", "0:128:128"], "--batch"),
    (["--batch", "0:128:128:4,"], "--batch"),
    (["--batch", "0:x:128:4"], "--batch"),
    (["--batch", "0:-1:128:4"], "--batch"),
    (["--batch", "1:1:1:1", "--batch", "-5:1:1:1"], "--batch"),
    (["--batch", "0:99999999999999999999:1:1"], "--batch"),
    (["--batch", "0:1:1:1", "--latency-model", "no-such-backend"], "--latency-model"),
    ([], "--batch"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else v)
def test_cli_bad_input_is_one_line_and_exit_2(args, names):
    result = invoke([*CLI, *args])
    assert result.code == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("blis: error:")
    assert names in result.stderr
    assert "Traceback" not in result.stderr


def test_cli_help_lists_the_latency_flags_and_batch():
    from blis_fast.options import STEP_TIME_FLAGS

    result = invoke(["step-time", "--help"])
    assert result.code == 0
    for flag in [*STEP_TIME_FLAGS, "batch"]:
        assert f"--{flag} " in result.stdout, flag
    assert "--rate" not in result.stdout and "--num-instances" not in result.stdout
