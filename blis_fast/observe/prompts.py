"""Prompt text for real-server requests, built from the generated token ids (OBS-4.1-4.3).

The server tokenizes text, not ids, so each request's ids become vocabulary words: word ``i``
is ``VOCABULARY[id_i mod 100]``, scaled by the measured tokens-per-word ratio so the server's
token count tracks the intended length. Prefix groups share one seeded word string, so requests
of a group start with identical text and can hit the server's prefix cache.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from blis_fast.kernels.go.gorand import intn, new_source

VOCABULARY: tuple[str, ...] = (
    "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet",
    "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango",
    "uniform", "victor", "whiskey", "xray", "yankee", "zulu", "apple", "banana", "cherry", "date",
    "elder", "fig", "grape", "hazel", "iris", "jasmine", "kiwi", "lemon", "mango", "nutmeg",
    "olive", "peach", "quince", "rose", "sage", "thyme", "umber", "violet", "willow", "yarrow",
    "acorn", "birch", "cedar", "daisy", "elm", "fern", "ginger", "holly", "ivy", "juniper",
    "kelp", "laurel", "maple", "nettle", "oak", "pine", "quinoa", "reed", "spruce", "tulip",
    "umbra", "vine", "walnut", "xylem", "yew", "zinnia", "alder", "basil", "clover", "dill",
    "fennel", "garlic", "hemp", "indigo", "jade", "kumquat", "lily", "moss", "neem", "orchid",
    "poppy", "rye", "saffron", "tea", "urchin", "verbena", "wheat", "xeris", "yucca", "zest",
)
"""The reference's fixed 100-word vocabulary, in its order (OBS-4.2)."""

RATIO_PROMPT = " ".join(VOCABULARY)
"""The token-ratio request's prompt: every vocabulary word once, single spaces (OBS-3.2)."""

DEFAULT_PREFIX_LENGTH = 50
"""Prefix length of a group whose clients give none (OBS-4.2)."""

_WORDS = np.array([w + " " for w in VOCABULARY], dtype=object)


def go_round(x: float) -> int:
    """Go ``math.Round``: halves away from zero."""
    return int(math.floor(abs(x) + 0.5)) * (1 if x >= 0 else -1)


def word_count(tokens: int, tokens_per_word: float) -> int:
    """``max(1, round(tokens / ratio))`` with a non-positive ratio read as 1.0 (OBS-4.1)."""
    tpw = tokens_per_word if tokens_per_word > 0 else 1.0
    return max(1, go_round(tokens / tpw))


def tokens_to_prompt(ids: np.ndarray, words: int) -> str:
    """``words`` vocabulary words, each with a trailing space: word ``i`` from ``ids[i]``, or
    from ``i`` itself once the ids run out (OBS-4.3)."""
    ids = np.asarray(ids, dtype=np.int64)
    idx = np.arange(words, dtype=np.int64)
    k = min(words, ids.shape[0])
    idx[:k] = ids[:k]
    return "".join(_WORDS[np.mod(idx, 100)].tolist())


def _fnv1a64(data: bytes) -> int:
    """FNV-1a 64-bit hash of ``data`` as a signed int64 (Go's ``int64(h.Sum64())``)."""
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h - (1 << 64) if h >= (1 << 63) else h


def prefix_string(group: str, seed: int, length: int, tokens_per_word: float) -> str:
    """The shared text of one prefix group: ``round(length / ratio)`` words drawn with Go's
    ``Intn(100)`` from a source seeded by FNV-1a(seed bytes ‖ group name), plus a trailing
    space (OBS-4.2)."""
    words = word_count(length, tokens_per_word)
    seed_bytes = struct.pack("<Q", int(seed) & 0xFFFFFFFFFFFFFFFF)
    rng = new_source(_fnv1a64(seed_bytes + group.encode("utf-8")))
    picks = [VOCABULARY[intn(rng, 100)] for _ in range(words)]
    return " ".join(picks) + " "


def group_lengths(clients: Iterable) -> dict[str, int]:
    """Prefix group -> length in tokens over the spec's clients; the last client listed wins
    and a length <= 0 means the default 50 (OBS-4.2)."""
    groups: dict[str, int] = {}
    for c in clients:
        if c.prefix_group:
            groups[c.prefix_group] = c.prefix_length if c.prefix_length > 0 else DEFAULT_PREFIX_LENGTH
    return groups


def build_prompt(ids: np.ndarray, prefix_group: str, prefixes: Mapping[str, str],
                 lengths: Mapping[str, int], tokens_per_word: float) -> str:
    """A request's prompt (OBS-4.3): the group's prefix string followed by words for the last
    ``max(1, n - L)`` ids when its group has a string; otherwise words for the first ids."""
    n = int(len(ids))
    if prefix_group and prefix_group in prefixes:
        suffix = max(1, n - int(lengths[prefix_group]))
        start = min(max(n - suffix, 0), n)
        return prefixes[prefix_group] + tokens_to_prompt(ids[start:],
                                                         word_count(suffix, tokens_per_word))
    return tokens_to_prompt(ids, word_count(n, tokens_per_word))


def build_prefixes(groups: Mapping[str, int], seed: int,
                   tokens_per_word: float) -> dict[str, str]:
    """The prefix string of every group (OBS-4.2)."""
    return {g: prefix_string(g, seed, length, tokens_per_word) for g, length in groups.items()}


__all__: Sequence[str] = (
    "RATIO_PROMPT",
    "VOCABULARY",
    "build_prefixes",
    "build_prompt",
    "go_round",
    "group_lengths",
    "prefix_string",
    "tokens_to_prompt",
    "word_count",
)
