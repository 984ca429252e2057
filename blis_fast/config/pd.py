"""Prefill/decode disaggregation: the P/D flags checked in the reference's order (PD-1.2) and
resolved into ``PDConfig``, the pools' layout and the KV link the engine runs with.

The checks run where the reference runs them (``runner.prepare``): ``check_encode`` before
the policies for ``blis replay``, ``validate_pd`` after the policies, ``check_construction``
last, before the kernel. ``blis run`` and ``blis replay`` differ in order and in which
"has no effect" cases are warnings (run) or refusals (replay).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from blis_fast.config.hardware import get_hw_config
from blis_fast.config.kv_capacity import (
    calculate_kv_blocks,
    extract_kv_capacity_params,
    kv_bytes_per_token,
)
from blis_fast.config.latency import pack_latency_params
from blis_fast.config.latency_backends import LATENCY_BACKENDS
from blis_fast.config.model_config import parse_hf_config
from blis_fast.config.pd_mode import pd_mode_on
from blis_fast.config.policy_bundle import parse_scorer_list
from blis_fast.errors import BlisConfigError
from blis_fast.gofmt import go_pct_f, go_quote
from blis_fast.options import TIME_LIMIT_US, check_options
from blis_fast.policies.deciders import DECIDERS, ENCODE_DECIDERS

ROLE_PREFILL, ROLE_DECODE, ROLE_ENCODE = 1, 2, 4
"""Pool role bits of an instance (PD-2); a shared instance has both prefill and decode."""

PER_POOL_FLAGS = ("prefill-tp", "decode-tp", "prefill-hardware", "decode-hardware",
                  "prefill-latency-model", "decode-latency-model", "prefill-max-model-len",
                  "decode-max-model-len")
"""The per-pool configuration flags (PD-1.2): they apply only with a prefill pool."""


@dataclass(frozen=True)
class PDConfig:
    """The P/D layout and parameters of a run (all counts 0: P/D off)."""

    prefill: int = 0
    decode: int = 0
    shared: int = 0
    encode: int = 0
    decider: str = "never"
    threshold: int = 16
    encode_decider: str = "never"
    bandwidth_gbps: float = 25.0
    base_latency_ms: float = 0.05
    contention: bool = False
    block_bytes: float = 0.0  # KV bytes of one block at the prefill TP (transfer sizing)
    prefill_scorers: tuple[tuple[str, float], ...] = ()
    decode_scorers: tuple[tuple[str, float], ...] = ()
    warnings: tuple[str, ...] = ()

    @property
    def on(self) -> bool:
        """P/D mode (the rule in pd_mode)."""
        return pd_mode_on(self.prefill, self.decode, self.shared)

    def roles(self, n_instances: int) -> np.ndarray:
        """Each instance's role bits by index: prefill, decode, shared, encode, then role 0."""
        roles = np.zeros(n_instances, np.int8)
        p, d, s, e = self.prefill, self.decode, self.shared, self.encode
        roles[:p] = ROLE_PREFILL
        roles[p:p + d] = ROLE_DECODE
        roles[p + d:p + d + s] = ROLE_PREFILL | ROLE_DECODE
        roles[p + d + s:p + d + s + e] = ROLE_ENCODE
        return roles


def _fail(message: str) -> None:
    raise BlisConfigError(message)


def _decider_known(name: str) -> bool:

    return name == "" or name in DECIDERS


def check_encode(opts: Any) -> list[str]:
    """The encode-pool checks (PD-1.2 step 8); returns the warnings."""
    e, dec = opts.encode_instances, opts.encode_decider
    if e < 0:
        _fail(f"--encode-instances must be >= 0, got {e}")
    if dec != "" and dec not in ENCODE_DECIDERS:
        _fail(f"Unknown encode decider {go_quote(dec)}. Valid: "
              + ", ".join(ENCODE_DECIDERS.valid_names()))
    if dec not in ("", "never") and e == 0:
        _fail(f"--encode-decider={go_quote(dec)} requires --encode-instances > 0 (the encode "
              "pool is disabled)")
    if e > 0 and dec in ("", "never"):
        return [f"--encode-decider={go_quote(dec)} has no effect because --encode-instances={e} "
                "but the decider never encodes; set --encode-decider=multimodal or always to "
                "activate the encode pool"]
    return []


