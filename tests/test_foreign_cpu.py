"""The machine-load gate of the real-server checks: a busy process outside this process's tree
counts as foreign CPU, a busy child of this process does not."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from blis_fast.testing.foreign_cpu import ForeignCpu

pytestmark = pytest.mark.skipif(not Path("/proc/stat").exists(),
                                reason="reads /proc (Linux only)")

BUSY = "import time\nt = time.time()\nwhile time.time() - t < {s}: pass\n"


def _background_share(seconds: float = 0.5) -> float:
    """Foreign CPU (in cores) while this test does nothing: other jobs on the machine."""
    meter = ForeignCpu()
    meter.start()
    time.sleep(seconds)
    return meter.share()


def test_own_child_is_not_foreign_and_a_detached_process_is():
    background = _background_share()
    if background > 0.3:  # the busy loops below would compete with it and the gaps blur
        pytest.skip(f"other processes use {background:.2f} cores: too busy to measure shares")
    own = ForeignCpu()
    own.start()
    subprocess.run([sys.executable, "-c", BUSY.format(s=1.5)], check=True)
    own_share = own.share()

    detached = ForeignCpu()
    detached.start()
    # a grandchild whose parent exits at once is re-parented outside this process's tree
    subprocess.run([sys.executable, "-c",
                    "import subprocess, sys\n"
                    f"subprocess.Popen([sys.executable, '-c', {BUSY.format(s=1.5)!r}], "
                    "start_new_session=True)\n"], check=True)
    time.sleep(1.7)
    foreign_share = detached.share()
    assert foreign_share > 0.6, foreign_share
    assert own_share < foreign_share - 0.5, (own_share, foreign_share)
