"""`prefix-edge verify [BUNDLE]`: re-hash every file of a bundle and check every prefix file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from .app import app


def verify_bundle(root: Path) -> list[dict]:
    """One row per file: {file, kind, bytes, status, detail}. status "ok" or "FAIL"."""
    from ..bundle import prefixfile
    from ..bundle import Manifest, confined, sha256_file

    m = Manifest.read(root)
    rows = []

    def check(rel: str, kind: str, want_sha: str, want_bytes: int | None = None) -> str | None:
        p = confined(root, rel)
        row = {"file": rel, "kind": kind, "bytes": p.stat().st_size if p.is_file() else 0,
               "status": "ok", "detail": ""}
        rows.append(row)
        if not p.is_file():
            row.update(status="FAIL", detail="missing")
            return None
        if want_bytes is not None and row["bytes"] != want_bytes:
            row.update(status="FAIL", detail=f"size {row['bytes']}, manifest says {want_bytes}")
            return None
        got = sha256_file(p)
        if got != want_sha:
            row.update(status="FAIL", detail="sha256 differs from the manifest")
            return None
        return got

    actual = {}
    check(m.tokenizer.file, "tokenizer", m.tokenizer.sha256)
    for name, b in m.backends.items():
        for rel, sha in b.files.items():
            actual.setdefault(name, {})[rel] = check(rel, f"model ({name})", sha) or "?"
    fps = {}
    for name, b in m.backends.items():
        fps[name] = m.fingerprint(name, actual[name])
        if fps[name] != b.fingerprint:
            rows.append({"file": "manifest.json", "kind": f"fingerprint ({name})", "bytes": 0,
                         "status": "FAIL", "detail": "recomputed fingerprint differs"})
    for task, t in sorted(m.tasks.items()):
        for backend, e in sorted(t.prefixes.items()):
            if check(e.file, f"prefix {task} ({backend})", e.sha256, e.bytes) is None:
                continue
            row = rows[-1]
            try:
                meta = prefixfile.metadata(root / e.file)
            except Exception as ex:  # PrefixEdgeError: one line
                row.update(status="FAIL", detail=f"unreadable: {str(ex).splitlines()[0]}")
                continue
            problem = ("the manifest records it for another model" if e.fingerprint != fps[backend]
                       else m.prefix_problem(task, meta, fps[backend]))
            if problem:
                row.update(status="FAIL", detail=problem)
    return rows


@app.command()
def verify(
    bundle: Optional[Path] = typer.Argument(None, help="Bundle dir (default bundle when omitted)."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Re-hash every file of a bundle against its manifest and check every prefix file's
    fingerprint and task; exit 1 if anything fails."""
    from ..paths import default_bundle

    root = bundle or default_bundle()
    rows = verify_bundle(root)
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