def topology_error(p: int, d: int, s: int, e: int, n: int) -> str | None:
    """The first problem of a pool layout (PD-2, ``ValidatePoolTopology``), or None."""
    for name, v in (("prefill", p), ("decode", d), ("prefill-decode", s), ("encode", e)):
        if v < 0:
            return f"{name}-instances must be >= 0, got {v}"
    if p == d == s == e == 0:
        return None
    if p == d == s == 0:
        return (f"encode-instances ({e}) requires a decode-capable pool: set "
                "--prefill-instances, --decode-instances, or --prefill-decode-instances > 0")
    if s == 0 and (p == 0) != (d == 0):
        return ("both --prefill-instances and --decode-instances must be set when PD "
                "disaggregation is enabled without shared-role pods "
                f"(got prefill={p}, decode={d})")
    if p + d + s + e > n:
        return (f"prefill-instances ({p}) + decode-instances ({d}) + prefill-decode-instances "
                f"({s}) + encode-instances ({e}) = {p + d + s + e} exceeds num-instances ({n})")
    return None


def _pool_scorers(opts: Any, pool: str, allow_custom: bool) -> tuple[tuple[str, float], ...]:

    text = getattr(opts, f"{pool}_routing_scorers")
    try:
        return tuple(parse_scorer_list(text, allow_custom=allow_custom))
    except BlisConfigError as exc:
        detail = str(exc).removeprefix("Invalid --routing-scorers: ")
        raise BlisConfigError(f"Invalid --{pool}-routing-scorers: {detail}") from None


def _check_pool_flags(opts: Any) -> None:
    """Per-pool TP, latency model and max-model-len, prefill then decode (PD-1.2 step 10)."""
    for pool in ("prefill", "decode"):
        tp = getattr(opts, f"{pool}_tp")
        if opts.given(f"{pool}_tp") and tp <= 0:
            _fail(f"--{pool}-tp must be > 0, got {tp}")
        backend = getattr(opts, f"{pool}_latency_model")
        if backend and backend not in LATENCY_BACKENDS:
            _fail(f"--{pool}-latency-model {go_quote(backend)} is not a recognized backend; "
                  "valid: " + ", ".join(LATENCY_BACKENDS.valid_names()))
        max_len = getattr(opts, f"{pool}_max_model_len")
        if opts.given(f"{pool}_max_model_len") and max_len <= 0:
            _fail(f"--{pool}-max-model-len must be > 0 when set, got {max_len}")


