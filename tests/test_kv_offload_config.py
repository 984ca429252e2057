"""The August KV-offload tier chain's configuration (issue 32; spec kv-offload.md): the
``--kv-offload-config`` file read strictly, defaults and ``defaults.yaml``'s device classes
resolved, every check in the reference's order and words (KVO-1.3, KVO-2.1..2.6), the
configurations the reference panics on refused in one line (KVO-3.3, KVO-D3), per-block bytes
(KVO-3.1, 3.2), the inert-key warning (KVO-D4), the trace header key (KVO-11.1) and replay's
rules (KVO-11.2)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
from _cli import invoke

from blis_fast.config.defaults import load_defaults
from blis_fast.config.kv_offload import (
    KVOffloadConfig,
    KVOffloadDevice,
    KVOffloadTier,
    check_buildable,
    inert_keys,
    reconcile_replay,
    resolve_flag,
    validation_error,
    with_block_bytes,
)
from blis_fast.config.model_config import ModelConfig
from blis_fast.data import data_path
from blis_fast.errors import BlisConfigError, BlisInputError
from blis_fast.workload.replay import load_trace_header
from blis_fast.workload.trace_v2 import kv_offload_header_text

MODEL = "meta-llama/llama-3.1-8b-instruct"
DEVICES = load_defaults(data_path("defaults.yaml")).kv_offload_devices
CASES = Path(__file__).resolve().parent / "reference_cases" / "cases"
LLAMA_8B = ModelConfig(num_layers=32, hidden_dim=4096, num_heads=32, num_kv_heads=8,
                       bytes_per_param=2.0)
"""Llama-3.1-8B's KV shape: 131 072 KV bytes per token at TP 1 (KVO-3.2)."""


def _file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "offload.yaml"
    path.write_text(text)
    return str(path)


def _resolve(tmp_path: Path, body: str, devices=None, gpu_block: int = 16
             ) -> tuple[KVOffloadConfig, str | None]:
    return resolve_flag(_file(tmp_path, "kv_offload:\n" + body),
                        DEVICES if devices is None else devices, gpu_block)


def _refusal(tmp_path: Path, body: str, **kw) -> str:
    with pytest.raises((BlisConfigError, BlisInputError)) as err:
        _resolve(tmp_path, body, **kw)
    return str(err.value)


def test_bundled_device_classes_are_the_references():
    """KVO-2.4: defaults.yaml's kv_offload_devices (reference f90a1e3a), no ramp/jitter."""
    assert {k: (d.read_bandwidth, d.write_bandwidth, d.base_latency)
            for k, d in DEVICES.items()} == {
        "nvme_gen4": (7000.0, 5000.0, 80.0), "nvme_gen3": (3500.0, 3000.0, 100.0),
        "sata_ssd": (550.0, 500.0, 150.0), "cpu_dram": (20000.0, 20000.0, 1.0),
        "s3": (1000.0, 1000.0, 30000.0)}
    assert all(d.regime(True)[3:] == (1, 1.0, 0.0) for d in DEVICES.values())


def test_a_cpu_budget_alone_takes_vllms_defaults(tmp_path):
    """KVO-2.2: block = GPU block, one block per chunk, tokens_per_hash = GPU block, lru,
    prompt-only true, no KV events, no tiers; nothing inert set, no warning."""
    cfg, warning = _resolve(tmp_path, "  cpu_bytes_to_use: 209715200\n", gpu_block=32)
    assert cfg == KVOffloadConfig(cpu_bytes_to_use=209715200, per_block_bytes=0, block_size=32,
                                  blocks_per_chunk=1, tokens_per_hash=32,
                                  eviction_policy="lru", offload_prompt_only=True,
                                  self_describing_kv_events=False, tiers=())
    assert warning is None and cfg.cpu_blocks == 0  # not derived yet


