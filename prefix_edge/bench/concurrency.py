"""`prefix-edge bench --concurrency`: many requests at once, through the runtime's scheduler, each figure a ratio against a baseline
measured in the same run:

  a. aggregate decode tok/s at 1 / 4 / 8 concurrent requests of one task (EOS banned by
     logit_bias, so every request decodes exactly N tokens), vs the single-request rate
  b. memory added per extra concurrent request of a ~1k-token task: llama.cpp KV cells counted
     in llama.cpp's own cache (the state of sequence -1 lists every used cell once); ONNX: the
     bytes of the KV tensors its sequences hold. Both vs one copy of the prefix.
  c. task switch: requests alternating over 3 tasks; prefix_load_ms with resident prefixes vs
     with resident_bytes=0 (every switch restores the blob)
  d. TTFT p50 / p99 with 8 requests in flight (8 threads x 4 requests)
  e. cancel latency: cancel() -> end of the stream, mid-decode and mid-prefill

The tasks used are the bundle's three longest text tasks ("long" = the longest).
`python benchmarks/concurrency.py` exports (once, under $PREFIX_EDGE_HOME/bench-bundles) the
default model with three text tasks of ~1k, ~600 and ~300 tokens and runs this on it.
"""

from __future__ import annotations

import ctypes
import statistics
import struct
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

SENT = ("The support desk answers questions about storage plans, billing, devices and sync. "
        "Files deleted from a device stay in the trash for a number of days that depends on the plan. ")


def run_all(bundle: Path, backends: list[str], threads: int, log=print) -> dict:
    report = {"bundle": str(bundle), "threads": threads}
    for b in backends:
        log(f"concurrency: {b} ...")
        report[b] = run(bundle, b, threads)
        if b == "gguf":  # the opt-in shared cache: one copy of a prefix for every request
            log("concurrency: gguf (shared_kv) ...")
            report["gguf_shared_kv"] = run(bundle, b, threads, shared_kv=True)
    return report


def used_cells(be) -> int:
    import llama_cpp as L

    size = L.llama_state_seq_get_size(be.ctx, -1)
    buf = (ctypes.c_uint8 * size)()
    L.llama_state_seq_get_data(be.ctx, buf, size, -1)
    return struct.unpack_from("<IiII", bytes(buf[:16]))[3]


def pick_tasks(manifest) -> tuple[str, str, str]:
    """The bundle's three longest text tasks, longest first (repeated if it has fewer)."""
    text = sorted((t for t, i in manifest.tasks.items() if not i.n_virtual),
                  key=lambda t: -manifest.tasks[t].prefix_tokens)
    if not text:
        from ..errors import PrefixEdgeError

        raise PrefixEdgeError("the concurrency bench needs a bundle with at least one text task")
    return tuple((text * 3)[:3])


