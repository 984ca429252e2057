"""RequestTable: the generated workload as a structure of arrays (docs/architecture.md).

One row per request in injection order (row ``i`` is ``request_<i>``). The engine reads it and
never mutates it; token ids are never stored, only the content digests of each request's
full ``block_size``-token chunks of *input ++ output* (aligned at token 0), in CSR form.

Session columns (WL-6, DELTA-47): ``session_idx`` (int32, index into ``sessions``, -1 for a
request outside any session) and ``round_index`` (int32). Multimodal counts (int64) and
``reason_ratio`` (float64) are per-request metadata (WL-6.1, WL-6.2). Tables built without
them get zeros / -1 / an empty ``sessions`` list.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

CLIENT_KEYS = ("id", "tenant_id", "slo_class", "model", "prefix_group", "streaming")
"""Keys of each per-client metadata dict in :attr:`RequestTable.clients`.

The values are the ones the client's requests carry: a multi-turn (reasoning) client's
requests carry no prefix group and ``streaming`` false (WL-6.2), so its entry says so. Session
follow-ups (round >= 1 produced by the engine) carry neither either (WL-6.5)."""

_OPTIONAL_INT64 = ("text_tokens", "image_tokens", "audio_tokens", "video_tokens")

_INT64_COLUMNS = (
    "arrival_us",
    "input_len",
    "output_len",
    "max_output_len",
    "deadline_us",
    "prefix_length",
)


def adapter_columns(client_idx: np.ndarray, client_adapters: list[str]
                    ) -> tuple[np.ndarray | None, tuple[str, ...]]:
    """``(adapter_idx, adapter_names)`` of rows that carry their client's LoRA adapter
    (LORA-1.7): names in first-seen row order; ``(None, ())`` when no row has one."""
    if not any(client_adapters) or client_idx.shape[0] == 0:
        return None, ()
    clients, first = np.unique(client_idx, return_index=True)
    code: dict[str, int] = {}
    for k in clients[np.argsort(first, kind="stable")].tolist():  # clients, not rows
        if client_adapters[k]:
            code.setdefault(client_adapters[k], len(code))
    if not code:
        return None, ()
    per_client = np.array([code.get(a, -1) for a in client_adapters], dtype=np.int32)
    return per_client[client_idx], tuple(code)


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
    session_idx: np.ndarray | None = None  # int32, index into ``sessions``; -1 = no session
    round_index: np.ndarray | None = None  # int32, round within the session (0 otherwise)
    text_tokens: np.ndarray | None = None  # int64, multimodal text token count
    image_tokens: np.ndarray | None = None  # int64
    audio_tokens: np.ndarray | None = None  # int64
    video_tokens: np.ndarray | None = None  # int64
    reason_ratio: np.ndarray | None = None  # float64, in [0, 1]
    sessions: list[str] = field(default_factory=list)  # session ids ("sess_<n>", ...)
    # int64, the number k of each request's id "request_<k>" (replayed traces keep the
    # trace's ids); None = the row index
    request_numbers: np.ndarray | None = None
    # ids of the last ``len(extra_ids)`` rows, which are not "request_<k>": the closed-loop
    # follow-ups the engine appends ("session_<id>_round_<r>_<n>", WL-6.5)
    extra_ids: list[str] = field(default_factory=list)
    # LoRA (LORA-1.7, LORA-1.9): int32 per row, index into ``adapter_names``, -1 = no adapter;
    # None = no request carries one. ``adapter_names``: the distinct ids in first-seen row order
    adapter_idx: np.ndarray | None = None
    adapter_names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        """Fill absent optional columns, then check dtypes and lengths once."""
        n = self.arrival_us.shape[0]
        if self.session_idx is None:
            object.__setattr__(self, "session_idx", np.full(n, -1, dtype=np.int32))
        if self.request_numbers is None:
            object.__setattr__(self, "request_numbers", np.arange(n, dtype=np.int64))
        if self.round_index is None:
            object.__setattr__(self, "round_index", np.zeros(n, dtype=np.int32))
        for name in _OPTIONAL_INT64:
            if getattr(self, name) is None:
                object.__setattr__(self, name, np.zeros(n, dtype=np.int64))
        if self.reason_ratio is None:
            object.__setattr__(self, "reason_ratio", np.zeros(n, dtype=np.float64))
        for name in ("session_idx", "round_index"):
            arr = getattr(self, name)
            if arr.dtype != np.int32 or arr.shape != (n,):
                raise ValueError(f"RequestTable.{name} must be int32[{n}]")
        for name in _OPTIONAL_INT64:
            arr = getattr(self, name)
            if arr.dtype != np.int64 or arr.shape != (n,):
                raise ValueError(f"RequestTable.{name} must be int64[{n}]")
        if self.reason_ratio.dtype != np.float64 or self.reason_ratio.shape != (n,):
            raise ValueError(f"RequestTable.reason_ratio must be float64[{n}]")
        if n and self.session_idx.max(initial=-1) >= len(self.sessions):
            raise ValueError("RequestTable.session_idx points past the sessions list")
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
        if len(self.extra_ids) > n:
            raise ValueError("RequestTable.extra_ids has more ids than rows")
        if self.adapter_idx is not None:
            if self.adapter_idx.dtype != np.int32 or self.adapter_idx.shape != (n,):
                raise ValueError(f"RequestTable.adapter_idx must be int32[{n}]")
            if n and self.adapter_idx.max(initial=-1) >= len(self.adapter_names):
                raise ValueError("RequestTable.adapter_idx points past adapter_names")

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

    def session_id(self, i: int) -> str:
        """Session id of row ``i`` (empty outside sessions)."""
        k = int(self.session_idx[i])
        return self.sessions[k] if k >= 0 else ""

    def adapter(self, i: int) -> str:
        """LoRA adapter id of row ``i`` (empty for a base-model request)."""
        if self.adapter_idx is None:
            return ""
        k = int(self.adapter_idx[i])
        return self.adapter_names[k] if k >= 0 else ""

    def request_id(self, i: int) -> str:
        """Reference-style id of row ``i`` (``request_<k>``, or a follow-up's own id)."""
        first_extra = self.n - len(self.extra_ids)
        if i >= first_extra:
            return self.extra_ids[i - first_extra]
        return f"request_{int(self.request_numbers[i])}"

    def id_strings(self) -> list[str]:
        """Every row's id, in row order."""
        first_extra = self.n - len(self.extra_ids)
        numbered = [f"request_{k}" for k in self.request_numbers[:first_extra].tolist()]
        return numbered + list(self.extra_ids)

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
