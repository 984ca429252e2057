"""LoRA multi-adapter serving: the resolved configuration (spec lora.md, LORA-0..LORA-1, LORA-6).

The configuration is resolved once per ``run``/``replay`` from three layers (LORA-1.3): the
``--lora-config`` file, the ``lora:`` block of ``defaults.yaml`` and the scalar ``--lora-*``
flags. It is *active* (LORA-0.2) only when adapters are declared and a positive capacity is set;
otherwise it is inert, but still validated (LORA-1.5, LORA-D12).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class LoRAAdapter:
    """One registry entry: adapter id, rank (> 0) and the optional base model (LORA-1.8)."""

    id: str
    rank: int
    base_model: str = ""


@dataclass(frozen=True)
class LoRAConfig:
    """The resolved LoRA configuration; ``None`` scalars were never set (LORA-1.3)."""

    capacity: int | None = None  # None = never set (file key absent and flag not given)
    load_base_latency_us: float | None = None
    load_bandwidth_bytes_us: float | None = None
    footprint_bytes_per_rank: float | None = None
    tiers: tuple[tuple[int, float, float], ...] = ()  # (rank key, k6, k7), keys ascending
    adapters: tuple[LoRAAdapter, ...] = ()  # the registry, file order
    scorer_weight: float | None = None  # --lora-scorer-weight when given

    @property
    def active(self) -> bool:
        """True when adapters are declared and a positive capacity is set (LORA-0.2)."""
        return bool(self.adapters) and self.capacity is not None and self.capacity > 0

    def rank_of(self, adapter_id: str) -> int:
        """The declared rank of ``adapter_id``; 0 for an id not in the registry (LORA-4.8)."""
        for a in self.adapters:
            if a.id == adapter_id:
                return a.rank
        return 0

    def load_ticks(self, adapter_id: str) -> int:
        """Cold-load duration in ticks: ``max(1, ceil(L))`` with L of LORA-4.3 (0 unregistered)."""
        rank = self.rank_of(adapter_id)
        if rank == 0:
            latency = 0.0
        else:
            base = self.load_base_latency_us or 0.0
            footprint = self.footprint_bytes_per_rank or 0.0
            bandwidth = self.load_bandwidth_bytes_us or 0.0
            latency = base + math.ceil(footprint * float(rank) / bandwidth)
        return max(1, math.ceil(latency))

    @property
    def max_rank(self) -> int:
        """The largest declared rank (0 without adapters)."""
        return max((a.rank for a in self.adapters), default=0)

    def reserved_float(self) -> float:
        """The static HBM reservation as the reference's float64 product (LORA-6.1); 0 inert."""
        if not self.active:
            return 0.0
        footprint = self.footprint_bytes_per_rank or 0.0
        return float(self.capacity or 0) * footprint * float(self.max_rank)

    def reserved_bytes(self) -> int:
        """The static HBM reservation in bytes, truncated to an int (LORA-6.1); 0 when inert."""
        value = self.reserved_float()
        if not math.isfinite(value) or value <= 0:
            return 0
        return int(value)


INERT = LoRAConfig()
"""An inert configuration (no adapters, nothing set)."""
