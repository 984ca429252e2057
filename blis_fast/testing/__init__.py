"""Test helpers that ship with the package: a deterministic recording server, a real vLLM launcher."""
