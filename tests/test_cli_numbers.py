"""Every subcommand reads its numeric flags with Go's parsers (``blis_fast.cli_numbers``):
spellings Go refuses give one stderr line naming the flag and exit 2; Go's spellings (hex
floats, base prefixes) mean the same number as the plain decimal."""

from __future__ import annotations

import pytest
from _cli import invoke

REFUSED = [" 5", "5 ", "+-5", "\u0665", "1e400"]


@pytest.mark.parametrize("text", REFUSED)
@pytest.mark.parametrize("argv,flag", [
    (["observe", "--server-url", "http://127.0.0.1:9", "--model", "m", "--trace-header",
      "h.yaml", "--trace-data", "d.csv", "--num-requests", "3", "--rate"], "--rate"),
    (["observe", "--server-url", "http://127.0.0.1:9", "--model", "m", "--trace-header",
      "h.yaml", "--trace-data", "d.csv", "--rate", "1", "--num-requests"], "--num-requests"),
    (["convert", "preset", "--name", "chatbot", "--rate"], "--rate"),
    (["saturate", "spec.yaml", "--slo", "ttft_p99_ms<=5", "--tolerance"], "--tolerance"),
    (["evolve", "eval", "cand.py", "--timeout"], "--timeout"),
])
def test_numeric_flag_refuses_what_go_refuses(tmp_path, monkeypatch, argv, flag, text):
    monkeypatch.chdir(tmp_path)
    res = invoke([*argv, text])
    assert res.code == 2, res.stderr
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and flag in lines[0] and "Traceback" not in res.stderr
    assert res.stdout == ""
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_go_spellings_mean_the_same_number():
    plain = invoke(["convert", "preset", "--name", "chatbot", "--rate", "4", "--num-requests",
                    "16"])
    spelled = invoke(["convert", "preset", "--name", "chatbot", "--rate", "0x1p2",
                      "--num-requests", "0x10"])
    assert plain.code == spelled.code == 0, plain.stderr + spelled.stderr
    assert plain.stdout == spelled.stdout and "16" in plain.stdout
