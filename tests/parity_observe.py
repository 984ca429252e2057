"""Parity support for cases that talk to a server or write wall-clock CSVs (``blis observe``).

Implements the README's rules for the case fields ``server`` (run the project's recording
server, substitute ``{server_url}``, compare the received requests as a multiset),
``compare_columns`` (CSV outputs reduced to listed columns, compared as a multiset); the
``outputs``/``ignore_keys`` files are compared by ``parity.compare_outputs`` as for every case.
Kept apart from ``parity.py`` so ``check_case`` only has to hand such cases over.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

REQUEST_ID_MARK = "<x-request-id>"
REL_TOL = 1e-9


def handles(case: dict) -> bool:
    """Whether a case needs this module (it names a server or column-compared outputs)."""
    return "server" in case or "compare_columns" in case


def expected_only_files(case: dict) -> set[str]:
    """Files of the case folder that are expected outputs, not inputs of the command."""
    names = set(case.get("outputs", [])) | set(case.get("compare_columns", {}))
    if "server" in case:
        names.add(case["server"]["record"])
    return names


def _number(text: str):
    try:
        return int(text)
    except ValueError:
        pass
    try:
        v = float(text)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def _column_key(fields: dict[str, str], columns: list[str]) -> tuple:
    key = []
    for col in columns:
        name, _, mode = col.partition(":")
        value = fields.get(name, "")
        if mode == "prefix":
            value = value.split(": ", 1)[0]
        num = _number(value)
        key.append(("n", float(num)) if num is not None and value != "" else ("s", value))
    return tuple(key)


def compare_csv_columns(actual: str, expected: str, columns: list[str], name: str) -> list[str]:
    """Equal header rows; data rows reduced to ``columns`` equal as a multiset."""
    import csv
    import io

    a_rows = list(csv.reader(io.StringIO(actual)))
    e_rows = list(csv.reader(io.StringIO(expected)))
    if not a_rows or not e_rows:
        return [f"{name}: empty file"] if a_rows != e_rows else []
    if a_rows[0] != e_rows[0]:
        return [f"{name}: header {a_rows[0]} != {e_rows[0]}"]
    head = a_rows[0]

    def bag(rows: list[list[str]]) -> Counter:
        return Counter(_column_key(dict(zip(head, r, strict=False)), columns) for r in rows[1:])

    a_bag, e_bag = bag(a_rows), bag(e_rows)
    if a_bag == e_bag:
        return []
    missing = list((e_bag - a_bag).elements())[:3]
    extra = list((a_bag - e_bag).elements())[:3]
    return [f"{name}: rows differ ({len(a_rows) - 1} vs {len(e_rows) - 1}); "
            f"missing {missing}; unexpected {extra}"]


def normalise_request(entry: dict) -> str:
    """One received request as sorted-key JSON with any x-request-id value masked."""
    entry = json.loads(json.dumps(entry))
    headers = entry.get("headers") or {}
    if "x-request-id" in headers:
        headers["x-request-id"] = REQUEST_ID_MARK
    return json.dumps(entry, sort_keys=True)


def compare_requests(actual_path: Path, expected_path: Path) -> list[str]:
    """The server's received requests against the case's, as multisets."""

    def load(p: Path) -> Counter:
        if not p.is_file():
            return Counter()
        return Counter(normalise_request(json.loads(line))
                       for line in p.read_text().splitlines() if line.strip())

    a, e = load(actual_path), load(expected_path)
    if a == e:
        return []
    missing = list((e - a).elements())
    extra = list((a - e).elements())
    return [f"received requests differ: {sum(a.values())} vs {sum(e.values())} expected; "
            f"missing {len(missing)}, unexpected {len(extra)}; first missing "
            f"{missing[:1]}; first unexpected {extra[:1]}"]


def check_observe_case(case_id: str, workdir: Path) -> list[str]:
    """Run one server/column case and return every difference from the reference's outputs."""
    from parity import CASES_DIR, UNKNOWN_INTERFACE, compare_outputs, load_case, run_case

    from blis_fast.testing.record_server import running_record_server

    case = load_case(case_id)
    src = CASES_DIR / case_id
    exclude = expected_only_files(case)
    log_path = workdir.parent / f"{workdir.name}-received.jsonl"
    errors: list[str] = []
    if "server" in case:
        log_path.write_text("")
        with running_record_server(log_path) as url:
            args = [a.replace("{server_url}", url) for a in case["args"]]
            run = run_case(case_id, workdir, args=args, exclude=exclude)
        errors += compare_requests(log_path, src / case["server"]["record"])
    else:
        run = run_case(case_id, workdir, exclude=exclude)
    errors += compare_outputs(case, src, workdir)
    if case["exit_code"] != 0:
        if run.exit_code == 0:
            errors.append("expected a non-zero exit code, got 0")
        errors += [f"output file {n} written by a failing run"
                   for n in sorted(case.get("compare_columns", {})) if (workdir / n).exists()]
        if run.stderr.count("\n") != 1:
            errors.append(f"stderr should be one line, got: {run.stderr!r}")
        if UNKNOWN_INTERFACE.search(run.stderr):
            errors.append(f"refused for a missing command or flag: {run.stderr.strip()!r}")
        return errors
    if run.exit_code != 0:
        return errors + [f"exit code {run.exit_code}: {run.stderr.strip()[-500:]}"]
    for name, columns in case.get("compare_columns", {}).items():
        if not (workdir / name).is_file():
            errors.append(f"{name} was not written")
            continue
        errors += compare_csv_columns((workdir / name).read_text(), (src / name).read_text(),
                                      columns, name)
    return errors
