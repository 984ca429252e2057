"""Policy evolution (blis_fast.evolve): contained evaluation, determinism and cache, the
OpenEvolve evaluator contract through OpenEvolve's own Evaluator, GEPA's optimize loop with a
deterministic stand-in for the reflection LM, and the ``blis evolve`` commands."""

from __future__ import annotations

import asyncio
import copy
import json
import time

import pytest

from blis_fast.cli import main as cli_main
from blis_fast.evolve import WORST_FITNESS
from blis_fast.evolve.adapters import (
    COMPONENT,
    INITIAL_PROGRAMS,
    BlisGEPAAdapter,
    write_openevolve_files,
)
from blis_fast.evolve.benchmark import DEFAULT_BENCHMARK, benchmark_from_dict
from blis_fast.evolve.evaluate import evaluate_source
from blis_fast.evolve.sandbox import EvalCache, Evaluator

TIMEOUT_S = 8.0
HEAD = "def custom_scorer(snapshots, request, out):\n"
LEAST_LOADED = INITIAL_PROGRAMS["scorer"]
BETTER = (HEAD + "    least = 1e18\n"
          "    for i in range(out.shape[0]):\n"
          "        least = min(least, snapshots[i, 0] + snapshots[i, 2])\n"
          "    for i in range(out.shape[0]):\n"
          "        load = snapshots[i, 0] + snapshots[i, 2] - least\n"
          "        cached = snapshots[i, 5] / max(1.0, request[4])\n"
          "        out[i] = 0.5 / (1.0 + 0.25 * load) + 0.5 * cached\n")
WORSE = HEAD + "    for i in range(out.shape[0]):\n        out[i] = 1.0 if i == 0 else 0.0\n"
BAD = {
    "timeout": HEAD + "    while True:\n        out[0] += 1.0\n",
    "memory": "import numpy as np\nBLOB = np.ones(1 << 30)\n" + HEAD + "    out[0] = 1.0\n",
    "exception": HEAD + "    raise ValueError('bad candidate')\n",
    "compile": HEAD + "    out[0] = = 1\n",
    "non_finite": "import math\n" + HEAD + "    for i in range(out.shape[0]):\n"
                  "        out[i] = math.nan\n",
}


def _small_bench(num_requests: int = 300):
    """The default benchmark's three workloads, one seed, a few hundred requests each."""
    data = copy.deepcopy(DEFAULT_BENCHMARK)
    data["seeds"] = [1]
    for w in data["workloads"]:
        w["options"] = {"num_requests": num_requests}
    return benchmark_from_dict(data, "test benchmark")


@pytest.fixture(scope="module")
def evaluator():
    return Evaluator("scorer", _small_bench(), timeout_s=TIMEOUT_S, memory_mb=512, workers=2)


def test_containment_each_failure_scores_worst_with_its_reason(evaluator):
    """A looping, allocating, raising, non-compiling and NaN candidate each end as a failure
    record within the timeout, evaluated alongside a good one that still scores."""
    names = list(BAD)
    started = time.monotonic()
    records = evaluator.evaluate_many([BAD[n] for n in names] + [LEAST_LOADED])
    elapsed = time.monotonic() - started
    for name, record in zip(names, records, strict=False):
        assert record["ok"] is False, name
        assert record["fitness"] == WORST_FITNESS, name
        assert record["error"]["kind"] == name, (name, record["error"])
        assert record["seconds"] < TIMEOUT_S + 5, name
    assert "bad candidate" in records[names.index("exception")]["error"]["message"]
    assert "8 s" in records[names.index("timeout")]["error"]["message"]
    good = records[-1]
    assert good["ok"] and 0.0 <= good["fitness"] <= 1.0
    assert elapsed < 3 * TIMEOUT_S


@pytest.mark.parametrize(("body", "kind"), [
    ("    for i in range(out.shape[0]):\n        out[i] = 1.0\n"
     "    if request[5] > 50.0:\n        raise ValueError('late failure')\n", "exception"),
    ("    for i in range(out.shape[0]):\n"
     "        out[i] = 1.0 if request[5] < 50.0 else math.inf - math.inf\n", "non_finite"),
])
def test_failure_inside_a_simulation_is_a_failure(body, kind):
    """The probe inputs pass; the policy fails only on the 51st request of a run."""
    record = evaluate_source("import math\n" + HEAD + body, "scorer", _small_bench(100),
                             feedback=False)
    assert (record["ok"], record["fitness"], record["error"]["kind"]) == (False, -1.0, kind)


