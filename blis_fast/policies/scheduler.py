"""Instance schedulers (ENG-3, DELTA-5): the order of an instance's wait queue.

One ``register`` per scheduler with its kernel code (:data:`Scheduler`, defined beside
``_sched_less`` in ``kernels/engine/batch.py``, the scheduler's branch). ``custom`` orders by a user key
function (``blis_fast.run(..., custom_scheduler_key=...)``).
"""

from __future__ import annotations

from blis_fast.kernels.engine.batch import Scheduler
from blis_fast.policies.registry import Policy, Registry

SCHEDULER = Registry[Policy]("scheduler", flag="scheduler", slot="ConfigSlot.SCHEDULER")

SCHEDULER.register(Policy("fcfs", Scheduler.FCFS))
SCHEDULER.register(Policy("priority-fcfs", Scheduler.PRIORITY_FCFS))
SCHEDULER.register(Policy("reverse-priority", Scheduler.REVERSE_PRIORITY))
SCHEDULER.register(Policy("sjf", Scheduler.SJF))
SCHEDULER.register(Policy("custom", Scheduler.CUSTOM, hook="scheduler_key"))
