"""A persistent blis_fast process for ``run_differential.py``: runs ``blis run`` configurations
one after another, each in its own folder, so the runner's memory and time limits apply to
blis_fast as they do to the reference without paying the import and JIT-cache load per run.

Protocol (one JSON object per line): the worker writes ``{"ready": true}`` once its imports and
a tiny warm-up run are done (``{"ready": false, ...}`` if they failed), then for each request ``{"args": [...], "cwd": "..."}`` read from stdin it answers
``{"exit_code", "stdout", "stderr", "seconds"}`` on its original stdout (file descriptor 1 is
pointed at stderr so that stray writes cannot corrupt the protocol). An exception other than a
clean exit is answered with ``"exit_code": null`` and the exception; one caused by the memory
limit (:func:`out_of_memory`) also sets ``"oom": true`` and ends the worker (its state is then
unreliable), and the runner starts another.
Not collected by pytest (no ``test_`` prefix).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _vm_peak_kb() -> int:
    """This process's peak address-space size (KiB; 0 where /proc is missing)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmPeak:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` came from the address-space limit: a MemoryError (also as the cause or
    context of another error), or any failure once the peak address space came within 15 % of
    the limit (native libraries report a refused allocation as OSError, SystemError, ...)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, MemoryError) or "Cannot allocate memory" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    import resource

    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    return limit != resource.RLIM_INFINITY and _vm_peak_kb() * 1024 >= 0.85 * limit


WARM_UP_ARGS = ["run", "--model", "meta-llama/llama-3.1-8b-instruct", "--num-requests", "2"]


def warm_up(main: object) -> None:
    """One tiny run before "ready", so that imports and the JIT cache load are not counted in
    the first configuration's time (and a memory limit too small for them shows at start)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="blis-worker-") as folder:
        os.chdir(folder)
        try:
            with contextlib.redirect_stdout(io.StringIO()), \
                    contextlib.redirect_stderr(io.StringIO()):
                main(WARM_UP_ARGS)  # type: ignore[operator]
        except SystemExit as exc:
            if exc.code not in (0, None):
                raise RuntimeError(f"warm-up run exited with {exc.code}") from None
        finally:
            os.chdir(REPO)


def serve() -> None:
    """Answer requests from stdin until it closes."""
    protocol = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.__stdout__ = os.fdopen(1, "w", encoding="utf-8", closefd=False)
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    try:
        from blis_fast.cli import main

        warm_up(main)
    except Exception as exc:
        protocol.write(json.dumps({"ready": False, "oom": out_of_memory(exc),
                                   "stderr": f"{type(exc).__name__}: {exc}"}) + "\n")
        protocol.flush()
        raise

    def answer(obj: dict[str, object]) -> None:
        protocol.write(json.dumps(obj) + "\n")
        protocol.flush()

    answer({"ready": True, "pid": os.getpid()})
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        out, err = io.StringIO(), io.StringIO()
        code: int | None = 0
        failure = None
        oom = False
        start = time.perf_counter()
        os.chdir(request["cwd"])
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    main(["run", *request["args"]])
                except SystemExit as exc:
                    code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None
                                                                       else 1)
        except Exception as exc:  # a crash is a finding, not a refusal (unless out of memory)
            code, failure, oom = None, f"{type(exc).__name__}: {exc}", out_of_memory(exc)
        finally:
            os.chdir(REPO)
        record = {"exit_code": code, "stdout": out.getvalue() if failure is None else "",
                  "stderr": failure or err.getvalue(),
                  "seconds": time.perf_counter() - start}
        if oom:
            record["oom"] = True
        try:
            answer(record)
        except MemoryError:
            answer({"exit_code": None, "stdout": "", "stderr": "MemoryError", "oom": True,
                    "seconds": time.perf_counter() - start})
        if oom:
            os._exit(3)


if __name__ == "__main__":
    serve()