def test_evaluation_is_deterministic_and_cached(evaluator):
    bench = _small_bench()
    first = evaluate_source(BETTER, "scorer", bench)
    again = evaluate_source(BETTER, "scorer", bench)
    first.pop("seconds"), again.pop("seconds")
    assert first == again
    baseline = evaluate_source(LEAST_LOADED, "scorer", bench)
    assert first["fitness"] > baseline["fitness"]
    assert "beat the baseline" in first["feedback"]
    assert "regret" in first["feedback"] and "request_" in first["feedback"]
    record = evaluator.evaluate(BETTER)
    assert record["fitness"] == first["fitness"]
    started = time.monotonic()
    assert evaluator.evaluate(BETTER) is record  # the cache, no second child process
    assert time.monotonic() - started < 0.05


def test_cache_directory_survives_the_process(tmp_path):
    bench = _small_bench()
    key = EvalCache.key(BETTER, "scorer", bench, "full")
    EvalCache(tmp_path).put(key, {"fitness": 0.5, "error": None})
    assert EvalCache(tmp_path).get(key) == {"fitness": 0.5, "error": None}
    EvalCache(tmp_path).put("t", {"fitness": -1.0, "error": {"kind": "timeout"}})
    assert EvalCache(tmp_path).get("t") is None


def test_weighted_fitness_matches_the_fitness_section():
    """fitness kind ``weights`` is the number ``--fitness-weights`` prints."""
    import blis_fast

    data = _small_bench(200).to_dict()
    data["fitness"] = {"kind": "weights", "weights": "p99_ttft:0.5,throughput:0.5"}
    data["workloads"] = data["workloads"][:1]
    bench = benchmark_from_dict(data)
    record = evaluate_source(LEAST_LOADED, "scorer", bench, feedback=False)
    from blis_fast.evolve.benchmark import run_plan
    from blis_fast.evolve.evaluate import compile_candidate

    opts = run_plan(bench)[0][3]
    out = blis_fast.run(**opts, routing_policy="weighted", routing_scorers="custom:1",
                        custom_scorer=compile_candidate(LEAST_LOADED, "scorer"),
                        fitness_weights="p99_ttft:0.5,throughput:0.5").stdout
    printed = float(out.split("=== Fitness Evaluation ===\nScore: ")[1].split()[0])
    assert record["fitness"] == pytest.approx(printed, abs=5e-7)


def test_openevolve_evaluator_runs_the_generated_files(tmp_path, monkeypatch):
    """OpenEvolve's own Evaluator, configured by the generated config.yaml, scores the
    generated initial program through the cascade, and a broken program as the worst."""
    from openevolve.config import load_config
    from openevolve.evaluator import Evaluator as OEEvaluator

    write_openevolve_files(tmp_path, "scorer", _small_bench(), timeout_s=TIMEOUT_S,
                           memory_mb=512)
    monkeypatch.setenv("OPENAI_API_KEY", "unused-the-llm-is-not-called")
    config = load_config(str(tmp_path / "config.yaml"))
    assert config.evaluator.cascade_evaluation
    oe = OEEvaluator(config.evaluator, str(tmp_path / "evaluator.py"))
    initial = (tmp_path / "initial_program.py").read_text()
    metrics = asyncio.run(oe.evaluate_program(initial, "initial"))
    assert 0.0 <= metrics["combined_score"] <= 1.0
    assert {"bursty-prefix_fitness", "shared-prompt_fitness", "many-prefixes_fitness"} \
        <= set(metrics)
    assert "feedback" in oe.get_pending_artifacts("initial")
    broken = asyncio.run(oe.evaluate_program(BAD["compile"], "broken"))
    assert broken["combined_score"] == WORST_FITNESS
    assert "bursty-prefix_fitness" not in broken  # the cascade stopped at stage 1


def test_gepa_optimize_ends_on_the_better_candidate(evaluator):
    """Three reflection rounds with a stand-in LM proposing a worse, a broken and a better
    policy: the broken one does not stop the search, GEPA ends on the better one, and the
    reflection prompts carried the feedback."""
    import gepa

    proposals = iter([WORSE, BAD["exception"], BETTER])
    prompts: list[str] = []

    def reflection_lm(prompt: str) -> str:
        prompts.append(prompt if isinstance(prompt, str) else json.dumps(prompt))
        return "```python\n" + next(proposals, BETTER) + "```"

    adapter = BlisGEPAAdapter(evaluator=evaluator)
    result = gepa.optimize(seed_candidate={COMPONENT: LEAST_LOADED}, trainset=adapter.trainset(),
                           valset=adapter.trainset(), adapter=adapter,
                           reflection_lm=reflection_lm, reflection_minibatch_size=3,
                           max_metric_calls=30, display_progress_bar=False, seed=0,
                           skip_perfect_score=False)
    assert len(prompts) >= 3
    assert result.best_candidate[COMPONENT].strip() == BETTER.strip()
    assert any("vs baseline" in p for p in prompts)


