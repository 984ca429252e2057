"""Score one candidate policy on a benchmark, in this process: compile its source, run every
(cluster, workload, seed) of the benchmark, and return the fitness, per-workload metrics and
feedback a reflecting LLM can act on (where it lost against the baseline, and why).

Use ``blis_fast.evolve.sandbox`` for untrusted code: it calls ``evaluate_source`` in a
contained child process. Here a failure (the source does not compile, the policy raises or
returns a non-finite value) is a record with ``ok: False`` and the worst fitness.
"""

from __future__ import annotations

import hashlib
import math
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import blis_fast
from blis_fast.errors import BlisConfigError, BlisError, BlisInputError
from blis_fast.evolve import FUNCTION_NAMES, TARGETS, WORST_FITNESS
from blis_fast.evolve.benchmark import BASELINES, Benchmark, run_plan
from blis_fast.evolve.restricted import RestrictedError, compile_policy, load_candidate

EXCERPT_DECISIONS = 5
"""Routing decisions quoted in the feedback (the worst-served requests of the worst run)."""
COUNTERFACTUAL_K = 3
"""Counterfactual candidates recorded per routing decision for the feedback excerpts."""


class CandidateError(Exception):
    """A candidate failed: ``kind`` is compile, exception, non_finite, memory or timeout
    (records also use crash, and benchmark when the benchmark itself cannot run)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def source_hash(source: str) -> str:
    """The sha256 of a candidate's source (the evaluation cache key's first part)."""
    return hashlib.sha256(source.encode()).hexdigest()


def failure_record(kind: str, message: str, source: str = "") -> dict[str, Any]:
    """The result of a failed candidate: worst fitness, and why."""
    return {"ok": False, "fitness": WORST_FITNESS, "error": {"kind": kind, "message": message},
            "workloads": {}, "feedback": f"The candidate failed ({kind}): {message}",
            "source_hash": source_hash(source)}


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


# --------------------------------------------------------------------------- compiling


_GUARDS = {
    "scorer": (
        "def _blis_guarded(snapshots, request, out):\n"
        "    _blis_user(snapshots, request, out)\n"
        "    for i in range(out.shape[0]):\n"
        "        if not _blis_isfinite(out[i]):\n"
        "            raise FloatingPointError('non-finite score')\n"),
    "scheduler": (
        "def _blis_guarded(features):\n"
        "    key = _blis_user(features)\n"
        "    if not _blis_isfinite(key):\n"
        "        raise FloatingPointError('non-finite scheduler key')\n"
        "    return key\n"),
}
"""Candidate-side wrappers that raise when the policy yields a non-finite value. They are
compiled with the candidate (like its own code), not as engine kernels."""


def _guarded(target: str, user: Any) -> Any:
    """The candidate's policy wrapped in its target's guard (``njit``-compiled)."""
    import numba

    if target not in _GUARDS:
        return user
    namespace: dict[str, Any] = {"_blis_user": user, "_blis_isfinite": math.isfinite}
    exec(compile(_GUARDS[target], "<candidate guard>", "exec"), namespace)  # noqa: S102
    return numba.njit(namespace["_blis_guarded"])


def compile_candidate(source: str, target: str) -> Any:
    """Check the candidate's module source (``restricted``: only nopython functions and
    constants), execute it and compile its policy function as a bounds-checked Numba cfunc of
    the hook signature; raises CandidateError(compile|exception|memory)."""
    from blis_fast.api import _as_cfunc  # lazy: numba; the parent imports this module
    from blis_fast.kernels.cluster import hooks as H  # lazy: numba; the parent imports this module

    if target not in TARGETS:
        raise CandidateError("compile", f"unknown target {target!r}")
    name = FUNCTION_NAMES[target]
    try:
        namespace = load_candidate(source)
    except SyntaxError as exc:
        raise CandidateError("compile", f"SyntaxError: {exc.msg} (line {exc.lineno})") from None
    except RestrictedError as exc:
        raise CandidateError("compile", str(exc)) from None
    except MemoryError:
        raise CandidateError("memory", "MemoryError while loading the candidate") from None
    except Exception as exc:  # noqa: BLE001 - any error of the candidate's module
        raise CandidateError("exception", f"loading the candidate: {_one_line(exc)}") from None
    fn = namespace.get(name)
    if not callable(fn):
        raise CandidateError("compile", f"the candidate defines no function {name}()")
    try:
        user = compile_policy(fn)
    except RestrictedError as exc:
        raise CandidateError("compile", str(exc)) from None
    sig = {"scorer": H.SCORER_SIG, "admission": H.ADMISSION_SIG,
           "scheduler": H.SCHEDULER_KEY_SIG}[target]
    guarded = _guarded(target, user)
    try:
        compiled = _as_cfunc(guarded, sig, name)
    except BlisError as exc:
        raise CandidateError("compile", str(exc)) from None
    _probe(target, guarded)
    return compiled


def _probe(target: str, fn: Any) -> None:
    """Call the policy on a few synthetic inputs: a raise or a non-finite value fails early
    with a readable reason (inside a simulation it is only reported afterwards)."""
    from blis_fast.kernels.cluster import hooks as H  # lazy: numba; the parent imports this module

    snaps = np.zeros((4, H.SNAP_COLS))
    snaps[:, H.SNAP_QUEUE] = [0, 3, 1, 7]
    snaps[:, H.SNAP_IN_FLIGHT] = [1, 4, 2, 9]
    snaps[:, H.SNAP_KV_UTIL] = [0.1, 0.5, 0.3, 0.9]
    snaps[:, H.SNAP_FREE_BLOCKS] = [900, 500, 700, 100]
    snaps[:, H.SNAP_CACHED_BLOCKS] = [0, 16, 4, 0]
    request = np.array([300.0, 1e6, 9e5, 0.0, 19.0, 5.0])
    features = np.array([300.0, 9e5, 1e5, 0.0, 0.0, 512.0])
    try:
        if target == "scorer":
            fn(snaps, request, np.zeros(4))
        elif target == "admission":
            fn(snaps, request)
        else:
            fn(features)
    except FloatingPointError as exc:
        if "non-finite" in str(exc):
            raise CandidateError("non_finite", f"on a probe input: {exc}") from None
        raise CandidateError("exception", f"on a probe input: {_one_line(exc)}") from None
    except MemoryError:
        raise CandidateError("memory", "MemoryError on a probe input") from None
    except Exception as exc:  # noqa: BLE001
        raise CandidateError("exception", f"on a probe input: {_one_line(exc)}") from None


# --------------------------------------------------------------------------- running


def _policy_options(target: str) -> dict[str, Any]:
    return {"scorer": {"routing_policy": "weighted", "routing_scorers": "custom:1"},
            "admission": {"admission_policy": "custom"},
            "scheduler": {"scheduler": "custom"}}[target]


class _HookErrors:
    """Collects the exceptions a compiled hook reports as 'unraisable' during a run (a Numba
    cfunc cannot propagate them), so a run whose policy raised is a failure."""

    def __init__(self) -> None:
        self.messages: list[str] = []
        self._saved: Callable | None = None

    def __enter__(self) -> _HookErrors:
        self._saved = sys.unraisablehook
        sys.unraisablehook = self._record
        return self

    def _record(self, info: Any) -> None:
        if len(self.messages) < 3:
            self.messages.append(_one_line(info.exc_value) if info.exc_value is not None
                                 else str(info.exc_type))

    def __exit__(self, *exc: object) -> None:
        sys.unraisablehook = self._saved


def _run_metrics(result: Any, bench: Benchmark) -> dict[str, float]:
    """Fitness and the headline numbers of one run."""
    req = result.requests
    n = int(result.simulation.table.n)
    ttft_ms = np.asarray(req.ttft_us, dtype=np.float64) / 1000.0
    e2e_ms = np.asarray(req.e2e_us, dtype=np.float64) / 1000.0
    fit = bench.fitness
    with np.errstate(invalid="ignore"):
        ttft_miss = int(np.count_nonzero(~(ttft_ms <= fit.get("ttft_ms", math.inf))))
        e2e_miss = int(np.count_nonzero(~(e2e_ms <= fit.get("e2e_ms", math.inf))))
        good = int(np.count_nonzero((ttft_ms <= fit.get("ttft_ms", math.inf))
                                    & (e2e_ms <= fit.get("e2e_ms", math.inf))))
    s = result.summary
    sim = result.simulation
    metrics = {
        "goodput": good / n if n else 0.0,
        "ttft_p99_ms": float(s["ttft_p99_ms"]), "ttft_mean_ms": float(s["ttft_mean_ms"]),
        "e2e_p99_ms": float(s["e2e_p99_ms"]),
        "completed": float(s["completed_requests"]), "requests": float(n),
        "ttft_slo_misses": float(ttft_miss + (n - len(ttft_ms))),
        "e2e_slo_misses": float(e2e_miss + (n - len(e2e_ms))),
        "rejected": float(sim.rejected_admission + sim.rejected_routing),
        "timed_out": float(s["timed_out_requests"]),
        "preemptions": float(s["preemption_count"]),
        "cache_hit_rate": float(np.mean(sim.cache_hit_rate)),
    }
    if fit["kind"] == "goodput":
        metrics["fitness"] = metrics["goodput"]
    else:
        metrics["fitness"] = _weighted_fitness(result, fit["weights"])
    return metrics


def _weighted_fitness(result: Any, weights: str) -> float:
    """The ``--fitness-weights`` score of one run (the fitness section's number)."""
    from blis_fast.output.fitness import (  # lazy: weights fitness only
        compute_fitness,
        parse_fitness_weights,
    )
    from blis_fast.output.report import (  # lazy: weights fitness only
        ClusterReport,
        collect_raw_metrics,
    )
    from blis_fast.output.run_outputs import instance_metrics  # lazy: weights fitness only

    sim = result.simulation
    report = ClusterReport(instances=instance_metrics(sim), requests=result.requests,
                           admission_rejections=sim.rejected_admission,
                           routing_rejections=sim.rejected_routing,
                           priority_policy=result.prepared.policies.priority)
    return compute_fitness(collect_raw_metrics(report), parse_fitness_weights(weights)).score


def _run_benchmark(bench: Benchmark, policy: dict[str, Any], hooks: dict[str, Any],
                   trace: bool) -> tuple[dict[str, dict[str, float]], dict[str, Any]]:
    """Run every run of the plan; per-workload means of the run metrics, and the first run
    of each workload (for the feedback excerpts). Raises CandidateError on a hook error."""
    runs: dict[str, list[dict[str, float]]] = {}
    first: dict[str, Any] = {}
    for _cluster, workload, _seed, opts in run_plan(bench):
        opts = {**opts, **policy}
        if trace:
            opts.update(trace_level="decisions", counterfactual_k=COUNTERFACTUAL_K)
        with _HookErrors() as errors:
            try:
                result = blis_fast.run(**opts, **hooks)
            except MemoryError:
                raise CandidateError("memory", "MemoryError during the simulation") from None
            except (BlisConfigError, BlisInputError) as exc:  # options: not the candidate's
                raise CandidateError("benchmark",
                                     f"workload {workload}: {_one_line(exc)}") from None
            except Exception as exc:  # noqa: BLE001 - a hook error that stopped the run
                text = str(exc)
                kind = "non_finite" if ("non-finite" in text or "NaN" in text) else "exception"
                raise CandidateError(kind, f"workload {workload}: {_one_line(exc)}") from None
        if errors.messages:
            kind = "non_finite" if any("non-finite" in m for m in errors.messages) else "exception"
            raise CandidateError(kind, f"workload {workload}: the policy raised "
                                       f"{errors.messages[0]}")
        metrics = _run_metrics(result, bench)
        if not math.isfinite(metrics["fitness"]):
            raise CandidateError("non_finite", f"workload {workload}: fitness "
                                               f"{metrics['fitness']}")
        runs.setdefault(workload, []).append(metrics)
        first.setdefault(workload, result)
    means = {w: {k: float(np.mean([m[k] for m in ms])) for k in ms[0]} for w, ms in runs.items()}
    return means, first


_BASELINE_CACHE: dict[tuple[str, str], dict[str, dict[str, float]]] = {}


def baseline_metrics(bench: Benchmark, target: str) -> dict[str, dict[str, float]]:
    """Per-workload metrics of the benchmark's baseline policy (cached per process)."""
    key = (bench.digest(), target)
    if key not in _BASELINE_CACHE:
        policy = bench.baseline if bench.baseline is not None else BASELINES[target]
        _BASELINE_CACHE[key] = _run_benchmark(bench, dict(policy), {}, trace=False)[0]
    return _BASELINE_CACHE[key]


def evaluate_source(source: str, target: str, bench: Benchmark, *,
                    feedback: bool = True) -> dict[str, Any]:
    """Compile ``source`` and score it on ``bench``: a JSON-able record with ``ok``,
    ``fitness`` (mean over runs; ``WORST_FITNESS`` on failure), ``workloads`` (per-workload
    metrics), ``baseline``, ``feedback`` (text) and ``error`` (None or kind + message)."""
    started = time.perf_counter()
    try:  # the baseline first: a benchmark the simulator refuses is not the candidate's fault
        base = baseline_metrics(bench, target) if feedback else {}
    except (BlisError, CandidateError) as exc:
        return failure_record("benchmark", f"the benchmark cannot run: {exc}", source)
    try:
        compiled = compile_candidate(source, target)
        hook_kw = {"scorer": "custom_scorer", "admission": "custom_admission",
                   "scheduler": "custom_scheduler_key"}[target]
        workloads, first = _run_benchmark(bench, _policy_options(target), {hook_kw: compiled},
                                          trace=feedback and target == "scorer")
    except CandidateError as exc:
        if exc.kind == "benchmark":
            return failure_record("benchmark", f"the benchmark cannot run: {exc}", source)
        return failure_record(exc.kind, str(exc), source)
    fitness = float(np.mean([m["fitness"] for m in workloads.values()]))
    record: dict[str, Any] = {"ok": True, "fitness": fitness, "error": None,
                              "workloads": workloads, "source_hash": source_hash(source)}
    if feedback:
        record["baseline"] = {"fitness": float(np.mean([m["fitness"] for m in base.values()])),
                              "workloads": base}
        record["feedback"] = _feedback(bench, target, workloads, base, first)
    else:
        record["feedback"] = ""
    record["seconds"] = round(time.perf_counter() - started, 3)
    return record


# --------------------------------------------------------------------------- feedback


def _feedback(bench: Benchmark, target: str, cand: dict[str, dict[str, float]],
              base: dict[str, dict[str, float]], first: dict[str, Any]) -> str:
    """What a reflecting LLM needs: per-workload fitness against the baseline, SLO misses,
    anomalies, and the routing decisions behind the worst-served requests."""
    fit = bench.fitness
    goal = (f"SLO goodput: share of requests with TTFT <= {fit['ttft_ms']:g} ms and E2E <= "
            f"{fit['e2e_ms']:g} ms" if fit["kind"] == "goodput"
            else f"weighted fitness {fit['weights']}")
    lines = [f"Fitness = mean over workloads of the {goal} (higher is better)."]
    worst, worst_delta = None, math.inf
    for name, m in cand.items():
        b = base[name]
        delta = m["fitness"] - b["fitness"]
        verdict = "LOST to" if delta < 0 else "beat" if delta > 0 else "tied with"
        lines.append(
            f"- {name}: fitness {m['fitness']:.4f} vs baseline {b['fitness']:.4f} "
            f"({verdict} the baseline by {abs(delta):.4f}); TTFT p99 {m['ttft_p99_ms']:.1f} ms "
            f"(baseline {b['ttft_p99_ms']:.1f}), E2E p99 {m['e2e_p99_ms']:.1f} ms "
            f"(baseline {b['e2e_p99_ms']:.1f}); SLO misses TTFT {m['ttft_slo_misses']:.0f} "
            f"(baseline {b['ttft_slo_misses']:.0f}), E2E {m['e2e_slo_misses']:.0f} "
            f"(baseline {b['e2e_slo_misses']:.0f}); cache hit rate {m['cache_hit_rate']:.3f} "
            f"(baseline {b['cache_hit_rate']:.3f})")
        anomalies = [f"{k.replace('_', ' ')} {m[k]:.0f}" for k in
                     ("rejected", "timed_out", "preemptions") if m[k] > b[k]]
        if anomalies:
            lines.append(f"  anomalies above the baseline: {', '.join(anomalies)}")
        if delta < worst_delta:
            worst, worst_delta = name, delta
    if target == "scorer" and worst is not None and first[worst].simulation.decisions is not None:
        lines.append(f"Routing decisions behind the slowest requests of {worst} "
                     "(scores are the candidate's, regret = best counterfactual score minus "
                     "the chosen one):")
        lines += _decision_excerpt(first[worst])
    return "\n".join(lines)


def _decision_excerpt(result: Any) -> list[str]:
    """The routing records of the requests with the longest TTFT in one traced run."""
    sim = result.simulation
    d = sim.decisions
    ttft = np.asarray(sim.ttft_us[:sim.table.n], dtype=np.float64)
    ttft = np.where(ttft < 0, np.inf, ttft)  # no first token: the worst served
    row_of = {int(r): k for k, r in enumerate(d.routing_request)}
    order = [int(i) for i in np.argsort(-ttft, kind="stable") if int(i) in row_of]
    lines = []
    for idx in order[:EXCERPT_DECISIONS]:
        k = row_of[idx]
        valid = d.candidate_instance[k] >= 0
        counts = d.candidate_counts[k][valid]
        cands = ", ".join(f"instance_{int(i)}={float(s):.3f} (queue {int(c[0])}, batch "
                          f"{int(c[1])}, in-flight {int(c[2])})" for i, s, c in
                          zip(d.candidate_instance[k][valid], d.candidate_score[k][valid],
                              counts, strict=True))
        lines.append(f"  request_{idx} at t={int(d.routing_clock[k]) / 1e6:.3f}s, input "
                     f"{int(sim.table.input_len[idx])} tokens: TTFT {ttft[idx] / 1000:.1f} ms "
                     f"on instance_{int(d.routing_target[k])}; top candidates {cands}; "
                     f"regret {float(d.routing_regret[k]):.3f}")
    return lines
