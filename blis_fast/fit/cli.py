"""The ``blis fit`` command: fit a latency backend's α/β (blackbox or trained-physics) to
observed traces, report, plot, predict holdouts.

The documented way to use the result: the printed ``--latency-model NAME --alpha-coeffs ...
--beta-coeffs ...`` flags, pasted into ``blis run``/``replay``. Every input is checked before
the fit starts; output files are written atomically after it, all or none. Exit codes: 0 the
fit converged (``blis_fast.fit.verdict``), 2 bad input (one line), 3 the fit did not fit (its
replay misses the training traces' means, or the loss did not improve; coefficients, report
and plot are still written).
"""

from __future__ import annotations

import json
import math
import sys

import click

from blis_fast.cli_numbers import GO_FLOAT, GO_INT, flag_number
from blis_fast.errors import BlisConfigError

_PASSED = ("model", "hardware", "tp", "vllm-version", "total-kv-blocks", "max-num-running-reqs",
           "max-num-scheduled-tokens", "num-instances")


def _fail(msg: str):
    raise BlisConfigError(msg)


def _number(name: str, text: str, *, integer: bool = False) -> float:
    return flag_number(GO_INT if integer else GO_FLOAT, name, text)


def _progress(stream):
    """An evaluation counter redrawn on a terminal (nothing when stderr is not one)."""
    if not getattr(stream, "isatty", lambda: False)():
        return None

    def show(count: int, loss: float, best: float) -> None:
        stream.write(f"\rfit: evaluation {count}, loss {loss:.4f}, best {best:.4f}\x1b[K")
        stream.flush()

    return show


@click.command("fit")
@click.option("--trace-header", multiple=True, metavar="FILE", help="Observed trace header "
              "(from blis observe); repeat with --trace-data for several traces (required)")
@click.option("--trace-data", multiple=True, metavar="FILE", help="Observed trace CSV (required)")
@click.option("--itl-data", multiple=True, metavar="FILE", help="ITL chunk CSV of each trace "
              "(from --record-itl): adds the ITL metric; give one per trace or none")
@click.option("--holdout", multiple=True, metavar="HEADER:DATA[:ITL]",
              help="A trace not used in the fit: its calibrate figures go to the report")
@click.option("--model", default="", help="LLM name for the replay (required)")
@click.option("--hardware", default=None, help="GPU type for the replay")
@click.option("--tp", default=None, help="Tensor parallelism for the replay")
@click.option("--vllm-version", default=None, help="vLLM version for the replay")
@click.option("--total-kv-blocks", default=None, help="KV blocks per instance")
@click.option("--max-num-running-reqs", default=None, help="Max requests in a running batch")
@click.option("--max-num-scheduled-tokens", default=None, help="Token budget per step")
@click.option("--num-instances", default=None, help="Instances serving the trace")
@click.option("--latency-model", default="blackbox", show_default=True,
              help="Backend to fit: blackbox or trained-physics (needs the model's config and "
              "the hardware, like blis run)")
@click.option("--loss", "loss_function", default="mape", show_default=True,
              help="Per-metric error to minimize: mape (calibrate's request-level MAPE) or "
              "rms-log (root mean square of ln(sim/real); symmetric: for a server whose speed "
              "wanders, where MAPE settles on its fastest periods)")
@click.option("--weight-ttft", default="1", show_default=True, help="Loss weight of TTFT")
@click.option("--weight-itl", default="1", show_default=True,
              help="Loss weight of ITL (used with --itl-data)")
@click.option("--weight-e2e", default="1", show_default=True, help="Loss weight of E2E")
@click.option("--warmup-requests", default="-1", show_default=True,
              help="Exclude request ids below this (-1: each header's warm_up_requests)")
@click.option("--network-rtt-us", default="-1", show_default=True,
              help="RTT in µs added to sim latencies (-1: each header's measured RTT)")
@click.option("--max-evaluations", default="2000", show_default=True,
              help="Most replays of the trace set")
