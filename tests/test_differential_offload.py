"""The differential tool's KV offload family (tests/differential/, ``--family offload``), checked
without the reference: its configurations pass blis_fast's validation, its invalid ones are
refused, ``--offload-tiers cpu`` keeps to the chain's CPU tier, and an opt-in meant for
blis_fast alone (``blis_fast_args``) never reaches the reference."""

from __future__ import annotations

import io
import json
import random
import sys
from contextlib import redirect_stderr
from pathlib import Path

import pytest
import yaml
from _cli import refused

DIFF_DIR = Path(__file__).resolve().parent / "differential"
if str(DIFF_DIR) not in sys.path:
    sys.path.insert(0, str(DIFF_DIR))

import run_differential as rd  # noqa: E402
from config_generator import (  # noqa: E402
    OFFLOAD_INVALID_KINDS,
    OFFLOAD_TIER_INVALID_KINDS,
    generate_configs,
    offload_block_bytes,
    offload_config,
    option_fields,
)


def _offload_block(cfg: dict) -> dict | None:
    text = cfg["files"].get("offload.yaml")
    return None if text is None else yaml.safe_load(text)["kv_offload"]


@pytest.mark.parametrize(("tiers", "seed", "count"), [("cpu", 11, 40), ("all", 12, 30)])
def test_offload_configurations_pass_blis_fast_validation(tmp_path, monkeypatch, tiers, seed,
                                                          count) -> None:
    """Every valid configuration passes ``build_options`` + ``runner.prepare`` with its
    blis_fast-only flags; the chain's block size in bytes is the generator's (KVO-3.1), so the
    budgets it draws as whole blocks plus a remainder mean what they say."""
    from blis_fast.options import build_options
    from blis_fast.runner import prepare

    monkeypatch.chdir(tmp_path)
    configs = generate_configs(seed, count, family="offload", offload_tiers=tiers)
    for cfg in configs:
        if cfg.get("invalid"):
            continue
        for name, text in cfg["files"].items():
            (tmp_path / name).write_text(text)
        with redirect_stderr(io.StringIO()):
            prepared = prepare(build_options(option_fields(
                cfg["args"] + cfg.get("blis_fast_args", []))))
        engine = prepared.engine
        flags = dict(zip(cfg["args"][::2], cfg["args"][1::2], strict=False))
        if "--kv-offload-config" in flags:
            bs = int(flags.get("--block-size-in-tokens", 16))
            assert engine.kv_offload.per_block_bytes == offload_block_bytes(
                flags["--model"], int(flags["--tp"]), bs), cfg["id"]
            assert engine.kv_offload.cpu_blocks >= 1
            assert (engine.kv_offload.cpu_blocks
                    == _offload_block(cfg)["cpu_bytes_to_use"] // engine.kv_offload.per_block_bytes)
        else:
            assert cfg["blis_fast_args"] == ["--kv-cpu-reload", "always"]
            assert engine.options.kv_cpu_reload == "always" and engine.options.kv_cpu_blocks > 0


def test_offload_family_draws_what_the_chain_depends_on() -> None:
    """Reproducible by seed; CPU budgets that are whole blocks, not, and tiny; prompt-only on
    and off; the legacy tier under its opt-in; shared prefixes, accumulating sessions,
    clusters; with 'cpu' never a secondary tier (nor an invalid one), with 'all' shipped and
    custom device classes, buffered and O_DIRECT."""
    cpu = generate_configs(21, 300, family="offload", offload_tiers="cpu")
    assert cpu == generate_configs(21, 300, family="offload", offload_tiers="cpu")
    assert all(c["id"].startswith("o21-") and c["family"] == "offload" for c in cpu)
    blocks = [b for c in cpu if not c.get("invalid") and (b := _offload_block(c))]
    assert not any("secondary_tiers" in b for b in blocks)
    assert not any(c.get("invalid_kind", "").startswith("tier-") for c in cpu)
    budgets = []
    for c in cpu:
        flags = dict(zip(c["args"][::2], c["args"][1::2], strict=False))
        b = _offload_block(c)
        if b is not None and not c.get("invalid"):
            per = offload_block_bytes(flags["--model"], int(flags["--tp"]),
                                      int(flags.get("--block-size-in-tokens", 16)))
            budgets.append(divmod(b["cpu_bytes_to_use"], per))
    assert any(rest == 0 for _, rest in budgets) and any(rest > 0 for _, rest in budgets)
    assert any(whole <= 3 for whole, _ in budgets) and any(whole >= 1000 for whole, _ in budgets)
    assert {b.get("offload_prompt_only") for b in blocks} == {None, True, False}
    assert sum(bool(c.get("blis_fast_args")) for c in cpu) > 20
    text = " ".join(" ".join(c["args"]) + " ".join(c["files"].values()) for c in cpu)
    for wanted in ("prefix_group", "context_growth: accumulate", "concurrency:",
                   "--num-instances 4", "prefix-affinity", "--long-prefill-token-threshold",
                   "--scheduler sjf", "--latency-model trained-physics", "qwen/qwen2.5-7b",
                   "mistral-nemo", "--block-size-in-tokens", "store_threshold",
                   "--kv-transfer-bandwidth"):
        assert wanted in text, wanted
    assert 0 < sum(bool(c.get("invalid")) for c in cpu) < 0.15 * len(cpu)
    full = generate_configs(22, 200, family="offload")
    tiers = [t for c in full if not c.get("invalid") and (b := _offload_block(c))
             for t in b.get("secondary_tiers", [])]
    assert {t["direct_io"] for t in tiers} == {True, False}
    assert any("device_class" not in t for t in tiers)
    assert any("--defaults-filepath" in c["args"] for c in full)


@pytest.mark.parametrize("kind", OFFLOAD_INVALID_KINDS + OFFLOAD_TIER_INVALID_KINDS)
def test_invalid_offload_configurations_are_refused_by_blis_fast(tmp_path, monkeypatch,
                                                                 kind) -> None:
    """Each kind of invalid offload configuration (the reference refuses all of them, or
    panics on three, KVO-D3) makes blis_fast exit 2 with one error line, before simulating."""
    monkeypatch.chdir(tmp_path)
    kinds = OFFLOAD_INVALID_KINDS + OFFLOAD_TIER_INVALID_KINDS
    cfg = offload_config(random.Random(kinds.index(kind)), f"bad-{kind}", max_requests=20,
                         invalid=kind)
    assert cfg["invalid"] and cfg["invalid_kind"] == kind
    refused(cfg, tmp_path)


def test_blis_fast_only_flags_never_reach_the_reference(monkeypatch, tmp_path) -> None:
    """``blis_fast_args`` go to blis_fast's run alone, and into the report (which ``--configs``
    reads back with them)."""
    seen: dict[str, list[str]] = {}

    def fake(side: str):
        def run(*call, **_):
            args = call[1] if side == "reference" else call[0]
            seen[side] = list(args)
            return {"exit_code": 2, "stdout": "", "stderr": "no", "seconds": 0.0}
        return run

    monkeypatch.setattr(rd, "run_reference", fake("reference"))
    monkeypatch.setattr(rd, "run_blis_fast", fake("blis_fast"))
    cfg = {"id": "x", "args": ["--model", "m", "--kv-cpu-blocks", "9"], "files": {},
           "family": "offload", "blis_fast_args": ["--kv-cpu-reload", "always"]}
    record = rd.check_config(cfg, "ref", 5.0)
    assert "--kv-cpu-reload" not in seen["reference"]
    assert seen["blis_fast"][-2:] == ["--kv-cpu-reload", "always"]
    assert record["status"] == "both-refused"
    assert record["blis_fast_args"] == ["--kv-cpu-reload", "always"]
    report = tmp_path / "r.jsonl"
    report.write_text(json.dumps(record) + "\n")
    assert rd.load_configs(report)[0]["blis_fast_args"] == ["--kv-cpu-reload", "always"]


def test_shrink_keeps_the_flags_whose_august_defaults_differ(monkeypatch) -> None:
    """Against the August reference ``--shrink`` never drops ``--latency-model`` or
    ``--snapshot-refresh-interval`` (their defaults changed after April, so a configuration
    without them differs for that reason alone); other flags go when the difference stays."""
    def always_differs(config, *_args, **_kw):
        return {"status": "differ", "fields": ["e2e_mean_ms"]}

    monkeypatch.setattr(rd, "check_config", always_differs)
    monkeypatch.setitem(rd.HEAD_EXTRAS, "on", True)
    cfg = {"id": "x", "files": {}, "family": "offload",
           "args": ["--model", "m", "--latency-model", "roofline", "--seed", "3",
                    "--snapshot-refresh-interval", "0", "--num-instances", "2"]}
    small = rd.shrink(cfg, {"status": "differ", "fields": ["e2e_mean_ms"]}, "ref", 5.0)
    assert small["args"] == ["--model", "m", "--latency-model", "roofline",
                             "--snapshot-refresh-interval", "0"]
    monkeypatch.setitem(rd.HEAD_EXTRAS, "on", False)
    assert rd.shrink(cfg, {"status": "differ", "fields": ["e2e_mean_ms"]}, "ref",
                     5.0)["args"] == ["--model", "m"]
