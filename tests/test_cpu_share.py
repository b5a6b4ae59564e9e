"""threads="auto": each forward runs the threads the CPUs have free (runtime/engines/cpu_share.py).
- the share reads real /proc/stat-format files: others' busy time is what the allowed CPUs spent
  busy less this process's own, in CPUs; a busy neighbour takes threads away, an idle machine
  gives them back; only the allowed CPUs count; leases held by other forwards of this process
  count against a new one; a machine without /proc/stat falls back to the load average;
- on real llama.cpp contexts, a forward's logits are the same bit for bit whatever thread count
  the share picks (the adaptive engine equals a fixed one), and the thread count in use moves
  with a real busy process beside it."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from prefix_edge.runtime.engines import cpu_share as cs


def _stat(path, busy: list[int], idle: int = 0) -> None:
    lines = [f"cpu  {sum(busy)} 0 0 {idle} 0 0 0 0 0 0"]
    lines += [f"cpu{i} {b} 0 0 {idle} 0 0 0 0 0 0" for i, b in enumerate(busy)]
    path.write_text("\n".join(lines) + "\nintr 0\n")


@pytest.mark.unit
def test_a_busy_neighbour_takes_threads_and_gives_them_back(tmp_path, monkeypatch):
    monkeypatch.setattr(cs, "SMOOTH", 1.0)  # the newest reading alone, for a short test
    stat = tmp_path / "stat"
    busy = [1000, 1000]
    _stat(stat, busy)
    share = cs.CpuShare(2, cpus={0, 1}, stat=stat)
    assert share.readable and share.choose(2) == 2  # the first reading: nothing known yet
    tick = cs._TICK
    for _ in range(2):  # both CPUs busy with others for each interval: one thread left
        time.sleep(cs.INTERVAL + 0.02)
        busy = [b + int(tick * (cs.INTERVAL + 0.05)) for b in busy]
        _stat(stat, busy)
        n = share.choose(2)
    assert share.others > 1.5 and n == 1, share.describe()
    time.sleep(cs.INTERVAL + 0.02)  # the neighbour stops
    _stat(stat, busy)
    assert share.choose(2) == 2 and share.others < 0.5


@pytest.mark.unit
def test_only_the_allowed_cpus_count(tmp_path, monkeypatch):
    monkeypatch.setattr(cs, "SMOOTH", 1.0)
    stat = tmp_path / "stat"
    busy = [0, 0, 0]
    _stat(stat, busy)
    share = cs.CpuShare(2, cpus={0, 1}, stat=stat)
    share.choose(2)
    time.sleep(cs.INTERVAL + 0.02)
    _stat(stat, [0, 0, int(cs._TICK * 10)])  # cpu2 is busy, but this process may not run there
    assert share.choose(2) == 2 and share.others == 0.0


@pytest.mark.unit
def test_leases_of_this_process_count(tmp_path):
    stat = tmp_path / "stat"
    _stat(stat, [0, 0])
    share = cs.CpuShare(2, cpus={0, 1}, stat=stat)
    with share.lease(2) as first:
        assert first == 2
        with share.lease(2) as second:  # the embedder while the generator runs
            assert second == 1
    with share.lease(2) as again:
        assert again == 2
    assert share.in_use == 0


@pytest.mark.unit
def test_without_proc_stat_the_load_average_stands_in(tmp_path):
    share = cs.CpuShare(2, cpus={0, 1}, stat=tmp_path / "missing")
    assert not share.readable
    d = share.describe()
    assert d["source"] == "load average" and 1 <= d["threads_now"] <= 2


@pytest.mark.integration
def test_thread_count_changes_no_logit_and_follows_a_busy_process(tmp_path):
    from prefix_edge.runtime.engines.llama.engine import LlamaBackend

    from .helpers.archs import build_arch

    built = build_arch("llama", tmp_path / "model")
    ids = np.arange(5, 60, dtype=np.int64)
    out = {}
    for n in (1, 2):
        be = LlamaBackend(built.gguf, threads=n, n_ctx=256)
        be.begin(None)
        out[n] = [be.prefill(ids)] + [be.step(int(t)) for t in (7, 8, 9)]
        be.close()
    for a, b in zip(out[1], out[2]):
        assert np.array_equal(a, b)  # ggml splits rows between threads, never a sum
    be = LlamaBackend(built.gguf, threads=2, n_ctx=256, adaptive=True)
    try:
        seen = []
        real = be._L.llama_set_n_threads

        def spy(ctx, n, n_batch):
            seen.append(n)
            return real(ctx, n, n_batch)

        be._L = type("L", (), {"__getattr__": lambda self, k: getattr(sys.modules["llama_cpp.llama_cpp"], k),
                                "llama_set_n_threads": staticmethod(spy)})()
        be.begin(None)
        got = [be.prefill(ids)] + [be.step(int(t)) for t in (7, 8, 9)]
        for a, b in zip(got, out[2]):
            assert np.array_equal(a, b)
        if cs.cpu_share().allowed < 2:
            pytest.skip("one CPU here: nothing to adapt")
        busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cs.cpu_share().allowed)]
        try:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and (not seen or seen[-1] != 1):
                be.begin(None)
                be.prefill(ids[:8])
                time.sleep(0.05)
            assert seen[-1] == 1, seen[-20:]
        finally:
            for p in busy:
                p.kill()
                p.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and seen[-1] != 2:
            be.begin(None)
            be.prefill(ids[:8])
            time.sleep(0.05)
        assert seen[-1] == 2, seen[-20:]
    finally:
        be.close()


@pytest.mark.parametrize("backend", ["onnx", "gguf"])
def test_background_priority(bundle_int4, backend):
    """priority="background": one thread, the engine thread at a lower OS priority, the same
    tokens as the default; a bad value is one line."""
    import os
    import threading

    from prefix_edge import PrefixEdgeError, Runtime

    with pytest.raises(PrefixEdgeError, match="priority must be one of 'normal', 'background'"):
        Runtime.open(bundle_int4, backend=backend, priority="idle")
    with Runtime.open(bundle_int4, backend=backend) as rt:
        want = rt.generate("support", "Can I get a refund?", max_tokens=8).tokens
    with Runtime.open(bundle_int4, backend=backend, priority="background") as rt:
        assert rt.threads == 1
        assert rt.generate("support", "Can I get a refund?", max_tokens=8).tokens == want
        if sys.platform.startswith("linux"):
            engine = rt._sched._thread  # this runtime's engine thread
            assert os.getpriority(os.PRIO_PROCESS, engine.native_id) >= \
                os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) + 10 or \
                os.getpriority(os.PRIO_PROCESS, engine.native_id) == 19


def test_the_gguf_embedder_runs_no_openmp_team_of_its_own(bundle_int4):
    """The embedder's llama.cpp context runs one thread, so its thread never starts an OpenMP
    team beside the engine thread's (two teams on 2 CPUs throttle every barrier for good: the
    generator fell from 77 to 29 tok/s after the first embedding, benchmarks/chat_with_embeddings.py);
    its vectors are the same as before (thread counts change no result)."""
    from prefix_edge import Runtime

    with Runtime.open(bundle_int4, backend="gguf") as rt:
        rt.embed(["a text", "another text"])
        runner = rt.embeddings._runner
        rt.embed(["a third"], pooling="mean")  # every pooling: the one context (embedding.py)
        assert runner._ctx is not None and rt.backend._L.llama_n_threads(runner._ctx) == 1


def test_onnx_thread_counts_change_no_logit(bundle_int4):
    """ONNX Runtime's sessions of 1 and 2 threads (the lean and the full one) give the same
    logits bit for bit, so a forward may run on either."""
    from prefix_edge.runtime.engines.onnx.engine import OnnxBackend

    ids = np.arange(5, 60, dtype=np.int64)
    out = {}
    for n in (1, 2):
        be = OnnxBackend(bundle_int4 / "onnx" / "model.onnx", threads=n, n_ctx=256)
        be.begin(None)
        out[n] = [be.prefill(ids)] + [be.step(int(t)) for t in (7, 8, 9)]
        be.close()
    for a, b in zip(out[1], out[2]):
        assert np.array_equal(a, b)
