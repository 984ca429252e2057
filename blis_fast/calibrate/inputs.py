"""Reading calibrate's inputs: the observed trace, the SimResult list and the ITL file (CAL-2).

The SimResult JSON is decoded the way Go's ``encoding/json`` fills ``[]SimResult``: keys match
field names case-insensitively, unknown keys are ignored, ``null`` leaves a field at zero, an
integer field takes only an integer literal, and NaN/Infinity literals or out-of-range numbers
are errors. The ITL CSV follows ``LoadITL``: a header row, then rows of the header's width with
non-negative integer ``request_id``, ``chunk_index`` and ``timestamp_us``.

Every file is read through :mod:`blis_fast.files` (regular files only, a size cap, UTF-8), so a
FIFO, ``/dev/zero`` or a binary file is one error line, not a hang or a traceback. Beyond the
reference, figures that would make the comparison nonsense are refused (exit 2, naming the file
and key or row): an ITL header whose first three columns are not ``request_id,chunk_index,
timestamp_us`` in that order (the reference skips its first row unread, so swapped columns were
silently read as each other), a trace row whose last chunk comes before its first (E2E shorter
than TTFT), a header RTT that is negative, not finite or over an hour, and a SimResult latency
outside [0, 2^63] µs or a negative token count.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass

import numpy as np

from blis_fast.errors import BlisInputError
from blis_fast.files import MAX_TRACE_BYTES, read_input_text
from blis_fast.gonum import atoi, or_none
from blis_fast.workload.replay import TraceRecords, load_trace_header, load_trace_records

__all__ = ["ITL_COLUMNS", "MAX_RTT_MS", "ITLData", "ObservedTrace", "SimResult", "load_itl",
           "load_observed_trace", "load_sim_results"]

ITL_COLUMNS = ("request_id", "chunk_index", "timestamp_us")
"""The ITL file's header row (``blis observe --record-itl``); checked, not only skipped."""
MAX_RTT_MS = 3_600_000.0
"""Largest ``network.measured_rtt_ms`` accepted (an hour): a round trip longer than any request
timeout is a corrupt header, and its µs must stay an exact integer."""


@dataclass(frozen=True)
class SimResult:
    """One simulated request (``blis replay --results-path``): server-side µs and token counts."""

    request_id: int
    ttft_us: float
    e2e_us: float
    input_tokens: int
    output_tokens: int


@dataclass
class ObservedTrace:
    """An observed trace: the parsed header (a dict) and the data columns."""

    header: dict
    records: TraceRecords

    @property
    def warm_up_requests(self) -> int:
        """The header's ``warm_up_requests`` (0 when absent)."""
        return int(self.header.get("warm_up_requests", 0))

    @property
    def measured_rtt_ms(self) -> float:
        """The header's ``network.measured_rtt_ms`` (0 when absent)."""
        return float((self.header.get("network") or {}).get("measured_rtt_ms", 0.0))


@dataclass
class ITLData:
    """The rows of an ITL file, in file order."""

    request_id: np.ndarray
    chunk_index: np.ndarray
    timestamp_us: np.ndarray


def load_observed_trace(header_path: str, data_path: str) -> ObservedTrace:
    """Load a trace v2 header and data file (the loader ``blis replay`` uses), then refuse the
    figures calibrate and fit cannot compare (module docstring)."""
    header = load_trace_header(header_path)
    rtt = (header.get("network") or {}).get("measured_rtt_ms", 0.0)
    if not (math.isfinite(rtt) and 0.0 <= rtt <= MAX_RTT_MS):
        raise BlisInputError(f"--trace-header {header_path}: network.measured_rtt_ms must be a "
                             f"number of ms in [0, {MAX_RTT_MS:g}], got {rtt!r}")
    records = load_trace_records(data_path)
    first, last = records.first_chunk_us, records.last_chunk_us
    backwards = np.flatnonzero(last < first)
    if backwards.size:
        k = int(backwards[0])
        raise BlisInputError(f"--trace-data {data_path}: row {k + 2} (request_id "
                             f"{int(records.request_id[k])}): last_chunk_time_us {int(last[k])} "
                             f"is before first_chunk_time_us {int(first[k])} (E2E shorter than "
                             f"TTFT); {backwards.size} such row(s)")
    return ObservedTrace(header, records)


class _Number(str):
    """A JSON number literal kept as text, so integer and float fields can be told apart."""


def _reject_constant(name: str) -> None:
    raise ValueError(f"invalid JSON literal {name}")


