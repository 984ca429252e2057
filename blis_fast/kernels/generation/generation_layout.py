"""Array layouts and status codes of the request-generation kernels, as NamedTuple enums.

Python resolves a workload spec into one row of integer parameters per client
(``clients.ints[k, GenClientCol.X]``) and one row of float parameters
(``clients.rates[k, GenRateCol.X]``); the kernel writes one int64 row per generated request
(``rows[i, GenRowCol.X]``). Every enum is a NamedTuple instance (Numba folds its fields as
constants), named for the generator so none collides with the engine's families.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class GenStatusT(NamedTuple):
    OK: int
    NEGATIVE_LENGTH: int  # a length sampler drew a negative token count
    SAMPLER_ERROR: int  # a sampler the reference fails to build was reached


GenStatus = GenStatusT(OK=0, NEGATIVE_LENGTH=1, SAMPLER_ERROR=2)
"""What a generation kernel returns first."""


class GenClientColT(NamedTuple):
    ACTIVE: int  # 1 when the client's rate is > 0 (it gets an RNG stream)
    ARRIVAL: int  # arrival process code (kernels.samplers ARRIVAL_*)
    IAT: int  # constant inter-arrival time (µs) of the constant process
    NORM_COUNT: int  # normalized-exponential factory: interval count
    NORM_DURATION: int  # normalized-exponential factory: total duration (µs)
    GROUP: int  # prefix group index, -1 = none
    INPUT: int  # sampler id of the input length
    OUTPUT: int  # sampler id of the output length
    MULTIMODAL: int  # 1 = input length is the multimodal sum
    MM_TEXT: int  # sampler ids: text, then (size, count) of image, audio, video
    MM_IMAGE: int
    MM_IMAGE_COUNT: int
    MM_AUDIO: int
    MM_AUDIO_COUNT: int
    MM_VIDEO: int
    MM_VIDEO_COUNT: int
    REASON_RATIO: int  # sampler id of the reason ratio, -1 = none
    MULTI_TURN: int  # 1 = each arrival is a whole session
    ROUNDS: int
    THINK: int  # think time between rounds (µs)
    ACCUMULATE: int  # 1 = later rounds re-send the context
    SINGLE_SESSION: int  # 1 = one session, then the client stops
    DROP_LATER_ROUNDS: int  # 1 = closed-loop conversion: rounds >= 1 never reach the output
    CAPTURE_ROUND0: int  # 1 = keep round 0's token ids (accumulating closed-loop sessions)
    PREFIX_CAPTURE: int  # > 0: keep this many leading ids of the first round 0 (blueprint prefix)
    PREFIX_CAPTURE_OFF: int  # where those ids go in the capture buffer
    WINDOW_FIRST: int  # lifecycle windows: [WINDOW_FIRST, WINDOW_END) in the window arrays
    WINDOW_END: int
    CAP: int  # request cap of the client (0 = none)


GenClientCol = GenClientColT(*range(len(GenClientColT._fields)))
"""Columns of the per-client integer parameters."""
GEN_CLIENT_COLS = len(GenClientCol)
MM_SAMPLER_SLOTS = GenClientCol.MM_VIDEO_COUNT - GenClientCol.MM_TEXT + 1
"""Multimodal sampler slots: text, then a (size, count) pair per image, audio, video."""


class GenRateColT(NamedTuple):
    RATE: int  # requests per µs
    P1: int  # process parameters (gamma/weibull shape and scale)
    P2: int


GenRateCol = GenRateColT(RATE=0, P1=1, P2=2)
"""Columns of the per-client float parameters."""
GEN_RATE_COLS = len(GenRateCol)


class GenRowColT(NamedTuple):
    ARRIVAL: int
    INPUT: int  # input length, group prefix included
    OUTPUT: int
    PREFIX: int  # group prefix length
    CLIENT: int
    SESSION: int  # kernel session key, -1 = none
    ROUND: int
    TEXT: int  # multimodal token counts
    IMAGE: int
    AUDIO: int
    VIDEO: int
    DROPPED: int  # 1 = a later round of a converted closed-loop session (no digests)


GenRowCol = GenRowColT(*range(len(GenRowColT._fields)))
"""Columns of a generated request row."""
GEN_ROW_COLS = len(GenRowCol)


class Round0ColT(NamedTuple):
    OFFSET: int  # start of the round's ids in the round-0 token buffer, -1 = not kept
    INPUT: int
    OUTPUT: int


Round0Col = Round0ColT(OFFSET=0, INPUT=1, OUTPUT=2)
"""Per-session triple of the round-0 capture (``round0[3 * session + Round0Col.X]``)."""
ROUND0_COLS = len(Round0Col)


class ClientParams(NamedTuple):
    """A workload resolved into arrays: what the generation kernel reads."""

    ints: np.ndarray  # (clients, GEN_CLIENT_COLS) int64
    rates: np.ndarray  # (clients, GEN_RATE_COLS) float64
    sampler_code: np.ndarray  # per sampler id: code (< 0 = the reference fails to build it)
    sampler_off: np.ndarray  # per sampler id: start of its parameters in sampler_params
    sampler_params: np.ndarray  # float64
    window_start: np.ndarray  # lifecycle windows (µs)
    window_end: np.ndarray
    group_len: np.ndarray  # prefix length per group


class GroupPrefixes(NamedTuple):
    """The token ids of every prefix group and the digests of their full blocks."""

    off: np.ndarray  # group g's ids are tokens[off[g]:off[g + 1]]
    tokens: np.ndarray
    full_blocks: np.ndarray  # full blocks per group
    digest_off: np.ndarray  # group g's block digests are digests[digest_off[g]:...[g + 1]]
    digests: np.ndarray


class GenerationResult(NamedTuple):
    """What ``generate_kernel`` returns; rows are sorted by arrival and truncated."""

    status: int
    err_client: int  # with SAMPLER_ERROR / NEGATIVE_LENGTH at a client's first request
    err_sampler: int
    rows: np.ndarray  # (n, GEN_ROW_COLS)
    reason_ratio: np.ndarray
    chunk_offsets: np.ndarray  # (n + 1): row i's digests are chunk_digests[off[i]:off[i+1]]
    chunk_digests: np.ndarray  # may be longer than chunk_offsets[-1] (a growth buffer)
    session_keys: np.ndarray  # per kernel session: its Int63 id
    round0: np.ndarray  # per kernel session: Round0Col triple
    round0_tokens: np.ndarray  # int32
    first_input: np.ndarray  # per client: input length of its first emitted round 0, -1 = none
    prefix_capture: np.ndarray  # captured leading ids (GenClientCol.PREFIX_CAPTURE_OFF)
    group_off: np.ndarray  # group prefixes: ids of group g are group_tokens[off[g]:off[g+1]]
    group_tokens: np.ndarray
    input_ids: np.ndarray  # int32, only with keep_ids
    input_off: np.ndarray  # (n + 1) with keep_ids, else (1,)


# --- the kernel's working state -----------------------------------------------------------------
class GenCountT(NamedTuple):
    ROWS: int  # rows emitted
    DIGESTS: int  # digests used in RowBuffers.digests
    IDS: int  # ids used in RowBuffers.input_ids
    SESSIONS: int
    ROUND0_TOKENS: int  # ids used in SessionBuffers.round0_tokens
    PENDING: int  # pending slots ever used
    POOL_DIGESTS: int  # digests used in PendingRounds.digests
    POOL_IDS: int  # ids used in PendingRounds.ids
    FREE: int  # recycled pending slots
    HEAP: int  # heap size
    SEQ: int  # heap pushes so far (the tie-break of equal (arrival, client))


GenCount = GenCountT(*range(len(GenCountT._fields)))
"""The generation kernel's counters (``cnt[GenCount.X]``)."""


