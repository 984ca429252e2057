"""Policy evolution: blis_fast as the evaluator of LLM-driven policy search (OpenEvolve, GEPA).

``benchmark`` defines what a candidate is scored on, ``evaluate`` compiles a candidate's
source and scores it (fitness, per-workload metrics, feedback for a reflecting LLM),
``sandbox`` runs each evaluation in a contained child process, ``adapters`` plugs that into
OpenEvolve (generated evaluator files) and GEPA (an adapter class). Importing this package
is cheap: the submodules load Numba only when used.
"""

from __future__ import annotations

TARGETS = ("scorer", "admission", "scheduler")
"""What a candidate can define: a routing scorer, an admission rule or a scheduler key."""

FUNCTION_NAMES = {"scorer": "custom_scorer", "admission": "custom_admission",
                  "scheduler": "custom_scheduler_key"}
"""The name a candidate's policy function must have, per target (the ``blis_fast.run`` hook
keyword of the same policy)."""

WORST_FITNESS = -1.0
"""The score of a failed candidate: below every valid fitness (valid ones are >= 0)."""
