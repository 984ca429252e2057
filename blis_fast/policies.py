"""Policy names and how they become kernel codes (the orchestration boundary, DESIGN §2).

``SCORERS`` is the registry of weighted-routing scorers: a stateless scorer is a cfunc in
``blis_fast/kernels/scorers.py`` registered here by name; the three stateful scorers are
implemented inside the routing kernel. The user scorer of the Python API is the entry
``custom``. See docs/extending.md.
"""

from __future__ import annotations

from blis_fast.kernels import scorers as S
from blis_fast.kernels.enums import StatefulScorer

# name -> cfunc (stateless, table-dispatched) or a kernel code (stateful)
SCORERS: dict[str, object] = {
    "prefix-affinity": StatefulScorer.PREFIX_AFFINITY,
    "precise-prefix-cache": StatefulScorer.PRECISE_PREFIX_CACHE,
    "no-hit-lru": StatefulScorer.NO_HIT_LRU,
    "queue-depth": S.score_queue_depth,
    "kv-utilization": S.score_kv_utilization,
    "load-balance": S.score_load_balance,
    "active-requests": S.score_active_requests,
    "running-requests": S.score_running_requests,
    "load-aware": S.score_load_aware,
    "vllm-dp": S.score_vllm_dp,
}
SCORERS_READING_CACHE = frozenset({"precise-prefix-cache", "no-hit-lru", "custom"})
"""Scorers that observe each instance's cached prefix blocks (costly: queried per decision)."""


def scorer_table(custom_scorer: object) -> tuple:
    """The kernel's table of scorer cfuncs: every registered stateless scorer, then ``custom``."""
    table = [fn for fn in SCORERS.values() if not isinstance(fn, int)]
    table.append(custom_scorer)
    return tuple(table)


def scorer_code(name: str) -> int:
    """Kernel code of a scorer name (stateful code, or StatefulScorer.TABLE_BASE + its table index)."""
    if name == "custom":
        n_table = sum(1 for fn in SCORERS.values() if not isinstance(fn, int))
        return StatefulScorer.TABLE_BASE + n_table
    entry = SCORERS[name]
    if isinstance(entry, int):
        return entry
    table = [fn for fn in SCORERS.values() if not isinstance(fn, int)]
    return StatefulScorer.TABLE_BASE + table.index(entry)
