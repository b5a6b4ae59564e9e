"""`prefix-edge bench --contention`: the runtime beside other work on the same CPUs.

For each engine, a request of the `support` task (or the bundle's first task) is timed: TTFT
after its baked prefix, the prefix prefilled instead (TTFT without the prefix cache), and decode
tok/s; medians of `runs`, with the CPUs

- idle,
- beside a busy loop (one process spinning on one core),
- beside another app of the same engine (a second process decoding in a loop, its threads fixed
  at every core: an app that does not share),
- beside another app of the other engine,

for the runtime's threads "auto" (the default: adapted to what is free, runtime/engines/cpu_share.py),
fixed at every core (the default before), and one thread. Each load process starts, warms up,
and is killed before the next row.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

LOADS = ("idle", "busy loop", "same engine", "other engine")
INPUT = "Can I get a refund for an order that arrived broken?"
WARMUP_S = 3.0


def _task(manifest) -> str:
    return "support" if "support" in manifest.tasks else next(iter(manifest.tasks))


def _start_load(load: str, bundle: Path, engine: str, engines: list[str], threads: int) -> subprocess.Popen | None:
    if load == "idle":
        return None
    if load == "busy loop":
        cmd = [sys.executable, "-c", "while True: pass"]
    else:
        other = engine if load == "same engine" else next((e for e in engines if e != engine), None)
        if other is None:
            return None
        cmd = [sys.executable, "-m", "prefix_edge.bench.contention", "load", str(bundle), other, str(threads)]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    time.sleep(WARMUP_S)  # the app's model loaded and decoding
    return p


def _stop(p: subprocess.Popen | None) -> None:
    if p is None:
        return
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait()


def _measure(bundle: Path, engine: str, threads: int | None, runs: int, max_tokens: int) -> dict:
    from .. import Runtime

    with Runtime.open(bundle, backend=engine, threads=threads) as rt:
        task = _task(rt.manifest)
        rt.generate(task, INPUT, max_tokens=4)  # warm: prefix resident, graphs built
        ttft, prefill, tok_s = [], [], []
        for _ in range(runs):
            r = rt.generate(task, INPUT, max_tokens=max_tokens)
            ttft.append(r.stats.ttft_ms)
            tok_s.append(r.stats.decode_tok_s)
            p = rt.generate(task, INPUT, max_tokens=1, use_prefix_cache=False, use_prompt_cache=False)
            prefill.append(p.stats.ttft_ms)
        auto = None
        if threads is None:  # what auto runs now, as the engines' next forward would
            from ..runtime.engines.cpu_share import cpu_share

            auto = cpu_share().choose(rt.threads or 1)
    return {"ttft_ms": round(statistics.median(ttft), 1), "prefilled_ttft_ms": round(statistics.median(prefill), 1),
            "decode_tok_s": round(statistics.median(tok_s), 1), "auto_threads_now": auto}


def run_all(bundle: Path, engines: list[str], full: int, runs: int = 3, max_tokens: int = 48,
            log=print, loads=LOADS) -> dict:
    rows = []
    for engine in engines:
        for load in loads:
            if load == "other engine" and len(engines) < 2:
                continue
            for label, threads in (("auto", None), (f"fixed {full}", full), ("1 thread", 1)):
                p = _start_load(load, bundle, engine, engines, full)
                try:
                    m = _measure(bundle, engine, threads, runs, max_tokens)
                finally:
                    _stop(p)
                row = {"engine": engine, "beside": load, "threads": label, **m}
                log(json.dumps(row))
                rows.append(row)
    return {"rows": rows, "machine": _machine()}


def _machine() -> dict:
    from ..runtime.engines.cpu_share import cpu_share
    from ..runtime.engines.cpus import budget

    return {"cpus": budget().describe(), "share": cpu_share().describe(), "load_avg": os.getloadavg()}


def table(report: dict) -> list[str]:
    lines = ["| engine | beside | threads | TTFT ms (baked) | TTFT ms (prefilled) | decode tok/s |",
             "|---|---|---|---|---|---|"]
    for r in report["rows"]:
        lines.append(f"| {r['engine']} | {r['beside']} | {r['threads']} | {r['ttft_ms']} | "
                     f"{r['prefilled_ttft_ms']} | {r['decode_tok_s']} |")
    return lines


def _load(bundle: str, engine: str, threads: str) -> None:
    """Another app: decode the bundle's task in a loop until killed."""
    from .. import Runtime

    with Runtime.open(bundle, backend=engine, threads=int(threads)) as rt:
        task = _task(rt.manifest)
        while True:
            rt.generate(task, INPUT, max_tokens=64, use_prompt_cache=False)


if __name__ == "__main__" and len(sys.argv) == 5 and sys.argv[1] == "load":
    _load(*sys.argv[2:])
