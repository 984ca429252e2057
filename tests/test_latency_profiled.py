"""The ``profiled`` latency backend against real GPU steps, a naive twin and the physical floor.

The measured steps (``gpu_profiles/measured/h100-steps.json``: 88 single steps of three dense
models on an H100, see the file's ``method``) are the golden numbers; the bundled H100 profile was
fitted to them (``docs/latency-profiled.md``), so the check here is the fit's quality, and a
leave-one-model-out refit shows how it carries to a model it has not seen.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blis_fast.config.gpu_profile import (
    bundled_profile,
    bundled_profile_names,
    load_gpu_profile,
    pack_profile_params,
    profile_from_dict,
)
from blis_fast.config.hardware import get_hw_config
from blis_fast.config.latency_backends import layer_split
from blis_fast.config.model_config import model_config_from_hf, parse_hf_config
from blis_fast.errors import BlisInputError
from blis_fast.kernels.engine import latency as K
from blis_fast.kernels.engine import latency_profiled as PF
from blis_fast.profiling.calibrate import fit_profile_to_steps

REPO = Path(__file__).resolve().parents[1]
MEASURED = REPO / "gpu_profiles" / "measured" / "h100-steps.json"


def _model(name: str):
    return model_config_from_hf(parse_hf_config(REPO / "model_configs" / name / "config.json"))


def _params(name: str, gpu: str = "H100", tp: int = 1) -> np.ndarray:
    mc = _model(name)
    return pack_profile_params(mc, bundled_profile(gpu), tp, layer_split(mc))


def _batch(row: dict) -> tuple[np.ndarray, ...]:
    """A measured row as the engine's batch arrays (the file's README gives the mapping)."""
    prog, new, inp, out = [], [], [], []
    if row["prefill_tokens"]:
        prog.append(row["prefill_ctx"])
        new.append(row["prefill_tokens"])
        inp.append(row["prefill_ctx"] + row["prefill_tokens"])
        out.append(8)
    for _ in range(row["decode_batch"]):
        prog.append(row["decode_ctx"])
        new.append(1)
        inp.append(row["decode_ctx"] - 1)
        out.append(8)
    return tuple(np.array(v, dtype=np.int64) for v in (prog, new, inp, out))


def _step(params: np.ndarray, batch: tuple[np.ndarray, ...]) -> int:
    return int(K.step_time(K.Backend.PROFILED, params, len(batch[0]), *batch))


def _measured_rows() -> list[dict]:
    return [r for r in json.loads(MEASURED.read_text())["results"] if "error" not in r]


# ----------------------------------------------------------------------------- naive twin


def _twin_gemm(prof: dict, m: float, n: float, k: float, wbytes: float) -> tuple[float, float, float]:
    if m <= 0 or n <= 0 or k <= 0:
        return 0.0, 0.0, 0.0
    flops = 2 * m * n * k
    nbytes = n * k * wbytes + prof["act"] * (m * k + m * n)
    compute = flops / (prof["peak"] * prof["gemm"]["compute_efficiency"] * m
                       / (m + prof["gemm"]["half_efficiency_tokens"]))
    memory = nbytes / (prof["bw"] * prof["gemm"]["memory_efficiency"])
    q = prof["gemm"]["overlap_exponent"]
    return prof["gemm"]["launch_us"] * 1e-6 + (compute ** q + memory ** q) ** (1 / q), flops, nbytes


def _twin(name: str, gpu: str, tp: int, requests: list[tuple[int, int, int, int]]) -> tuple[float, float]:
    """(µs, floor µs) of a step, written request by request from docs/latency-profiled.md."""
    mc = _model(name)
    data = bundled_profile(gpu).to_dict()
    prof = dict(data, peak=data["peaks"]["tflops_bf16"] * 1e12, bw=data["peaks"]["bandwidth_tbs"] * 1e12)
    wb = mc.effective_weight_bytes_per_param() or 2.0
    if wb <= 1 and data["peaks"].get("tflops_fp8", 0) > 0:
        prof["peak"] = data["peaks"]["tflops_fp8"] * 1e12
    kvb = prof["act"] = mc.bytes_per_param or 2.0
    d, L = mc.hidden_dim, mc.num_layers
    hq, hkv = max(1, mc.num_heads / tp), max(1, (mc.num_kv_heads or mc.num_heads) / tp)
    dh = mc.head_dim or d / mc.num_heads
    n_moe, n_dense = layer_split(mc)
    att = data["attention"]
    ew = data["elementwise"]
    tokens = sampled = 0
    attn_s = attn_flops = kv_bytes = copy = 0.0
    for progress, new, inp, out in requests:
        if progress < inp:
            tokens += new
            sampled += progress + new >= inp
            f = 4 * hq * dh * (new * progress + new * new / 2)
            attn_flops += f
            attn_s += f / (prof["peak"] * att["prefill_compute_efficiency"])
            kv_bytes += 2 * hkv * dh * (progress + new) * kvb
            copy += ew["prefill_kv_copy_bytes"] * (hq + hkv) * dh * (progress + new)
            if progress > 0:
                attn_s += att["cached_prefill_bytes_per_score"] * hq * new * (progress + new) / prof["bw"]
                copy += ew["cached_prefill_concat_bytes"] * hkv * dh * (progress + new)
        elif out > 0:
            tokens += 1
            sampled += 1
            attn_flops += 4 * hq * dh * progress
            kv = 2 * hkv * dh * progress * kvb
            kv_bytes += kv
            attn_s += (kv + att["decode_bytes_per_score"] * hq * progress) / (prof["bw"] * att["decode_memory_efficiency"])
    if tokens == 0:
        return 1.0, 0.0
    parts = [_twin_gemm(prof, tokens, (hq + 2 * hkv) * dh, d, wb), _twin_gemm(prof, tokens, d, hq * dh, wb)]
    seconds = L * sum(p[0] for p in parts)
    flops = L * (sum(p[1] for p in parts) + attn_flops)
    nbytes = L * (sum(p[2] for p in parts) + kv_bytes)
    # dense layers of an interleaved MoE model have their own width (intermediate_size_mlp)
    dff = (mc.dense_intermediate_dim if n_moe and mc.dense_intermediate_dim else mc.intermediate_dim) / tp
    inputs = 2 if mc.hidden_act in ("silu", "swiglu", "geglu", "") else 1
    if n_dense:
        for shape in ((tokens, inputs * dff, d), (tokens, d, dff)):
            s, f, b = _twin_gemm(prof, *shape, wb)
            seconds, flops, nbytes = seconds + n_dense * s, flops + n_dense * f, nbytes + n_dense * b
    act_ffn = dff
    if n_moe:
        e, k = mc.num_local_experts, mc.num_experts_per_tok
        moe_ffn = (mc.moe_expert_ffn_dim or mc.intermediate_dim) / tp
        touched = e * (1 - (1 - k / e) ** tokens)
        each = tokens * k / touched
        shared = mc.shared_expert_ffn_dim / tp
        for count, shape in ((1, (tokens, e, d)), (touched, (each, inputs * moe_ffn, d)),
                             (touched, (each, d, moe_ffn)), (1, (tokens, inputs * shared, d)),
                             (1, (tokens, d, shared))):
            s, f, b = _twin_gemm(prof, *shape, wb)
            seconds, flops, nbytes = (seconds + n_moe * count * s, flops + n_moe * count * f,
                                      nbytes + n_moe * count * b)
        if not n_dense:
            act_ffn = k * moe_ffn + shared
    s, f, b = _twin_gemm(prof, sampled, mc.vocab_size / tp, d, wb)
    seconds, flops, nbytes = seconds + s, flops + f, nbytes + b
    ew_bytes = tokens * (ew["bytes_per_hidden"] * d + ew["bytes_per_qkv"] * (hq + 2 * hkv) * dh
                         + ew["bytes_per_ffn"] * act_ffn) + copy
    seconds += L * (attn_s + ew_bytes / (prof["bw"] * ew["memory_efficiency"])
                    + data["fixed_us"]["per_layer"] * 1e-6)
    if tp > 1:
        ic = data["interconnect"]
        seconds += L * 2 * (ic["allreduce_latency_us"] * 1e-6
                            + 2 * (tp - 1) / tp * tokens * d * kvb / (ic["allreduce_bandwidth_gbs"] * 1e9))
    seconds += data["fixed_us"]["per_step"] * 1e-6
    floor = max(flops / prof["peak"], nbytes / prof["bw"])
    return seconds * 1e6, floor * 1e6


# ----------------------------------------------------------------------------- measured steps


def test_profiled_matches_every_measured_h100_step():
    """Median |error| <= 5% and every step within 15% of the measured H100 time; none below
    the physical floor (the floor guard never fires on profiled)."""
    errors = []
    for row in _measured_rows():
        params = _params(row["model"])
        batch = _batch(row)
        t = _step(params, batch)
        _, floor = _twin(row["model"], "H100", 1, list(zip(*(b.tolist() for b in batch), strict=True)))
        assert t >= math.floor(floor), row
        errors.append(t / row["us_median"] - 1)
    errors = np.abs(np.array(errors))
    assert len(errors) == 88
    assert np.median(errors) <= 0.05, np.median(errors)
    assert errors.max() <= 0.15, errors.max()


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(["llama-3.1-8b-instruct", "qwen2.5-7b-instruct", "mixtral-8x7b-v0.1",
                          "qwen3-30b-a3b", "mistral-nemo-instruct-2407", "llama-3.1-70b-instruct",
                          "deepseek-v2-lite", "llama-4-scout-17b-16e-instruct-fp8-dynamic"]),
    gpu=st.sampled_from(["H100", "A100-80", "L40S", "H200"]),
    tp=st.sampled_from([1, 2, 4, 8]),
    requests=st.lists(
        st.tuples(st.integers(0, 9000), st.integers(1, 2048), st.integers(1, 9000), st.integers(0, 64)),
        min_size=1, max_size=24),
)
def test_kernel_agrees_with_naive_twin_and_floor(name, gpu, tp, requests):
    """The Numba kernel equals a request-by-request Python twin (to the µs it truncates) and is
    never below the step's physical floor, on dense, MoE and head_dim models, any TP and GPU."""
    params = _params(name, gpu, tp)
    batch = tuple(np.array(col, dtype=np.int64) for col in zip(*requests, strict=True))
    t = _step(params, batch)
    twin, floor = _twin(name, gpu, tp, requests)
    assert abs(t - max(1.0, twin)) <= 1.0 + 1e-9 * twin, (t, twin)
    assert t >= math.floor(floor)


