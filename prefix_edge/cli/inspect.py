"""`prefix-edge tasks` and `prefix-edge inspect`."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Optional

import typer

from .app import app


def _manifest(bundle: Optional[Path]):
    from ..bundle import Bundle

    b = Bundle.open(bundle)
    return b.root, b.manifest


@app.command("tasks")
def tasks_cmd(bundle: Optional[Path] = typer.Option(None, "--bundle", help="Bundle dir (default bundle when omitted).")) -> None:
    """List a bundle's tasks with prefix lengths and sizes."""
    from rich.console import Console
    from rich.table import Table

    _, m = _manifest(bundle)
    table = Table("task", "kind", "chat", "prefix tokens", "backends", "size")
    for col in table.columns:  # a long name folds onto a next line, never cut with an ellipsis
        col.overflow = "fold"
    for name, t in sorted(m.tasks.items()):
        size = sum(p.bytes for p in t.prefixes.values())
        table.add_row(name, _kind(t), str(t.chat), _tokens(t), ",".join(t.prefixes),
                      f"{size / 1e6:.2f} MB")
    Console().print(table)


def _kind(t, with_name: bool = False) -> str:
    """'text', or 'peft PREFIX_TUNING' (+ ' (adapter dir name)') for a trained prefix."""
    if not t.adapter:
        return t.kind
    name = f" ({t.adapter.get('name', '?')})" if with_name else ""
    return f"{t.kind} {t.adapter.get('peft_type', '?')}{name}"


def _tokens(t) -> str:
    """Prefix positions; '14 (8 virtual)' when some are a trained prefix's virtual tokens."""
    if t.compression:
        return f"{t.prefix_tokens} (of {t.compression['source_tokens']}, compressed)"
    return f"{t.prefix_tokens} ({t.n_virtual} virtual)" if t.n_virtual else str(t.prefix_tokens)


@app.command()
def inspect(
    bundle: Optional[Path] = typer.Option(None, "--bundle", help="Bundle dir (default bundle when omitted)."),
    as_json: bool = typer.Option(False, "--json", help="Print the manifest summary as JSON."),
) -> None:
    """Print a bundle's manifest summary: model, fingerprint, backends, tasks."""
    root, m = _manifest(bundle)
    summary = {
        "bundle": str(root),
        "format_version": m.format_version,
        "created_by": m.created_by,
        "model": asdict(m.model),
        "tokenizer": asdict(m.tokenizer),
        "backends": {k: {**asdict(b), "bytes": sum((root / f).stat().st_size for f in b.files if (root / f).exists())}
                     for k, b in m.backends.items()},
        "tasks": {k: {"kind": t.kind, "prefix_tokens": t.prefix_tokens, "n_virtual": t.n_virtual,
                      "adapter": t.adapter,
                      "compression": t.compression_summary(),
                      "bytes": sum(p.bytes for p in t.prefixes.values())} for k, t in m.tasks.items()},
        "extra": m.extra,
    }
    if as_json:
        typer.echo(json.dumps(summary, indent=2))
        return
    mi = m.model
    typer.echo(f"bundle     {root}  (format v{m.format_version}, {m.created_by})")
    typer.echo(f"model      {mi.source}: {mi.architecture}, {mi.n_layers} layers, {mi.n_heads} heads / "
               f"{mi.n_kv_heads} KV heads × {mi.head_dim}, vocab {mi.vocab_size}, context {mi.n_ctx}")
    for k, b in summary["backends"].items():
        graph = f"{m.extra['onnx_builder']} graph, " if k == "onnx" and m.extra.get("onnx_builder") else ""
        typer.echo(f"backend    {k}: {graph}{b['quantization']}, KV {b['kv_dtype']}, {b['bytes'] / 1e6:.1f} MB, "
                   f"fingerprint {b['fingerprint'][:16]}")
    for k, t in sorted(m.tasks.items()):
        size = summary["tasks"][k]["bytes"]
        typer.echo(f"task       {k}: {_kind(t, True)}, {_tokens(t)} prefix tokens, {size / 1e6:.2f} MB")
    for w in m.extra.get("warnings", []):
        typer.echo(f"warning    {w}")
