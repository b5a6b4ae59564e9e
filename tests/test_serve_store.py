"""What the server keeps between requests: stored responses never change after they are stored
(a chain from one, in every way the Responses API allows, leaves its record byte for byte and
what a chain from it sees token for token), and every store stays within its budget, reported
in /metrics: the stored responses by count and bytes, under a seeded soak of mixed requests
(benchmarks/soak.py, bounded) whose RSS growth after warm-up stays within the stores' budgets.
A real `prefix-edge serve` (llama.cpp, the tiny quantized bundle) driven over HTTP."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("llama_cpp")

from .helpers.serve import metrics, start_server, stop_server  # noqa: E402

STORED, STORED_MB, PROMPT_MB, CACHE_MB = 40, 3, 8, 6  # the prompt cache's cap, inside the caches' one budget
TOOL = {"type": "function", "name": "lookup", "description": "Look an order up.",
        "parameters": {"type": "object", "properties": {"order": {"type": "string"}}, "required": ["order"]}}


@pytest.fixture(scope="module")
def server(bundle_int4):
    proc, base = start_server(bundle_int4, "--backend", "gguf", "--slots", "2", "--n-ctx", "512",
                              "--stored-responses", STORED, "--stored-mb", STORED_MB,
                              "--prompt-cache", PROMPT_MB, "--cache", CACHE_MB)
    yield base, proc.pid
    rc, err = stop_server(proc)
    assert rc == 0, err
    assert "Traceback" not in err, err[-5000:]


def respond(base: str, **body) -> dict:
    r = httpx.post(base + "/v1/responses", json={"model": "support", "max_output_tokens": 4,
                                                 "temperature": 0, **body}, timeout=120)
    assert r.status_code == 200, r.text
    if body.get("stream"):  # the last event holds the response
        events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
        assert events[-1]["type"] in ("response.completed", "response.incomplete"), events[-1]
        return events[-1]["response"]
    return r.json()


def text_of(resp: dict) -> str:
    return "".join(p["text"] for item in resp["output"] if item["type"] == "message" for p in item["content"])


def probe(base: str, rid: str) -> tuple[int, str]:
    """What a plain chain from `rid` sees (input tokens) and answers (greedy)."""
    r = respond(base, previous_response_id=rid, input="and then?", max_output_tokens=6)
    return r["usage"]["input_tokens"], text_of(r)


def calls(k: int) -> list[dict]:
    return [{"type": "function_call", "call_id": f"call_x{k}", "name": "lookup", "arguments": '{"order": "A1"}'},
            {"type": "function_call_output", "call_id": f"call_x{k}", "output": "shipped"}]


def test_a_chain_never_changes_what_it_continues(server):
    base, _ = server
    a = respond(base, input="where is my order?", tools=[TOOL], tool_choice="required", max_output_tokens=24)
    assert a["output"][0]["type"] == "function_call", a  # A ends in a tool call
    call = a["output"][0]
    record = httpx.get(f"{base}/v1/responses/{a['id']}").content
    seen = probe(base, a["id"])
    # the reference: the same conversation sent whole, no stored response involved
    whole = respond(base, max_output_tokens=6, input=[
        {"role": "user", "content": "where is my order?"},
        {"type": "function_call", "call_id": call["call_id"], "name": call["name"], "arguments": call["arguments"]},
        {"role": "user", "content": "and then?"}])
    assert seen == (whole["usage"]["input_tokens"], text_of(whole))

    chains = [dict(input="plain text"),
              dict(input=[{"role": "user", "content": "a message item"},
                          {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "parts"}]}]),
              dict(input=calls(1)), dict(input=calls(2)),  # the calls once merged into A's own turn
              dict(input=[{"type": "function_call_output", "call_id": call["call_id"], "output": {"state": "late"}}]),
              dict(instructions="Answer briefly.", input="with instructions"),
              dict(tools=[TOOL], tool_choice="required", input="call it", max_output_tokens=24),
              dict(store=False, input=calls(3)),
              dict(stream=True, input=calls(4)),
              dict(stream=True, tools=[TOOL], input="streamed with tools"),
              dict(text={"format": {"type": "json_schema", "name": "o", "schema": {"type": "object"}}}, input="json"),
              dict(metadata={"k": "v"}, user="someone", input="with metadata")]
    kept = [respond(base, previous_response_id=a["id"], **kw) for kw in chains]
    b = kept[2]  # a chain from a chain, then B deleted: A is still as it was
    b_record = httpx.get(f"{base}/v1/responses/{b['id']}").content
    b_seen = probe(base, b["id"])
    respond(base, previous_response_id=b["id"], input=calls(5))
    assert httpx.get(f"{base}/v1/responses/{b['id']}").content == b_record
    assert probe(base, b["id"]) == b_seen
    assert httpx.delete(f"{base}/v1/responses/{b['id']}").json()["deleted"] is True
    assert httpx.get(f"{base}/v1/responses/{b['id']}").status_code == 404

    assert httpx.get(f"{base}/v1/responses/{a['id']}").content == record  # byte for byte
    assert probe(base, a["id"]) == seen  # token for token
    assert httpx.get(f"{base}/v1/responses/{kept[7]['id']}").status_code == 404  # store: false


def test_stored_responses_within_count_and_bytes(server):
    base, _ = server
    big = [respond(base, input="big", user="u" * 1_000_000, max_output_tokens=1)["id"] for _ in range(5)]
    m = metrics(base)
    assert m['prefix_edge_memory_budget_bytes{store="stored_responses"}'] == STORED_MB << 20
    assert m['prefix_edge_memory_bytes{store="stored_responses"}'] <= STORED_MB << 20
    assert httpx.get(f"{base}/v1/responses/{big[0]}").status_code == 404  # the oldest went first
    assert httpx.get(f"{base}/v1/responses/{big[-1]}").json()["user"] == "u" * 1_000_000
    small = [respond(base, input="small", max_output_tokens=1)["id"] for _ in range(STORED + 5)]
    m = metrics(base)
    assert m["prefix_edge_stored_responses"] == STORED == m["prefix_edge_stored_responses_max"]
    assert httpx.get(f"{base}/v1/responses/{small[4]}").status_code == 404
    assert httpx.get(f"{base}/v1/responses/{small[5]}").status_code == 200


def _soak():
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "soak.py"
    spec = importlib.util.spec_from_file_location("soak", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_soak_stays_within_the_budgets(server):
    """A seeded mix of 100 requests (benchmarks/soak.py): no 5xx; at every sample each store's
    bytes are within its budget; RSS growth after warm-up within the budgets' sum (+ slack)."""
    base, pid = server
    soak = _soak()
    report = soak.run(base, pid, requests=100, seed=1, concurrency=3, warmup=20, samples=5)
    assert not any(int(code) >= 500 for code in report["statuses"]), report["statuses"]
    assert report["statuses"].get(200, 0) >= 60, report["statuses"]
    assert not report["stores_over_budget"], report["stores_over_budget"]
    assert set(report["budgets_bytes"]) >= {"stored_responses", "host_cache", "task_prefixes"}
    assert report["budgets_bytes"]["host_cache"] == CACHE_MB << 20
    assert report["growth_after_warmup_mib"] <= report["bound_growth_mib"], report