def test_step_time_grows_with_the_work():
    """More decode requests, longer contexts and longer prompts never make a step faster."""
    params = _params("llama-3.1-8b-instruct")

    def decode(batch: int, ctx: int) -> int:
        return _step(params, tuple(np.full(batch, v, dtype=np.int64) for v in (ctx, 1, ctx - 1, 8)))

    sizes = [decode(b, 1024) for b in (1, 2, 8, 32, 128, 256)]
    assert sizes == sorted(sizes) and sizes[-1] > sizes[0]
    contexts = [decode(16, c) for c in (128, 512, 2048, 8192)]
    assert contexts == sorted(contexts) and contexts[-1] > contexts[0]
    prefills = [_step(params, tuple(np.array([v]) for v in (0, t, t, 8))) for t in (16, 256, 2048, 8192)]
    assert prefills == sorted(prefills) and prefills[-1] > 10 * prefills[0]


def test_head_dim_and_tensor_parallel_shape_the_work():
    """An explicit head_dim is used (mistral-nemo: 128, not hidden/heads = 160); TP splits the
    heads and the FFN and adds all-reduces (TP 2 is faster than TP 1 but not twice)."""
    p = _params("mistral-nemo-instruct-2407")
    assert p[PF.PF_DH] == 128 and p[PF.PF_HQ] == 32 and p[PF.PF_HKV] == 8
    one, two = _params("llama-3.1-8b-instruct", tp=1), _params("llama-3.1-8b-instruct", tp=2)
    assert two[PF.PF_HQ] == 16 and two[PF.PF_DFF] == 14336 / 2
    batch = tuple(np.array([0], dtype=np.int64) + v for v in (0, 2048, 2048, 8))
    assert _step(one, batch) / 2 < _step(two, batch) < _step(one, batch)


