"""`prefix-edge serve --ray` on a real local Ray cluster (2 replicas of the tiny int4 bundle, one
task held per replica): the same answers as Runtime.generate, task affinity, LRU reloads,
streaming, the API key, an unknown task, and a replica killed with SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from .conftest import INPUTS
from .test_serve import KEY, _free_port, local  # noqa: F401  (the in-process reference)

pytest.importorskip("ray", reason="the [ray] extra (ray[serve]) is not installed")
openai = pytest.importorskip("openai")

TASKS = ["support", "sentiment", "extract"]
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def cluster(bundle_int4, tmp_path_factory):
    port = _free_port()
    log = tmp_path_factory.mktemp("ray") / "serve.log"
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "prefix_edge", "serve", "--ray", "--bundle", str(bundle_int4),
                                 "--port", str(port), "--backend", "onnx", "--threads", "1", "--slots", "2",
                                 "--replicas", "2", "--tasks-per-replica", "1", "--api-key", KEY],
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
