"""`prefix-edge serve --ray` on a real local Ray cluster (2 replicas of the tiny int4 bundle, one
task held per replica): the same answers (and embeddings) as the library, task affinity, LRU reloads,
streaming, the API key, an unknown task, stored responses found whichever replica answers, and
a replica killed with SIGKILL (between requests, and under four streams), and a task created
through one replica served by another."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import ExitStack

import httpx
import numpy as np
import pytest

from .conftest import INPUTS
from .helpers.serve import free_port
from .helpers.served import KEY, local  # noqa: F401  (the in-process reference)

pytest.importorskip("ray", reason="the [ray] extra (ray[serve]) is not installed")
openai = pytest.importorskip("openai")

TASKS = ["support", "sentiment", "extract"]
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def task_store(tmp_path_factory):
    return tmp_path_factory.mktemp("ray-tasks") / "store"


@pytest.fixture(scope="module")
def cluster(bundle_int4, tmp_path_factory, task_store):
    port = free_port()
    log = tmp_path_factory.mktemp("ray") / "serve.log"
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "prefix_edge", "serve", "--ray", "--bundle", str(bundle_int4),
                                 "--port", str(port), "--backend", "onnx", "--threads", "1", "--slots", "2",
                                 "--replicas", "2", "--tasks-per-replica", "1", "--api-key", KEY,
                                 "--allow-task-api", "--task-store", str(task_store)],
                                stdout=out, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 240
    while True:
        if proc.poll() is not None:
            raise AssertionError(log.read_text()[-3000:])
        try:
            if httpx.get(base + "/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.time() > deadline:
            proc.kill()
            raise AssertionError("the Ray cluster did not come up:\n" + log.read_text()[-3000:])
        time.sleep(1)
    yield base
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(90)
    except subprocess.TimeoutExpired:
        proc.kill()


def _ask(base: str, task: str, text: str, **kw) -> httpx.Response:
    return httpx.post(base + "/v1/chat/completions", headers=AUTH, timeout=120, json={
        "model": task, "messages": [{"role": "user", "content": text}], "max_tokens": 12, **kw})


def test_answers_streaming_and_errors(cluster, local):
    client = openai.OpenAI(base_url=cluster + "/v1", api_key=KEY, max_retries=0, timeout=120)
    for task in TASKS:
        for text in INPUTS[:2]:
            ref = local.generate(task, text, max_tokens=12)
            r = client.chat.completions.create(model=task, max_tokens=12, messages=[{"role": "user", "content": text}])
            assert r.choices[0].message.content == ref.text, (task, text)
            assert r.usage.completion_tokens == len(ref.tokens)
    ref = local.generate("support", INPUTS[0], max_tokens=12)
    parts = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="support", max_tokens=12, stream=True, messages=[{"role": "user", "content": INPUTS[0]}]) if c.choices]
    assert "".join(parts) == ref.text and len(parts) > 2
    raw = _ask(cluster, "support", INPUTS[0], stream=True)
    assert raw.status_code == 200 and raw.text.rstrip().endswith("data: [DONE]")
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    assert e.value.body["param"] == "model"
    assert httpx.post(cluster + "/v1/chat/completions", json={"model": "support"}).status_code == 401
    bad = _ask(cluster, "support", INPUTS[0], temperature=-1)  # the replica's own validation
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "temperature"
    models = httpx.get(cluster + "/v1/models", headers=AUTH).json()
    assert {m["id"] for m in models["data"]} == set(local.tasks) | {"base"}
    # /v1/embeddings goes through the ingress to a replica (model base): the library's vectors
    emb = client.embeddings.create(model="base", input=INPUTS[:2], encoding_format="float")
    got = np.array([d.embedding for d in emb.data], np.float32)
    np.testing.assert_allclose(got, local.embed(INPUTS[:2]), atol=1e-5)
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model="support", input="x")
    assert e.value.body["param"] == "model"


def _replica(r: httpx.Response) -> str:
    assert r.status_code == 200, r.text
    return r.headers["x-prefix-edge-replica"]


def _metric(base: str, name: str) -> dict[str, float]:
    out = {}
    for line in httpx.get(base + "/metrics", headers=AUTH).text.splitlines():
        if line.startswith(name + "{"):
            labels, value = line[len(name):].rsplit(" ", 1)
            out[labels] = float(value)
    return out


def test_task_affinity_and_lru_reloads(cluster):
    """Two tasks on two replicas holding one task each: once each sits on its own replica (the
    router places a task it finds nowhere on the replica with the fewest, so this settles
    within a few rounds), every later request goes to the replica that holds it: no reload."""
    a, b = TASKS[:2]
    last = None
    for _ in range(20):  # settled: on two replicas, and where they were the round before (the
        got = (_replica(_ask(cluster, a, INPUTS[0])), _replica(_ask(cluster, b, INPUTS[0])))
        if got[0] != got[1] and got == last:  # router's view of who holds what reaches it
            break                              # asynchronously, after a load)
        last = got
        time.sleep(0.5)
    loads = sum(_metric(cluster, "prefix_edge_replica_loads_total").values())
    seen = {a: set(), b: set()}
    for _ in range(4):
        for task in (a, b):
            seen[task].add(_replica(_ask(cluster, task, INPUTS[1])))
    assert len(seen[a]) == 1 and len(seen[b]) == 1 and seen[a] != seen[b], seen
    assert sum(_metric(cluster, "prefix_edge_replica_loads_total").values()) == loads
    before = sum(_metric(cluster, "prefix_edge_replica_loads_total").values())
    for _ in range(2):  # three tasks, two replicas holding one each: someone reloads
        for task in TASKS:
            _replica(_ask(cluster, task, INPUTS[2]))
    after = sum(_metric(cluster, "prefix_edge_replica_loads_total").values())
    assert after > before
    assert sum(_metric(cluster, "prefix_edge_replica_evictions_total").values()) >= after - 2
    counts = _metric(cluster, "prefix_edge_cluster_requests_total")
    assert sum(v for k, v in counts.items() if f'task="{a}"' in k) >= 7


def _respond(base: str, task: str, text: str, prev: str | None) -> httpx.Response:
    return httpx.post(base + "/v1/responses", headers=AUTH, timeout=120, json={
        "model": task, "input": text, "max_output_tokens": 8, "previous_response_id": prev})


def test_stored_responses_are_found_on_every_replica(cluster, local):
    """A chain of 8 responses alternating two tasks (so both replicas answer it), each turn
    continuing the one before: every turn finds its predecessor, answers as the in-process
    runtime does with the whole history, and every id is found by GET whichever replica holds it."""
    tasks = TASKS[:2]
    for _ in range(20):  # each task settled on its own replica (as in the affinity test)
        got = {_replica(_ask(cluster, t, INPUTS[0])) for t in tasks}
        if len(got) == 2:
            break
    history, prev, made, replicas = [], None, {}, set()
    for turn in range(8):
        task, text = tasks[turn % 2], f"{INPUTS[0]} {turn}"
        r = _respond(cluster, task, text, prev)
        assert r.status_code == 200, (turn, r.text)
        replicas.add(r.headers["x-prefix-edge-replica"])
        history.append({"role": "user", "content": text})
        ref = local.generate(task, messages=history, max_tokens=8)
        body = r.json()
        answer = "".join(p["text"] for item in body["output"] for p in item.get("content", []))
        assert answer == ref.text, turn
        assert body["usage"]["input_tokens"] == ref.stats.prefix_tokens + ref.stats.input_tokens
        history.append({"role": "assistant", "content": answer})
        made[body["id"]], prev = body, body["id"]
    assert len(replicas) == 2, replicas
    for rid, body in made.items():
        got = httpx.get(f"{cluster}/v1/responses/{rid}", headers=AUTH, timeout=60)
        assert got.status_code == 200 and got.json() == body, rid
    first = next(iter(made))  # deleted for every replica: neither found nor chained from
    assert httpx.delete(f"{cluster}/v1/responses/{first}", headers=AUTH).json()["deleted"] is True
    assert httpx.get(f"{cluster}/v1/responses/{first}", headers=AUTH).status_code == 404
    for task in tasks:
        assert _respond(cluster, task, "x", first).status_code == 404
    missing = httpx.get(cluster + "/v1/responses/resp_nope", headers=AUTH)
    assert missing.status_code == 404 and missing.json()["error"]["param"] == "response_id"
    chained = _respond(cluster, "support", "x", "resp_nope")
    assert chained.status_code == 404 and chained.json()["error"]["param"] == "previous_response_id"


def test_a_killed_replica(cluster, local):
    r = _ask(cluster, "support", INPUTS[0])
    pid = json.loads(r.headers["x-prefix-edge-counters"])["pid"]
    os.kill(pid, signal.SIGKILL)
    ref = {t: local.generate(t, INPUTS[0], max_tokens=12).text for t in TASKS}
    for i in range(6):
        task = TASKS[i % 3]
        got = _ask(cluster, task, INPUTS[0])
        assert got.status_code == 200, got.text
        assert got.json()["choices"][0]["message"]["content"] == ref[task]
        assert json.loads(got.headers["x-prefix-edge-counters"])["pid"] != pid


def test_response_store_keeps_its_byte_budget():
    """The shared store (cluster/store.py) on its own: least recently used dropped beyond the
    budget, a read counts as a use, an entry larger than the whole budget refused, a delete."""
    import asyncio

    from prefix_edge.cluster.store import ENTRY, ResponseStore

    async def run():
        store = ResponseStore.func_or_class(2 * (ENTRY + 40) + 10)  # room for two of 40 bytes
        for rid in ("a", "b"):
            assert await store.put(rid, b"r" * 20, b"m" * 20)
        assert await store.get("a") == (b"r" * 20, b"m" * 20)  # now b is the least recent
        assert await store.put("c", b"r" * 30, b"m" * 10)
        assert await store.get("b") is None and await store.get("a") is not None
        assert not await store.put("huge", b"r" * (2 * ENTRY), b"")
        assert await store.delete("c") and not await store.delete("c") and await store.get("c") is None
        return await store.stats()

    assert asyncio.run(run()) == {"count": 1, "bytes": ENTRY + 40, "budget": 2 * (ENTRY + 40) + 10,
                                  "evictions": 1, "refused": 1}


def test_ray_config_is_a_serve_deploy_config(bundle_int4, tmp_path):
    """`serve --ray-config` writes what Ray's own `serve deploy` validates (its schema)."""
    from ray.serve.schema import ServeDeploySchema

    out = tmp_path / "serve.json"
    got = subprocess.run([sys.executable, "-m", "prefix_edge", "serve", "--ray-config", str(out), "--bundle",
                          str(bundle_int4), "--replicas", "3", "--api-key", "secret"], capture_output=True, text=True)
    assert got.returncode == 0, got.stderr
    cfg = ServeDeploySchema(**json.loads(out.read_text()))
    app = cfg.applications[0]
    assert app.import_path == "prefix_edge.cluster.app:build" and app.args["replicas"] == 3
    assert app.args["bundle"] == str(bundle_int4) and "api_key" not in app.args  # no secret in the file


