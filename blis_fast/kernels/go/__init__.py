"""Ports of Go's standard library the reference's numbers depend on: ``math/rand`` v1 (``gorand``), ``math`` (``gomath``) and ``sort.Slice`` (``gosort``)."""
