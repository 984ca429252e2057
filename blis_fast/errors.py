"""Typed errors raised by the library; only the CLI turns them into stderr lines and exit codes."""

from __future__ import annotations


class BlisError(Exception):
    """Base class of every error the library raises on purpose."""


class BlisConfigError(BlisError):
    """A flag, option or configuration value is invalid (names the flag or key)."""


class BlisInputError(BlisError):
    """An input file (defaults, model config, workload spec, trace) is missing or malformed."""


class BlisOutputError(BlisError):
    """An output path is unusable (missing folder, a directory, read-only, full, an input)."""


class BlisRuntimeError(BlisError):
    """The simulation kernel reported an internal failure status."""
