"""The Python API: ``blis_fast.run(...)`` takes the options of ``blis run`` as keyword arguments."""

from __future__ import annotations

import numbers
import textwrap
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from blis_fast.engine.engine_config import Hooks
from blis_fast.errors import BlisConfigError, BlisInputError
from blis_fast.kernels.cluster import hooks as H
from blis_fast.kernels.engine import latency as K
from blis_fast.options import RUN_OPTIONS, build_options
from blis_fast.run_options_codegen import KIND_TYPES
from blis_fast.runner import RunResult, execute_replay, execute_run, step_latency


def _checked(what: str, user: Any) -> Any:
    """A Python wrapper of the user's jitted hook that raises on a non-finite score or key
    (NaN would otherwise route every request to instance 0 or scramble the queue)."""
    import numpy as np

    if what == "custom_scorer":
        def custom_scorer(snapshots, request, out):
            user(snapshots, request, out)
            for i in range(out.shape[0]):
                if not np.isfinite(out[i]):
                    raise ValueError("custom_scorer returned a non-finite score")
        return custom_scorer
    if what == "custom_scheduler_key":
        def custom_scheduler_key(features):
            key = user(features)
            if not np.isfinite(key):
                raise ValueError("custom_scheduler_key returned a non-finite key")
            return key
        return custom_scheduler_key

    def custom_admission(snapshots, request):
        return user(snapshots, request)
    return custom_admission


def _as_cfunc(fn: Any, sig: Any, what: str) -> Any:
    """Accept a cfunc of ``sig``, an ``@numba.njit`` function or a plain Python function.

    Functions are wrapped so a non-finite result raises; an exception raised in a hook is
    collected by the engine (``blis_fast.engine.simulate.hook_errors``) and stops the run.
    """
    if fn is None:
        return None
    import numba
    from numba.core.ccallback import CFunc
    from numba.core.registry import CPUDispatcher

    if isinstance(fn, CFunc):
        if fn._sig != sig:
            raise BlisConfigError(f"{what}: cfunc signature {fn._sig} differs from {sig}")
        return fn
    py_func = getattr(fn, "py_func", fn)
    if not callable(py_func):
        raise BlisConfigError(f"{what}: expected a function, got {type(fn).__name__}")
    try:
        user = fn if isinstance(fn, CPUDispatcher) else numba.njit(py_func)
        return numba.cfunc(sig)(_checked(what, user))
    except Exception as exc:  # noqa: BLE001 - report the user's compile error in one line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise BlisConfigError(f"{what}: cannot compile it with signature {sig}: {first}") from None


def run(*, custom_scorer: Any = None, custom_admission: Any = None,
        custom_scheduler_key: Any = None, **options: Any) -> RunResult:
    """Run one simulation, exactly as ``blis run`` with the same options would.

    Keyword names are the CLI flags with ``_`` for ``-`` (``num_requests=1000``,
    ``latency_model="blackbox"``); values are Python numbers, strings or sequences. Options not
    given take the CLI defaults. Files are written only when asked for (``metrics_path``,
    ``trace_output``, ``output_dir``). Raises ``BlisConfigError``/``BlisInputError`` on bad input.

    User policies (see ``blis_fast.kernels.cluster.hooks`` for what they observe and return):
    ``custom_scorer`` joins weighted routing as the scorer named ``custom``
    (``routing_policy="weighted", routing_scorers="custom:1,queue-depth:1"``);
    ``custom_admission`` is used with ``admission_policy="custom"``; ``custom_scheduler_key``
    with ``scheduler="custom"``. Each may be an ``@numba.njit`` function, a plain function
    Numba can compile, or a ``numba.cfunc`` of the documented signature.
    """
    hooks = Hooks(
        scorer=_as_cfunc(custom_scorer, H.SCORER_SIG, "custom_scorer"),
        admission=_as_cfunc(custom_admission, H.ADMISSION_SIG, "custom_admission"),
        scheduler_key=_as_cfunc(custom_scheduler_key, H.SCHEDULER_KEY_SIG,
                                "custom_scheduler_key"),
    )
    return execute_run(build_options(options, keywords=True), hooks=hooks)


