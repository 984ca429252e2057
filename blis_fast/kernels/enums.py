"""The integer codes shared by the kernels and the Python layer, one NamedTuple enum per family.

Each family is an instance of a ``NamedTuple`` class (the style of vectorbt's
``portfolio/enums.py``): ``Routing.WEIGHTED`` is a plain ``int`` in Python, and inside
``@njit`` code the attribute of the global instance is a compile-time constant (Numba freezes
global tuples; the machine code is the same as with a module-level integer). The members keep
the values the kernels have always used, so the codes of a run, its outputs and Numba's cached
kernels are unchanged.

Every compile-time constant a kernel reads is defined in ``blis_fast/kernels/`` (the Python
layer imports it from there, never the other way: a kernel's cache key covers the kernel
modules only, see ``kernels/jit.py``). A policy family's codes live in the kernel module that
branches on them, so a built-in policy is one kernel module and one registry module:
``Admission``, ``AdmissionReason`` and the admission parameters' slots ``RouterParam`` in
``kernels/cluster/admission.py``; ``Priority`` and ``Scheduler`` in ``kernels/engine/batch.py``; the latency
backends' ``Backend`` in ``kernels/engine/latency.py``. Codes read by several kernel modules are here:
the routing policies (:data:`Routing`), the P/D deciders, the stateful routing scorers
(:data:`StatefulScorer`), the kernels' return statuses (:data:`Status`), a request's lifecycle
(:data:`RequestState`, :data:`Registration`, :data:`SessionOutcome`) and the event loop's kinds
and priorities (:data:`Event`, :data:`EventPriority`). A kernel that meets a code no member of
its family has returns an error status (the ``is_known`` checks count the family's members, so
a member added last is known).
"""

from __future__ import annotations

from typing import NamedTuple


class RoutingT(NamedTuple):
    """Routing policies (CLU-3.11..3.16)."""

    ROUND_ROBIN: int = 0
    LEAST_LOADED: int = 1
    WEIGHTED: int = 2
    ALWAYS_BUSIEST: int = 3


Routing = RoutingT()


class DeciderT(NamedTuple):
    """P/D disaggregation deciders (PD-3): whether a routed request is split into a prefill
    and a decode sub-request."""

    NEVER: int = 0
    ALWAYS: int = 1
    PREFIX_THRESHOLD: int = 2  # uncached prompt tokens on the decode pick > threshold


Decider = DeciderT()


class EncodeDeciderT(NamedTuple):
    """Encode-stage deciders (PD-3): whether a request visits the encode pool first."""

    NEVER: int = 0
    ALWAYS: int = 1
    MULTIMODAL: int = 2  # image, audio or video tokens > 0


EncodeDecider = EncodeDeciderT()


class StatefulScorerT(NamedTuple):
    """Routing scorers that keep router state, built into the kernel (CLU-3.22, DELTA-32/34).

    Every other scorer, built-in or user-supplied, is a cfunc in the scorer table and has the
    code ``TABLE_BASE`` + its index in that table.
    """

    PREFIX_AFFINITY: int = 0
    PRECISE_PREFIX_CACHE: int = 1
    NO_HIT_LRU: int = 2
    LORA_AFFINITY: int = 3  # warm where the request's LoRA adapter is resident (LORA-7)
    TABLE_BASE: int = 16


StatefulScorer = StatefulScorerT()


class StatusT(NamedTuple):
    """What a simulation kernel returns: done, a buffer to grow, a pause, or an error."""

    OK: int = 0
    GROW_HEAP: int = 2  # the event heap is full: the caller grows it and calls again
    GROW_LOG: int = 3  # the step log or the ITL run pool is full: likewise
    KV_LIST_OVERFLOW: int = 4  # a request's block list outgrew its slice (error)
    SESSIONS: int = 5  # closed-loop outcomes wait for follow-ups: push them, call again
    UNKNOWN_BACKEND: int = 6  # error: a latency backend code no backend has
    TOO_MANY_INSTANCES: int = 7  # error: more instances than the event key can address
    SEQ_OVERFLOW: int = 8  # error: more events than the event key can number
    UNKNOWN_POLICY: int = 9  # error: an admission, routing, priority or scheduler code unknown
    GROW_FLEET: int = 10  # the autoscaler needs more instance rows: the run restarts bigger
    LIVELOCK: int = 11  # error: a run that can never finish (event_loop: livelock rules)
    PAUSED: int = 12  # the next event is at or after LoopSlot.STOP_AT (blis serve's clock)


