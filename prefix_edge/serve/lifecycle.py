"""Starting and stopping the server: the port bound before anything loads, and a shutdown with a
bound.

SIGTERM or SIGINT: stop accepting, answer new requests on open connections with 503, let the
running ones finish for at most `grace` seconds, then end each one still running with an error
(streams: an error frame and `data: [DONE]`; others: a 503). A second signal ends them at once.
uvicorn's own graceful timeout (grace + 5 s) is the backstop that also ends a stalled upload.
The exit status is 1 when requests were cut, else 0.
"""

from __future__ import annotations

import asyncio
import errno
import socket

from ..errors import PrefixEdgeError

GRACE = 30.0  # seconds running requests may take to finish after SIGTERM (--grace)


def bind(host: str, port: int) -> socket.socket:
    """Bind the listening socket first: a port in use is one line before the model loads."""
    if not 0 < port < 65536:
        raise PrefixEdgeError(f"--port must be in 1..65535, got {port}")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise PrefixEdgeError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    family, _, _, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(2048)
    except OSError as e:
        sock.close()
        why = "the port is in use" if e.errno == errno.EADDRINUSE else e.strerror
        raise PrefixEdgeError(f"cannot listen on {host}:{port}: {why}") from None
    sock.set_inheritable(True)
    return sock


def make_server(config, state, grace: float = GRACE):
    """A uvicorn.Server whose signals drain `state` (the app's ServerState) within `grace`."""
    import uvicorn

    class DrainingServer(uvicorn.Server):
        async def serve(self, sockets=None):
            self._loop = asyncio.get_running_loop()
            await super().serve(sockets)

        def handle_exit(self, sig, frame):  # a signal handler: schedule, never block
            loop = getattr(self, "_loop", None)
            if not self.should_exit:
                self.should_exit = True
                state.draining = True
                if loop is not None:
                    loop.call_soon_threadsafe(loop.call_later, grace, state.cut, "shutdown")
            elif loop is not None:
                loop.call_soon_threadsafe(state.cut, "shutdown")

    config.timeout_graceful_shutdown = int(grace) + 5
    return DrainingServer(config)
