"""Instance schedulers (ENG-3, DELTA-5): the order of an instance's wait queue.

One ``register`` per scheduler with the kernel's code (``blis_fast.kernels.engine``); the
scheduler itself is a branch of ``_sched_less`` in the kernel. ``custom`` orders by a user key
function (``blis_fast.run(..., custom_scheduler_key=...)``).
"""

from __future__ import annotations

from blis_fast.kernels import engine as K
from blis_fast.policies.registry import Policy, Registry

SCHEDULER = Registry[Policy]("scheduler", flag="scheduler", slot="ic.IC_SCHEDULER")

SCHEDULER.register(Policy("fcfs", K.SCHED_FCFS))
SCHEDULER.register(Policy("priority-fcfs", K.SCHED_PRIORITY_FCFS))
SCHEDULER.register(Policy("reverse-priority", K.SCHED_REVERSE_PRIORITY))
SCHEDULER.register(Policy("sjf", K.SCHED_SJF))
SCHEDULER.register(Policy("custom", K.SCHED_CUSTOM, hook="scheduler_key"))
