"""Instance schedulers (ENG-3, DELTA-5): the order of an instance's wait queue.

One ``register`` per scheduler with its kernel code (:data:`Scheduler`); the
scheduler itself is a branch of ``_sched_less`` in the kernel. ``custom`` orders by a user key
function (``blis_fast.run(..., custom_scheduler_key=...)``).
"""

from __future__ import annotations

from typing import NamedTuple

from blis_fast.policies.registry import Policy, Registry


class SchedulerT(NamedTuple):
    """Instance schedulers: the order of the wait queue (CLU-4.4)."""

    FCFS: int = 0
    PRIORITY_FCFS: int = 1
    SJF: int = 2
    REVERSE_PRIORITY: int = 3
    CUSTOM: int = 4  # the user's scheduler-key hook


Scheduler = SchedulerT()


SCHEDULER = Registry[Policy]("scheduler", flag="scheduler", slot="ConfigSlot.SCHEDULER")

SCHEDULER.register(Policy("fcfs", Scheduler.FCFS))
SCHEDULER.register(Policy("priority-fcfs", Scheduler.PRIORITY_FCFS))
SCHEDULER.register(Policy("reverse-priority", Scheduler.REVERSE_PRIORITY))
SCHEDULER.register(Policy("sjf", Scheduler.SJF))
SCHEDULER.register(Policy("custom", Scheduler.CUSTOM, hook="scheduler_key"))