def test_block_size_gives_blocks_per_chunk_and_the_reverse(tmp_path):
    cfg, _ = _resolve(tmp_path, "  cpu_bytes_to_use: 1\n  block_size: 48\n")
    assert (cfg.block_size, cfg.blocks_per_chunk) == (48, 3)
    cfg, _ = _resolve(tmp_path, "  cpu_bytes_to_use: 1\n  blocks_per_chunk: 2\n")
    assert (cfg.block_size, cfg.blocks_per_chunk) == (32, 2)


TIER = "  secondary_tiers:\n    - {type: fs, root_dir: /mnt/kv, direct_io: true, "
BAD = [
    # (block text, the message after "kv_offload: "), each the first failure in the
    # reference's order (KVO-2.2, 2.5 steps 1-6, then Validate)
    ("  store_threshold: 2\n", "cpu_bytes_to_use is required"),
    ("  cpu_bytes_to_use: 5\n  store_threshold: -1\n  block_size: 3\n",
     "store_threshold must be >= 0, got -1"),
    ("  cpu_bytes_to_use: 5\n  store_threshold: 7\n",
     "store_threshold=7: store_threshold is not supported for TieringOffloadingSpec (values >= 2 "
     "are rejected; it is single-tier-only and fixed at 1 on the multi-tier offload path)"),
    ("  cpu_bytes_to_use: 5\n  block_size: 16\n  blocks_per_chunk: 1\n",
     "block_size and blocks_per_chunk are mutually exclusive (they encode the same quantity: "
     "block_size = blocks_per_chunk × gpu_block_size); set at most one"),
    ("  cpu_bytes_to_use: 5\n  block_size: 24\n",
     "block_size (24) must be a positive multiple of the GPU block size (16)"),
    ("  cpu_bytes_to_use: 5\n  block_size: 0\n",
     "block_size (0) must be a positive multiple of the GPU block size (16)"),
    ("  cpu_bytes_to_use: 5\n  blocks_per_chunk: 0\n", "blocks_per_chunk must be > 0, got 0"),
    ("  cpu_bytes_to_use: 5\n  blocks_per_chunk: 1152921504606846976\n",
     "blocks_per_chunk (1152921504606846976) is too large — block_size = blocks_per_chunk × "
     "gpu_block_size (16) would overflow int64"),
    ("  cpu_bytes_to_use: 5\n  tokens_per_hash: 0\n", "tokens_per_hash must be > 0, got 0"),
    # tier resolution comes before the block's Validate (eviction policy, cpu bytes > 0)
    ("  cpu_bytes_to_use: 0\n  eviction_policy: fifo\n  secondary_tiers:\n    - {root_dir: /a}\n",
     "secondary_tiers[0].type is required"),
    ("  cpu_bytes_to_use: 5\n  secondary_tiers:\n    - {type: obj, root_dir: /b}\n",
     'secondary_tiers[0].type="obj" is not supported in BLIS yet (only "fs" is representable; '
     "obj/p2p/example tiers have no faithful config mapping — see #1587/#1585)"),
    ("  cpu_bytes_to_use: 5\n  secondary_tiers:\n    - {type: fs, root_dir: ''}\n",
     'secondary_tiers[0].root_dir is required for an "fs" tier'),
    ("  cpu_bytes_to_use: 5\n  secondary_tiers:\n    - {type: fs, root_dir: /a, "
     "n_read_threads: 0, device_class: nope}\n",
     "secondary_tiers[0].direct_io must be set explicitly (BLIS makes vLLM's runtime O_DIRECT "
     "probe an explicit config axis; direct vs buffered I/O are materially different storage "
     "physics)"),
    ("  cpu_bytes_to_use: 5\n" + TIER + "device_class: nvme_gen5}\n",
     'secondary_tiers[0].device_class="nvme_gen5" is not defined in defaults.yaml '
     "kv_offload_devices (known: cpu_dram, nvme_gen3, nvme_gen4, s3, sata_ssd)"),
    ("  cpu_bytes_to_use: 5\n" + TIER + "read_bandwidth: 1, write_bandwidth: 1}\n",
     "secondary_tiers[0] needs a device_class OR an explicit read_bandwidth + write_bandwidth + "
     "base_latency triple"),
    ("  cpu_bytes_to_use: 0\n  eviction_policy: fifo\n",
     "cpu_bytes_to_use must be > 0 when offload is enabled, got 0"),
    ("  cpu_bytes_to_use: 5\n  eviction_policy: fifo\n",
     'eviction_policy must be "lru" or "arc", got "fifo"'),
    ("  cpu_bytes_to_use: 5\n" + TIER + "device_class: s3, locality: local}\n",
     'secondary_tiers[0].locality must be "LOCAL" or "REMOTE" (or unset), got "local"'),
    ("  cpu_bytes_to_use: 5\n" + TIER + "device_class: s3, n_read_threads: 0, "
     "n_write_threads: 0}\n", "secondary_tiers[0].n_read_threads must be > 0, got 0"),
    ("  cpu_bytes_to_use: 5\n" + TIER + "device_class: s3, n_write_threads: -2}\n",
     "secondary_tiers[0].n_write_threads must be > 0, got -2"),
    ("  cpu_bytes_to_use: 5\n" + TIER + "device_class: s3, read_bandwidth: .nan}\n",
     "secondary_tiers[0].read_bandwidth must be a finite value > 0, got NaN"),
    ("  cpu_bytes_to_use: 5\n" + TIER + "device_class: s3, write_bandwidth: 0}\n",
     "secondary_tiers[0].write_bandwidth must be a finite value > 0, got 0"),
    ("  cpu_bytes_to_use: 5\n" + TIER + "device_class: s3, base_latency: -1.5}\n",
     "secondary_tiers[0].base_latency must be a finite value >= 0, got -1.5"),
    ("  cpu_bytes_to_use: 5\n" + TIER + "device_class: s3}\n" + "    - {type: fs, root_dir: "
     "/b, direct_io: false, read_bandwidth: 1, write_bandwidth: 2, base_latency: .inf}\n",
     "secondary_tiers[1].base_latency must be a finite value >= 0, got +Inf"),
]


