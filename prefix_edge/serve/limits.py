"""What one client may cost the server: a body-size limit and a body deadline (an ASGI wrapper),
a header deadline and a connection cap (a uvicorn protocol), the descriptor limit raised.

uvicorn has no header-read timeout and no connection cap of its own (`limit_concurrency`
answers 503 but keeps every socket open; `timeout_keep_alive` only covers idle time after a
response), so both live in a subclass of its h11 protocol; everything else is uvicorn's.
"""

from __future__ import annotations

import asyncio
import json

from ..options import MAX_INPUT_BYTES

MAX_BODY = MAX_INPUT_BYTES   # bytes of one request body (--max-body): the runtime's input cap
BODY_TIMEOUT = 30.0         # seconds to receive a whole body once its headers are in
HEADER_TIMEOUT = 10.0       # seconds from a connection's first byte (or its idle start) to a full request head
MAX_CONNECTIONS = 512       # open connections; beyond, a new one is closed at once


def _error_bytes(status: int, message: str, code: str, param: str | None = None) -> bytes:
    return json.dumps({"error": {"message": message, "type": "invalid_request_error",
                                 "param": param, "code": code}}).encode()


async def _respond(send, status: int, message: str, code: str) -> None:
    body = _error_bytes(status, message, code)
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"connection", b"close"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class BodyLimits:
    """Reads a request's whole body before the app sees it: more than `max_body` bytes is a 413
    (at once when Content-Length says so), a body not in within `timeout` seconds a 408, and a
    client that leaves mid-upload ends the request quietly (nothing to answer, no traceback)."""

    def __init__(self, app, max_body: int = MAX_BODY, timeout: float = BODY_TIMEOUT, readers=None):
        self.app, self.max_body, self.timeout = app, max_body, timeout
        self.readers = readers if readers is not None else set()  # tasks reading a body (shutdown ends them)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("method") in ("GET", "HEAD", "OPTIONS"):
            return await self.app(scope, receive, send)
        limit = self.max_body
        headers = dict(scope.get("headers") or [])
        try:
            declared = int(headers.get(b"content-length", b"-1"))
        except ValueError:
            declared = -1
        if declared > limit:
            return await _respond(send, 413, f"the request body is {declared} bytes; this server "
                                  f"takes at most {limit} (--max-body)", "request_too_large")
        chunks, n = [], 0
        me = asyncio.current_task()
        self.readers.add(me)
        try:
            async with asyncio.timeout(self.timeout):
                while True:
                    msg = await receive()
                    if msg["type"] == "http.disconnect":
                        return  # an aborted upload: the client is gone
                    part = msg.get("body", b"")
                    n += len(part)
                    if n > limit:
                        return await _respond(send, 413, f"the request body exceeds {limit} bytes "
                                              "(--max-body)", "request_too_large")
                    chunks.append(part)
                    if not msg.get("more_body", False):
                        break
        except TimeoutError:
            return await _respond(send, 408, f"the request body did not arrive within "
                                  f"{self.timeout:g} s", "request_timeout")
        except asyncio.CancelledError:
            if me.cancelling() and getattr(me, "_prefix_edge_cut", False):
                me.uncancel()  # ended by shutdown (ServerState.cut), not by uvicorn: answer it
                return await _respond(send, 503, "the server is shutting down", "unavailable")
            raise
        finally:
            self.readers.discard(me)
        whole, given = b"".join(chunks), False

        async def replay():
            nonlocal given
            if not given:
                given = True
                return {"type": "http.request", "body": whole, "more_body": False}
            return await receive()  # after the body: the disconnect, when it comes

        return await self.app(scope, replay, send)


def protocol_class(header_timeout: float = HEADER_TIMEOUT, max_connections: int = MAX_CONNECTIONS):
    """uvicorn's h11 protocol with a deadline for each request head and a connection cap."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class LimitedH11Protocol(H11Protocol):
        _head_timer = None

        def connection_made(self, transport):
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                transport.abort()  # over the cap: no descriptor is kept for it
                return
            self._arm()

        def _between_requests(self) -> bool:
            return self.cycle is None or self.cycle.response_complete

        def _arm(self) -> None:
            if self._head_timer is None:
                self._head_timer = self.loop.call_later(header_timeout, self._head_expired)

        def _head_expired(self) -> None:
            self._head_timer = None
            if self._between_requests() and not self.transport.is_closing():
                self.transport.close()  # no full request head in time (a trickling client)

        def data_received(self, data: bytes) -> None:
            if self._between_requests():
                self._arm()
            super().data_received(data)

        def connection_lost(self, exc):
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None
            super().connection_lost(exc)

    return LimitedH11Protocol


def raise_fd_limit() -> int:
    """Raise this process's open-file limit to its hard limit (at most 65536); return it."""
    try:
        import resource
    except ImportError:  # not on Windows
        return -1
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard if hard != resource.RLIM_INFINITY else 65536, 65536)
    if soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError):
            pass
    return soft
