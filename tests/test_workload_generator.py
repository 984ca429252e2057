"""Request generation rules (WL-2, WL-5, WL-13, WL-14, DELTA-28, DELTA-56) and RequestTable."""

from __future__ import annotations

import numpy as np
import pytest
from naive import generate_requests as naive_generate_requests

from blis_fast.errors import BlisConfigError, BlisInputError
from blis_fast.gonum import INT64_MAX
from blis_fast.workload.client_params import normalize_rate_fractions
from blis_fast.workload.generated import apply_timeout
from blis_fast.workload.generator import generate_requests
from blis_fast.workload.request_table import RequestTable
from blis_fast.workload.spec import (
    ActiveWindow,
    ArrivalSpec,
    ClientSpec,
    DistSpec,
    LifecycleSpec,
    WorkloadSpec,
    apply_timeout_to_spec,
)
from blis_fast.workload.synthesis import (
    DistributionParams,
    lookup_preset,
    synthesize_from_distribution,
    synthesize_from_preset,
    validate_distribution_params,
    validate_rate,
)
from blis_fast.workload.trace_v2 import TraceOutcome, build_trace_csv


def _table_bytes(t: RequestTable) -> bytes:
    parts = [
        t.arrival_us, t.input_len, t.output_len, t.max_output_len, t.deadline_us,
        t.prefix_length, t.client_idx, t.chunk_offsets, t.chunk_digests,
    ]
    return b"".join(np.ascontiguousarray(a).tobytes() for a in parts)


def _gauss(mean, std, lo, hi) -> DistSpec:
    return DistSpec("gaussian", {"mean": mean, "std_dev": std, "min": lo, "max": hi})


def _naive_generate(spec: WorkloadSpec, horizon: int, max_requests: int, bs: int):
    """The reference's loop written plainly with the Go RNG port (``naive.generate_requests``)."""
    rates = normalize_rate_fractions(spec.clients, spec.aggregate_rate)
    return naive_generate_requests(spec, rates, horizon, max_requests, bs)


def _assert_matches_naive(table: RequestTable, naive) -> None:
    assert table.n == len(naive)
    for i, (t, ci, ilen, olen, plen, dig) in enumerate(naive):
        assert table.arrival_us[i] == t
        assert table.client_idx[i] == ci
        assert table.input_len[i] == ilen
        assert table.output_len[i] == olen == table.max_output_len[i]
        assert table.prefix_length[i] == plen
        assert table.chunks(i).tolist() == dig


def _mixed_spec(seed: int = 5) -> WorkloadSpec:
    return WorkloadSpec(
        seed=seed,
        aggregate_rate=50.0,
        clients=[
            ClientSpec(
                id="a",
                rate_fraction=2.0,
                arrival=ArrivalSpec("poisson"),
                input_dist=_gauss(40, 15, 2, 90),
                output_dist=DistSpec("exponential", {"mean": 20.0}),
                prefix_group="g1",
                prefix_length=37,
            ),
            ClientSpec(
                id="b",
                tenant_id="t",
                slo_class="batch",
                rate_fraction=1.0,
                arrival=ArrivalSpec("constant"),
                input_dist=DistSpec("constant", {"value": 30.7}),
                output_dist=_gauss(10, 0, 5, 5),
            ),
            ClientSpec(
                id="c",
                rate_fraction=1.0,
                arrival=ArrivalSpec("poisson"),
                input_dist=_gauss(25, 30, 1, 60),
                output_dist=_gauss(25, 30, 1, 60),
                prefix_group="g2",  # no prefix_length: 50 tokens (WL-5.4)
            ),
            ClientSpec(
                id="d",
                rate_fraction=0.5,
                arrival=ArrivalSpec("poisson"),
                input_dist=_gauss(20, 5, 2, 40),
                output_dist=_gauss(20, 5, 2, 40),
                prefix_group="g1",  # joins g1: its own prefix_length is ignored
                prefix_length=5,
            ),
        ],
    )


# --- tests ------------------------------------------------------------------------------------
@pytest.mark.parametrize("bs", [16, 7])
def test_kernel_matches_naive_twin(bs):
    """Draw order, prefixes, stable merge, truncation and digest layout equal the plain loop."""
    spec = _mixed_spec()
    table = generate_requests(spec, max_requests=60, block_size=bs)
    _assert_matches_naive(table, _naive_generate(_mixed_spec(), INT64_MAX, 60, bs))
    assert set(table.client_idx.tolist()) == {0, 1, 2, 3}
    assert (table.prefix_length[table.client_idx == 2] == 50).all()
    assert (table.prefix_length[table.client_idx == 3] == 37).all()


