"""Policy families, one registry each (``registry.Registry``), one module per family:

| module | registry | what it chooses |
|---|---|---|
| ``admission.py`` | ``ADMISSION`` | who enters the cluster (and each policy's parameters) |
| ``routing.py`` | ``ROUTING`` | which instance a request goes to |
| ``scorers.py`` | ``SCORERS`` | weighted routing's scorers (stateless cfuncs, stateful codes) |
| ``priority.py`` | ``PRIORITY`` | a waiting request's priority (and the SLO-class map) |
| ``scheduler.py`` | ``SCHEDULER`` | the order of an instance's wait queue |
| ``deciders.py`` | ``DECIDERS``, ``ENCODE_DECIDERS`` | P/D: which requests are disaggregated / encoded |

Each family module imports the kernel module holding its codes, so this package imports none
of them itself: ``family(name)`` loads one when it is needed. ``family("latency_backends")``
is the latency backends' registry, which lives with the configuration it resolves
(``blis_fast/config/latency_backends.py``: model config and hardware in, step-time
parameters out).
"""

from __future__ import annotations

import importlib

_REGISTRIES = {"admission": "ADMISSION", "routing": "ROUTING", "scorers": "SCORERS",
               "priority": "PRIORITY", "scheduler": "SCHEDULER",
               "latency_backends": "LATENCY_BACKENDS", "deciders": "DECIDERS",
               "encode_deciders": "ENCODE_DECIDERS"}
_MODULES = {"encode_deciders": "blis_fast.policies.deciders",  # shares the deciders' module
            "latency_backends": "blis_fast.config.latency_backends"}


def family(name: str):
    """The registry of the family module ``name`` (e.g. ``"admission"``)."""
    module = importlib.import_module(_MODULES.get(name, f"blis_fast.policies.{name}"))
    return getattr(module, _REGISTRIES[name])