@pytest.mark.parametrize(("body", "message"), BAD)
def test_each_check_in_the_references_order_and_words(tmp_path, body, message):
    """KVO-2.1, 2.2, 2.5: ``--kv-offload-config "PATH": kv_offload: <reason>``."""
    path = str(tmp_path / "offload.yaml")
    assert _refusal(tmp_path, body) == f'--kv-offload-config "{path}": kv_offload: {message}'


CUSTOM = {
    "ramp": KVOffloadDevice(4000.0, 3000.0, 90.0, saturation_queue_depth=8,
                            single_transfer_fraction=0.25),
    "bad_f1": KVOffloadDevice(1.0, 1.0, 1.0, saturation_queue_depth=2,
                              single_transfer_fraction=1.5),
    "nan_f1": KVOffloadDevice(1.0, 1.0, 1.0, single_transfer_fraction=math.nan),
    "neg_q": KVOffloadDevice(1.0, 1.0, 1.0, saturation_queue_depth=-1),
    "neg_sigma": KVOffloadDevice(1.0, 1.0, 1.0, latency_jitter_stddev=-0.1),
    "buffered": KVOffloadDevice(7000.0, 5000.0, 80.0, saturation_queue_depth=4,
                                single_transfer_fraction=0.5, latency_jitter_stddev=0.2,
                                buffered_write_bandwidth=9000.0, buffered_base_latency=20.0,
                                buffered_latency_jitter_stddev=0.0),
}