def test_the_generator_without_session_code_draws_the_same():
    """A workload without multi-turn clients runs the generator compiled without the session
    code (``multi_turn_on`` None); the variant compiled with it draws the very same rows."""
    from blis_fast.kernels.generation.generation import generate_kernel
    from blis_fast.workload.client_params import resolve_clients

    spec = _mixed_spec(seed=7)
    rc = resolve_clients(spec.clients, spec.aggregate_rate, 80, True)
    args = (np.int64(123), rc.params, np.int64(INT64_MAX), np.int64(16),
            np.int64(rc.prefix_capture_len), np.int64(80), np.int64(1))
    without, with_code = generate_kernel(*args, None), generate_kernel(*args, True)
    assert without.rows.shape[0] == 80
    used_digests = without.chunk_offsets[-1]
    for field in without._fields:
        a, b = getattr(without, field), getattr(with_code, field)
        if field == "chunk_digests":  # a growth buffer: the used part
            a, b = a[:used_digests], b[:used_digests]
        np.testing.assert_array_equal(a, b)


def test_kernel_matches_naive_twin_horizon_and_lifecycle():
    """Horizon-bounded generation (no request cap) with lifecycle windows equals the plain loop."""
    spec = _mixed_spec(seed=11)
    spec.clients[2].lifecycle = LifecycleSpec(
        [ActiveWindow(0, 300_000), ActiveWindow(600_000, 700_000)]
    )
    horizon = 1_000_000
    table = generate_requests(spec, horizon=horizon, max_requests=0)
    spec2 = _mixed_spec(seed=11)
    spec2.clients[2].lifecycle = LifecycleSpec(
        [ActiveWindow(0, 300_000), ActiveWindow(600_000, 700_000)]
    )
    _assert_matches_naive(table, _naive_generate(spec2, horizon, 0, 16))
    arr = table.arrival_us[table.client_idx == 2]
    assert ((arr < 300_000) | ((arr >= 600_000) & (arr < 700_000))).all()
    assert (table.arrival_us < horizon).all()


def test_same_seed_is_byte_identical():
    """Two generations with the same seed give identical arrays and identical trace bytes."""
    p = DistributionParams(rate=50, num_requests=300, prefix_tokens=40)
    a = apply_timeout(
        generate_requests(synthesize_from_distribution(p, seed=3), max_requests=300), 300
    )
    b = apply_timeout(
        generate_requests(synthesize_from_distribution(p, seed=3), max_requests=300), 300
    )
    assert _table_bytes(a) == _table_bytes(b)
    out = TraceOutcome(np.zeros(a.n, np.int8), np.full(a.n, -1, np.int64), np.zeros(a.n, np.int64))
    assert build_trace_csv(a, out).encode() == build_trace_csv(b, out).encode()
    c = generate_requests(synthesize_from_distribution(p, seed=4), max_requests=300)
    assert _table_bytes(a) != _table_bytes(c)


@pytest.mark.parametrize(("prefix", "bs"), [(40, 16), (512, 32), (48, 16), (10, 16)])
def test_shared_prefix_digests(prefix, bs):
    """Requests sharing a --prefix-tokens prefix agree on their first floor(P/bs) chunks only."""
    p = DistributionParams(rate=10, num_requests=50, prefix_tokens=prefix)
    t = generate_requests(synthesize_from_distribution(p, seed=42), max_requests=50, block_size=bs)
    shared = prefix // bs
    assert (t.prefix_length == prefix).all()
    assert all(m["prefix_group"] == "shared" for m in t.clients)
    first = t.chunks(0)
    for i in range(t.n):
        ch = t.chunks(i)
        assert len(ch) == (t.input_len[i] + t.output_len[i]) // bs
        assert (ch[:shared] == first[:shared]).all()
    # The first block after the shared ones differs between requests (random suffix tokens).
    nxt = {t.chunks(i)[shared] for i in range(t.n) if len(t.chunks(i)) > shared}
    assert len(nxt) > t.n // 2


def test_no_prefix_means_no_shared_chunks():
    """Without a prefix group the first blocks of different requests differ."""
    t = generate_requests(
        synthesize_from_distribution(DistributionParams(num_requests=30)), max_requests=30
    )
    assert (t.prefix_length == 0).all()
    assert len({t.chunks(i)[0] for i in range(t.n)}) == t.n


def test_constant_arrivals_and_rate_rounding():
    """Arrival k is at k*trunc(1/(rate/1e6)); --rate 10 gives 99 999 µs (WL-2.2)."""
    for rate, iat in [(1.0, 1_000_000), (10.0, 99_999), (100.0, 10_000)]:
        t = generate_requests(
            synthesize_from_distribution(DistributionParams(rate=rate, num_requests=5)),
            max_requests=5,
        )
        assert t.arrival_us.tolist() == [iat * k for k in range(1, 6)]