def keyword_reference() -> str:
    """The keywords :func:`run` takes, one line each under the ``blis run --help`` headings,
    made from the same option rows as the CLI's flags (the type ``RunOptions`` annotates, real
    default, help)."""
    lines: list[str] = []
    group = None
    for spec in RUN_OPTIONS:
        if spec.group != group:
            group = spec.group
            lines += ["", f"{group}:"]
        default = spec.default_text()
        shown = f", default {default}" if default else ""
        lines.append(f"    {spec.field} ({KIND_TYPES[spec.kind]}{shown}): "
                     f"{spec.help}")
    return "\n".join(lines[1:])


run.__doc__ = (f"{run.__doc__.rstrip()}\n\n    Keywords (the rows of ``blis run --help``):\n\n"
               + textwrap.indent(keyword_reference(), "    ") + "\n")


def rerun(path: Any, *, custom_scorer: Any = None, custom_admission: Any = None,
          custom_scheduler_key: Any = None, **overrides: Any) -> RunResult:
    """Run again the simulation that wrote the Parquet file at ``path``, from the options its
    metadata records (``blis_fast.output.provenance``): ``blis run`` or ``blis replay`` as
    recorded, same stdout and same outputs.

    ``overrides`` are ``run`` keywords applied on top (e.g. ``output_dir=...``: the recorded
    options hold no output destinations, so a re-run writes files only when asked). Input
    files (workload spec, trace, configs) are read again from their recorded paths. A run made
    with user policies needs them passed again; ``BlisConfigError`` says which.
    """
    # lazy: pyarrow, for rerun only
    from blis_fast.output.provenance import read_provenance, rerun_options

    provenance = read_provenance(path)
    given = {"custom_scorer": custom_scorer, "custom_admission": custom_admission,
             "custom_scheduler_key": custom_scheduler_key}
    missing = [name for name in provenance.hooks if given[name] is None]
    if missing:
        raise BlisConfigError(f"{path}: the run used {', '.join(missing)}; pass "
                              f"{'it' if len(missing) == 1 else 'them'} to rerun again")
    hooks = Hooks(
        scorer=_as_cfunc(custom_scorer, H.SCORER_SIG, "custom_scorer"),
        admission=_as_cfunc(custom_admission, H.ADMISSION_SIG, "custom_admission"),
        scheduler_key=_as_cfunc(custom_scheduler_key, H.SCHEDULER_KEY_SIG,
                                "custom_scheduler_key"),
    )
    opts = rerun_options(provenance, **overrides)
    execute = execute_replay if provenance.command == "replay" else execute_run
    return execute(opts, hooks=hooks)


BATCH_FIELDS = ("progress", "new_tokens", "input_len", "output_len")
"""What each entry of a batch gives, in order (``kernels/engine/latency.py``'s batch contract)."""

_INT64_LIMIT = 1 << 63


class StepBatch(NamedTuple):
    """One batch as the step-time kernel reads it: four int64 arrays, entry ``i`` in each."""

    progress: np.ndarray
    new_tokens: np.ndarray
    input_len: np.ndarray
    output_len: np.ndarray

    @property
    def requests(self) -> int:
        return len(self.progress)

    @property
    def prefill(self) -> np.ndarray:
        """Entries that prefill this step (progress < input length)."""
        return self.progress < self.input_len

    @property
    def prefill_tokens(self) -> int:
        """New tokens of the prefill entries."""
        return int(self.new_tokens[self.prefill].sum())

    @property
    def decode_requests(self) -> int:
        """Entries that decode this step (prompt done and outputs to produce)."""
        return int(np.count_nonzero(~self.prefill & (self.output_len > 0)))