def test_leave_one_model_out_refit_carries_to_the_held_out_model():
    """Refitting the profile's fitted figures on two models predicts the third within 20% on
    every step (median <= 5%): the figures describe the GPU, not the three rows."""
    rows = _measured_rows()
    base = bundled_profile("H100")
    for held_out in sorted({r["model"] for r in rows}):
        train = [r for r in rows if r["model"] != held_out]
        fitted = fit_profile_to_steps(base, train, REPO / "model_configs")
        errors = []
        for row in (r for r in rows if r["model"] == held_out):
            mc = _model(row["model"])
            params = pack_profile_params(mc, fitted, 1, layer_split(mc))
            errors.append(abs(_step(params, _batch(row)) / row["us_median"] - 1))
        assert np.median(errors) <= 0.05 and max(errors) <= 0.20, (held_out, max(errors))


# ----------------------------------------------------------------------------- profiles


def test_every_bundled_profile_loads_and_round_trips():
    names = bundled_profile_names()
    assert {"H100", "H200", "A100-80", "L40S"} <= set(names)
    for name in names:
        prof = bundled_profile(name)
        again = profile_from_dict(json.loads(json.dumps(prof.to_dict())), "copy")
        assert again.figures == prof.figures and again.gpu == prof.gpu
    assert bundled_profile("A100-SXM").gpu == "A100-80"  # an alias of the hardware table
    assert bundled_profile("no-such-gpu") is None


