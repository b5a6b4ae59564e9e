"""The invariant outside a fresh process: on llama.cpp a request's tokens equal its lone run in a
fresh runtime whatever ran before it (other tasks, long answers, cancelled requests) and beside
it (threads, interleaved streams, a prefill mixed with decodes), on a quantized bundle and on a
q8_0-KV (flash-attention) bundle. References come from a fresh Runtime per request."""

from __future__ import annotations

import random
import threading

import numpy as np
import pytest

from prefix_edge import PrefixEdgeError, Runtime
from prefix_edge.llamacpp.seqstate import parse_seq_state
from prefix_edge.llamacpp.seqstate_write import in_stream

from .conftest import INPUTS

pytest.importorskip("llama_cpp")

TASKS = ["support", "sentiment", "raw"]


def _requests(seed: int = 0, n: int = 6):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        opts = {"max_tokens": rng.choice([6, 10, 16])}
        if i % 3 == 2:
            opts.update(temperature=0.9, top_k=30, seed=100 + i)
        out.append((TASKS[i % 3], rng.choice(INPUTS) + f" ({i})", opts))
    return out


def _lone(bundle, reqs, **open_kw):
    refs = []
    for t, x, o in reqs:
        with Runtime.open(bundle, backend="gguf", **open_kw) as rt:
            refs.append(rt.generate(t, x, **o).tokens)
    return refs


@pytest.fixture(scope="module", params=["int4", "q8kv"])
def case(request, bundle_int4, bundle_q8kv):
    bundle = {"int4": bundle_int4, "q8kv": bundle_q8kv}[request.param]
    reqs = _requests()
    return bundle, reqs, _lone(bundle, reqs)


def test_sequential_after_other_requests(case):
    bundle, reqs, refs = case
    with Runtime.open(bundle, backend="gguf", slots=4) as rt:
        for k in range(3 * len(reqs)):
            i = (k * 5) % len(reqs)
            # a long answer of another task first, and a cancelled one, to move the cells
            if k % 3 == 0:
                s = rt.stream(reqs[(i + 1) % len(reqs)][0], "filler " * (k + 1), max_tokens=40)
                next(s, None)
                s.cancel()
                list(s)
            assert rt.generate(*reqs[i][:2], **reqs[i][2]).tokens == refs[i], (k, i)


def test_threads_and_interleaved_streams(case):
    bundle, reqs, refs = case
    with Runtime.open(bundle, backend="gguf", slots=3) as rt:
        got = {}

        def worker(w):
            for j in range(4):
                i = (w + j) % len(reqs)
                got[(w, j)] = (i, rt.generate(*reqs[i][:2], **reqs[i][2]).tokens)

        threads = [threading.Thread(target=worker, args=(w,)) for w in range(5)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(got) == 20
        assert [refs[i] == toks for i, toks in got.values()] == [True] * 20
        # two streams advanced in turn on one thread, one starting while the other decodes
        a = rt.stream(*reqs[0][:2], **reqs[0][2])
        next(a)
        b = rt.stream(*reqs[1][:2], **reqs[1][2])
        for _ in zip(a, b):
            pass
        list(a), list(b)
        assert a.result.tokens == refs[0] and b.result.tokens == refs[1]


def test_shared_kv_opt_in_still_serves(bundle_int4):
    """shared_kv=True: the old unified cache (one prefix copy for all requests) still runs;
    equality with a lone run is not promised there, only answers of the asked length."""
    with Runtime.open(bundle_int4, backend="gguf", slots=2, shared_kv=True) as rt:
        r = rt.generate("support", INPUTS[0], max_tokens=5, logit_bias={int(e): -100 for e in rt.eos})
        assert len(r.tokens) == 5 and rt.engine_info()["residents"]["support"]["users"] == 0
    with pytest.raises(PrefixEdgeError, match="shared_kv must be"):
        Runtime.open(bundle_int4, backend="gguf", shared_kv="yes")


def test_context_is_per_request_and_max_tokens_clipped(bundle_int4):
    """Each slot's stream holds n_ctx positions: a request whose max_tokens would pass them ends
    with finish_reason "length" at the stream's end; one whose input cannot fit is refused up
    front with ContextLengthExceeded (the server's 400 context_length_exceeded)."""
    from prefix_edge.errors import ContextLengthExceeded

    with Runtime.open(bundle_int4, backend="gguf", slots=2, n_ctx=256) as rt:
        P = rt.manifest.tasks["support"].prefix_tokens
        ids = rt.encode_input("support", INPUTS[0])
        r = rt.generate("support", INPUTS[0], max_tokens=100_000, logit_bias={int(e): -100 for e in rt.eos})
        assert r.stats.finish_reason == "length"
        assert len(r.tokens) == 256 - P - len(ids)
        with pytest.raises(ContextLengthExceeded, match="256 tokens a request may use"):
            rt.generate("support", "word " * 400)


def test_in_stream_blob_layout(bundle_int4):
    """A bundle's one-stream blob placed in stream k of n: the stream count, k empty streams,
    the cells, the rest empty; llama.cpp reads it back as the same sequence (restore above)."""
    from prefix_edge.bundle import prefixfile

    t = next(p for p in (bundle_int4 / "tasks").iterdir() if p.name.endswith(".gguf.safetensors"))
    tensors = prefixfile.read(t, [prefixfile.STATE, prefixfile.IDS])[0]
    blob = tensors[prefixfile.STATE]
    info = parse_seq_state(blob)
    laid = in_stream(blob, 2, 4)
    assert laid.nbytes == blob.nbytes + 12
    assert laid[8:12].view("<u4")[0] == 4 and not laid[12:20].any()
    assert (laid[20:20 + blob.nbytes - 12] == blob[12:]).all() and not laid[-4:].any()
    one = in_stream(blob, 0, 1)  # one stream: the blob as it is
    assert one.dtype == np.uint8 and np.array_equal(one, np.ascontiguousarray(blob).view(np.uint8).reshape(-1))
    assert info.cell_count == len(tensors[prefixfile.IDS]) > 0  # a cell per prefix token
    with pytest.raises(PrefixEdgeError):
        in_stream(laid, 0, 4)  # not a one-stream blob
    with pytest.raises(PrefixEdgeError):
        in_stream(blob, 4, 4)


def test_request_text_and_bias_checks(bundle_int4):
    with Runtime.open(bundle_int4, backend="gguf", slots=1) as rt:
        with pytest.raises(PrefixEdgeError, match="lone surrogate"):
            rt.generate("support", "a\ud800b")
        with pytest.raises(PrefixEdgeError, match="stop is not valid text"):
            rt.generate("support", "hi", stop=["\udc00"])
        with pytest.raises(PrefixEdgeError, match="at most 300"):
            rt.generate("support", "hi", logit_bias={i: 1.0 for i in range(301)})
        with pytest.raises(PrefixEdgeError, match="outside this model's vocabulary"):
            rt.generate("support", "hi", logit_bias={10 ** 7: 1.0})
        r = rt.generate("support", "hi", max_tokens=2, logit_bias={int(e): -100 for e in rt.eos})
        assert r.stats.finish_reason == "length" and len(r.tokens) == 2
