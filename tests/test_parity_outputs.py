"""The parity runner's comparison of a case's extra ``outputs`` files (``ignore_keys``, line
files with numbers to 1e-9, nothing left behind by a failing case)."""

from __future__ import annotations

import json

from parity import compare_outputs


def _dirs(tmp_path, name, expected, actual):
    src, work = tmp_path / "case", tmp_path / "work"
    src.mkdir(exist_ok=True)
    work.mkdir(exist_ok=True)
    (src / name).write_text(expected)
    if actual is not None:
        (work / name).write_text(actual)
    return src, work


def test_json_output_compared_with_tolerance_and_ignored_keys(tmp_path):
    case = {"exit_code": 0, "outputs": ["r.json"], "ignore_keys": ["created_at"]}
    exp = {"a": {"x": 1.0000000000001, "created_at": "t1"}, "n": 3}
    act = {"a": {"x": 1.0, "created_at": "t2"}, "n": 3}
    src, work = _dirs(tmp_path, "r.json", json.dumps(exp), json.dumps(act))
    assert compare_outputs(case, src, work) == []
    (work / "r.json").write_text(json.dumps({"a": {"x": 1.1, "created_at": "t1"}, "n": 3}))
    assert any("r.a.x" in e or "a.x" in e for e in compare_outputs(case, src, work))


def test_text_output_line_by_line(tmp_path):
    case = {"exit_code": 0, "outputs": ["h.yaml"], "ignore_keys": ["created_at"]}
    exp = 'created_at: "2026-01-01T00:00:00Z"\nmode: real\nnetwork:\n    rtt_ms: 2.5\n'
    ok = 'created_at: "2027-05-05T11:11:11Z"\nmode: real\nnetwork:\n    rtt_ms: 2.5000000000001\n'
    src, work = _dirs(tmp_path, "h.yaml", exp, ok)
    assert compare_outputs(case, src, work) == []
    (work / "h.yaml").write_text(exp.replace("real", "generated"))
    assert compare_outputs(case, src, work)
    (work / "h.yaml").write_text(exp.replace("2.5", "2.6"))
    assert compare_outputs(case, src, work)
    (work / "h.yaml").unlink()
    assert compare_outputs(case, src, work) == ["h.yaml was not written"]


def test_failing_case_must_leave_no_output(tmp_path):
    case = {"exit_code": 1, "outputs": ["r.json"]}
    src, work = _dirs(tmp_path, "r.json", "{}", None)
    assert compare_outputs(case, src, work) == []
    (work / "r.json").write_text("{}")
    assert compare_outputs(case, src, work) == ["output file r.json written by a failing run"]