@pytest.mark.parametrize(("device", "message"), [
    ("bad_f1", "single_transfer_fraction must be in (0,1] when saturation_queue_depth >= 2, "
               "got 1.5"),
    ("nan_f1", "single_transfer_fraction must be a finite value, got NaN"),
    ("neg_q", "saturation_queue_depth must be >= 0, got -1"),
    ("neg_sigma", "latency_jitter_stddev must be a finite value >= 0, got -0.1"),
])
def test_device_model_checks(tmp_path, device, message):
    """KVO-2.5 step 7: the ramp and jitter figures a device class brings."""
    got = _refusal(tmp_path, "  cpu_bytes_to_use: 5\n" + TIER + f"device_class: {device}}}\n",
                   devices=CUSTOM)
    assert got.endswith(f"kv_offload: secondary_tiers[0].{message}")


def test_regimes_and_explicit_overrides(tmp_path):
    """KVO-2.5 steps 5-6: buffered twins replace their O_DIRECT figures (absent ones fall
    back); explicit figures override the class's triple but never its ramp or jitter."""
    body = ("  cpu_bytes_to_use: 5\n  secondary_tiers:\n"
            "    - {type: fs, root_dir: /a, direct_io: false, device_class: buffered}\n"
            "    - {type: fs, root_dir: /b, direct_io: true, device_class: buffered}\n"
            "    - {type: fs, root_dir: /c, direct_io: true, device_class: ramp, "
            "read_bandwidth: 1e3, base_latency: 0, n_read_threads: 2, n_write_threads: 3}\n")
    cfg, _ = _resolve(tmp_path, body, devices=CUSTOM)
    t = cfg.tiers
    assert (t[0].read_bandwidth, t[0].write_bandwidth, t[0].base_latency,
            t[0].saturation_queue_depth, t[0].single_transfer_fraction,
            t[0].latency_jitter_stddev) == (7000.0, 9000.0, 20.0, 4, 0.5, 0.0)
    assert (t[1].write_bandwidth, t[1].base_latency, t[1].latency_jitter_stddev) == (
        5000.0, 80.0, 0.2)
    assert t[2] == KVOffloadTier(type="fs", root_dir="/c", n_read_threads=2, n_write_threads=3,
                                 direct_io=True, device_class="ramp", read_bandwidth=1000.0,
                                 write_bandwidth=3000.0, base_latency=0.0,
                                 saturation_queue_depth=8, single_transfer_fraction=0.25)


def test_a_file_without_the_block_unknown_keys_and_unreadable_files(tmp_path):
    """KVO-2.1: strict YAML with one top-level kv_offload: block."""
    path = _file(tmp_path, "other: 1\n")
    with pytest.raises(BlisInputError, match=r"parse --kv-offload-config file .*unknown key "
                                             r"'other'"):
        resolve_flag(path, DEVICES, 16)
    path = _file(tmp_path, "kv_offload:\n  cpu_bytes_to_use: 5\n  cpu_budget: 3\n")
    with pytest.raises(BlisInputError, match="unknown key 'cpu_budget'"):
        resolve_flag(path, DEVICES, 16)
    path = _file(tmp_path, "kv_offload:\n")
    with pytest.raises(BlisConfigError) as err:
        resolve_flag(path, DEVICES, 16)
    assert str(err.value).endswith("kv_offload: the --kv-offload-config file has no top-level "
                                   "kv_offload: block")
    with pytest.raises(BlisInputError, match='read --kv-offload-config file ".*missing.yaml"'):
        resolve_flag(str(tmp_path / "missing.yaml"), DEVICES, 16)


def test_inert_keys_are_named_in_one_warning(tmp_path):
    """KVO-2.3, KVO-D4: recorded keys that change nothing are named as written."""
    body = ("  cpu_bytes_to_use: 5\n  tokens_per_hash: 64\n  store_threshold: 1\n"
            + TIER + "device_class: s3, locality: REMOTE, enable_kv_events: false}\n")
    cfg, warning = _resolve(tmp_path, body)
    assert cfg.tokens_per_hash == 64 and cfg.tiers[0].locality == "REMOTE"
    assert warning is not None and warning.count("\n") == 0
    assert ("tokens_per_hash, store_threshold, secondary_tiers[0].locality, "
            "secondary_tiers[0].enable_kv_events only recorded") in warning
    assert inert_keys({"cpu_bytes_to_use": 5}) == []


