"""Turn the kernel's decision records into the columns of ``decisions.parquet`` (CLU-6)."""

from __future__ import annotations

import numpy as np

from blis_fast.engine.simulate import DecisionTrace
from blis_fast.kernels.enums import AdmissionReason

ADMISSION_REASONS = {
    AdmissionReason.NONE: "",
    AdmissionReason.REJECT_ALL: "reject-all",
    AdmissionReason.NO_TOKENS: "insufficient tokens",
    AdmissionReason.TIER_SHED: "tier-shed",
    AdmissionReason.GAIE: "gaie-saturated",
    AdmissionReason.TENANT_BUDGET: "tenant-budget-shed",
    AdmissionReason.CUSTOM: "custom",
}


def _routing_reason(policy: str, best: float) -> str:
    """The reference's routing reason text (sim/routing.go)."""
    if policy in ("", "round-robin"):
        return f"round-robin[{int(best)}]"
    if policy == "least-loaded":
        return f"least-loaded (load={int(best)})"
    if policy == "always-busiest":
        return f"always-busiest (load={int(best)})"
    return f"weighted-scoring (score={best:.3f})"


def decision_columns(d: DecisionTrace, routing_policy: str) -> dict[str, list]:
    """One row per admission record, then per routing record, ordered by (clock, kind)."""
    na, nr = len(d.admission_request), len(d.routing_request)
    inst = lambda i: f"instance_{int(i)}"  # noqa: E731
    rows_kind = ["admission"] * na + ["routing"] * nr
    req = [f"request_{int(r)}" for r in d.admission_request] + [
        f"request_{int(r)}" for r in d.routing_request]
    clock = np.concatenate([d.admission_clock, d.routing_clock]).tolist()
    admitted = d.admitted.tolist() + [None] * nr
    reason = [ADMISSION_REASONS[int(c)] for c in d.admission_reason] + [
        _routing_reason(routing_policy, float(b)) for b in d.routing_best]
    chosen = [None] * na + [inst(t) for t in d.routing_target]
    regret = [None] * na + d.routing_regret.tolist()
    scores = [None] * na + ([row.tolist() for row in d.routing_scores]
                            if d.routing_scores is not None else [None] * nr)
    cand_inst: list = [None] * na
    cand_score: list = [None] * na
    for k in range(nr):
        valid = d.candidate_instance[k] >= 0
        cand_inst.append([inst(i) for i in d.candidate_instance[k][valid]])
        cand_score.append(d.candidate_score[k][valid].tolist())
    order = sorted(range(na + nr), key=lambda j: (clock[j], rows_kind[j] == "routing", j))

    def pick(col: list) -> list:
        return [col[j] for j in order]

    return {"kind": pick(rows_kind), "request_id": pick(req), "clock_us": pick(clock),
            "admitted": pick(admitted), "reason": pick(reason), "chosen_instance": pick(chosen),
            "regret": pick(regret), "instance_scores": pick(scores),
            "candidate_instances": pick(cand_inst), "candidate_scores": pick(cand_score)}