def validate_pd(opts: Any, replay: bool = False, allow_custom: bool = False,
                encode_warnings: list[str] | None = None) -> PDConfig:
    """The P/D checks after the policies (PD-1.2 steps 1-11, ``blis run`` or ``blis
    replay`` order); the first failure raises BlisConfigError. For replay, ``check_encode``
    ran before the policies and ``encode_warnings`` are its warnings."""
    check_options(opts, "pd")
    warnings: list[str] = []
    decider = opts.pd_decider
    if not _decider_known(decider):
        _fail(f"Unknown PD decider {go_quote(decider)}. Valid: "
              + ", ".join(DECIDERS.valid_names()))
    p, d, s, e = (opts.prefill_instances, opts.decode_instances, opts.prefill_decode_instances,
                  opts.encode_instances)
    problem = topology_error(p, d, s, e, opts.num_instances)
    if problem:
        _fail(f"Invalid PD pool topology: {problem}")
    bw, base = opts.pd_transfer_bandwidth, opts.pd_transfer_base_latency
    if p > 0:
        if not (bw > 0) or math.isinf(bw):
            _fail(f"--pd-transfer-bandwidth must be a finite positive number, got {go_pct_f(bw)}")
        if not (base >= 0) or math.isinf(base):
            _fail("--pd-transfer-base-latency must be a finite non-negative number, got "
                  f"{go_pct_f(base)}")
    threshold = opts.pd_prefix_threshold
    if decider == "prefix-threshold" and threshold < 0:
        _fail(f"--pd-prefix-threshold must be >= 0, got {threshold}")
    if opts.given("pd_prefix_threshold") and decider != "prefix-threshold":
        if replay:
            _fail(f"--pd-prefix-threshold={threshold} has no effect when "
                  f"--pd-decider={go_quote(decider)} (only applies to the prefix-threshold "
                  "decider); remove the flag or set --pd-decider=prefix-threshold")
        warnings.append(f"--pd-prefix-threshold={threshold} is ignored when "
                        f"--pd-decider={go_quote(decider)} (only applies to the "
                        "prefix-threshold decider)")
    if decider not in ("", "never") and p == 0 and s > 0 and not replay:
        warnings.append(  # D9: the reference's own text says the decider has no effect
            f"with --prefill-instances=0 and --prefill-decode-instances={s} the decider acts "
            "on the shared pods; per-pool flags are ignored and --pd-transfer-bandwidth/"
            "--pd-transfer-base-latency are not checked (reference behaviour)")
    elif decider not in ("", "never") and p == 0:
        if replay:
            _fail(f"--pd-decider={go_quote(decider)} has no effect because --prefill-instances=0 "
                  "(disaggregation is disabled); set --prefill-instances > 0 and "
                  "--decode-instances > 0, or omit --pd-decider")
        warnings.append(f"--pd-decider={go_quote(decider)} has no effect because "
                        "--prefill-instances=0 (disaggregation is disabled); set "
                        "--prefill-instances and --decode-instances to enable")
    warnings += check_encode(opts) if encode_warnings is None else encode_warnings
    pool_flags = any(opts.given(flag.replace("-", "_")) for flag in PER_POOL_FLAGS)
    if pool_flags and p == 0:
        if replay:
            _fail("per-pool hardware flags (--prefill-tp, --decode-tp, etc.) have no effect when "
                  "--prefill-instances=0 (disaggregation is disabled); either set "
                  "--prefill-instances > 0 or remove the per-pool flags")
        warnings.append("per-pool hardware flags (--prefill-tp, --decode-tp, etc.) have no "
                        "effect when --prefill-instances=0 (disaggregation is disabled)")
    if p > 0:
        _check_pool_flags(opts)
    return PDConfig(
        prefill=p, decode=d, shared=s, encode=e, decider=decider or "never",
        threshold=threshold, encode_decider=opts.encode_decider or "never",
        bandwidth_gbps=bw, base_latency_ms=base, contention=opts.pd_transfer_contention,
        prefill_scorers=_pool_scorers(opts, "prefill", allow_custom),
        decode_scorers=_pool_scorers(opts, "decode", allow_custom),
        warnings=tuple(warnings))


def config_warnings(opts: Any, pd: PDConfig, global_backend: str = "") -> list[str]:
    """Warnings about reference behaviour a P/D configuration runs into (README, "known
    reference behaviour"): the shared round-robin counter (D1), per-pool GPUs that change only
    the KV capacity (D8), per-pool backends that reuse the global coefficients (D10), per-pool
    scorers without pools (D11)."""
    out: list[str] = []
    if not pd.on:
        for pool in ("prefill", "decode"):
            if getattr(pd, f"{pool}_scorers"):
                out.append(f"--{pool}-routing-scorers has no effect without P/D pools "
                           "(--prefill-instances, --decode-instances or "
                           "--prefill-decode-instances)")
        return out
    roles = pd.roles(opts.num_instances)
    pools = (int(np.count_nonzero(roles & ROLE_PREFILL)),
             int(np.count_nonzero(roles & ROLE_DECODE)))
    if (opts.routing_policy in ("", "round-robin") and pd.decider != "never"
            and any(size % 2 == 0 for size in pools)):
        out.append("P/D with --routing-policy round-robin: the decode and prefill picks share "
                   "one round-robin counter (reference behaviour), which can leave instances "
                   "of a pool without work; set another --routing-policy")
    for pool in ("prefill", "decode"):
        if pd.prefill > 0 and opts.given(f"{pool}_hardware"):
            gpu = getattr(opts, f"{pool}_hardware")
            out.append(f"--{pool}-hardware {gpu} changes the {pool} pool's KV capacity and "
                       "GPU label only; its step times use the --hardware calibration "
                       "(reference behaviour)")
    for pool in ("prefill", "decode"):
        backend = pool_backend(opts, pd, pool, global_backend)
        if global_backend and backend != global_backend:
            out.append(f"--{pool}-latency-model {backend} times the {pool} pool with the "
                       f"coefficients resolved for --latency-model {global_backend} (alpha "
                       "and beta), not coefficients of its own (reference behaviour)")
    return out


