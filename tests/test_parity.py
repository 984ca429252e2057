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


def test_head_extras_are_dropped_only_where_the_case_says():
    """An August case's additions (a key in every metrics object, ``ITL:`` lines, a session
    block) do not count against blis_fast, and do count for an ordinary case."""
    from parity import CASES_DIR, compare_stdout

    april = (CASES_DIR / "quickstart-llama31-8b" / "stdout.txt").read_text()
    august = (april.replace('"timed_out_requests": 0', '"timed_out_requests": 0,\n'
                            '  "cache_hit_rate": 0.25')
              + "ITL: 12 samples\n=== Session Metrics ===\nSessions: 3\n")
    assert august != april
    assert compare_stdout(april, august, head_extras=True) == []
    assert compare_stdout(april, april.replace("0", "1", 1), head_extras=True) != []
    assert compare_stdout(april, august) != []