class GenConfig(NamedTuple):
    """What every stage of one generation run reads."""

    clients: ClientParams
    prefixes: GroupPrefixes
    horizon: int
    block_size: int
    limit: int  # maxRequests, 0 = none
    keep_ids: bool
    tie_shift: int  # heap tie = client << tie_shift | seq


class RowBuffers(NamedTuple):
    """The output rows (growing); see GenerationResult for the fields."""

    rows: np.ndarray
    ratio: np.ndarray
    offsets: np.ndarray
    digests: np.ndarray
    input_ids: np.ndarray
    input_off: np.ndarray


class SessionBuffers(NamedTuple):
    """Per session: its key and round-0 capture; per client: the blueprint-prefix capture."""

    keys: np.ndarray  # Int63 id per session
    round0: np.ndarray  # Round0Col triple per session
    round0_tokens: np.ndarray  # int32
    first_input: np.ndarray  # per client
    prefix_capture: np.ndarray
    context: np.ndarray  # the accumulated context of the session being drawn


class PendColT(NamedTuple):
    DIG_OFF: int  # the round's digests: PendingRounds.digests[DIG_OFF:DIG_OFF + DIG_LEN]
    DIG_LEN: int
    IDS_OFF: int  # its input ids: PendingRounds.ids[IDS_OFF:IDS_OFF + IDS_LEN]
    IDS_LEN: int
    LIVE: int  # 1 while the slot holds a round (compaction keeps only live digests)


PendCol = PendColT(*range(len(PendColT._fields)))
"""Columns of ``PendingRounds.info``."""
PEND_COLS = len(PendCol)


class PendingRounds(NamedTuple):
    """Session rounds >= 1 waiting in the heap; their digests and ids in append-only pools."""

    rows: np.ndarray  # (slots, GEN_ROW_COLS)
    ratio: np.ndarray
    info: np.ndarray  # (slots, PEND_COLS)
    free: np.ndarray  # recycled slots (as long as the slot arrays)
    digests: np.ndarray
    ids: np.ndarray


class GenHeap(NamedTuple):
    """``kernels/engine/heap.py`` arrays: arrival, tie (client, seq), unused kind, pending slot."""

    times: np.ndarray
    ties: np.ndarray
    kinds: np.ndarray
    payloads: np.ndarray

