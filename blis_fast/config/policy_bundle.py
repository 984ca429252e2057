"""Policy bundles (``--policy-config``): strict loading, validation and merge with the CLI
(CLU-5, DELTA-41).

A bundle sets admission, routing, priority and scheduler policies and their parameters; a
value from the bundle applies only when the corresponding flag was not given explicitly.
``autoscaler``, ``node_pools`` and ``instance_lifecycle`` (AS-1) are decoded and validated by
``config/autoscale_bundle.py`` and resolved by ``config/autoscale.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import yaml

from blis_fast.config.autoscale_bundle import (
    AutoscalerBundle,
    LifecycleBundle,
    NodePoolBundle,
    autoscale_bundle_error,
    decode_autoscaler,
    decode_lifecycle,
    decode_node_pools,
)
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
from blis_fast.gofmt import go_trim_space
from blis_fast.gonum import NumError, parse_float
from blis_fast.policies.admission import ADMISSION, admission_params
from blis_fast.policies.priority import PRIORITY
from blis_fast.policies.routing import ROUTING
from blis_fast.policies.scheduler import SCHEDULER
from blis_fast.policies.scorers import SCORERS


@dataclass
class PolicyBundle:
    """The content of a policy bundle; ``None`` or ``""`` means "not set"."""

    admission_policy: str = ""
    admission_params: dict[str, float | int] = field(default_factory=dict)  # set keys only
    slo_priorities: dict[str, int] | None = None
    routing_policy: str = ""
    scorers: list[tuple[str, float]] = field(default_factory=list)
    priority_policy: str = ""
    scheduler: str = ""
    tenant_budgets: dict[str, float] | None = None
    autoscaler: AutoscalerBundle | None = None  # None: no ``autoscaler:`` section
    node_pools: list[NodePoolBundle] = field(default_factory=list)
    instance_lifecycle: LifecycleBundle = field(default_factory=LifecycleBundle)


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


def _admission_fields() -> dict:
    """``admission:`` keys: the policy, every registered policy's parameters, SLO priorities."""
    decoders = {int: _opt_int, float: _opt_float}
    return {"policy": as_str, **{p.key: decoders[p.kind] for p in admission_params()},
            "slo_priorities": _int_map}


_TOP_FIELDS = {
    "admission": lambda ctx, n, w: decode_struct(ctx, n, w, _admission_fields()),
    "routing": lambda ctx, n, w: decode_struct(ctx, n, w, {"policy": as_str,
                                                            "scorers": _scorers}),
    "priority": lambda ctx, n, w: decode_struct(ctx, n, w, {"policy": as_str}),
    "scheduler": as_str,
    "tenant_budgets": _float_map,
    "node_pools": decode_node_pools,
    "autoscaler": decode_autoscaler,
    "instance_lifecycle": decode_lifecycle,
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
        admission_params={p.key: adm[p.key] for p in admission_params()
                          if adm.get(p.key) is not None},
        slo_priorities=adm.get("slo_priorities"),
        routing_policy=rt.get("policy", ""),
        scorers=rt.get("scorers", []),
        priority_policy=top.get("priority", {}).get("policy", ""),
        scheduler=top.get("scheduler", ""),
        tenant_budgets=top.get("tenant_budgets"),
        autoscaler=top.get("autoscaler"),
        node_pools=top.get("node_pools", []),
        instance_lifecycle=top.get("instance_lifecycle", LifecycleBundle()),
    )
    validate_bundle(bundle, path)
    return bundle


def _finite(v: float) -> bool:
    return not (math.isnan(v) or math.isinf(v))


def validate_bundle(b: PolicyBundle, path: str) -> None:
    """Whole-bundle validation, used or not (CLU-5.3, DELTA-41)."""

    def bad(msg: str) -> None:
        raise BlisConfigError(f"--policy-config {path}: {msg}")

    for what, name, registry in (("admission policy", b.admission_policy, ADMISSION),
                                 ("routing policy", b.routing_policy, ROUTING),
                                 ("priority policy", b.priority_policy, PRIORITY),
                                 ("scheduler", b.scheduler, SCHEDULER)):
        valid = registry.valid_names()
        if name and name not in valid:
            bad(f"unknown {what} {name!r}; valid options: {', '.join(valid)}")
    for param in admission_params():
        value = b.admission_params.get(param.key)
        if value is not None and param.bundle_check is not None:
            message = param.bundle_check.error(param.key, value)
            if message is not None:
                bad(message)
    for tenant, v in sorted((b.tenant_budgets or {}).items()):
        if not _finite(v) or v < 0 or v > 1:
            bad(f"tenant_budgets[{tenant!r}] must be in [0, 1], got {v}")
    valid_scorers = SCORERS.valid_names()
    seen: set[str] = set()
    for k, (name, weight) in enumerate(b.scorers):
        if name not in valid_scorers:
            bad(f"routing scorer[{k}]: unknown scorer {name!r}; valid: {', '.join(valid_scorers)}")
        if name in seen:
            bad(f"routing scorer[{k}]: duplicate scorer {name!r}")
        seen.add(name)
        if not _finite(weight) or weight <= 0:
            bad(f"routing scorer[{k}] {name!r}: weight must be a finite positive number, "
                f"got {weight}")
    message = autoscale_bundle_error(b.autoscaler, b.node_pools, b.instance_lifecycle)
    if message is not None:
        bad(message)


