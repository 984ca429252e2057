"""Bit-exactness of the Go math/rand v1 port (spec WL-14.1, ENG-8).

Golden vectors come from Go's own regression test, ``src/math/rand/regress_test.go``
(``TestRegress``: every method is called 20 times on ``New(NewSource(0))`` after ``Seed(0)``,
with the argument lists ``int32s`` / ``int64s`` below, cycled). Table spot values come from
``src/math/rand/rng.go`` (``rngCooked``), ``exp.go`` (``ke``/``we``/``fe``) and ``normal.go``
(``kn``/``wn``/``fn``).
"""

from __future__ import annotations

import numpy as np
import pytest

from blis_fast.kernels.go import gorand as g

# Arguments used by regress_test.go for methods taking an int32 / int64 / int.
INT32S = [1, 10, 32, 1 << 20, (1 << 20) + 1, 1000000000, 1 << 30, (1 << 31) - 2, (1 << 31) - 1]
INT64S = [
    1, 10, 32, 1 << 20, (1 << 20) + 1, 1000000000, 1 << 30, (1 << 31) - 2, (1 << 31) - 1,
    1000000000000000000, 1 << 60, (1 << 63) - 2, (1 << 63) - 1,
]

# Golden outputs of regress_test.go (regressGolden), per method, in call order.
GOLDEN_EXP = [
    4.668112973579268, 0.1601593871172866, 3.0465834105636, 0.06385839451671879,
    1.8578917487258961, 0.784676123472182, 0.11225477361256932, 0.20173283329802255,
    0.3468619496201105, 0.35601103454384536, 0.888376329507869, 1.4081362450365698,
    1.0077753823151994, 0.23594100766227588, 2.777245612300007, 0.5202997830662377,
    1.2842705247770294, 0.030307408362776206, 2.204156824853721, 2.09891923895058,
]
GOLDEN_FLOAT64 = [
    0.9451961492941164, 0.24496508529377975, 0.6559562651954052, 0.05434383959970039,
    0.36758720663245853, 0.2894804331565928, 0.19243860967493215, 0.6553321508148324,
    0.897169713149801, 0.16735444255905835, 0.2885856518054551, 0.9026048462705047,
    0.8497802817628735, 0.2730468047134829, 0.6090801919903561, 0.25365600644283687,
    0.7746542391859803, 0.017480762156647272, 0.7870739563039942, 0.7993936979594545,
]
GOLDEN_INT63 = [
    8717895732742165505, 2259404117704393152, 6050128673802995827, 501233450539197794,
    3390393562759376202, 2669985732393126063, 1774932891286980153, 6044372234677422456,
    8274930044578894929, 1543572285742637646, 2661732831099943416, 8325060299420976708,
    7837839688282259259, 2518412263346885298, 5617773211005988520, 2339563716805116249,
    7144924247938981575, 161231572858529631, 7259475919510918339, 7373105480197164748,
]
GOLDEN_INT31 = [
    2029793274, 526058514, 1408655353, 116702506, 789387515, 621654496, 413258767,
    1407315077, 1926657288, 359390928, 619732968, 1938329147, 1824889259, 586363548,
    1307989752, 544722126, 1663557311, 37539650, 1690228450, 1716684894,
]
GOLDEN_INT31N = [
    0, 4, 25, 310570, 857611, 621654496, 413258767, 1407315077, 1926657288,
    0, 8, 27, 367019, 209005, 307989752, 544722126, 1663557311, 37539650, 0, 4,
]
GOLDEN_INT63N = [
    0, 2, 19, 959842, 688912, 393126063, 89212473, 834026388, 1577188963,
    543572285742637646, 355889821886249464, 8325060299420976708, 7837839688282259259,
    0, 0, 25, 679623, 882178, 510918339, 782454476,
]
GOLDEN_INTN = [
    0, 4, 25, 310570, 857611, 621654496, 413258767, 1407315077, 1926657288,
    543572285742637646, 355889821886249464, 8325060299420976708, 7837839688282259259,
    0, 2, 14, 515775, 839455, 690228450, 642943070,
]
GOLDEN_NORM = [
    -0.28158587086436215, 0.570933095808067, -1.6920196326157044, 0.1996229111693099,
    1.9195199291234621, 0.8954838794918353, 0.41457072128813166, -0.48700161491544713,
    -0.1684059662402393, 0.37056410998929545, 1.0156889027029008, -0.5174422210625114,
    -0.5565834214413804, 0.778320596648391, -1.8970718197702225, 0.5229525761688676,
    -1.5515595563231523, 0.0182029289376123, -0.6820951356608795, -0.5987943422687668,
]
GOLDEN_UINT32 = [
    4059586549, 1052117029, 2817310706, 233405013, 1578775030, 1243308993, 826517535,
    2814630155, 3853314576, 718781857, 1239465936, 3876658295, 3649778518, 1172727096,
    2615979505, 1089444252, 3327114623, 75079301, 3380456901, 3433369789,
]


def _run(method, args=None):
    s = g.new_source(0)
    out = []
    for k in range(20):
        if args is None:
            out.append(method(s))
        else:
            out.append(method(s, args[k % len(args)]))
    return out


