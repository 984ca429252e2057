"""Latency backend resolution (ENG-10.4 with DELTA-20/22/23/25/26)."""

from __future__ import annotations

import math
import shutil

import numpy as np
import pytest

from blis_fast.config.latency import resolve_latency
from blis_fast.data import data_path
from blis_fast.errors import BlisConfigError, BlisInputError
from blis_fast.kernels.engine import latency as K
from blis_fast.kernels.engine.latency import Backend

try:
    from tests._parity_latency import (
        CASES_DIR,
        LATENCY_CASES,
        latency_options,
        options_for,
        stderr_messages,
    )
except ImportError:  # tests/ run as a plain folder (not a package)
    from _parity_latency import (
        CASES_DIR,
        LATENCY_CASES,
        latency_options,
        options_for,
        stderr_messages,
    )

needs_parity = pytest.mark.skipif(not CASES_DIR.is_dir(), reason="parity cases not available")

LLAMA8 = "meta-llama/llama-3.1-8b-instruct"

# case → (backend, GPU, TP, total KV blocks, MaxModelLen)
EXPECTED = {
    "quickstart-llama31-8b": ("roofline", "H100", 1, 26312, 131072),
    "roofline-llama70b-tp4-a100-summarization": ("roofline", "A100-80", 4, 121801, 131072),
    "roofline-mixtral-moe-tp2": ("roofline", "H100", 2, 48956, 32768),
    "roofline-qwen3-14b-contentgen": ("roofline", "H100", 1, 15909, 40960),
    "trained-physics-llama31-8b": ("trained-physics", "H100", 1, 26312, 131072),
    "blackbox-default-lowload": ("blackbox", "H100", 1, 26312, 0),
    "mar-crossmodel-llama31-8b": ("crossmodel", "H100", 1, 26312, 131072),
    "mar-trained-roofline-llama31-8b": ("trained-roofline", "H100", 1, 26312, 131072),
}


@needs_parity
@pytest.mark.parametrize("case", LATENCY_CASES)
def test_parity_case_resolution(case):
    cfg = resolve_latency(options_for(case))
    backend, gpu, tp, blocks, max_len = EXPECTED[case]
    assert (cfg.backend, cfg.gpu, cfg.tp) == (backend, gpu, tp)
    assert (
        cfg.code
        == {
            "roofline": Backend.ROOFLINE,
            "blackbox": Backend.BLACKBOX,
            "crossmodel": Backend.CROSSMODEL,
            "trained-roofline": Backend.TRAINED_ROOFLINE,
            "trained-physics": Backend.TRAINED_PHYSICS,
        }[backend]
    )
    # DELTA-23: blocks are auto-calculated for every backend (no defaults.yaml figure any more).
    assert cfg.total_kv_blocks == blocks and cfg.kv_blocks_source == "auto"
    assert cfg.max_model_len == max_len
    # The KV cache holds at least one maximum-length request: no length cap was needed.
    assert cfg.max_model_len <= cfg.total_kv_blocks * 16
    assert cfg.alpha.dtype == np.float64 and cfg.alpha.shape == (3,)
    assert cfg.params.dtype == np.float64


@needs_parity
@pytest.mark.parametrize("case", LATENCY_CASES)
def test_defaults_warnings_match_reference(case):
    # The GPU/TP/vLLM defaulting warnings are the reference's lines, in its order.
    cfg = resolve_latency(options_for(case))
    ref = [
        m
        for m in stderr_messages(case)
        if m.startswith(("Finding default values", "Using default"))
    ]
    ours = [m for m in cfg.warnings if m.startswith(("Finding default values", "Using default"))]
    assert ours == ref


def test_coefficients_per_backend():
    bb = resolve_latency(
        latency_options(
            model=LLAMA8, latency_model="blackbox", explicit=frozenset({"latency-model"})
        )
    )
    assert bb.alpha.tolist() == [10326.268121600151, 0.0, 0.0]
    assert bb.params[:K.BB_SIZE].tolist() == [6472.007648778123, 19.79721387814611, 304.4021040302657]
    assert any("deprecated" in w for w in bb.warnings)  # DELTA-21
    tp_ = resolve_latency(latency_options(model=LLAMA8, latency_model="trained-physics"))
    assert tp_.alpha.tolist() == [15563.199579, 777.3455, 45.907545]
    assert tp_.params[K.TP_PREFILL_SPLIT] == 1.0 and tp_.params[K.TP_DECODE_SPLIT] == 1.0
    cm = resolve_latency(latency_options(model=LLAMA8, latency_model="crossmodel"))
    assert cm.alpha.tolist() == [13732.0, 0.0, 860.6]
    assert cm.params[:4].tolist() == [116.11, 1226.868, 19.943, 9445.157]
    tr = resolve_latency(latency_options(model=LLAMA8, latency_model="trained-roofline"))
    assert tr.alpha.tolist() == [9315.338771116985, 1849.5902371340574, 1.7079389122469397]
    rf = resolve_latency(latency_options(model=LLAMA8))
    assert rf.alpha.tolist() == [0.0, 0.0, 0.0]


