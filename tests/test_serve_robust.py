"""A server you can leave running: a real `prefix-edge serve` (llama.cpp backend, quantized tiny
bundle) on a loopback port, attacked as a client would: oversized and trickled bodies, trickled
headers, too many connections, invalid text, huge requests, disconnects, more streams than
threads, SIGTERM mid-stream, and a seeded chaos run whose every completed answer must equal the
same request run alone in a fresh in-process runtime."""

from __future__ import annotations

import json
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("llama_cpp")

from prefix_edge import Runtime  # noqa: E402

from .conftest import INPUTS  # noqa: E402
from .helpers.served import launch_server  # noqa: E402

EOS_BAN = {"2": -100}  # the tiny model's EOS: no early end


def start(bundle, *extra):
    """A real server on the llama.cpp backend (no API key): (process, base URL, port)."""
    proc, base = launch_server(bundle, "--backend", "gguf", *map(str, extra), api_key=None)
    return proc, base, int(base.rsplit(":", 1)[1])


def stop(proc, sig=signal.SIGTERM, timeout=30) -> tuple[int, str]:
    proc.send_signal(sig)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    return proc.returncode, proc.stderr.read().decode()


def chat(task, text, **kw):
    return {"model": task, "messages": [{"role": "user", "content": text}], **kw}


@pytest.fixture(scope="module")
def server(bundle_int4):
    proc, base, port = start(bundle_int4, "--slots", "2", "--n-ctx", "256", "--max-body", 20000,
                             "--body-timeout", 1, "--header-timeout", 1, "--max-connections", 24)
    assert httpx.get(base + "/health").json()["backend"] == "gguf"
    yield base, port
    rc, err = stop(proc)
    assert rc == 0, err  # idle: a clean exit
    assert "Traceback" not in err, err


def _raw(port, data: bytes, wait: float = 0.0) -> bytes:
    """Everything the server sends until IT ends the connection (a close or a reset); a
    connection the server holds raises socket.timeout here (10 s: a hang guard)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        s.sendall(data)
        if wait:
            time.sleep(wait)
        out = b""
        while True:
            try:
                part = s.recv(65536)
            except ConnectionResetError:
                break
            if not part:
                break
            out += part
        return out
    finally:
        s.close()


def test_body_limits(server):
    base, port = server
    r = httpx.post(base + "/v1/chat/completions", content=b"x" * 30000)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"

    def chunks():  # no Content-Length: counted as it arrives
        for _ in range(30):
            yield b"x" * 1000

    r = httpx.post(base + "/v1/chat/completions", content=chunks())
    assert r.status_code == 413
    # a body that trickles: 408 after --body-timeout, then the server ends the connection
    out = _raw(port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 500\r\n\r\n{\"model\": ")
    assert out.startswith(b"HTTP/1.1 408"), out[:200]


def test_head_timeout_and_connection_cap(server):
    base, port = server
    out = _raw(port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")  # never finishes its head
    assert out == b""  # closed by the server (its --header-timeout), not held
    socks = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(40)]
    try:
        time.sleep(0.5)
        closed = 0
        for s in socks:
            s.settimeout(0.2)
            try:
                closed += s.recv(1) == b""
            except socket.timeout:
                pass
            except ConnectionResetError:
                closed += 1
        assert closed >= 40 - 24, closed  # beyond the cap, closed at once
    finally:
        for s in socks:
            s.close()
    assert httpx.get(base + "/health", timeout=5).status_code == 200


@pytest.mark.parametrize("body,status,param,code", [
    (chat("support", "a\ud800b"), 400, "messages", None),
    ({"model": "sup\udc00", "messages": [{"role": "user", "content": "hi"}]}, 400, "model", None),
    (chat("support", "hi", logit_bias={str(i): 1 for i in range(301)}), 400, "logit_bias", None),
    (chat("support", "hi", logit_bias={"99999999": 1}), 400, "logit_bias", None),
    (chat("support", "word " * 600), 400, "messages", "context_length_exceeded"),
])
def test_client_mistakes_are_4xx(server, body, status, param, code):
    base, _ = server
    raw = json.dumps(body, ensure_ascii=True).encode()  # a lone surrogate travels as \ud800
    r = httpx.post(base + "/v1/chat/completions", content=raw, headers={"Content-Type": "application/json"})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["code"] == code and err["message"]


def test_harmless_fields_and_huge_max_tokens(server, bundle_int4):
    base, _ = server
    with Runtime.open(bundle_int4, backend="gguf", n_ctx=256) as rt:
        ref = rt.generate("support", INPUTS[0], max_tokens=10 ** 6, logit_bias={2: -100})
    body = chat("support", INPUTS[0], max_tokens=10 ** 6, logit_bias=EOS_BAN, tools=None, tool_choice=None,
                prompt_cache_key="k", safety_identifier="u", modalities=["text"])
    r = httpx.post(base + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "length" and choice["message"]["content"] == ref.text
    assert r.json()["usage"]["completion_tokens"] == len(ref.tokens) == ref.stats.generated_tokens


def test_disconnected_non_streamed_client_cancels_at_once(bundle_int4):
    """A non-streamed client that hangs up while its request waits behind others (1 slot):
    its request is cancelled then (counted 499, never run to the end and counted 200). The
    requests ahead each run to the full context, and there are AHEAD of them, so they outlast
    the client's 0.3 s even on a fast machine (5 did not: the tiny model ran all six in 0.3 s)."""
    AHEAD = 16
    proc, base, _ = start(bundle_int4, "--slots", "1")
    try:
        body = chat("raw", INPUTS[0], max_tokens=10 ** 6, logit_bias=EOS_BAN)
        m0 = httpx.get(base + "/metrics").text
        with ThreadPoolExecutor(AHEAD) as pool:
            ahead = [pool.submit(httpx.post, base + "/v1/chat/completions", json=body, timeout=120)
                     for _ in range(AHEAD)]
            time.sleep(0.05)
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(base + "/v1/chat/completions", json=body, timeout=0.3)
            assert [f.result().status_code for f in ahead] == [200] * AHEAD
        m1 = httpx.get(base + "/metrics").text
        name = 'prefix_edge_requests_total{model="raw",status="%s"}'
        assert _metric(m1, name % 499) == _metric(m0, name % 499) + 1
        assert _metric(m1, name % 200) == _metric(m0, name % 200) + AHEAD
        assert _metric(m1, "prefix_edge_client_disconnects_total") == \
            _metric(m0, "prefix_edge_client_disconnects_total") + 1
        assert httpx.get(base + "/health").json()["active"] == 0
    finally:
        stop(proc)


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


