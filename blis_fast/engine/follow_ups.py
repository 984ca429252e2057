"""Closed-loop follow-ups: the room reserved for them and their rows appended to the kernel's
request arrays as sessions continue (WL-6.5, CLU-1.15)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from blis_fast.engine.packing import Capacity, RequestMeta
from blis_fast.engine.sessions import FollowUp, SessionDriver
from blis_fast.kernels.engine.state import RequestInputs
from blis_fast.kernels.enums import SessionOutcome
from blis_fast.kernels.kv.kv_layout import BlockList, KVConfig, pool_slots


@dataclass
class SessionPlan:
    """The closed-loop part of a workload: session blueprints and the follow-up budget."""

    blueprints: list
    follow_up_budget: int = -1


class OutOfRoom(Exception):
    """Follow-ups outgrew the reserved capacity (the run restarts, deterministically)."""


def initial_capacity(table, sessions: SessionPlan | None) -> Capacity:
    """Room for the follow-ups a session plan can bring (exact when rounds are bounded)."""
    n = table.n
    chunks = np.diff(table.chunk_offsets) if n else np.zeros(1, np.int64)
    max_chunks = int(chunks.max(initial=0)) + 1
    if not sessions or not sessions.blueprints:
        return Capacity(0, 0, 0, max_chunks)
    bounded = sum(max(bp.max_rounds - 1, 0) for bp in sessions.blueprints
                  if not bp.unlimited_rounds)
    unbounded = any(bp.unlimited_rounds for bp in sessions.blueprints)
    if sessions.follow_up_budget >= 0:
        rows = min(bounded + sessions.follow_up_budget, sessions.follow_up_budget)
    else:
        rows = bounded + (max(1024, 2 * n) if unbounded else 0)
    accumulate = any(bp.context_growth == "accumulate" for bp in sessions.blueprints)
    per_row = (4 if accumulate else 2) * max(max_chunks, 8)
    return Capacity(rows, rows * per_row, rows * (per_row + 2), 4 * max_chunks + 64)


class FollowUpRows:
    """Appends follow-ups to the run's request arrays, in the order they are generated."""

    def __init__(self, n0: int, pool_cursor: int) -> None:
        self.n = n0
        self.n0 = n0
        self.pool_cursor = pool_cursor
        self.follow_ups: list[FollowUp] = []

    def take(self, driver: SessionDriver, outcomes: np.ndarray, rs, inp: RequestInputs, kv, rt,
             meta: RequestMeta, room: Capacity):
        """Play ``OnComplete`` for each recorded outcome; append the follow-ups it returns.

        Returns the new rows and the event sequence numbers reserved for their arrivals.
        """
        rows: list[int] = []
        seqs: list[int] = []
        capacity = inp.arrival.shape[0]
        for row, tick, outcome, pi, seq in outcomes.tolist():
            b = int(inp.session[row])
            fu = driver.on_outcome(b, tick, outcome == SessionOutcome.COMPLETED, pi,
                                   int(inp.input_len[row]))
            if fu is None:
                continue
            k = self.n
            slots = int(pool_slots(fu.input_len, fu.output_len, kv.cfg[KVConfig.BLOCK_SIZE],
                                   kv.cfg[KVConfig.TIERED] == 1))
            c0 = int(kv.chunk_off[k])
            nch = fu.digests.shape[0]
            if (k >= capacity or c0 + nch > kv.chunk_dig.shape[0] or nch > room.max_chunks
                    or self.pool_cursor + slots >= kv.pool.shape[0]):
                raise OutOfRoom()
            inp.arrival[k] = fu.arrival_us
            inp.input_len[k] = fu.input_len
            inp.output_len[k] = fu.output_len
            inp.deadline[k] = fu.deadline_us
            rs.max_out[k] = fu.output_len
            kv.chunk_dig[c0 : c0 + nch] = fu.digests
            kv.chunk_off[k + 1] = c0 + nch
            kv.req[k, BlockList.OFFSET] = self.pool_cursor
            self.pool_cursor += slots
            if k + 1 < capacity:
                kv.req[k + 1, BlockList.OFFSET] = self.pool_cursor
            client = driver.blueprints[b].client_idx
            rt.req_priority[k] = meta.client_priority[client]
            rt.req_sheddable[k] = meta.client_priority[client] < 0
            rt.req_tenant[k] = meta.client_tenant[client]
            rt.req_model_bad[k] = meta.client_model_bad[client]
            inp.session[k] = b
            # a follow-up carries its session's LoRA adapter (LORA-1.7)
            inp.adapter[k] = inp.adapter[driver.blueprints[b].round0_row]
            self.n = k + 1
            self.follow_ups.append(fu)
            rows.append(k)
            seqs.append(seq)
        return np.array(rows, np.int64), np.array(seqs, np.int64)

    def table(self, table, sessions: SessionPlan):
        """The run's requests: the pre-generated rows, then the follow-ups in creation order."""
        fus = self.follow_ups
        bps = sessions.blueprints
        session_names = list(table.sessions)
        index = {name: k for k, name in enumerate(session_names)}
        for bp in bps:
            if bp.session_id not in index:
                index[bp.session_id] = len(session_names)
                session_names.append(bp.session_id)
        digests = np.concatenate([table.chunk_digests, *(f.digests for f in fus)])
        offsets = np.concatenate([table.chunk_offsets, table.chunk_offsets[-1]
                                  + np.cumsum([f.digests.shape[0] for f in fus], dtype=np.int64)])

        def column(values, name, dtype):
            return np.concatenate([getattr(table, name), np.array(values, dtype=dtype)])

        adapters = None
        if table.adapter_idx is not None:  # each follow-up has its session's adapter
            adapters = column([table.adapter_idx[bps[f.blueprint].round0_row] for f in fus],
                              "adapter_idx", np.int32)
        return replace(
            table,
            adapter_idx=adapters,
            arrival_us=column([f.arrival_us for f in fus], "arrival_us", np.int64),
            input_len=column([f.input_len for f in fus], "input_len", np.int64),
            output_len=column([f.output_len for f in fus], "output_len", np.int64),
            max_output_len=column([f.output_len for f in fus], "max_output_len", np.int64),
            deadline_us=column([f.deadline_us for f in fus], "deadline_us", np.int64),
            prefix_length=column([0] * len(fus), "prefix_length", np.int64),
            client_idx=column([bps[f.blueprint].client_idx for f in fus], "client_idx",
                              np.int32),
            chunk_offsets=offsets,
            chunk_digests=digests,
            session_idx=column([index[bps[f.blueprint].session_id] for f in fus],
                               "session_idx", np.int32),
            round_index=column([f.round_index for f in fus], "round_index", np.int32),
            text_tokens=column([0] * len(fus), "text_tokens", np.int64),
            image_tokens=column([0] * len(fus), "image_tokens", np.int64),
            audio_tokens=column([0] * len(fus), "audio_tokens", np.int64),
            video_tokens=column([0] * len(fus), "video_tokens", np.int64),
            reason_ratio=column([0.0] * len(fus), "reason_ratio", np.float64),
            sessions=session_names,
            request_numbers=column([-1] * len(fus), "request_numbers", np.int64),
            extra_ids=list(table.extra_ids) + [f.request_id for f in fus],
        )
