"""Many requests at once, through the runtime's scheduler, each figure a ratio against a baseline
measured in the same run:

  a. aggregate decode tok/s at 1 / 4 / 8 concurrent requests of one task (EOS banned by
     logit_bias, so every request decodes exactly N tokens), vs the single-request rate
  b. memory added per extra concurrent request of a ~1k-token task: llama.cpp KV cells counted
     in llama.cpp's own cache (the state of sequence -1 lists every used cell once); ONNX: the
     process's RSS growth. Both vs one copy of the prefix.
  c. task switch: requests alternating over 3 tasks; prefix_load_ms with resident prefixes vs
     with resident_bytes=0 (every switch restores the blob)
  d. TTFT p50 / p99 with 8 requests in flight (8 threads x 4 requests)
  e. cancel latency: cancel() -> end of the stream, mid-decode and mid-prefill

    python benchmarks/concurrency.py [--bundle DIR] [--threads 2] [--out docs/concurrency.json]

With no --bundle it exports (once, cached under $PREFIX_EDGE_HOME/bench-bundles) the default
model with three text tasks of ~1k, ~600 and ~300 tokens.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

SENT = ("The support desk answers questions about storage plans, billing, devices and sync. "
        "Files deleted from a device stay in the trash for a number of days that depends on the plan. ")


def bench_bundle() -> Path:
    from prefix_edge.export.build import export_bundle
    from prefix_edge.export.source import default_model_path
    from prefix_edge.paths import home

    out = home() / "bench-bundles" / "concurrency"
    if (out / "manifest.json").is_file():
        return out
    tasks = out.parent / "concurrency-tasks.toml"
    out.parent.mkdir(parents=True, exist_ok=True)
    lines = []
    for name, reps in (("long", 28), ("mid", 16), ("short", 8)):
        lines.append(f'[task.{name}]\nsystem = """{SENT * reps}"""\nmax_tokens = 64\n')
    tasks.write_text("\n".join(lines))
    export_bundle(default_model_path(), tasks, out, progress=True)
    return out


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def used_cells(be) -> int:
    import llama_cpp as L

    size = L.llama_state_seq_get_size(be.ctx, -1)
    buf = (ctypes.c_uint8 * size)()
    L.llama_state_seq_get_data(be.ctx, buf, size, -1)
    return struct.unpack_from("<IiII", bytes(buf[:16]))[3]


def run(bundle: Path, backend: str, threads: int, n_tokens: int = 48) -> dict:
    from prefix_edge import Runtime

    out: dict = {}
    q = "How long do deleted files stay in the trash on the Plus plan? "
    with Runtime.open(bundle, backend=backend, threads=threads, slots=8) as rt:
        ban = {int(e): -100.0 for e in rt.eos}
        opts = dict(max_tokens=n_tokens, logit_bias=ban)
        rt.generate("long", q, max_tokens=4)  # warm up
        # a. aggregate decode throughput
        agg = {}
        for n in (1, 4, 8):
            def one(k):
                r = rt.generate("long", q + f"({k})", **opts)
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
        # b. memory per extra concurrent request of the long task
        P = rt.manifest.tasks["long"].prefix_tokens
        prefix_bytes = rt.prefixes.get("long")[0].nbytes
        mem = {"prefix_tokens": P, "prefix_bytes": prefix_bytes}
        for n in (1, 8):
            streams = [rt.stream("long", q + f"[{k}]", max_tokens=400, logit_bias=ban) for k in range(n)]
            for s in streams:
                next(s)
            time.sleep(0.05)
            if backend == "gguf":
                mem[f"cells_{n}"] = used_cells(rt.backend)
            else:
                mem[f"rss_mb_{n}"] = round(rss_mb(), 1)
            for s in streams:
                s.cancel()
                list(s)
        if backend == "gguf":
            per = (mem["cells_8"] - mem["cells_1"]) / 7 * rt.backend.bytes_per_cell
        else:
            per = (mem["rss_mb_8"] - mem["rss_mb_1"]) / 7 * 2**20
        mem["added_bytes_per_request"] = int(per)
        mem["vs_prefix_copy"] = round(per / prefix_bytes, 3)
        out["memory"] = mem
        # d. TTFT under 8 in flight
        def ttft(k):
            return [rt.generate(("long", "mid", "short")[j % 3], q + f"<{k}.{j}>",
                                max_tokens=16, logit_bias=ban).stats.ttft_ms for j in range(4)]
        with ThreadPoolExecutor(8) as pool:
            ttfts = sorted(x for part in pool.map(ttft, range(8)) for x in part)
        out["ttft_8_in_flight_ms"] = {"p50": round(statistics.median(ttfts), 1),
                                      "p99": round(ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))], 1)}
        # e. cancel latency
        lat_dec = []
        for k in range(5):
            s = rt.stream("short", q, max_tokens=400, logit_bias=ban)
            next(s)
            next(s)
            t0 = time.perf_counter()
            s.cancel()
            list(s)
            lat_dec.append((time.perf_counter() - t0) * 1e3)
        lat_pre = []
        long_input = SENT * 40
        for k in range(5):
            s = rt.stream("short", long_input, max_tokens=4)
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
                r = rt.generate(("long", "mid", "short")[j % 3], q, max_tokens=1)
                if j >= 3:
                    loads.append(r.stats.prefix_load_ms)
            switch[label] = round(statistics.median(loads), 3)
    out["task_switch_prefix_load_ms"] = switch
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bundle", type=Path)
    ap.add_argument("--backend", default="gguf,onnx")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    bundle = a.bundle or bench_bundle()
    report = {"bundle": str(bundle), "threads": a.threads}
    for b in a.backend.split(","):
        report[b] = run(bundle, b, a.threads)
        print(json.dumps({b: report[b]}, indent=1), flush=True)
    if a.out:
        a.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
