"""``blis evolve init`` and ``blis evolve eval``; hook them in with ``register(main_group)``.
Heavy modules (Numba, the simulator) are imported only when a command runs."""

from __future__ import annotations

import json
import sys

import click

from blis_fast.cli_numbers import GO_FLOAT, GO_INT
from blis_fast.errors import BlisConfigError
from blis_fast.evolve import TARGETS


@click.group("evolve")
def evolve_group() -> None:
    """Policy evolution: blis as the evaluator of OpenEvolve / GEPA searches."""


@evolve_group.command("init")
@click.argument("framework", type=click.Choice(["openevolve"]))
@click.option("--target", type=click.Choice(TARGETS), default="scorer", show_default=True,
              help="The policy to evolve")
@click.option("--benchmark", default=None, help="Benchmark YAML [default: the built-in one]")
@click.option("--out", "out_dir", default="evolve", show_default=True,
              help="Folder to write the files into")
@click.option("--timeout", "timeout_s", type=GO_FLOAT, default=60.0, show_default=True,
              help="Seconds per contained evaluation")
@click.option("--memory-mb", type=GO_INT, default=2048, show_default=True,
              help="Memory a candidate may use (MB)")
def init_command(framework: str, target: str, benchmark: str | None, out_dir: str,
                 timeout_s: float, memory_mb: int) -> None:
    """Write evaluator.py, initial_program.py, config.yaml and benchmark.yaml for FRAMEWORK."""
    from blis_fast.evolve.adapters import write_openevolve_files  # lazy: not for blis --help
    from blis_fast.evolve.benchmark import load_benchmark  # lazy: not for blis --help
    from blis_fast.evolve.sandbox import check_limits  # lazy: not for blis --help

    check_limits(timeout_s, memory_mb, ("--timeout", "--memory-mb"))
    for path in write_openevolve_files(out_dir, target, load_benchmark(benchmark),
                                       timeout_s=timeout_s, memory_mb=memory_mb,
                                       inputs=[("--benchmark", benchmark or "")]):
        sys.stdout.write(f"wrote {path}\n")
    sys.stdout.write(f"run: openevolve-run {out_dir}/initial_program.py {out_dir}/evaluator.py "
                     f"--config {out_dir}/config.yaml\n")


@evolve_group.command("eval")
@click.argument("candidate")
@click.option("--target", type=click.Choice(TARGETS), default="scorer", show_default=True,
              help="The policy the candidate defines")
@click.option("--benchmark", default=None, help="Benchmark YAML [default: the built-in one]")
@click.option("--stage", type=click.Choice(["full", "tiny"]), default="full", show_default=True,
              help="full: the whole benchmark; tiny: a few requests of the first workload")
@click.option("--timeout", "timeout_s", type=GO_FLOAT, default=60.0, show_default=True,
              help="Seconds before the evaluation is stopped")
@click.option("--memory-mb", type=GO_INT, default=2048, show_default=True,
              help="Memory the candidate may use (MB)")
def eval_command(candidate: str, target: str, benchmark: str | None, stage: str,
                 timeout_s: float, memory_mb: int) -> None:
    """Score CANDIDATE.py (contained); print fitness, metrics and feedback as JSON."""
    from blis_fast.evolve.benchmark import load_benchmark  # lazy: not for blis --help
    from blis_fast.evolve.sandbox import check_limits, evaluate_contained  # lazy: --help

    check_limits(timeout_s, memory_mb, ("--timeout", "--memory-mb"))
    from blis_fast.files import read_input_text  # lazy: not for blis --help

    try:
        source = read_input_text(candidate)
    except OSError as exc:
        raise BlisConfigError(f"CANDIDATE: cannot read {candidate}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise BlisConfigError(f"CANDIDATE: {candidate} is not UTF-8 text") from None
    record = evaluate_contained(source, target, load_benchmark(benchmark), stage=stage,
                                timeout_s=timeout_s, memory_mb=memory_mb)
    if (record.get("error") or {}).get("kind") == "benchmark":  # not the candidate's failure
        raise BlisConfigError(f"--benchmark {benchmark or '(built-in)'}: "
                              f"{record['error']['message']}")
    sys.stdout.write(json.dumps(record, indent=2, sort_keys=True) + "\n")


def register(group: click.Group) -> None:
    """Add ``blis evolve`` to the main command group."""
    group.add_command(evolve_group)
