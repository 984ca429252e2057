"""The acceptance tests: every parity case of ../shared/parity/cases through the blis CLI."""

from __future__ import annotations

import pytest

from tests.parity import PENDING, all_case_ids, check_case


@pytest.mark.parametrize("case_id", all_case_ids())
def test_parity_case(case_id, tmp_path):
    if case_id in PENDING:
        pytest.xfail(f"pending: needs {PENDING[case_id]}")
    errors = check_case(case_id, tmp_path)
    assert not errors, "\n".join(errors[:30])
