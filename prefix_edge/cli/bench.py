"""`prefix-edge bench`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from .app import app

TARGETS = {  # the ratios this project holds itself to (README, Performance)
    "ttft_speedup": {1024: 30.0, 4096: 60.0},
    "task_switch_ms": 5.0,
    "gguf_decode_vs_llama_cpp": 0.97,
    "onnx_decode_vs_optimum": 1.5,
    "onnx_decode_vs_genai": 1.0,
    "prefix_bytes_per_token": 12 * 1024,
    "rss_ratio": 1.5,
    "model_rss_ratio": 1.3,  # peak RSS minus a model-less process's, at the sizes people deploy
    "cold_start_ms": 400.0,
}


@app.command()
def bench(
    bundle: Optional[Path] = typer.Option(None, "--bundle", help="Bundle dir (default bundle when omitted)."),
    backend: Optional[str] = typer.Option(None, "--backend", help="Comma-separated backends (default: all in the bundle)."),
    prefix_lengths: str = typer.Option("128,512,1024,4096", "--prefix-lengths"),
    input_tokens: int = typer.Option(32, "--input-tokens"),
    threads: Optional[int] = typer.Option(None, "--threads", help="Threads for every engine and peer (default: the physical cores this process may use)."),
    runs: int = typer.Option(5, "--runs", help="Runs per figure (medians are reported)."),
    peers: bool = typer.Option(True, "--peers/--no-peers", help="Run the peer baselines from benchmarks/."),
    out: Optional[Path] = typer.Option(None, "--out", help="Write the report as JSON."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Write a PNG plot of TTFT vs prefix length (needs matplotlib)."),
    concurrency: bool = typer.Option(False, "--concurrency", help="Instead: many requests at once (throughput at 1/4/8, memory per request, task switch, TTFT p50/p99, cancel latency)."),
    speculative: bool = typer.Option(False, "--speculative", help="Instead: speculative='lookup' vs 'off' per task (tokens per forward, decode tok/s, answers equal, JSON valid); --runs inputs per task; with --peers, llama.cpp's own lookup decoding."),
    inputs: Optional[Path] = typer.Option(None, "--inputs", help="With --speculative: a JSONL file of {\"task\", \"input\"} lines (default: the demo tasks' held-out sets)."),
    contention: bool = typer.Option(False, "--contention", help="Instead: TTFT and decode idle, beside a busy loop, beside another app of each engine, for threads auto / fixed / 1 (docs/contention.md)."),
) -> None:
    """Measure TTFT (prefilled vs restored), task switch, decode speed vs peers, cold start, RSS;
    or, with --concurrency, the engine under many requests at once; or, with --speculative,
    drafted decoding against plain decoding; or, with --contention, beside other work on the CPUs."""
    from ..bench.measure import run_bench
    from ..bundle import Bundle
    from ..errors import PrefixEdgeError
    from ..runtime.engines.cpus import default_threads

    opened = Bundle.open(bundle)
    root, manifest = opened.root, opened.manifest
    if threads is not None and threads < 1:
        raise PrefixEdgeError(f"--threads must be >= 1, got {threads}")
    threads = threads or default_threads()
    names = [b.strip() for b in backend.split(",")] if backend else list(manifest.backends)
    try:
        lengths = [int(x) for x in prefix_lengths.split(",") if x.strip()]
    except ValueError:
        raise PrefixEdgeError(f"--prefix-lengths must be integers, got {prefix_lengths!r}") from None
    if speculative:
        from ..bench.speculative import read_inputs, run_all as run_speculative, table

        given = read_inputs(inputs) if inputs else None
        report = run_speculative(root, names, threads, runs, given=given, peers=peers,
                                 log=lambda m: typer.echo(m, err=True))
        typer.echo("\n".join(table(report)))
        if out:
            out.write_text(json.dumps(report, indent=2) + "\n")
        return
    if contention:
        from ..bench.contention import run_all as run_contention, table as contention_table

        report = run_contention(root, names, threads, runs=runs, log=lambda m: typer.echo(m, err=True))
        typer.echo("\n".join(contention_table(report)))
        if out:
            out.write_text(json.dumps(report, indent=2) + "\n")
        return
    if concurrency:
        from ..bench.concurrency import run_all

        report = run_all(root, names, threads, log=lambda m: typer.echo(m, err=True))
        typer.echo(json.dumps(report, indent=1))
        if out:
            out.write_text(json.dumps(report, indent=2) + "\n")
        return
    report = run_bench(root, names, lengths, input_tokens, threads, runs, peers=peers,
                       log=lambda m: typer.echo(m, err=True))
    report["targets"] = check_targets(report)
    print_table(report)
    if out:
        out.write_text(json.dumps(report, indent=2) + "\n")
        typer.echo(f"report written to {out}", err=True)
    if plot:
        write_plot(report, plot)
        typer.echo(f"plot written to {plot}", err=True)


def check_targets(report: dict) -> dict:
    res = {}
    for row in report["ttft"]:
        want = TARGETS["ttft_speedup"].get(row["prefix_tokens"])
        if want:
            res[f"{row['backend']}: cached TTFT >= {want:g}x prefilled at P={row['prefix_tokens']}"] = row["speedup"] >= want
    for backend in sorted({row["backend"] for row in report["ttft"]}):
        worst = max(r["bytes_per_prefix_token"] for r in report["ttft"] if r["backend"] == backend)
        res[f"{backend}: prefix bytes per token <= 12 KiB"] = worst <= TARGETS["prefix_bytes_per_token"]
    for row in report["task_switch"]:
        res[f"{row['backend']}: task switch <= 5 ms (1k prefix, from memory)"] = row["switch_ms_lru"] <= TARGETS["task_switch_ms"]
    speed = {row["backend"]: row["tok_s"] for row in report["decode"]}
    for row in report["decode"]:
        if row.get("ratio") is not None:
            key = "gguf_decode_vs_llama_cpp" if row["backend"] == "gguf" else "onnx_decode_vs_optimum"
            res[f"{row['backend']}: decode >= {TARGETS[key]}x its peer"] = row["ratio"] >= TARGETS[key]
        if row.get("genai_ratio") is not None:
            res["onnx: decode >= 1.0x onnxruntime-genai int4"] = row["genai_ratio"] >= TARGETS["onnx_decode_vs_genai"]
    if {"onnx", "gguf"} <= set(speed):
        res["onnx: decode >= 1.0x llama.cpp (stretch)"] = speed["onnx"] >= speed["gguf"]
    for row in report["cold_start"]:
        res[f"{row['backend']}: peak RSS <= 1.5x (model + prefix)"] = row["rss_ratio"] <= TARGETS["rss_ratio"]
        if row.get("model_rss_ratio") is not None:
            res[f"{row['backend']}: model-attributable RSS <= 1.3x (model + prefix)"] = \
                row["model_rss_ratio"] <= TARGETS["model_rss_ratio"]
        res[f"{row['backend']}: cold start (open -> 1st token) <= 400 ms"] = row["cold_start_ms"] <= TARGETS["cold_start_ms"]
        res[f"{row['backend']}: no torch in the process"] = not row["torch_in_process"]
    return res


def print_table(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    c = Console()
    t = Table("backend", "prefix tokens", "TTFT prefilled ms", "TTFT restored ms", "speedup", "bytes/prefix token",
              title=f"TTFT, {report['ttft'][0]['input_tokens'] if report['ttft'] else '?'} input tokens, "
                    f"{report['machine']['threads']} threads, {report['machine']['cpu_count']} cores")
    for r in report["ttft"]:
        t.add_row(r["backend"], str(r["prefix_tokens"]), f"{r['ttft_prefilled_ms']:.1f}",
                  f"{r['ttft_restored_ms']:.1f}", f"{r['speedup']:.1f}x", f"{r['bytes_per_prefix_token']:.0f}")
    c.print(t)
    t = Table("backend", "switch ms (LRU)", "switch ms (file)", "decode tok/s", "peer tok/s", "ratio",
              "genai int4 tok/s", "cold start ms", "peak RSS MB", "RSS / (model+prefix)",
              "without a model MB", "the rest / (model+prefix)")
    by = {k: {r["backend"]: r for r in report[k]} for k in ("task_switch", "decode", "cold_start")}
    for name in by["decode"]:
        s, d, cs = by["task_switch"][name], by["decode"][name], by["cold_start"][name]
        peer = (d.get("baseline") or {}).get("tok_s")
        t.add_row(name, f"{s['switch_ms_lru']:.2f}", f"{s['switch_ms_from_file']:.2f}", f"{d['tok_s']:.1f}",
                  f"{peer}" if peer else "-", f"{d['ratio']:.2f}x" if d.get("ratio") else "-",
                  f"{d['genai']['tok_s']} ({d['genai_ratio']:.2f}x)" if d.get("genai_ratio") else "-",
                  f"{cs['cold_start_ms']:.0f}", f"{cs['peak_rss_mb']}", f"{cs['rss_ratio']}",
                  f"{cs.get('fixed_rss_mb', '-')}", f"{cs.get('model_rss_ratio', '-')}")
    c.print(t)
    for k, ok in report.get("targets", {}).items():
        c.print(f"{'[green]holds' if ok else '[red]misses'}[/]  {k}")


def write_plot(report: dict, path: Path) -> None:
    from ..errors import PrefixEdgeError

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PrefixEdgeError("--plot needs matplotlib: pip install 'prefix-edge[bench]'") from None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name in sorted({r["backend"] for r in report["ttft"]}):
        rows = [r for r in report["ttft"] if r["backend"] == name]
        xs = [r["prefix_tokens"] for r in rows]
        ax.plot(xs, [r["ttft_prefilled_ms"] for r in rows], "o--", label=f"{name}: prefix prefilled")
        ax.plot(xs, [r["ttft_restored_ms"] for r in rows], "o-", label=f"{name}: prefix restored")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("prefix tokens")
    ax.set_ylabel("time to first token (ms, median)")
    m = report["machine"]
    ax.set_title(f"prefix-edge TTFT ({m['threads']} threads, {m['cpu_count']} cores)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
