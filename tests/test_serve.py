"""`prefix-edge serve`: a real server on a free loopback port, driven by the official `openai`
client (sync and streaming) and raw HTTP for the error cases. Every answer is compared with the
same request run in-process (greedy, ONNX: exact under concurrency). The server and the
in-process runtime: tests/helpers/served.py."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from .conftest import INPUTS  # noqa: E402
from .helpers.served import KEY, client, launch_server, local, server  # noqa: E402,F401  (fixtures)


def test_models_are_tasks(client, local):
    models = {m.id: m for m in client.models.list()}
    assert set(models) == set(local.tasks) | {"base"}  # and the bundle's model, no prefix
    assert models["base"].model_extra["prefix_tokens"] == 0
    assert models["support"].model_extra["prefix_tokens"] == local.tasks["support"].prefix_tokens


def test_chat_and_completion_match_in_process(client, local):
    for task in ("support", "sentiment"):
        ref = local.generate(task, INPUTS[1], max_tokens=12)
        r = client.chat.completions.create(model=task, max_tokens=12,
                                           messages=[{"role": "user", "content": INPUTS[1]}])
        assert r.choices[0].message.content == ref.text
        assert r.usage.completion_tokens == len(ref.tokens)
        assert r.usage.prompt_tokens_details.cached_tokens == local.tasks[task].prefix_tokens
        assert r.usage.prompt_tokens == ref.stats.prefix_tokens + ref.stats.input_tokens
    ref = local.generate("raw", INPUTS[0], max_tokens=10)
    r = client.completions.create(model="raw", prompt=INPUTS[0], max_tokens=10)
    assert r.choices[0].text == ref.text
    assert r.choices[0].finish_reason == {"eos": "stop", "stop": "stop", "length": "length"}[ref.stats.finish_reason]


def test_streaming_with_usage(client, local):
    ref = local.generate("extract", INPUTS[2], max_tokens=16)
    chunks = list(client.chat.completions.create(
        model="extract", max_completion_tokens=16, stream=True, stream_options={"include_usage": True},
        messages=[{"role": "user", "content": [{"type": "text", "text": INPUTS[2]}]}]))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == ref.text
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(ref.tokens)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [{"eos": "stop", "stop": "stop", "length": "length"}[ref.stats.finish_reason]]


def test_seeded_sampling_matches(client, local):
    ref = local.generate("support", INPUTS[0], max_tokens=10, temperature=0.9, seed=7, top_p=0.9)
    r = client.chat.completions.create(model="support", max_tokens=10, temperature=0.9, seed=7, top_p=0.9,
                                       messages=[{"role": "user", "content": INPUTS[0]}])
    assert r.choices[0].message.content == ref.text


def _post(base, path, body, key=KEY, raw=None):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    if raw is not None:
        headers["Content-Type"] = "application/json"
        return httpx.post(base + path, content=raw, headers=headers, timeout=60)
    return httpx.post(base + path, json=body, headers=headers, timeout=60)


@pytest.mark.parametrize("body,status,param", [
    ({"model": "nope", "messages": [{"role": "user", "content": "hi"}]}, 404, "model"),
    ({"messages": [{"role": "user", "content": "hi"}]}, 400, "model"),
    ({"model": "support", "messages": []}, 400, "messages"),
    ({"model": "raw", "messages": [{"role": "system", "content": "x"}, {"role": "user", "content": "hi"}]}, 400, "messages"),
    ({"model": "support", "messages": [{"role": "function", "content": "x"}, {"role": "user", "content": "hi"}]}, 400, "messages"),
    ({"model": "support", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x"}]}, 400, "messages"),
    ({"model": "support", "messages": [{"role": "user", "content": "hi"}], "n": 9}, 400, "n"),
    ({"model": "support", "messages": [{"role": "user", "content": "hi"}], "temperature": "0.7"}, 400, "temperature"),
    ({"model": "support", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2.5}, 400, "max_tokens"),
    ({"model": "support", "messages": [{"role": "user", "content": "hi"}], "n": 0}, 400, "n"),
    ({"model": "support", "messages": [{"role": "user", "content": "hi"}], "top_logprobs": 3}, 400, "top_logprobs"),
    ({"model": "support", "messages": [{"role": "user", "content": "hi"}], "stop": [""]}, 400, "stop"),
    ({"model": "support", "messages": [{"role": "user", "content": "hi"}], "bogus": 1}, 400, "bogus"),
    ({"model": "support", "messages": [{"role": "user", "content": "   "}]}, 400, "messages"),
])
def test_errors_are_openai_shaped(server, body, status, param):
    r = _post(server, "/v1/chat/completions", body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["message"] and err["type"]


def test_bad_json_auth_and_unknown_model_via_client(server, client):
    r = _post(server, "/v1/chat/completions", None, raw=b"{not json")
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    r = _post(server, "/v1/models", None, key="wrong", raw=b"")
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", r.text
    assert httpx.get(server + "/v1/models").status_code == 401
    assert httpx.get(server + "/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])


def test_load_16_clients_equal_sequential(client, local):
    """16 concurrent clients x 10 requests: every answer equals its sequential greedy answer."""
    tasks = ["support", "sentiment", "raw", "extract"]
    reqs = [(tasks[i % 4], f"{INPUTS[i % 3]} #{i}") for i in range(160)]
    ref = [local.generate(t, x, max_tokens=6).text for t, x in reqs]

    def one(i):
        t, x = reqs[i]
        if t == "raw":
            return client.completions.create(model=t, prompt=x, max_tokens=6).choices[0].text
        return client.chat.completions.create(model=t, max_tokens=6,
                                              messages=[{"role": "user", "content": x}]).choices[0].message.content

    with ThreadPoolExecutor(16) as pool:
        got = list(pool.map(one, range(160)))
    assert got == ref


def test_disconnect_cancels_and_metrics(server):
    with httpx.stream("POST", server + "/v1/chat/completions", timeout=60,
                      headers={"Authorization": f"Bearer {KEY}"},
                      json={"model": "raw", "max_tokens": 400, "stream": True,
                            "logit_bias": {"2": -100},  # the tiny model's EOS: no early end
                            "messages": [{"role": "user", "content": INPUTS[0]}]}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {") and '"content"' in line:
                break  # one chunk, then hang up
    deadline = time.time() + 30
    text = ""
    while time.time() < deadline:
        text = httpx.get(server + "/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
        if "prefix_edge_client_disconnects_total 1" in text or 'reason="cancelled"' in text:
            break
        time.sleep(0.2)
    assert "prefix_edge_client_disconnects_total 1" in text, text
    assert json.loads(httpx.get(server + "/health").text)["active"] == 0
    assert "prefix_edge_ttft_seconds_bucket" in text and "prefix_edge_requests_total" in text


def test_overload_is_429_not_a_hang(bundle_int4):
    proc, base = launch_server(bundle_int4, "--slots", "1", "--queue", "1", api_key=None)
    try:
        body = {"model": "raw", "max_tokens": 300, "logit_bias": {"2": -100},
                "messages": [{"role": "user", "content": INPUTS[0]}]}
        with ThreadPoolExecutor(8) as pool:
            codes = list(pool.map(lambda _: _post(base, "/v1/chat/completions", body, key=None), range(8)))
        statuses = sorted(r.status_code for r in codes)
        assert 200 in statuses and 429 in statuses, statuses
        r429 = next(r for r in codes if r.status_code == 429)
        assert r429.headers["Retry-After"] and r429.json()["error"]["code"] == "overloaded"
    finally:
        proc.terminate()
        proc.wait(30)