def test_horizon_rules():
    """Horizon <= 0 gives an empty table; arrivals stop strictly before the horizon (WL-1.3)."""
    spec = synthesize_from_distribution(DistributionParams(rate=10, num_requests=100))
    e = generate_requests(spec, horizon=0, max_requests=100)
    assert e.n == 0 and e.chunk_offsets.tolist() == [0] and e.seed == 42
    t = generate_requests(spec, horizon=1_000_000, max_requests=100)
    assert t.arrival_us.tolist() == [99_999 * k for k in range(1, 11)]
    assert generate_requests(spec, horizon=999_991, max_requests=0).n == 10
    assert generate_requests(spec, horizon=999_990, max_requests=0).n == 9  # t >= horizon stops
    with pytest.raises(BlisInputError):
        generate_requests(spec, max_requests=-1)


def test_deadline_rules():
    """computeDeadline (WL-5.7) per client, then --timeout overrides every deadline (DELTA-28)."""
    spec = _mixed_spec()
    spec.clients[0].timeout = None  # non-session, no timeout -> 0
    spec.clients[1].timeout = 0  # explicit 0 -> 0
    spec.clients[2].timeout = 1234  # arrival + 1234
    spec.clients[3].closed_loop = True  # session default: arrival + 300 s
    t = generate_requests(spec, max_requests=80)
    ci, arr, dl = t.client_idx, t.arrival_us, t.deadline_us
    assert (dl[ci == 0] == 0).all() and (dl[ci == 1] == 0).all()
    assert (dl[ci == 2] == arr[ci == 2] + 1234).all()
    assert (dl[ci == 3] == arr[ci == 3] + 300_000_000).all()
    t5 = apply_timeout(t, 5)
    assert (t5.deadline_us == t.arrival_us + 5_000_000).all()
    assert (apply_timeout(t, -1).deadline_us == 0).all()
    assert (t.deadline_us[ci == 2] == arr[ci == 2] + 1234).all()  # original untouched
    with pytest.raises(ValueError):
        apply_timeout(t, 0)
    spec2 = _mixed_spec()
    apply_timeout_to_spec(spec2, 5)
    t_spec = generate_requests(spec2, max_requests=80)
    assert (t_spec.deadline_us == t5.deadline_us).all()
    apply_timeout_to_spec(spec2, -3)
    assert (generate_requests(spec2, max_requests=80).deadline_us == 0).all()


def test_gaussian_min_equals_max_draws_nothing():
    """A gaussian with min == max returns min without a draw, like a constant (WL-14.3 step 4)."""

    def spec(out: DistSpec) -> WorkloadSpec:
        c = ClientSpec(
            id="x", rate_fraction=1.0, arrival=ArrivalSpec("poisson"),
            input_dist=_gauss(30, 10, 2, 60), output_dist=out,
        )
        return WorkloadSpec(seed=9, aggregate_rate=5.0, clients=[c])

    a = generate_requests(spec(_gauss(500, 100, 7, 7)), max_requests=40)
    b = generate_requests(spec(DistSpec("constant", {"value": 7.0})), max_requests=40)
    assert (a.output_len == 7).all()
    assert _table_bytes(a) == _table_bytes(b)


