"""The autoscaler's configuration (AS-1, AS-2.4): bundle keys, validation in the reference's
order and words, our own refusals, the flag merged over the bundle, per-pool KV capacity."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from blis_fast.config.autoscale import resolve_autoscale
from blis_fast.config.autoscale_bundle import (
    AutoscalerBundle,
    DelaySpec,
    LifecycleBundle,
    NodePoolBundle,
    autoscale_bundle_error,
)
from blis_fast.config.latency import resolve_latency
from blis_fast.config.policy_bundle import load_policy_bundle
from blis_fast.errors import BlisConfigError, BlisInputError
from blis_fast.options import build_options, check_options

MODEL = "meta-llama/llama-3.1-8b-instruct"
POOL = NodePoolBundle(name="p", gpu_type="H100", gpus_per_node=1, gpu_memory_gib=80.0,
                      initial_nodes=2, max_nodes=2)


def _error(a: AutoscalerBundle | None = None, pools: list[NodePoolBundle] | None = None,
           life: LifecycleBundle | None = None) -> str | None:
    return autoscale_bundle_error(a, pools or [], life or LifecycleBundle())


@pytest.mark.parametrize(("bundle", "message"), [
    (AutoscalerBundle(interval_us=math.nan), "autoscaler.interval_us must be a finite number"),
    (AutoscalerBundle(interval_us=-1e6),
     "autoscaler.interval_us must be >= 0 (0 = disabled), got -1e+06"),
    (AutoscalerBundle(scale_up_window_us=-1.5),
     "autoscaler.scale_up_stabilization_window_us must be a finite non-negative number, got -1.5"),
    (AutoscalerBundle(scrape_delay=DelaySpec(1.0, math.inf)),
     "autoscaler.hpa_scrape_delay.stddev must be a finite non-negative number, got +Inf"),
    (AutoscalerBundle(kv_cache_threshold=1.5),
     "autoscaler.analyzer.kv_cache_threshold must be in (0, 1], got 1.5"),
    (AutoscalerBundle(avg_input_tokens=-3.0),
     "autoscaler.analyzer.avg_input_tokens must be > 0, got -3"),
    (AutoscalerBundle(scale_down_boundary=0.9),
     "autoscaler.analyzer.scale_down_boundary (0.9) must be < effective scale_up_threshold (0.8)"),
    (AutoscalerBundle(interval_us=0.5),
     "autoscaler.interval_us must be 0 (off) or at least 1 µs, got 0.5: a shorter interval "
     "truncates to 0 and the reference ticks forever at one instant"),
    (AutoscalerBundle(min_replicas=3, max_replicas=2),
     "autoscaler.min_replicas (3) must be <= autoscaler.max_replicas (2)"),
])
def test_autoscaler_checks_in_reference_words(bundle, message):
    assert _error(bundle) == message


def test_first_failing_check_wins_in_reference_order():
    """Interval before windows, autoscaler before pools, pools before lifecycle."""
    bad_pool = NodePoolBundle(name="x", gpu_type="H100", gpus_per_node=0)
    bad_life = LifecycleBundle(loading_delay=DelaySpec(-1.0, 0.0))
    both = AutoscalerBundle(interval_us=-5.0, scale_up_window_us=-1.0)
    assert _error(both, [bad_pool], bad_life).startswith("autoscaler.interval_us must be >= 0")
    assert _error(None, [bad_pool], bad_life) == \
        'node_pools[0] "x": gpus_per_node must be >= 1, got 0'
    assert _error(None, [POOL], bad_life) == \
        "instance_lifecycle.loading_delay.mean must be >= 0, got -1"


@pytest.mark.parametrize(("pool", "message"), [
    (NodePoolBundle(), "node_pools[0]: name must not be empty"),
    (NodePoolBundle(name="a"), 'node_pools[0] "a": gpu_type must not be empty'),
    (NodePoolBundle(name="a", gpu_type="H100", gpus_per_node=1, gpu_memory_gib=math.nan),
     'node_pools[0] "a": gpu_memory_gib must be finite, got NaN'),
    (NodePoolBundle(name="a", gpu_type="H100", gpus_per_node=1, gpu_memory_gib=80,
                    initial_nodes=3, max_nodes=2),
     'node_pools[0] "a": max_nodes (2) must be >= initial_nodes (3)'),
    (NodePoolBundle(name="a", gpu_type="H100", gpus_per_node=1, gpu_memory_gib=80,
                    cost_per_hour=-2.5),
     'node_pools[0] "a": cost_per_hour must be >= 0, got -2.5'),
])
def test_pool_checks(pool, message):
    assert _error(None, [pool]) == message


def test_duplicate_pool_names_refused_after_reference_checks():
    assert _error(None, [POOL, POOL]) == \
        'node_pools[1] "p": duplicate pool name (the reference panics on this)'


def _bundle(tmp_path: Path, text: str) -> str:
    path = tmp_path / "bundle.yaml"
    path.write_text(text)
    return str(path)


def test_bundle_keys_decode(tmp_path):
    b = load_policy_bundle(_bundle(tmp_path, """\
