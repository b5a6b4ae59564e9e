"""Many requests at once on one Runtime: threads, interleaved streams, cancellation, close, the
bounded queue and shared prefixes. Every output is checked against the same request run alone
(sequentially, on a fresh runtime).

ONNX runs each sequence on its own (bit-identical to running alone by construction). llama.cpp
batches the sequences' decode tokens, and by default gives each request slot a KV stream of its
own (`kv_unified = false`), so a sequence always sits at the same cells and its attention sums
run in the same order: with a shared (unified) cache, where cells land moves near-tie greedy
tokens (measured on the default Q4_1 bundle: 13/18 sequential and 17/24 threaded answers equal
a fresh runtime's, against 18/18 and 24/24 with a stream per slot). So both backends' equality
tests run on the quantized int4/q8_0 bundle, not on an f32 one."""

from __future__ import annotations

import asyncio
import random
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from prefix_edge import PrefixEdgeError, Runtime

from .conftest import INPUTS

BACKENDS = ["onnx", "gguf"]
TASKS = ["support", "sentiment", "raw"]


def _no_eos(rt) -> dict:
    """Long generations that a test cancels must not end by themselves first."""
    return {"logit_bias": {int(e): -100.0 for e in rt.eos}}


def _slow_steps(rt, seconds: float = 0.02) -> None:
    """Every engine step (one forward) takes `seconds` longer, so a long generation cannot reach
    max_tokens within a short timeout or before a close()."""
    be = rt._sched.backend
    forward = be.forward

    def slow(items):
        threading.Event().wait(seconds)
        return forward(items)

    be.forward = slow


def _backend(name):
    if name == "gguf":
        pytest.importorskip("llama_cpp")
    return name


def _requests(n: int, seed: int = 0):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        task = TASKS[i % len(TASKS)]
        text = rng.choice(INPUTS) + f" #{i}"
        opts = {"max_tokens": rng.choice([4, 8, 12])}
        if i % 4 == 3:  # some sampled, seeded
            opts.update(temperature=0.8, top_k=20, seed=i)
        out.append((task, text, opts))
    return out


@pytest.fixture(scope="module")
def bundles(bundle_int4, bundle_fp32):
    return {"onnx": bundle_int4, "gguf": bundle_int4}


@pytest.fixture(scope="module")
def reference(bundles):
    """Each request alone, one at a time, on a fresh runtime per backend."""
    refs = {}
    for b in BACKENDS:
        if b == "gguf" and pytest.importorskip("llama_cpp") is None:
            continue
        with Runtime.open(bundles[b], backend=b, slots=1) as rt:
            refs[b] = [rt.generate(t, x, **o).tokens for t, x, o in _requests(200)]
    return refs


@pytest.mark.parametrize("backend", BACKENDS)
def test_threads_match_sequential(bundles, reference, backend):
    """8 threads x 25 requests over 3 tasks (greedy and seeded sampling) = sequential outputs."""
    reqs = _requests(200)
    with Runtime.open(bundles[backend], backend=_backend(backend), slots=8) as rt:
        def worker(k):
            return [(i, rt.generate(*reqs[i][:2], **reqs[i][2]).tokens) for i in range(k, 200, 8)]

        with ThreadPoolExecutor(8) as pool:
            got = dict(kv for part in pool.map(worker, range(8)) for kv in part)
        info = rt.engine_info()
    assert [got[i] for i in range(200)] == reference[backend]
    assert info["steps"] > 0 and info["active"] == 0 and info["waiting"] == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_interleaved_streams_on_one_thread(bundles, reference, backend):
    reqs = _requests(6)
    with Runtime.open(bundles[backend], backend=_backend(backend)) as rt:
        streams = [rt.stream(t, x, **o) for t, x, o in reqs]
        texts = ["" for _ in streams]
        live = list(range(len(streams)))
        while live:  # advance them in turn, one chunk each
            for k in list(live):
                try:
                    texts[k] += next(streams[k])
                except StopIteration:
                    live.remove(k)
        for k, s in enumerate(streams):
            assert s.result.tokens == reference[backend][k]
            assert s.result.text == texts[k]


@pytest.mark.parametrize("backend", BACKENDS)
def test_cancel_mid_prefill_and_mid_decode(bundles, reference, backend):
    reqs = _requests(3)
    long_text = " ".join(INPUTS * 6)
    with Runtime.open(bundles[backend], backend=_backend(backend), slots=2, prefill_chunk=4) as rt:
        # mid-prefill: a long input in 4-token chunks, cancelled right away
        s = rt.stream("support", long_text, max_tokens=50)
        s.cancel()
        list(s)
        assert s.result.stats.finish_reason == "cancelled"
        # mid-decode: cancel after the first chunk, from another thread
        s = rt.stream("raw", INPUTS[0], max_tokens=400, stop=[], temperature=0.0, **_no_eos(rt))
        first = next(s)
        assert first
        threading.Thread(target=s.cancel).start()
        rest = "".join(s)
        assert s.result.stats.finish_reason == "cancelled"
        assert s.result.text == first + rest and s.result.stats.generated_tokens < 400
        # the slots are free again, and the next requests still match their sequential output
        for k, (t, x, o) in enumerate(reqs):
            assert rt.generate(t, x, **o).tokens == reference[backend][k]
        assert rt.engine_info()["active"] == 0


