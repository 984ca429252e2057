"""Instance schedulers (ENG-3, DELTA-5): the order of an instance's wait queue.

One ``register`` per scheduler with the kernel's code (``blis_fast.kernels.enums``); the
scheduler itself is a branch of ``_sched_less`` in the kernel. ``custom`` orders by a user key
function (``blis_fast.run(..., custom_scheduler_key=...)``).
"""

from __future__ import annotations

from blis_fast.kernels.enums import Scheduler
from blis_fast.policies.registry import Policy, Registry

SCHEDULER = Registry[Policy]("scheduler", flag="scheduler", slot="ConfigSlot.SCHEDULER")

SCHEDULER.register(Policy("fcfs", Scheduler.FCFS))
SCHEDULER.register(Policy("priority-fcfs", Scheduler.PRIORITY_FCFS))
SCHEDULER.register(Policy("reverse-priority", Scheduler.REVERSE_PRIORITY))
SCHEDULER.register(Policy("sjf", Scheduler.SJF))
SCHEDULER.register(Policy("custom", Scheduler.CUSTOM, hook="scheduler_key"))
