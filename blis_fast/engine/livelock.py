"""The error of a run that can never finish (``Status.LIVELOCK``), naming the flag to change.

The kernel stops such a run as soon as it is proven endless (``kernels/engine/event_loop.py:
_never_finishes``, ``kernels/engine/step.py: skip_idle_steps``,
``kernels/engine/livelock.py``): the reference simulator, given
the same configuration, preempts and re-admits the same requests, or takes empty steps, until it
is killed. No output is written.
"""

from __future__ import annotations

import logging

from blis_fast.errors import BlisConfigError
from blis_fast.kernels.engine.lora import LoraVar
from blis_fast.kernels.engine.state import LoopSlot
from blis_fast.kernels.enums import Livelock

log = logging.getLogger("blis_fast")


def livelock_error(loop, totals, table, pd_on: bool) -> BlisConfigError:
    """The one-line error of a livelocked run: the request and instance that can never move on,
    why, and the flags that would let the run finish (``loop``: the event heap's loop slots,
    ``totals``: each instance's GPU KV blocks, ``table``: the workload's RequestTable)."""
    row = int(loop[LoopSlot.STOP_ROW])
    inst = int(loop[LoopSlot.STOP_INST])
    name = f"row {row}"
    if table is not None and 0 <= row < table.n:
        name = table.request_id(row)
    elif table is not None and pd_on and table.n <= row < 2 * table.n:  # P/D: a prefill row
        name = f"the prefill of {table.request_id(row - table.n)}"
    blocks = ("the P/D pools' KV blocks (--total-kv-blocks, --prefill-decode-instances/"
              "--decode-instances)" if pd_on else "--total-kv-blocks")
    if int(loop[LoopSlot.STOP_KIND]) == Livelock.TOO_BIG:
        why = (f"request {name} needs {int(loop[LoopSlot.STOP_NEED])} KV blocks to finish but "
               f"instance_{inst} has {int(totals[inst])}, so it is preempted and re-admitted "
               "forever")
    elif int(loop[LoopSlot.STOP_KIND]) == Livelock.LORA_STALL:
        return BlisConfigError(
            f"--lora-adapter-capacity: the run can never finish: instance_{inst}'s wait queue "
            f"(first {name}) waits for a LoRA adapter that cannot load, every adapter slot "
            "being pinned by requests queued behind it (preempted requests keep their pins), "
            "so it takes empty steps forever (the reference loops until killed); raise "
            "--lora-adapter-capacity, use --scheduler fcfs, or give a --timeout or --horizon")
    elif int(loop[LoopSlot.STOP_KIND]) == Livelock.CYCLE:
        why = (f"instance_{inst} (wait queue first {name}) keeps preempting and re-admitting "
               "the same requests, its state repeating exactly with nothing else left to happen"
               + (" (KV blocks reserved for waiting decode sub-requests starve the running ones)"
                  if pd_on else ""))
    else:
        why = (f"instance_{inst}'s wait queue (first {name}) waits for KV blocks that nothing "
               "will ever free, so it takes empty steps forever")
    return BlisConfigError(
        f"--total-kv-blocks: the run can never finish: {why} (the reference loops until "
        f"killed); raise {blocks}, cap request lengths with --max-model-len, or give a "
        "--timeout or --horizon")


def warn_lora_stall(lora, table) -> None:
    """Warn once when the run hit the reference's LoRA stall (LORA-D1, ``lora``: the kernel's
    LoRA state or None): an instance whose cold queue head could not load because every
    adapter slot was pinned took empty steps until a timeout, an arrival or the horizon."""
    if lora is None or int(lora.var[LoraVar.STALL_STEPS]) == 0:
        return
    log.warning(
        "LoRA stall (reference defect LORA-D1): instance_%d could not load the adapter of its "
        "queue head from tick %d on, every adapter slot being pinned (preempted requests keep "
        "their pins), and took empty steps until a timeout, an arrival or the horizon freed it",
        int(lora.var[LoraVar.STALL_INST]), int(lora.var[LoraVar.FIRST_STALL]))
