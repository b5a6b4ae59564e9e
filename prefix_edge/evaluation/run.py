"""Run a task over example lines and summarise: through a bundle (`eval_bundle`, one backend at a
time, requests one after another so TTFT is a single request's) or through any `generate`
function (`evaluate`, used by the fp32 reference). Decoding is the task's own: greedy unless the
task's defaults say otherwise."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from ..tasks.datafile import Example
from ..errors import PrefixEdgeError
from .metrics import scorer


@dataclass
class Answer:
    text: str
    ttft_ms: float | None = None
    tokens: int = 0
    decode_s: float = 0.0


@dataclass
class Summary:
    label: str          # "onnx", "gguf", "reference"
    metric: str
    n: int
    score: float
    exact: float
    valid: float
    ttft_ms: float | None
    tok_s: float | None
    seconds: float
    rows: list[dict] = field(default_factory=list)

    def as_dict(self, rows: bool = False) -> dict:
        d = asdict(self)
        if not rows:
            d.pop("rows")
        return d


def evaluate(label: str, generate: Callable[[str], Answer], data: list[Example], metric: str,
             bar=None) -> Summary:
    score = scorer(metric, [ex.output for ex in data])
    t0, rows = time.perf_counter(), []
    task = bar.add_task(label, total=len(data), info="") if bar is not None else None
    for ex in data:
        a = generate(ex.input)
        s = score(a.text, ex.output)
        rows.append({"input": ex.input, "reference": ex.output, "answer": a.text, "score": round(s.score, 4),
                     "exact": s.exact, "valid": s.valid, "ttft_ms": a.ttft_ms, "tokens": a.tokens,
                     "decode_s": a.decode_s})
        if bar is not None:
            bar.advance(task)
    n = len(rows)
    ttfts = [r["ttft_ms"] for r in rows if r["ttft_ms"] is not None]
    dec_tokens = sum(max(r["tokens"] - 1, 0) for r in rows if r["decode_s"] > 0)
    dec_s = sum(r["decode_s"] for r in rows)
    return Summary(label, metric, n, round(sum(r["score"] for r in rows) / n, 4),
                   round(sum(r["exact"] for r in rows) / n, 4), round(sum(r["valid"] for r in rows) / n, 4),
                   round(sum(ttfts) / len(ttfts), 1) if ttfts else None,
                   round(dec_tokens / dec_s, 1) if dec_s > 0 else None,
                   round(time.perf_counter() - t0, 1), rows)


def eval_bundle(bundle: Path | None, task: str, backend: str, data: list[Example], metric: str,
                threads: int | None = None, bar=None, constrain: bool = True,
                whole: bool = False) -> Summary:
    """Score `task` on `data` through the bundle's `backend`. whole: prefill the task's whole
    prefix on every request instead of restoring its baked one (a compressed prefix's
    baseline; labelled "BACKEND whole")."""
    from ..runtime.runtime import Runtime

    with Runtime.open(bundle, backend=backend, threads=threads, slots=1) as rt:
        if task not in rt.tasks:
            raise PrefixEdgeError(f"unknown task {task!r}; this bundle has: {', '.join(sorted(rt.tasks))}")

        def generate(text: str) -> Answer:
            r = rt.generate(task, text, use_constraint=constrain, use_prefix_cache=not whole)
            st = r.stats
            dec_s = (st.generated_tokens - 1) / st.decode_tok_s if st.decode_tok_s > 0 else 0.0
            return Answer(r.text, st.ttft_ms, st.generated_tokens, dec_s)

        return evaluate(rt.backend.name + (" whole" if whole else ""), generate, data, metric, bar)
