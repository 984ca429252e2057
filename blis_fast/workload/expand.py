"""Spec expansions that turn compact sources into clients: cohorts (WL-7.1/7.2, DELTA-54),
inference-perf (WL-8.1, DELTA-53) and ServeGen native data (WL-8.2, DELTA-57).
"""

from __future__ import annotations

import copy
import csv
import glob
import io
import json
import logging
import math
import os

from blis_fast.errors import BlisInputError
from blis_fast.files import MAX_TRACE_BYTES, read_input_text
from blis_fast.gofmt import go_pct_f, go_trim_space
from blis_fast.gonum import NumError, parse_float
from blis_fast.kernels.go.gomath import go_cos, go_f2i
from blis_fast.workload.spec import (
    ActiveWindow,
    ArrivalFactory,
    ArrivalSpec,
    ClientSpec,
    CohortSpec,
    DistSpec,
    DiurnalSpec,
    DrainSpec,
    InferencePerfSpec,
    LifecycleSpec,
    MultiTurnSpec,
    ReasoningSpec,
    ServeGenDataSpec,
    SpikeSpec,
    StageSpec,
    WorkloadSpec,
)

log = logging.getLogger("blis_fast")

US_PER_HOUR = 3_600_000_000


# --- cohorts ------------------------------------------------------------------------------------
def diurnal_windows(d: DiurnalSpec) -> list[ActiveWindow]:
    """24 hourly windows whose active length follows the cosine modulation (first day only)."""
    r = d.peak_to_trough_ratio
    out = []
    for h in range(24):
        angle = 2.0 * math.pi * float(h - d.peak_hour) / 24.0
        m = (1.0 + float(go_cos(angle))) / 2.0 * (1.0 - 1.0 / r) + 1.0 / r
        dur = int(go_f2i(float(US_PER_HOUR) * m))
        dur = min(dur, US_PER_HOUR)
        dur = max(dur, 1)
        out.append(ActiveWindow(h * US_PER_HOUR, h * US_PER_HOUR + dur))
    return out


def spike_window(s: SpikeSpec) -> ActiveWindow:
    """The single window ``[start, start + duration)``."""
    return ActiveWindow(s.start_time_us, s.start_time_us + s.duration_us)


def drain_windows(d: DrainSpec) -> list[ActiveWindow]:
    """A full window before the drain, then 10 segments active for (10-i)/10 of their length."""
    q = abs(d.ramp_duration_us) // 10  # Go integer division truncates toward zero
    seg = max(q if d.ramp_duration_us >= 0 else -q, 1)
    out = []
    if d.start_time_us > 0:
        out.append(ActiveWindow(0, d.start_time_us))
    for i in range(10):
        frac = float(10 - i) / 10.0
        start = d.start_time_us + i * seg
        active = max(int(go_f2i(float(seg) * frac)), 1)
        out.append(ActiveWindow(start, start + active))
    return out


def expand_cohorts(cohorts: list[CohortSpec], seed: int = 0) -> list[ClientSpec]:
    """``ExpandCohorts``: one client per member, ``rate_fraction / population`` each.

    (The reference also seeds a per-cohort RNG from ``seed`` that it never draws from.)
    """
    out: list[ClientSpec] = []
    for c in cohorts:
        if c.population <= 0:
            continue
        frac = c.rate_fraction / float(c.population)
        windows: list[ActiveWindow] = []
        if c.diurnal is not None:
            windows.extend(diurnal_windows(c.diurnal))
        if c.spike is not None:
            windows.append(spike_window(c.spike))
        if c.drain is not None:
            windows.extend(drain_windows(c.drain))
        lifecycle = LifecycleSpec(windows) if windows else None
        for j in range(c.population):
            out.append(
                ClientSpec(
                    id=f"{c.id}-{j}",
                    tenant_id=c.tenant_id,
                    slo_class=c.slo_class,
                    model=c.model,
                    adapter=c.adapter,
                    rate_fraction=frac,
                    arrival=c.arrival,
                    input_dist=c.input_dist,
                    output_dist=c.output_dist,
                    prefix_group=c.prefix_group,
                    streaming=c.streaming,
                    prefix_length=c.prefix_length,
                    reasoning=c.reasoning,
                    closed_loop=c.closed_loop,
                    timeout=c.timeout,
                    network=c.network,
                    multimodal=c.multimodal,
                    lifecycle=lifecycle,
                )
            )
    return out


