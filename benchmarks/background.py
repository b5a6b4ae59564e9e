"""What a runtime decoding in the background costs the app in front: a foreground process doing a
fixed amount of CPU work (two threads' worth, as a UI with a render thread) is timed alone and
beside a runtime that decodes in a loop, opened with the defaults (threads auto) and with
priority="background"; the runtime's decode speed is reported beside it.

    python benchmarks/background.py [--bundle DIR] [--backend gguf] [--seconds 20] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import time
from pathlib import Path

WORK = 2_000_000  # loop iterations per unit of foreground work


def _unit() -> None:
    x = 0
    for i in range(WORK):
        x += i * i


def _foreground(units: int, q) -> None:
    """Two worker processes share `units` units of work; the wall time of the whole."""
    t0 = time.perf_counter()
    with mp.Pool(2) as pool:
        pool.starmap(_noop_unit, [()] * units)
    q.put(time.perf_counter() - t0)


def _noop_unit() -> None:
    _unit()


def _runtime(bundle: str | None, backend: str, priority: str, stop, rates) -> None:
    from prefix_edge import Runtime

    with Runtime.open(bundle, backend=backend, priority=priority) as rt:
        task = "support" if "support" in rt.tasks else next(iter(rt.tasks))
        rt.generate(task, "Can I get a refund?", max_tokens=4)
        rates.put("ready")
        while not stop.is_set():
            r = rt.generate(task, "Can I get a refund for a broken order?", max_tokens=32, use_prompt_cache=False)
            rates.put(r.stats.decode_tok_s)


def measure(bundle, backend: str, priority: str | None, units: int) -> dict:
    q = mp.Queue()
    stop, rates = mp.Event(), mp.Queue()
    p = None
    if priority is not None:
        p = mp.Process(target=_runtime, args=(bundle, backend, priority, stop, rates))
        p.start()
        assert rates.get(timeout=120) == "ready"
        time.sleep(1.0)
    f = mp.Process(target=_foreground, args=(units, q))
    f.start()
    seconds = q.get()
    f.join()
    tok_s = []
    if p is not None:
        stop.set()
        while p.is_alive() or not rates.empty():
            try:
                tok_s.append(rates.get(timeout=5))
            except Exception:
                break
        p.join(timeout=60)
    return {"runtime": priority or "none", "foreground_s": round(seconds, 2),
            "runtime_decode_tok_s": round(statistics.median(tok_s), 1) if tok_s else None}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bundle", default=None)
    ap.add_argument("--backend", default="gguf")
    ap.add_argument("--units", type=int, default=40)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    rows = [measure(a.bundle, a.backend, prio, a.units) for prio in (None, "normal", "background")]
    alone = rows[0]["foreground_s"]
    for r in rows:
        r["foreground_slowdown"] = round(r["foreground_s"] / alone, 2)
        print(json.dumps(r), flush=True)
    if a.out:
        a.out.write_text(json.dumps({"backend": a.backend, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
