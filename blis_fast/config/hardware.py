"""GPU hardware table (``hardware_config.json``; spec ENG-6.9, DELTA-19).

The file maps a GPU name to its calibration: ``TFlopsPeak`` (dense BF16 TFLOP/s),
``TFlopsFP8`` (0 = no native FP8), ``BwPeakTBs`` (TB/s), ``mfuPrefill``, ``mfuDecode`` and
``MemoryGiB``. As in the reference's JSON decoding, field names match case-insensitively
(an exact match first), other keys such as ``_comment`` are ignored, ``null`` leaves a field at 0,
and a value of the wrong type makes the whole file invalid.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace

from blis_fast.errors import BlisConfigError, BlisInputError
from blis_fast.files import read_input_text

__all__ = ["HardwareCalib", "get_hw_config", "load_hardware_table"]


@dataclass(frozen=True)
class HardwareCalib:
    """Calibration of one GPU type."""

    tflops_peak: float = 0.0
    tflops_fp8: float = 0.0
    bw_peak_tbs: float = 0.0
    mfu_prefill: float = 0.0
    mfu_decode: float = 0.0
    memory_gib: float = 0.0
    gpu: str = ""  # the table's name of this GPU (the profiled backend finds its GPU profile by it)
    profile_path: str = ""  # --gpu-profile, for the profiled backend ("" = the bundled profile)


_JSON_FIELDS = {
    "TFlopsPeak": "tflops_peak",
    "TFlopsFP8": "tflops_fp8",
    "BwPeakTBs": "bw_peak_tbs",
    "mfuPrefill": "mfu_prefill",
    "mfuDecode": "mfu_decode",
    "MemoryGiB": "memory_gib",
}
_LOWER = {k.lower(): v for k, v in _JSON_FIELDS.items()}


def _reject_constant(name: str) -> float:
    raise ValueError(f"invalid JSON number {name}")


def _decode_entry(gpu: str, raw: object, path: str) -> HardwareCalib:
    if raw is None:
        return HardwareCalib()
    if not isinstance(raw, dict):
        raise BlisInputError(f"hardware config {path}: entry {gpu!r} is not a JSON object")
    values: dict[str, float] = {}
    exact_seen: set[str] = set()
    for key, val in raw.items():
        attr = _JSON_FIELDS.get(key)
        exact = attr is not None
        if attr is None:
            attr = _LOWER.get(key.lower())
        if attr is None:
            continue
        if not exact and attr in exact_seen:
            continue
        if val is None:
            continue
        if isinstance(val, bool) or not isinstance(val, (int, float)):
            raise BlisInputError(
                f"hardware config {path}: {gpu}.{key} must be a number, got {val!r}"
            )
        values[attr] = float(val)
        if exact:
            exact_seen.add(attr)
    return HardwareCalib(**values)


def load_hardware_table(path: str | os.PathLike[str]) -> dict[str, HardwareCalib]:
    """Read a hardware config file into ``{gpu name: HardwareCalib}``."""
    p = os.fspath(path)
    try:
        text = read_input_text(p)
    except (OSError, UnicodeDecodeError) as exc:
        raise BlisInputError(f"cannot read hardware config {p}: {exc}") from exc
    try:
        data = json.loads(text, parse_constant=_reject_constant)
    except ValueError as exc:
        raise BlisInputError(f"cannot parse hardware config {p}: {exc}") from exc
    if not isinstance(data, dict):
        raise BlisInputError(
            f"cannot parse hardware config {p}: the top level must be a JSON object"
        )
    return {gpu: _decode_entry(gpu, raw, p) for gpu, raw in data.items()}


def get_hw_config(path: str | os.PathLike[str], gpu: str) -> HardwareCalib:
    """GetHWConfig: the calibration of ``gpu``; an unknown name lists the available ones."""
    table = load_hardware_table(path)
    if gpu not in table:
        raise BlisConfigError(
            f"--hardware: GPU {gpu!r} is not in hardware config {os.fspath(path)} (available: {', '.join(sorted(table))})"
        )
    return replace(table[gpu], gpu=gpu)