def test_abandoned_stream_frees_its_sequence(bundle_int4, reference):
    reqs = _requests(2)
    with Runtime.open(bundle_int4, backend="onnx", slots=1) as rt:
        s = rt.stream("raw", INPUTS[0], max_tokens=300, **_no_eos(rt))
        next(s)
        del s  # dropped mid-generation: cancelled, so the only slot is free for the next one
        assert rt.generate(*reqs[1][:2], timeout=60, **reqs[1][2]).tokens == reference["onnx"][1]


def test_generate_timeout(bundle_int4):
    with Runtime.open(bundle_int4, backend="onnx") as rt:
        ref = rt.generate("raw", INPUTS[0], max_tokens=10_000, **_no_eos(rt))  # untimed: to the context's end
        assert ref.stats.finish_reason == "length" and len(ref.tokens) > 100
        _slow_steps(rt)  # ~len(ref.tokens) * 20 ms to reach "length": far past the 0.5 s timeout
        r = rt.generate("raw", INPUTS[0], max_tokens=10_000, timeout=0.5, **_no_eos(rt))
        assert r.stats.finish_reason == "timeout"
        n = r.stats.generated_tokens
        assert 0 < n < len(ref.tokens) // 2 and r.tokens == ref.tokens[:n]  # what it had: the untimed run's start
        with pytest.raises(PrefixEdgeError, match="timeout"):
            rt.generate("raw", INPUTS[0], timeout=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_close_while_streaming_and_after(bundle_int4, backend):
    rt = Runtime.open(bundle_int4, backend=_backend(backend), slots=2)
    ref = rt.generate("raw", INPUTS[0], max_tokens=400, **_no_eos(rt))  # the same request, not closed
    assert ref.stats.finish_reason == "length" and len(ref.tokens) == 400
    _slow_steps(rt)  # 400 steps now take >= 8 s: only close() can end the stream early
    s = rt.stream("raw", INPUTS[0], max_tokens=400, **_no_eos(rt))
    first = next(s)
    results = []
    t = threading.Thread(target=lambda: results.append("".join(s)))
    t.start()
    rt.close()  # another thread is streaming: it ends cleanly, nothing crashes
    t.join(30)
    assert not t.is_alive() and s.result.stats.finish_reason == "cancelled"
    n = s.result.stats.generated_tokens
    assert 0 < n < 200 and s.result.tokens == ref.tokens[:n] and s.result.text == first + results[0]
    with pytest.raises(PrefixEdgeError, match="closed"):
        rt.generate("raw", INPUTS[0])
    rt.close()  # twice is fine


def test_full_queue_is_an_error_not_a_hang(bundle_int4):
    with Runtime.open(bundle_int4, backend="onnx", slots=1, queue_size=2) as rt:
        ref = rt.generate("raw", INPUTS[0], max_tokens=2, **_no_eos(rt))  # before the flood
        streams = []
        with pytest.raises(PrefixEdgeError, match="busy"):
            for _ in range(20):
                streams.append(rt.stream("raw", INPUTS[0], max_tokens=200, **_no_eos(rt)))
        for s in streams:
            s.cancel()
        for s in streams:
            list(s)
        r = rt.generate("raw", INPUTS[0], max_tokens=2, **_no_eos(rt))
        assert r.stats.finish_reason == "length" and r.stats.generated_tokens == 2 and r.tokens == ref.tokens


def test_astream_matches_stream(bundle_int4, reference):
    reqs = _requests(4)

    async def main(rt):
        async def one(k):
            t, x, o = reqs[k]
            return "".join([c async for c in rt.astream(t, x, **o)])
        return await asyncio.gather(*(one(k) for k in range(4)))

    with Runtime.open(bundle_int4, backend="onnx") as rt:
        texts = asyncio.run(main(rt))
        for k, (t, x, o) in enumerate(reqs):
            assert rt.generate(t, x, **o).text == texts[k]


def test_gguf_prefix_cells_are_shared(bundle_int4):
    """shared_kv=True: N requests of one task in flight hold ONE copy of the prefix cells (seq_cp from a resident
    sequence): counted in llama.cpp's own KV cache, on the engine thread between two steps."""
    pytest.importorskip("llama_cpp")
    import llama_cpp as L

    with Runtime.open(bundle_int4, backend="gguf", slots=4, shared_kv=True) as rt:
        P = rt.manifest.tasks["support"].prefix_tokens
        streams = [rt.stream("support", INPUTS[k % 3], max_tokens=300, **_no_eos(rt)) for k in range(4)]
        for s in streams:
            next(s)  # all four are past their prefill

        def snapshot(sched):
            be = sched.backend
            own = [L.llama_memory_seq_pos_max(be.mem, r.seq) + 1 - P for r in sched.active]
            return _used_cells(be), own, sched.resident_info()

        used, own, residents = rt._sched.run_in_engine(snapshot)
        assert len(own) == 4 and all(n > 0 for n in own)
        assert residents["support"]["users"] == 4 and residents["support"]["cells"] == P
        assert used == P + sum(own), (used, P, own)  # not 4 * P + ...
        for s in streams:
            s.cancel()
            list(s)
        assert rt.engine_info()["residents"]["support"]["users"] == 0


def _used_cells(be) -> int:
    """Used KV cells, as llama.cpp itself serialises them: the state of sequence -1 (all of
    them) lists every used cell once, with the sequences that share it."""
    import ctypes
    import struct

    import llama_cpp as L

    size = L.llama_state_seq_get_size(be.ctx, -1)
    buf = (ctypes.c_uint8 * size)()
    assert L.llama_state_seq_get_data(be.ctx, buf, size, -1) == size
    magic, _seq, n_stream, cells = struct.unpack_from("<IiII", bytes(buf[:16]))
    assert n_stream == 1
    return cells