@dataclass
class Policies:
    """The policies a run uses: the bundle merged under the flags (CLU-5.4, DELTA-41)."""

    admission: str
    routing: str
    priority: str
    scheduler: str
    scorers: tuple[tuple[str, float], ...]  # weighted routing's; () = the default profile
    params: dict[str, float | int]  # every admission parameter's effective value, by key
    slo_priorities: dict[str, int] = field(default_factory=dict)  # overrides (DELTA-38)
    tenant_budgets: dict[str, float] = field(default_factory=dict)  # (DELTA-40)
    bundle: PolicyBundle = field(default_factory=PolicyBundle)  # the loaded bundle (AS-1)


def select_policies(opts: Any, hooks: Any) -> Policies:
    """Load, validate and merge ``--policy-config`` under the flags of ``opts``; check the
    selected admission policy's parameters and every policy name (DELTA-26 order).

    ``hooks`` (``engine.engine_config.Hooks``) holds the user functions the ``custom`` entries need.
    The scorers are the bundle's until ``--routing-scorers`` is parsed (later in the order).
    """
    b = load_policy_bundle(opts.policy_config) if opts.policy_config else PolicyBundle()

    def chosen(registry: Any, bundle_value: str) -> str:
        flag_field = registry.flag.replace("-", "_")
        given = opts.given(flag_field)
        return bundle_value if bundle_value and not given else getattr(opts, flag_field)

    params: dict[str, float | int] = {}
    for policy in ADMISSION:
        for p in policy.params:
            flag_field = p.flag.replace("-", "_")
            value = getattr(opts, flag_field) if p.flag else p.default_value()
            if p.key in b.admission_params and not (p.flag and opts.given(flag_field)):
                value = b.admission_params[p.key]
            elif p.bundle_default is not None and b.admission_policy == policy.name:
                value = p.bundle_default
            params[p.key] = value
    pol = Policies(admission=chosen(ADMISSION, b.admission_policy),
                   routing=chosen(ROUTING, b.routing_policy),
                   priority=chosen(PRIORITY, b.priority_policy),
                   scheduler=chosen(SCHEDULER, b.scheduler),
                   scorers=tuple(b.scorers), params=params,
                   slo_priorities=dict(b.slo_priorities or {}),
                   tenant_budgets=dict(b.tenant_budgets or {}), bundle=b)
    selected = ADMISSION.entries.get(pol.admission)
    for p in selected.params if selected is not None else ():
        message = p.check.error(p.flag or p.key, params[p.key]) if p.check else None
        if message is not None:
            raise BlisConfigError(message)
    for registry, name in ((ADMISSION, pol.admission), (ROUTING, pol.routing),
                           (PRIORITY, pol.priority), (SCHEDULER, pol.scheduler)):
        entry = registry.entries.get(name)
        if name == "custom":  # a user function's entry (admission, scheduler)
            if entry is None or getattr(hooks, entry.hook, None) is None:
                raise BlisConfigError(
                    f"--{registry.flag} custom needs a user function: pass it through the Python API "
                    "(blis_fast.run(..., custom_admission=... / custom_scheduler_key=...))")
        elif name and entry is None:
            raise BlisConfigError(f"--{registry.flag}: unknown value {name!r}. Valid: "
                                  + ", ".join(registry.valid_names()))
    return pol


def parse_scorer_list(text: str, allow_custom: bool = False) -> list[tuple[str, float]]:
    """``--routing-scorers name:weight,...`` (CLU-3.18): errors name the flag and item.

    ``custom`` (a user scorer given through the Python API) is accepted when ``allow_custom``.
    """
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
        if name not in SCORERS:
            raise BlisConfigError(f"Invalid --routing-scorers: unknown scorer {name!r}; valid: "
                                  + ", ".join(SCORERS.valid_names()))
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
