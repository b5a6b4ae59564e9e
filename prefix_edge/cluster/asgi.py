"""One HTTP request through an ASGI app in this process, its response as a stream of parts.

A replica runs the server's own FastAPI app (serve/app.py) this way, so the cluster serves
exactly the API `prefix-edge serve` serves. The first part is {"status", "headers"}, the rest
are body bytes as the app sends them (an SSE stream stays a stream). When the consumer stops
reading (the client went away, Ray cancelled the call), the app sees `http.disconnect` and the
request is cancelled as on a direct connection.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator


async def call(app, method: str, path: str, query: bytes, headers: list[tuple[bytes, bytes]],
               body: bytes) -> AsyncIterator[dict | bytes]:
    parts: asyncio.Queue = asyncio.Queue()
    gone = asyncio.Event()
    delivered = False

    async def receive() -> dict:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        await parts.put(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
             "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": query,
             "root_path": "", "headers": headers, "client": ("127.0.0.1", 0), "server": ("127.0.0.1", 0)}
    runner = asyncio.create_task(app(scope, receive, send))
    runner.add_done_callback(lambda _: parts.put_nowait(None))
    try:
        while True:
            message = await parts.get()
            if message is None:
                break
            if message["type"] == "http.response.start":
                yield {"status": message["status"],
                       "headers": [(k.decode("latin-1"), v.decode("latin-1")) for k, v in message.get("headers", [])]}
            elif message["type"] == "http.response.body":
                if message.get("body"):
                    yield message["body"]
                if not message.get("more_body"):
                    break
        await runner
    finally:
        gone.set()
        if not runner.done():
            try:
                await asyncio.wait_for(runner, 5)
            except (asyncio.TimeoutError, Exception):
                runner.cancel()