@click.option("--time-limit", default="60", show_default=True, help="Seconds of fitting at most")
@click.option("--seed", default="0", show_default=True, help="Seed of the optimizer's start")
@click.option("--starts", default="1", show_default=True,
              help="Independent searches from seeded starts; they share --max-evaluations")
@click.option("--workers", default="1", show_default=True,
              help="Worker processes running the searches at once (the sweep's pool)")
@click.option("--backend", default="local", show_default=True,
              help="Where the workers run: local processes or ray")
@click.option("--out-coeffs", default="", metavar="FILE", help="Write the fitted coefficients "
              "(JSON: latency_model, alpha_coeffs, beta_coeffs)")
@click.option("--report", default="", metavar="FILE", help="Write the fit report JSON")
@click.option("--plot", "plot_path", default="", metavar="FILE",
              help="Draw the loss curve and observed vs predicted per metric (.png, .svg, .pdf)")
def fit_command(trace_header, trace_data, itl_data, holdout, model, latency_model, loss_function,
                weight_ttft, weight_itl, weight_e2e, warmup_requests, network_rtt_us,
                max_evaluations, time_limit, seed, starts, workers, backend, out_coeffs, report,
                plot_path, **replay) -> None:
    """Fit the latency model's coefficients so replays reproduce observed traces.

    Exit 3 when the fit did not fit (its replay misses the traces' mean TTFT, ITL or E2E by
    more than 15 %, or the loss did not improve); the coefficients are still written."""
    from blis_fast.files import OutputPlan  # lazy: not for blis --help
    from blis_fast.fit.problem import load_fit_trace  # lazy: not for blis --help

    if not trace_header or not trace_data:
        _fail("--trace-header and --trace-data are required")
    if len(trace_header) != len(trace_data):
        _fail(f"--trace-header given {len(trace_header)} times but --trace-data "
              f"{len(trace_data)} times; give them in pairs")
    if itl_data and len(itl_data) != len(trace_header):
        _fail(f"--itl-data given {len(itl_data)} times for {len(trace_header)} traces; "
              f"give one per trace or none")
    if not model:
        _fail("--model is required")
    from blis_fast.fit.optimize import FIT_MODELS  # lazy: not for blis --help

    if latency_model not in FIT_MODELS:
        _fail(f"--latency-model: {latency_model!r} cannot be fitted; choose one of "
              f"{', '.join(FIT_MODELS)}")
    from blis_fast.fit.problem import LOSSES  # lazy: not for blis --help

    if loss_function not in LOSSES:
        _fail(f"--loss: unknown value {loss_function!r}. Valid: {', '.join(LOSSES)}")
    weights, warm_up, rtt, max_evals, limit, seed_value, n_starts, n_workers = _search_flags(
        weight_ttft, weight_itl, weight_e2e, bool(itl_data), warmup_requests, network_rtt_us,
        max_evaluations, time_limit, seed, starts, workers, backend)
    if plot_path:
        from blis_fast.calibrate.plot import check_plot_path  # lazy: not for blis --help

        plot_format = check_plot_path(plot_path)
    holdouts = []
    for spec in holdout:
        parts = spec.split(":")
        if len(parts) not in (2, 3) or not all(parts):
            _fail(f"--holdout {spec!r}: expected HEADER:DATA or HEADER:DATA:ITL")
        holdouts.append(parts)
    plan = OutputPlan()  # every output checked before the fit, written together after it
    plan.add_inputs([*(("--trace-header", h) for h in trace_header),
                     *(("--trace-data", d) for d in trace_data),
                     *(("--itl-data", i) for i in itl_data),
                     *(("--holdout", path) for parts in holdouts for path in parts)])
    for flag, path in (("--out-coeffs", out_coeffs), ("--report", report),
                       ("--plot", plot_path)):
        if path:
            plan.check_file(path, flag)
    base = {name.replace("-", "_"): value for name, value in
            (("model", model), *((k.replace("_", "-"), v) for k, v in replay.items()))
            if value is not None}
    traces = [load_fit_trace(h, d, itl_data[i] if itl_data else None, warmup_requests=warm_up,
                             network_rtt_us=rtt)
              for i, (h, d) in enumerate(zip(trace_header, trace_data, strict=True))]
    held = [load_fit_trace(p[0], p[1], p[2] if len(p) == 3 else None, warmup_requests=warm_up,
                           network_rtt_us=rtt) for p in holdouts]
    from blis_fast.fit.optimize import starting_point  # lazy: not for blis --help
    from blis_fast.fit.problem import check_fittable, simulate  # lazy: not for blis --help

    guess = starting_point(FIT_MODELS[latency_model], traces, base)
    for ft, flag in [*((t, "--trace-data") for t in traces), *((t, "--holdout") for t in held)]:
        # refuses bad replay flags, and traces nothing can be fitted to, before the fit starts
        sims = simulate(ft, base, latency_model, guess[:3], guess[3:])
        # a holdout is graded on every metric it has pairs for, not only the weighted ones
        check_fittable(ft, sims, weights if flag == "--trace-data" else dict.fromkeys(weights, 1.0),
                       loss_function, flag)
    for ft in traces + held:  # after the checks: a refused run prints its one line only
        for line in left_out_lines(ft):
            sys.stderr.write(line + "\n")
    from blis_fast.fit.optimize import fit  # lazy: not for blis --help
    from blis_fast.fit.report import build_fit_report  # lazy: not for blis --help

    result = fit(traces, base, weights, latency_model=latency_model, max_evaluations=max_evals,
                 time_limit_s=limit, seed=seed_value, starts=n_starts, workers=n_workers,
                 backend=backend, loss=loss_function, on_evaluation=_progress(sys.stderr))
    if _progress(sys.stderr) is not None:
        sys.stderr.write("\n")
    fit_report, figures = build_fit_report(result, traces, held, base, weights)
    outputs: list[tuple[str, str, bytes]] = []
    if out_coeffs:
        coeffs = {"latency_model": latency_model, "alpha_coeffs": list(result.alpha),
                  "beta_coeffs": list(result.beta)}
        outputs.append(("out-coeffs", out_coeffs, (json.dumps(coeffs, indent=2) + "\n").encode()))
    if report:
        outputs.append(("report", report, (json.dumps(fit_report, indent=2) + "\n").encode()))
    if plot_path:
        from blis_fast.calibrate.plot import render_plot  # lazy: not for blis --help
        from blis_fast.fit.plot import plot_fit  # lazy: not for blis --help

        outputs.append(("plot", plot_path, render_plot(plot_fit(result, figures), plot_format)))
    with plan:
        for flag, path, data in outputs:
            plan.stage(path, f"--{flag}", data)
        plan.commit()
    for line in summary_lines(fit_report):
        sys.stderr.write(line + "\n")
    sys.stdout.write(paste_flags(latency_model, result.alpha, result.beta) + "\n")
    from blis_fast.fit.verdict import EXIT_DID_NOT_FIT  # lazy: not for blis --help

    if fit_report["verdict"]["result"] != "converged":
        sys.exit(EXIT_DID_NOT_FIT)


