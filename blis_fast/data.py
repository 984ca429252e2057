"""Locate the bundled data files (defaults.yaml, hardware_config.json, model_configs/, schemas/).

An installed wheel carries them under ``blis_fast/data``; a source checkout keeps them at the
repository root. Both layouts are looked up so ``blis`` works from any directory, offline.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent


def data_dir() -> Path:
    """Return the directory that holds defaults.yaml and its siblings."""
    packaged = _PACKAGE_DIR / "data"
    if (packaged / "defaults.yaml").is_file():
        return packaged
    return _PACKAGE_DIR.parent


def data_path(name: str) -> Path:
    """Return the path of one bundled data file or folder (e.g. ``"defaults.yaml"``)."""
    return data_dir() / name