def check_construction(opts: Any, pd: PDConfig) -> None:
    """The cluster's construction checks (PD-1.2, ``NewClusterSimulator``), and what
    blis_fast does not support with P/D; the last checks before the kernel."""
    if opts.pd_transfer_contention and not pd.on:
        _fail("ClusterSimulator: PDTransferContention requires PD disaggregation "
              "(--prefill-instances, --decode-instances, or --prefill-decode-instances must be "
              "set)")
    if pd.on and opts.kv_cpu_blocks > 0:
        _fail("--kv-cpu-blocks is not supported with P/D disaggregation")
    if not pd.on:
        return
    # parts of the reference's P/D that blis_fast does not run yet: refused, never ignored
    if pd.encode > 0:
        _fail("--encode-instances is not supported yet with P/D disaggregation")


def pool_tp(opts: Any, pd: PDConfig, pool: str, global_tp: int) -> int:
    """A pool's TP: ``--<pool>-tp`` when given with a prefill pool, else the global TP."""
    if pd.prefill > 0 and opts.given(f"{pool}_tp"):
        return int(getattr(opts, f"{pool}_tp"))
    return global_tp


def with_transfer_sizing(pd: PDConfig, opts: Any, latency: Any) -> PDConfig:
    """``pd`` with the KV bytes of one block at the prefill pool's TP (PD-3.9), from the
    model's architecture; a model without one is refused."""
    from dataclasses import replace

    if latency.model_config is None:
        _fail("P/D disaggregation needs the model's architecture for KV transfer sizing; "
              f"--latency-model {latency.backend} has none (not supported yet)")
    per_token = kv_bytes_per_token(latency.model_config,  # August rule: explicit head_dim
                                   pool_tp(opts, pd, "prefill", latency.tp),
                                   explicit_head_dim=True)
    return replace(pd, block_bytes=float(opts.block_size_in_tokens) * per_token)


def check_transfer_range(pd: PDConfig, kv_blocks: tuple[int, ...], num_requests: int) -> None:
    """Refuse transfer figures whose longest KV transfer (every block of the largest
    instance, sharing the link with every request under contention) is beyond the simulator's
    time range: the reference's float-to-int conversion turns such a transfer into 1 µs, the
    fastest of all."""
    base_us = pd.base_latency_ms * 1000.0
    if base_us > TIME_LIMIT_US:
        _fail(f"--pd-transfer-base-latency {pd.base_latency_ms:g} ms is beyond the simulator's "
              "time range")
    sharing = max(num_requests, 1) if pd.contention else 1
    longest = base_us + max(kv_blocks, default=0) * pd.block_bytes / (pd.bandwidth_gbps * 1000.0)
    if longest * sharing > TIME_LIMIT_US:
        _fail(f"--pd-transfer-bandwidth {pd.bandwidth_gbps:g} GB/s makes a KV transfer longer "
              "than the simulator's time range")


@dataclass(frozen=True)
class PoolClasses:
    """Per-instance configuration of a P/D run (PD-1.7): latency backend and parameters per
    class (0 = global, 1 = prefill pool, 2 = decode and shared pods), each instance's class,
    KV blocks and max model length."""

    params: np.ndarray  # float64 [classes, P]: each class's packed latency parameters
    codes: tuple[int, ...]  # each class's latency backend code
    instance_class: tuple[int, ...]
    kv_blocks: tuple[int, ...]
    max_model_len: tuple[int, ...]
    warnings: tuple[str, ...] = ()

    def engine_fields(self) -> dict[str, Any]:
        """The ``EngineConfig`` fields these overrides set."""
        return {"latency_class_params": self.params,
                "latency_class_codes": self.codes,
                "instance_latency_class": self.instance_class,
                "instance_kv_blocks": self.kv_blocks,
                "instance_max_model_len": self.max_model_len}


def pool_backend(opts: Any, pd: PDConfig, pool: str, global_backend: str) -> str:
    """A pool's latency backend: ``--<pool>-latency-model`` when given (not empty) with a
    prefill pool, else the global one."""
    backend = getattr(opts, f"{pool}_latency_model")
    if pd.prefill > 0 and opts.given(f"{pool}_latency_model") and backend:
        return str(backend)
    return global_backend


