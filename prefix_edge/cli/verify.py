"""`prefix-edge verify [BUNDLE]`: re-hash every file of a bundle and check every prefix file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from .app import app


def verify_bundle(root: Path | None, task_store: Path | None = None) -> tuple[Path, list[dict]]:
    """The bundle's root and one row per file (Bundle.verify_all), created tasks' too."""
    from ..bundle import Bundle

    bundle = Bundle.open(root, task_store)
    return bundle.root, bundle.verify_all()


@app.command()
def verify(
    bundle: Optional[Path] = typer.Argument(None, help="Bundle dir (default bundle when omitted)."),
    as_json: bool = typer.Option(False, "--json"),
    task_store: Optional[Path] = typer.Option(None, "--task-store", help="Where created tasks are kept (default: the bundle's created/)."),
) -> None:
    """Re-hash every file of a bundle against its manifest and check every prefix file's
    fingerprint and task (tasks created at run time too); exit 1 if anything fails."""
    root, rows = verify_bundle(bundle, task_store)
    bad = [r for r in rows if r["status"] != "ok"]
    if as_json:
        typer.echo(json.dumps({"bundle": str(root), "ok": not bad, "files": rows}, indent=1))
    else:
        from rich.console import Console
        from rich.table import Table

        table = Table("file", "what", "bytes", "status", "detail")
        for r in rows:
            table.add_row(r["file"], r["kind"], f"{r['bytes']:,}", r["status"], r["detail"])
        Console().print(table)
        typer.echo(f"{len(rows) - len(bad)} of {len(rows)} ok" + (f"; {len(bad)} FAILED" if bad else ""))
    if bad:
        raise typer.Exit(1)
