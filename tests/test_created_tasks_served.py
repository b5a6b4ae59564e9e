"""Tasks created at run time on the real engines (the tiny int4 bundle: ONNX Runtime and
llama.cpp) and over HTTP (a real `prefix-edge serve --allow-task-api`, driven by httpx for
/v1/tasks and by the official openai client for the created task as a model).

References: a created task's answer is its prefix prefilled in the request (use_prefix_cache
False) on the same engine; the server's, a local runtime's on the same bundle and store."""

from __future__ import annotations

import pytest

from prefix_edge import Runtime

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("llama_cpp")

from .helpers.serve import metrics, start_server, stop_server  # noqa: E402

FIELDS = {"system": "You answer in one short sentence, as a pirate would.",
          "examples": [{"user": "Hello?", "assistant": "Ahoy, matey!"}], "max_tokens": 12}
ASK = [{"role": "user", "content": "Where is the treasure?"}]


@pytest.mark.parametrize("backend", ["onnx", "gguf"])
def test_a_created_task_answers_as_its_prefill_on_each_engine(bundle_int4, tmp_path, backend):
    with Runtime.open(bundle_int4, backend=backend, task_store=tmp_path / "store") as rt:
        made = rt.add_task("pirate", **FIELDS)
        assert made["verified"]["baked_equals_prefilled"] and made["backends"] == [backend]
        baked = rt.generate("pirate", messages=ASK, logprobs=2)
        prefilled = rt.generate("pirate", messages=ASK, logprobs=2, use_prefix_cache=False)
        assert baked.tokens == prefilled.tokens and baked.logprobs == prefilled.logprobs
        assert baked.stats.cached_from["task_prefix"] == made["prefix_tokens"] > 20


def test_made_on_one_engine_the_other_bakes_its_own_when_it_opens(bundle_int4, tmp_path):
    store = tmp_path / "store"
    with Runtime.open(bundle_int4, backend="gguf", task_store=store) as rt:
        rt.add_task("pirate", **FIELDS)
    with Runtime.open(bundle_int4, backend="onnx", task_store=store) as rt:
        assert rt.task_info("pirate")["backends"] == ["gguf", "onnx"]
        baked = rt.generate("pirate", messages=ASK)
        assert baked.tokens == rt.generate("pirate", messages=ASK, use_prefix_cache=False).tokens
    with Runtime.open(bundle_int4, backend="gguf", task_store=store) as rt:  # its own, as made
        assert rt.generate("pirate", messages=ASK).tokens == \
            rt.generate("pirate", messages=ASK, use_prefix_cache=False).tokens


@pytest.fixture(scope="module")
def served(bundle_int4, tmp_path_factory):
    store = tmp_path_factory.mktemp("served") / "store"
    proc, base = start_server(bundle_int4, "--backend", "gguf", "--slots", "2", "--n-ctx", "512",
                              "--allow-task-api", "--task-store", store, "--task-store-mb", 0.1)
    yield base, store
    rc, err = stop_server(proc)
    assert rc == 0, err
    assert "Traceback" not in err, err[-5000:]


def test_the_task_api_over_http(served, bundle_int4):
    base, store = served
    client = openai.OpenAI(base_url=base + "/v1", api_key="none")
    r = httpx.post(base + "/v1/tasks", json={"name": "pirate", **FIELDS}, timeout=300)
    assert r.status_code == 201, r.text
    made = r.json()
    assert made["id"] == "pirate" and made["origin"] == "created" and made["verified"]["baked_equals_prefilled"]
    assert "pirate" in [m.id for m in client.models.list().data]
    assert httpx.get(base + "/v1/tasks/pirate").json()["fields"] == FIELDS
    listed = {t["id"]: t["origin"] for t in httpx.get(base + "/v1/tasks").json()["data"]}
    assert listed["pirate"] == "created" and listed["support"] == "exported"
    got = client.chat.completions.create(model="pirate", messages=ASK, temperature=0)
    with Runtime.open(bundle_int4, backend="gguf", slots=2, n_ctx=512, task_store=store) as local:
        ref = local.generate("pirate", messages=ASK, temperature=0, use_prefix_cache=False)
    assert got.choices[0].message.content == ref.text and got.usage.completion_tokens == len(ref.tokens)
    assert metrics(base)["prefix_edge_created_tasks_count"] == 1

    def refused(method, path, status, param=None, **kw):
        resp = httpx.request(method, base + path, timeout=120, **kw)
        assert resp.status_code == status, resp.text
        err = resp.json()["error"]
        assert err["param"] == param and "\n" not in err["message"], err
        return err

    refused("POST", "/v1/tasks", 409, "name", json={"name": "pirate", "system": "x"})
    refused("POST", "/v1/tasks", 403, "name", json={"name": "support", "system": "x"})
    refused("POST", "/v1/tasks", 400, "name", json={"system": "x"})
    refused("POST", "/v1/tasks", 400, "template", json={"name": "t2", "system": "x", "template": "no input"})
    refused("POST", "/v1/tasks", 400, "colour", json={"name": "t2", "system": "x", "colour": 1})
    refused("POST", "/v1/tasks", 400, "kind", json={"name": "t2", "kind": "peft", "adapter": "/tmp"})
    refused("POST", "/v1/tasks", 400, "system", json={"name": "t2", "system": "long " * 2000})
    assert made["bytes"] < 0.1 * 2**20  # the store's 0.1 MiB: room for 'pirate', not for 400 tokens more
    assert refused("POST", "/v1/tasks", 429, None, json={"name": "t2", "system": "x " * 400})["code"] == "insufficient_quota"
    refused("POST", "/v1/tasks", 400, None, content=b"{not json", headers={"content-type": "application/json"})
    refused("DELETE", "/v1/tasks/support", 403, "name")
    refused("GET", "/v1/tasks/nothing", 404, "name")
    assert httpx.delete(base + "/v1/tasks/pirate").json() == {"id": "pirate", "object": "task.deleted", "deleted": True}
    refused("DELETE", "/v1/tasks/pirate", 404, "name")
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="pirate", messages=ASK)
    assert "pirate" not in [m.id for m in client.models.list().data]
    assert not any(p.name == "pirate" for p in store.iterdir())


def test_the_task_api_is_off_unless_allowed(bundle_int4, tmp_path):
    proc, base = start_server(bundle_int4, "--backend", "gguf", "--slots", "1", "--n-ctx", "256",
                              "--task-store", tmp_path / "store")
    try:
        r = httpx.post(base + "/v1/tasks", json={"name": "pirate", **FIELDS}, timeout=60)
        assert r.status_code == 403 and r.json()["error"]["code"] == "task_api_off", r.text
        assert httpx.delete(base + "/v1/tasks/support").status_code == 403
        assert httpx.get(base + "/v1/tasks").status_code == 200  # reading is not creating
    finally:
        rc, err = stop_server(proc)
    assert rc == 0 and "Traceback" not in err, err
