"""Turn the kernel's decision records into the columns of ``decisions.parquet`` (CLU-6)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from blis_fast.engine.results import DecisionTrace
from blis_fast.policies.admission import admission_reasons
from blis_fast.policies.routing import reason_text


def decision_columns(d: DecisionTrace, routing_policy: str,
                     instance_name: Callable[[int], str] | None = None) -> dict[str, list]:
    """One row per admission record, then per routing record, ordered by (clock, kind);
    ``instance_name`` names an instance index (default ``instance_<i>``)."""
    na, nr = len(d.admission_request), len(d.routing_request)

    def inst(i: int) -> str:
        return instance_name(int(i)) if instance_name is not None else f"instance_{int(i)}"

    rows_kind = ["admission"] * na + ["routing"] * nr
    req = [f"request_{int(r)}" for r in d.admission_request] + [
        f"request_{int(r)}" for r in d.routing_request]
    clock = np.concatenate([d.admission_clock, d.routing_clock]).tolist()
    admitted = d.admitted.tolist() + [None] * nr
    admission = admission_reasons()
    reason = [admission[int(c)] for c in d.admission_reason] + [
        reason_text(routing_policy, float(b)) for b in d.routing_best]
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
