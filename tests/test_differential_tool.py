"""The differential-testing tool of tests/differential/, checked with stand-ins for the reference.

No reference binary is needed: the "reference" is a small script running blis_fast's own CLI
(so every configuration must agree), or one that adds 1 to a number of its stdout (so the tool
must report a difference naming that field, and ``--shrink`` must drop flags).
"""

from __future__ import annotations

import io
import json
import sys
from contextlib import redirect_stderr
from pathlib import Path

import pytest
from _cli import refused

DIFF_DIR = Path(__file__).resolve().parent / "differential"
if str(DIFF_DIR) not in sys.path:
    sys.path.insert(0, str(DIFF_DIR))

import run_differential as rd  # noqa: E402
from config_generator import LORA_INVALID_KINDS, generate_configs, option_fields  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SMALL_CONFIG = {"id": "small", "files": {},
                "args": ["--model", "meta-llama/llama-3.1-8b-instruct", "--num-requests", "8",
                         "--rate", "20", "--max-num-running-reqs", "2"]}

_RUN_CLI = f"""\
import contextlib, io, re, sys
sys.path.insert(0, {str(REPO)!r})
from blis_fast.cli import main
out = io.StringIO()
code = 0
with contextlib.redirect_stdout(out):
    try:
        main(sys.argv[1:])
    except SystemExit as exc:
        code = exc.code
text = out.getvalue()
"""


def _stand_in(tmp_path: Path, name: str, body: str) -> str:
    """An executable Python script at ``tmp_path/name`` (the reference stand-in)."""
    path = tmp_path / name
    path.write_text(f"#!{sys.executable}\n{body}")
    path.chmod(0o755)
    return str(path)


def _same_cli(tmp_path: Path) -> str:
    return _stand_in(tmp_path, "same-blis", _RUN_CLI + "sys.stdout.write(text)\nsys.exit(code)\n")


def _perturbed_cli(tmp_path: Path) -> str:
    """Adds 1 to the first ``completed_requests`` of stdout."""
    bump = ("text = re.sub(r'\"completed_requests\": (\\d+)', "
            "lambda m: f'\"completed_requests\": {int(m.group(1)) + 1}', text, count=1)\n")
    return _stand_in(tmp_path, "perturbed-blis",
                     _RUN_CLI + bump + "sys.stdout.write(text)\nsys.exit(code)\n")


def test_generator_is_reproducible_and_seed_dependent() -> None:
    assert generate_configs(5, 10) == generate_configs(5, 10)
    assert generate_configs(5, 10) != generate_configs(6, 10)
    assert all(cfg["args"][:2] == ["--model", cfg["args"][1]] for cfg in generate_configs(5, 10))


@pytest.mark.parametrize(("family", "seed", "count"), [("april", 2026, 40), ("august", 7, 30),
                                                      ("lora", 31, 40)])
def test_generated_configurations_pass_blis_fast_validation(tmp_path, monkeypatch, family, seed,
                                                            count) -> None:
    """Every configuration but the deliberately invalid ones passes ``build_options`` +
    ``runner.prepare`` (the sweep's check); the families' new flags and keys are drawn."""
    from blis_fast.options import build_options
    from blis_fast.runner import prepare

    monkeypatch.chdir(tmp_path)
    configs = generate_configs(seed, count, family=family)
    assert any(cfg["files"] for cfg in configs)  # some draw a workload spec
    drawn = " ".join(" ".join(cfg["args"]) + " ".join(cfg["files"].values()) for cfg in configs)
    wanted = {"april": ("--admission-policy", "--fitness-weights", "--gpu-memory-utilization",
                        "pareto_lognormal", "empirical", "--vllm-version", "--routing-latency"),
              "august": ("--prefill-instances", "--prefill-tp", "node_pools", "autoscaler:",
                         "analyzer:", "--snapshot-refresh-interval", "mistral-nemo"),
              "lora": ("--lora-config", "adapter_capacity:", "lora-affinity",
                       "--lora-scorer-weight", "step_overhead_tiers:", "cohorts:")}[family]
    assert [w for w in wanted if w not in drawn] == []
    for cfg in configs:
        if cfg.get("invalid"):
            continue
        for name, text in cfg["files"].items():
            (tmp_path / name).write_text(text)
        with redirect_stderr(io.StringIO()):
            prepared = prepare(build_options(option_fields(cfg["args"])))
        assert prepared.table is not None, cfg["id"]