def _cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "blis_fast.cli", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=600)


RUN = ("run", "--model", "meta-llama/llama-3.1-8b-instruct", "--hardware", "H100", "--tp", "1",
       "--latency-model", "profiled", "--num-requests", "20", "--rate", "5")


def _broken(tmp_path: Path, edit) -> Path:
    data = bundled_profile("H100").to_dict()
    edit(data)
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return path


@pytest.mark.parametrize("edit, needle", [
    (lambda d: d["gemm"].pop("memory_efficiency"), "gemm.memory_efficiency is missing"),
    (lambda d: d["peaks"].update(bandwidth_tbs=-1.0), "peaks.bandwidth_tbs must be > 0"),
    (lambda d: d["gemm"].update(compute_efficiency=1.5), "gemm.compute_efficiency must be > 0 and <= 1"),
    (lambda d: d.update(version=2), "\"version\" must be 1"),
    (lambda d: d.update(format="other"), "\"format\" must be"),
    (lambda d: d["fixed_us"].update(per_layr=3.0), "unknown key fixed_us.per_layr"),
    (lambda d: d["fixed_us"].update(per_layer="54"), "fixed_us.per_layer must be a number"),
])
def test_bad_profile_files_get_one_line_and_exit_2(tmp_path, edit, needle):
    path = _broken(tmp_path, edit)
    with pytest.raises(BlisInputError, match=needle.replace("(", r"\(")):
        load_gpu_profile(path)
    proc = _cli(*RUN, "--gpu-profile", str(path))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in proc.stderr
    assert proc.stdout == ""


def test_non_finite_and_unreadable_profiles(tmp_path):
    data = bundled_profile("H100").to_dict()
    data["fixed_us"]["per_step"] = float("nan")
    text = json.dumps(data)  # Python writes the NaN token JSON has no place for
    assert '"per_step": NaN' in text
    (tmp_path / "nan.json").write_text(text)
    (tmp_path / "bad.json").write_text("{not json")
    for name, needle in (("nan.json", "invalid JSON number NaN"), ("bad.json", "cannot parse"),
                         ("absent.json", "cannot read")):
        proc = _cli(*RUN, "--gpu-profile", str(tmp_path / name))
        assert proc.returncode == 2 and needle in proc.stderr and "Traceback" not in proc.stderr


def test_profiled_run_uses_a_given_profile_and_refuses_betas(tmp_path):
    """A run with a user profile follows its figures (a GPU twice as fast in every figure gives
    shorter E2E); --beta-coeffs is refused; a GPU without a bundled profile names --gpu-profile."""
    base = _cli(*RUN, "--metrics-path", str(tmp_path / "a.json"))
    assert base.returncode == 0, base.stderr

    def faster(d):
        d["peaks"]["tflops_bf16"] *= 2
        d["peaks"]["bandwidth_tbs"] *= 2
        d["fixed_us"]["per_layer"] /= 2

    fast = _cli(*RUN, "--gpu-profile", str(_broken(tmp_path, faster)),
                "--metrics-path", str(tmp_path / "b.json"))
    assert fast.returncode == 0, fast.stderr
    e2e = [json.loads((tmp_path / f).read_text())["e2e_mean_ms"] for f in ("a.json", "b.json")]
    assert e2e[1] < e2e[0]
    refused = _cli(*RUN, "--beta-coeffs", "1,2,3")
    assert refused.returncode == 2 and "--beta-coeffs" in refused.stderr
    table = tmp_path / "hw.json"
    table.write_text(json.dumps({"B300": {"TFlopsPeak": 2000, "BwPeakTBs": 8, "mfuPrefill": 0.5,
                                          "mfuDecode": 0.3, "MemoryGiB": 288}}))
    missing = _cli(*RUN[:4], "B300", *RUN[5:], "--hardware-config", str(table))
    assert missing.returncode == 2 and "--gpu-profile" in missing.stderr, missing.stderr


