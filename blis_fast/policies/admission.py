"""Admission policies (CLU-2, DELTA-38/39/40): who may enter the cluster.

One ``register`` call per built-in policy: its name, kernel code, parameters (bundle key,
default, checks, slot) and decision-trace reason text. The policy itself is a branch of
``_policy_decision`` in ``blis_fast/kernels/cluster/admission.py``, which also defines the codes this
module imports (:data:`Admission`, the refusal reasons' :data:`AdmissionReason`, the float
parameters' slots :data:`RouterParam`): compile-time constants live with the kernels that
freeze them. Recipe: docs/extending.md.
"""

from __future__ import annotations

from blis_fast.kernels.cluster.admission import Admission, AdmissionReason
from blis_fast.options import Check, finite_positive
from blis_fast.policies.registry import Param, Policy, Registry

ADMISSION = Registry[Policy]("admission", flag="admission-policy", slot="RouterCfg.ADMISSION")


def _bundle_finite_at_least_zero() -> Check:
    return Check(lambda v: v >= 0 and v != float("inf"),
                 "{flag} must be a finite number >= 0, got {value}")


ADMISSION.register(Policy("always-admit", Admission.ALWAYS))
ADMISSION.register(Policy("reject-all", Admission.REJECT_ALL,
                          reason="reject-all", reason_code=AdmissionReason.REJECT_ALL))
ADMISSION.register(Policy("token-bucket", Admission.TOKEN_BUCKET, params=(
    Param("token_bucket_capacity", float, "RouterParam.TB_CAPACITY", flag="token-bucket-capacity",
          bundle_check=_bundle_finite_at_least_zero(), check=finite_positive()),
    Param("token_bucket_refill_rate", float, "RouterParam.TB_REFILL",
          flag="token-bucket-refill-rate", bundle_check=_bundle_finite_at_least_zero(),
          check=finite_positive()),
), reason="insufficient tokens", reason_code=AdmissionReason.NO_TOKENS))
ADMISSION.register(Policy("tier-shed", Admission.TIER_SHED, params=(
    Param("tier_shed_threshold", int, "RouterCfg.TIER_THRESHOLD", default=0,
          bundle_check=Check(lambda v: v >= 0, "{flag} must be >= 0, got {value}")),
    Param("tier_shed_min_priority", int, "RouterCfg.TIER_MIN_PRIORITY", default=0,
          bundle_default=3),
), reason="tier-shed", reason_code=AdmissionReason.TIER_SHED))
ADMISSION.register(Policy("gaie-legacy", Admission.GAIE_LEGACY, params=(
    Param("gaie_qd_threshold", float, "RouterParam.GAIE_QD", default=5.0,
          bundle_check=finite_positive("{flag} must be a finite value > 0, got {value}")),
    Param("gaie_kv_threshold", float, "RouterParam.GAIE_KV", default=0.8,
          bundle_check=Check(lambda v: 0 < v <= 1.0,
                             "{flag} must be a finite value in (0, 1.0], got {value}")),
), reason="gaie-saturated", reason_code=AdmissionReason.GAIE))
ADMISSION.register(Policy("custom", Admission.CUSTOM, reason="custom", reason_code=AdmissionReason.CUSTOM,
                          hook="admission"))

OTHER_REASONS = {AdmissionReason.NONE: "", AdmissionReason.TENANT_BUDGET: "tenant-budget-shed"}
"""Decision-trace reasons of no single policy: admitted, and the tenant budget (DELTA-40)."""


def admission_reasons() -> dict[int, str]:
    """The decision-trace text of every admission reason code (CLU-6)."""
    reasons = dict(OTHER_REASONS)
    reasons.update((p.reason_code, p.reason) for p in ADMISSION if p.reason)
    return reasons


def admission_params() -> tuple[Param, ...]:
    """Every admission policy's parameters, in registration order (the bundle's key order)."""
    return tuple(param for policy in ADMISSION for param in policy.params)