def test_per_block_bytes_and_cpu_blocks_of_llama_8b():
    """KVO-3.1/3.2: 131 072 B/token x 16 = 2 097 152 B/block; 301 blocks minus one byte hold
    300 blocks (kvo-cpu-bytes-not-block-multiple); TP 2 halves the block."""
    cfg = with_block_bytes(KVOffloadConfig(cpu_bytes_to_use=301 * 2097152 - 1), LLAMA_8B, 1, 16,
                           "roofline")
    assert (cfg.per_block_bytes, cfg.cpu_blocks) == (2097152, 300)
    assert with_block_bytes(cfg, LLAMA_8B, 2, 16, "roofline").per_block_bytes == 1048576


def test_per_block_bytes_use_an_explicit_head_dim():
    """KVO-3.1: the August KVBytesPerToken (explicit head_dim, as P/D's transfer sizing):
    40 layers x 2 x 128 x 8 KV heads x 2 B = 163 840 B/token although hidden/heads = 160."""
    mc = ModelConfig(num_layers=40, hidden_dim=5120, num_heads=32, num_kv_heads=8,
                     bytes_per_param=2.0, head_dim=128)
    cfg = with_block_bytes(KVOffloadConfig(cpu_bytes_to_use=1), mc, 1, 16, "roofline")
    assert cfg.per_block_bytes == 163840 * 16
    with pytest.raises(BlisConfigError, match="cannot derive per_block_bytes from the model: "
                                              "--latency-model blackbox"):
        with_block_bytes(cfg, None, 1, 16, "blackbox")


@pytest.mark.parametrize(("cfg", "words"), [
    (KVOffloadConfig(cpu_bytes_to_use=1 << 30, per_block_bytes=2097152, block_size=32,
                     blocks_per_chunk=2), "blocks_per_chunk 2 (block_size 32) is not supported"),
    (KVOffloadConfig(cpu_bytes_to_use=1 << 30, per_block_bytes=2097152, eviction_policy="arc"),
     'eviction_policy "arc" is not supported'),
    (KVOffloadConfig(cpu_bytes_to_use=2097151, per_block_bytes=2097152),
     "cpu_bytes_to_use (2097151) is smaller than one KV block (2097152 bytes"),
])
def test_what_the_reference_panics_on_is_refused(cfg, words):
    """KVO-3.2, 3.3, KVO-D3: one line naming the flag instead of a Go panic."""
    with pytest.raises(BlisConfigError) as err:
        check_buildable(cfg)
    assert str(err.value).startswith("--kv-offload-config: ") and words in str(err.value)
    check_buildable(replace(cfg, blocks_per_chunk=1, block_size=16, eviction_policy="lru",
                            cpu_bytes_to_use=2097152))


def test_header_key_is_the_references_text():
    """KVO-11.1: the header the reference wrote for kvo-multiturn-accumulate-sessions."""
    case = CASES / "kvo-multiturn-accumulate-sessions"
    cfg, _ = resolve_flag(str(case / "offload.yaml"), DEVICES, 16)
    cfg = with_block_bytes(cfg, LLAMA_8B, 1, 16, "roofline")
    recorded = (case / "trace.yaml").read_text()
    assert kv_offload_header_text(cfg) == recorded[recorded.index("kv_offload:"):]
    assert kv_offload_header_text(None) == ""


