"""blis_fast.stored: results kept beside the bytecode, keyed by their inputs and code."""

from __future__ import annotations

import numpy as np
import pytest

from blis_fast import stored


@pytest.fixture
def module(tmp_path):
    """A module file and a helper source beside it, as a package module would have."""
    (tmp_path / "helper.py").write_text("X = 1\n")
    path = tmp_path / "mod.py"
    path.write_text("Y = 2\n")
    return path


def _kept(module):
    return sorted(p.name for p in (module.parent / "__pycache__").glob("*.pickle"))


def test_computed_once_then_read_back(module):
    calls = []

    def compute():
        calls.append(1)
        return np.arange(5)

    for _ in range(3):
        got = stored.kept_beside(str(module), "t", b"in", compute, np.ndarray, ("helper.py",))
        assert got.tolist() == [0, 1, 2, 3, 4]
    assert len(calls) == 1 and len(_kept(module)) == 1 and _kept(module)[0].startswith("t-")


def test_other_inputs_or_changed_code_compute_again(module):
    calls = []

    def compute():
        calls.append(1)
        return len(calls)

    def get(inputs):
        return stored.kept_beside(str(module), "t", inputs, compute, int, ("helper.py",))

    assert get(b"a") == 1 and get(b"a") == 1
    assert get(b"b") == 2
    (module.parent / "helper.py").write_text("X = 2\n")  # the code that decides changed
    assert get(b"a") == 3
    module.write_text("Y = 3\n")
    assert get(b"a") == 4
    assert len(_kept(module)) == 4


def test_junk_is_ignored_and_errors_are_not_kept(module):
    def get(compute):
        return stored.kept_beside(str(module), "t", b"x", compute, dict)

    assert get(lambda: {"a": 1}) == {"a": 1}
    (path,) = (module.parent / "__pycache__").glob("*.pickle")
    for junk in (b"", path.read_bytes()[:5], b"\x80\x04K\x01."):  # empty, cut, an int
        path.write_bytes(junk)
        assert get(lambda: {"b": 2}) == {"b": 2}
    path.unlink()

    def fail():
        raise ValueError("bad input")

    with pytest.raises(ValueError, match="bad input"):
        get(fail)
    assert not path.exists()


def test_a_folder_that_cannot_be_written_computes_every_time(module):
    (module.parent / "__pycache__").write_text("a file where the folder would be")
    calls = []
    for _ in range(2):
        assert stored.kept_beside(str(module), "t", b"x", lambda: calls.append(1) or 7, int) == 7
    assert len(calls) == 2
    assert sorted(p.name for p in module.parent.iterdir()) == ["__pycache__", "helper.py", "mod.py"]


def test_an_unreadable_source_computes_every_time(module):
    calls = []
    for _ in range(2):
        stored.kept_beside(str(module), "t", b"x", lambda: calls.append(1) or 7, int,
                           ("missing.py",))
    assert len(calls) == 2