def test_coefficients_select_blackbox_and_flags_win():
    opts = latency_options(
        model="Meta-Llama/Llama-3.1-8B-Instruct",
        alpha_coeffs=[100, 1, 100],
        beta_coeffs=[1000, 10, 5],
        total_kv_blocks=1000,
        explicit=frozenset({"alpha-coeffs", "--beta-coeffs", "total-kv-blocks"}),
    )
    cfg = resolve_latency(opts)
    assert cfg.model == LLAMA8  # lower-cased
    assert cfg.backend == "blackbox" and cfg.params[:K.BB_SIZE].tolist() == [1000.0, 10.0, 5.0]
    assert cfg.total_kv_blocks == 1000 and cfg.kv_blocks_source == "flag"
    assert cfg.max_model_len == 0  # blackbox derives no MaxModelLen


def test_explicit_trained_physics_coefficients_allowed():
    opts = latency_options(
        model=LLAMA8,
        latency_model="trained-physics",
        alpha_coeffs=[1, 2, 3],
        beta_coeffs=[1, 1, 1, 1, 1, 1, 1],
        explicit=frozenset({"latency-model", "alpha-coeffs", "beta-coeffs"}),
    )
    cfg = resolve_latency(opts)
    assert cfg.backend == "trained-physics" and cfg.alpha.tolist() == [1.0, 2.0, 3.0]
    assert cfg.params[K.TP_PREFILL_SPLIT] == 0.0 and cfg.params[7] == 0.0  # padded betas


def test_max_model_len_flag_and_cap():
    cfg = resolve_latency(
        latency_options(model=LLAMA8, max_model_len=4096, explicit=frozenset({"max-model-len"}))
    )
    assert cfg.max_model_len == 4096
    cfg = resolve_latency(
        latency_options(model=LLAMA8, total_kv_blocks=100, explicit=frozenset({"total-kv-blocks"}))
    )
    assert cfg.total_kv_blocks == 100 and cfg.max_model_len == 1600
    assert any("capped to 1600" in w for w in cfg.warnings)


def test_kv_auto_calc_failure_keeps_default_with_warning():
    # gpu memory utilisation too small for the weights: calculation fails, 1,000,000 kept.
    cfg = resolve_latency(latency_options(model=LLAMA8, gpu_memory_utilization=0.1))
    assert cfg.total_kv_blocks == 1_000_000 and cfg.kv_blocks_source == "default"
    assert any("auto-calculation failed" in w for w in cfg.warnings)


# ---------------------------------------------------------------- validation errors (DELTA-26)


def _err(match, **kw):
    explicit = kw.pop("explicit", ())
    with pytest.raises(BlisConfigError, match=match):
        resolve_latency(latency_options(explicit, **kw))


def test_unknown_backend():
    _err(r"--latency-model", model=LLAMA8, latency_model="magic")


def test_alpha_without_beta():
    _err(r"--alpha-coeffs requires --beta-coeffs", model=LLAMA8, explicit=["alpha-coeffs"])
    _err(r"--beta-coeffs requires --alpha-coeffs", model=LLAMA8, explicit=["beta-coeffs"])


def test_nan_and_negative_coefficients():
    both = ["alpha-coeffs", "beta-coeffs"]
    _err(
        r"--alpha-coeffs\[0\]",
        model=LLAMA8,
        alpha_coeffs=[math.nan, 0, 0],
        beta_coeffs=[1, 1, 1],
        explicit=both,
    )
    _err(
        r"--beta-coeffs\[1\]",
        model=LLAMA8,
        alpha_coeffs=[1, 1, 1],
        beta_coeffs=[1, -2, 1],
        explicit=both,
    )
    _err(
        r"--beta-coeffs\[2\]",
        model=LLAMA8,
        alpha_coeffs=[1, 1, 1],
        beta_coeffs=[1, 2, math.inf],
        explicit=both,
    )


def test_short_coefficient_lists():
    both = ["alpha-coeffs", "beta-coeffs"]
    _err(
        r"--alpha-coeffs: at least 3",
        model=LLAMA8,
        alpha_coeffs=[1, 1],
        beta_coeffs=[1, 1, 1],
        explicit=both,
    )
    _err(
        r"--beta-coeffs: blackbox needs at least 3",
        model=LLAMA8,
        alpha_coeffs=[1, 1, 1],
        beta_coeffs=[1],
        explicit=both,
    )


def test_gpu_memory_and_block_size():
    _err(r"--gpu-memory-utilization", model=LLAMA8, gpu_memory_utilization=1.5)
    _err(r"--gpu-memory-utilization", model=LLAMA8, gpu_memory_utilization=math.nan)
    _err(r"--block-size-in-tokens", model=LLAMA8, block_size_in_tokens=0)


def test_negative_max_model_len():
    _err(
        r"--max-model-len must be >= 0", model=LLAMA8, max_model_len=-1, explicit=["max-model-len"]
    )


def test_unknown_gpu():
    _err(r"--hardware: GPU 'B200'", model=LLAMA8, hardware="B200")


