"""The column schemas of the Parquet files blis_fast writes, read from ``schemas/*.json``.

Each file in ``schemas/`` (packaged as ``blis_fast/data/schemas``) lists a file's columns (name,
type, nullability, description) and a ``version`` raised whenever they change. Both the writers
(``blis_fast.output.parquet`` and the pool, scaling, sweep and observe tables) and the
provenance stamp (``blis_fast.output.provenance``, which records the version) read them here,
so neither has to import the other for it.
"""

from __future__ import annotations

import json
from functools import cache

import pyarrow as pa

from blis_fast.data import data_path

__all__ = ["ARROW_TYPES", "load_schema", "schema_fields", "schema_version"]

ARROW_TYPES: dict[str, pa.DataType] = {
    "string": pa.string(),
    "int64": pa.int64(),
    "int32": pa.int32(),
    "float64": pa.float64(),
    "bool": pa.bool_(),
    "list<float64>": pa.list_(pa.float64()),
    "list<int64>": pa.list_(pa.int64()),
    "list<string>": pa.list_(pa.string()),
}
"""The Arrow type of each ``type`` a schema file may name."""


@cache
def _schema_doc(name: str) -> dict:
    """The parsed ``schemas/<name>.json``, read once per process."""
    path = data_path("schemas") / f"{name}.json"
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def schema_fields(name: str) -> tuple[dict, ...]:
    """The field entries (name, type, nullable, description) of ``schemas/<name>.json``."""
    return tuple(_schema_doc(name)["fields"])


def schema_version(name: str) -> int:
    """The version of ``schemas/<name>.json`` (raised whenever its columns change), which
    every Parquet file written with it records (``blis_fast.output.provenance``)."""
    return int(_schema_doc(name)["version"])


def load_schema(name: str) -> pa.Schema:
    """Arrow schema of ``schemas/<name>.json`` (``summary``, ``requests``, ``decisions``...)."""
    return pa.schema(
        [
            pa.field(f["name"], ARROW_TYPES[f["type"]], nullable=bool(f.get("nullable", True)))
            for f in schema_fields(name)
        ]
    )
