"""The server the OpenAI-API tests share: `prefix-edge serve` of the tiny int4 bundle (ONNX, 4
slots, API key KEY) on a free loopback port, the official `openai` client on it, and the same
bundle opened in-process (`local`, the reference its answers are compared with).

The fixtures are taken by importing them into a test module (`from .helpers.served import
client, local, server`): each module that does gets its own server (module scope)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from prefix_edge import Runtime  # noqa: E402

from .serve import free_port  # noqa: E402

KEY = "test-key-123"


def launch_server(bundle, *extra, api_key=KEY) -> tuple[subprocess.Popen, str]:
    """`prefix-edge serve --backend onnx --slots 4 *extra [--api-key api_key]` once /health
    answers: (process, base URL). `extra` may override the backend and slots. Its stdout and
    stderr are pipes: read them once it has ended."""
    port = free_port()
    args = [sys.executable, "-m", "prefix_edge", "serve", "--bundle", str(bundle), "--port", str(port),
            "--backend", "onnx", "--slots", "4", *extra] + (["--api-key", api_key] if api_key else [])
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=os.environ.copy())
    base = f"http://127.0.0.1:{port}"
    for _ in range(300):
        if proc.poll() is not None:
            raise AssertionError(proc.stderr.read().decode())
        try:
            if httpx.get(base + "/health", timeout=1).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise AssertionError("server did not start")


@pytest.fixture(scope="module")
def server(bundle_int4):
    proc, base = launch_server(bundle_int4)
    yield base
    proc.terminate()
    proc.wait(30)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key=KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def local(bundle_int4):
    with Runtime.open(bundle_int4, backend="onnx") as rt:
        yield rt
