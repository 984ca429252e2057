"""The ``blis serve`` command: ``blis run``'s cluster, engine, KV and latency flags (the same
option rows, parsed and checked the same way) plus the server's own flags."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import math
import os
import signal
import sys
import tempfile
from typing import Any

import click
from click.core import ParameterSource

from blis_fast.cli_options import GroupedHelpCommand, add_run_options
from blis_fast.errors import BlisConfigError, BlisRuntimeError
from blis_fast.files import OutputPlan
from blis_fast.options import REPLAY_ONLY_FLAGS, WORKLOAD_FLAGS, build_options

SERVE_SKIPS = WORKLOAD_FLAGS | REPLAY_ONLY_FLAGS | {
    "trace-output", "results-path", "output-dir", "metrics-path"}
"""``blis run`` rows ``blis serve`` does not take: the workload is what clients send, and the
outputs of a run do not exist (``--trace-output`` is serve's own: what was served)."""
MAX_SPEED = 1e6
MAX_OUTPUT_TOKENS = 1 << 24
TRACE_FLAG = "--trace-output"


def _speed(ctx: click.Context, param: click.Parameter, value: float) -> float:
    if not math.isfinite(value) or value <= 0 or value > MAX_SPEED:
        raise click.BadParameter(f"{value!r}: must be a finite number in (0, {MAX_SPEED:g}]")
    return value


def _default_length(ctx: click.Context, param: click.Parameter,
                    value: str) -> tuple[int, float]:
    parts = value.split(",")
    try:
        mean = int(parts[0])
        stdev = float(parts[1]) if len(parts) == 2 else 0.0
    except ValueError:
        raise click.BadParameter(f"{value!r}: expected N or N,STDEV") from None
    if len(parts) > 2 or not 1 <= mean <= MAX_OUTPUT_TOKENS or not (
            math.isfinite(stdev) and 0 <= stdev <= MAX_OUTPUT_TOKENS):
        raise click.BadParameter(f"{value!r}: N must be in 1..{MAX_OUTPUT_TOKENS} and STDEV "
                                 f"a finite number in 0..{MAX_OUTPUT_TOKENS}")
    return mean, stdev


def parse_instance_ports(text: str | None, num_instances: int) -> list[int]:
    """``--instance-ports``: ``BASE`` (instance i listens on BASE+i; 0 gives each a free port)
    or one port per instance, comma-separated. Raises BlisConfigError naming the flag."""
    if not text:
        return []
    try:
        ports = [int(p) for p in text.split(",")]
    except ValueError:
        raise BlisConfigError(f"--instance-ports {text!r}: expected a base port or a "
                              "comma-separated list of ports") from None
    if len(ports) == 1:
        base = ports[0]
        ports = [0] * num_instances if base == 0 else [base + i for i in range(num_instances)]
    if len(ports) != num_instances:
        raise BlisConfigError(f"--instance-ports: {len(ports)} ports for {num_instances} "
                              "instances (give one per instance, or a base port)")
    bad = [p for p in ports if not 0 <= p <= 65535]
    if bad:
        raise BlisConfigError(f"--instance-ports: port {bad[0]} is outside 0..65535")
    named = [p for p in ports if p]
    if len(set(named)) != len(named):
        raise BlisConfigError("--instance-ports: a port is given twice")
    return ports


def write_served_trace(sim: Any, prefix: str) -> list[str]:
    """Write the trace v2 of what was served as ``<prefix>.yaml`` + ``<prefix>.csv``, both or
    neither (staged beside the targets, then moved into place)."""
    targets = [prefix + ".yaml", prefix + ".csv"]
    with tempfile.TemporaryDirectory(prefix="blis-serve-") as tmp:
        header, data = os.path.join(tmp, "trace.yaml"), os.path.join(tmp, "trace.csv")
        sim.write_trace(header, data)
        with OutputPlan() as plan:
            for target, made in zip(targets, (header, data), strict=True):
                with open(made, "rb") as fh:
                    plan.stage(target, TRACE_FLAG, fh.read())
            plan.commit()
    return targets


def warm_up(make_sim: Any, external_routing: bool, max_events: int = 100_000) -> None:
    """Run one small request through a throwaway simulation, so the kernels are compiled (or
    loaded from Numba's cache) before the clock starts: a first call inside the time loop
    would stall every stream for as long as it takes."""
    sim = make_sim()
    sim.submit(0, 16, 2, instance=0 if external_routing else None)
    for _ in range(max_events):
        nxt = sim.next_event_us()
        if nxt is None:
            break
        sim.advance(nxt + 1)
    sim.gauges()


def run_serve(sim: Any, config: Any, host: str, port: int, instance_ports: list[int],
              trace_output: str = "") -> int:
    """Serve until SIGINT/SIGTERM, then end the streams in flight, write the trace; 0."""
    # lazy: `blis --help` and the flag checks must not load aiohttp and prometheus_client
    from blis_fast.serve.app import LiveServer, serve_forever

    server = LiveServer(sim, config)

    def listening(ports: list[int]) -> None:
        sys.stderr.write(f"blis serve: listening on http://{host}:{ports[0]} (model "
                         f"{config.model}, {sim.num_instances} instance(s), speed "
                         f"{config.speed:g}x)\n")
        for i, p in enumerate(ports[1:]):
            sys.stderr.write(f"blis serve: instance {i} on http://{host}:{p}\n")
        sys.stderr.flush()

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
        try:
            await serve_forever(server, host, port, instance_ports, stop, listening)
        except OSError as exc:
            raise BlisConfigError(f"--host {host} / --port {port}: cannot listen: "
                                  f"{exc.strerror or exc}") from None

    # what start-up made (the compiled kernels, the modules: ~a million objects) lives as
    # long as the server: out of the collector's sight, a full collection under load takes
    # a few ms instead of the ~70 ms that stalled every stream at once (500 streams)
    gc.collect()
    gc.freeze()
    asyncio.run(main())
    if server.failure is not None:
        raise BlisRuntimeError(f"blis serve: the simulation failed: {server.failure}")
    written = write_served_trace(sim, trace_output) if trace_output else []
    tail = f"; trace written to {' + '.join(written)}" if written else ""
    sys.stderr.write(f"blis serve: stopped after {server.served} completed request(s){tail}\n")
    return 0


def _serve_options(func: Any) -> Any:
    opts = [
        click.option("--host", default="127.0.0.1", show_default=True,
                     help="the address to listen on"),
        click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True,
                     help="the fleet's port (0: any free port)"),
        click.option("--instance-ports", default=None, metavar="BASE|P1,P2,...",
                     help="each instance also listens on its own port (BASE+i, or one per "
                          "instance) with its own /metrics; the internal router is off"),
        click.option("--speed", type=float, default=1.0, show_default=True,
                     callback=_speed, help="simulated seconds per wall-clock second"),
        click.option("--trace-output", "serve_trace_output", default="", metavar="PREFIX",
                     help="write what was served as a trace v2 (<prefix>.yaml + .csv) when "
                          "the server stops"),
        click.option("--default-output-tokens", default="128", show_default=True,
                     metavar="N[,STDEV]", callback=_default_length,
                     help="output length of a request that gives no max_tokens; with a "
                          "standard deviation, drawn per request (normal, rounded, >= 1, "
                          "seeded by --seed)"),
        click.option("--content", type=click.Choice(["words", "echo"]), default="words",
                     show_default=True,
                     help="the filler text: fixed words, or the prompt's words echoed"),
    ]
    for opt in reversed(opts):
        func = opt(func)
    return func


