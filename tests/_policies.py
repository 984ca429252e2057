"""Every policy the package accepts, per family, and how a random configuration runs each one.

The names are read from the package (``policy_names``), never restated, so a policy added to
the package is drawn by the property tests at once. A policy of a family whose members can
take parameters (admission, routing) also needs an entry in ``POLICY_OPTIONS`` saying how a
random configuration sets it up (``_flag_only`` when it takes none):
``test_invariants.test_strategies_draw_every_policy`` fails, naming this file, when the package
and the table disagree, rather than letting coverage shrink.

Options that have no flag (tier-shed, gaie-legacy and SLO priorities) go through a policy
bundle (``--policy-config``) written to a temporary folder, one file per distinct content.
"""

from __future__ import annotations

import atexit
import hashlib
import shutil
import tempfile
from pathlib import Path

import yaml
from hypothesis import strategies as st

_BUNDLES = Path(tempfile.mkdtemp(prefix="blis-test-bundles-"))
atexit.register(shutil.rmtree, _BUNDLES, ignore_errors=True)


def policy_names() -> dict[str, tuple[str, ...]]:
    """Every policy name ``blis run`` accepts, per family, as the package's registries expose
    them (``blis_fast.policies``); a missing registry is an error, never a shorter list."""
    from blis_fast.policies import family

    names = {name: family(name).valid_names()
             for name in ("admission", "routing", "priority", "scheduler")}
    names["scorer"] = family("scorers").valid_names()
    return names


def default_policy(name: str) -> str:
    """The CLI default of a family's flag (``--admission-policy`` etc.), from its registry."""
    from blis_fast.policies import family

    return family(name).default_name


def bundle_file(bundle: dict) -> str:
    """A policy bundle YAML holding ``bundle`` (the same content gives the same path)."""
    text = yaml.safe_dump(bundle, sort_keys=True)
    path = _BUNDLES / (hashlib.sha256(text.encode()).hexdigest()[:16] + ".yaml")
    if not path.exists():
        path.write_text(text)
    return str(path)


# ---------------------------------------------------------------- per-policy options


def _flag_only(family: str, name: str):
    flag = {"admission": "admission_policy", "routing": "routing_policy"}[family]
    return st.just({flag: name})


@st.composite
def _token_bucket(draw) -> dict:
    return dict(admission_policy="token-bucket",
                token_bucket_capacity=draw(st.floats(500.0, 50_000.0)),
                token_bucket_refill_rate=draw(st.floats(100.0, 40_000.0)))


# SLO priority overrides for the class every generated request has (""): sheddable or not
_EMPTY_CLASS_PRIORITY = st.one_of(st.none(), st.sampled_from([-3, -1, 3, 4]))


def _slo_priorities(draw) -> dict:
    prio = draw(_EMPTY_CLASS_PRIORITY)
    return {} if prio is None else {"slo_priorities": {"": prio}}


@st.composite
def _tier_shed(draw) -> dict:
    """DELTA-38: shed classes below a priority when the busiest instance's load passes a
    threshold; without ``tier_shed_min_priority`` the bundle's default (3) applies."""
    adm = {"policy": "tier-shed", "tier_shed_threshold": draw(st.integers(0, 20))}
    min_prio = draw(st.one_of(st.none(), st.integers(-3, 5)))
    if min_prio is not None:
        adm["tier_shed_min_priority"] = min_prio
    adm.update(_slo_priorities(draw))
    return dict(admission_policy="tier-shed", policy_config=bundle_file({"admission": adm}))


@st.composite
def _gaie_legacy(draw) -> dict:
    """DELTA-39: shed sheddable classes when the mean saturation reaches 1."""
    adm = {"policy": "gaie-legacy"}
    if draw(st.booleans()):
        adm["gaie_qd_threshold"] = draw(st.floats(0.05, 20.0))
    if draw(st.booleans()):
        adm["gaie_kv_threshold"] = draw(st.floats(0.01, 1.0))
    adm.update(_slo_priorities(draw))
    return dict(admission_policy="gaie-legacy", policy_config=bundle_file({"admission": adm}))


@st.composite
def _weighted(draw) -> dict:
    """Weighted routing over a random subset of the registered scorers (or the default
    profile, DELTA-31)."""
    opts = {"routing_policy": "weighted"}
    if draw(st.integers(0, 3)) > 0:
        names = draw(st.lists(st.sampled_from(policy_names()["scorer"]), min_size=1,
                              max_size=4, unique=True))
        weights = [draw(st.floats(0.1, 5.0)) for _ in names]
        opts["routing_scorers"] = ",".join(f"{n}:{w!r}" for n, w in zip(names, weights,
                                                                        strict=True))
    return opts


POLICY_OPTIONS = {
    "admission": {
        "always-admit": _flag_only("admission", "always-admit"),
        "reject-all": _flag_only("admission", "reject-all"),
        "token-bucket": _token_bucket(),
        "tier-shed": _tier_shed(),
        "gaie-legacy": _gaie_legacy(),
    },
    "routing": {
        "round-robin": _flag_only("routing", "round-robin"),
        "least-loaded": _flag_only("routing", "least-loaded"),
        "always-busiest": _flag_only("routing", "always-busiest"),
        "weighted": _weighted(),
    },
}
"""Per family whose members take parameters: policy name -> strategy of the run options that
select and configure it. Must hold exactly the package's names (test_invariants checks)."""


@st.composite
def policy_options(draw, family: str, name: str | None = None, default_weight: int = 0) -> dict:
    """Run options selecting one policy of ``family`` (``name``, or drawn from the package's
    names, the CLI default ``default_weight`` times more often) and its parameters."""
    if name is None:
        names = policy_names()[family]
        name = draw(st.sampled_from([default_policy(family)] * default_weight + list(names)))
    return draw(POLICY_OPTIONS[family][name])


def drawn_policies(opts: dict) -> dict[str, set[str]]:
    """Which policies of each family a configuration from these strategies runs."""
    out = {"admission": {opts.get("admission_policy", default_policy("admission"))},
           "routing": {opts.get("routing_policy", default_policy("routing"))},
           "priority": {opts.get("priority_policy", default_policy("priority"))},
           "scheduler": {opts.get("scheduler", default_policy("scheduler"))},
           "scorer": set()}
    for item in filter(None, opts.get("routing_scorers", "").split(",")):
        out["scorer"].add(item.split(":")[0])
    return out