MAX_SIM_US = float(2 ** 63)
"""Largest SimResult latency accepted: the simulator's clock is an int64 of µs, and sums of
such figures stay finite."""
_INT_FIELDS = ("request_id", "input_tokens", "output_tokens")
_FLOAT_FIELDS = ("ttft_us", "e2e_us")


def _decode_entry(obj: object, index: int, where: str) -> SimResult:
    values: dict[str, int | float] = {"request_id": 0, "ttft_us": 0.0, "e2e_us": 0.0,
                                      "input_tokens": 0, "output_tokens": 0}
    if obj is None:
        return SimResult(**values)  # type: ignore[arg-type]
    if not isinstance(obj, dict):
        raise BlisInputError(f"{where}: entry {index} is not a JSON object")
    fields = {name.lower(): name for name in values}
    for key, raw in obj.items():
        name = fields.get(key.lower())
        if name is None or raw is None:
            continue
        if not isinstance(raw, _Number):
            raise BlisInputError(f"{where}: entry {index}: {name} must be a number, got "
                                 f"{json.dumps(raw)[:40]}")
        if name in _INT_FIELDS:
            value = or_none(atoi, raw)
            if value is None:
                raise BlisInputError(f"{where}: entry {index}: {name} must be an integer, "
                                     f"got {raw}")
            if name != "request_id" and value < 0:
                raise BlisInputError(f"{where}: entry {index}: {name} must be >= 0, got {raw}")
            values[name] = value
        else:
            x = float(raw)
            if not (math.isfinite(x) and 0.0 <= x <= MAX_SIM_US):
                raise BlisInputError(f"{where}: entry {index}: {name} {raw} is out of range "
                                     f"[0, {MAX_SIM_US:.4g}] µs")
            values[name] = x
    return SimResult(**values)  # type: ignore[arg-type]


def load_sim_results(path: str) -> list[SimResult]:
    """The SimResult list of ``path``, in file order (duplicates kept; the caller decides)."""
    where = f"--sim-results {path}"
    try:
        text = read_input_text(path, MAX_TRACE_BYTES, universal_newlines=False)
    except OSError as exc:
        raise BlisInputError(f"{where}: cannot read the sim results: "
                             f"{exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise BlisInputError(f"{where}: not UTF-8 text (byte {exc.start})") from None
    try:
        data = json.loads(text, parse_int=_Number, parse_float=_Number,
                          parse_constant=_reject_constant)
    except ValueError as exc:
        raise BlisInputError(f"{where}: invalid JSON: {exc}") from None
    if data is None:
        return []
    if not isinstance(data, list):
        raise BlisInputError(f"{where}: expected a JSON array of SimResult objects")
    return [_decode_entry(obj, i, where) for i, obj in enumerate(data)]


def load_itl(path: str) -> ITLData:
    """The chunk timestamps of an ITL file (``request_id,chunk_index,timestamp_us``)."""
    where = f"--itl-data {path}"
    try:
        text = read_input_text(path, MAX_TRACE_BYTES, universal_newlines=False)
        rows = [row for row in csv.reader(io.StringIO(text, newline=""), strict=True) if row]
    except OSError as exc:
        raise BlisInputError(f"{where}: cannot read the ITL file: "
                             f"{exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise BlisInputError(f"{where}: not UTF-8 text (byte {exc.start})") from None
    except csv.Error as exc:
        raise BlisInputError(f"{where}: cannot read the ITL file: {exc}") from None
    expected = ",".join(ITL_COLUMNS)
    if not rows:
        raise BlisInputError(f"{where}: empty file (expected the header {expected})")
    head = [name.strip().lstrip("\ufeff") for name in rows[0][:3]]
    if head != list(ITL_COLUMNS):
        raise BlisInputError(f"{where}: row 1: expected the header {expected}, got "
                             f"{','.join(rows[0])[:60]!r}")
    width = len(rows[0])
    cols: list[list[int]] = [[], [], []]
    names = ("request_id", "chunk_index", "timestamp_us")
    for row_no, row in enumerate(rows[1:], start=2):
        if len(row) != width:
            raise BlisInputError(f"{where}: row {row_no} has {len(row)} fields, the header "
                                 f"has {width}")
        if width < 3:
            raise BlisInputError(f"{where}: row {row_no} has {width} columns, expected 3")
        for k, name in enumerate(names):
            value = or_none(atoi, row[k])
            if value is None:
                raise BlisInputError(f"{where}: row {row_no}: invalid {name} {row[k]!r}")
            if value < 0:
                raise BlisInputError(f"{where}: row {row_no}: {name} must be >= 0, got {value}")
            cols[k].append(value)
    return ITLData(*(np.array(c, dtype=np.int64) for c in cols))
