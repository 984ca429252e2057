"""What workload generation hands a run: the table of requests with the closed-loop session
blueprints and follow-up budget (:class:`GeneratedWorkload`, :class:`SessionBlueprint`; made by
``generator.py`` and ``replay.py``, continued by ``engine/sessions.py``), and the deadlines
``--timeout`` sets on them afterwards (DELTA-28)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from blis_fast.workload.request_table import RequestTable
from blis_fast.workload.samplers import SamplerSpec
from blis_fast.workload.spec import ClientSpec, has_multi_turn


@dataclass
class SessionBlueprint:
    """A closed-loop session the engine continues after each completion (WL-6.4/6.5, DELTA-47/48).

    ``seed`` seeds the session's own Go RNG (``NewSource(seed)``); follow-ups draw, in order,
    input length, output length, input ids, output ids from it (after a think-time draw if the
    engine adds a think-time sampler). ``prefix`` is prepended to every follow-up input.
    For ``context_growth == "accumulate"``, ``round0_input``/``round0_output`` are the token
    ids of the session's round-0 request (DELTA-46 builds the context from them).
    """

    session_id: str
    client_id: str
    client_idx: int  # index into the table's ``clients`` (the claiming client)
    seed: int
    max_rounds: int
    unlimited_rounds: bool
    context_growth: str
    think_time_us: int
    timeout: int | None  # µs; None = 300 s default for session requests, 0 = no deadline
    horizon: int
    input_sampler: SamplerSpec
    output_sampler: SamplerSpec
    prefix: np.ndarray  # int64 token ids (empty = none)
    tenant_id: str
    slo_class: str
    model: str
    round0_row: int  # row of the session's round-0 request in the table
    round0_input: np.ndarray | None = None  # int32 token ids (accumulate sessions only; a view)
    round0_output: np.ndarray | None = None  # int32 token ids (a view of a shared buffer)
    # replay (DELTA-65): think times drawn per follow-up instead of ``think_time_us``, and the
    # session's Go RNG state after its round-0 draws (used instead of ``seed``)
    think_sampler: SamplerSpec | None = None
    rng_state: np.ndarray | None = None


@dataclass
class GeneratedWorkload:
    """The reference's ``GeneratedWorkload``: requests, session blueprints, follow-up budget.

    ``follow_up_budget`` is -1 for no cap, else the number of follow-ups the engine may
    generate (DELTA-47.4). ``clients`` is the working client list (explicit clients, expanded
    inference-perf / ServeGen clients, then cohort members), aligned with ``table.clients``.
    """

    table: RequestTable
    sessions: list[SessionBlueprint] = field(default_factory=list)
    follow_up_budget: int = -1
    clients: list[ClientSpec] = field(default_factory=list)
    # the input token ids of each table row (group prefix included), only when asked for
    # with ``keep_token_ids`` (``blis observe`` builds its prompts from them, OBS-4.3)
    input_ids: list[np.ndarray] | None = None

    @property
    def outputs_reenter_inputs(self) -> bool:
        """Whether some request's input repeats an earlier request's output tokens: a multi-turn
        client accumulates context, in open loop (later rounds are drawn so, WL-6.2) or closed
        loop (follow-ups are built so at completion, WL-6.5). Only then can the prefix cache
        ever match a block that output tokens filled."""
        return any(has_multi_turn(c) and c.reasoning.multi_turn.context_growth == "accumulate"
                   for c in self.clients)


def apply_timeout(table: RequestTable, timeout_s: int) -> RequestTable:
    """Overwrite every deadline from ``--timeout`` seconds (DELTA-28): arrival + T*1e6, or 0 if T < 0."""
    if timeout_s == 0:
        raise ValueError("timeout 0 must be rejected by the caller (use a negative value)")
    if timeout_s > 0:
        with np.errstate(over="ignore"):
            deadline = table.arrival_us + np.int64(int(timeout_s) * 1_000_000)
    else:
        deadline = np.zeros(table.n, dtype=np.int64)
    return table.with_deadlines(deadline)


def apply_timeout_to_workload(wl: GeneratedWorkload, timeout_s: int) -> GeneratedWorkload:
    """``applyTimeoutToRequests``: request deadlines and blueprint timeouts from ``--timeout``."""
    table = apply_timeout(wl.table, timeout_s)
    us = int(timeout_s) * 1_000_000 if timeout_s > 0 else 0
    sessions = [replace(b, timeout=us) for b in wl.sessions]
    return GeneratedWorkload(table, sessions, wl.follow_up_budget, wl.clients)
