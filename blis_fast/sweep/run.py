"""``blis sweep``: validate every configuration, then run the missing ones in chunks and store them.

Order of work: parse and validate the spec (nothing written on failure), check the output
directory, then run chunks on the chosen backend; each finished chunk is written at once, so
an interrupted sweep keeps what it finished and ``resume=True`` runs only the rest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from blis_fast.compile_notice import finish_background_compile
from blis_fast.errors import BlisConfigError
from blis_fast.sweep.execute import TaskRunner
from blis_fast.sweep.progress import Progress
from blis_fast.sweep.spec import SweepConfig, SweepPlan, load_sweep_plan
from blis_fast.sweep.store import SweepStore
from blis_fast.sweep.worker import ChunkTask, check_stop, run_chunk

__all__ = ["SweepOutcome", "default_chunk_size", "run_sweep"]


@dataclass
class SweepOutcome:
    """What a sweep call did."""

    out_dir: Path
    total: int
    skipped: int
    ran: int
    errors: int


def default_chunk_size(num_configs: int) -> int:
    """Configurations per task: about 64 tasks, 1..32 configurations each.

    Depends on the sweep's size only (not on the worker count), so the summary files of a
    sweep are the same whichever backend ran it.
    """
    return max(1, min(32, math.ceil(num_configs / 64)))


def _chunks(plan: SweepPlan, configs: list[SweepConfig], size: int, with_requests: bool,
            offload_dir: Path) -> list[ChunkTask]:
    return [ChunkTask([(c.config_id, plan.run_kwargs(c, offload_dir=offload_dir))
                       for c in configs[i:i + size]], with_requests)
            for i in range(0, len(configs), size)]


def run_sweep(spec_path: str | Path, out_dir: str | Path, *, workers: int | None = None,
              backend: str = "local", ray_address: str | None = None, resume: bool = False,
              with_requests: bool = False, chunk_size: int | None = None,
              progress: TextIO | None = None) -> SweepOutcome:
    """Run the sweep of ``spec_path`` into ``out_dir``; progress lines go to ``progress``.

    Raises ``BlisConfigError``/``BlisInputError`` before writing anything if the spec, a
    configuration or the directory is unusable. ``KeyboardInterrupt`` stops the workers and
    propagates after the manifest records the interruption.
    """
    if chunk_size is not None and chunk_size < 1:
        raise BlisConfigError(f"--chunk-size must be >= 1, got {chunk_size}")
    with TaskRunner(backend, workers, ray_address) as runner:
        plan = load_sweep_plan(spec_path)
        store = SweepStore(out_dir, plan)
        done = store.done_ids(resume)
        pending = [c for c in plan.configs if c.config_id not in done]
        offload_dir = Path(out_dir) / "kv_offload"  # the varied offload blocks (spec.py)
        tasks = _chunks(plan, pending, chunk_size or default_chunk_size(len(plan.configs)),
                        with_requests, offload_dir)
        outcome = SweepOutcome(Path(out_dir), len(plan.configs), len(done), 0, 0)
        finish_background_compile()  # a cold cache compiles once here, not in every worker
        check_stop()  # Ctrl-C during validation: stop before writing anything
        store.begin(backend, runner.workers, len(pending))
        plan.write_offload_files(offload_dir, pending)
        bar = Progress(len(plan.configs), len(done), progress)
        try:
            for results in runner.map(run_chunk, tasks):
                store.write(results)
                failed = sum(r.error is not None for r in results)
                outcome.ran += len(results)
                outcome.errors += failed
                bar.advance(len(results), failed)
        except BaseException:
            store.finish(outcome.ran, outcome.errors, interrupted=True)
            raise
        finally:
            bar.close()
        store.finish(outcome.ran, outcome.errors, interrupted=False)
    return outcome
