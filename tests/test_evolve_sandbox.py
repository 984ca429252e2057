"""Evolve's containment promises, each tried by a hostile candidate (issue 28 item 2).

Two layers are checked. The restricted language: a candidate that reaches for the network,
the result channel, a process or raw memory is refused as a compile failure (fitness -1),
and what it prints never reaches the protocol. The operating-system layer, checked as if a
candidate had escaped the language (trusted test code run as the sandbox's body): no network
(even to a listener on 127.0.0.1), no process surviving the timeout, no ``/dev/shm`` beyond a
private tmpfs, and a forged record (NaN, 1e9) refused by the supervisor. Where this platform
cannot make a namespace, the test checks that the README says which promise does not hold.
"""

from __future__ import annotations

import copy
import json
import os
import re
import socket
import time
from pathlib import Path

import pytest

from blis_fast.evolve import WORST_FITNESS
from blis_fast.evolve.adapters import INITIAL_PROGRAMS
from blis_fast.evolve.benchmark import DEFAULT_BENCHMARK, benchmark_from_dict
from blis_fast.evolve.evaluate import CandidateError, compile_candidate
from blis_fast.evolve.sandbox import checked_record, evaluate_contained, run_contained

README = " ".join((Path(__file__).resolve().parents[1] / "README.md").read_text().split())
HEAD = "def custom_scorer(snapshots, request, out):\n"
FILL = "    for i in range(out.shape[0]):\n        out[i] = 1.0 / (1.0 + snapshots[i, 0])\n"
HELD = {"pid": "namespace", "network": "namespace", "dev_shm": "private tmpfs"}
FALLBACK = {"pid": "processes that leave the evaluation's session",
            "network": "network access", "dev_shm": "`/dev/shm` writes"}
"""The README's words for each promise that does not hold without namespaces."""


def _bench(num_requests: int = 60):
    data = copy.deepcopy(DEFAULT_BENCHMARK)
    data["seeds"] = [1]
    data["workloads"] = data["workloads"][:1]
    data["workloads"][0]["options"] = {"num_requests": num_requests}
    return benchmark_from_dict(data, "test benchmark")


@pytest.fixture(scope="module")
def containment() -> dict[str, str]:
    """What the sandbox makes on this machine (one empty run)."""
    return run_contained("python", ("", 256), timeout_s=20, memory_mb=256)["containment"]


def _held_or_documented(containment: dict[str, str], promise: str) -> bool:
    """True when the OS mechanism holds here; else assert the README says it does not."""
    if containment[promise] == HELD[promise]:
        return True
    assert "Where namespaces cannot be made" in README
    assert FALLBACK[promise] in README.split("Where namespaces cannot be made")[1][:600]
    return False


def test_root_linux_makes_every_namespace(containment):
    """On Linux as root (this machine, CI) every promise holds at the OS level."""
    if os.name == "posix" and os.path.exists("/proc/self/ns/pid") and os.geteuid() == 0:
        assert containment == HELD
    else:
        for promise in HELD:
            _held_or_documented(containment, promise)


# ------------------------------------------------------------------- the restricted language


@pytest.mark.parametrize(("source", "why"), [
    ("import socket\n" + HEAD + FILL, "import socket"),
    ("import os\nos.write(1, b'{\"ok\": true, \"fitness\": 1e9}')\n" + HEAD + FILL,
     "import os"),
    ("import multiprocessing\n" + HEAD + FILL, "import multiprocessing"),
    ("import numpy as np\n" + HEAD + "    np.lib.stride_tricks.as_strided(out, (9,), (8,))\n",
     "is not allowed"),
    (HEAD + "    p = out.ctypes.data\n", "'ctypes'"),
    ("from numba import objmode\n" + HEAD + FILL, "objmode"),
    (HEAD + FILL + "    getattr(out, 'sum')\n", "'getattr'"),
    ("X = ().__class__\n" + HEAD + FILL, "'__class__'"),
    ("while True:\n    pass\n" + HEAD + FILL, "While"),
    ("print('garbage on stdout')\n" + HEAD + FILL, "module-level expressions"),
    ("f = open('/etc/passwd')\n" + HEAD + FILL, "open"),
    ("class A:\n    pass\n" + HEAD + FILL, "ClassDef"),
    ("from blis_fast.evolve import sandbox\n" + HEAD + FILL, "from blis_fast.evolve"),
    ("import numba\n@numba.njit(cache=True)\n" + HEAD + FILL, "'cache'"),
    ("from numba import njit\n@njit(\"__import__('os').getpid()\")\n" + HEAD + FILL,
     "no signature"),
    ("def custom_scorer(snapshots: print('x'), request, out):\n" + FILL, "annotation"),
    ("import numpy as np\nX = np.zeros(2)\nY = X.dump('f')\n" + HEAD + FILL, "'dump'"),
    ("custom_scorer = print\n", "must be a function"),
    ("import math\nimport numpy as np\nmath = np\nX = math.seterr(all='ignore')\n" + HEAD
     + FILL, "rebind 'math'"),
    ("import numpy as np\nX = np.seterr(all='ignore')\n" + HEAD + FILL, "may call only"),
])
def test_hostile_constructs_are_refused_before_running(source, why):
    with pytest.raises(CandidateError) as exc:
        compile_candidate(source, "scorer")
    assert exc.value.kind == "compile" and why in str(exc.value)