def resolve_pools(pd: PDConfig, opts: Any, latency: Any) -> PoolClasses:
    """The per-pool overrides (``deployment.go: resolveConfigForRole``, ``cmd/root.go``'s
    per-pool KV calculation): a pool whose TP or GPU differs from the global one gets the KV
    blocks computed for it (when the *global* backend is roofline or trained-physics; its GPU
    changes nothing else: step times keep the global hardware calibration) and, unless set, a
    max model length capped by them. A pool's TP or backend repacks its latency parameters
    from the global coefficients, model and hardware (a pool backend looks up no
    coefficients of its own, ``resolve.go: ResolvePoolConfig``)."""
    warnings: list[str] = []
    rows = [np.asarray(latency.params, np.float64)]
    codes = [int(latency.code)]
    pack_warnings: list[str] = []
    blocks = [latency.total_kv_blocks]
    max_len = [latency.max_model_len]
    kv_params = None
    per_pool_kv = latency.backend in ("roofline", "trained-physics") and pd.prefill > 0
    if per_pool_kv:
        import os

        try:
            hf = parse_hf_config(os.path.join(latency.model_config_folder, "config.json"))
        except Exception as exc:  # noqa: BLE001 - the reference's message carries the cause
            _fail(f"Failed to parse HuggingFace config for per-pool KV calc: {exc}")
        try:
            kv_params = extract_kv_capacity_params(hf)
        except BlisConfigError as exc:
            warnings.append(f"per-pool KV calculation skipped: no KV capacity parameters ({exc})")
            per_pool_kv = False
    for pool in ("prefill", "decode"):
        tp = pool_tp(opts, pd, pool, latency.tp)
        gpu = latency.gpu
        if pd.prefill > 0 and opts.given(f"{pool}_hardware"):
            gpu = getattr(opts, f"{pool}_hardware")
        n_blocks, n_len = latency.total_kv_blocks, latency.max_model_len
        if per_pool_kv and (tp != latency.tp or gpu != latency.gpu):
            try:
                hw = get_hw_config(latency.hardware_config_path, gpu)
            except BlisConfigError:
                warnings.append(f"--{pool}-hardware {gpu}: no hardware entry; the {pool} pool "
                                "keeps the global KV blocks")
            else:
                if hw.memory_gib <= 0:
                    warnings.append(f"--{pool}-hardware {gpu}: no GPU memory; the {pool} pool "
                                    "keeps the global KV blocks")
                else:
                    try:
                        n_blocks = calculate_kv_blocks(
                            latency.model_config, hw, tp, opts.block_size_in_tokens,
                            opts.gpu_memory_utilization, kv_params,
                            explicit_head_dim=True,
                            reserved_bytes=latency.lora_reserved_bytes)  # LORA-6.3
                    except BlisConfigError as exc:
                        _fail(f"--{pool}-tp/--{pool}-hardware: KV capacity auto-calculation "
                              f"failed for {pool} pool: {exc}")
                    cap = n_blocks * opts.block_size_in_tokens
                    if not opts.given(f"{pool}_max_model_len") and cap < n_len:
                        n_len = cap
        if pd.prefill > 0 and opts.given(f"{pool}_max_model_len"):
            n_len = int(getattr(opts, f"{pool}_max_model_len"))
        backend = pool_backend(opts, pd, pool, latency.backend)
        params, code = rows[0], latency.code
        if tp != latency.tp or backend != latency.backend:
            try:
                code, _alpha, params = pack_latency_params(
                    backend, latency.alpha, latency.beta, latency.model_config,
                    latency.hardware, tp, pack_warnings)
            except BlisConfigError as exc:
                if backend == latency.backend:
                    raise
                raise BlisConfigError(
                    f"--{pool}-latency-model {backend}: {exc} (a pool's backend takes the "
                    f"coefficients resolved for --latency-model {latency.backend})") from None
        rows.append(np.asarray(params, np.float64))
        codes.append(int(code))
        blocks.append(int(n_blocks))
        max_len.append(int(n_len))
    width = max(len(r) for r in rows)
    params = np.zeros((len(rows), width), np.float64)
    for k, r in enumerate(rows):
        params[k, : len(r)] = r
    roles = pd.roles(opts.num_instances)
    cls = [0 if role == 0 or role == ROLE_ENCODE else (1 if role == ROLE_PREFILL else 2)
           for role in roles.tolist()]
    warnings += dict.fromkeys(w for w in pack_warnings if w not in latency.warnings)
    return PoolClasses(params=params, codes=tuple(codes), instance_class=tuple(cls),
                       kv_blocks=tuple(blocks[c] for c in cls),
                       max_model_len=tuple(max_len[c] for c in cls), warnings=tuple(warnings))
