"""``EngineConfig``: what the engine kernel runs, composed from a run's resolved parts, and how
it packs itself into the kernel's config arrays by the slots the options rows and the policy
registries declare."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from blis_fast.config.latency_backends import LATENCY_BACKENDS
from blis_fast.kernels.cluster.admission import RouterParam
from blis_fast.kernels.cluster.router_state import RouterCfg
from blis_fast.kernels.engine.latency import post_decode_fixed_overhead
from blis_fast.kernels.engine.state import ConfigSlot
from blis_fast.options import RUN_OPTIONS
from blis_fast.policies.admission import ADMISSION, admission_params
from blis_fast.policies.priority import PRIORITY
from blis_fast.policies.routing import ROUTING
from blis_fast.policies.scheduler import SCHEDULER
from blis_fast.policies.scorers import DEFAULT_PROFILE

if TYPE_CHECKING:
    from blis_fast.config.autoscale import AutoscaleSetup
    from blis_fast.config.kv_offload import KVOffloadConfig
    from blis_fast.config.latency import LatencyConfig
    from blis_fast.config.lora import LoRAConfig
    from blis_fast.config.policy_bundle import Policies

SLOT_ARRAYS = {"ConfigSlot": ConfigSlot, "RouterCfg": RouterCfg, "RouterParam": RouterParam}
"""The slot families a ``"<family>.<slot>"`` slot names, by family (the config arrays
they index: ``SimConfig.ints``, ``RouterState.rcfg``, ``RouterState.rfl``)."""


@dataclass(frozen=True)
class EngineConfig:
    """What the kernel runs, composed from the resolved parts of a run.

    ``options`` holds every flag's effective value (the resolved horizon, KV blocks,
    max-model-len and counterfactual k included); ``latency`` the backend's code, α and packed
    parameters; ``policies`` the merged policy names, scorers and admission parameters.
    """

    options: Any  # blis_fast.options.RunOptions
    latency: LatencyConfig
    policies: Policies
    hash_decode_blocks: bool = False  # register decode-filled blocks (accumulating sessions)
    hooks: Hooks | None = None  # user policies (custom scorer / admission / scheduler key)
    # per-instance overrides (P/D pools, instances of another GPU or TP): one value per
    # instance; None = the resolved global value (options.total_kv_blocks / max_model_len)
    instance_kv_blocks: tuple[int, ...] | None = None
    instance_max_model_len: tuple[int, ...] | None = None
    pd: Any = None  # blis_fast.config.pd.PDConfig: P/D pools and link (None or off: no P/D)
    # latency backend code and parameters per class ([classes, P], row 0 = the global ones)
    # and each instance's class; None = one class, latency.code and latency.params
    latency_class_params: np.ndarray | None = None
    latency_class_codes: tuple[int, ...] | None = None
    instance_latency_class: tuple[int, ...] | None = None
    autoscale: AutoscaleSetup | None = None  # autoscaler / node pools; None: a fixed fleet
    lora: LoRAConfig | None = None  # LoRA adapters (None or inert: no LoRA, LORA-0.2)
    # the August KV-offload tier chain (--kv-offload-config or a replayed trace header, KVO-1.2;
    # per_block_bytes derived); None: no chain
    kv_offload: KVOffloadConfig | None = None

    @property
    def pd_on(self) -> bool:
        """True in P/D mode (``pd`` given with a prefill, decode or shared pool)."""
        return self.pd is not None and self.pd.on

    @property
    def scorers(self) -> tuple[tuple[str, float], ...]:
        """Weighted routing's scorers and weights (the default profile when none is set)."""
        return self.policies.scorers or DEFAULT_PROFILE

    @property
    def trace_decisions(self) -> bool:
        """True when the decision trace is recorded (``--trace-level decisions``)."""
        return self.options.trace_level == "decisions"

    def kv_blocks_per_instance(self) -> np.ndarray:
        """Each instance's GPU KV blocks (int64 [num_instances])."""
        return self._per_instance(self.instance_kv_blocks, self.options.total_kv_blocks)

    def max_model_len_per_instance(self) -> np.ndarray:
        """Each instance's max model length, 0 = unlimited (int64 [num_instances])."""
        return self._per_instance(self.instance_max_model_len, self.options.max_model_len)

    def latency_params_by_class(self) -> np.ndarray:
        """``SimConfig.latency_params``: one row per latency class (float64 [classes, P])."""
        if self.latency_class_params is None:
            return np.ascontiguousarray(np.atleast_2d(self.latency.params), np.float64)
        return np.ascontiguousarray(self.latency_class_params, np.float64)

    def latency_class_per_instance(self) -> np.ndarray:
        """Each instance's latency class (int64 [num_instances])."""
        return self._per_instance(self.instance_latency_class, 0)

    def backend_per_instance(self) -> np.ndarray:
        """Each instance's latency backend code, its class's (int64 [num_instances])."""
        codes = self.latency_class_codes or (self.latency.code,)
        return np.array(codes, np.int64)[self.latency_class_per_instance()]

    def post_decode_per_instance(self) -> np.ndarray:
        """Each instance's fixed post-decode overhead (ticks) under its backend: the
        coefficients are the global ones whatever the backend (PD-1.8)."""
        alpha = np.ascontiguousarray(self.latency.alpha, np.float64)
        codes = self.latency_class_codes or (self.latency.code,)
        per_class = np.array([post_decode_fixed_overhead(c, alpha) for c in codes], np.int64)
        return per_class[self.latency_class_per_instance()]

    def _per_instance(self, values: tuple[int, ...] | None, default: int) -> np.ndarray:
        n = self.options.num_instances
        if values is None:
            return np.full(n, default, np.int64)
        if len(values) != n:
            raise ValueError(f"expected {n} per-instance values, got {len(values)}")
        return np.array(values, np.int64)

    def slot_values(self) -> list[tuple[str, int | float]]:
        """Every kernel config slot (``"<array>.<constant>"``) with its value: the options rows
        naming a slot, each policy family's chosen code, the admission parameters and the
        latency backend's per-token and post-decode times."""
        pol, lat = self.policies, self.latency
        values: list[tuple[str, int | float]] = [
            (spec.slot, getattr(self.options, spec.field)) for spec in RUN_OPTIONS if spec.slot]
        values += [(registry.slot, registry.code(name)) for registry, name in (
            (ADMISSION, pol.admission), (ROUTING, pol.routing), (PRIORITY, pol.priority),
            (SCHEDULER, pol.scheduler))]
        values.append((LATENCY_BACKENDS.slot, lat.code))
        values += [(p.slot, pol.params[p.key]) for p in admission_params()]
        values += [("ConfigSlot.OUTPUT_TOKEN_TIME", lat.output_token_time),
                   ("ConfigSlot.POST_DECODE", lat.post_decode_overhead)]
        return values

    def pack_slots(self, arrays: dict[str, np.ndarray]) -> None:
        """Write ``slot_values`` into the config arrays named by their slots."""
        for slot, value in self.slot_values():
            family, name = slot.split(".")
            arrays[family][getattr(SLOT_ARRAYS[family], name)] = value


@dataclass(frozen=True)
class Hooks:
    """User policy hooks, each a Numba cfunc of the signature in blis_fast.kernels.cluster.hooks."""

    scorer: object | None = None
    admission: object | None = None
    scheduler_key: object | None = None