def test_more_streams_than_threads_do_not_stall(bundle_int4):
    """24 streams on 2 slots (asyncio's default executor has 6 threads here): a running stream's
    chunks keep coming while the others wait; nothing holds a thread per waiting stream."""
    proc, base, _ = start(bundle_int4, "--slots", "2")
    try:
        gaps = []

        def one(k):
            last, worst = None, 0.0
            with httpx.stream("POST", base + "/v1/chat/completions", timeout=120,
                              json=chat("raw", f"{INPUTS[k % 3]} {k}", max_tokens=60, stream=True,
                                        logit_bias=EOS_BAN)) as r:
                for line in r.iter_lines():
                    if '"content"' in line and '"content": ""' not in line:
                        now = time.perf_counter()
                        if last is not None:
                            worst = max(worst, now - last)
                        last = now
            gaps.append(worst)

        with ThreadPoolExecutor(24) as pool:
            list(pool.map(one, range(24)))
        assert len(gaps) == 24 and max(gaps) < 2.0, sorted(gaps)[-3:]
    finally:
        stop(proc)


def test_port_in_use_is_one_line_before_loading(bundle_int4):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        p = subprocess.run([sys.executable, "-m", "prefix_edge", "serve", "--bundle", str(bundle_int4),
                            "--port", str(port)], capture_output=True, timeout=60)
    err = p.stderr.decode().strip()
    assert p.returncode == 1 and "in use" in err and "serving" not in err
    assert len(err.splitlines()) == 1, err


