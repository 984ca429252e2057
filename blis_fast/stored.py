"""Results derived from the package's own files, kept between runs beside the bytecode.

Some start-up work gives the same result every run: the strict parse of the bundled
``defaults.yaml`` (70 ms) and Go's seeding table, recomputed from its definition (50 ms).
:func:`kept_beside` does such work once and keeps the result in the ``__pycache__`` folder of
the module that needs it, as Python keeps bytecode: the file is named by the SHA-256 of the
inputs and of the source of the code that computes the result, so a changed input or changed
code never reads an old result back. A missing, unreadable or foreign file means computing
again; a folder that is not writable means computing every run.
"""

from __future__ import annotations

import hashlib
import os
import pickle
from collections.abc import Callable, Iterable
from typing import TypeVar

T = TypeVar("T")


def kept_beside(module_file: str, tag: str, inputs: bytes, compute: Callable[[], T],
                kind: type, sources: Iterable[str] = ()) -> T:
    """``compute()``, or its result kept by an earlier run for the same ``inputs`` and code.

    ``module_file`` is the ``__file__`` of the module that asks; ``sources`` are further
    files (relative to its folder) whose code decides the result; ``kind`` is the result's
    type (anything else read back is ignored). An exception from ``compute`` is raised and
    nothing is kept.
    """
    here = os.path.dirname(os.path.abspath(module_file))
    path = _stored_path(here, tag, inputs, (os.path.basename(module_file), *sources))
    if path is not None:
        try:
            with open(path, "rb") as fh:
                value = pickle.load(fh)
            if isinstance(value, kind):
                return value
        except Exception:  # noqa: BLE001 - missing, truncated or foreign: compute instead
            pass
    value = compute()
    if path is not None:
        _store(path, value)
    return value


def _stored_path(here: str, tag: str, inputs: bytes, sources: tuple[str, ...]) -> str | None:
    """Where the result for these inputs and this code is kept (None: a source unreadable)."""
    digest = hashlib.sha256(inputs)
    try:
        for name in sources:
            with open(os.path.join(here, name), "rb") as fh:
                digest.update(fh.read())
    except OSError:
        return None
    return os.path.join(here, "__pycache__", f"{tag}-{digest.hexdigest()}.pickle")


def _store(path: str, value: object) -> None:
    """Write ``value`` whole and rename it into place; nothing when the folder is not writable."""
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(tmp, "wb") as fh:
            pickle.dump(value, fh, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, path)
    except OSError:
        try:
            os.remove(tmp)
        except OSError:
            pass
