"""`prefix-edge eval --task NAME [--data FILE]`: score a task through the bundle on each backend."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from ..errors import PrefixEdgeError
from .app import app

from ..paths import demo_data


@app.command("eval")
def eval_(
    task: str = typer.Option(..., "--task", "-t", help="Task name (see `prefix-edge tasks`)."),
    data: Optional[Path] = typer.Option(None, "--data", help="JSONL lines {\"input\", \"output\"} (default: a demo task's held-out set)."),
    bundle: Optional[Path] = typer.Option(None, "--bundle", help="Bundle dir (default bundle when omitted)."),
    backend: Optional[str] = typer.Option(None, "--backend", help="Comma-separated backends (default: every one the bundle has)."),
    metric: Optional[str] = typer.Option(None, "--metric", help="exact | label | json-fields | chrf (default: guessed from the outputs)."),
    reference: bool = typer.Option(False, "--reference", help="Also score fp32 transformers (+ PEFT) on the same lines (export extra)."),
    tasks_file: Optional[Path] = typer.Option(None, "--tasks", help="--reference: the task file the bundle was exported from."),
    base: Optional[Path] = typer.Option(None, "--base", help="--reference: the model the bundle was exported from."),
    limit: Optional[int] = typer.Option(None, "--limit", help="Score only the first N lines."),
    threads: Optional[int] = typer.Option(None, "--threads", help="Engine threads (default: the physical cores this process may use)."),
    no_constraint: bool = typer.Option(False, "--no-constraint", help="Decode without the task's json_schema/regex/grammar (to score what the constraint changes)."),
    as_json: bool = typer.Option(False, "--json", help="Print the results as JSON (with every answer) instead of a table."),
    no_whole: bool = typer.Option(False, "--no-whole", help="A compressed task: skip scoring its whole prefix (prefilled) beside the compressed one."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Print every answer that is not exact on stderr."),
) -> None:
    """Score a task on example lines: score, valid-answer rate, mean TTFT and decode tok/s per backend."""
    from ..bundle import Bundle
    from ..tasks.datafile import read_jsonl
    from ..evaluation.metrics import METRICS, guess_metric
    from ..evaluation.run import eval_bundle
    from ..progress import bars
    opened = Bundle.open(bundle)
    root, manifest = opened.root, opened.manifest
    if task not in manifest.tasks:
        raise PrefixEdgeError(f"unknown task {task!r}; this bundle has: {', '.join(sorted(manifest.tasks))}")
    if data is None:
        from ..export.source import DEFAULT_GGUF  # (a constant: no export dependency is imported)

        data = demo_data(task) if manifest.model.source == DEFAULT_GGUF else None
        if data is None:
            raise PrefixEdgeError(f"task {task!r} has no embedded held-out set (only the default model's demo "
                                  "tasks have one); give --data FILE.jsonl")
    rows = read_jsonl(data)
    if limit is not None:
        if limit < 1:
            raise PrefixEdgeError(f"--limit must be at least 1, not {limit}")
        rows = rows[:limit]
    if metric is None:
        metric = guess_metric([r.output for r in rows])
    elif metric not in METRICS:
        raise PrefixEdgeError(f"--metric must be one of {', '.join(METRICS)}, not {metric!r}")
    if metric == "json-fields":
        from ..evaluation.metrics import json_object

        bad = next((i for i, r in enumerate(rows) if json_object(r.output) is None), None)
        if bad is not None:
            raise PrefixEdgeError(f"{data}: line {bad + 1}'s output is not a JSON object (needed by --metric json-fields)")
    backends = [b.strip() for b in backend.split(",") if b.strip()] if backend else list(manifest.backends)
    for b in backends:
        if b not in manifest.backends:
            raise PrefixEdgeError(f"bundle {root} has no {b} model (it has: {', '.join(manifest.backends)})")

    compression = manifest.tasks[task].compression
    results = []
    with bars(not as_json and sys.stderr.isatty(), transient=True) as bar:
        for b in backends:
            results.append(eval_bundle(root, task, b, rows, metric, threads, bar,
                                       constrain=not no_constraint))
            if compression and not no_whole:  # what compressing the prefix cost, per backend
                results.append(eval_bundle(root, task, b, rows, metric, threads, bar,
                                           constrain=not no_constraint, whole=True))
        if reference:
            from ..tune.reference import open_reference
            from ..evaluation.run import evaluate

            hf, generate = open_reference(opened, task, tasks_file, base)
            try:
                results.append(evaluate("reference", generate, rows, metric, bar))
            finally:
                hf.close()
    if verbose:
        for s in results:
            for r in s.rows:
                if not r["exact"]:
                    print(f"[{s.label}] {r['input']!r} -> {r['answer']!r} (want {r['reference']!r})", file=sys.stderr)
    if as_json:
        typer.echo(json.dumps({"task": task, "data": str(data), "metric": metric, "n": len(rows),
                               "prefix_tokens": manifest.tasks[task].prefix_tokens,
                               "compression": manifest.tasks[task].compression_summary(),
                               "results": [s.as_dict(rows=True) for s in results]}, indent=2, ensure_ascii=False))
        return
    typer.echo(f"task {task} ({manifest.tasks[task].prefix_tokens} prefix positions) · {len(rows)} lines of "
               f"{data.name} · metric {metric}")
    if compression:
        typer.echo(f"compressed prefix: {compression['kept_tokens']} of {compression['source_tokens']} tokens "
                   f"kept (ratio {compression['ratio']}); '<backend> whole' prefills all "
                   f"{compression['source_tokens']}")
    typer.echo(f"{'':11} {'score':>6} {'exact':>6} {'valid':>6} {'TTFT ms':>8} {'tok/s':>7}")
    for s in results:
        ttft = f"{s.ttft_ms:8.1f}" if s.ttft_ms is not None else f"{'-':>8}"
        tps = f"{s.tok_s:7.1f}" if s.tok_s is not None else f"{'-':>7}"
        typer.echo(f"{s.label:11} {s.score:6.3f} {s.exact:6.3f} {s.valid:6.3f} {ttft} {tps}")