def _search_flags(weight_ttft, weight_itl, weight_e2e, has_itl: bool, warmup_requests,
                  network_rtt_us, max_evaluations, time_limit, seed, starts, workers,
                  backend: str) -> tuple:
    """The search's numbers, each checked (one line and exit 2 for a bad one): loss weights,
    warm-up requests, RTT, evaluation and time budgets, seed, starts, workers."""
    from blis_fast.fit.optimize import MAX_STARTS  # lazy: not for blis --help

    weights = {m: _number(f"weight-{m}", v) for m, v in
               (("ttft", weight_ttft), ("itl", weight_itl), ("e2e", weight_e2e))}
    for m, w in weights.items():
        if not math.isfinite(w) or w < 0:
            _fail(f"--weight-{m} must be a finite number >= 0, got {w}")
    if not any(weights[m] > 0 for m in ("ttft", "e2e")) and not (has_itl and weights["itl"] > 0):
        _fail("every loss weight is 0 (--weight-itl counts only with --itl-data)")
    warm_up = int(_number("warmup-requests", warmup_requests, integer=True))
    rtt = int(_number("network-rtt-us", network_rtt_us, integer=True))
    max_evals = int(_number("max-evaluations", max_evaluations, integer=True))
    if max_evals < 1:
        _fail(f"--max-evaluations must be >= 1, got {max_evals}")
    limit = _number("time-limit", time_limit)
    if not math.isfinite(limit) or limit <= 0:
        _fail(f"--time-limit must be a number of seconds > 0, got {time_limit}")
    seed_value = int(_number("seed", seed, integer=True))
    if seed_value < 0:  # numpy's generators take a seed >= 0 only
        _fail(f"--seed must be >= 0, got {seed_value}")
    n_starts = int(_number("starts", starts, integer=True))
    if n_starts < 1:
        _fail(f"--starts must be >= 1, got {n_starts}")
    if n_starts > min(max_evals, MAX_STARTS):
        _fail(f"--starts {n_starts} is more than "
              + (f"--max-evaluations {max_evals} (the starts share that budget, each needs at "
                 "least one evaluation)" if max_evals < MAX_STARTS else f"{MAX_STARTS}"))
    n_workers = int(_number("workers", workers, integer=True))
    if n_workers < 1:
        _fail(f"--workers must be >= 1, got {n_workers}")
    if backend not in ("local", "ray"):
        _fail(f"--backend: unknown value {backend!r}. Valid: local, ray")
    return weights, warm_up, rtt, max_evals, limit, seed_value, n_starts, n_workers


