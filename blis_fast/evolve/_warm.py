"""Preloaded by the sandbox's forkserver: import the simulator and run one tiny simulation of
each hook kind, so every contained evaluation forks with the kernels already loaded."""

from __future__ import annotations


def _warm() -> None:
    import blis_fast  # in _warm: a failure is caught below
    from blis_fast.evolve.benchmark import MODEL  # in _warm: a failure is caught below
    from blis_fast.evolve.evaluate import compile_candidate  # in _warm: a failure is caught below

    scorer = compile_candidate(
        "def custom_scorer(snapshots, request, out):\n"
        "    for i in range(out.shape[0]):\n"
        "        out[i] = 1.0 / (1.0 + snapshots[i, 0])\n", "scorer")
    blis_fast.run(model=MODEL, num_instances=2, num_requests=20, rate=50, log="error",
                  routing_policy="weighted", routing_scorers="custom:1", custom_scorer=scorer,
                  trace_level="decisions", counterfactual_k=2)


try:
    _warm()
except Exception:  # noqa: BLE001, S110 - warming is an optimisation; evaluations still work
    pass