# --- inference-perf -----------------------------------------------------------------------------
def validate_inference_perf(ip: InferencePerfSpec) -> None:
    """``validateInferencePerfSpec`` (messages without the caller's wrapping)."""
    if not ip.stages:
        raise ValueError("inference_perf: at least one stage required")
    for i, st in enumerate(ip.stages):
        if st.duration <= 0:
            raise ValueError(
                f"inference_perf.stages[{i}]: duration must be positive, got {st.duration}"
            )
        if st.rate <= 0 or math.isnan(st.rate) or math.isinf(st.rate):
            raise ValueError(
                f"inference_perf.stages[{i}]: rate must be a finite positive number, got "
                f"{go_pct_f(st.rate)}"
            )
    sp = ip.shared_prefix
    if sp is None:
        raise ValueError("inference_perf: shared_prefix is required")
    for name in ("num_unique_system_prompts", "num_users_per_system_prompt"):
        v = getattr(sp, name)
        if v <= 0:
            raise ValueError(f"inference_perf.shared_prefix: {name} must be positive, got {v}")
    for name in ("system_prompt_len", "question_len", "output_len"):
        v = getattr(sp, name)
        if v < 0:
            raise ValueError(f"inference_perf.shared_prefix: {name} must be non-negative, got {v}")


def distribute_evenly(total: int, n: int) -> list[int]:
    """``distributeRequestsEvenly``: ``total // n`` each, the first ``total % n`` get one more."""
    base, rem = divmod(total, n)
    return [base + (1 if i < rem else 0) for i in range(n)]


def _constant(value: int) -> DistSpec:
    return DistSpec("constant", {"value": float(value)})


def _reasoning(rate: float, n: int, rounds: int) -> ReasoningSpec:
    """``computeReasoningSpec``: single session, no growth, think time n/rate seconds."""
    think = int(go_f2i(float(n) / rate * 1e6))
    return ReasoningSpec(
        reason_ratio_dist=DistSpec("constant", {"value": 0.0}),
        multi_turn=MultiTurnSpec(max_rounds=rounds, think_time_us=think, context_growth="",
                                 single_session=True),
    )


def _stage_total(i: int, st: StageSpec) -> int:
    total = int(go_f2i(st.rate * float(st.duration)))
    if total < 1:
        raise ValueError(
            f"inference_perf.stages[{i}]: rate {st.rate:.4f} × duration {st.duration} produces "
            f"{total} requests (< 1); increase rate or duration"
        )
    return total


def expand_inference_perf(ip: InferencePerfSpec, seed: int = 0) -> WorkloadSpec:
    """``ExpandInferencePerfSpec`` (DELTA-53); raises ValueError with the reference's text."""
    try:
        validate_inference_perf(ip)
    except ValueError as exc:
        raise ValueError(f"validating inference-perf spec: {exc}") from None
    sp = ip.shared_prefix
    n_p, n_u = sp.num_unique_system_prompts, sp.num_users_per_system_prompt
    n = n_p * n_u
    in_d, out_d = _constant(sp.question_len), _constant(sp.output_len)
    category = "reasoning" if sp.enable_multi_turn_chat else "language"
    clients: list[ClientSpec] = []

    def client(cid, grp, frac, **kw) -> ClientSpec:
        return ClientSpec(id=cid, tenant_id=grp, slo_class="standard", rate_fraction=frac,
                          arrival=ArrivalSpec("poisson"), input_dist=copy.deepcopy(in_d),
                          output_dist=copy.deepcopy(out_d), prefix_group=grp,
                          prefix_length=sp.system_prompt_len, **kw)

    if len(ip.stages) == 1:
        st = ip.stages[0]
        agg = st.rate
        frac = 1.0 / float(n)
        total = _stage_total(0, st)
        share = distribute_evenly(total, n)
        dur_us = st.duration * 1_000_000
        if not sp.enable_multi_turn_chat and n > 1_000_000:
            raise ValueError(f"total client count {n} exceeds safety limit (1M)")
        idx = 0
        for p in range(n_p):
            grp = f"prompt-{p}"
            for u in range(n_u):
                cid = f"prompt-{p}-user-{u}"
                if sp.enable_multi_turn_chat:
                    clients.append(client(cid, grp, frac, reasoning=_reasoning(st.rate, n, share[idx])))
                else:
                    cnt = share[idx]
                    if cnt <= 0:
                        raise ValueError(
                            f"inference_perf: client {cid} got 0 requests (totalRequests={total} "
                            f"< numClients={n}); increase rate or duration"
                        )
                    if cnt > 10_000_000:
                        raise ValueError(
                            f"inference_perf: requestsPerClient {cnt} exceeds safety limit (10M); "
                            "reduce rate, duration, or increase clients"
                        )
                    if dur_us < cnt:
                        raise ValueError(
                            f"inference_perf: durationUs ({dur_us}) < requestsPerClient ({cnt}) "
                            "produces degenerate distribution"
                        )
                    clients.append(client(
                        cid, grp, frac,
                        arrival_factory=ArrivalFactory("normalized_exponential", count=cnt,
                                                       duration_us=dur_us)))
                idx += 1
    else:
        windows = []
        off = 0
        for st in ip.stages:
            d = st.duration * 1_000_000
            windows.append(ActiveWindow(off, off + d))
            off += d
        agg = 0.0
        for st in ip.stages:
            agg += st.rate
        for s, st in enumerate(ip.stages):
            per_rate = st.rate / float(n) / 1e6
            life = LifecycleSpec([windows[s]])
            share = distribute_evenly(_stage_total(s, st), n) if sp.enable_multi_turn_chat else None
            idx = 0
            for p in range(n_p):
                grp = f"prompt-{p}"
                for u in range(n_u):
                    cid = f"stage-{s}-prompt-{p}-user-{u}"
                    extra = {}
                    if share is not None:
                        extra["reasoning"] = _reasoning(st.rate, n, share[idx])
                    clients.append(client(
                        cid, grp, 1.0, lifecycle=life,
                        arrival_factory=ArrivalFactory("poisson", rate_us=per_rate), **extra))
                    idx += 1
    return WorkloadSpec(version="2", seed=seed, category=category, aggregate_rate=agg,
                        clients=clients)