def test_header_round_trip(tmp_path):
    """KVO-11.2: the header is read back field for field (never re-resolved)."""
    body = ("  cpu_bytes_to_use: 5\n  offload_prompt_only: false\n  tokens_per_hash: 7\n"
            + TIER + "device_class: s3, locality: LOCAL}\n"
            "    - {type: fs, root_dir: 'a: b', direct_io: false, read_bandwidth: 1.25e7, "
            "write_bandwidth: 3, base_latency: 0.5}\n")
    cfg, _ = _resolve(tmp_path, body)
    cfg = replace(cfg, per_block_bytes=123)
    header = tmp_path / "h.yaml"
    header.write_text("trace_version: 2\nmode: generated\n" + kv_offload_header_text(cfg))
    assert load_trace_header(str(header))["kv_offload"] == cfg


def test_replay_rules():
    """KVO-11.2: the header is authoritative; a flag must agree (per_block_bytes aside), may
    not add a chain to a simulated trace, may to an observed one (mode real)."""
    rec = KVOffloadConfig(cpu_bytes_to_use=1 << 28, per_block_bytes=2097152)
    flag = replace(rec, per_block_bytes=0)
    assert reconcile_replay(rec, "generated", None) == rec
    assert reconcile_replay(rec, "generated", flag) == rec
    assert reconcile_replay(None, "real", flag) == flag
    assert reconcile_replay(None, "generated", None) is None
    with pytest.raises(BlisConfigError, match="^--kv-offload-config conflicts with the "
                                              "kv_offload config recorded in the trace header"):
        reconcile_replay(rec, "generated", replace(flag, offload_prompt_only=False))
    with pytest.raises(BlisConfigError, match="^the trace was captured without a kv_offload "
                                              "config; --kv-offload-config cannot add one"):
        reconcile_replay(None, "replayed", flag)
    bad = replace(rec, eviction_policy="")
    with pytest.raises(BlisConfigError) as err:
        reconcile_replay(bad, "generated", None)
    assert str(err.value) == (
        "blis replay cannot reproduce the trace's kv_offload config: kv_offload: eviction_policy "
        'must be "lru" or "arc", got "" (INV-13: never silent degradation)')
    assert validation_error(rec) is None


# --- the command line -----------------------------------------------------------------------

RUN = ["--model", MODEL, "--latency-model", "roofline", "--total-kv-blocks", "200",
       "--num-requests", "6", "--rate", "50", "--prompt-tokens", "64", "--output-tokens", "4",
       "--log", "error"]


def test_cli_refuses_the_tier_chain_beside_the_cpu_tier(tmp_path):
    """KVO-1.3 (checked after the file resolved): exit 2, one line, nothing written."""
    path = _file(tmp_path, "kv_offload:\n  cpu_bytes_to_use: 209715200\n")
    out = tmp_path / "m.json"
    res = invoke(["run", *RUN, "--kv-cpu-blocks", "100", "--kv-offload-config", path,
                  "--metrics-path", str(out)])
    assert (res.code, res.stdout) == (2, "")
    assert res.stderr.count("\n") == 1 and res.stderr.rstrip().endswith(
        "--kv-offload-config and --kv-cpu-blocks are mutually exclusive (distinct KV-offload "
        "models); set only one")
    assert not out.exists()
    bad = _file(tmp_path, "kv_offload:\n  store_threshold: 3\n")  # the file's error first
    res = invoke(["run", *RUN, "--kv-cpu-blocks", "100", "--kv-offload-config", bad])
    assert res.code == 2 and "cpu_bytes_to_use is required" in res.stderr


