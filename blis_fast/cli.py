"""The ``blis`` command line. The only module that prints errors and chooses exit codes."""

from __future__ import annotations

import atexit
import functools
import gc
import logging
import os
import sys
import threading

import click
from click.core import ParameterSource

from blis_fast.calibrate import cli as calibrate_cli
from blis_fast.cli_options import GroupedHelpCommand, add_run_options
from blis_fast.errors import BlisError
from blis_fast.evolve import cli as evolve_cli
from blis_fast.fit import cli as fit_cli
from blis_fast.observe import command as observe_command
from blis_fast.options import (
    OPTIONS_BY_FLAG,
    REPLAY_ONLY_FLAGS,
    STEP_TIME_FLAGS,
    WORKLOAD_FLAGS,
    build_options,
)
from blis_fast.profiling import cli as profiling_cli
from blis_fast.serve import cli as serve_cli
from blis_fast.sweep import cli as sweep_cli
from blis_fast.workload import cli as workload_cli

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


def _add_run_options(func):
    """Attach the ``blis run`` flags: every RUN_OPTIONS row but replay's."""
    return add_run_options(func, skip=REPLAY_ONLY_FLAGS)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.pass_context
def main_group(ctx: click.Context) -> None:
    """blis: a fast, deterministic simulator of LLM inference serving clusters."""
    if ctx.invoked_subcommand not in ("run", "replay"):
        startup_done()  # the simulation commands call it once their imports are done


workload_cli.register(main_group)
sweep_cli.register(main_group)
calibrate_cli.register(main_group)
observe_command.register(main_group)
evolve_cli.register(main_group)
fit_cli.register(main_group)
profiling_cli.register(main_group)
serve_cli.register(main_group)


def _numba_without_scipy() -> None:
    """Load numba's array support without SciPy (about 0.15 s of a simulation's start-up).

    numba imports SciPy only to offer BLAS-backed ``np.dot``/``np.linalg`` in jitted code; no
    blis kernel uses them and the CLI takes no user functions, so the run commands let that
    optional import fail (numba's documented no-SciPy mode) and then restore ``import scipy``
    for everything else. Does nothing if SciPy or numba's array module is already loaded.
    """
    if "scipy" in sys.modules or "numba.np.arraymath" in sys.modules:
        return
    sys.modules["scipy"] = None  # type: ignore[assignment]  # makes `import scipy...` fail
    try:
        from numba.np import arraymath  # noqa: F401
    finally:
        del sys.modules["scipy"]


@main_group.command("run", cls=GroupedHelpCommand,
                    context_settings={"ignore_unknown_options": False})
@_add_run_options
@click.pass_context
def run_command(ctx: click.Context, **raw: object) -> None:
    """Generate a workload and simulate it; print the reference's metrics on stdout."""
    _simulate_and_print(ctx, raw, replay=False)


def _simulate_and_print(ctx: click.Context, raw: dict, replay: bool) -> None:
    """``blis run``/``blis replay``: build the options from the given flags, run, print."""
    _numba_without_scipy()
    # lazy: blis --help must not load numba
    from blis_fast.runner import execute_replay, execute_run

    startup_done()
    result = (execute_replay if replay else execute_run)(build_options(_given(ctx, raw)))
    sys.stdout.write(result.stdout)
    sys.stdout.flush()


def _given(ctx: click.Context, raw: dict) -> dict:
    """The options given on the command line (defaults are the options table's)."""
    return {name: ",".join(value) if isinstance(value, tuple) else value
            for name, value in raw.items()
            if ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE}


def _add_replay_options(func):
    """Attach the ``blis replay`` flags: the trace is the workload, so no workload flags."""
    return add_run_options(func, skip=WORKLOAD_FLAGS - {"results-path", "think-time-ms",
                                                        "metrics-path"})


@main_group.command("replay", cls=GroupedHelpCommand)
@_add_replay_options
@click.pass_context
def replay_command(ctx: click.Context, **raw: object) -> None:
    """Simulate the exact requests of a trace v2 (header + CSV); print the metrics on stdout."""
    _simulate_and_print(ctx, raw, replay=True)


BATCH_SYNTAX = "PROGRESS:NEW:INPUT:OUTPUT[,PROGRESS:NEW:INPUT:OUTPUT...]"
STEP_TIME_COLUMNS = ("batch", "requests", "prefill_tokens", "decode_requests", "step_time_us")


def _parse_batch(text: str) -> list[tuple[int, ...]]:
    """One ``--batch`` value: comma-separated requests, each four non-negative decimal
    integers joined by colons (progress, new tokens, input length, output length)."""
    entries = []
    for item in text.split(","):
        parts = item.split(":")
        if len(parts) != 4:
            raise click.BadParameter(f"{text!r}: a request is PROGRESS:NEW:INPUT:OUTPUT (four "
                                     f"integers), got {item!r}", param_hint="'--batch'")
        for name, part in zip(("PROGRESS", "NEW", "INPUT", "OUTPUT"), parts, strict=True):
            if not (part.isascii() and part.isdigit()) or int(part) >= 1 << 63:
                raise click.BadParameter(f"{text!r}: {name} must be a non-negative integer "
                                         f"below 2^63, got {part!r}", param_hint="'--batch'")
        entries.append(tuple(int(part) for part in parts))
    return entries


