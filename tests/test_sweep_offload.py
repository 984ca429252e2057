"""Sweeps that vary the KV offload chain (``kv_offload.*`` keys, issue 32): each configuration's
``kv_offload:`` block is written under ``--out``/kv_offload, its rows equal ``blis run`` with
that file, its columns are typed, and bad keys or values are one error naming the spec line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import polars as pl
import pytest
import yaml
from _sweep import MODEL, summary, write_spec

import blis_fast
from blis_fast.errors import BlisError
from blis_fast.sweep.run import run_sweep
from blis_fast.sweep.spec import load_sweep_plan
from blis_fast.sweep.store import metric_fields

CASE = Path(__file__).parent / "reference_cases" / "cases" / "kvo-cpu-only-tiny-budget"
"""A shared-prefix workload and an 80 MiB CPU tier (40 blocks) from the parity cases."""

ARGS = {"model": MODEL, "latency_model": "roofline", "snapshot_refresh_interval": 0,
        "total_kv_blocks": 220}


def _spec(tmp: Path, axes: str) -> Path:
    shutil.copy(CASE / "wl.yaml", tmp / "wl.yaml")
    shutil.copy(CASE / "offload.yaml", tmp / "offload.yaml")
    base = "".join(f"  {k}: {v}\n" for k, v in ARGS.items())
    return write_spec(tmp, f"base:\n{base}  workload_spec: wl.yaml\n"
                           f"  kv_offload_config: offload.yaml\n{axes}")


def test_a_cpu_budget_grid_runs_each_block_as_blis_run_would(tmp_path):
    spec = _spec(tmp_path, "grid:\n"
                           "  kv_offload.cpu_bytes_to_use: [20971520, 335544320]\n"
                           "  kv_offload.offload_prompt_only: [true, false]\n")
    out = tmp_path / "out"
    run_sweep(spec, out, workers=1)
    frame = summary(out)
    assert frame.height == 4 and frame["error"].null_count() == 4
    assert frame.schema["kv_offload.cpu_bytes_to_use"] == pl.Int64
    assert frame.schema["kv_offload.offload_prompt_only"] == pl.Boolean
    assert frame.schema["kv_offload_config"] == pl.String  # the base file, as given
    plan = load_sweep_plan(spec)
    metrics = [f.name for f in metric_fields()]
    rows_by_budget = {}
    for config, row in zip(plan.configs, frame.iter_rows(named=True), strict=True):
        written = out / "kv_offload" / f"{config.config_id}.yaml"
        block = yaml.safe_load(written.read_text())["kv_offload"]
        assert block == {"cpu_bytes_to_use": row["kv_offload.cpu_bytes_to_use"],
                         "offload_prompt_only": row["kv_offload.offload_prompt_only"]}
        direct = blis_fast.run(**ARGS, workload_spec=str(CASE / "wl.yaml"), seed=row["seed"],
                               kv_offload_config=str(written), log="error").summary_row
        for name in metrics:
            assert row[name] == direct.get(name, 0), name  # absent counts are 0 rows
        rows_by_budget.setdefault(row["kv_offload.cpu_bytes_to_use"], []).append(row)
    assert sorted(rows_by_budget) == [20971520, 335544320]


def test_the_whole_tier_list_and_one_tier_field_can_vary(tmp_path):
    spec = _spec(tmp_path, "grid:\n"
                           "  kv_offload.secondary_tiers:\n"
                           "    - [{type: fs, root_dir: /mnt/nvme, device_class: nvme_gen4,"
                           " direct_io: true}]\n"
                           "    - [{type: fs, root_dir: /mnt/ssd, device_class: sata_ssd,"
                           " direct_io: false}]\n"
                           "  kv_offload.secondary_tiers.0.n_read_threads: [4, 32]\n")
    plan = load_sweep_plan(spec)
    assert len(plan.configs) == 4
    blocks = [plan.offload_block(c) for c in plan.configs]
    assert [(b["secondary_tiers"][0]["device_class"], b["secondary_tiers"][0]["n_read_threads"])
            for b in blocks] == [("nvme_gen4", 4), ("nvme_gen4", 32), ("sata_ssd", 4),
                                 ("sata_ssd", 32)]
    assert all(b["cpu_bytes_to_use"] == 83886080 for b in blocks)  # from the base file
    # the list is a column of its JSON text
    assert json.loads(plan.configs[0].values["kv_offload.secondary_tiers"])[0]["root_dir"] \
        == "/mnt/nvme"


@pytest.mark.parametrize(("axes", "line", "words"), [
    ("grid:\n  kv_offload.nope: [1]\n", 9, "unknown offload key 'kv_offload.nope'"),
    ("grid:\n  kv_offload.secondary_tiers.0.direct_io: [true]\n", 9,
     "the configuration has 0 secondary tier(s)"),
    ("grid:\n  kv_offload.cpu_bytes_to_use: [abc]\n", 9, "invalid value 'abc'"),
    ("grid:\n  kv_offload.secondary_tiers: [{type: fs}]\n", 9, "expected a list of tiers"),
    ("grid:\n  kv_offload.blocks_per_chunk: [1, 2]\n", 9,
     "configuration 000001-0dbd9a8a (kv_offload.blocks_per_chunk=2): --kv-offload-config: "
     "blocks_per_chunk 2"),
    ("grid:\n  kv_offload.eviction_policy: [lru, mru]\n", 9, '"kv_offload/000001-'),
])
def test_a_bad_offload_key_or_value_is_one_error_naming_the_line(tmp_path, axes, line, words):
    spec = _spec(tmp_path, axes)
    with pytest.raises(BlisError) as err:
        load_sweep_plan(spec)
    message = str(err.value)
    assert message.startswith(f"{spec}:{line}:"), message
    assert words in message, message


def test_saturate_runs_each_offload_block(tmp_path):
    from blis_fast.sweep.saturate import find_saturation, parse_slo

    shutil.copy(CASE / "offload.yaml", tmp_path / "offload.yaml")
    spec = write_spec(tmp_path, f"base:\n  model: {MODEL}\n  num_requests: 60\n"
                                "  kv_offload_config: offload.yaml\n"
                                "grid:\n  kv_offload.cpu_bytes_to_use: [83886080, 0]\n")
    with pytest.raises(BlisError, match=r"sweep.yaml:6: configuration 000001-.*"
                                        r"kv_offload.cpu_bytes_to_use=0"):
        find_saturation(spec, [parse_slo("ttft_p99_ms<1e9")], 1.0, 4.0, 2.0, workers=1)
    write_spec(tmp_path, spec.read_text().replace(", 0]", ", 167772160]"))
    table = pl.from_arrow(find_saturation(spec, [parse_slo("ttft_p99_ms<1e9")], 1.0, 4.0, 2.0,
                                          workers=1))
    assert table["kv_offload.cpu_bytes_to_use"].to_list() == [83886080, 167772160]
    assert table["max_rate_per_sec"].to_list() == [4.0, 4.0]
    assert table["error"].null_count() == 2
