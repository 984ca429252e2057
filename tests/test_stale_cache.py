"""A renumbered kernel code recompiles every kernel that holds it (issue 26).

Compile-time constants are frozen into Numba's cached machine code, and Numba keys a cached
kernel by its own file only. The codes a kernel branches on are defined in the kernel modules
(``kernels/cluster/admission.py`` for the admission policies) and every cached kernel's key digests all
kernel modules (``kernels/jit.py``), so renumbering a code in a scratch copy of the package must
make the copy compile its engine again and give the very same results; a stale engine would
read the token bucket's new code as another policy's.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from test_recipes import _copy_package

CHILD = r'''
import json, sys
import blis_fast
assert blis_fast.__file__.startswith(sys.argv[1]), blis_fast.__file__
from blis_fast.kernels.cluster.admission import Admission
r = blis_fast.run(model="meta-llama/llama-3.1-8b-instruct", num_instances=2, rate=80,
                  num_requests=150, seed=5, log="error", admission_policy="token-bucket",
                  token_bucket_capacity=4000, token_bucket_refill_rate=20000)
print(json.dumps({"stdout": r.stdout, "rejected": int(r.simulation.rejected_admission),
                  "token_bucket_code": Admission.TOKEN_BUCKET}))
'''


def _run(root: Path, tmp: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(root)}
    res = subprocess.run([sys.executable, "-c", CHILD, str(root)], cwd=tmp, env=env,
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-4000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def _engine_cache_entries(root: Path) -> set[str]:
    cache = root / "blis_fast" / "kernels" / "engine" / "__pycache__"
    return {p.name for p in cache.glob("event_loop.run_events*.nbc")}


def test_renumbered_admission_code_recompiles_the_engine(tmp_path: Path) -> None:
    root = _copy_package(tmp_path / "pkg", caches=True)
    before = _run(root, tmp_path)
    assert before["rejected"] > 0  # the code decides the run: the bucket refuses requests
    entries = _engine_cache_entries(root)
    assert entries  # the first run left the engine in the copy's cache

    admission = root / "blis_fast" / "kernels" / "cluster" / "admission.py"
    source = admission.read_text()
    swapped = re.sub(r"^    TOKEN_BUCKET: int = 2$", "    TOKEN_BUCKET: int = 3", source,
                     flags=re.M)
    swapped = re.sub(r"^    TIER_SHED: int = 3$", "    TIER_SHED: int = 2", swapped, flags=re.M)
    assert swapped.count(": int = ") == source.count(": int = ") and swapped != source
    admission.write_text(swapped)

    after = _run(root, tmp_path)
    assert after["token_bucket_code"] == 3 != before["token_bucket_code"]
    assert after["rejected"] == before["rejected"]
    assert after["stdout"] == before["stdout"]
    assert _engine_cache_entries(root) - entries  # compiled anew, not loaded stale
