"""Policy families, one registry each (``registry.Registry``), one module per family:

| module | registry | what it chooses |
|---|---|---|
| ``admission.py`` | ``ADMISSION`` | who enters the cluster (and each policy's parameters) |
| ``routing.py`` | ``ROUTING`` | which instance a request goes to |
| ``scorers.py`` | ``SCORERS`` | weighted routing's scorers (stateless cfuncs, stateful codes) |
| ``priority.py`` | ``PRIORITY`` | a waiting request's priority (and the SLO-class map) |
| ``scheduler.py`` | ``SCHEDULER`` | the order of an instance's wait queue |
| ``latency_backends.py`` | ``LATENCY_BACKENDS`` | the step-time model and how its parameters are packed |
| ``deciders.py`` | ``DECIDERS``, ``ENCODE_DECIDERS`` | P/D: which requests are disaggregated / encoded |

Each family module imports the kernel module holding its codes, so this package imports none
of them itself: ``family(name)`` loads one when it is needed.
"""

from __future__ import annotations

import importlib

_REGISTRIES = {"admission": "ADMISSION", "routing": "ROUTING", "scorers": "SCORERS",
               "priority": "PRIORITY", "scheduler": "SCHEDULER",
               "latency_backends": "LATENCY_BACKENDS", "deciders": "DECIDERS",
               "encode_deciders": "ENCODE_DECIDERS"}
_MODULES = {"encode_deciders": "deciders"}  # registries that share another family's module


def family(name: str):
    """The registry of the family module ``name`` (e.g. ``"admission"``)."""
    module = importlib.import_module(f"blis_fast.policies.{_MODULES.get(name, name)}")
    return getattr(module, _REGISTRIES[name])
