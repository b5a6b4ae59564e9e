"""The fused ONNX graph's KV buffers: a prefix's first sequence makes its home buffer, later
sequences of that prefix take it without a copy, and every answer equals the same request
run on a fresh backend (no buffer ever reused)."""

import gc

import numpy as np

from prefix_edge.bundle import Manifest
from prefix_edge.runtime.engines.onnx.engine import OnnxBackend

INPUTS = [np.array([5, 17, 42, 99, 7], np.int64),
          np.arange(30, 130, dtype=np.int64)]  # 100 tokens: outgrows a home (P + 64 positions)


def _open(bundle):
    return OnnxBackend(next((bundle / "onnx").glob("*.onnx")), threads=2)


def _prefix_file(bundle, task):
    return bundle / Manifest.read(bundle).tasks[task].prefixes["onnx"].file


def _greedy(be, ids, steps=10) -> list[int]:
    logits = be.prefill(ids)
    out = []
    for _ in range(steps):
        out.append(int(np.argmax(logits)))
        logits = be.step(out[-1])
    return out


def _reference(bundle, task, ids) -> list[int]:
    be = _open(bundle)  # a fresh backend: a fresh buffer, the prefix copied in
    be.begin(be.load_prefix(_prefix_file(bundle, task)))
    return _greedy(be, ids)


def test_home_buffers_reuse_without_changing_answers(bundle_int4):
    be = _open(bundle_int4)
    assert be.fused
    prefixes = {t: be.load_prefix(_prefix_file(bundle_int4, t)) for t in ("support", "sentiment")}
    ref = {(t, i): _reference(bundle_int4, t, ids) for t in prefixes for i, ids in enumerate(INPUTS)}
    order = [("support", 0), ("support", 1), ("sentiment", 0), ("support", 0), ("sentiment", 1),
             ("support", 1), ("sentiment", 0), ("support", 0)]
    for k, (task, i) in enumerate(order):
        p = prefixes[task]
        be.begin(p)
        if k >= 3:  # the task ran before: its home buffer is taken as it is
            assert be.seqs[be.single_seq][0] is p.state.home[1]
        assert _greedy(be, INPUTS[i]) == ref[(task, i)], (k, task, i)
    # the prefix's arrays are views of its home's first positions, which no forward wrote
    p = prefixes["support"]
    assert all(np.shares_memory(kv, a) for kv, a in zip(p.state.kv, p.state.home[1].arrays))
    again = be.load_prefix(_prefix_file(bundle_int4, "support"))
    for kv, fresh in zip(p.state.kv, again.state.kv):
        np.testing.assert_array_equal(kv, fresh)


def test_busy_home_is_copied_and_dead_homes_become_spares(bundle_int4):
    be = _open(bundle_int4)
    p = be.load_prefix(_prefix_file(bundle_int4, "support"))
    n = be.seq_restore(1, p)
    home = p.state.home[1]
    be.seq_restore(2, p)  # the home is held by sequence 1: sequence 2 gets a copy
    assert be.seqs[1][0] is home and be.seqs[2][0] is not home
    ref = [_reference(bundle_int4, "support", ids) for ids in INPUTS]
    got = {1: [], 2: []}
    logits = dict(zip((1, 2), be.forward([(1, n, INPUTS[0]), (2, n, INPUTS[1])])))
    pos = {1: n + INPUTS[0].size, 2: n + INPUTS[1].size}
    for _ in range(10):  # the two sequences step in turn
        for s in (1, 2):
            got[s].append(int(np.argmax(logits[s])))
            logits[s] = be.forward([(s, pos[s], np.array([got[s][-1]]))])[0]
            pos[s] += 1
    assert got[1] == ref[0] and got[2] == ref[1]
    be.seq_free(1)
    be.seq_free(2)
    assert home not in be._spare  # kept for the prefix
    del p
    gc.collect()
    be.begin(None)  # the next buffer request sweeps homes of prefixes gone
    assert not be._homes and home in be._spare + [be.seqs[be.single_seq][0]]