autoscaler:
  interval_us: 1000000
  scale_down_stabilization_window_us: 8e6
  hpa_scrape_delay: {mean: 1.5, stddev: 0.5}
  analyzer: {kv_cache_threshold: 0.7}
node_pools:
  - {name: a, gpu_type: H100, gpus_per_node: 2, gpu_memory_gib: 80, initial_nodes: 1,
     max_nodes: 1, cost_per_hour: 2.5}
instance_lifecycle:
  loading_delay: {mean: 2.0}
  warm_start_initial_instances: yes
"""))
    a = b.autoscaler
    assert (a.interval_us, a.scale_down_window_us, a.kv_cache_threshold) == (1e6, 8e6, 0.7)
    assert (a.scrape_delay.mean, a.scrape_delay.stddev) == (1.5, 0.5)
    assert a.keys == {"interval_us", "scale_down_stabilization_window_us", "hpa_scrape_delay",
                      "analyzer.kv_cache_threshold"}
    assert b.node_pools == [NodePoolBundle("a", "H100", 2, 80.0, 1, 1, 2.5)]
    assert b.instance_lifecycle.warm_start_initial_instances is True
    assert b.instance_lifecycle.loading_delay.mean == 2.0


@pytest.mark.parametrize("key", ["min_nodes: 1", "provisioning_delay: {mean: 1}"])
def test_dead_node_keys_refused_naming_the_key(tmp_path, key):
    path = _bundle(tmp_path, "node_pools:\n  - name: a\n    gpu_type: H100\n    " + key + "\n")
    with pytest.raises(BlisInputError) as ei:
        load_policy_bundle(path)
    assert f"{path}:4: policy config.node_pools[0].{key.split(':')[0]}: nodes are never added" in str(ei.value)


def test_drain_policy_is_not_a_bundle_key(tmp_path):
    path = _bundle(tmp_path, "instance_lifecycle:\n  drain_policy: WAIT\n")
    with pytest.raises(BlisInputError, match="unknown key 'drain_policy'"):
        load_policy_bundle(path)


@pytest.mark.parametrize(("value", "text"), [
    ("-1", "must be a finite number >= 0 (0 = disabled), got -1"),
    ("NaN", "got NaN"),
    ("0.5", "must be 0 (off) or at least 1 µs, got 0.5"),
    ("1e19", "is beyond the simulator's time range"),
])
def test_interval_flag_refused(value, text):
    opts = build_options({"model": MODEL, "model_autoscaler_interval_us": value})
    with pytest.raises(BlisConfigError) as ei:
        check_options(opts, "autoscale")
    assert str(ei.value).startswith("--model-autoscaler-interval-us")
    assert text in str(ei.value)


def _setup(tmp_path: Path, text: str | None, **flags):
    given = {"model": MODEL, **flags}
    if text is not None:
        given["policy_config"] = _bundle(tmp_path, text)
    opts = build_options(given)
    opts = opts.__class__(**{**opts.__dict__, "model": opts.model.lower()})
    latency = resolve_latency(opts)
    bundle = load_policy_bundle(opts.policy_config) if text is not None else None
    from blis_fast.config.policy_bundle import PolicyBundle

    return resolve_autoscale(opts, bundle or PolicyBundle(), latency)


def test_flag_alone_uses_defaults_and_windows_zero(tmp_path):
    s = _setup(tmp_path, "autoscaler:\n  scale_down_stabilization_window_us: 3e8\n",
               model_autoscaler_interval_us="1000000")
    assert s.enabled and s.interval_us == 1e6 and s.down_window_us == 0
    assert (s.kv_cache_threshold, s.scale_up_threshold, s.scale_down_boundary,
            s.avg_input_tokens) == (0.8, 0.8, 0.4, 512.0)
    assert any("its interval_us is 0, so the reference ignores it" in w for w in s.warnings)


def test_flag_zero_disables_a_bundle_interval(tmp_path):
    s = _setup(tmp_path, "autoscaler:\n  interval_us: 1e6\n", model_autoscaler_interval_us="0")
    assert not s.enabled and not s.active


def test_small_pool_memory_gives_per_label_kv(tmp_path):
    """24 GiB H100s: 508 blocks, max-model-len capped to 508 x 16 (as-node-pool-small-gpu-memory);
    the global 80 GiB capacity is untouched."""
    s = _setup(tmp_path, "node_pools:\n  - {name: s, gpu_type: H100, gpus_per_node: 1, "
                         "gpu_memory_gib: 24, initial_nodes: 4, max_nodes: 4}\n")
    assert s.labels == ["H100"] and s.label_blocks == [508] and s.label_max_len == [8128]
    s80 = _setup(tmp_path, "node_pools:\n  - {name: s, gpu_type: H100, gpus_per_node: 1, "
                           "gpu_memory_gib: 80, initial_nodes: 4, max_nodes: 4}\n")
    assert s80.label_blocks == [26312]


def test_replay_refuses_the_interval_flag(tmp_path):
    from blis_fast.config.policy_bundle import PolicyBundle

    opts = build_options({"model": MODEL, "model_autoscaler_interval_us": "0"})
    with pytest.raises(BlisConfigError, match="not supported in blis replay"):
        resolve_autoscale(opts, PolicyBundle(), None, replay=True)


def test_config_time_warnings(tmp_path):
    """Traps 2.8, 2.9, 2.11, 2.12, 2.16, 2.18: keys that do less than they seem, each named once."""
    s = _setup(tmp_path, """\
