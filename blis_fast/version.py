"""The package version, stated once: ``blis_fast.__version__``, the wheel's metadata
(``pyproject.toml`` reads it from here) and the provenance every output file records."""

__version__ = "0.1.0"
