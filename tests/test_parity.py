"""The acceptance tests: every parity case of tests/reference_cases/cases through the blis CLI."""

from __future__ import annotations

import pytest
from parity import PENDING, all_case_ids, check_case


def _param(case_id: str):
    if case_id in PENDING:
        mark = pytest.mark.xfail(reason=f"pending: needs {PENDING[case_id]}", strict=True)
        return pytest.param(case_id, marks=mark)
    return case_id


@pytest.mark.parametrize("case_id", [_param(c) for c in all_case_ids()])
def test_parity_case(case_id, tmp_path):
    errors = check_case(case_id, tmp_path)
    assert not errors, "\n".join(errors[:30])