def run(bundle: Path, backend: str, threads: int, n_tokens: int = 48, shared_kv: bool = False) -> dict:
    from .. import Runtime
    from ..bundle import Bundle

    opened = Bundle.open(bundle)
    tasks = opened.tasks
    LONG, MID, SHORT = names = pick_tasks(opened.manifest)
    out: dict = {"tasks": {n: tasks[n].prefix_tokens for n in names}}
    q = "How long do deleted files stay in the trash on the Plus plan? "
    with Runtime.open(bundle, backend=backend, threads=threads, slots=8, shared_kv=shared_kv) as rt:
        ban = {int(e): -100.0 for e in rt.eos}
        opts = dict(max_tokens=n_tokens, logit_bias=ban, stop=[])
        rt.generate(LONG, q, max_tokens=4)  # warm up
        # a. aggregate decode throughput
        agg = {}
        for n in (1, 4, 8):
            def one(k):
                r = rt.generate(LONG, q + f"({k})", **opts)
                return r.stats
            t0 = time.perf_counter()
            with ThreadPoolExecutor(n) as pool:
                stats = list(pool.map(one, range(n)))
            wall = time.perf_counter() - t0
            toks = sum(s.generated_tokens for s in stats)
            agg[n] = {"requests": n, "tokens": toks, "wall_s": round(wall, 3),
                      "aggregate_tok_s": round(toks / wall, 1),
                      "per_request_decode_tok_s": round(statistics.median(s.decode_tok_s for s in stats), 1)}
        for n in (4, 8):
            agg[n]["vs_single"] = round(agg[n]["aggregate_tok_s"] / agg[1]["aggregate_tok_s"], 2)
        out["throughput"] = agg
        # b. memory per extra concurrent request of the long task, from a snapshot taken on
        # the engine thread between two steps (nothing moves while it is read)
        P = rt.manifest.tasks[LONG].prefix_tokens
        prefix_bytes = rt.prefixes.get(LONG)[0].nbytes
        mem = {"prefix_tokens": P, "prefix_bytes": prefix_bytes}

        def snapshot(sched):
            own = [r.pos - P for r in sched.active]  # each request's cells beyond the prefix
            if backend == "gguf" and not shared_kv:  # a stream per request: its own prefix copy
                return {"requests": len(own), "own_cells": sum(own), "shared_cells": 0,
                        "prefix_cells": P * len(own),
                        "own_bytes": (sum(own) + P * len(own)) * sched.backend.bytes_per_cell}
            if backend == "gguf":
                used = used_cells(sched.backend)
                return {"requests": len(own), "used_cells": used, "own_cells": sum(own),
                        "shared_cells": used - sum(own),
                        "own_bytes": sum(own) * sched.backend.bytes_per_cell}
            return {"requests": len(own), "kv_bytes": sched.backend.kv_bytes()}

        snaps = {}
        for n in (1, 8):
            streams = [rt.stream(LONG, q + f"[{k}]", max_tokens=400, logit_bias=ban, stop=[]) for k in range(n)]
            for s in streams:
                next(s)
            snaps[n] = rt._sched.run_in_engine(snapshot)
            for s in streams:
                s.cancel()
                list(s)
        mem["snapshots"] = snaps
        if backend == "gguf":  # shared prefix cells are counted once; a request adds its own
            per = snaps[8]["own_bytes"] / max(snaps[8]["requests"], 1)
            held = snaps[8]["shared_cells"] if shared_kv else snaps[8]["prefix_cells"]
            mem["prefix_copies_held"] = round(held / P, 3)
        else:
            per = (snaps[8]["kv_bytes"] - snaps[1]["kv_bytes"]) / 7
        mem["added_bytes_per_request"] = int(per)
        mem["vs_prefix_copy"] = round(per / prefix_bytes, 3)
        out["memory"] = mem
        # d. TTFT under 8 in flight
        def ttft(k):
            return [rt.generate(names[j % 3], q + f"<{k}.{j}>",
                                max_tokens=16, logit_bias=ban, stop=[]).stats.ttft_ms for j in range(4)]
        with ThreadPoolExecutor(8) as pool:
            ttfts = sorted(x for part in pool.map(ttft, range(8)) for x in part)
        out["ttft_8_in_flight_ms"] = {"p50": round(statistics.median(ttfts), 1),
                                      "p99": round(ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))], 1)}
        # e. cancel latency
        lat_dec = []
        for k in range(5):
            s = rt.stream(SHORT, q, max_tokens=400, logit_bias=ban, stop=[])
            next(s)
            next(s)
            t0 = time.perf_counter()
            s.cancel()
            list(s)
            lat_dec.append((time.perf_counter() - t0) * 1e3)
        lat_pre = []
        long_input = SENT * 40
        room = rt.n_ctx - rt.manifest.tasks[SHORT].prefix_tokens - 8
        while len(rt.encode_input(SHORT, long_input)) > room:  # fit the model's context
            long_input = long_input[: len(long_input) // 2]
        for k in range(5):
            s = rt.stream(SHORT, long_input, max_tokens=4)
            time.sleep(0.03)
            t0 = time.perf_counter()
            s.cancel()
            list(s)
            lat_pre.append((time.perf_counter() - t0) * 1e3)
            assert s.result.stats.finish_reason in ("cancelled", "length", "eos")
        out["cancel_ms"] = {"mid_decode_median": round(statistics.median(lat_dec), 2),
                            "mid_prefill_median": round(statistics.median(lat_pre), 2),
                            "decode_step_ms": round(1e3 / max(agg[1]["per_request_decode_tok_s"], 1e-9), 2)}
    # c. task switch, resident prefixes vs none
    switch = {}
    for label, budget in (("resident", 256 << 20), ("no_resident", 0)):
        with Runtime.open(bundle, backend=backend, threads=threads, resident_bytes=budget) as rt:
            loads = []
            for j in range(15):
                r = rt.generate(names[j % 3], q, max_tokens=1)
                if j >= 3:
                    loads.append(r.stats.prefix_load_ms)
            switch[label] = round(statistics.median(loads), 3)
    out["task_switch_prefix_load_ms"] = switch
    return out
