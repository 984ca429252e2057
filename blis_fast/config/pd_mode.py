"""Whether a run is in P/D (disaggregated prefill/decode) mode: one rule, read before any check
(which engine to compile first, which head-dim rule sizes KV) and by the P/D configuration."""

from __future__ import annotations

from typing import Any


def pd_mode_on(prefill: int, decode: int, shared: int) -> bool:
    """P/D mode: some prefill, decode or shared instance (encode alone never turns it on)."""
    return prefill + decode + shared > 0


def requested(opts: Any) -> bool:
    """Whether the flags ask for P/D mode (options without the P/D flags never do)."""
    try:
        return pd_mode_on(opts.prefill_instances, opts.decode_instances,
                          opts.prefill_decode_instances)
    except AttributeError:  # options of a command without the P/D flags
        return False