LONG = 400  # tokens: the tiny model decodes them for a while, so streams are mid-answer


def _events(lines) -> list[tuple[str | None, str]]:
    """(event, data) of each SSE event in the lines read so far."""
    out, kind = [], None
    for line in lines:
        if line.startswith("event: "):
            kind = line[7:]
        elif line.startswith("data: "):
            out.append((kind, line[6:]))
            kind = None
    return out


def test_a_replica_killed_under_streams(cluster, local):
    """Four streams (chat read raw and through the openai client, a Responses stream) and one
    plain request on one replica (2 slots: two streams decode, the rest wait), which is killed
    mid-answer: every stream ends with an OpenAI-shaped error (then `[DONE]`; `response.failed`
    for the Responses stream), the plain request is a retryable 503 (or answered, where it was
    not taken there), a response stored there is still found, and the cluster answers."""
    client = openai.OpenAI(base_url=cluster + "/v1", api_key=KEY, max_retries=0, timeout=120)
    stored = _respond(cluster, "base", INPUTS[0], None)
    victim = _replica(stored)
    chat = {"model": "base", "max_tokens": LONG, "messages": [{"role": "user", "content": INPUTS[1]}]}
    with ExitStack() as stack, httpx.Client(headers=AUTH, timeout=120) as http:
        def open_raw(path: str, body: dict):
            for _ in range(10):  # on the victim (the task's replica; the router may stray)
                r = stack.enter_context(http.stream("POST", cluster + path, json={**body, "stream": True}))
                assert r.status_code == 200, r.read()
                lines = r.iter_lines()
                first = next(lines)
                if r.headers["x-prefix-edge-replica"] == victim:
                    return r, [first], lines
                r.close()
            raise AssertionError("the streams did not reach the task's replica")

        raws = [open_raw("/v1/chat/completions", chat)[1:] for _ in range(2)]  # decoding
        plain: dict = {}  # waits for a slot behind them
        waiter = threading.Thread(target=lambda: plain.update(r=http.post(cluster + "/v1/chat/completions",
                                                                          json=chat)))
        waiter.start()
        for _ in range(10):
            sdk = client.chat.completions.create(stream=True, **chat)
            it = iter(sdk)
            next(it)
            if sdk.response.headers["x-prefix-edge-replica"] == victim:
                break
            sdk.close()
        assert sdk.response.headers["x-prefix-edge-replica"] == victim
        last, *resp = open_raw("/v1/responses", {"model": "base", "input": INPUTS[1], "max_output_tokens": LONG})
        held = json.loads(last.headers["x-prefix-edge-counters"])
        assert held["active"] + held["waiting"] >= 4 and held["replica"] == victim, held
        os.kill(held["pid"], signal.SIGKILL)
        for seen, lines in raws:
            events = _events(seen + list(lines))
            assert events[-1] == (None, "[DONE]"), events[-3:]
            err = json.loads(events[-2][1])["error"]
            assert err["code"] == "replica_failed" and err["type"] == "server_error" and err["message"]
            assert all(c["finish_reason"] is None for _, d in events[:-2] for c in json.loads(d)["choices"])
        with pytest.raises(openai.APIError) as e:
            for _ in it:
                pass
        assert e.value.body["code"] == "replica_failed"
        events = _events(resp[0] + list(resp[1]))
        kinds = [k for k, _ in events]
        assert kinds[0] == "response.created" and kinds[-2:] == ["error", "response.failed"], kinds[-3:]
        assert "response.completed" not in kinds
        assert [json.loads(d)["sequence_number"] for _, d in events] == list(range(len(events)))
        failed = json.loads(events[-1][1])["response"]
        assert failed["status"] == "failed" and failed["error"]["code"] == "replica_failed"
        assert failed["id"] == json.loads(events[0][1])["response"]["id"]
        waiter.join()
    r, ref = plain["r"], local.generate(None, messages=chat["messages"], max_tokens=LONG)
    if r.headers["x-prefix-edge-replica"] == victim:  # taken there (usually): a retryable 503
        assert r.status_code == 503 and r.headers["retry-after"], r.text
        assert r.json()["error"]["code"] == "replica_failed"
    else:  # the router sent it to the other replica, or it reached the victim only once dead
        assert r.json()["choices"][0]["message"]["content"] == ref.text
    again = httpx.get(f"{cluster}/v1/responses/{stored.json()['id']}", headers=AUTH, timeout=60)
    assert again.status_code == 200 and again.json() == stored.json()  # the store outlives the replica
    failures = _metric(cluster, "prefix_edge_cluster_replica_failures_total")
    assert failures[f'{{replica="{victim}"}}'] == 4 + (r.status_code == 503)
    ref = local.generate(None, messages=chat["messages"], max_tokens=12)
    after = _ask(cluster, "base", INPUTS[1])
    assert after.json()["choices"][0]["message"]["content"] == ref.text
    assert json.loads(after.headers["x-prefix-edge-counters"])["pid"] != held["pid"]