def test_roofline_needs_gpu_and_tp():
    _err(r"--hardware \(GPU type\) and --tp", model="acme/unknown-model")
    _err(r"--tp \(tensor parallelism\)", model="acme/unknown-model", hardware="H100")


def test_missing_model_config():
    _err(r"--model-config-folder", model="acme/unknown-model", hardware="H100", tp=1)
    _err(
        r"--model-config-folder",
        model="acme/unknown-model",
        hardware="H100",
        tp=1,
        latency_model="trained-physics",
    )


def test_explicit_roofline_with_coefficients():
    _err(
        r"cannot be combined with --latency-model roofline",
        model=LLAMA8,
        latency_model="roofline",
        explicit=["latency-model", "alpha-coeffs", "beta-coeffs"],
    )


def test_blackbox_without_coefficients():
    _err(r"no trained blackbox coefficients", model=LLAMA8, latency_model="blackbox", tp=8)


def test_trained_backend_tp_divisibility():
    _err(r"--tp: trained-physics needs", model=LLAMA8, latency_model="trained-physics", tp=3)


def test_model_config_folder_flag(tmp_path):
    src = data_path("model_configs") / "qwen3-14b" / "config.json"
    shutil.copy(src, tmp_path / "config.json")
    cfg = resolve_latency(
        latency_options(
            model="acme/custom", hardware="H100", tp=1, model_config_folder=str(tmp_path)
        )
    )
    assert cfg.total_kv_blocks == 15909 and cfg.model_config_folder == str(tmp_path)


def test_custom_defaults_file(tmp_path):
    # Model configs and the hardware file are looked up beside the defaults file; a missing
    # config falls back to the bundled copy (this port's offline stand-in for the HF download).
    (tmp_path / "defaults.yaml").write_text(
        "defaults:\n  meta-llama/llama-3.1-8b-instruct:\n    GPU: L40S\n    tensor_parallelism: 1\n"
        "    vllm_version: v0\n"
    )
    with pytest.raises(BlisConfigError, match="--hardware-config"):
        resolve_latency(
            latency_options(model=LLAMA8, defaults_filepath=str(tmp_path / "defaults.yaml"))
        )
    shutil.copy(data_path("hardware_config.json"), tmp_path / "hardware_config.json")
    cfg = resolve_latency(
        latency_options(model=LLAMA8, defaults_filepath=str(tmp_path / "defaults.yaml"))
    )
    assert cfg.gpu == "L40S" and cfg.vllm_version == "v0"
    assert cfg.params[K.RF_PEAK_FLOPS] == 362.05e12
    # crossmodel needs crossmodel_defaults (or --beta-coeffs)
    with pytest.raises(BlisConfigError, match="crossmodel_defaults"):
        resolve_latency(
            latency_options(
                model=LLAMA8,
                latency_model="crossmodel",
                defaults_filepath=str(tmp_path / "defaults.yaml"),
            )
        )
    # a local config.json that is not an HF config is skipped with a warning
    bad = tmp_path / "model_configs" / "llama-3.1-8b-instruct"
    bad.mkdir(parents=True)
    (bad / "config.json").write_text('{"error": "x"}')
    cfg = resolve_latency(
        latency_options(model=LLAMA8, defaults_filepath=str(tmp_path / "defaults.yaml"))
    )
    assert any("not a HuggingFace config" in w for w in cfg.warnings)


def test_strict_defaults_error_propagates(tmp_path):
    (tmp_path / "defaults.yaml").write_text("defaults: {}\nunexpected: 1\n")
    with pytest.raises(BlisInputError, match="unexpected"):
        resolve_latency(
            latency_options(model=LLAMA8, defaults_filepath=str(tmp_path / "defaults.yaml"))
        )


def test_blackbox_kv_autocalc_failure_is_only_a_warning():
    opts = latency_options(
        model="acme/unknown-model",
        hardware="H100",
        tp=1,
        alpha_coeffs=[1, 1, 1],
        beta_coeffs=[1, 1, 1],
        explicit=frozenset({"alpha-coeffs", "beta-coeffs"}),
    )
    cfg = resolve_latency(opts)
    assert cfg.backend == "blackbox" and cfg.total_kv_blocks == 1_000_000
    assert any("using total-kv-blocks=1000000" in w for w in cfg.warnings)


def test_trained_roofline_quantization_warning():
    cfg = resolve_latency(
        latency_options(
            model="redhatai/llama-4-scout-17b-16e-instruct-fp8-dynamic",
            latency_model="trained-roofline",
        )
    )
    assert cfg.model_config.weight_bytes_per_param == 1.0
    assert any("trained-roofline charges 2-byte weights" in w for w in cfg.warnings)


def test_empty_backend_name_is_the_default_roofline():
    # the reference lets "" through its name check and then resolves no model config (CLU
    # OPEN-4); blis_fast reads "" as the default backend instead of failing later
    empty = resolve_latency(latency_options(model=LLAMA8, latency_model="",
                                           explicit=frozenset({"latency-model"})))
    default = resolve_latency(latency_options(model=LLAMA8))
    assert empty.backend == default.backend == "roofline"
    assert empty.total_kv_blocks == default.total_kv_blocks
    assert np.array_equal(empty.params, default.params)