def test_request_table_contract():
    """Dtypes and CSR layout follow docs/architecture.md."""
    t = generate_requests(
        synthesize_from_distribution(DistributionParams(num_requests=20)), max_requests=20
    )
    for name in (
        "arrival_us",
        "input_len",
        "output_len",
        "max_output_len",
        "deadline_us",
        "prefix_length",
    ):
        assert getattr(t, name).dtype == np.int64
    assert t.client_idx.dtype == np.int32
    assert t.chunk_offsets.dtype == np.int64 and t.chunk_offsets.shape == (t.n + 1,)
    assert t.chunk_digests.dtype == np.uint64
    assert np.diff(t.chunk_offsets).tolist() == ((t.input_len + t.output_len) // 16).tolist()
    assert t.n == len(t) == 20 and t.block_size == 16 and t.seed == 42
    assert t.clients == [
        {"id": "distribution", "tenant_id": "", "slo_class": "", "model": "",
         "prefix_group": "", "streaming": False}
    ]
    e = RequestTable.empty(block_size=32, seed=-5)
    assert e.n == 0 and e.block_size == 32 and e.seed == -5
    with pytest.raises(ValueError):
        RequestTable(
            arrival_us=np.zeros(2, np.int64), input_len=np.zeros(2, np.int64),
            output_len=np.zeros(2, np.int64), max_output_len=np.zeros(2, np.int64),
            deadline_us=np.zeros(2, np.int64), prefix_length=np.zeros(2, np.int64),
            client_idx=np.zeros(2, np.int64), chunk_offsets=np.zeros(3, np.int64),
            chunk_digests=np.zeros(0, np.uint64),
        )


def test_synthesis_shapes_the_spec():
    """Distribution and preset modes build the same one-client spec (WL-2.1, WL-2.5)."""
    spec = synthesize_from_distribution(
        DistributionParams(rate=3.5, num_requests=7, prefix_tokens=9), seed=1
    )
    assert spec.seed == 1 and spec.aggregate_rate == 3.5 and spec.num_requests == 7
    assert spec.category == "language" and spec.version == "2"
    (c,) = spec.clients
    assert (c.id, c.rate_fraction, c.arrival.process) == ("distribution", 1.0, "constant")
    assert c.input_dist.params == {"mean": 512.0, "std_dev": 256.0, "min": 2.0, "max": 7000.0}
    assert (c.prefix_group, c.prefix_length) == ("shared", 9)
    preset = {"prompt_tokens": 100, "prompt_tokens_stdev": 10, "output_tokens": 5}  # rest -> 0
    ps = synthesize_from_preset(preset, 2.0, 11, seed=8)
    assert ps.clients[0].input_dist.params == {
        "mean": 100.0,
        "std_dev": 10.0,
        "min": 0.0,
        "max": 0.0,
    }
    assert ps.clients[0].prefix_group == "" and ps.num_requests == 11 and ps.seed == 8


def test_flag_validation_messages():
    """WL-2.4 checks, the rate check and the unknown-preset error use the reference's wording."""
    with pytest.raises(BlisConfigError, match=r"^--rate must be a finite value > 0, got 0$"):
        validate_rate(0.0)
    with pytest.raises(BlisConfigError, match=r"got NaN$"):
        validate_rate(float("nan"))
    with pytest.raises(BlisConfigError, match=r"got \+Inf$"):
        validate_rate(float("inf"))
    with pytest.raises(BlisConfigError, match=r"^--prompt-tokens-min must be >= 1, got 0$"):
        validate_distribution_params(DistributionParams(prompt_tokens_min=0))
    with pytest.raises(BlisConfigError, match=r"must be <= --output-tokens-max \(3\)$"):
        validate_distribution_params(DistributionParams(output_tokens_min=5, output_tokens_max=3))
    with pytest.raises(BlisConfigError, match=r"^prompt-tokens and prompt-tokens-stdev should be"):
        validate_distribution_params(DistributionParams(prompt_tokens_stdev=1))  # below min 2
    validate_distribution_params(DistributionParams())
    with pytest.raises(BlisConfigError, match=r'^Undefined workload "traces"\. Use one among'):
        lookup_preset({"chatbot": {}}, "traces")


def test_spec_validation_and_sampler_errors():
    """Invalid specs and unbuildable samplers raise BlisInputError with the reference's text."""
    spec = _mixed_spec()
    spec.clients[0].rate_fraction = 0.0
    with pytest.raises(
        BlisInputError, match=r"^invalid workload spec: client\[0\]\.rate_fraction must be positive"
    ):
        generate_requests(spec, max_requests=5)
    spec = _mixed_spec()
    spec.clients[1].input_dist = DistSpec("gaussian", {"mean": 3.0})
    with pytest.raises(BlisInputError, match='requires parameter "std_dev"'):
        generate_requests(spec, max_requests=5)
    spec = _mixed_spec()
    spec.aggregate_rate = float("nan")
    with pytest.raises(
        BlisInputError, match="^invalid workload spec: aggregate_rate must be a finite number, got NaN$"
    ):
        generate_requests(spec, max_requests=5)
    spec = _mixed_spec()
    spec.clients[1].input_dist = _gauss(5, 1, -3, -3)
    with pytest.raises(BlisInputError, match="negative token count"):
        generate_requests(spec, max_requests=5)
    spec = _mixed_spec()
    spec.clients[1].arrival = ArrivalSpec("gamma", cv=2.0)  # implemented now: generates
    assert generate_requests(spec, max_requests=5).n == 5


def test_v1_slo_names_are_upgraded():
    """A v1 spec's deprecated SLO classes are mapped to v2 names (WL-4.2)."""
    spec = _mixed_spec()
    spec.version = "1"
    spec.clients[1].slo_class = "realtime"
    t = generate_requests(spec, max_requests=5)
    assert t.clients[1]["slo_class"] == "critical"


@pytest.mark.bench
def test_generation_speed_100k():
    """100,000 requests of ~512+512 tokens generate in well under 2 s once compiled."""
    import time

    p = DistributionParams(rate=100, num_requests=100_000)
    generate_requests(synthesize_from_distribution(p), max_requests=1000)  # warm-up
    start = time.perf_counter()
    t = generate_requests(synthesize_from_distribution(p), max_requests=100_000)
    elapsed = time.perf_counter() - start
    assert t.n == 100_000
    assert elapsed < 2.0, elapsed