# --- ServeGen native data -----------------------------------------------------------------------
def parse_servegen_pdf(s: str) -> dict[int, float]:
    """``parseServeGenPDF``: Python-dict text ``{100: 0.5, 200: 3e-4,}`` -> {int: prob}."""
    s = s.strip()
    if not (s.startswith("{") and s.endswith("}")):
        raise ValueError(
            f"expected dict string starting with '{{' and ending with '}}', got: {s[:40]}"
        )
    s = s[1:-1].strip()
    if s == "":
        raise ValueError("empty PDF dictionary")
    pdf: dict[int, float] = {}
    for pair in s.split(","):
        pair = go_trim_space(pair)
        if pair == "":
            continue
        parts = pair.split(":", 1)
        if len(parts) != 2:
            raise ValueError(f"invalid key:value pair: {pair!r}")
        ks, vs = go_trim_space(parts[0]), go_trim_space(parts[1])
        try:
            kf = parse_float(ks)
        except NumError:
            raise ValueError(f"invalid key {ks!r}") from None
        key = int(go_f2i(kf))
        try:
            val = parse_float(vs)
        except NumError:
            raise ValueError(f"invalid value {vs!r} for key {key}") from None
        pdf[key] = val
    if not pdf:
        raise ValueError("no valid entries in PDF dictionary")
    return pdf


def _read_servegen_trace(path: str) -> list[tuple[float, float, float, str]]:
    """Rows (start_s, rate, cv, pattern); short or unparsable rows are skipped with a warning."""
    rows = []
    skipped = 0
    width = None
    text = read_input_text(path, MAX_TRACE_BYTES, universal_newlines=False)
    for lineno, rec in enumerate(csv.reader(io.StringIO(text, newline="")), start=1):
        if not rec:
            continue
        if width is None:
            width = len(rec)
        elif len(rec) != width:
            raise ValueError(
                f"reading trace CSV: record on line {lineno}: wrong number of fields"
            )
        if len(rec) < 4:
            skipped += 1
            continue
        try:
            vals = [parse_float(go_trim_space(rec[i])) for i in range(3)]
        except NumError:
            skipped += 1
            continue
        rows.append((vals[0], vals[1], vals[2], rec[3].strip()))
    if skipped:
        log.warning(
            "parseServeGenTrace: %d rows in %s were skipped (short rows or parse errors)",
            skipped, path,
        )
    return rows


