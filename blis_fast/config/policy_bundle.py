"""Policy bundles (``--policy-config``): strict loading, validation and merge with the CLI
(CLU-5, DELTA-41).

A bundle sets admission, routing, priority and scheduler policies and their parameters; a
value from the bundle applies only when the corresponding flag was not given explicitly.
``node_pools`` and ``autoscaler`` belong to reference features the project does not adopt
(DELTA-44) and are rejected with a message naming them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import yaml

from blis_fast.config.strict_yaml import (
    YamlContext,
    as_float,
    as_int,
    as_str,
    decode_struct,
    is_null,
    mapping_items,
    parse_root,
)
from blis_fast.errors import BlisConfigError, BlisInputError
from blis_fast.files import read_input_text
from blis_fast.policies import SCORERS

VALID_ADMISSION = ("always-admit", "gaie-legacy", "reject-all", "tier-shed", "token-bucket")
VALID_ROUTING = ("always-busiest", "least-loaded", "round-robin", "weighted")
VALID_PRIORITY = ("constant", "inverted-slo", "slo-based")
VALID_SCHEDULER = ("fcfs", "priority-fcfs", "reverse-priority", "sjf")
VALID_SCORERS = tuple(sorted(SCORERS))


@dataclass
class PolicyBundle:
    """The content of a policy bundle; ``None`` means "not set"."""

    admission_policy: str = ""
    token_bucket_capacity: float | None = None
    token_bucket_refill_rate: float | None = None
    tier_shed_threshold: int | None = None
    tier_shed_min_priority: int | None = None
    gaie_qd_threshold: float | None = None
    gaie_kv_threshold: float | None = None
    slo_priorities: dict[str, int] | None = None
    routing_policy: str = ""
    scorers: list[tuple[str, float]] = field(default_factory=list)
    priority_policy: str = ""
    scheduler: str = ""
    tenant_budgets: dict[str, float] | None = None


def _opt_float(ctx: YamlContext, node: yaml.Node, what: str) -> float | None:
    return None if is_null(node) else as_float(ctx, node, what)


def _opt_int(ctx: YamlContext, node: yaml.Node, what: str) -> int | None:
    return None if is_null(node) else as_int(ctx, node, what)


def _int_map(ctx: YamlContext, node: yaml.Node, what: str) -> dict[str, int] | None:
    if is_null(node):
        return None
    return {k: as_int(ctx, v, f"{what}.{k}") for k, _kn, v in mapping_items(ctx, node, what)}


def _float_map(ctx: YamlContext, node: yaml.Node, what: str) -> dict[str, float] | None:
    if is_null(node):
        return None
    return {k: as_float(ctx, v, f"{what}.{k}") for k, _kn, v in mapping_items(ctx, node, what)}


def _scorers(ctx: YamlContext, node: yaml.Node, what: str) -> list[tuple[str, float]]:
    if is_null(node):
        return []
    if not isinstance(node, yaml.SequenceNode):
        raise ctx.fail(node, f"{what}: expected a list of {{name, weight}}")
    out = []
    for k, item in enumerate(node.value):
        v = decode_struct(ctx, item, f"{what}[{k}]", {"name": as_str, "weight": as_float})
        out.append((v.get("name", ""), v.get("weight", 0.0)))
    return out


def _unsupported(ctx: YamlContext, node: yaml.Node, what: str) -> None:
    raise ctx.fail(node, f"{what} is a feature of the reference that blis_fast does not support "
                         "(node pools and the autoscaler were not adopted)")


_ADMISSION_FIELDS = {
    "policy": as_str,
    "token_bucket_capacity": _opt_float,
    "token_bucket_refill_rate": _opt_float,
    "tier_shed_threshold": _opt_int,
    "tier_shed_min_priority": _opt_int,
    "gaie_qd_threshold": _opt_float,
    "gaie_kv_threshold": _opt_float,
    "slo_priorities": _int_map,
}
_TOP_FIELDS = {
    "admission": lambda ctx, n, w: decode_struct(ctx, n, w, _ADMISSION_FIELDS),
    "routing": lambda ctx, n, w: decode_struct(ctx, n, w, {"policy": as_str,
                                                            "scorers": _scorers}),
    "priority": lambda ctx, n, w: decode_struct(ctx, n, w, {"policy": as_str}),
    "scheduler": as_str,
    "tenant_budgets": _float_map,
    "node_pools": _unsupported,
    "autoscaler": _unsupported,
}


def load_policy_bundle(path: str) -> PolicyBundle:
    """Parse a bundle strictly; errors name the file, the line and the key."""
    try:
        text = read_input_text(path)
    except (OSError, UnicodeDecodeError) as exc:
        raise BlisInputError(f"--policy-config: cannot read {path}: {exc}") from exc
    with parse_root(text, path, "policy config") as (ctx, root):
        top = decode_struct(ctx, root, "policy config", _TOP_FIELDS)
    adm = top.get("admission", {})
    rt = top.get("routing", {})
    bundle = PolicyBundle(
        admission_policy=adm.get("policy", ""),
        token_bucket_capacity=adm.get("token_bucket_capacity"),
        token_bucket_refill_rate=adm.get("token_bucket_refill_rate"),
        tier_shed_threshold=adm.get("tier_shed_threshold"),
        tier_shed_min_priority=adm.get("tier_shed_min_priority"),
        gaie_qd_threshold=adm.get("gaie_qd_threshold"),
        gaie_kv_threshold=adm.get("gaie_kv_threshold"),
        slo_priorities=adm.get("slo_priorities"),
        routing_policy=rt.get("policy", ""),
        scorers=rt.get("scorers", []),
        priority_policy=top.get("priority", {}).get("policy", ""),
        scheduler=top.get("scheduler", ""),
        tenant_budgets=top.get("tenant_budgets"),
    )
    validate_bundle(bundle, path)
    return bundle


def _finite(v: float) -> bool:
    return not (math.isnan(v) or math.isinf(v))


def validate_bundle(b: PolicyBundle, path: str) -> None:
    """Whole-bundle validation, used or not (CLU-5.3, DELTA-41)."""

    def bad(msg: str) -> None:
        raise BlisConfigError(f"--policy-config {path}: {msg}")

    for what, name, valid in (("admission policy", b.admission_policy, VALID_ADMISSION),
                              ("routing policy", b.routing_policy, VALID_ROUTING),
                              ("priority policy", b.priority_policy, VALID_PRIORITY),
                              ("scheduler", b.scheduler, VALID_SCHEDULER)):
        if name and name not in valid:
            bad(f"unknown {what} {name!r}; valid options: {', '.join(valid)}")
    for key in ("token_bucket_capacity", "token_bucket_refill_rate"):
        v = getattr(b, key)
        if v is not None and (not _finite(v) or v < 0):
            bad(f"{key} must be a finite number >= 0, got {v}")
    if b.tier_shed_threshold is not None and b.tier_shed_threshold < 0:
        bad(f"tier_shed_threshold must be >= 0, got {b.tier_shed_threshold}")
    if b.gaie_qd_threshold is not None and (not _finite(b.gaie_qd_threshold)
                                            or b.gaie_qd_threshold <= 0):
        bad(f"gaie_qd_threshold must be a finite value > 0, got {b.gaie_qd_threshold}")
    if b.gaie_kv_threshold is not None and (not _finite(b.gaie_kv_threshold)
                                            or not 0 < b.gaie_kv_threshold <= 1.0):
        bad(f"gaie_kv_threshold must be a finite value in (0, 1.0], got {b.gaie_kv_threshold}")
    for tenant, v in sorted((b.tenant_budgets or {}).items()):
        if not _finite(v) or v < 0 or v > 1:
            bad(f"tenant_budgets[{tenant!r}] must be in [0, 1], got {v}")
    seen: set[str] = set()
    for k, (name, weight) in enumerate(b.scorers):
        if name not in VALID_SCORERS:
            bad(f"routing scorer[{k}]: unknown scorer {name!r}; valid: {', '.join(VALID_SCORERS)}")
        if name in seen:
            bad(f"routing scorer[{k}]: duplicate scorer {name!r}")
        seen.add(name)
        if not _finite(weight) or weight <= 0:
            bad(f"routing scorer[{k}] {name!r}: weight must be a finite positive number, "
                f"got {weight}")


def parse_scorer_list(text: str, allow_custom: bool = False) -> list[tuple[str, float]]:
    """``--routing-scorers name:weight,...`` (CLU-3.18): errors name the flag and item.

    ``custom`` (a user scorer given through the Python API) is accepted when ``allow_custom``.
    """
    from blis_fast.gonum import NumError, parse_float
    from blis_fast.workload.gofmt import go_trim_space

    if text == "":
        return []
    out: list[tuple[str, float]] = []
    seen: set[str] = set()
    for part in text.split(","):
        item = part.strip()
        if ":" not in item:
            raise BlisConfigError(f"Invalid --routing-scorers: invalid scorer config {item!r} "
                                  "(expected name:weight)")
        name, _, raw = item.partition(":")
        name = name.strip()
        if name == "custom" and not allow_custom:
            raise BlisConfigError("Invalid --routing-scorers: the custom scorer needs a user "
                                  "function (blis_fast.run(..., custom_scorer=...))")
        if name not in VALID_SCORERS and name != "custom":
            raise BlisConfigError(f"Invalid --routing-scorers: unknown scorer {name!r}; valid: "
                                  + ", ".join(VALID_SCORERS))
        if name in seen:
            raise BlisConfigError(f"Invalid --routing-scorers: duplicate scorer {name!r}; each "
                                  "scorer may appear at most once")
        seen.add(name)
        try:
            weight = parse_float(go_trim_space(raw))
        except NumError:
            raise BlisConfigError(f"Invalid --routing-scorers: invalid weight for scorer "
                                  f"{name!r}: {raw.strip()!r}") from None
        if not _finite(weight) or weight <= 0:
            raise BlisConfigError(f"Invalid --routing-scorers: scorer {name!r} weight must be a "
                                  f"finite positive number, got {weight}")
        out.append((name, weight))
    return out