def test_lora_family_draws_what_parity_can_check() -> None:
    """The LoRA family (spec lora.md section 10): reproducible by seed; draws the file's
    capacity, ranks 8..64, base models, custom tiers with and without k6, the --lora-* flags,
    adapters on clients and cohorts beside base-model clients, lora-affinity in scorers, bundle
    or --lora-scorer-weight, periodic snapshots, SJF, deadlines, explicit KV blocks and both
    latency models; never priority schedulers, P/D, the autoscaler or open-loop sessions; its
    invalid share covers every invalid kind."""
    import yaml

    configs = generate_configs(31, 250, family="lora")
    assert configs == generate_configs(31, 250, family="lora")
    assert configs[:20] != generate_configs(32, 20, family="lora")
    assert all(c["id"].startswith("l31-") and c["family"] == "lora" for c in configs)
    drawn = " ".join(" ".join(c["args"]) for c in configs)
    for wanted in ("--lora-adapter-capacity", "--lora-load-base-latency-us",
                   "--lora-load-bandwidth-bytes-us", "--lora-footprint-bytes-per-rank",
                   "--lora-scorer-weight", "--routing-scorers", "--policy-config",
                   "--snapshot-refresh-interval 100000", "--scheduler sjf", "--timeout",
                   "--total-kv-blocks", "--latency-model trained-physics",
                   "--routing-policy round-robin", "--routing-policy least-loaded"):
        assert wanted in drawn, wanted
    for banned in ("priority", "--prefill-instances", "--pd-", "node_pools", "autoscaler"):
        assert banned not in drawn + " ".join(c["files"].get("policy.yaml", "")
                                              for c in configs), banned
    ranks, base_models, k6, no_k6, base_clients, cohort_adapters = set(), 0, 0, 0, 0, 0
    for cfg in configs:
        assert "--snapshot-refresh-interval" in cfg["args"]
        block = yaml.safe_load(cfg["files"]["lora.yaml"])["lora"]
        ranks |= {a["rank"] for a in block["adapters"]}
        base_models += sum("base_model" in a for a in block["adapters"])
        for tier in block.get("step_overhead_tiers", {}).values():
            k6, no_k6 = k6 + ("k6" in tier), no_k6 + ("k6" not in tier)
        spec = yaml.safe_load(cfg["files"]["workload.yaml"])
        base_clients += sum("adapter" not in c for c in spec["clients"])
        cohort_adapters += sum("adapter" in c for c in spec.get("cohorts", []))
        for client in spec["clients"]:
            assert client.get("closed_loop", True) is True  # no open-loop sessions
    valid_ranks = {r for r in ranks if r > 0}
    assert min(valid_ranks) == 8 and max(valid_ranks) == 64 and len(valid_ranks) > 10
    assert min(base_models, k6, no_k6, base_clients, cohort_adapters) > 0
    assert 0 < sum(bool(c.get("invalid")) for c in configs) < 0.15 * len(configs)


@pytest.mark.parametrize("kind", LORA_INVALID_KINDS)
def test_invalid_lora_configurations_are_refused_by_blis_fast(tmp_path, monkeypatch,
                                                              kind) -> None:
    """Each kind of invalid LoRA configuration (both references refuse them all: capacity 0
    with adapters, an adapter the registry lacks, lora-affinity named twice, ...) makes
    blis_fast exit 2 with an error line, before simulating."""
    import random

    from config_generator import lora_config

    monkeypatch.chdir(tmp_path)
    rng = random.Random(LORA_INVALID_KINDS.index(kind))
    cfg = lora_config(rng, f"bad-{kind}", max_requests=20, invalid=kind)
    assert cfg["invalid"] and cfg["invalid_kind"] == kind
    refused(cfg, tmp_path)


