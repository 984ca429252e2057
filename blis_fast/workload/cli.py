"""``blis convert preset|servegen|inference-perf`` and ``blis compose`` (WL-12, DELTA-58).

Each command builds a WorkloadSpec, validates it and prints it as the reference's yaml.v3
would. Errors are raised as ``BlisError`` and reported by ``blis_fast.cli.main``. Hook the
commands into the CLI with ``register(main_group)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from blis_fast.cli_numbers import GO_FLOAT, GO_INT
from blis_fast.errors import BlisInputError
from blis_fast.options import OPTIONS_BY_FLAG

if TYPE_CHECKING:
    from blis_fast.workload.spec import WorkloadSpec


@click.group("convert")
def convert_group() -> None:
    """Convert external workload formats (presets, ServeGen, inference-perf) to a v2 spec."""


@convert_group.command("preset")
@click.option("--name", "name", required=True, help="Preset name (e.g. chatbot, summarization)")
@click.option("--rate", "rate", type=GO_FLOAT, default=OPTIONS_BY_FLAG["rate"].default,
              show_default=True, help="Request rate in req/s")
@click.option("--num-requests", "num_requests", type=GO_INT,
              default=OPTIONS_BY_FLAG["num-requests"].default, show_default=True,
              help="Number of requests")
@click.option("--defaults-filepath", "defaults_filepath", default=None,
              help="Path to defaults.yaml [default: the bundled copy]")
def convert_preset_command(name: str, rate: float, num_requests: int,
                           defaults_filepath: str | None) -> None:
    """Convert a named workload preset from defaults.yaml to a v2 spec."""
    from blis_fast.config.defaults import load_defaults  # lazy: not for blis --help
    from blis_fast.data import data_path  # lazy: not for blis --help
    from blis_fast.workload.convert import (  # lazy: not for blis --help
        check_preset_flags,
        convert_preset,
        unknown_preset,
    )

    check_preset_flags(rate, num_requests)
    cfg = load_defaults(defaults_filepath or str(data_path("defaults.yaml")))
    if name not in cfg.workloads:
        raise unknown_preset(name)
    _print_converted(lambda n: convert_preset(n, rate, num_requests, cfg.workloads[n]), name,
                     "Preset conversion failed")


def _print_converted(convert: Callable[[Any], WorkloadSpec], arg: Any, failure: str) -> None:
    """Run one conversion and print the validated spec; a failure is ``<failure>: <error>``."""
    from blis_fast.workload.convert import spec_yaml_for_stdout  # lazy: not for blis --help

    try:
        spec = convert(arg)
    except BlisInputError as exc:
        raise BlisInputError(f"{failure}: {exc}") from None
    click.echo(spec_yaml_for_stdout(spec), nl=False)


@convert_group.command("servegen")
@click.option("--path", "path", required=True, help="Path to the ServeGen data directory")
def convert_servegen_command(path: str) -> None:
    """Convert a ServeGen data directory (chunk-*-trace.csv + datasets) to a v2 spec."""
    from blis_fast.workload.convert import convert_servegen  # lazy: not for blis --help

    _print_converted(convert_servegen, path, "ServeGen conversion failed")


@convert_group.command("inference-perf")
@click.option("--spec", "spec_path", required=True, help="Path to an inference-perf YAML spec")
def convert_inference_perf_command(spec_path: str) -> None:
    """Expand a spec's inference_perf block into explicit clients (v2 spec)."""
    from blis_fast.workload.convert import convert_inference_perf  # lazy: not for blis --help

    _print_converted(convert_inference_perf, spec_path, "inference-perf conversion failed")


@click.command("compose")
@click.option("--from", "from_paths", multiple=True, required=True,
              help="Path to a v2 WorkloadSpec YAML file (repeatable)")
def compose_command(from_paths: tuple[str, ...]) -> None:
    """Merge several v2 workload specs into one (clients concatenated, rates re-weighted)."""
    from blis_fast.workload.convert import compose_specs  # lazy: not for blis --help
    from blis_fast.workload.spec_yaml import load_workload_spec  # lazy: not for blis --help

    specs = []
    for path in from_paths:
        try:
            specs.append(load_workload_spec(path))
        except BlisInputError as exc:
            raise BlisInputError(f"Failed to load spec {path}: {exc}") from None
    _print_converted(compose_specs, specs, "Compose failed")


def register(main_group: click.Group) -> None:
    """Add ``convert`` and ``compose`` to the ``blis`` command group."""
    main_group.add_command(convert_group)
    main_group.add_command(compose_command)
