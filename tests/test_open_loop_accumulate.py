"""Open-loop multi-turn sessions with ``context_growth: accumulate`` (WL-6.2, WL-13.3, ENG-5.4).

Round r+1's input starts with round r's whole token list (input, then output). The reference
hashes every KV block that output tokens fill, so round r+1 finds round r's output blocks in
the prefix cache, exactly as closed-loop follow-ups do.
"""

from __future__ import annotations

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import blis_fast
from blis_fast.kernels.enums import RequestState

MODEL = "meta-llama/llama-3.1-8b-instruct"


def _spec(tmp_path, *, rounds: int, in_len, out_len, prefix: int = 0, single: bool = False,
          rate: float = 0.1, n: int | None = None, think_us: int = 2_000_000,
          seed: int = 7) -> str:
    """One open-loop accumulating multi-turn client with constant arrivals (WL-2.2)."""
    client = {
        "id": "chat", "rate_fraction": 1.0, "arrival": {"process": "constant"},
        "input_distribution": in_len, "output_distribution": out_len,
        "closed_loop": False,
        "reasoning": {"multi_turn": {"max_rounds": rounds, "think_time_us": think_us,
                                     "context_growth": "accumulate",
                                     "single_session": single}},
    }
    if prefix:
        client["prefix_group"] = "sys"
        client["prefix_length"] = prefix
    spec = {"version": "2", "seed": seed, "aggregate_rate": rate, "clients": [client]}
    spec["num_requests"] = rounds if n is None else n
    path = tmp_path / f"open-accum-{rounds}-{prefix}-{single}-{seed}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


def _const(value: int) -> dict:
    return {"type": "constant", "params": {"value": value}}


def test_two_sessions_three_requests_hit_rate_0_3125(tmp_path):
    """One client, three requests, block size 16, one instance, no KV pressure.

    Prefix P = 40, new input a = 64, output o = 28, max_rounds 2, sessions every 10 s (constant
    arrivals at rate 0.1), think time 2 s: the first three arrivals are A0 (10 s), A1 (12 s)
    and B0 (20 s), each after the previous request finished. Every request stores all of its
    input and output tokens, so it accounts for ceil((input + output) / 16) blocks:
      * A0: input P + a = 104, 132 tokens -> 9 blocks, nothing cached: 0 hits;
      * A1: input P + a + o + a = 196 (= A0's 132 tokens + 64 new), 224 tokens -> 14 blocks.
        A0's full blocks are all hashed: 6 by its prefill, block 7 (input 96-103 completed by
        output) and block 8 (output only) by decode -> floor(132 / 16) = 8 hits;
      * B0 (new session): input P + a = 104, 9 blocks; only the prefix's floor(40 / 16) = 2
        blocks are shared -> 2 hits.
    Hit rate = (8 + 2) / (9 + 14 + 9) = 10 / 32 = 0.3125. Without the output blocks A1 finds
    only A0's 6 input blocks: (6 + 2) / 32 = 0.25.
    """
    spec = _spec(tmp_path, rounds=2, in_len=_const(64), out_len=_const(28), prefix=40, n=3)
    res = blis_fast.run(model=MODEL, workload_spec=spec, num_instances=1)
    table = res.simulation.table
    assert table.n == 3
    assert table.input_len.tolist() == [104, 196, 104]
    assert table.round_index.tolist() == [0, 1, 0]
    assert res.simulation.cache_hit_rate.tolist() == [0.3125]
    assert "Cache Hit Rate: 0.3125" in res.stdout


def test_single_session_three_rounds_reuses_each_rounds_output(tmp_path):
    """``single_session`` with a prefix group: P = 40, a = 64, o = 28, three rounds.

    Token totals 132, 224 (= 132 + 64 + 28) and 316 -> 9 + 14 + 20 = 43 blocks. Round 1 hits
    floor(132 / 16) = 8 blocks, round 2 floor(224 / 16) = 14: 22 / 43 (input blocks only would
    give 6 + 12 = 18 / 43).
    """
    spec = _spec(tmp_path, rounds=3, in_len=_const(64), out_len=_const(28), prefix=40,
                 single=True)
    res = blis_fast.run(model=MODEL, workload_spec=spec, num_instances=1)
    assert res.simulation.table.input_len.tolist() == [104, 196, 288]
    assert res.simulation.cache_hit_rate.tolist() == [22 / 43]


def _blocks(tokens: int, bs: int) -> int:
    return -(-tokens // bs)


@settings(max_examples=6, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prefix=st.sampled_from([0, 7, 40]), bs=st.sampled_from([16, 32]),
       seed=st.integers(1, 10_000))
def test_next_round_hits_cover_previous_rounds_aligned_blocks(tmp_path, prefix, bs, seed):
    """Invariant (one instance, no KV pressure, rounds one after another): round r+1's cache
    hits are at least floor((input_r + output_r) / bs), the full blocks of round r's tokens.

    Per-round hits come from runs with 1..4 rounds of the same single session (earlier rounds
    draw the same lengths and are not affected by later ones): hits = rate x blocks.
    """
    dist_in = {"type": "gaussian", "params": {"mean": 40, "std_dev": 25, "min": 1, "max": 100}}
    dist_out = {"type": "gaussian", "params": {"mean": 30, "std_dev": 20, "min": 1, "max": 90}}
    hits: list[int] = []
    tokens: list[int] = []
    for rounds in range(1, 5):
        spec = _spec(tmp_path, rounds=rounds, in_len=dist_in, out_len=dist_out, prefix=prefix,
                     single=True, seed=seed)
        res = blis_fast.run(model=MODEL, workload_spec=spec, num_instances=1,
                            block_size_in_tokens=bs)
        sim = res.simulation
        table = sim.table
        assert table.n == rounds and all(s == RequestState.COMPLETED for s in sim.state)
        run_tokens = (table.input_len + table.output_len).tolist()
        assert run_tokens[:-1] == tokens  # the earlier rounds are those of the shorter run
        tokens = run_tokens
        for r in range(rounds - 1):  # precondition: round r finished before round r+1 came
            assert table.arrival_us[r + 1] >= table.arrival_us[r] + sim.e2e_us[r]
        total = sum(_blocks(t, bs) for t in tokens)
        got = float(sim.cache_hit_rate[0]) * total
        assert abs(got - round(got)) < 1e-6
        hits.append(round(got))
    assert hits[0] == 0
    for r in range(3):  # rounds r and r+1 exist in the run with r + 2 rounds
        assert hits[r + 1] - hits[r] >= tokens[r] // bs
