"""The acceptance tests: every parity case of tests/reference_cases/cases through the blis CLI."""

from __future__ import annotations

import pytest
from parity import all_case_ids, check_case, pending_reason


def _param(case_id: str):
    reason = pending_reason(case_id)
    if reason is not None:
        mark = pytest.mark.xfail(reason=f"pending: needs {reason}", strict=True)
        return pytest.param(case_id, marks=mark)
    return case_id


@pytest.mark.parametrize("case_id", [_param(c) for c in all_case_ids()])
def test_parity_case(case_id, tmp_path):
    errors = check_case(case_id, tmp_path)
    assert not errors, "\n".join(errors[:30])