@pytest.mark.parametrize(
    ("method", "args", "golden"),
    [
        (g.exp_float64, None, GOLDEN_EXP),
        (g.float64_, None, GOLDEN_FLOAT64),
        (g.int63, None, GOLDEN_INT63),
        (g.int31, None, GOLDEN_INT31),
        (g.int31n, INT32S, GOLDEN_INT31N),
        (g.int63n, INT64S, GOLDEN_INT63N),
        (g.intn, INT64S, GOLDEN_INTN),
        (g.norm_float64, None, GOLDEN_NORM),
        (g.uint32, None, GOLDEN_UINT32),
    ],
    ids=[
        "ExpFloat64",
        "Float64",
        "Int63",
        "Int31",
        "Int31n",
        "Int63n",
        "Intn",
        "NormFloat64",
        "Uint32",
    ],
)
def test_regress_golden(method, args, golden):
    """Go's regress_test.go golden outputs are reproduced exactly (floats bit for bit)."""
    got = _run(method, args)
    assert got == golden


def test_cooked_table_matches_go_literals():
    """The recomputed rngCooked equals Go's literal table (rng.go; 64-bit form, spot values)."""
    c = g.RNG_COOKED
    assert c.dtype == np.int64 and c.shape == (607,)
    assert c[0] == -4181792142133755926
    assert c[1] == -4576982950128230565
    assert c[2] == 1395769623340756751
    assert c[3] == 5333664234075297259
    mask = np.int64(0x7FFFFFFFFFFFFFFF)
    # Older Go releases printed the table's low 63 bits; those literals must agree too.
    assert (c[300:303] & mask).tolist() == [
        2058427839513754051, 5133784708526867938, 8785882556301281247,
    ]
    assert (c[-3:] & mask).tolist() == [
        8382142935188824023, 9103922860780351547, 4152330101494654406,
    ]


def test_ziggurat_tables_match_go_literals():
    """Recomputed ziggurat tables equal Go's literals (exp.go, normal.go spot values)."""
    assert g.KE[:6].tolist() == [0xE290A139, 0x0, 0x9BEADEBC, 0xC377AC71, 0xD4DDB990, 0xDE893FB8]
    assert g.KE[-3:].tolist() == [0xF2CB0E3C, 0xEEEFB15D, 0xE6DA6ECF]
    assert g.KE[134] == 0xFE1C8289
    assert g.KN[:5].tolist() == [0x76AD2212, 0x0, 0x600F1B53, 0x6CE447A6, 0x725B46A2]
    assert g.KN[-3:].tolist() == [0x7BA90BDC, 0x7A722176, 0x77D664E5]
    assert g.KN[64] == 0x7EDDC78E
    f32 = np.float32
    assert g.WE.dtype == np.float32 and g.WN.dtype == np.float32
    assert g.WE[0] == f32(2.0249555e-09) and g.WE[1] == f32(1.486674e-11)
    assert g.WE[255] == f32(1.7921248e-09) and g.WE[20] == f32(1.03220314e-10)
    assert g.FE[1] == f32(0.9381437) and g.FE[255] == f32(0.00045413437)
    assert g.FE[191] == f32(0.069420435)
    assert g.WN[0] == f32(1.7290405e-09) and g.WN[127] == f32(1.6030948e-09)
    assert g.WN[20] == f32(4.1719309e-10)
    assert g.FN[1] == f32(0.9635997) and g.FN[127] == f32(0.0026696292)
    assert g.FN[101] == f32(0.104987256)


def test_seed_congruence_and_zero_seed():
    """Seeds congruent mod 2^31-1 give one stream; seed 0 is replaced (WL-14.1)."""
    m = (1 << 31) - 1
    a = g.new_source(42)
    b = g.new_source(42 + m)
    c = g.new_source(42 - 3 * m)
    assert [g.int63(a) for _ in range(50)] == [g.int63(b) for _ in range(50)]
    a = g.new_source(42)
    assert [g.int63(a) for _ in range(50)] == [g.int63(c) for _ in range(50)]
    z = g.new_source(0)
    r = g.new_source(89482311)
    assert [g.int63(z) for _ in range(10)] == [g.int63(r) for _ in range(10)]


def test_state_layout():
    """State is int64[609]: 607 register words then tap=0 and feed=334."""
    s = g.new_source(7)
    assert s.dtype == np.int64 and s.shape == (g.STATE_LEN,) == (609,)
    assert s[607] == 0 and s[608] == 334
    g.int63(s)
    assert s[607] == 606 and s[608] == 333


def test_subsystem_seeds():
    """ENG-8 / WL-14.2 vectors: fnv1a64 and XOR derivation, 'workload' keeps the seed."""
    assert g.fnv1a64("router") == 0xA0DBA500590B7544
    assert g.fnv1a64("workload-gen") == 0x623E21A6896FC55F
    assert g.subsystem_seed(42, "workload-gen") == 7079132663427089781
    assert g.subsystem_seed(42, "workload") == 42
    assert g.subsystem_seed(-1, "workload") == -1
    v = g.subsystem_seed(42, "router")
    assert -(1 << 63) <= v < (1 << 63)
    assert v == (42 ^ 0xA0DBA500590B7544) - (1 << 64)