def test_invalid_configurations_are_refused_by_blis_fast(tmp_path, monkeypatch) -> None:
    """Each deliberately invalid configuration makes blis_fast exit 2 with one error line."""
    import random

    from config_generator import invalid_config

    monkeypatch.chdir(tmp_path)
    rng = random.Random(3)
    configs = [invalid_config(rng, f"bad{i}") for i in range(30)]
    assert len({" ".join(c["args"]) + str(c["files"]) for c in configs}) > 15
    for cfg in configs:
        assert cfg["invalid"]
        refused(cfg, tmp_path)


def test_field_name_and_classification() -> None:
    assert rd.field_name("results.requests[3].ttft_ms: 1.0 != 2.0") == "ttft_ms"
    assert rd.field_name("Priority Inversions: 123 != 129") == "Priority Inversions"
    assert rd.field_name("trace.yaml: text differs") == "trace.yaml"
    diffs = rd.trace_csv_differences("id,arrival_us,input\n0,5,9\n1,7,9\n",
                                     "id,arrival_us,input\n0,5,9\n1,8,9\n")
    assert diffs == ["trace.csv.arrival_us[1]: '7' != '8'"]
    assert rd.field_name(diffs[0]) == "arrival_us"
    ok = {"exit_code": 0}
    noise = ["Priority Inversions: 123 != 129"]
    assert rd.classify(ok, ok, []) == "agree"
    assert rd.classify(ok, ok, noise) == "known-noise"
    assert rd.classify(ok, ok, noise + ["results.completed_requests: 5 != 6"]) == "differ"
    assert rd.classify({"exit_code": 2}, {"exit_code": 1}, []) == "both-refused"
    assert rd.classify({"exit_code": 2}, ok, []) == "blis_fast-refused"
    assert rd.classify(ok, {"exit_code": None}, []) == "reference-timeout"
    stopped = {"exit_code": None, "limit": "timeout"}
    assert rd.classify(stopped, ok, []) == "blis_fast-timeout"
    assert rd.classify(stopped, {"exit_code": None}, []) == "both-timeout"
    assert rd.classify({"exit_code": None, "limit": "oom"}, ok, []) == "blis_fast-oom"
    assert rd.classify({"exit_code": None}, ok, []) == "blis_fast-error"
    assert rd.classify(ok, ok, [], invalid=True) == "invalid-accepted"
    assert rd.classify({"exit_code": 2}, {"exit_code": 1}, [], invalid=True) == "both-refused"
    august = ["Priority Inversions: 0 != 7"]
    assert rd.classify(ok, ok, august, noise=rd.AUGUST_KNOWN_NOISE) == "known-noise"


def test_blis_fast_against_itself_agrees(tmp_path) -> None:
    configs = generate_configs(11, 4, max_requests=10)
    report = tmp_path / "report.jsonl"
    records = rd.run_all(configs, _same_cli(tmp_path), timeout=120, jobs=2, report=report,
                         quiet=True)
    assert [r["status"] for r in records] == ["agree"] * 4, [r["differences"] for r in records]
    lines = [json.loads(line) for line in report.read_text().splitlines()]
    assert [r["id"] for r in lines] == [c["id"] for c in configs]
    assert "agree                     4" in rd.summary_table(records)


def test_perturbed_reference_differs_and_shrinks(tmp_path) -> None:
    records = rd.run_all([SMALL_CONFIG], _perturbed_cli(tmp_path), timeout=120, jobs=3,
                         do_shrink=True, quiet=True)
    (record,) = records
    assert record["status"] == "differ"
    assert record["fields"] == ["completed_requests"]
    assert record["differences"][0].endswith("8 != 9")
    assert record["shrunk_args"] == ["--model", "meta-llama/llama-3.1-8b-instruct"]
    assert "shrunk: --model meta-llama/llama-3.1-8b-instruct" in rd.summary_table(records)


@pytest.mark.parametrize(("body", "status"), [
    ("import sys, time\ntime.sleep(30)\n", "reference-timeout"),
    ("import sys\nsys.stderr.write('error: no\\n')\nsys.exit(2)\n", "reference-refused"),
])
def test_reference_timeout_and_refusal(tmp_path, body, status) -> None:
    records = rd.run_all([SMALL_CONFIG], _stand_in(tmp_path, "ref", body), timeout=1.0, jobs=1,
                         quiet=True)
    assert records[0]["status"] == status
    assert records[0]["blis_fast_exit"] == 0