def _load_servegen_dataset(path: str, sg: ServeGenDataSpec) -> tuple[dict, dict]:
    try:
        data = json.loads(read_input_text(path))
    except OSError as exc:
        raise ValueError(f"reading dataset: open {path}: {(exc.strerror or str(exc)).lower()}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"parsing dataset JSON: {exc}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict) or any(
        not (v is None or (isinstance(v, dict)
                           and all(x is None or isinstance(x, str) for x in v.values())))
        for v in data.values()
    ):
        raise ValueError("parsing dataset JSON: json: cannot unmarshal into Go value of type "
                         "map[string]map[string]string")
    in_s = out_s = ""
    for k in sorted(data):
        try:
            start = parse_float(k)
        except NumError:
            log.warning("loadServeGenDataset: skipping non-numeric key %r", k)
            continue
        if sg.span_start > 0 and start < float(sg.span_start):
            continue
        if sg.span_end > 0 and start >= float(sg.span_end):
            continue
        window = data[k] or {}
        in_s = window.get("input_tokens") or ""
        out_s = window.get("output_tokens") or ""
        if in_s not in ("", "{}") and out_s not in ("", "{}"):
            break
    if in_s in ("", "{}") or out_s in ("", "{}"):
        raise ValueError("no valid PDF windows found in dataset")
    try:
        in_pdf = parse_servegen_pdf(in_s)
    except ValueError as exc:
        raise ValueError(f"parsing input PDF: {exc}") from None
    try:
        out_pdf = parse_servegen_pdf(out_s)
    except ValueError as exc:
        raise ValueError(f"parsing output PDF: {exc}") from None
    return in_pdf, out_pdf


def load_servegen_clients(sg: ServeGenDataSpec) -> list[ClientSpec]:
    """``loadServeGenData``: one client per active chunk (best-rate window, empirical PDFs)."""
    files = sorted(glob.glob(os.path.join(glob.escape(sg.path), "chunk-*-trace.csv")))
    if not files:
        raise ValueError(f"no chunk-*-trace.csv files found in {sg.path}")
    out: list[ClientSpec] = []
    for trace in files:
        base = os.path.basename(trace)
        chunk = base[len("chunk-"):] if base.startswith("chunk-") else base
        chunk = chunk[: -len("-trace.csv")] if chunk.endswith("-trace.csv") else chunk
        dataset = os.path.join(sg.path, f"chunk-{chunk}-dataset.json")
        try:
            rows = _read_servegen_trace(trace)
            best = (0.0, 0.0, 0.0, "")
            for row in rows:
                if sg.span_start > 0 and row[0] < float(sg.span_start):
                    continue
                if sg.span_end > 0 and row[0] >= float(sg.span_end):
                    continue
                if row[1] > best[1]:
                    best = row
            if best[1] <= 0:
                continue
            in_pdf, out_pdf = _load_servegen_dataset(dataset, sg)
        except OSError as exc:
            raise ValueError(f"loading chunk {chunk}: opening trace: {exc}") from None
        except ValueError as exc:
            raise ValueError(f"loading chunk {chunk}: {exc}") from None
        arrival = ArrivalSpec("poisson")
        pattern = best[3].lower()
        if best[3] and pattern in ("gamma", "weibull"):
            arrival = ArrivalSpec(pattern, cv=best[2])
        out.append(ClientSpec(
            id=f"servegen-chunk-{chunk}", tenant_id=f"chunk-{chunk}", rate_fraction=best[1],
            arrival=arrival,
            input_dist=DistSpec("empirical", {str(k): v for k, v in in_pdf.items()}),
            output_dist=DistSpec("empirical", {str(k): v for k, v in out_pdf.items()}),
        ))
    if not out:
        raise ValueError(f"no valid chunks found in {sg.path}")
    return out


def expand_sources(spec: WorkloadSpec) -> WorkloadSpec:
    """Steps 1-2 of WL-4.6 on a copy of ``spec``: exclusivity, inference-perf, ServeGen."""
    names = []
    if spec.clients:
        names.append("clients")
    if spec.servegen_data is not None:
        names.append("servegen_data")
    if spec.inference_perf is not None:
        names.append("inference_perf")
    if len(names) > 1:
        raise BlisInputError(
            f"workload sources {{{', '.join(names)}}} are mutually exclusive; specify exactly "
            "one of: clients, servegen_data, inference_perf"
        )
    out = copy.copy(spec)
    out.clients = list(spec.clients)
    if spec.inference_perf is not None and not spec.clients:
        try:
            ex = expand_inference_perf(spec.inference_perf, spec.seed)
        except ValueError as exc:
            raise BlisInputError(f"expanding inference-perf spec: {exc}") from None
        out.clients = ex.clients
        if not out.category:
            out.category = ex.category
        if spec.aggregate_rate > 0 and spec.aggregate_rate != ex.aggregate_rate:
            log.warning("overriding aggregate_rate %.2f with sum of stage rates %.2f",
                        spec.aggregate_rate, ex.aggregate_rate)
        out.aggregate_rate = ex.aggregate_rate
    if spec.servegen_data is not None and not out.clients:
        try:
            out.clients = load_servegen_clients(spec.servegen_data)
        except ValueError as exc:
            raise BlisInputError(f"loading ServeGen data: {exc}") from None
    return out
