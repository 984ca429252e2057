"""A sweep's output directory: summary Parquet files, per-configuration requests, the manifest.

Layout under ``--out DIR``::

    manifest.json                                  the spec, versions, runs (start/end, counts)
    summary/part-<first config id>.parquet         one row per configuration of a chunk
    requests/config_id=<id>/requests.parquet       per-request rows (``--requests``)
    pools/config_id=<id>/pools.parquet             a P/D configuration's pools (``--requests``)
    adapters/config_id=<id>/adapters.parquet       a LoRA configuration's per-adapter figures
                                                   (always: a few rows per configuration)

Every summary file has the same Arrow schema (:func:`summary_schema`): ``config_id``, the
configuration's option columns (typed from the options table), the metric columns of
``schemas/summary.json`` (nullable: a failed configuration has null metrics) and ``error``.
Files are written atomically (temporary file + ``os.replace``); a configuration is done when its
row is in a summary file, which is what ``--resume`` reads.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from blis_fast.errors import BlisConfigError, BlisInputError
from blis_fast.files import OutputPlan, read_input_text
from blis_fast.options import OPTIONS_BY_FIELD
from blis_fast.output.parquet import atomic_write_table
from blis_fast.output.provenance import file_provenance, read_provenance, with_provenance
from blis_fast.output.schemas import load_schema, schema_version
from blis_fast.output.summary import atomic_write_text
from blis_fast.sweep.spec import SweepPlan
from blis_fast.sweep.worker import ConfigResult
from blis_fast.version import __version__

__all__ = ["SweepStore", "metric_fields", "option_field", "summary_schema"]

OPTION_ARROW_TYPES: dict[str, pa.DataType] = {
    "int": pa.int64(), "float": pa.float64(), "str": pa.string(), "bool": pa.bool_(),
    "floats": pa.list_(pa.float64()),
}
"""Arrow type of an option column, by the option's kind in ``blis_fast.options``."""


def metric_fields() -> list[pa.Field]:
    """The metric columns of ``schemas/summary.json`` (minus ``instance_id``), nullable."""
    return [f.with_nullable(True) for f in load_schema("summary") if f.name != "instance_id"]


_VALUE_KINDS = {bool: "bool", int: "int", float: "float", str: "str"}


def option_field(name: str, plan: SweepPlan | None = None) -> pa.Field:
    """The column of one ``blis run`` option (non-null: every configuration has a value); a
    ``kv_offload.*`` column is typed by its values (each key's values share one type: the
    spec coerced them alike; a whole tier list is its JSON text)."""
    spec = OPTIONS_BY_FIELD.get(name)
    if spec is None and plan is not None and plan.configs:
        kind = _VALUE_KINDS[type(plan.configs[0].values[name])]
    else:
        kind = spec.kind
    return pa.field(name, OPTION_ARROW_TYPES[kind], nullable=False)


def summary_schema(plan: SweepPlan) -> pa.Schema:
    """Schema of every summary file of the sweep ``plan``."""
    return pa.schema([pa.field("config_id", pa.string(), nullable=False),
                      *(option_field(c, plan) for c in plan.columns), *metric_fields(),
                      pa.field("error", pa.string())])


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