def test_readme_accuracy_table_is_the_generated_one():
    """The README's backend-accuracy table is exactly what ``blis_fast.profiling.accuracy``
    computes from the measured steps (roofline and trained-physics beside profiled)."""
    from blis_fast.profiling.accuracy import accuracy_table

    readme = (REPO / "README.md").read_text()
    start = readme.index("<!-- accuracy-table:start")
    start = readme.index("\n", start) + 1
    end = readme.index("<!-- accuracy-table:end -->")
    assert readme[start:end] == accuracy_table(MEASURED)


# ----------------------------------------------------------------------------- floor guard

FLOOR_RUN = ("run", "--model", "meta-llama/llama-3.1-8b-instruct", "--hardware", "H100", "--tp",
             "1", "--num-requests", "12", "--rate", "2", "--seed", "7")
# the reference checks that the stdev, too, lies within [min, max]: min = max = stdev pins
# every length
LONG_PROMPTS = ("--prompt-tokens", "8192", "--prompt-tokens-stdev", "8192", "--prompt-tokens-min",
                "8192", "--prompt-tokens-max", "8192", "--output-tokens", "4",
                "--output-tokens-stdev", "4", "--output-tokens-min", "4", "--output-tokens-max", "4",
                "--max-num-scheduled-tokens", "8192", "--max-model-len", "16384")


def _floor_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "physical floor" in line]


@pytest.mark.parametrize("backend, extra", [
    ("roofline", ()),  # decode steps: two MLP matrices at full bandwidth
    ("trained-physics", LONG_PROMPTS),  # 8k-token prefills faster than peak FLOP/s allows
])
def test_floor_guard_fires_once_for_reference_backends(backend, extra):
    proc = _cli(*FLOOR_RUN, "--latency-model", backend, *extra)
    assert proc.returncode == 0, proc.stderr
    lines = _floor_lines(proc.stderr)
    assert len(lines) == 1, proc.stderr
    assert f"--latency-model {backend}: " in lines[0] and "steps took less than" in lines[0]
    worst = float(lines[0].split("worst ")[1].split("x")[0])
    assert 0 < worst < 1
    assert "physical floor" not in proc.stdout


@pytest.mark.parametrize("extra", [(), LONG_PROMPTS])
def test_floor_guard_never_fires_on_profiled(extra):
    proc = _cli(*FLOOR_RUN, "--latency-model", "profiled", *extra)
    assert proc.returncode == 0, proc.stderr
    assert _floor_lines(proc.stderr) == []


def test_floor_row_counts_three_mlp_matrices_and_sits_above_every_layout():
    """Every backend's params row carries the floor description past the largest layout; a
    roofline decode step of one request is below the floor the row describes."""
    from blis_fast.api import step_time
    from blis_fast.config.latency import pack_latency_params

    assert PF.FLOOR_OFFSET >= max(K.BB_SIZE, K.RF_SIZE, K.CM_SIZE, K.TP_SIZE, PF.PF_SIZE)
    mc = _model("llama-3.1-8b-instruct")
    hc = get_hw_config(REPO / "hardware_config.json", "H100")
    _, _, row = pack_latency_params("roofline", [0, 0, 0], [], mc, hc, 1)
    floor = row[PF.FLOOR_OFFSET:]
    assert floor[PF.PF_MLP_INPUTS] == 2 and floor[PF.PF_PEAK_BW] == 3.35e12
    batch = tuple(np.array([v], dtype=np.int64) for v in (1024, 1, 1023, 8))
    roofline = step_time(model="meta-llama/llama-3.1-8b-instruct", hardware="H100", tp=1,
                         latency_model="roofline", batch=[(1024, 1, 1023, 8)])
    weights = 32 * 2 * 4096 * (6144 + 4096 + 3 * 14336) + 2 * 4096 * 128256  # bytes, bf16
    assert PF.step_floor_us(row, 1, *batch) >= weights / 3.35e12 * 1e6 > roofline