def test_spec_reductions_drop_one_thing_each() -> None:
    spec = {"version": "2", "num_requests": 40, "horizon": 5_000_000,
            "clients": [{"id": "a", "lifecycle": {"windows": []}, "prefix_group": "g"},
                        {"id": "b"}],
            "cohorts": [{"id": "c", "spike": {"start_time_us": 0, "duration_us": 1}}]}
    variants = rd.spec_reductions(spec)
    assert len(variants) == 3 + 3 + 2  # 3 entries fewer, 3 optional keys fewer, horizon, half
    assert [c["id"] for c in variants[0]["clients"]] == ["b"]
    assert variants[1]["clients"][0] == {"id": "a", "prefix_group": "g"}
    assert "cohorts" not in variants[4] and variants[5]["cohorts"] == [{"id": "c"}]
    assert "horizon" not in variants[-2]
    assert variants[-1]["num_requests"] == 20
    assert spec["clients"][0]["prefix_group"] == "g"  # the original is left alone
    assert rd.spec_reductions({"clients": [{"id": "only"}], "num_requests": 9}) == []
    lora = rd.spec_reductions({"clients": [{"id": "c", "adapter": "a0", "model": "m"}]})
    assert lora == [{"clients": [{"id": "c", "model": "m"}]},
                    {"clients": [{"id": "c", "adapter": "a0"}]}]


def test_exact_mode_compares_an_earlier_build_byte_for_byte(tmp_path, monkeypatch) -> None:
    """``--exact``: the same build agrees on stdout, results, trace and Parquet data; a build
    whose stdout differs only in layout (the parity rules read it as equal) differs."""
    monkeypatch.setitem(rd.EXACT, "on", True)
    same = rd.check_config(SMALL_CONFIG, _same_cli(tmp_path), timeout=120)
    assert same["status"] == "agree", same["differences"]
    spaced = _stand_in(tmp_path, "spaced-blis",
                       _RUN_CLI + "sys.stdout.write(text + '\\n')\nsys.exit(code)\n")
    record = rd.check_config(SMALL_CONFIG, spaced, timeout=120)
    assert record["status"] == "differ" and record["differences"] == ["stdout: text differs"]
    monkeypatch.setitem(rd.EXACT, "on", False)
    assert rd.check_config(SMALL_CONFIG, spaced, timeout=120)["status"] == "agree"


