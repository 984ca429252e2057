"""A workload's clients resolved into the generation kernel's arrays (WL-5.1-5.4, WL-6).

``resolve_clients`` gives each client its row of ``GenClientCol`` integers (arrival process,
sampler ids, prefix group, session shape, lifecycle windows, request cap) and of
``GenRateCol`` floats, builds the flat sampler table (each distinct distribution once), and
marks what closed-loop conversion keeps of sessions (DELTA-49).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from blis_fast.errors import BlisInputError
from blis_fast.gofmt import go_quote
from blis_fast.gonum import INT64_MAX
from blis_fast.kernels.generation.generation_layout import (
    GEN_CLIENT_COLS,
    GEN_RATE_COLS,
    MM_SAMPLER_SLOTS,
    ClientParams,
)
from blis_fast.kernels.generation.generation_layout import GenClientCol as C
from blis_fast.kernels.generation.generation_layout import GenRateCol as F
from blis_fast.kernels.generation.samplers import ARRIVAL_FACTORY_POISSON, ARRIVAL_NORMALIZED_EXP
from blis_fast.workload.samplers import SAMPLER_ABSENT, SamplerSpec, arrival_params, build_sampler
from blis_fast.workload.spec import (
    DEFAULT_PREFIX_LENGTH,
    ClientSpec,
    LifecycleSpec,
    has_multi_turn,
    is_closed_loop,
)

_MM_NAMES = ("text", "image", "image count", "audio", "audio count", "video", "video count")
_MM_ATTRS = ("text_dist", "image_dist", "image_count_dist", "audio_dist", "audio_count_dist",
             "video_dist", "video_count_dist")


def _windows_overlap(a: LifecycleSpec | None, b: LifecycleSpec | None) -> bool:
    """Whether two clients can be active together (no windows = always on)."""
    if a is None or not a.windows or b is None or not b.windows:
        return True
    return any(
        wa.start_us < wb.end_us and wb.start_us < wa.end_us for wa in a.windows for wb in b.windows
    )


def normalize_rate_fractions(clients: list[ClientSpec], aggregate_rate: float) -> list[float]:
    """Per-client rates in requests/µs (WL-5.1; per co-active phase with lifecycles, DELTA-50)."""
    has_lifecycle = any(c.lifecycle is not None and c.lifecycle.windows for c in clients)
    if not has_lifecycle:
        total = 0.0
        for c in clients:
            total += c.rate_fraction
        if total == 0:
            return [0.0] * len(clients)
        return [aggregate_rate * (c.rate_fraction / total) / 1e6 for c in clients]
    rates = [0.0] * len(clients)
    # Clients sharing one lifecycle object (cohort members, inference-perf stages) overlap
    # the same set: compute each distinct lifecycle's co-active sum once.
    positive = [c for c in clients if c.rate_fraction > 0]
    cache: dict[int, float] = {}
    for i, ci in enumerate(clients):
        if ci.rate_fraction <= 0:
            continue
        key = id(ci.lifecycle) if ci.lifecycle is not None and ci.lifecycle.windows else 0
        co = cache.get(key)
        if co is None:
            co = 0.0
            for cj in positive:
                if _windows_overlap(ci.lifecycle, cj.lifecycle):
                    co += cj.rate_fraction
            cache[key] = co
        if co == 0:
            continue
        rates[i] = aggregate_rate * (ci.rate_fraction / co) / 1e6
    return rates


@dataclass
class SamplerTable:
    """The flat sampler table handed to the kernel, plus error texts of invalid samplers."""

    codes: list[int] = field(default_factory=list)
    offs: list[int] = field(default_factory=list)
    params: list[np.ndarray] = field(default_factory=list)
    specs: list[SamplerSpec] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    size: int = 0
    cache: dict = field(default_factory=dict)

    def add(self, dist, label: str) -> int:
        """Sampler id of ``dist`` (built once per distinct DistSpec object and label)."""
        key = (id(dist), label)
        hit = self.cache.get(key)
        if hit is not None:
            return hit
        smp = build_sampler(dist)
        sid = len(self.codes)
        self.codes.append(smp.code)
        self.offs.append(self.size)
        self.params.append(smp.params)
        self.specs.append(smp)
        self.labels.append(label)
        self.size += smp.params.shape[0]
        self.cache[key] = sid
        return sid

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The kernel's (codes, offsets, parameters); an empty table gives one absent sampler
        and one zero parameter (the kernel's arrays are never empty)."""
        sp = np.concatenate(self.params) if self.params else np.zeros(0)
        if sp.shape[0] == 0:
            sp = np.zeros(1, dtype=np.float64)
        if not self.codes:
            return (np.full(1, SAMPLER_ABSENT, dtype=np.int64), np.zeros(1, dtype=np.int64),
                    np.ascontiguousarray(sp, dtype=np.float64))
        return (np.asarray(self.codes, dtype=np.int64), np.asarray(self.offs, dtype=np.int64),
                np.ascontiguousarray(sp, dtype=np.float64))

    def error(self, client: ClientSpec, sid: int) -> BlisInputError:
        """The reference's message for invalid sampler ``sid`` met while generating ``client``."""
        return BlisInputError(
            f"client {go_quote(client.id)} {self.labels[sid]}: {self.specs[sid].error}"
        )


