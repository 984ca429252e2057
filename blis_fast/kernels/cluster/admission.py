"""Cluster admission (CLU-2, DELTA-38..40): one decision per arriving request, over the snapshots
of the candidate instances, recorded in the decision trace when tracing is on.

Policies (:data:`Admission`): always-admit, reject-all, token-bucket, tier-shed, gaie-legacy
and the user's ``custom`` rule; tenant budgets (DELTA-40) apply after any policy that admitted,
with the tenants' in-flight accounting kept by :func:`on_routed` and :func:`on_done`.

The policies' codes, their refusal reasons' codes and the slots of their float parameters are
defined here, beside the branches that read them as compile-time constants; the registry
(``blis_fast/policies/admission.py``) imports them from here.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from blis_fast.kernels.cluster import hooks as hk
from blis_fast.kernels.cluster.router_state import RouterCfg, RouterVar, SnapField, SnapRate
from blis_fast.kernels.cluster.routing import fill_hook_view, instance_load
from blis_fast.kernels.jit import njit


class AdmissionT(NamedTuple):
    """Admission policies' kernel codes (CLU-2, DELTA-38..40)."""

    ALWAYS: int = 0
    REJECT_ALL: int = 1
    TOKEN_BUCKET: int = 2
    TIER_SHED: int = 3
    GAIE_LEGACY: int = 4
    CUSTOM: int = 5  # the user's admission hook


Admission = AdmissionT()


class AdmissionReasonT(NamedTuple):
    """Why an admission decision was taken, as recorded in the decision trace (CLU-6)."""

    NONE: int = 0
    REJECT_ALL: int = 1
    NO_TOKENS: int = 2
    TIER_SHED: int = 3
    GAIE: int = 4
    TENANT_BUDGET: int = 5
    CUSTOM: int = 6


AdmissionReason = AdmissionReasonT()


class RouterParamT(NamedTuple):
    """Slots of ``RouterState.rfl``: the admission policies' float parameters."""

    TB_CAPACITY: int = 0
    TB_REFILL: int = 1
    GAIE_QD: int = 2
    GAIE_KV: int = 3
    SIZE: int = 4


RouterParam = RouterParamT()


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _token_bucket(rt, input_len, clock):
    """Refill the bucket for the time elapsed, then take the request's input tokens if there
    are enough. Returns True when admitted."""
    elapsed = clock - rt.st[RouterVar.TB_LAST]
    if elapsed > 0:
        refill = np.float64(elapsed) * rt.rfl[RouterParam.TB_REFILL] / 1e6
        rt.tb_tokens[0] = min(rt.rfl[RouterParam.TB_CAPACITY], rt.tb_tokens[0] + refill)
        rt.st[RouterVar.TB_LAST] = clock
    cost = np.float64(input_len)
    if rt.tb_tokens[0] >= cost:
        rt.tb_tokens[0] -= cost
        return True
    return False


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _tier_shed(rt, r, cand, n):
    """Shed requests below the minimum priority while the busiest candidate's load is over the
    threshold. Returns True when admitted."""
    max_load = 0
    for k in range(n):
        load = instance_load(rt, cand[k])
        if load > max_load:
            max_load = load
    if max_load > rt.rcfg[RouterCfg.TIER_THRESHOLD]:
        return rt.req_priority[r] >= rt.rcfg[RouterCfg.TIER_MIN_PRIORITY]
    return True


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _gaie_saturated(rt, r, cand, n):
    """gaie-legacy: a sheddable request is refused when the mean over the candidates of
    max(queue / QD threshold, KV utilisation / KV threshold) is at least 1."""
    if rt.req_sheddable[r] != 1:
        return False
    total = 0.0
    for k in range(n):
        i = cand[k]
        q_ratio = np.float64(rt.snap_i[i, SnapField.QUEUE]) / rt.rfl[RouterParam.GAIE_QD]
        kv_ratio = rt.snap_f[i, SnapRate.KV_UTIL] / rt.rfl[RouterParam.GAIE_KV]
        total += max(q_ratio, kv_ratio)
    sat = total / np.float64(n) if n > 0 else 1.0
    return sat >= 1.0


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _over_tenant_budget(rt, r):
    """DELTA-40: a sheddable request of a tenant whose in-flight count exceeds its budget
    (``tenant_budget`` holds budget * max(1, instances * max running requests))."""
    t = rt.req_tenant[r]
    if t >= 0 and rt.tenant_budget[t] >= 0 and rt.req_sheddable[r] == 1:
        return np.float64(rt.tenant_inflight[t]) > rt.tenant_budget[t]
    return False


