"""Provenance of every Parquet file blis_fast writes: which version, schema and options made it.

Each file's Arrow schema metadata (``pq.read_schema(path).metadata``, or polars'
``pl.read_parquet_metadata(path)``) holds, as UTF-8 strings:

``blis_fast.version``
    the package version (``blis_fast/version.py``);
``blis_fast.schema``, ``blis_fast.schema_version``
    the ``schemas/<name>.json`` the columns follow and that file's ``version``;
``blis_fast.command``
    ``run``, ``replay``, ``sweep`` or ``observe``: what wrote the file;
``blis_fast.options``
    (files of one simulation) JSON ``{"values": {...}, "explicit": [...]}``: every field of the
    ``RunOptions`` the run was given, defaults filled in, and the fields given explicitly
    (explicitness changes some runs: a workload spec's horizon yields to an explicit
    ``--horizon``). Output destinations (the ``file="output"`` flags) are left out so a file's
    bytes do not depend on where it was written; they are not needed to re-run;
``blis_fast.resolved_options``
    JSON of the options the engine ran with (horizon, KV blocks and max model length
    resolved), for reading only;
``blis_fast.hooks``
    JSON list of the user policies a Python API run was given (``custom_scorer``, ...): code
    that cannot be recorded, so re-running needs them passed again.

:func:`read_provenance` reads it back and :func:`rerun_options` rebuilds the ``RunOptions`` to
re-run the simulation (``blis_fast.api.rerun`` does both and runs it).
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from blis_fast.errors import BlisConfigError, BlisInputError
from blis_fast.options import OPTIONS_BY_FIELD, build_options, coerce
from blis_fast.output.schemas import schema_version
from blis_fast.version import __version__

__all__ = [
    "PREFIX",
    "Provenance",
    "file_provenance",
    "options_record",
    "read_provenance",
    "rerun_options",
    "run_provenance",
    "with_provenance",
]

PREFIX = "blis_fast."
"""Prefix of every provenance key in a Parquet file's schema metadata."""

_HOOK_NAMES = {"scorer": "custom_scorer", "admission": "custom_admission",
               "scheduler_key": "custom_scheduler_key"}
_SECRET_FIELDS = frozenset({"api_key"})
"""Option fields never recorded (``blis observe --api-key``)."""


def file_provenance(schema: str, command: str) -> dict[str, str]:
    """The keys every file carries: package version, schema name and version, command."""
    return {f"{PREFIX}version": __version__, f"{PREFIX}schema": schema,
            f"{PREFIX}schema_version": str(schema_version(schema)),
            f"{PREFIX}command": command}


def _is_recorded(name: str) -> bool:
    spec = OPTIONS_BY_FIELD.get(name)
    return name not in _SECRET_FIELDS and (spec is None or spec.file != "output")


def options_record(opts: Any) -> dict[str, Any]:
    """``{"values": ..., "explicit": [...]}`` of an options dataclass (``RunOptions`` or
    ``ObserveOptions``): every field but the explicit-set itself, output destinations and
    secrets, tuples as lists. Fields are iterated generically so the record follows the
    class's rows."""
    values, explicit = {}, []
    for f in dataclasses.fields(opts):
        value = getattr(opts, f.name)
        if isinstance(value, (set, frozenset)):  # RunOptions.explicit, ObserveOptions.given
            explicit = sorted(v for v in value if _is_recorded(v))
        elif _is_recorded(f.name):
            values[f.name] = list(value) if isinstance(value, tuple) else value
    return {"values": values, "explicit": explicit}


def run_provenance(schema: str, opts: Any, engine: Any = None,
                   command: str = "run") -> dict[str, str]:
    """Provenance of a file of one simulation: :func:`file_provenance` plus the options it
    was given (``opts``, a ``RunOptions``) and, with ``engine`` (its ``EngineConfig``), the
    resolved options and the user hooks it ran with."""
    meta = file_provenance(schema, command)
    meta[f"{PREFIX}options"] = json.dumps(options_record(opts), sort_keys=True)
    if engine is not None:
        meta[f"{PREFIX}resolved_options"] = json.dumps(
            options_record(engine.options)["values"], sort_keys=True)
        hooks = engine.hooks
        used = [] if hooks is None else [
            label for attr, label in _HOOK_NAMES.items() if getattr(hooks, attr) is not None]
        if used:
            meta[f"{PREFIX}hooks"] = json.dumps(used)
    return meta


def with_provenance(table: pa.Table, provenance: dict[str, str]) -> pa.Table:
    """``table`` with ``provenance`` merged into its schema metadata (existing keys kept
    unless provenance names them)."""
    merged = dict(table.schema.metadata or {})
    merged.update({k.encode(): v.encode() for k, v in provenance.items()})
    return table.replace_schema_metadata(merged)


@dataclass(frozen=True)
class Provenance:
    """What a Parquet file's metadata says produced it."""

    version: str
    schema: str
    schema_version: int
    command: str
    options: dict[str, Any] | None  # field -> value; None for files not made by one run
    explicit: tuple[str, ...]
    resolved_options: dict[str, Any] | None
    hooks: tuple[str, ...]


def read_provenance(path: str | os.PathLike) -> Provenance:
    """The provenance recorded in the Parquet file at ``path``; ``BlisInputError`` when the
    file has none (not written by blis_fast, or by a version before provenance)."""
    try:
        raw = pq.read_schema(path).metadata or {}
    except (OSError, pa.ArrowInvalid) as exc:
        raise BlisInputError(f"{path}: cannot read a Parquet schema: {exc}") from None
    meta = {k.decode(): v.decode() for k, v in raw.items() if k.startswith(PREFIX.encode())}
    if f"{PREFIX}version" not in meta:
        raise BlisInputError(f"{path}: no blis_fast provenance in the file's metadata")
    options = json.loads(meta.get(f"{PREFIX}options", "null"))
    resolved = json.loads(meta.get(f"{PREFIX}resolved_options", "null"))
    return Provenance(
        version=meta[f"{PREFIX}version"], schema=meta.get(f"{PREFIX}schema", ""),
        schema_version=int(meta.get(f"{PREFIX}schema_version", "0")),
        command=meta.get(f"{PREFIX}command", ""),
        options=None if options is None else options["values"],
        explicit=() if options is None else tuple(options["explicit"]),
        resolved_options=resolved,
        hooks=tuple(json.loads(meta.get(f"{PREFIX}hooks", "[]"))))


def rerun_options(provenance: Provenance, **overrides: Any) -> Any:
    """The ``RunOptions`` of the recorded run, with ``overrides`` (Python API keywords, e.g.
    ``output_dir=...``) applied and counted as given explicitly.

    Values go through the same parsers as the Python API (``options.coerce``); a recorded
    field the current ``RunOptions`` no longer has is refused, so a re-run never silently
    differs from the recorded one."""
    if provenance.options is None or provenance.command not in ("run", "replay"):
        raise BlisConfigError(f"the file was written by {provenance.command or 'an unknown'} "
                              "command, not by one simulation: it has no run options")
    unknown = sorted(set(provenance.options) - set(OPTIONS_BY_FIELD))
    if unknown:
        raise BlisConfigError(f"the recorded options name fields this blis_fast "
                              f"({__version__}) does not have: {', '.join(unknown)}")
    base = build_options(overrides, keywords=True)
    values = {name: coerce(OPTIONS_BY_FIELD[name], value)
              for name, value in provenance.options.items() if name not in base.explicit}
    return dataclasses.replace(base, **values,
                               explicit=frozenset(provenance.explicit) | base.explicit)
