"""RequestTable: the generated workload as a structure of arrays (docs/architecture.md).

One row per request in injection order (row ``i`` is ``request_<i>``). The engine reads it and
never mutates it; token ids are never stored, only the content digests of each request's
full ``block_size``-token chunks of *input ++ output* (aligned at token 0), in CSR form.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

CLIENT_KEYS = ("id", "tenant_id", "slo_class", "model", "prefix_group", "streaming")
"""Keys of each per-client metadata dict in :attr:`RequestTable.clients`."""

_INT64_COLUMNS = (
    "arrival_us",
    "input_len",
    "output_len",
    "max_output_len",
    "deadline_us",
    "prefix_length",
)


@dataclass(frozen=True, eq=False)
class RequestTable:
    """Immutable per-request arrays of one generated workload, sorted by arrival (stable)."""

    arrival_us: np.ndarray  # int64, arrival tick (µs)
    input_len: np.ndarray  # int64, len(InputTokens), group prefix included
    output_len: np.ndarray  # int64, len(OutputTokens) (the oracle output length)
    max_output_len: np.ndarray  # int64, MaxOutputLen (= output_len for generated requests)
    deadline_us: np.ndarray  # int64, absolute deadline tick; 0 = none
    prefix_length: np.ndarray  # int64, PrefixLength (group prefix tokens at the start)
    client_idx: np.ndarray  # int32, index into ``clients``
    chunk_offsets: np.ndarray  # int64, n + 1 CSR offsets into chunk_digests
    chunk_digests: np.ndarray  # uint64, content digests of full blocks of input ++ output
    clients: list[dict[str, Any]] = field(default_factory=list)
    block_size: int = 16
    seed: int = 0  # workload seed used for generation (trace header ``workload_seed``)

    def __post_init__(self) -> None:
        """Check dtypes and lengths once, so kernels can trust the arrays."""
        n = self.arrival_us.shape[0]
        for name in _INT64_COLUMNS:
            arr = getattr(self, name)
            if arr.dtype != np.int64 or arr.shape != (n,):
                raise ValueError(f"RequestTable.{name} must be int64[{n}]")
        if self.client_idx.dtype != np.int32 or self.client_idx.shape != (n,):
            raise ValueError(f"RequestTable.client_idx must be int32[{n}]")
        if self.chunk_offsets.dtype != np.int64 or self.chunk_offsets.shape != (n + 1,):
            raise ValueError(f"RequestTable.chunk_offsets must be int64[{n + 1}]")
        if self.chunk_digests.dtype != np.uint64 or self.chunk_digests.ndim != 1:
            raise ValueError("RequestTable.chunk_digests must be a 1-D uint64 array")
        if self.chunk_offsets[0] != 0 or self.chunk_offsets[-1] != self.chunk_digests.shape[0]:
            raise ValueError("RequestTable.chunk_offsets must span chunk_digests exactly")
        if self.block_size <= 0:
            raise ValueError("RequestTable.block_size must be positive")

    @property
    def n(self) -> int:
        """Number of requests."""
        return int(self.arrival_us.shape[0])

    def __len__(self) -> int:
        """Number of requests (same as :attr:`n`)."""
        return self.n

    def chunks(self, i: int) -> np.ndarray:
        """Content digests of request ``i``'s full blocks (a view)."""
        return self.chunk_digests[self.chunk_offsets[i] : self.chunk_offsets[i + 1]]

    def request_id(self, i: int) -> str:
        """Reference-style id of row ``i`` (``request_<i>``)."""
        return f"request_{i}"

    def with_deadlines(self, deadline_us: np.ndarray) -> RequestTable:
        """Copy of the table with the deadline column replaced (other arrays shared)."""
        return replace(self, deadline_us=np.ascontiguousarray(deadline_us, dtype=np.int64))

    @classmethod
    def empty(
        cls,
        block_size: int = 16,
        seed: int = 0,
        clients: list[dict[str, Any]] | None = None,
    ) -> RequestTable:
        """A table with zero requests (e.g. horizon <= 0), keeping block size, seed and clients."""
        i64 = np.zeros(0, dtype=np.int64)
        return cls(
            arrival_us=i64.copy(),
            input_len=i64.copy(),
            output_len=i64.copy(),
            max_output_len=i64.copy(),
            deadline_us=i64.copy(),
            prefix_length=i64.copy(),
            client_idx=np.zeros(0, dtype=np.int32),
            chunk_offsets=np.zeros(1, dtype=np.int64),
            chunk_digests=np.zeros(0, dtype=np.uint64),
            clients=list(clients or []),
            block_size=int(block_size),
            seed=int(seed),
        )
