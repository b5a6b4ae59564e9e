"""`prefix-edge task add|list|rm`: tasks created at run time (runtime/tasks.py), from the shell.

add opens a runtime on the bundle (the backend asked for) and bakes, verifies and stores the
task there; a runtime of another backend bakes its own prefix of it when it opens. list and rm
read and change the store only (no model is loaded); a server sharing the store sees the change
at its next call of that task.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from ..errors import PrefixEdgeError
from .app import app

task_app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                       rich_markup_mode=None, help="Create, list and delete tasks beside a bundle.")
app.add_typer(task_app, name="task")


def _fields(name: str, file: Optional[Path], fields: Optional[str], system: Optional[str],
            prefix: Optional[str], template: Optional[str]) -> dict:
    out: dict = {}
    if file is not None:
        from ..tasks.taskfile import read_task_file

        data = read_task_file(file)
        table = (data.get("task") or {}).get(name) if isinstance(data.get("task"), dict) else None
        if not isinstance(table, dict):
            raise PrefixEdgeError(f"{file}: no [task.{name}] table")
        out.update(table)
    if fields is not None:
        try:
            extra = json.loads(fields)
        except ValueError as e:
            raise PrefixEdgeError(f"--fields: not JSON: {e}") from None
        if not isinstance(extra, dict):
            raise PrefixEdgeError("--fields: a JSON object of the task's fields")
        out.update(extra)
    for key, value in (("system", system), ("prefix", prefix), ("template", template)):
        if value is not None:
            out[key] = value
    return out


@task_app.command("add")
def add(
    name: str = typer.Argument(..., help="The task's name (its model id on the server)."),
    bundle: Optional[Path] = typer.Option(None, "--bundle", help="Bundle dir (default bundle when omitted)."),
    system: Optional[str] = typer.Option(None, "--system", help="The task's system prompt."),
    prefix: Optional[str] = typer.Option(None, "--prefix", help="A raw-text prefix instead (chat = false)."),
    template: Optional[str] = typer.Option(None, "--template", help="How an input is wrapped: a text with {input} once."),
    file: Optional[Path] = typer.Option(None, "--file", help="A task file: its [task.NAME] table gives the fields."),
    fields: Optional[str] = typer.Option(None, "--fields", help='Any fields as JSON, e.g. \'{"examples": [{"user": "hi", "assistant": "hello"}], "max_tokens": 64}\'.'),
    backend: str = typer.Option("auto", "--backend", help="onnx | gguf | auto: the engine that bakes it."),
    task_store: Optional[Path] = typer.Option(None, "--task-store", help="Where created tasks are kept (default: the bundle's created/)."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Create a task: checked as export checks a task file's, baked, verified, stored."""
    from ..runtime.runtime import Runtime

    given = _fields(name, file, fields, system, prefix, template)
    with Runtime.open(bundle, backend=backend, task_store=task_store, read_ahead=False) as rt:
        made = rt.add_task(name, **given)
    if as_json:
        typer.echo(json.dumps(made, indent=1))
    else:
        typer.echo(f"created task '{name}': {made['prefix_tokens']} prefix tokens, {made['bytes']:,} bytes "
                   f"({', '.join(made['backends'])}); a probe answers from it as from its prefill")


@task_app.command("list")
def list_tasks(
    bundle: Optional[Path] = typer.Option(None, "--bundle", help="Bundle dir (default bundle when omitted)."),
    task_store: Optional[Path] = typer.Option(None, "--task-store", help="Where created tasks are kept (default: the bundle's created/)."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Every task of the bundle: exported ones and those created."""
    from ..bundle import Bundle

    b = Bundle.open(bundle, task_store)
    rows = [{"name": n, "origin": "created" if n in b.created else "exported", "chat": t.chat,
             "prefix_tokens": t.prefix_tokens, "backends": sorted(t.prefixes),
             "created": b.created[n].created if n in b.created else None}
            for n, t in sorted(b.tasks.items())]
    if as_json:
        typer.echo(json.dumps(rows, indent=1))
        return
    for r in rows:
        when = f", created {r['created']}" if r["created"] else ""
        typer.echo(f"{r['name']}\t{r['origin']}\t{r['prefix_tokens']} tokens\t{','.join(r['backends'])}{when}")


@task_app.command("rm")
def remove(
    name: str = typer.Argument(..., help="The created task to delete."),
    bundle: Optional[Path] = typer.Option(None, "--bundle", help="Bundle dir (default bundle when omitted)."),
    task_store: Optional[Path] = typer.Option(None, "--task-store", help="Where created tasks are kept (default: the bundle's created/)."),
) -> None:
    """Delete a created task (a server sharing the store stops serving it at its next call)."""
    from ..bundle import Bundle

    b = Bundle.open(bundle, task_store)
    if name in b.exported:
        raise PrefixEdgeError(f"task '{name}' is the bundle's own (exported); only created tasks can be deleted")
    if not b.store.remove(name):
        raise PrefixEdgeError(f"no created task '{name}' in {b.store.root}")
    typer.echo(f"deleted task '{name}'")
