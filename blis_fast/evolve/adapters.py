"""Framework adapters: OpenEvolve (generated evaluator files, cascade stages) and GEPA (an
adapter whose component is the policy source and whose data instances are the benchmark's
workloads). Both evaluate through the contained, cached ``sandbox.Evaluator``."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from blis_fast.evolve import FUNCTION_NAMES, TARGETS
from blis_fast.evolve.benchmark import Benchmark, load_benchmark
from blis_fast.evolve.sandbox import (
    DEFAULT_MEMORY_MB,
    DEFAULT_TIMEOUT_S,
    Evaluator,
    check_limits,
)
from blis_fast.files import OutputPlan

COMPONENT = "policy"
"""GEPA: the name of the candidate component holding the policy source."""

INITIAL_PROGRAMS = {
    "scorer": '''"""Routing scorer: one score per instance, the request goes to the best one."""

import numpy as np  # noqa: F401  (numpy and math work inside the function)

from blis_fast.kernels.cluster import hooks as H


# EVOLVE-BLOCK-START
def custom_scorer(snapshots, request, out):
    """Least loaded: prefer the instance with the fewest queued, batched and in-flight
    requests (snapshots[i, H.SNAP_*] columns; request[H.REQ_*]; write out[i] in [0, 1])."""
    for i in range(snapshots.shape[0]):
        load = snapshots[i, H.SNAP_QUEUE] + snapshots[i, H.SNAP_BATCH] \\
            + snapshots[i, H.SNAP_IN_FLIGHT]
        out[i] = 1.0 / (1.0 + load)
# EVOLVE-BLOCK-END
''',
    "admission": '''"""Admission rule: return True to admit the request."""

from blis_fast.kernels.cluster import hooks as H


# EVOLVE-BLOCK-START
def custom_admission(snapshots, request):
    """Admit everything (snapshots[i, H.SNAP_*] per instance; request[H.REQ_*])."""
    return True
# EVOLVE-BLOCK-END
''',
    "scheduler": '''"""Scheduler key: each step the wait queue is sorted by this key, ascending."""

from blis_fast.kernels.cluster import hooks as H


# EVOLVE-BLOCK-START
def custom_scheduler_key(features):
    """First come, first served (features[H.KEY_*] of one queued request)."""
    return features[H.KEY_ARRIVAL]
# EVOLVE-BLOCK-END
''',
}
"""The starting point of each target (least-loaded routing, admit-all, FCFS)."""

CONTRACTS = {
    "scorer": "custom_scorer(snapshots, request, out) -> None: snapshots is float64[n, 7] "
              "(columns queue, batch, in-flight, KV utilisation, free blocks, cached prefix "
              "blocks of this request, preemptions), request is float64[6] (input length, "
              "clock us, arrival us, SLO priority, input blocks, index); write one score per "
              "instance into out (clamped to [0, 1]); the request goes to the highest score.",
    "admission": "custom_admission(snapshots, request) -> bool: same inputs as a routing "
                 "scorer; return True to admit the request, False to reject it.",
    "scheduler": "custom_scheduler_key(features) -> float: features is float64[6] (input "
                 "length, arrival us, wait us, priority, SLO priority, max output); each step "
                 "the wait queue is sorted by the key, ascending.",
}


def system_message(target: str) -> str:
    """The instructions an LLM gets: what to write, in which language subset, for what."""
    return (f"You improve a request {target} policy for an LLM inference cluster simulator. "
            f"The program must define {CONTRACTS[target]} The function is compiled by Numba "
            "in nopython mode: use loops, float arithmetic, math and numpy scalars only; no "
            "Python objects, no I/O, no global state. Import only math, numpy, numba (njit) "
            "and `from blis_fast.kernels.cluster import hooks as H`; at module level write "
            "only functions and constants. It must be fast (it runs for every "
            "request) and always produce finite values. The fitness is the SLO goodput over "
            "bursty, prefix-heavy workloads; the feedback shows where the program lost "
            "against the baseline and the routing decisions behind the slowest requests.")


# --------------------------------------------------------------------------- OpenEvolve

EVALUATOR_TEMPLATE = '''"""OpenEvolve evaluator written by `blis evolve init openevolve --target {target}`.