def _step_time_table(batches: list, times: list[int]) -> str:
    """One row per batch: requests, prefill tokens, decode requests, step time (µs)."""
    rows = [STEP_TIME_COLUMNS] + [
        tuple(str(v) for v in (j, b.requests, b.prefill_tokens, b.decode_requests, t))
        for j, (b, t) in enumerate(zip(batches, times, strict=True), start=1)]
    widths = [max(len(row[c]) for row in rows) for c in range(len(STEP_TIME_COLUMNS))]
    return "".join("  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) + "\n"
                   for row in rows)


@main_group.command("step-time", cls=GroupedHelpCommand)
@functools.partial(add_run_options, skip=frozenset(OPTIONS_BY_FLAG) - STEP_TIME_FLAGS)
@click.option("--batch", "batch_texts", multiple=True, required=True, metavar=BATCH_SYNTAX,
              help="one engine step's scheduled requests (repeat for more batches): per request "
                   "its progress (tokens already computed), new tokens this step, input and "
                   "output length")
@click.pass_context
def step_time_command(ctx: click.Context, batch_texts: tuple[str, ...], **raw: object) -> None:
    """Print the latency model's time (µs) of one engine step of each --batch, the backend
    resolved as blis run resolves it from the same flags."""
    parsed = [_parse_batch(text) for text in batch_texts]
    _numba_without_scipy()
    # lazy: blis --help must not load numba
    from blis_fast.api import step_batch, step_times

    batches = [step_batch(entries, f"--batch {text!r}")
               for entries, text in zip(parsed, batch_texts, strict=True)]
    times = step_times(build_options(_given(ctx, raw)), batches)
    sys.stdout.write(_step_time_table(batches, times))
    sys.stdout.flush()


class _CurrentStderrHandler(logging.StreamHandler):
    """A stderr handler that writes to whatever ``sys.stderr`` is at the time of each record."""

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


def _install_log_handler() -> None:
    """Diagnostics go to stderr as ``level=... msg="..."`` lines (the reference's logrus style)."""
    logger = logging.getLogger("blis_fast")
    if not logger.handlers:
        handler = _CurrentStderrHandler()
        handler.setFormatter(logging.Formatter('level=%(levelname)s msg="%(message)s"'))
        logger.addHandler(handler)
        logger.propagate = False


def main(argv: list[str] | None = None) -> None:
    """Entry point: run click without its own error handling, one stderr line per error."""
    _install_log_handler()
    try:
        main_group.main(args=argv, prog_name="blis", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.exceptions.Abort as exc:
        if isinstance(exc.__cause__, KeyboardInterrupt):
            sys.stderr.write("blis: interrupted\n")
            sys.exit(EXIT_INTERRUPTED)
        sys.stderr.write("blis: aborted\n")
        sys.exit(EXIT_USAGE)
    except click.ClickException as exc:
        sys.stderr.write(f"blis: error: {exc.format_message()}\n")
        sys.exit(EXIT_USAGE)
    except BlisError as exc:
        sys.stderr.write(f"blis: error: {exc}\n")
        sys.exit(EXIT_USAGE)
    except BrokenPipeError:
        sys.exit(1)
    except OSError as exc:  # a file error no check anticipated: still one line, no traceback
        where = f" {exc.filename}" if exc.filename else ""
        sys.stderr.write(f"blis: error:{where} {exc.strerror or exc}\n")
        sys.exit(EXIT_USAGE)
    except MemoryError:
        sys.stderr.write("blis: error: out of memory: the configuration asks for more memory "
                         "than this machine has (request count, lengths or cluster size)\n")
        sys.exit(EXIT_USAGE)
    except RecursionError:
        sys.stderr.write("blis: error: an input is nested too deeply to process\n")
        sys.exit(EXIT_USAGE)


def console_main() -> None:
    """The ``blis`` executable: :func:`main`, then leave without tearing the interpreter down.

    A simulation process ends holding Numba's compiler state (types, templates, LLVM modules):
    freeing it object by object, with the garbage collections that go with it, took 0.3 s of a
    1.1 s warm quick start. Output streams, logging and ``atexit`` handlers are flushed and run
    first, so nothing written is lost. The collector is off during the start-up imports and
    their objects are then frozen out of its reach (:func:`startup_done`), so collections
    during the run walk only the run's own objects.
    """
    gc.disable()
    code: int | str | None = 0
    try:
        main()
    except SystemExit as exc:
        code = exc.code
    _leave(code)


def _leave(code: int | str | None) -> None:
    """Wait for non-daemon threads, flush, run the exit handlers, and end the process with
    ``code`` (SystemExit's rules), as the interpreter's own exit would."""
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    if isinstance(code, str):
        sys.stderr.write(code + "\n")
        code = 1
    status = 0 if code is None else int(code)
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        status = status or 1
    try:
        sys.stderr.flush()
    except (BrokenPipeError, ValueError):
        pass
    logging.shutdown()
    atexit._run_exitfuncs()
    os._exit(status)


def startup_done() -> None:
    """Once the start-up imports are done: put the objects they made out of the collector's
    reach (``gc.freeze``) and turn the collector back on for the run itself. Does nothing
    unless :func:`console_main` turned the collector off."""
    if not gc.isenabled():
        gc.freeze()
        gc.enable()


if __name__ == "__main__":
    console_main()