def test_cli_eval_prints_the_record_and_init_writes_the_files(tmp_path, capsys):
    bench = tmp_path / "bench.yaml"
    bench.write_text(json.dumps(_small_bench(100).to_dict()))
    cand = tmp_path / "cand.py"
    cand.write_text(BAD["non_finite"])
    cli_main(["evolve", "eval", str(cand), "--benchmark", str(bench), "--timeout", "8"])
    record = json.loads(capsys.readouterr().out)
    assert record["fitness"] == WORST_FITNESS and record["error"]["kind"] == "non_finite"
    cli_main(["evolve", "init", "openevolve", "--target", "admission", "--out",
              str(tmp_path / "oe"), "--benchmark", str(bench)])
    assert sorted(p.name for p in (tmp_path / "oe").iterdir()) == [
        "benchmark.yaml", "config.yaml", "evaluator.py", "initial_program.py"]
    assert "def custom_admission" in (tmp_path / "oe" / "initial_program.py").read_text()


@pytest.mark.parametrize(("args", "message"), [
    (["evolve", "eval", "missing.py"], "CANDIDATE: cannot read missing.py"),
    (["evolve", "init", "openevolve", "--benchmark", "nope.yaml"], "--benchmark: cannot read"),
])
def test_cli_bad_input_is_one_line_exit_2(args, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        cli_main(args)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_help_does_not_load_the_simulator():
    """``blis --help`` and ``blis evolve --help`` stay light: no Numba, no OpenEvolve/GEPA."""
    import subprocess
    import sys

    code = ("import sys\nfrom blis_fast.cli import main\n"
            "for args in (['--help'], ['evolve', '--help'], ['evolve', 'eval', '--help']):\n"
            "    try:\n        main(args)\n    except SystemExit:\n        pass\n"
            "print(sorted(m for m in ('numba', 'openevolve', 'gepa', 'blis_fast.runner') "
            "if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert "Score CANDIDATE.py" in out
    assert out.strip().splitlines()[-1] == "[]"


def test_ray_backend_gives_the_local_records(evaluator):
    """Evaluations as Ray tasks (a local Ray): same records as the local pool, one task per
    distinct candidate, failures contained."""
    pytest.importorskip("ray", reason="the Ray backend needs the [ray] extra")
    ray_eval = Evaluator("scorer", evaluator.bench, timeout_s=TIMEOUT_S, memory_mb=512,
                         workers=1, backend="ray")
    records = ray_eval.evaluate_many([BETTER, BAD["compile"], BETTER])
    local = evaluator.evaluate(BETTER)
    assert records[0]["fitness"] == records[2]["fitness"] == local["fitness"]
    assert records[0]["workloads"] == local["workloads"]
    assert records[1]["error"]["kind"] == "compile"


def test_a_benchmark_the_simulator_refuses_is_named_as_such():
    data = _small_bench(50).to_dict()
    data["clusters"] = [{"name": "bad", "num_instances": 4, "routing_latency": -1}]
    record = evaluate_source(LEAST_LOADED, "scorer", benchmark_from_dict(data))
    assert record["error"]["kind"] == "benchmark"
    assert "--routing-latency must be >= 0" in record["error"]["message"]


def test_evolve_files_go_through_the_shared_file_checks(tmp_path, monkeypatch):
    """A FIFO candidate or benchmark is refused at once (no hang), a deeply nested benchmark
    is refused before composing, and ``init`` onto a path that is a file writes nothing."""
    import os

    from _cli import invoke

    monkeypatch.chdir(tmp_path)
    os.mkfifo(tmp_path / "cand.fifo")
    res = invoke(["evolve", "eval", "cand.fifo"])
    assert res.code == 2 and len(res.stderr.splitlines()) == 1 and "cand.fifo" in res.stderr
    (tmp_path / "deep.yaml").write_text("[" * 500 + "]" * 500)
    (tmp_path / "cand.py").write_text("def score(x):\n    return 0.0\n")
    res = invoke(["evolve", "eval", "cand.py", "--benchmark", "deep.yaml"])
    assert res.code == 2 and "deep.yaml" in res.stderr and "Traceback" not in res.stderr
    (tmp_path / "taken").write_text("not a folder")
    before = sorted(p.name for p in tmp_path.iterdir())
    res = invoke(["evolve", "init", "openevolve", "--out", "taken"])
    assert res.code == 2 and len(res.stderr.splitlines()) == 1 and "--out" in res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert (tmp_path / "taken").read_text() == "not a folder"
