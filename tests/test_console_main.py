"""The ``blis`` executable (``cli.console_main``): leaves with ``os._exit`` after flushing and
running the exit handlers, with the exit code ``main`` chose; the collector is back on (with the
start-up objects frozen) once a command runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_RUN = """
import atexit, gc, sys
import blis_fast.cli as cli
atexit.register(lambda: sys.stdout.write("atexit handler ran\\n"))
original = cli.startup_done
def seen():
    original()
    sys.stdout.write(f"collector on {gc.isenabled()} frozen {gc.get_freeze_count() > 0}\\n")
cli.startup_done = seen
sys.argv = ["blis", *sys.argv[1:]]
cli.console_main()
"""


def _blis(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _RUN, *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def test_help_flushes_output_runs_exit_handlers_and_exits_zero():
    proc = _blis("convert", "--help")
    assert proc.returncode == 0
    assert "Usage:" in proc.stdout
    assert proc.stdout.endswith("atexit handler ran\n")
    assert "collector on True frozen True" in proc.stdout


def test_a_refused_flag_exits_2_with_one_line():
    proc = _blis("run", "--model", "meta-llama/llama-3.1-8b-instruct", "--rate", "fast")
    assert proc.returncode == 2
    assert proc.stderr.count("blis: error:") == 1 and "--rate" in proc.stderr
    assert "collector on True frozen True" in proc.stdout  # the run command re-enabled it
    assert proc.stdout.endswith("atexit handler ran\n")


def test_a_string_exit_code_is_printed_and_exits_1(tmp_path):
    script = tmp_path / "leave.py"
    script.write_text("import sys\nfrom blis_fast import cli\nsys.stdout.write('partial')\n"
                      "cli._leave('fatal: stopped')\n")
    proc = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert (proc.returncode, proc.stdout, proc.stderr) == (1, "partial", "fatal: stopped\n")