def test_a_task_created_through_one_replica_is_served_by_another(cluster, bundle_int4, task_store):
    """POST /v1/tasks reaches one replica; the task lives in the store the replicas share, so a
    replica that did not create it serves it, with the answer of its prefix prefilled on one
    runtime. Ray Serve's router may keep the task where it first landed for as long as that
    replica holds it (it prefers a replica that holds the task), so the tasks take turns a few
    rounds, and if the task is still only served by its creator, the creator is killed: the next
    call of it lands on a process that never saw it created."""
    from prefix_edge import Runtime

    r = httpx.post(cluster + "/v1/tasks", headers=AUTH, timeout=300,
                   json={"name": "pirate", "system": "You answer as a pirate would.", "max_tokens": 12})
    assert r.status_code == 201, r.text
    creator = json.loads(r.headers["x-prefix-edge-counters"])["pid"]
    with Runtime.open(bundle_int4, backend="onnx", threads=1, task_store=task_store) as rt:
        ref = rt.generate("pirate", messages=[{"role": "user", "content": INPUTS[0]}], max_tokens=12,
                          use_prefix_cache=False).text

    def pirate() -> int:
        got = _ask(cluster, "pirate", INPUTS[0])
        assert got.status_code == 200, got.text
        assert got.json()["choices"][0]["message"]["content"] == ref
        return json.loads(got.headers["x-prefix-edge-counters"])["pid"]

    served = {pirate()}
    for _ in range(6):  # the tasks take turns (one task held per replica): the router may move it
        if served - {creator}:
            break
        for task in TASKS[:2]:
            _replica(_ask(cluster, task, INPUTS[1]))
        served.add(pirate())
    if not served - {creator}:
        os.kill(creator, signal.SIGKILL)
        served.add(pirate())
    assert served - {creator}, (creator, served)
    assert httpx.delete(cluster + "/v1/tasks/pirate", headers=AUTH, timeout=60).status_code == 200
    for _ in range(4):  # deleted: no replica serves it any more
        assert _ask(cluster, "pirate", INPUTS[0]).status_code == 404