def test_cli_run_writes_the_header_and_replay_applies_its_rules(tmp_path):
    """KVO-11.1/11.2 end to end: the run's header carries the derived per_block_bytes; a
    replay with the same file agrees, another file or --kv-cpu-blocks are refused."""
    path = _file(tmp_path, "kv_offload:\n  cpu_bytes_to_use: 209715200\n  secondary_tiers:\n"
                 "    - {type: fs, root_dir: /mnt/kv, direct_io: true, device_class: s3}\n")
    trace = tmp_path / "t"
    res = invoke(["run", *RUN, "--kv-offload-config", path, "--trace-output", str(trace)])
    assert res.code == 0, res.stderr
    header = load_trace_header(str(trace) + ".yaml")["kv_offload"]
    assert (header.per_block_bytes, header.cpu_blocks, header.tiers[0].base_latency) == (
        2097152, 100, 30000.0)
    replay = ["replay", "--model", MODEL, "--latency-model", "roofline", "--total-kv-blocks",
              "200", "--log", "error", "--trace-header", str(trace) + ".yaml", "--trace-data",
              str(trace) + ".csv"]
    again = tmp_path / "again"
    res = invoke([*replay, "--kv-offload-config", path, "--trace-output", str(again)])
    assert res.code == 0, res.stderr
    assert load_trace_header(str(again) + ".yaml")["kv_offload"] == header
    other = tmp_path / "other.yaml"
    other.write_text("kv_offload:\n  cpu_bytes_to_use: 209715201\n")
    res = invoke([*replay, "--kv-offload-config", str(other)])
    assert res.code == 2 and res.stderr.count("\n") == 1 and "conflicts with the kv_offload " \
        "config recorded in the trace header" in res.stderr
    res = invoke([*replay, "--kv-cpu-blocks", "10"])
    assert res.code == 2 and res.stderr.rstrip().endswith(
        "--kv-cpu-blocks conflicts with the trace's kv_offload config (distinct KV-offload "
        "models); set only one")


def test_cli_warns_about_inert_keys_and_the_cpu_tiers_transfer_flags(tmp_path):
    """KVO-D4, KVO-1.4: one warning per kind, after every check passed; the run goes on."""
    path = _file(tmp_path, "kv_offload:\n  cpu_bytes_to_use: 209715200\n  tokens_per_hash: 64\n")
    res = invoke(["run", *RUN[:-2], "--log", "warn", "--kv-offload-config", path,
                  "--kv-transfer-bandwidth", "8"])
    assert res.code == 0, res.stderr
    assert "tokens_per_hash only recorded in the trace header" in res.stderr
    assert ("--kv-transfer-bandwidth applies to the --kv-cpu-blocks tier only: the "
            "--kv-offload-config chain takes its figures from the file") in res.stderr


VALID_KVO = sorted(p.name for p in CASES.glob("kvo-*") if (p / "offload.yaml").is_file()
                   and not p.name.startswith("kvo-invalid-"))


@pytest.mark.parametrize("case_id", VALID_KVO)
def test_every_valid_case_configuration_resolves_and_can_be_built(case_id):
    """The reference ran each valid kvo case: its file resolves (with the case's own
    defaults.yaml where it brings one) and passes what the chain needs to be built; the CPU
    tier holds cpu_bytes_to_use // 2 097 152 blocks (KVO-3.2)."""
    case = CASES / case_id
    devices = DEVICES
    if (case / "defaults.yaml").is_file():
        devices = load_defaults(case / "defaults.yaml").kv_offload_devices
    cfg, _ = resolve_flag(str(case / "offload.yaml"), devices, 16)
    cfg = with_block_bytes(cfg, LLAMA_8B, 1, 16, "roofline")
    check_buildable(cfg)
    assert cfg.cpu_blocks == cfg.cpu_bytes_to_use // 2097152 >= 40
    if case_id == "kvo-cpu-bytes-not-block-multiple":
        assert cfg.cpu_blocks == 300
    if case_id == "kvo-ramp-custom-device":
        t = cfg.tiers[0]
        assert (t.read_bandwidth, t.saturation_queue_depth, t.single_transfer_fraction) == (
            4000.0, 8, 0.25)
    if case_id == "kvo-class-with-latency-override":
        t = cfg.tiers[0]  # nvme_gen3's bandwidths, the file's latency and read servers
        assert (t.read_bandwidth, t.write_bandwidth, t.base_latency, t.n_read_threads,
                t.n_write_threads) == (3500.0, 3000.0, 5000.0, 4, 16)
