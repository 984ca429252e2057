"""``--help`` tells the truth: each flag's type, its real default, grouped headings (issue 26).

The rows of ``blis_fast.options`` are the one source: these tests read the help click renders
from them and check it against the rows.
"""

from __future__ import annotations

import re

import click
import pytest
from click.testing import CliRunner

from blis_fast.cli import main_group
from blis_fast.cli_options import OTHER_OPTIONS, RowOption, value_name
from blis_fast.options import OPTIONS_BY_FLAG, REPLAY_ONLY_FLAGS, RUN_OPTIONS


def _help(*args: str) -> str:
    result = CliRunner().invoke(main_group, [*args, "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    return result.output


def _records(command: str) -> dict[str, tuple[str, str]]:
    """Flag -> (the option column, the help column) of ``blis <command> --help``."""
    cmd = main_group.commands[command]
    with click.Context(cmd, info_name=command) as ctx:
        return {param.opts[0][2:]: param.get_help_record(ctx)  # type: ignore[misc]
                for param in cmd.get_params(ctx) if isinstance(param, RowOption)}


def test_run_help_groups_the_flags_under_headings():
    text = _help("run")
    headings = [line[:-1] for line in text.splitlines() if line.endswith(":") and
                not line.startswith(" ")]
    groups = list(dict.fromkeys(spec.group for spec in RUN_OPTIONS
                                if spec.flag not in REPLAY_ONLY_FLAGS))
    assert headings == [*groups, OTHER_OPTIONS]
    for wanted in ("Workload", "Cluster, admission and routing", "KV cache and batching",
                   "Model and latency", "Prefill/decode disaggregation (P/D)",
                   "Autoscaler and cost", "Outputs"):
        assert wanted in headings


def test_every_row_has_a_group():
    assert all(spec.group for spec in RUN_OPTIONS)


def test_run_help_shows_types_and_real_defaults():
    text = _help("run")
    assert re.search(r"--num-requests INTEGER\s+number of requests \[default: 100\]", text)
    assert re.search(r"--rate FLOAT\s+requests per second \[default: 1\]", text)
    assert re.search(r"--latency-model \[[a-z-]*\|?[^\]]*roofline[^\]]*\]", text)
    assert "--model-config-folder DIRECTORY" in text and "--workload-spec PATH" in text
    assert "--alpha-coeffs FLOAT,..." in text and "[default: 0,0,0]" in text
    assert "[default: ]" not in text and '[default: ""]' not in text


@pytest.mark.parametrize("command", ["run", "replay"])
def test_no_numeric_flag_shows_text(command):
    records = _records(command)
    for spec in RUN_OPTIONS:
        if spec.flag in records and spec.kind in ("int", "float", "floats"):
            column = records[spec.flag][0]
            assert "TEXT" not in column, column
            assert ("INTEGER" if spec.kind == "int" else "FLOAT") in column, column


def test_help_shows_the_value_name_and_default_of_each_row():
    records = _records("run")
    for spec in RUN_OPTIONS:
        if spec.flag in REPLAY_ONLY_FLAGS:
            continue
        column, help_text = records[spec.flag]
        assert column == f"--{spec.flag} {value_name(spec)}".rstrip()
        default = spec.default_text()
        assert help_text.endswith(f"[default: {default}]") == bool(default), help_text


def test_display_types_do_not_parse():
    """The value still reaches the rows' Go parsers as the text given (``0x10`` is 16)."""
    from blis_fast.cli import _given

    cmd = main_group.commands["run"]
    ctx = cmd.make_context("run", ["--num-requests", "0x10", "--rate", "1e1", "--alpha-coeffs",
                                   "1,2", "--alpha-coeffs", "3"])
    given = _given(ctx, ctx.params)
    assert given == {"num_requests": "0x10", "rate": "1e1", "alpha_coeffs": "1,2,3"}


def test_observe_shows_the_run_help_of_every_shared_flag():
    """``blis observe`` takes its shared flags from the RUN_OPTIONS rows: same help line (the
    default part aside: observe states the reference's own defaults), same value name."""
    run, observe = _records("run"), _records("observe")
    shared = set(run) & set(observe)
    assert {"rate", "num-requests", "seed", "prompt-tokens", "model"} <= shared
    redefined = set()
    for flag in sorted(shared):
        run_help = run[flag][1].split(" [default: ")[0]
        observe_help = observe[flag][1].split(" [default: ")[0]
        if run_help != observe_help:
            redefined.add(flag)
            continue
        assert run[flag][0] == observe[flag][0], flag
    # flags whose meaning differs in observe (rows of its own, in OBSERVE_OPTIONS)
    assert redefined == {"timeout", "output-dir", "workload"}


def test_observe_states_its_own_defaults_once():
    from blis_fast.observe.command import OBSERVE_DEFAULTS, ObserveOptions, observe_default

    opts = ObserveOptions()
    assert opts.rate == observe_default("rate") == OBSERVE_DEFAULTS["rate"][0] == 0.0
    assert opts.seed == observe_default("seed") == 42
    assert "[default: 0 (the spec's, else unlimited)]" in _records("observe")["num-requests"][1]


def test_the_rate_default_is_stated_once():
    """``--rate``'s default lives in its row: the other modules read it from there (the
    generated ``run_options.py`` copies it, and tests/test_run_options_typed.py holds the copy
    to the row)."""
    from pathlib import Path

    import blis_fast

    root = Path(blis_fast.__file__).parent
    stated = [str(path.relative_to(root)) for path in root.rglob("*.py")
              if path.name != "run_options.py" and re.search(r'"rate",\s*"float",\s*1\.0|\brate: float = 1\.0|"--rate".*default=1\.0',
                           path.read_text(encoding="utf-8"))]
    assert stated == ["options.py"]


def test_one_rate_check():
    from blis_fast.errors import BlisConfigError
    from blis_fast.workload.convert import check_preset_flags
    from blis_fast.workload.synthesis import DistributionParams, validate_rate

    for bad, shown in ((0.0, "0"), (float("nan"), "NaN"), (float("inf"), "+Inf"),
                       (-1.2345678, "-1.2345678")):
        for check in (validate_rate, lambda r: check_preset_flags(r, 1)):
            with pytest.raises(BlisConfigError, match=re.escape(
                    f"--rate must be a finite value > 0, got {shown}")):
                check(bad)
    assert DistributionParams().rate == 1.0 and DistributionParams().prompt_tokens_mean == 512


def test_distribution_params_read_the_flags_by_name():
    from blis_fast.options import build_options
    from blis_fast.workload.synthesis import DistributionParams

    opts = build_options({"rate": "7", "prompt_tokens": "100", "output_tokens_max": "900"})
    params = DistributionParams.from_flags(opts)
    assert (params.rate, params.prompt_tokens_mean, params.output_tokens_max) == (7.0, 100, 900)
    assert params == DistributionParams(rate=7.0, prompt_tokens_mean=100, output_tokens_max=900)


@pytest.mark.parametrize(("flags", "distribution", "source"), [
    ({"workload_spec": "w.yaml", "concurrency": 0, "workload": "distribution"}, "distribution",
     "spec"),
    ({"workload_spec": "", "concurrency": 3, "workload": "distribution"}, "distribution",
     "concurrency"),
    ({"workload_spec": "", "concurrency": 0, "workload": "distribution"}, "distribution",
     "distribution"),
    ({"workload_spec": "", "concurrency": 0, "workload": "chatbot"}, "distribution", "preset"),
    ({"workload_spec": "", "concurrency": 0, "workload": ""}, "", "distribution"),
    ({"workload_spec": "", "concurrency": 0, "workload": "distribution"}, "", "preset"),
])
def test_one_workload_source_choice(flags, distribution, source):
    from types import SimpleNamespace

    from blis_fast.workload.synthesis import workload_source

    assert workload_source(SimpleNamespace(**flags), distribution) == source


@pytest.mark.parametrize("flag", ["log", "trace-level", "session-mode"])
def test_a_flag_with_listed_values_shows_them_and_its_check_takes_exactly_them(flag):
    spec = OPTIONS_BY_FLAG[flag]
    assert spec.values and value_name(spec) == "[" + "|".join(spec.values) + "]"
    assert all(check.error(flag, value) is None for value in spec.values for check in spec.checks)
    assert any(check.error(flag, "bogus") for check in spec.checks)
    records = _records("replay" if flag == "session-mode" else "run")
    assert records[flag][0] == f"--{flag} {value_name(spec)}"