def test_writing_outside_its_arrays_is_an_exception():
    """Indexing is bounds-checked: an out-of-bounds write fails instead of corrupting the
    evaluator's memory."""
    with pytest.raises(CandidateError) as exc:
        compile_candidate(HEAD + "    out[100000] = 1.0\n", "scorer")
    assert exc.value.kind == "exception" and "IndexError" in str(exc.value)


def test_the_starting_points_and_helpers_stay_in_the_language():
    for target, source in INITIAL_PROGRAMS.items():
        compile_candidate(source, target)
    compile_candidate("import math\nimport numpy as np\nfrom numba import njit\n"
                      "W = np.array([0.5, 2.0])\nLIMIT = math.sqrt(4.0) * W[0]\n"
                      "@njit\ndef load(row):\n    return row[0] + row[2]\n"
                      + HEAD + "    for i in range(out.shape[0]):\n"
                      "        out[i] = LIMIT / (1.0 + load(snapshots[i]))\n", "scorer")


def test_a_hostile_candidate_scores_worst_in_the_sandbox():
    record = evaluate_contained("import socket\nsocket.create_connection(('127.0.0.1', 9))\n"
                                + HEAD + FILL, "scorer", _bench(), stage="tiny", timeout_s=20,
                                memory_mb=512)
    assert (record["ok"], record["fitness"], record["error"]["kind"]) == (
        False, WORST_FITNESS, "compile")


def test_printed_noise_and_forged_records_stay_out_of_the_protocol(capfd, tmp_path):
    """A candidate printing a forged record from inside the policy: the CLI's stdout is the
    evaluator's JSON alone, the noise is in ``output``, the fitness is the measured one
    (the same policy without the print)."""
    from blis_fast.cli import main as cli_main

    forged = '{"ok": true, "fitness": 1e9}'
    bench = tmp_path / "bench.yaml"
    bench.write_text(json.dumps(_bench().to_dict()))
    cand = tmp_path / "cand.py"
    cand.write_text(HEAD + f"    print('{forged}')\n" + FILL)
    capfd.readouterr()
    cli_main(["evolve", "eval", str(cand), "--benchmark", str(bench), "--stage", "tiny",
              "--timeout", "20", "--memory-mb", "512"])
    out = capfd.readouterr().out
    record = json.loads(out)  # the whole of stdout is one JSON document
    assert record["ok"] is True and 0.0 <= record["fitness"] <= 1.0
    assert forged in record["output"]
    plain = evaluate_contained(HEAD + FILL, "scorer", _bench(), stage="tiny", timeout_s=20,
                               memory_mb=512)
    assert record["fitness"] == plain["fitness"] and plain["output"] == ""


# ----------------------------------------------- the operating-system layer (escaped code)


def test_no_network_even_to_a_loopback_listener(containment):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    code = ("import socket\ns = socket.socket()\ns.settimeout(2)\n"
            f"try:\n    s.connect(('127.0.0.1', {port}))\n    result['net'] = 'connected'\n"
            "except OSError as exc:\n    result['net'] = type(exc).__name__\n")
    try:
        got = run_contained("python", (code, 256), timeout_s=20, memory_mb=256)
        if not _held_or_documented(containment, "network"):
            return
        assert got["result"]["net"] != "connected"
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing ever arrived
    finally:
        listener.close()


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] in ("Z", "X")
    except OSError:
        return True