def register(group: click.Group) -> None:
    """Add ``serve`` to the ``blis`` command group."""

    @group.command("serve", cls=GroupedHelpCommand)
    @functools.partial(add_run_options, skip=SERVE_SKIPS)
    @_serve_options
    @click.pass_context
    def serve_command(ctx: click.Context, host: str, port: int, instance_ports: str | None,
                      speed: float, serve_trace_output: str,
                      default_output_tokens: tuple[int, float],
                      content: str, **raw: object) -> None:
        """Serve a simulated vLLM fleet in real time behind an OpenAI-compatible API."""
        given = {name: ",".join(v) if isinstance(v, tuple) else v for name, v in raw.items()
                 if ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE}
        # no server-side deadline (run's --timeout is a client's): a client that gives up
        # disconnects, and its request is aborted
        options = build_options({**given, "timeout": "-1"})
        if serve_trace_output:
            plan = OutputPlan()
            for suffix in (".yaml", ".csv"):
                plan.check_file(serve_trace_output + suffix, TRACE_FLAG)
        # lazy: the flag checks above run without loading numba, aiohttp or the engine
        from blis_fast.serve.app import ServeConfig, load_token_counter
        from blis_fast.serve.live import LiveSimulation  # lazy: loads numba and the engine

        def make() -> Any:
            return LiveSimulation(options, external_routing=bool(instance_ports))

        warm_up(make, bool(instance_ports))
        sim = make()
        ports = parse_instance_ports(instance_ports, sim.num_instances)
        count, how = load_token_counter(options.model)
        sys.stderr.write(f"blis serve: prompt tokens {how}\n")
        config = ServeConfig(model=options.model, speed=speed,
                             default_output_tokens=default_output_tokens[0],
                             default_output_stdev=default_output_tokens[1],
                             seed=int(options.seed), content=content,
                             block_size=int(options.block_size_in_tokens),
                             external_routing=bool(ports), count_tokens=count)
        sys.exit(run_serve(sim, config, host, port, ports, serve_trace_output))


__all__ = ["SERVE_SKIPS", "parse_instance_ports", "register", "run_serve", "warm_up",
           "write_served_trace"]
