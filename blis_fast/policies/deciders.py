"""P/D deciders (PD-3): whether a request routed in P/D mode is split into a prefill and a
decode sub-request (``--pd-decider``), and whether it visits the encode pool first
(``--encode-decider``). One ``register`` per decider with the kernel's code
(``blis_fast.kernels.enums``); ``""`` means the flag's default, ``never``."""

from __future__ import annotations

from blis_fast.kernels.enums import Decider, EncodeDecider
from blis_fast.policies.registry import Policy, Registry

DECIDERS = Registry[Policy]("deciders", flag="pd-decider")

DECIDERS.register(Policy("never", Decider.NEVER))
DECIDERS.register(Policy("always", Decider.ALWAYS))
DECIDERS.register(Policy("prefix-threshold", Decider.PREFIX_THRESHOLD))

ENCODE_DECIDERS = Registry[Policy]("encode_deciders", flag="encode-decider")

ENCODE_DECIDERS.register(Policy("never", EncodeDecider.NEVER))
ENCODE_DECIDERS.register(Policy("always", EncodeDecider.ALWAYS))
ENCODE_DECIDERS.register(Policy("multimodal", EncodeDecider.MULTIMODAL))
