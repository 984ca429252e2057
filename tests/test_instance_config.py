"""Per-instance configuration in the engine: KV totals (``KVMeta.TOTAL``), max model length
(``InstanceSlot.MAX_MODEL_LEN``) and the routable candidate list, the base P/D pools and
instances added during a run build on. A fleet with identical instances is covered by the
parity cases and the differential tool; these tests exercise instances that differ."""

from __future__ import annotations

import contextlib
import io
from dataclasses import replace

import numpy as np

from blis_fast.engine.simulate import run_engine
from blis_fast.kernels.engine.state import InstanceCounter
from blis_fast.kernels.kv import kvcache as kvc
from blis_fast.options import build_options
from blis_fast.runner import prepare

MODEL = "meta-llama/llama-3.1-8b-instruct"


def _kv(totals):
    return kvc.new_kv_state(len(totals), np.array(totals, np.int64), 16,
                            np.zeros(1, np.int64), np.zeros(0, np.uint64),
                            np.zeros(0, np.int64), np.zeros(0, np.int64))


def test_new_kv_state_sizes_each_instance_and_the_records_for_the_largest():
    kv = _kv([8, 3])
    assert kv.cfg[kvc.KVConfig.BLOCKS] == 8
    assert kv.meta[:, kvc.KVMeta.TOTAL].tolist() == [8, 3]
    assert [kvc.free_blocks(kv, i) for i in range(2)] == [8, 3]
    assert [kvc.used_blocks(kv, i) for i in range(2)] == [0, 0]
    assert kv.free_ring[1, :3].tolist() == [0, 1, 2]
    assert kv.blk[1, 3:, kvc.BlockField.FREE].tolist() == [0] * 5  # beyond its total


def test_reset_instance_blocks_empties_one_instance_with_its_own_total():
    kv = _kv([8, 8])
    kv.meta[1, kvc.KVMeta.FREE] = 2  # as if six blocks were taken
    kv.ht[1, 0, 0] = 77
    kvc.reset_instance_blocks(kv, 1, 5)
    assert kv.meta[1, kvc.KVMeta.TOTAL] == 5 and kvc.free_blocks(kv, 1) == 5
    assert kvc.used_blocks(kv, 1) == 0 and kv.ht[1].sum() == 0
    assert kv.free_ring[1, :5].tolist() == [0, 1, 2, 3, 4]
    assert kv.meta[0, kvc.KVMeta.TOTAL] == 8 and kvc.free_blocks(kv, 0) == 8


def _prepared(**extra):
    opts = {"model": MODEL, "num_instances": 2, "num_requests": 40, "rate": 5.0,
            "routing_policy": "round-robin", "log": "error", **extra}
    with contextlib.redirect_stderr(io.StringIO()):
        return prepare(build_options(opts))


def test_an_instance_with_a_smaller_max_model_len_refuses_what_the_other_serves():
    p = _prepared()
    longest = int((p.table.input_len + p.table.output_len).max())
    need = p.table.input_len + p.table.max_output_len
    short = int(np.sort(need)[len(need) // 2])
    eng = replace(p.engine, instance_max_model_len=(longest + 16, short))
    sim = run_engine(p.table, eng, model=p.latency.model)
    dropped = sim.counters[:, InstanceCounter.DROPPED]
    assert dropped[0] == 0
    # round-robin sends the odd rows to instance 1, which refuses every request whose prompt
    # or prompt + output budget exceeds its limit (ENG-3.4)
    n_in, budget = p.table.input_len[1::2], p.table.max_output_len[1::2]
    expected = int(((n_in >= short) | (n_in + budget > short)).sum())
    assert 0 < dropped[1] == expected < 20


def test_an_instance_with_fewer_kv_blocks_refuses_prompts_that_do_not_fit():
    p = _prepared()
    blocks = -(-p.table.input_len // 16)
    small = int(np.sort(blocks)[len(blocks) // 2])
    eng = replace(p.engine, instance_kv_blocks=(p.engine.options.total_kv_blocks, small),
                  instance_max_model_len=(0, 0))
    sim = run_engine(p.table, eng, model=p.latency.model)
    dropped = sim.counters[:, InstanceCounter.DROPPED]
    assert dropped[0] == 0
    assert dropped[1] == int((blocks[1::2] > small).sum()) > 0
