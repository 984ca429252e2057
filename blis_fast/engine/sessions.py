"""Closed-loop sessions: the reference's SessionManager, driven by the engine's outcomes.

The kernel records every terminal outcome of a closed-loop request (completion with its tick
and progress index, or a cancelling timeout/drop) and stops before the first event a
follow-up could precede. :class:`SessionDriver` then plays ``OnComplete`` for each outcome in
the order they happened (WL-6.5 with DELTA-46/48): state checks, follow-up budget, think time
and horizon guard, the session RNG's draws, context accumulation, the prefix, the new id and
deadline. Token ids live here only as long as a session needs them for its context.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from blis_fast.kernels.generation.samplers import DIST_SEQUENCE, sample_length
from blis_fast.kernels.generation.token_ids import draw_token_ids
from blis_fast.kernels.go.gorand import new_source
from blis_fast.kernels.hashing import block_digests
from blis_fast.workload.spec import DEFAULT_TIMEOUT_US

ACTIVE, COMPLETED, CANCELLED, HORIZON_INTERRUPTED, BUDGET_EXHAUSTED = range(5)
"""Session states (the reference's sessionState values)."""


@dataclass
class FollowUp:
    """One generated follow-up request, ready to be appended to the request arrays."""

    blueprint: int  # index of its session's blueprint
    request_id: str
    arrival_us: int
    input_len: int
    output_len: int
    deadline_us: int
    round_index: int
    digests: np.ndarray  # uint64 content digests of the full blocks of input ++ output
    input_ids: np.ndarray | None = None  # int64 input token ids (prefix and context included)


@dataclass
class SessionDriver:
    """Per-session state of a run's closed-loop sessions (``blueprints`` from the generator).

    ``follow_up_budget`` < 0 means no cap (DELTA-47.4); otherwise at most that many follow-ups
    are generated over the whole run.
    """

    blueprints: list
    follow_up_budget: int
    block_size: int
    state: np.ndarray = field(init=False)
    current_round: np.ndarray = field(init=False)
    follow_ups: int = field(init=False, default=0)
    id_counter: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        """Seed each session's RNG and set every session active at round 0."""
        n = len(self.blueprints)
        for bp in self.blueprints:
            for sampler in (bp.input_sampler, bp.output_sampler):
                if not sampler.valid:
                    raise ValueError(f"session {bp.session_id}: {sampler.error}")
        self.state = np.full(n, ACTIVE, dtype=np.int8)
        self.current_round = np.zeros(n, dtype=np.int64)
        self._rng = [new_source(int(bp.seed)) if bp.rng_state is None
                     else np.array(bp.rng_state, dtype=np.int64) for bp in self.blueprints]
        # cursors of replayed sessions' sequence samplers (input, output, think time)
        self._cursor = np.zeros((n, 3), dtype=np.int64)
        # accumulate sessions: context so far, and the last request's input and output ids
        self._context: list[np.ndarray | None] = [None] * n
        self._last_input: list[np.ndarray | None] = [
            None if bp.round0_input is None else np.asarray(bp.round0_input, np.int64)
            for bp in self.blueprints]
        self._last_output: list[np.ndarray | None] = [
            None if bp.round0_output is None else np.asarray(bp.round0_output, np.int64)
            for bp in self.blueprints]

    def think_times(self) -> np.ndarray:
        """Each session's least think time (µs): the earliest a follow-up can arrive after a
        completion (0 when think times are drawn)."""
        return np.array([0 if bp.think_sampler is not None else int(bp.think_time_us)
                         for bp in self.blueprints] + [0], dtype=np.int64)

    def _sample(self, b: int, which: int, sampler) -> int:
        """One draw of ``sampler`` for session ``b`` (sequence samplers replay their values)."""
        if sampler.code == DIST_SEQUENCE:
            values = sampler.params
            if values.shape[0] == 0:
                return 1
            k = self._cursor[b, which]
            self._cursor[b, which] = k + 1
            return int(values[k % values.shape[0]])
        return int(sample_length(self._rng[b], sampler.code, sampler.params))

    def on_outcome(self, b: int, tick: int, completed: bool, progress_index: int,
                   input_len: int, output_ids: np.ndarray | None = None) -> FollowUp | None:
        """``OnComplete`` for a request of session ``b`` that ended at ``tick``.

        ``completed`` is False for a timeout or a drop (the session is cancelled);
        ``progress_index`` and ``input_len`` are the finished request's. ``output_ids``
        replaces the finished request's drawn output ids in an accumulated context
        (``blis observe`` passes ``1..k`` for the k tokens a real server returned, OBS-5.6).
        """
        if output_ids is not None:
            self._last_output[b] = np.asarray(output_ids, np.int64)
        if self.state[b] != ACTIVE:
            return None
        if not completed:
            self.state[b] = CANCELLED
            return None
        bp = self.blueprints[b]
        if not bp.unlimited_rounds and self.current_round[b] >= bp.max_rounds - 1:
            self.state[b] = COMPLETED
            return None
        if self.follow_up_budget >= 0 and self.follow_ups >= self.follow_up_budget:
            self.state[b] = BUDGET_EXHAUSTED
            return None
        think = (int(bp.think_time_us) if bp.think_sampler is None
                 else self._sample(b, 2, bp.think_sampler))
        arrival = tick + think
        if arrival > bp.horizon:
            self.state[b] = HORIZON_INTERRUPTED
            return None
        in_len = self._sample(b, 0, bp.input_sampler)
        out_len = self._sample(b, 1, bp.output_sampler)
        # GenerateRandomTokenIDs: input ids, then output ids, from the session's stream
        new_ids = np.empty(in_len, dtype=np.int64)
        draw_token_ids(self._rng[b], new_ids, 0, in_len)
        out_ids = np.empty(out_len, dtype=np.int64)
        draw_token_ids(self._rng[b], out_ids, 0, out_len)
        if bp.context_growth == "accumulate":
            tokens = self._accumulate(b, progress_index - input_len, new_ids)
            self._last_input[b] = tokens
            self._last_output[b] = out_ids
        else:
            tokens = new_ids
            if len(bp.prefix):
                tokens = np.concatenate((np.asarray(bp.prefix, np.int64), tokens))
        self.current_round[b] += 1
        self.id_counter += 1
        if self.follow_up_budget >= 0:
            self.follow_ups += 1
        rnd = int(self.current_round[b])
        return FollowUp(
            blueprint=b,
            request_id=f"session_{bp.session_id}_round_{rnd}_{self.id_counter}",
            arrival_us=arrival,
            input_len=int(tokens.shape[0]),
            output_len=int(out_ids.shape[0]),
            deadline_us=session_deadline(arrival, bp.timeout),
            round_index=rnd,
            digests=_digests(np.concatenate((tokens, out_ids)), self.block_size),
            input_ids=tokens,
        )

    def _accumulate(self, b: int, actual_out: int, new_ids: np.ndarray) -> np.ndarray:
        """DELTA-46: extend the context by the finished request's new input suffix and the
        output it actually produced; the next input is prefix ++ context ++ new ids."""
        bp = self.blueprints[b]
        last_in = self._last_input[b]
        last_out = self._last_output[b]
        ctx = self._context[b]
        if ctx is None:
            ctx = np.zeros(0, np.int64)
        parts = [ctx]
        if last_in is not None and last_in.shape[0] > ctx.shape[0]:
            parts.append(last_in[ctx.shape[0]:])
        if actual_out > 0 and last_out is not None and last_out.shape[0] > 0:
            parts.append(last_out[:actual_out])
        ctx = np.concatenate(parts) if len(parts) > 1 else ctx
        self._context[b] = ctx
        head = [np.asarray(bp.prefix, np.int64)] if len(bp.prefix) else []
        return np.concatenate([*head, ctx, new_ids])


def _digests(tokens: np.ndarray, block_size: int) -> np.ndarray:
    """Content digests of the full blocks of a follow-up's input ++ output."""
    n = tokens.shape[0] // block_size
    out = np.empty(n, dtype=np.uint64)
    block_digests(tokens, 0, block_size, n, out, 0)
    return out


def session_deadline(arrival: int, timeout: int | None) -> int:
    """``computeDeadline`` for a session request: 300 s by default, none when 0 (WL-5.7)."""
    offset = DEFAULT_TIMEOUT_US if timeout is None else int(timeout)
    return arrival + offset if offset > 0 else 0