autoscaler:
  scale_up_stabilization_window_us: 1e6
node_pools:
  - {name: a, gpu_type: H100, gpus_per_node: 1, gpu_memory_gib: 80, initial_nodes: 1,
     max_nodes: 3}
  - {name: b, gpu_type: A100, gpus_per_node: 1, gpu_memory_gib: 80, initial_nodes: 1,
     max_nodes: 1}
  - {name: c, gpu_type: H100, gpus_per_node: 1, gpu_memory_gib: 40, initial_nodes: 1,
     max_nodes: 1}
""")
    w = s.warnings
    assert ("autoscaler: --policy-config sets autoscaler.scale_up_stabilization_window_us but "
            "autoscaler.interval_us is 0: the autoscaler is off") in w
    assert ('node_pools[0] "a": max_nodes 3 has no effect: only the 1 initial node(s) exist '
            "during a run") in w
    assert any(m.startswith('node_pools[1] "b": gpu_type A100 differs from the hardware H100')
               for m in w)
    assert any(m.startswith('node_pools[2] "c" shares gpu_type H100 with node_pools[0]')
               for m in w)
    assert len(w) == 4
    scrape = _setup(tmp_path, "autoscaler:\n  interval_us: 1e6\n  hpa_scrape_delay: {mean: 2}\n")
    assert any("hpa_scrape_delay.mean 2.000 s exceeds the interval 1.000 s" in m
               for m in scrape.warnings)
    alone = _setup(tmp_path, "instance_lifecycle:\n  loading_delay: {mean: 1}\n")
    assert alone.warnings == ["instance_lifecycle has no effect without node_pools"]
    assert not alone.active



def test_refused_with_prefill_decode_pools():
    """The reference gives autoscaled instances no P/D role: the combination is refused."""
    import blis_fast

    with pytest.raises(BlisConfigError, match="cannot be combined with the autoscaler"):
        blis_fast.run(model=MODEL, num_instances=4, prefill_instances=2, decode_instances=2,
                      model_autoscaler_interval_us=1e6, num_requests=5, log="error")
