"""Routing policies (CLU-3, DELTA-30..36): which instance an admitted request goes to.

One ``register`` per policy: its name, the kernel's code (:data:`Routing`, defined in
``kernels/enums.py``) and its decision-trace reason (formatted with the decision's ``best`` value: the round-robin
counter, the extreme load or the best score). The policy itself is a branch of ``route`` in
the kernel; the weighted policy's scorers are the registry of ``policies/scorers.py``.
"""

from __future__ import annotations

from blis_fast.kernels.enums import Routing
from blis_fast.policies.registry import Policy, Registry

ROUTING = Registry[Policy]("routing", flag="routing-policy", slot="RouterCfg.ROUTING")

ROUTING.register(Policy("round-robin", Routing.ROUND_ROBIN, reason="round-robin[{count}]"))
ROUTING.register(Policy("least-loaded", Routing.LEAST_LOADED,
                        reason="least-loaded (load={count})"))
ROUTING.register(Policy("always-busiest", Routing.ALWAYS_BUSIEST,
                        reason="always-busiest (load={count})"))
ROUTING.register(Policy("weighted", Routing.WEIGHTED,
                        reason="weighted-scoring (score={best:.3f})"))


def reason_text(policy: str, best: float) -> str:
    """The reference's routing reason (sim/routing.go) of a decision of ``policy``."""
    return ROUTING[policy].reason.format(best=best, count=int(best))