def test_sigterm_drains_then_ends_streams_with_an_error(bundle_int4):
    """48 streams on 2 slots (24 pairs of work), SIGTERM, a grace of about 2.5 pairs: the ones
    that finish in the grace period end normally, every other one with an error frame and
    [DONE]; exit 1, saying how many were cut. The grace is sized from a pair's time on this
    machine now (a fixed one would let nothing finish on a loaded machine)."""
    proc, base, _ = start(bundle_int4, "--slots", "2", "--queue", "64")
    t0 = time.perf_counter()
    threads, results = _start_streams(base, 2)
    for th in threads:
        th.join(120)
    pair = time.perf_counter() - t0
    assert len(results) == 2 and stop(proc)[0] == 0
    grace = max(1.0, 2.5 * pair)
    proc, base, _ = start(bundle_int4, "--slots", "2", "--grace", f"{grace:.2f}", "--queue", "64")
    threads, results = _start_streams(base, 48)  # a request arriving after SIGTERM is a 503 instead
    proc.send_signal(signal.SIGTERM)
    for th in threads:
        th.join(grace + 30)
    proc.wait(grace + 30)
    err = proc.stderr.read().decode()
    assert len(results) == 48 and all(r[-1] == "data: [DONE]" for r in results)
    done = [r for r in results if '"finish_reason": "length"' in r[-2]]
    cut = [r for r in results if json.loads(r[-2][6:]).get("error", {}).get("code") == "server_shutdown"]
    assert len(done) + len(cut) == 48 and done and cut, (len(done), len(cut))
    assert proc.returncode == 1 and f"{len(cut)} request(s)" in err, err
    assert "Traceback" not in err


def _long_stream(base, k: int) -> list[str]:
    """A streamed request that only the context ends (EOS banned): its non-empty SSE lines."""
    with httpx.stream("POST", base + "/v1/chat/completions", timeout=60,
                      json=chat("raw", f"{INPUTS[k % 3]} {k}", max_tokens=10 ** 6, stream=True,
                                logit_bias=EOS_BAN)) as r:
        return [line for line in r.iter_lines() if line]


def _start_streams(base, n: int, keep=lambda lines: lines):
    """n long streams, each on a thread appending keep(its lines) when it ends; returns once the
    server holds all of them (running or queued): (threads, results)."""
    results: list = []
    threads = [threading.Thread(target=lambda k: results.append(keep(_long_stream(base, k))), args=(k,))
               for k in range(n)]
    for th in threads:
        th.start()
    _until_accepted(base, n, results)
    return threads, results


def _until_accepted(base, n: int, finished: list) -> None:
    deadline = time.time() + 30
    while time.time() < deadline:
        h = httpx.get(base + "/health").json()
        if h["active"] + h["waiting"] + len(finished) >= n:
            return
        time.sleep(0.01)
    raise AssertionError(f"the server did not take {n} requests: {h}")


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS"))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_chaos(bundle_int4):
    """Seeded: streams and plain requests over mixed tasks, some disconnecting mid-answer or
    timing out, oversized bodies, a slow reader; every completed answer equals its lone run, no
    5xx, slots idle afterwards, RSS flat over rounds; then SIGTERM mid-run ends every stream with
    [DONE]."""
    reqs = [("support", INPUTS[0], 12), ("sentiment", INPUTS[1], 8), ("raw", INPUTS[2], 16),
            ("support", INPUTS[1] + " again", 10), ("extract", INPUTS[2], 12), ("raw", INPUTS[0], 6)]
    refs = []
    for t, x, n in reqs:
        with Runtime.open(bundle_int4, backend="gguf") as rt:
            refs.append(rt.generate(t, x, max_tokens=n).text)
    proc, base, _ = start(bundle_int4, "--slots", "3", "--max-body", 50000, "--grace", "2")
    rng = random.Random(1234)
    failures, statuses = [], []

    def op(seed):
        r = random.Random(seed)
        i = r.randrange(len(reqs))
        t, x, n = reqs[i]
        kind = r.choice(["stream", "plain", "drop", "timeout", "big", "slow"])
        if kind == "big":
            statuses.append(httpx.post(base + "/v1/completions", content=b"{" * 60000, timeout=30).status_code)
            return
        if kind == "timeout":
            try:
                httpx.post(base + "/v1/chat/completions", timeout=0.05,
                           json=chat(t, x, max_tokens=400, logit_bias=EOS_BAN))
            except httpx.TimeoutException:
                pass
            return
        if kind == "plain":
            resp = httpx.post(base + "/v1/chat/completions", json=chat(t, x, max_tokens=n), timeout=60)
            statuses.append(resp.status_code)
            if resp.status_code == 200 and resp.json()["choices"][0]["message"]["content"] != refs[i]:
                failures.append((i, kind))
            return
        text, k = [], 0
        with httpx.stream("POST", base + "/v1/chat/completions", timeout=60,
                          json=chat(t, x, max_tokens=n, stream=True)) as resp:
            statuses.append(resp.status_code)
            for line in resp.iter_lines():
                if kind == "slow":
                    time.sleep(0.05)
                if line.startswith("data: {"):
                    d = json.loads(line[6:])["choices"]
                    if d:
                        text.append(d[0]["delta"].get("content") or "")
                    k += 1
                    if kind == "drop" and k == 3:
                        return
        if "".join(text) != refs[i]:
            failures.append((i, kind))

    try:
        rss = []
        for rnd in range(3):
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(op, [rng.randrange(1 << 30) for _ in range(24)]))
            deadline = time.time() + 10
            while time.time() < deadline:
                h = httpx.get(base + "/health").json()
                if h["active"] == 0 and h["waiting"] == 0:
                    break
                time.sleep(0.1)
            assert h["active"] == 0 and h["waiting"] == 0, h
            rss.append(_rss_kb(proc.pid))
        assert failures == [], failures
        assert statuses and all(s < 500 for s in statuses), statuses
        assert 413 in statuses  # seed 1234 draws oversized bodies
        assert rss[2] - rss[1] < 30_000, rss  # kB: flat after the first round's warm-up
        # SIGTERM with streams running: every one ends with [DONE], none silently
        threads, ends = _start_streams(base, 30, keep=lambda lines: lines[-2:])  # the last two lines
        proc.send_signal(signal.SIGTERM)
        for th in threads:
            th.join(30)
        proc.wait(30)
        assert len(ends) == 30 and all(e[-1] == "data: [DONE]" for e in ends), ends
        n_cut = sum('"server_shutdown"' in e[0] for e in ends)
        assert proc.returncode == (1 if n_cut else 0)
        assert "Traceback" not in proc.stderr.read().decode()
    finally:
        if proc.poll() is None:
            proc.kill()