def test_exact_differences_read_parquet_by_data(tmp_path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    new, old = tmp_path / "new", tmp_path / "old"
    for side, extra in ((new, {"added": [7, 8]}), (old, {})):
        side.mkdir()
        table = pa.table({"x": [1, 2], **extra}).replace_schema_metadata({"k": str(side)})
        pq.write_table(table, side / "t.parquet")
    assert rd.exact_differences(new, "s", old, "s") == []  # added column, other metadata
    pq.write_table(pa.table({"x": [1, 3]}), old / "t.parquet")
    assert rd.exact_differences(new, "s", old, "s") == ["t.parquet: data differs"]


BIG_CONFIG = {"id": "big", "files": {},
              "args": ["--model", "meta-llama/llama-3.1-8b-instruct", "--num-requests", "60000",
                       "--rate", "2000"]}
_FAST_FOR_BIG = ("import sys\n"
                 "if '60000' in sys.argv:\n"
                 "    sys.exit(0)\n")
"""A stand-in reference that answers the big configuration at once and runs the others."""


def test_blis_fast_over_its_time_limit_is_recorded_and_the_tool_continues(tmp_path) -> None:
    """A blis_fast run longer than ``--timeout`` is killed and recorded; the next configuration
    runs in a fresh worker."""
    reference = _stand_in(tmp_path, "ref", _FAST_FOR_BIG + _RUN_CLI
                          + "sys.stdout.write(text)\nsys.exit(code)\n")
    records = rd.run_all([BIG_CONFIG, {**BIG_CONFIG, "id": "big2"}], reference, timeout=0.5,
                         jobs=1, quiet=True)
    assert [r["status"] for r in records] == ["blis_fast-timeout"] * 2, records
    assert records[0]["blis_fast_exit"] is None
    assert "timed out after 0.5 s" in records[0]["blis_fast_stderr"]
    assert "blis_fast-timeout" in rd.summary_table(records)
    assert rd.check_config(SMALL_CONFIG, reference, timeout=60)["status"] == "agree"


def test_blis_fast_over_its_memory_limit_is_recorded_and_the_tool_continues(
        tmp_path, monkeypatch) -> None:
    """Under an address-space limit too small for blis_fast every configuration is recorded as
    ``blis_fast-oom`` (no exception, the report complete; blis_fast starts without the limit)."""
    report = tmp_path / "report.jsonl"
    monkeypatch.setitem(rd.LIMITS, "memory_mb", 200)
    records = rd.run_all([SMALL_CONFIG, {**SMALL_CONFIG, "id": "small2"}], _same_cli(tmp_path),
                         timeout=60, jobs=1, report=report, quiet=True)
    assert [r["status"] for r in records] == ["blis_fast-oom", "blis_fast-oom"]
    assert len(report.read_text().splitlines()) == 2
    assert "did not start" in records[0]["blis_fast_stderr"]


def test_worker_reports_memory_errors_as_out_of_memory() -> None:
    """A MemoryError, also wrapped in another exception, counts as the memory limit."""
    import blis_worker

    assert blis_worker.out_of_memory(MemoryError())
    try:
        try:
            raise MemoryError("numpy")
        except MemoryError as exc:
            raise RuntimeError("wrapped") from exc
    except RuntimeError as wrapped:
        assert blis_worker.out_of_memory(wrapped)
    assert not blis_worker.out_of_memory(ValueError("bad"))


def test_august_inversion_noise_may_add_the_whole_anomaly_section(monkeypatch, tmp_path) -> None:
    """The August reference prints an anomaly section with only its inversion count non-zero
    where blis_fast prints none: known noise under ``--family august``, a difference otherwise."""
    base = "=== Simulation Metrics ===\n{\n  \"completed_requests\": 5\n}\n"
    theirs = (base + "=== Anomaly Counters ===\nPriority Inversions: 287\n"
              "HOL Blocking Events: 0\nTimed Out Requests: 0\n")
    assert rd.without_inversions(theirs) == (base, "287")
    busy = theirs.replace("Timed Out Requests: 0", "Timed Out Requests: 2")
    assert rd.without_inversions(busy)[0] == (
        base + "=== Anomaly Counters ===\nHOL Blocking Events: 0\nTimed Out Requests: 2\n")
    monkeypatch.setitem(rd.HEAD_EXTRAS, "on", True)
    errors = rd.compare_outputs(tmp_path, base, tmp_path, theirs)
    assert errors == ["Priority Inversions: 0 != 287"]
    ok = {"exit_code": 0}
    assert rd.classify(ok, ok, errors, noise=rd.AUGUST_KNOWN_NOISE) == "known-noise"
    monkeypatch.setitem(rd.HEAD_EXTRAS, "on", False)
    assert rd.classify(ok, ok, rd.compare_outputs(tmp_path, base, tmp_path, theirs)) == "differ"


def test_a_worker_that_cannot_start_at_all_is_an_error_not_out_of_memory(tmp_path,
                                                                          monkeypatch) -> None:
    """A worker that fails to start even without a memory limit is ``blis_fast-error``."""
    broken = tmp_path / "broken_worker.py"
    broken.write_text("import sys\nsys.exit('no blis_fast here')\n")
    monkeypatch.setattr(rd, "WORKER", broken)
    monkeypatch.setitem(rd.LIMITS, "memory_mb", 1234)  # a pool of its own
    try:
        record = rd.check_config(SMALL_CONFIG, _same_cli(tmp_path), timeout=60)
    finally:
        rd.close_workers()
    assert record["status"] == "blis_fast-error"
    assert "no blis_fast here" in record["blis_fast_stderr"]