# ----------------------------------------------------------------------------- blis profile


@pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                    reason="PyTorch (the [profile] extra, part of [dev]) is not installed")
def test_blis_profile_on_this_cpu_predicts_this_cpus_steps(tmp_path):
    """``blis profile`` on this CPU writes a profile --gpu-profile accepts; ``profiled`` with it
    predicts the same CPU's steps of a tiny model it was not fitted to (the shapes of
    step_physics.py --quick), timed here with the same forward: median error <= 25%."""
    from blis_fast.profiling.measure import Dims

    dims = Dims(hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, ffn=128, vocab=256)
    cases = [(16, 0, 0, 0), (8, 8, 0, 0), (0, 0, 4, 32), (8, 0, 4, 32)]
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "config.json").write_text(json.dumps(dims.to_config("float32")))

    def batch(case):
        prefill, ctx, decodes, decode_ctx = case
        return ([(ctx, prefill, ctx + prefill, 4)] if prefill else []) + \
            [(decode_ctx, 1, decode_ctx - 1, 4)] * decodes

    # one core for the profile (a child inherits it) and the timings: the cores of a virtual
    # machine need not run at the same speed
    cores = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cores)})
    try:
        measured, predicted, reasons = _profile_and_time(tmp_path, dims, cases, batch)
    finally:
        os.sched_setaffinity(0, cores)
    if measured is None:
        pytest.skip("no try could time this CPU (" + "; ".join(reasons) + "): timings here "
                    "say nothing about its CPU now")
    errors = [abs(p / m - 1) for p, m in zip(predicted, measured, strict=True)]
    print("measured", [round(v) for v in measured], "predicted", predicted)
    assert statistics.median(errors) <= 0.25, (measured, predicted)


def _profile_and_time(tmp_path, dims, cases, batch):
    """Up to 3 tries of: blis profile, then the tiny model's steps predicted with the profile
    and timed twice. A try counts when no other work ran and the two timings agree within 25%
    (a CPU whose speed moved more than that cannot be judged); it returns the timings' means
    and the predictions ((None, None, reasons) when no try counted)."""
    from blis_fast.api import step_time
    from blis_fast.profiling.measure import Timer, machine, time_step, weights_for
    from blis_fast.testing.foreign_cpu import ForeignCpu

    reasons = []
    for _ in range(3):
        gate = ForeignCpu()
        gate.start()
        out = tmp_path / "cpu.json"
        proc = _cli("profile", "--out", str(out), "--plot", str(tmp_path / "gemm.png"))
        assert proc.returncode == 0, proc.stderr
        assert load_gpu_profile(out).gpu == "cpu" and (tmp_path / "gemm.png").stat().st_size > 0
        predicted = step_time(model="tiny", hardware="cpu", tp=1, latency_model="profiled",
                              gpu_profile=str(out), model_config_folder=str(tmp_path / "tiny"),
                              log="error", batches=[batch(c) for c in cases])
        m = machine("cpu")
        weights = weights_for(m, dims)
        measured = [[time_step(m, Timer(m, 15, min_seconds=2.0), dims, weights, c) * 1e6
                     for c in cases] for _ in range(2)]  # each case over 2 s, twice
        moved = max(abs(a / b - 1) for a, b in zip(*measured, strict=True))
        share = gate.share()
        if share >= 0.25:
            reasons.append(f"other work held {share:.2f} cores")
        elif moved > 0.25:
            reasons.append(f"the CPU's speed moved {moved:.0%} between two timings")
        else:
            return [sum(v) / 2 for v in zip(*measured, strict=True)], predicted, reasons
    return None, None, reasons


def test_blis_profile_refuses_bad_output_before_measuring(tmp_path):
    """An output path that cannot be written is refused in one line before any timing."""
    proc = _cli("profile", "--out", str(tmp_path / "missing" / "dir" / "p.json"))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "--out" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "missing").exists()
