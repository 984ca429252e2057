"""Priority policies (ENG-3, DELTA-38): the priority a scheduler orders waiting requests by.

One ``register`` per policy with its kernel code (:data:`Priority`, defined beside the
policy's branch in ``kernels/engine/batch.py``). ``SLO_PRIORITIES`` is the SLO-class
map the priority-based policies and admission read (a bundle's ``slo_priorities`` override it).
"""

from __future__ import annotations

from blis_fast.kernels.engine.batch import Priority
from blis_fast.policies.registry import Policy, Registry

PRIORITY = Registry[Policy]("priority", flag="priority-policy", slot="ConfigSlot.PRIORITY")

PRIORITY.register(Policy("constant", Priority.CONSTANT))
PRIORITY.register(Policy("slo-based", Priority.SLO_BASED))
PRIORITY.register(Policy("inverted-slo", Priority.INVERTED_SLO))

SLO_PRIORITIES = {"critical": 4, "standard": 3, "batch": -1, "sheddable": -2, "background": -3}
"""Default SLO-class priorities (DELTA-38); an unknown or empty class counts as
``DEFAULT_SLO_PRIORITY``; below 0 is sheddable."""
DEFAULT_SLO_PRIORITY = SLO_PRIORITIES["standard"]
