"""A real `prefix-edge serve` in a subprocess on a free loopback port (what the serve tests start)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(bundle, *extra) -> tuple[subprocess.Popen, str]:
    """`prefix-edge serve --bundle BUNDLE *extra` (no API key) once /health answers: (process,
    base URL). Its stderr goes to a file (a pipe nobody reads could fill and stall it): read
    it with stop_server()."""
    import httpx

    port = free_port()
    args = [sys.executable, "-m", "prefix_edge", "serve", "--bundle", str(bundle), "--port", str(port),
            *map(str, extra)]
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log, env=os.environ.copy())
    proc.log = log
    base = f"http://127.0.0.1:{port}"
    for _ in range(600):
        if proc.poll() is not None:
            raise AssertionError(_read(log))
        try:
            if httpx.get(base + "/health", timeout=1).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise AssertionError("server did not start")


def stop_server(proc: subprocess.Popen, timeout: float = 60) -> tuple[int, str]:
    """SIGTERM, wait; (exit status, everything it wrote on stderr)."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    return proc.returncode, _read(proc.log)


def _read(log) -> str:
    log.seek(0)
    return log.read().decode(errors="replace")


def metrics(base: str) -> dict[str, float]:
    """/metrics as {sample name with its labels: value}."""
    import httpx

    out = {}
    for line in httpx.get(base + "/metrics", timeout=30).text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out
