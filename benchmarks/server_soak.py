"""The adversarial cases of "a server you can leave running", replayed against `prefix-edge serve`
on one bundle (default: the default bundle, gguf), each case measured and written to one report.

    python benchmarks/server_soak.py [--bundle DIR] [--backend gguf] [--out docs/server-soak.json]

  a. the same greedy request 15x one after another with another task's request between repeats,
     over HTTP, slots 1 and 4: distinct answers, and how many equal a fresh runtime's
  b. 26 `support` requests under load (4 slots, mixed tasks beside them): how many equal the idle answer
  c. max_tokens 2600 / 4096 and a ~3000-token input: status and finish reason (streamed too)
  d. head of line: one request with max_tokens 2500, then 4 small ones: their wall time
  e. 4 running streams + 12 queued: the longest gap between two chunks of a running stream
  f. a 10 MB prompt: its status, and a small request's latency while it is sent
  g. a 1M-entry logit_bias: status and time
  h. 300 connections that trickle their head: how many are still open after 12 s
  i. SIGTERM while one client trickles its body and a stream runs: exit status, seconds to exit,
     how the stream ended; then a port already in use: exit status and stderr lines
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

SUPPORT_Q = "My parcel arrived damaged and the box was wet, what can I do?"
OTHER = [("extract", "Hi, this is Tom Baker from Leeds, I'd like 2 blue mugs."),
         ("sentiment", "The battery died after two days and support never answered."),
         ("translate", "Where is the nearest train station?")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(bundle, backend, *extra, port=None):
    port = port or free_port()
    proc = subprocess.Popen([sys.executable, "-m", "prefix_edge", "serve", "--bundle", str(bundle),
                             "--backend", backend, "--port", str(port), *map(str, extra)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(base + "/health", timeout=1).status_code == 200:
                return proc, base, port
        except httpx.HTTPError:
            time.sleep(0.1)
    raise SystemExit("server did not start: " + proc.stderr.read().decode()[-500:])


def stop(proc):
    proc.send_signal(signal.SIGTERM)
    proc.wait(60)


def chat(base, task, text, timeout=600, **kw):
    r = httpx.post(base + "/v1/chat/completions", timeout=timeout,
                   json={"model": task, "messages": [{"role": "user", "content": text}], **kw})
    return r


def content(r):
    return r.json()["choices"][0]["message"]["content"] if r.status_code == 200 else f"HTTP {r.status_code}"


def case_a(bundle, backend, fresh):
    out = {}
    for slots in (1, 4):
        proc, base, _ = start(bundle, backend, "--slots", slots)
        try:
            answers = []
            for k in range(15):
                t, x = OTHER[k % 3]
                chat(base, t, x, max_tokens=48)
                answers.append(content(chat(base, "support", SUPPORT_Q, max_tokens=64)))
        finally:
            stop(proc)
        out[f"slots_{slots}"] = {"distinct": len(set(answers)), "equal_fresh": sum(a == fresh for a in answers),
                                 "of": len(answers)}
    return out


def case_b(base, idle):
    def one(k):
        if k % 2:
            t, x = OTHER[k % 3]
            chat(base, t, x, max_tokens=48)
            return None
        return content(chat(base, "support", SUPPORT_Q, max_tokens=64))

    with ThreadPoolExecutor(8) as pool:
        got = [a for a in pool.map(one, range(52)) if a is not None]
    return {"equal_idle": sum(a == idle for a in got), "of": len(got)}


def case_c(base):
    out = {}
    for mt in (2600, 4096):
        r = chat(base, "support", SUPPORT_Q, max_tokens=mt, logit_bias={"2": -100})
        out[f"max_tokens_{mt}"] = {"status": r.status_code,
                                   "finish": r.json()["choices"][0]["finish_reason"] if r.status_code == 200 else None,
                                   "completion_tokens": r.json().get("usage", {}).get("completion_tokens")}
    long_input = "the parcel was late and " * 500  # ~3000 tokens
    r = chat(base, "support", long_input, max_tokens=16)
    out["input_3000"] = {"status": r.status_code, "prompt_tokens": r.json().get("usage", {}).get("prompt_tokens"),
                         "code": r.json().get("error", {}).get("code") if r.status_code != 200 else None}
    too_long = "the parcel was late and " * 900
    r = chat(base, "support", too_long, max_tokens=16)
    out["input_5400"] = {"status": r.status_code, "code": r.json().get("error", {}).get("code")}
    with httpx.stream("POST", base + "/v1/chat/completions", timeout=600,
                      json={"model": "support", "stream": True, "max_tokens": 4096, "logit_bias": {"2": -100},
                            "messages": [{"role": "user", "content": SUPPORT_Q}]}) as r:
        lines = [ln for ln in r.iter_lines() if ln]
    out["max_tokens_4096_streamed"] = {"status": r.status_code, "last": lines[-1],
                                       "finish": json.loads(lines[-2][6:])["choices"][0]["finish_reason"]}
    return out


def case_d(base):
    big = threading.Thread(target=chat, args=(base, "support", SUPPORT_Q), kwargs={"max_tokens": 2500, "logit_bias": {"2": -100}})
    big.start()
    time.sleep(0.5)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda k: chat(base, *OTHER[k % 3], max_tokens=16), range(4)))
    small = time.perf_counter() - t0
    big.join()
    t0 = time.perf_counter()
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda k: chat(base, *OTHER[k % 3], max_tokens=16), range(4)))
    return {"four_small_beside_big_s": round(small, 2), "four_small_alone_s": round(time.perf_counter() - t0, 2)}


def case_e(base):
    gaps = {}

    def one(k):
        last, worst = None, 0.0
        with httpx.stream("POST", base + "/v1/chat/completions", timeout=600,
                          json={"model": "support", "stream": True, "max_tokens": 64, "logit_bias": {"2": -100},
                                "messages": [{"role": "user", "content": f"{SUPPORT_Q} ({k})"}]}) as r:
            for ln in r.iter_lines():
                if '"content"' in ln and '"content": ""' not in ln:  # not the role frame
                    now = time.perf_counter()
                    if last is not None:
                        worst = max(worst, now - last)
                    last = now
        gaps[k] = worst

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(one, range(16)))
    return {"streams": 16, "slots": 4, "max_gap_s": round(max(gaps.values()), 3)}


def case_f(base):
    res = {}

    def big():
        t0 = time.perf_counter()
        r = httpx.post(base + "/v1/chat/completions", timeout=600,
                       content=json.dumps({"model": "support", "messages": [
                           {"role": "user", "content": "x" * (10 << 20)}]}).encode(),
                       headers={"Content-Type": "application/json"})
        res["status"], res["seconds"] = r.status_code, round(time.perf_counter() - t0, 3)

    th = threading.Thread(target=big)
    th.start()
    t0 = time.perf_counter()
    r = chat(base, "sentiment", OTHER[1][1], max_tokens=4)
    res["small_request_s"] = round(time.perf_counter() - t0, 3)
    res["small_status"] = r.status_code
    th.join()
    return res


def case_g(base):
    t0 = time.perf_counter()
    bias = {str(i): 1 for i in range(1_000_000)}
    r = httpx.post(base + "/v1/chat/completions", timeout=600, json={
        "model": "support", "messages": [{"role": "user", "content": "hi"}], "logit_bias": bias})
    return {"status": r.status_code, "seconds": round(time.perf_counter() - t0, 3),
            "code": r.json()["error"]["code"]}


def case_h(port):
    socks = []
    for _ in range(300):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\n")
        socks.append(s)
    time.sleep(12)
    still = count_open(socks, 0.05)
    over = [socket.create_connection(("127.0.0.1", port)) for _ in range(1100)]
    time.sleep(1)
    kept = count_open(over, 0.01)
    return {"trickling_open_after_12s": still, "of": 300, "of_1100_kept_open": kept}


def count_open(socks, wait: float) -> int:
    """How many of `socks` the server still holds open (a recv that neither ends nor fails);
    closes them all."""
    n = 0
    for s in socks:
        s.settimeout(wait)
        try:
            n += s.recv(1) != b""
        except socket.timeout:
            n += 1
        except OSError:
            pass
        s.close()
    return n


def case_i(bundle, backend):
    proc, base, port = start(bundle, backend, "--grace", 3)
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n{")
    lines = []

    def stream():
        with httpx.stream("POST", base + "/v1/chat/completions", timeout=600,
                          json={"model": "support", "stream": True, "max_tokens": 3000, "logit_bias": {"2": -100},
                                "messages": [{"role": "user", "content": SUPPORT_Q}]}) as r:
            lines.extend(ln for ln in r.iter_lines() if ln)

    th = threading.Thread(target=stream)
    th.start()
    time.sleep(1.0)
    t0 = time.perf_counter()
    proc.send_signal(signal.SIGTERM)
    proc.wait(120)
    th.join()
    s.close()
    out = {"exit": proc.returncode, "seconds_to_exit": round(time.perf_counter() - t0, 2),
           "stream_last": lines[-1] if lines else None,
           "stream_error_code": json.loads(lines[-2][6:]).get("error", {}).get("code") if len(lines) > 1 else None}
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        p = subprocess.run([sys.executable, "-m", "prefix_edge", "serve", "--bundle", str(bundle),
                            "--port", str(busy.getsockname()[1])], capture_output=True, timeout=120)
    out["port_in_use"] = {"exit": p.returncode, "stderr": p.stderr.decode().strip().splitlines()}
    return out


def main() -> None:
    from prefix_edge import Runtime
    from prefix_edge.paths import default_bundle

    ap = argparse.ArgumentParser()
    ap.add_argument("--bundle", type=Path, default=None)
    ap.add_argument("--backend", default="gguf")
    ap.add_argument("--out", type=Path, default=Path("docs/server-soak.json"))
    a = ap.parse_args()
    bundle = a.bundle or default_bundle()
    with Runtime.open(bundle, backend=a.backend) as rt:
        fresh = rt.generate("support", SUPPORT_Q, max_tokens=64).text
    report = {"bundle": str(bundle), "backend": a.backend, "date": time.strftime("%Y-%m-%d"),
              "command": "python benchmarks/server_soak.py"}
    report["a_repeats_after_other_tasks"] = case_a(bundle, a.backend, fresh)
    print(json.dumps(report["a_repeats_after_other_tasks"]), flush=True)
    proc, base, port = start(bundle, a.backend, "--slots", 4)
    try:
        report["b_support_under_load"] = case_b(base, fresh)
        for name, fn in (("c_long_requests", case_c), ("d_head_of_line", case_d), ("e_stalls", case_e),
                         ("f_10mb_prompt", case_f), ("g_1m_logit_bias", case_g)):
            report[name] = fn(base)
            print(name, json.dumps(report[name]), flush=True)
        report["h_connections"] = case_h(port)
        print(json.dumps(report["h_connections"]), flush=True)
    finally:
        stop(proc)
    report["i_shutdown_and_port"] = case_i(bundle, a.backend)
    print(json.dumps(report["i_shutdown_and_port"]), flush=True)
    a.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    os.environ.setdefault("PREFIX_EDGE_LOG", "0")
    main()
