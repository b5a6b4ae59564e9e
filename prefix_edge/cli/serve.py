"""`prefix-edge serve`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from . import app


@app.command()
def serve(
    bundle: Optional[Path] = typer.Option(None, "--bundle", help="Bundle dir (default bundle when omitted)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind (default: loopback only)."),
    port: int = typer.Option(8080, "--port"),
    backend: str = typer.Option("auto", "--backend", help="onnx | gguf | auto."),
    device: str = typer.Option("cpu", "--device"),
    threads: Optional[int] = typer.Option(None, "--threads"),
    slots: int = typer.Option(4, "--slots", help="Requests decoded together."),
    queue_size: int = typer.Option(64, "--queue", help="Requests that may wait; beyond: 429."),
    api_key: Optional[str] = typer.Option(None, "--api-key", envvar="PREFIX_EDGE_API_KEY", help="Require Authorization: Bearer KEY on /v1/."),
    cors: Optional[str] = typer.Option(None, "--cors", help="Comma-separated origins allowed by CORS (default: none)."),
) -> None:
    """Serve the bundle's tasks as models over an OpenAI-compatible HTTP API."""
    from ..errors import PrefixEdgeError

    try:
        import uvicorn

        from ..serve.app import create_app
    except ImportError:
        raise PrefixEdgeError("the server needs its extra: pip install 'prefix-edge[serve]'") from None
    from ..runtime.generate import Runtime

    if not 0 < port < 65536:
        raise PrefixEdgeError(f"--port must be in 1..65535, got {port}")
    rt = Runtime.open(bundle, backend=backend, device=device, threads=threads, slots=slots,
                      queue_size=queue_size)
    try:
        application = create_app(rt, api_key=api_key,
                                 cors_origins=[o.strip() for o in cors.split(",")] if cors else None)
        typer.echo(f"serving {len(rt.tasks)} tasks ({rt.backend.name}) on http://{host}:{port}/v1", err=True)
        uvicorn.run(application, host=host, port=port, log_level="warning")
    finally:
        rt.close()