@dataclass
class ResolvedClients:
    """The kernel's ClientParams and what the generator needs beside them."""

    params: ClientParams
    samplers: SamplerTable
    group_of: np.ndarray  # prefix group per client, -1 = none
    prefix_capture_off: np.ndarray  # per client: its blueprint-prefix capture offset
    prefix_capture_len: int  # total length of the capture buffer


def _prefix_groups(clients: list[ClientSpec]) -> tuple[np.ndarray, list[int]]:
    """Each client's prefix group (-1: none) and each group's prefix length, groups numbered
    by first appearance."""
    group_index: dict[str, int] = {}
    group_len: list[int] = []
    group_of = np.full(len(clients), -1, dtype=np.int64)
    for i, c in enumerate(clients):
        if not c.prefix_group:
            continue
        if c.prefix_group not in group_index:
            group_index[c.prefix_group] = len(group_len)
            group_len.append(c.prefix_length if c.prefix_length > 0 else DEFAULT_PREFIX_LENGTH)
        group_of[i] = group_index[c.prefix_group]
    return group_of, group_len


def _closed_loop_claims(clients: list[ClientSpec]) -> tuple[set[str], set[str], dict[str, int]]:
    """Closed-loop conversion (WL-6.4, DELTA-49): rounds >= 1 of sessions generated by a client
    whose id is a closed-loop multi-turn client's id never reach the output (they are truncated
    away or filtered), so their tokens are drawn but not hashed. Returns those ids, the ids
    whose round 0 is kept for context accumulation, and per id the group-prefix length its
    blueprints capture."""
    cl_mt = [c for c in clients if is_closed_loop(c) and has_multi_turn(c)]
    cl_ids = {c.id for c in cl_mt}
    accum_ids = {c.id for c in cl_mt if c.reasoning.multi_turn.context_growth == "accumulate"}
    fcap_len: dict[str, int] = {}
    for c in cl_mt:
        if c.prefix_group and c.prefix_length > 0:
            fcap_len[c.id] = max(fcap_len.get(c.id, 0), c.prefix_length)
    return cl_ids, accum_ids, fcap_len


