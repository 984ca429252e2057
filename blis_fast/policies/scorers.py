"""Weighted-routing scorers (CLU-3.19..3.21, DELTA-30..36): one ``register`` per scorer.

A stateless scorer is a ``cfunc`` in ``blis_fast/kernels/cluster/scorers.py`` (``function``), called
through a table of function pointers; a stateful one keeps router state inside the routing
kernel (``code``); ``custom`` is the user's scorer of the Python API. Every entry says whether
it reads the instances' cached prefix blocks (``SNAP_CACHED_BLOCKS``): the kernel fills that
view, which costs a cache query per decision, only when a configured scorer does.
See docs/extending.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from blis_fast.kernels.cluster import scorers as S
from blis_fast.kernels.enums import StatefulScorer
from blis_fast.policies.registry import Registry


@dataclass(frozen=True)
class Scorer:
    """One scorer: its name, how the kernel reaches it, and whether it reads the cache view."""

    name: str
    reads_cache: bool
    function: object = None  # a stateless scorer's cfunc (SCORER_SIG)
    code: int = -1  # a stateful scorer's kernel code
    hook: str = ""  # "scorer": the user's function fills this table slot


class ScorerRegistry(Registry[Scorer]):
    """Scorers and the kernel's view of them: codes and the function-pointer table."""

    def _table_entries(self) -> list[Scorer]:
        return [s for s in self if s.code < 0]

    def code(self, name: str) -> int:
        """A stateful scorer's code, or SC_TABLE + the index of its function in the table."""
        scorer = self.entries[name]
        if scorer.code >= 0:
            return scorer.code
        return StatefulScorer.TABLE_BASE + self._table_entries().index(scorer)

    def table(self, custom_scorer: object) -> tuple:
        """The kernel's scorer table: every table scorer's cfunc, ``custom_scorer`` for the
        user's slot."""
        return tuple(s.function if s.function is not None else custom_scorer
                     for s in self._table_entries())

    def reads_cache(self, names) -> bool:
        """True when one of ``names`` reads the cached-prefix view."""
        return any(self.entries[name].reads_cache for name in names)


SCORERS = ScorerRegistry("scorer", flag="routing-scorers")

SCORERS.register(Scorer("prefix-affinity", reads_cache=False, code=StatefulScorer.PREFIX_AFFINITY))
SCORERS.register(Scorer("precise-prefix-cache", reads_cache=True, code=StatefulScorer.PRECISE_PREFIX_CACHE))
SCORERS.register(Scorer("no-hit-lru", reads_cache=True, code=StatefulScorer.NO_HIT_LRU))
SCORERS.register(Scorer("queue-depth", reads_cache=False, function=S.score_queue_depth))
SCORERS.register(Scorer("kv-utilization", reads_cache=False, function=S.score_kv_utilization))
SCORERS.register(Scorer("load-balance", reads_cache=False, function=S.score_load_balance))
SCORERS.register(Scorer("active-requests", reads_cache=False, function=S.score_active_requests))
SCORERS.register(Scorer("running-requests", reads_cache=False,
                        function=S.score_running_requests))
SCORERS.register(Scorer("load-aware", reads_cache=False, function=S.score_load_aware))
SCORERS.register(Scorer("vllm-dp", reads_cache=False, function=S.score_vllm_dp))
# LORA-7: 1 where the request's adapter is resident in the routing snapshot (kernels/engine/lora.py)
SCORERS.register(Scorer("lora-affinity", reads_cache=False, code=StatefulScorer.LORA_AFFINITY))
SCORERS.register(Scorer("custom", reads_cache=True, hook="scorer"))

DEFAULT_PROFILE = (("precise-prefix-cache", 2.0), ("queue-depth", 1.0), ("kv-utilization", 1.0))
"""The weighted-routing profile used when no scorers are configured (DELTA-31)."""
