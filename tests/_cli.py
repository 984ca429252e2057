"""Run the ``blis`` command line in this process and capture its exit code and output."""

from __future__ import annotations

import contextlib
import io
import traceback
from dataclasses import dataclass
from pathlib import Path

from blis_fast.cli import main


@dataclass
class CliResult:
    code: int
    stdout: str
    stderr: str


def invoke(argv: list[str]) -> CliResult:
    """``blis <argv>`` through ``blis_fast.cli.main``; an uncaught exception is reported as the
    console script would (traceback on stderr, exit 1)."""
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(argv)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            err.write(traceback.format_exc())
            code = 1
    return CliResult(code, out.getvalue(), err.getvalue())


def refused(cfg: dict, folder: Path) -> CliResult:
    """``blis run`` of a generated differential configuration ``cfg`` (``tests/differential``:
    its ``args``, its ``files`` written to ``folder``, the working directory), asserted
    refused as bad input is: exit 2, an error line on stderr, no traceback."""
    for name, text in cfg["files"].items():
        (folder / name).write_text(text)
    result = invoke(["run", *cfg["args"]])
    assert result.code == 2, (cfg, result.stderr[-300:])
    assert "Traceback" not in result.stderr
    assert "error" in result.stderr.lower(), result.stderr[-300:]
    return result