def _entry_values(entry: Any, where: str) -> tuple[int, ...]:
    """The four integers of one batch entry; ``BlisInputError`` naming the entry otherwise."""
    shown = repr(entry) if len(repr(entry)) <= 60 else repr(entry)[:57] + "..."
    is_row = isinstance(entry, (tuple, list)) or (type(entry).__name__ == "ndarray"
                                                   and entry.ndim == 1)
    if not is_row or len(entry) != len(BATCH_FIELDS):
        raise BlisInputError(f"{where} = {shown}: expected a tuple of 4 integers "
                             f"({', '.join(BATCH_FIELDS)})")
    for name, value in zip(BATCH_FIELDS, entry, strict=True):
        if (isinstance(value, bool) or type(value).__name__ == "bool_"
                or not isinstance(value, numbers.Integral)):
            raise BlisInputError(f"{where} = {shown}: {name} must be an integer, got "
                                 f"{type(value).__name__} {value!r}")
        if not 0 <= int(value) < _INT64_LIMIT:
            raise BlisInputError(f"{where} = {shown}: {name} must be a non-negative integer "
                                 f"below 2^63, got {int(value)}")
    return tuple(int(v) for v in entry)


def step_batch(batch: Any, where: str = "batch") -> StepBatch:
    """A batch (a sequence of ``(progress, new_tokens, input_len, output_len)`` tuples of
    non-negative integers) as the kernel's arrays; ``BlisInputError`` names the bad entry as
    ``<where>[i]``."""
    if isinstance(batch, (str, bytes)) or not (isinstance(batch, Sequence)
                                               or type(batch).__name__ == "ndarray"):
        raise BlisInputError(f"{where}: expected a sequence of (progress, new_tokens, input_len, "
                             f"output_len) tuples, got {type(batch).__name__}")
    rows = [_entry_values(entry, f"{where}[{i}]") for i, entry in enumerate(batch)]
    columns = np.array(rows, dtype=np.int64).reshape(len(rows), len(BATCH_FIELDS)).T
    return StepBatch(*(np.ascontiguousarray(c) for c in columns))


def step_times(opts: Any, batches: Sequence[StepBatch]) -> list[int]:
    """The time (µs) of one engine step of each batch under the latency backend a run with
    ``opts`` (a ``RunOptions``) resolves, resolved once: the engine's own kernel
    (``kernels.engine.latency.step_time``) over the batch's entries."""
    latency = step_latency(opts)
    return [int(K.step_time(latency.code, latency.params, b.requests, b.progress, b.new_tokens,
                            b.input_len, b.output_len)) for b in batches]


def step_time(*, batch: Any = None, batches: Any = None, **options: Any) -> int | list[int]:
    """The latency backend's time, in integer µs, of ONE engine step of ``batch``.

    ``batch`` is a sequence of ``(progress, new_tokens, input_len, output_len)`` tuples, one per
    request scheduled in the step: an entry prefills iff ``progress < input_len`` (its
    ``new_tokens`` prompt tokens), else decodes iff ``output_len > 0`` (``new_tokens`` is then
    normally 1); other entries still count in the batch size of the trained backends. The
    time is the engine's own step-time kernel over these entries, with the backend's
    parameters resolved exactly as ``blis run`` with the same ``options`` resolves them
    (keywords and their checks are :func:`run`'s: ``model``, ``hardware``, ``tp``,
    ``latency_model``, ``alpha_coeffs``, ``beta_coeffs``, ``model_config_folder``,
    ``hardware_config``, ...; the backend's warnings are logged as a run logs them).
    ``batches=[batch, ...]`` returns a list, one time per batch, the backend resolved once.
    A step of a run also adds any pending CPU-to-GPU KV transfer (``--kv-cpu-blocks``).

    Raises ``BlisConfigError``/``BlisInputError`` on bad options, as :func:`run` does, and
    ``BlisInputError`` naming the entry (``batch[2]``, ``batches[1][0]``) on a bad batch.
    """
    if (batch is None) == (batches is None):
        raise BlisInputError("step_time: give batch= (one batch) or batches= (a list of "
                             "batches), exactly one of them")
    opts = build_options(options, keywords=True)
    if batch is not None:
        return step_times(opts, [step_batch(batch, "batch")])[0]
    if isinstance(batches, (str, bytes)) or not isinstance(batches, Sequence):
        raise BlisInputError(f"batches: expected a list of batches, got {type(batches).__name__}")
    return step_times(opts, [step_batch(b, f"batches[{j}]") for j, b in enumerate(batches)])
