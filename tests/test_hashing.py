"""The 64-bit block hashes give the reference's SHA-256 block identities (DESIGN §3, ENG-5.3).

Only equality of block hashes matters to the simulation, so replacing the reference's chained
SHA-256 hex digests by chained 64-bit digests is exact when both partition the blocks the same
way. These tests rebuild the token ids of parity workloads with the Go RNG port (the draw
order of WL-14 for the distribution workload), check the generator's digests against them,
and compare the two hash partitions block by block.
"""

from __future__ import annotations

import numpy as np
import pytest
from naive import distribution_tokens, go_hash_block

from blis_fast.kernels.hashing import EMPTY_HASH, chain_hash, content_digest
from blis_fast.workload.generator import generate_requests
from blis_fast.workload.synthesis import DistributionParams, synthesize_from_distribution


def rebuild_tokens(p: DistributionParams, seed: int, n: int) -> list[np.ndarray]:
    """Token ids (input ++ output) of a distribution workload, drawn as the reference does."""
    lengths = ((p.prompt_tokens_mean, p.prompt_tokens_stdev, p.prompt_tokens_min,
                p.prompt_tokens_max),
               (p.output_tokens_mean, p.output_tokens_stdev, p.output_tokens_min,
                p.output_tokens_max))
    return [np.array(ids, dtype=np.int64)
            for ids in distribution_tokens(p.prefix_tokens, lengths, seed, n)]


CASES = [  # (params, seed, block size, requests): parity workloads with shared prefixes
    (DistributionParams(rate=20, num_requests=60, prefix_tokens=512), 42, 32, 60),
    (DistributionParams(rate=30, num_requests=60, prefix_tokens=256), 42, 16, 60),
    (DistributionParams(rate=2, num_requests=40), 7, 16, 40),
]


@pytest.mark.parametrize(("params", "seed", "bs", "n"), CASES)
def test_generator_digests_are_the_chunks_of_the_reference_tokens(params, seed, bs, n):
    table = generate_requests(synthesize_from_distribution(params, seed=seed), max_requests=n,
                              block_size=bs)
    tokens = rebuild_tokens(params, seed, n)
    for r in range(n):
        assert len(tokens[r]) == table.input_len[r] + table.output_len[r]
        chunks = table.chunk_digests[table.chunk_offsets[r]:table.chunk_offsets[r + 1]]
        expected = [content_digest(tokens[r], k * bs, bs) for k in range(len(tokens[r]) // bs)]
        assert list(chunks) == expected


@pytest.mark.parametrize(("params", "seed", "bs", "n"), CASES)
def test_64_bit_chains_partition_blocks_like_sha256(params, seed, bs, n):
    table = generate_requests(synthesize_from_distribution(params, seed=seed), max_requests=n,
                              block_size=bs)
    tokens = rebuild_tokens(params, seed, n)
    sha_of: dict[str, int] = {}
    fast_of: dict[int, int] = {}
    pairs = 0
    for r in range(n):
        prev_sha, prev_fast = "", EMPTY_HASH
        n_blocks = int(table.input_len[r]) // bs
        for k in range(n_blocks):
            block = tokens[r][k * bs:(k + 1) * bs]
            prev_sha = go_hash_block(prev_sha, block)
            prev_fast = np.uint64(chain_hash(np.uint64(prev_fast),
                                             table.chunk_digests[table.chunk_offsets[r] + k]))
            # the two maps must be inverse bijections between SHA and 64-bit identities
            assert sha_of.setdefault(prev_sha, int(prev_fast)) == int(prev_fast)
            assert fast_of.setdefault(int(prev_fast), hash(prev_sha)) == hash(prev_sha)
            pairs += 1
    assert pairs > 0
    if params.prefix_tokens:
        shared = params.prefix_tokens // bs
        assert len(sha_of) < pairs  # prefix blocks are shared, so identities repeat
        assert pairs - len(sha_of) == shared * (n - 1)


def test_reference_hash_vectors():
    """ENG-5.3 test vectors of the reference's HashBlock."""
    h1 = go_hash_block("", [1, 2])
    assert h1 == "5e78b5162f9dd69f2b1b1b3f02203d4319466dd77e1d7ff744337ea38059a492"
    assert go_hash_block(h1, [3, 4]) == (
        "97558f976d3ef1a5e76a3ac1c5c0e6ecd9ce26824609e0b3403ce5eacac40614")