def resolve_clients(clients: list[ClientSpec], aggregate_rate: float, max_requests: int,
                    conversion: bool) -> ResolvedClients:
    """Per-client kernel parameters; ``conversion`` marks closed-loop sessions' later rounds
    as dropped (WL-6.4, DELTA-49)."""
    k_n = len(clients)
    rates = normalize_rate_fractions(clients, aggregate_rate)
    group_of, group_len = _prefix_groups(clients)
    cl_ids, accum_ids, fcap_len = _closed_loop_claims(clients if conversion else [])

    cap_std = int(max_requests)
    cap_mt = 0
    if max_requests > 0:
        cap_mt = 2 * int(max_requests)
        if cap_mt > INT64_MAX:
            cap_mt = INT64_MAX

    smp = SamplerTable()
    ci = np.zeros((k_n, GEN_CLIENT_COLS), dtype=np.int64)
    cf = np.zeros((k_n, GEN_RATE_COLS), dtype=np.float64)
    ci[:, C.GROUP] = group_of
    ci[:, C.REASON_RATIO] = SAMPLER_ABSENT
    ci[:, C.MM_TEXT : C.MM_TEXT + MM_SAMPLER_SLOTS] = SAMPLER_ABSENT
    win_start: list[int] = []
    win_end: list[int] = []
    fcap_off = np.zeros(k_n, dtype=np.int64)
    fcap_total = 0
    arr_cache: dict = {}
    for i, c in enumerate(clients):
        ci[i, C.WINDOW_FIRST] = len(win_start)
        if c.lifecycle is not None:
            for w in c.lifecycle.windows:
                win_start.append(int(w.start_us))
                win_end.append(int(w.end_us))
        ci[i, C.WINDOW_END] = len(win_start)
        if rates[i] <= 0:
            continue
        ci[i, C.ACTIVE] = 1
        fac = c.arrival_factory
        if fac is not None and fac.kind == "normalized_exponential":
            ci[i, C.ARRIVAL] = ARRIVAL_NORMALIZED_EXP
            ci[i, C.NORM_COUNT] = fac.count
            ci[i, C.NORM_DURATION] = fac.duration_us
        elif fac is not None:
            ci[i, C.ARRIVAL] = ARRIVAL_FACTORY_POISSON
            cf[i, F.RATE] = fac.rate_us
        else:
            key = (c.arrival.process, c.arrival.cv, rates[i])
            ap = arr_cache.get(key)
            if ap is None:
                ap = arr_cache[key] = arrival_params(c.arrival.process, c.arrival.cv, rates[i])
            ci[i, C.ARRIVAL], ci[i, C.IAT], cf[i, F.RATE], cf[i, F.P1], cf[i, F.P2] = ap
        ci[i, C.INPUT] = smp.add(c.input_dist, "input distribution")
        ci[i, C.OUTPUT] = smp.add(c.output_dist, "output distribution")
        if has_multi_turn(c):
            mt = c.reasoning.multi_turn
            ci[i, C.MULTI_TURN] = 1
            ci[i, C.ROUNDS] = mt.max_rounds
            ci[i, C.THINK] = mt.think_time_us
            ci[i, C.ACCUMULATE] = 1 if mt.context_growth == "accumulate" else 0
            ci[i, C.SINGLE_SESSION] = 1 if mt.single_session else 0
            ci[i, C.CAP] = cap_mt
            rr = c.reasoning.reason_ratio_dist
            if rr.type != "":
                ci[i, C.REASON_RATIO] = smp.add(rr, "reasoning: reason ratio distribution")
            if c.id in cl_ids:
                ci[i, C.DROP_LATER_ROUNDS] = 1
                ci[i, C.CAPTURE_ROUND0] = 1 if c.id in accum_ids else 0
                fc = fcap_len.get(c.id, 0)
                if fc > 0:
                    ci[i, C.PREFIX_CAPTURE] = fc
                    ci[i, C.PREFIX_CAPTURE_OFF] = fcap_total
                    fcap_off[i] = fcap_total
                    fcap_total += fc
        else:
            ci[i, C.CAP] = cap_std
            if c.multimodal is not None:
                ci[i, C.MULTIMODAL] = 1
                for j, attr in enumerate(_MM_ATTRS):
                    d = getattr(c.multimodal, attr)
                    if d.type != "":
                        ci[i, C.MM_TEXT + j] = smp.add(d, f"multimodal: {_MM_NAMES[j]} distribution")

    s_code, s_off, sp = smp.arrays()
    params = ClientParams(ci, cf, s_code, s_off, sp, np.asarray(win_start, dtype=np.int64),
                          np.asarray(win_end, dtype=np.int64),
                          np.asarray(group_len, dtype=np.int64))
    return ResolvedClients(params, smp, group_of, fcap_off, fcap_total)
