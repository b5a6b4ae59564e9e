"""The invariant: a baked prefix gives the same tokens (and, on fp32, the same logits) as
prefilling that prefix in the request."""

from __future__ import annotations

import numpy as np
import pytest

from prefix_edge import Runtime

from .conftest import INPUTS

TASKS = ["support", "sentiment", "extract", "raw"]


@pytest.mark.parametrize("task", TASKS)
def test_fp32_first_step_logits_match(bundle_fp32, task):
    with Runtime.open(bundle_fp32) as rt:
        for text in INPUTS:
            ids = rt.encode_input(task, text)
            prefix, _ = rt.prefixes.get(task)
            rt.backend.begin(prefix)
            baked = rt.backend.prefill(ids)
            rt.backend.begin(None)
            full = rt.backend.prefill(np.concatenate([prefix.ids, ids]))
            assert np.max(np.abs(baked - full)) < 1e-5
            assert np.std(full) > 0.1  # the model is not degenerate: logits discriminate


@pytest.mark.parametrize("bundle", ["bundle_fp32", "bundle_int4"])
def test_greedy_tokens_match_prefill(request, bundle):
    path = request.getfixturevalue(bundle)
    with Runtime.open(path) as rt:
        produced = 0
        for task in TASKS:
            for text in INPUTS:
                a = rt.generate(task, text, max_tokens=16)
                b = rt.generate(task, text, max_tokens=16, use_prefix_cache=False)
                assert a.tokens == b.tokens, (task, text)
                assert a.text == b.text
                assert a.stats.prefix_cached and not b.stats.prefix_cached
                assert a.stats.prefix_tokens == b.stats.prefix_tokens == rt.tasks[task].prefix_tokens
                produced += len(a.tokens)
        assert produced > 0


def test_prefix_changes_the_output(bundle_fp32):
    """The baked KV is really used: a different task's prefix gives different logits."""
    with Runtime.open(bundle_fp32) as rt:
        ids = rt.encode_input("support", INPUTS[0])
        outs = []
        for task in ("support", "extract"):
            prefix, _ = rt.prefixes.get(task)
            rt.backend.begin(prefix)
            outs.append(rt.backend.prefill(ids))
        assert np.max(np.abs(outs[0] - outs[1])) > 1e-3


def test_int4_tracks_fp32(bundle_fp32, bundle_int4):
    """Quantization changes numbers, not the model: int4 logits correlate with fp32."""
    logits = []
    for b in (bundle_fp32, bundle_int4):
        with Runtime.open(b) as rt:
            prefix, _ = rt.prefixes.get("support")
            rt.backend.begin(prefix)
            logits.append(rt.backend.prefill(rt.encode_input("support", INPUTS[0])))
    assert np.corrcoef(logits[0], logits[1])[0, 1] > 0.9