def left_out_lines(ft) -> list[str]:
    """What a trace's quality flags leave out of TTFT and ITL (E2E keeps every request)."""
    kinds = {"burst": "delivered in one burst", "not_streamed": "not streamed",
             "client_late": "read by a late client"}
    flagged = ft.flags.flagged if ft.flags is not None else set()
    if not flagged:
        return []
    parts = ", ".join(f"{len(ids)} {kinds[k]} (e.g. request {ids[0]})"
                      for k, ids in ft.left_out.items() if ids)
    return [f"fit: {ft.data_path}: {len(flagged)} request(s) left out of TTFT and ITL, E2E kept: "
            f"{parts}"]


def paste_flags(latency_model: str, alpha, beta) -> str:
    """The ``blis run``/``replay`` flags of fitted coefficients (full precision)."""
    return (f"--latency-model {latency_model} --alpha-coeffs "
            f"{','.join(repr(float(a)) for a in alpha)} "
            f"--beta-coeffs {','.join(repr(float(b)) for b in beta)}")


def summary_lines(fit_report: dict) -> list[str]:
    """One line for the fit, one per trace with its MAPE per metric."""
    stopped = fit_report["stopped"]
    search = "search settled" if stopped == "converged" else f"search stopped: {stopped}"
    lines = [f"fit: {len(fit_report['losses'])} evaluations in {fit_report['seconds']:.1f} s "
             f"({search}), loss ({fit_report['loss_function']}) {fit_report['loss']:.4f}"]
    for entry in fit_report["traces"] + fit_report["holdout"]:
        figures = ", ".join(f"{m} MAPE {v['request_level']['mape'] * 100:.1f}%"
                            for m, v in entry["calibration"]["metrics"].items())
        lines.append(f"fit: {entry['role']} {entry['trace_data']}: {figures}")
    from blis_fast.fit.verdict import Verdict  # lazy: not for blis --help

    lines.append(Verdict(**{k: fit_report["verdict"][k] for k in ("means", "start_loss", "loss")},
                         fitted=fit_report["verdict"]["result"] == "converged").line())
    return lines


def register(main_group: click.Group) -> None:
    """Add ``fit`` to the ``blis`` command group."""
    main_group.add_command(fit_command)