@njit(cache=True, _nrt=False, error_model="numpy")
def _policy_decision(rt, r, input_len, cand, n, clock, arrival, admit_fn, kv):
    """The admission policy's verdict: (admitted, reason)."""
    code = rt.rcfg[RouterCfg.ADMISSION]
    if code == Admission.REJECT_ALL:
        return False, AdmissionReason.REJECT_ALL
    if code == Admission.TOKEN_BUCKET:
        if not _token_bucket(rt, input_len, clock):
            return False, AdmissionReason.NO_TOKENS
    elif code == Admission.TIER_SHED:
        if not _tier_shed(rt, r, cand, n):
            return False, AdmissionReason.TIER_SHED
    elif code == Admission.CUSTOM:
        fill_hook_view(rt, kv, r, input_len, np.int64(0), cand, n, clock, np.int64(0) > 0)
        rt.hook_req[hk.REQ_ARRIVAL] = arrival
        if not admit_fn(rt.hook_snap[:n], rt.hook_req):
            return False, AdmissionReason.CUSTOM
    elif code == Admission.GAIE_LEGACY:
        if _gaie_saturated(rt, r, cand, n):
            return False, AdmissionReason.GAIE
    return True, AdmissionReason.NONE


@njit(cache=True, _nrt=False, error_model="numpy")
def admit(rt, r, input_len, cand, n, clock, arrival, admit_fn, kv):
    """Admission decision for request ``r`` over the snapshots of the ``n`` candidates
    ``cand[:n]`` (CLU-2, DELTA-38..40); ``admit_fn`` is the user rule of the ``custom`` policy.
    Returns (admitted, reason)."""
    ok, reason = _policy_decision(rt, r, input_len, cand, n, clock, arrival, admit_fn, kv)
    if ok and rt.rcfg[RouterCfg.HAS_TENANT_BUDGETS] == 1 and _over_tenant_budget(rt, r):
        ok = False
        reason = AdmissionReason.TENANT_BUDGET
    if rt.rcfg[RouterCfg.TRACE] == 1:
        k = rt.st[RouterVar.N_ADMISSION_RECORDS]
        rt.adm_req[k] = r
        rt.adm_clock[k] = clock
        rt.adm_ok[k] = 1 if ok else 0
        rt.adm_reason[k] = reason
        rt.st[RouterVar.N_ADMISSION_RECORDS] = k + 1
    return ok, reason


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def on_routed(rt, r):
    """Tenant in-flight accounting when a request is dispatched (DELTA-40)."""
    t = rt.req_tenant[r]
    if rt.rcfg[RouterCfg.HAS_TENANT_BUDGETS] == 1 and t >= 0:
        rt.tenant_inflight[t] += 1


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def on_done(rt, r):
    """Tenant in-flight accounting when an instance finishes with a request (DELTA-40)."""
    t = rt.req_tenant[r]
    if rt.rcfg[RouterCfg.HAS_TENANT_BUDGETS] == 1 and t >= 0 and rt.tenant_inflight[t] > 0:
        rt.tenant_inflight[t] -= 1


@njit(cache=True, _nrt=False, error_model="numpy")
def is_known_policy(code):
    """True for an admission code :func:`admit` implements."""
    return 0 <= code < len(Admission)