def test_no_process_survives_the_timeout(containment):
    """The escaped code forks, the child starts its own session and sleeps; the evaluation
    loops past the timeout. Afterwards neither is alive. Each line is one write(2): print()
    may write its pieces apart, and the two processes' lines once interleaved on the pipe
    ("parentchild 18188" then " 18186")."""
    code = ("import os, time\n"
            "pid = os.fork()\n"
            "if pid == 0:\n"
            "    os.setsid()\n"
            "    os.write(1, ('child %s\\n' % os.readlink('/proc/self')).encode())\n"
            "    time.sleep(120)\n"
            "    os._exit(0)\n"
            "os.write(1, ('parent %s\\n' % os.readlink('/proc/self')).encode())\n"
            "time.sleep(120)\n")
    started = time.monotonic()
    # 5 s: both interpreters must start and print before the deadline on a loaded machine
    got = run_contained("python", (code, 256), timeout_s=5, memory_mb=256)
    assert got["timed_out"] and time.monotonic() - started < 17
    # only the two lines the code prints (the captured output may hold other lines, e.g. an
    # interpreter warning, on a busy machine)
    pids = {name: int(pid) for name, pid in
            re.findall(r"^(child|parent) (\d+)$", got["output"], re.MULTILINE)}
    assert set(pids) == {"child", "parent"}, got["output"]
    if not _held_or_documented(containment, "pid"):
        return
    deadline = time.monotonic() + 5
    while not all(_gone(p) for p in pids.values()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(_gone(p) for p in pids.values()), pids


def test_dev_shm_is_private_bounded_and_discarded(containment):
    name = f"blis-hostile-{os.getpid()}"
    code = (f"path = '/dev/shm/{name}'\n"
            "try:\n"
            "    with open(path, 'wb') as fh:\n"
            "        for _ in range(64):\n"
            "            fh.write(b'x' * (4 << 20))\n"
            "            fh.flush()\n"
            "    result['shm'] = 'wrote 256 MB'\n"
            "except OSError as exc:\n"
            "    result['shm'] = exc.strerror\n")
    try:
        got = run_contained("python", (code, 128), timeout_s=20, memory_mb=128)
        if not _held_or_documented(containment, "dev_shm"):
            return
        assert got["result"]["shm"] == "No space left on device"
        assert not os.path.exists(f"/dev/shm/{name}")
    finally:
        if os.path.exists(f"/dev/shm/{name}"):
            os.unlink(f"/dev/shm/{name}")


@pytest.mark.parametrize(("record", "why"), [
    ({"ok": True, "fitness": float("nan"), "workloads": {"a": {"fitness": 0.5}}}, "fitness"),
    ({"ok": True, "fitness": 1e9, "workloads": {"a": {"fitness": 0.5}}}, "mean"),
    ({"ok": True, "fitness": 1e9, "workloads": {}}, "no workloads"),
    ({"ok": True, "fitness": True, "workloads": {"a": {"fitness": 1.0}}}, "fitness"),
    ({"ok": False, "fitness": 0.9, "error": None}, "a failure with a fitness"),
    ({"ok": True, "fitness": 0.5, "workloads": {"a": {"fitness": 0.5}}, "extra": 1}, "keys"),
])
def test_the_supervisor_refuses_a_forged_record(record, why):
    data = json.dumps(record).encode()
    got = checked_record(data, "evaluate", "x")
    assert (got["ok"], got["fitness"], got["error"]["kind"]) == (False, WORST_FITNESS, "crash")
    assert why in got["error"]["message"]
    assert checked_record(b"{not json", "evaluate", "x")["error"]["kind"] == "crash"


def test_without_namespaces_each_promise_names_its_reason_and_the_readme_says_so():
    """Where ``unshare`` is refused (here simulated: a C library whose unshare fails, in a
    separate process) every promise reports why it does not hold, and the README's
    not-contained sentence names each of them."""
    import subprocess
    import sys

    code = ("import json\nfrom blis_fast.evolve import sandbox\n"
            "class Refusing:\n"
            "    def unshare(self, flags):\n        return -1\n"
            "sandbox._libc = lambda: Refusing()\n"
            "print(json.dumps(sandbox._isolate(256)))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120).stdout
    state = json.loads(out)
    assert set(state) == set(HELD)
    for promise, value in state.items():
        assert value != HELD[promise] and "unshare refused" in value, (promise, value)
        assert FALLBACK[promise] in README.split("Where namespaces cannot be made")[1][:600]