Scores a program's `{function}` on benchmark.yaml (next to this file) with blis_fast, each
evaluation in a contained child process ({timeout:g} s, {memory} MB). Cascade: stage 1 runs
a tiny workload (does it compile and run?), stage 2 the whole benchmark.
"""

from pathlib import Path

from blis_fast.evolve.adapters import openevolve_result

TARGET = "{target}"
BENCHMARK = str(Path(__file__).with_name("benchmark.yaml"))
TIMEOUT_S = {timeout!r}
MEMORY_MB = {memory!r}


def evaluate_stage1(program_path):
    """Compile and run a tiny workload: combined_score >= 0 passes, -1 fails."""
    return openevolve_result(program_path, TARGET, BENCHMARK, "tiny", TIMEOUT_S, MEMORY_MB)


def evaluate_stage2(program_path):
    """The whole benchmark: combined_score is the fitness, artifacts hold the feedback."""
    return openevolve_result(program_path, TARGET, BENCHMARK, "full", TIMEOUT_S, MEMORY_MB)


def evaluate(program_path):
    """Without cascade: the whole benchmark."""
    return evaluate_stage2(program_path)
'''


def openevolve_config(target: str, timeout_s: float) -> dict[str, Any]:
    """An OpenEvolve config.yaml for evolving ``target`` (LLM endpoint from the environment)."""
    return {
        "max_iterations": 50,
        "checkpoint_interval": 10,
        "random_seed": 42,
        "diff_based_evolution": True,
        "max_code_length": 6000,
        "llm": {"api_base": "https://api.openai.com/v1", "api_key": "${OPENAI_API_KEY}",
                "models": [{"name": "gpt-4o-mini", "weight": 1.0}],
                "temperature": 0.7, "max_tokens": 4096, "timeout": 120},
        "prompt": {"system_message": system_message(target), "num_top_programs": 3,
                   "include_artifacts": True},
        "database": {"population_size": 50, "num_islands": 2, "archive_size": 20},
        "evaluator": {"timeout": int(timeout_s * 2 + 10), "max_retries": 0,
                      "cascade_evaluation": True, "cascade_thresholds": [0.0],
                      "parallel_evaluations": 2, "enable_artifacts": True},
    }


def write_openevolve_files(out_dir: str | Path, target: str, bench: Benchmark, *,
                           timeout_s: float = DEFAULT_TIMEOUT_S,
                           memory_mb: int = DEFAULT_MEMORY_MB,
                           inputs: Iterable[tuple[str, str]] = ()) -> list[Path]:
    """Write evaluator.py, initial_program.py, config.yaml and benchmark.yaml into
    ``out_dir``; returns the paths written. ``inputs`` (``(flag, path)``, e.g. the benchmark
    file read) may not be overwritten: an output naming one is refused before writing."""
    check_limits(timeout_s, memory_mb)
    files = {
        "evaluator.py": EVALUATOR_TEMPLATE.format(target=target, function=FUNCTION_NAMES[target],
                                                  timeout=timeout_s, memory=memory_mb),
        "initial_program.py": INITIAL_PROGRAMS[target],
        "config.yaml": yaml.safe_dump(openevolve_config(target, timeout_s), sort_keys=False,
                                      width=100),
        "benchmark.yaml": yaml.safe_dump(bench.to_dict(), sort_keys=False),
    }
    with OutputPlan() as plan:  # checked, then written together (or not at all)
        plan.add_inputs(inputs)
        plan.check_dir(out_dir, "--out")
        out = plan.make_dir(out_dir, "--out")
        for name in files:
            plan.check_file(out / name, "--out")
        for name, text in files.items():
            plan.stage_text(out / name, "--out", text)
        plan.commit()
    return [out / name for name in files]


_EVALUATORS: dict[tuple, Evaluator] = {}


def _evaluator(target: str, benchmark: str | None, timeout_s: float, memory_mb: int) -> Evaluator:
    """One cached Evaluator per (target, benchmark file, limits) in this process."""
    key = (target, benchmark, timeout_s, memory_mb)
    if key not in _EVALUATORS:
        _EVALUATORS[key] = Evaluator(target, load_benchmark(benchmark), timeout_s=timeout_s,
                                     memory_mb=memory_mb)
    return _EVALUATORS[key]


def openevolve_metrics(record: dict[str, Any]) -> tuple[dict[str, float], dict[str, str]]:
    """An evaluation record as OpenEvolve metrics (``combined_score`` = fitness) and
    artifacts (feedback, error)."""
    metrics = {"combined_score": float(record["fitness"])}
    for name, m in (record.get("workloads") or {}).items():
        metrics[f"{name}_fitness"] = float(m["fitness"])
        metrics[f"{name}_ttft_p99_ms"] = float(m["ttft_p99_ms"])
    artifacts = {"feedback": record.get("feedback", "")}
    if record.get("error"):
        artifacts["error"] = f"{record['error']['kind']}: {record['error']['message']}"
    return metrics, artifacts


def openevolve_result(program_path: str, target: str, benchmark: str | None, stage: str,
                      timeout_s: float, memory_mb: int) -> Any:
    """Evaluate the program file for OpenEvolve: an ``EvaluationResult`` when OpenEvolve is
    installed, else the metrics dict."""
    source = Path(program_path).read_text()
    record = _evaluator(target, benchmark, timeout_s, memory_mb).evaluate(source, stage=stage)
    metrics, artifacts = openevolve_metrics(record)
    try:
        from openevolve.evaluation_result import EvaluationResult
    except ImportError:
        return metrics
    return EvaluationResult(metrics=metrics, artifacts=artifacts)


# --------------------------------------------------------------------------- GEPA


class BlisGEPAAdapter:
    """A ``gepa.GEPAAdapter``: the candidate's ``policy`` component is the policy source, a
    data instance is a benchmark workload name, a score is that workload's fitness."""

    propose_new_texts = None

    def __init__(self, target: str = "scorer", bench: Benchmark | None = None, *,
                 timeout_s: float = DEFAULT_TIMEOUT_S, memory_mb: int = DEFAULT_MEMORY_MB,
                 evaluator: Evaluator | None = None) -> None:
        if target not in TARGETS:
            raise ValueError(f"target must be one of {TARGETS}")
        self.evaluator = evaluator or Evaluator(target, bench or load_benchmark(None),
                                                timeout_s=timeout_s, memory_mb=memory_mb)

    def trainset(self) -> list[str]:
        """The benchmark's workload names: GEPA's data instances."""
        return [w.name for w in self.evaluator.bench.workloads]

    def evaluate(self, batch: list[str], candidate: dict[str, str],
                 capture_traces: bool = False) -> Any:
        """Score the candidate on the batch's workloads (one contained evaluation)."""
        from gepa import EvaluationBatch

        wanted = set(batch)  # benchmark order, so a batch's evaluation is cached whatever order
        bench = self.evaluator.bench.subset([w.name for w in self.evaluator.bench.workloads
                                             if w.name in wanted])
        record = self.evaluator.evaluate(candidate[COMPONENT], bench=bench)
        outputs, scores, trajectories = [], [], []
        for name in batch:
            m = (record.get("workloads") or {}).get(name)
            score = float(m["fitness"]) if record["ok"] and m else float(record["fitness"])
            outputs.append({"workload": name, "fitness": score, "metrics": m})
            scores.append(score)
            trajectories.append({"workload": name, "record": record})
        return EvaluationBatch(outputs=outputs, scores=scores,
                               trajectories=trajectories if capture_traces else None)

    def make_reflective_dataset(self, candidate: dict[str, str], eval_batch: Any,
                                components_to_update: list[str]) -> dict[str, list[dict]]:
        """Per workload: the workload, the candidate's score, and the evaluation feedback."""
        rows = []
        for traj, score in zip(eval_batch.trajectories or [], eval_batch.scores, strict=False):
            record = traj["record"]
            feedback = record.get("feedback", "")
            if record.get("error"):
                feedback = (f"FAILED ({record['error']['kind']}): {record['error']['message']}"
                            f"\n{feedback}")
            rows.append({"Inputs": f"workload {traj['workload']} of benchmark "
                                   f"{self.evaluator.bench.name}",
                         "Generated Outputs": f"fitness {score:.4f}",
                         "Feedback": feedback})
        return {component: rows for component in components_to_update}