Status = StatusT()


class LivelockT(NamedTuple):
    """Why a run can never finish (``LoopSlot.STOP_KIND`` with ``Status.LIVELOCK``)."""

    NONE: int = 0
    TOO_BIG: int = 1  # a queued request needs more KV blocks than its instance has
    STUCK: int = 2  # an instance steps forever with an empty batch and a queue that never moves
    CYCLE: int = 3  # every instance still stepping goes round the same states (engine/livelock)
    LORA_STALL: int = 4  # a cold LoRA head while every adapter slot is pinned (LORA-D1)


Livelock = LivelockT()


class RequestStateT(NamedTuple):
    """A request's lifecycle in the engine (ENG-3.2)."""

    NEW: int = 0  # not injected into an instance yet (cluster pipeline, or rejected)
    QUEUED: int = 1
    RUNNING: int = 2
    COMPLETED: int = 3
    TIMED_OUT: int = 4
    DROPPED: int = 5  # refused by the instance's enqueue guards (ENG-3.4)
    ABORTED: int = 6  # its client went away (blis serve: kernels/engine/live_ops.py)


RequestState = RequestStateT()


class RegistrationT(NamedTuple):
    """What the cluster did with a request: routed to an instance (and not dropped) or not."""

    NONE: int = 0
    ROUTED: int = 1
    REJECTED_ADMISSION: int = 2
    REJECTED_ROUTING: int = 3


Registration = RegistrationT()


class SessionOutcomeT(NamedTuple):
    """How a closed-loop session request ended, as handed to the session driver."""

    COMPLETED: int = 0
    CANCELLED: int = 1  # timed out or dropped


SessionOutcome = SessionOutcomeT()


class EventT(NamedTuple):
    """Event kinds of the cluster loop; cluster events are < 10 <= instance events (CLU-1)."""

    CLUSTER_ARRIVAL: int = 0
    ADMISSION: int = 1
    ROUTING: int = 2
    PREFILL_ROUTING: int = 3  # P/D (PD-3): the prefill sub-request picks its instance
    KV_TRANSFER_START: int = 4  # P/D: a prefill finished; the decode side reserves KV
    KV_TRANSFER_DONE: int = 5  # P/D: the KV arrived; the decode sub-request is queued
    INSTANCE_LOADED: int = 7  # the autoscaler's cluster events (AS-3, AS-4)
    SCALING_TICK: int = 8
    SCALE_ACTUATION: int = 9
    ARRIVAL: int = 10
    QUEUED: int = 11
    STEP: int = 12
    ADAPTER_LOAD: int = 13  # a LoRA adapter load completes on the instance (LORA-4.4)
    REQUEST_LEFT: int = 14
    TIMEOUT: int = 15


Event = EventT()


class EventPriorityT(NamedTuple):
    """Priorities within an event queue (ENG-1.2); the cluster's are offset by +2 so that they
    are non-negative in the heap's tie key."""

    ARRIVAL: int = 0
    QUEUED: int = 1
    ADAPTER_LOAD: int = 2  # LORA-10.1: after queued, before step (the August numbering)
    STEP: int = 3
    REQUEST_LEFT: int = 5
    TIMEOUT: int = 6
    INSTANCE_LIFECYCLE: int = 1  # InstanceLoaded (Go -1)
    CLUSTER_ARRIVAL: int = 2
    ADMISSION: int = 3
    ROUTING: int = 4
    PREFILL_ROUTING: int = 6  # the reference's cluster priorities 4, 5, 6 (PD-3.13)
    KV_TRANSFER_START: int = 7
    KV_TRANSFER_DONE: int = 8
    SCALING_TICK: int = 10  # Go 8
    SCALE_ACTUATION: int = 11  # Go 9


EventPriority = EventPriorityT()


class LifecycleT(NamedTuple):
    """An instance's lifecycle state (AS-3.1); Scheduling and WarmingUp are never entered
    from the CLI (kept for the reference's numbering)."""

    NONE: int = 0
    SCHEDULING: int = 1
    LOADING: int = 2
    WARMING_UP: int = 3
    ACTIVE: int = 4
    DRAINING: int = 5
    TERMINATED: int = 6


Lifecycle = LifecycleT()


class InstanceKindT(NamedTuple):
    """How an instance came to be: at start-up (``instance_<n>``) or by the autoscaler
    (``autoscale-<model>-<seq>``)."""

    STARTUP: int = 0
    AUTOSCALED: int = 1


InstanceKind = InstanceKindT()