class SweepStore:
    """Reads and writes one sweep's output directory."""

    def __init__(self, out_dir: str | Path, plan: SweepPlan) -> None:
        self.root = Path(out_dir)
        self.plan = plan
        self.schema = summary_schema(plan)
        self.summary_dir = self.root / "summary"
        self.requests_dir = self.root / "requests"
        self.pools_dir = self.root / "pools"
        self.adapters_dir = self.root / "adapters"
        self.manifest_path = self.root / "manifest.json"
        self._values = {c.config_id: c.values for c in plan.configs}
        self._manifest: dict[str, Any] = {}

    def done_ids(self, resume: bool) -> set[str]:
        """Configurations already written; refuses a non-empty directory unless resuming.

        Reads only: nothing is created here, so a refused sweep leaves no trace.
        """
        if self.root.exists() and not self.root.is_dir():
            raise BlisConfigError(f"--out {self.root}: not a directory")
        plan = OutputPlan()
        plan.add_inputs([("the sweep spec", str(self.plan.path))])
        plan.check_dir(self.root, "--out")  # the folder can be made or written, before any run
        if not self.root.exists():
            return set()
        if not resume:
            if any(self.root.iterdir()):
                raise BlisConfigError(f"--out {self.root}: directory is not empty; pass --resume "
                                      "to continue the sweep there, or choose another directory")
            return set()
        done: set[str] = set()
        for path in sorted(self.summary_dir.glob("*.parquet")):
            try:
                ids = pq.read_table(path, columns=["config_id"]).column(0).to_pylist()
            except (OSError, pa.ArrowException, KeyError) as exc:
                raise BlisInputError(f"--resume: cannot read {path}: {exc}") from None
            done.update(ids)
        self._check_schemas()
        if self.manifest_path.exists() or self.manifest_path.is_symlink():
            self._manifest = self._read_manifest()
        foreign = sorted(done - self._values.keys())
        if foreign:
            raise BlisConfigError(
                f"--resume: {self.root} holds {len(foreign)} configuration(s) that {self.plan.path}"
                f" does not define (e.g. {foreign[0]}); it is another sweep's directory")
        return done

    def _check_schemas(self) -> None:
        """Refuse to resume into files of another schema version: a sweep resumed by a
        blis_fast whose summary or requests columns differ would leave a directory that
        polars cannot read as one table. One file of each kind is enough: a sweep writes
        them all with one version."""
        for folder, kind in ((self.summary_dir, "summary"), (self.requests_dir, "requests"),
                             (self.pools_dir, "pools"), (self.adapters_dir, "adapters")):
            path = min(folder.rglob("*.parquet"), default=None) if folder.is_dir() else None
            if path is None:
                continue
            try:
                found = read_provenance(path).schema_version
            except BlisInputError:
                found = 0  # written before files carried their provenance
            if found != schema_version(kind):
                raise BlisConfigError(
                    f"--resume: {path} has {kind} schema version {found}, this blis_fast "
                    f"{__version__} writes version {schema_version(kind)}; finish the sweep with "
                    "the blis_fast that started it (manifest.json names it) or sweep into a new "
                    "--out")

    def begin(self, backend: str, workers: int, pending: int) -> None:
        """Create the directories, drop temporary files of a killed run, record this run."""
        self.summary_dir.mkdir(parents=True, exist_ok=True)
        for stale in self.summary_dir.glob(".*.tmp"):
            stale.unlink()
        if self._manifest:
            pass  # read (and checked) by done_ids when resuming
        elif self.manifest_path.exists():
            self._manifest = self._read_manifest()
        else:
            self._manifest = {"spec_path": str(self.plan.path), "spec": self.plan.text,
                              "blis_fast_version": __version__,
                              "num_configs": len(self.plan.configs),
                              "columns": list(self.schema.names), "runs": []}
        self._manifest["runs"].append({"started_at": _now(), "finished_at": None,
                                       "backend": backend, "workers": workers,
                                       "configs_to_run": pending})
        self._write_manifest()

    def _read_manifest(self) -> dict[str, Any]:
        """The manifest of a previous run; unreadable or malformed is an error naming it."""
        try:
            doc = json.loads(read_input_text(self.manifest_path))
        except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise BlisInputError(f"--resume: {self.manifest_path} is not a sweep manifest: "
                                 f"{exc}") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("runs"), list):
            raise BlisInputError(f"--resume: {self.manifest_path} is not a sweep manifest: "
                                 "expected an object with a \"runs\" list")
        return doc

    def finish(self, written: int, errors: int, interrupted: bool) -> None:
        """Close this run's manifest entry."""
        run = self._manifest["runs"][-1]
        run.update(finished_at=_now(), configs_written=written, errors=errors,
                   interrupted=interrupted)
        self._write_manifest()

    def _write_manifest(self) -> None:
        atomic_write_text(self.manifest_path, json.dumps(self._manifest, indent=2) + "\n",
                          flag="--out")

    def write(self, results: list[ConfigResult]) -> None:
        """Write a chunk's requests (P/D pools, LoRA adapters) files, then its summary rows
        (which mark it done; a rerun after a crash overwrites the per-configuration files)."""
        for res in results:
            for folder, name, table in ((self.requests_dir, "requests.parquet", res.requests),
                                        (self.pools_dir, "pools.parquet", res.pools),
                                        (self.adapters_dir, "adapters.parquet", res.adapters)):
                if table is not None:
                    part = folder / f"config_id={res.config_id}"
                    part.mkdir(parents=True, exist_ok=True)
                    atomic_write_table(part / name, table, flag="--out")
        ordered = sorted(results, key=lambda r: r.config_id)
        table = with_provenance(self.rows_table(ordered), file_provenance("summary", "sweep"))
        atomic_write_table(self.summary_dir / f"part-{ordered[0].config_id}.parquet", table,
                           flag="--out")

    def rows_table(self, results: list[ConfigResult]) -> pa.Table:
        """The summary rows of ``results`` with the sweep's schema."""
        columns: dict[str, list[Any]] = {name: [] for name in self.schema.names}
        metric_names = [f.name for f in metric_fields()]
        for res in results:
            columns["config_id"].append(res.config_id)
            for name, value in self._values[res.config_id].items():
                columns[name].append(value)
            for name in metric_names:
                columns[name].append(None if res.metrics is None else res.metrics[name])
            columns["error"].append(res.error)
        return pa.Table.from_pydict(columns, schema=self.schema)