def test_unknown_routes_and_model_lookup_are_openai_shaped(server):
    base, _ = server
    r = httpx.get(base + "/v1/nothing")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    r = httpx.get(base + "/v1/chat/completions")
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"
    assert httpx.get(base + "/v1/models/support").json()["id"] == "support"
    r = httpx.get(base + "/v1/models/nope")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    c = openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0)
    assert c.models.retrieve("sentiment").id == "sentiment"


def test_shutdown_is_not_held_by_a_stalled_upload(bundle_int4):
    """A client trickling its body cannot hold the process: at the end of --grace its upload is
    answered 503 and the server exits 0 (nothing was generating), well before uvicorn's backstop
    (grace + 5 s)."""
    proc, base, port = start(bundle_int4, "--grace", "0.5", "--body-timeout", "60")
    s = socket.create_connection(("127.0.0.1", port), timeout=20)
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: 1000\r\n\r\n{\"model\": ")
    time.sleep(0.3)
    t0 = time.time()
    proc.send_signal(signal.SIGTERM)
    out = b""
    while True:
        part = s.recv(65536)
        if not part:
            break
        out += part
    s.close()
    proc.wait(30)
    assert out.startswith(b"HTTP/1.1 503"), out[:200]
    # not a timing bound: a half-sent body must not hold the shutdown for its --body-timeout
    # (60 s); the grace (0.5 s) and the 503 end it, so half the body timeout is plenty of room
    assert proc.returncode == 0 and time.time() - t0 < 60 / 2


def test_second_sigint_ends_streams_at_once_with_an_error(bundle_int4):
    """Ctrl-C twice: the second signal cuts every running and queued stream at once (well before
    --grace 30), each with an error frame and [DONE]; exit 1."""
    proc, base, _ = start(bundle_int4, "--slots", "1", "--grace", "30", "--queue", "64")
    threads, results = _start_streams(base, 24)
    t0 = time.time()
    proc.send_signal(signal.SIGINT)
    time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    for th in threads:
        th.join(30)
    proc.wait(30)
    # not a timing bound: the cut comes from the second signal, not from --grace (30 s) running out
    assert time.time() - t0 < 30 / 2
    assert len(results) == 24 and all(r[-1] == "data: [DONE]" for r in results)
    cut = [r for r in results if '"server_shutdown"' in r[-2]]
    assert len(cut) >= 12 and proc.returncode == 1
    assert "Traceback" not in proc.stderr.read().decode()
