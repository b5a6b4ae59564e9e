"""The real-model tier (`pytest -m real`; opt-in: the models are fetched once, 1.4 GB, and a 1.5B
model decodes at a few tokens a second here). Real trained GGUFs as people download them
(tests/helpers/real_models.py, sha256 pinned), exported `--format gguf` (read and baked without
transformers) and run through the runtime:
- Gemma 3 270M Q4_K_M (SentencePiece, window 512): a raw few-shot task answers as plain
  llama-cpp-python on the same file; a few-shot prefix past llama.cpp's sliding-window ring
  bakes and its replies equal the prefilled runs' bit for bit;
- Qwen2.5-Coder-1.5B-Instruct Q4_K_M (BPE qwen2, its own chat template), GGUF-only and as ONNX
  through transformers' de-quantization: a system-prompt task's replies baked == prefilled, a two-turn conversation == its cold replay, a JSON-schema answer
  that validates, a forced tool call that validates, embeddings of unit length that rank a
  paraphrase above an unrelated text."""

from __future__ import annotations

import json

import numpy as np
import pytest

from prefix_edge import Runtime

from .helpers.real_models import GEMMA3_270M, QWEN25_CODER_1_5B, fetch

pytestmark = pytest.mark.real

FEW_SHOT = ("Translate English to French.\nEnglish: thank you\nFrench: merci\nEnglish: good morning\n"
            "French: bonjour\nEnglish: the cat\nFrench: le chat\n")
PAIRS = [("the house", "la maison"), ("I am happy", "je suis heureux"), ("the red car", "la voiture rouge"),
         ("where is the station", "où est la gare"), ("my brother", "mon frère"),
         ("the book is on the table", "le livre est sur la table")]
SQL = ("You write one SQLite query for the question, and nothing else. Tables: customers(id, name, city), "
       "orders(id, customer_id, total, placed_at). Examples: 'How many customers?' -> SELECT COUNT(*) FROM "
       "customers; 'Orders over 100' -> SELECT * FROM orders WHERE total > 100;")


def _export(tmp, gguf, tasks: str, fmt: str = "gguf"):
    from prefix_edge.export.build import export_bundle

    (tmp / "tasks.toml").write_text(tasks, encoding="utf-8")
    return export_bundle(gguf, tmp / "tasks.toml", tmp / "bundle", formats=(fmt,), progress=False)


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    gguf = fetch(GEMMA3_270M)
    tmp = tmp_path_factory.mktemp("gemma3-270m")
    long = "Translate English to French.\n" + "".join(f"English: {e}\nFrench: {f}\n" for e, f in PAIRS * 16)
    manifest = _export(tmp, gguf, f'[task.french]\nchat = false\nprefix = {json.dumps(FEW_SHOT)}\n'
                                  'template = "English: {input}\\nFrench:"\nmax_tokens = 6\n\n'
                                  f'[task.french_long]\nchat = false\nprefix = {json.dumps(long)}\n'
                                  'template = "English: {input}\\nFrench:"\nmax_tokens = 6\n')
    return gguf, tmp / "bundle", manifest


def test_gemma3_answers_as_llama_cpp(gemma):
    from llama_cpp import Llama

    gguf, bundle, manifest = gemma
    assert manifest.extra["tokenizer_check"]["checked_against"] == "llama.cpp"
    plain = Llama(str(gguf), n_ctx=2048, verbose=False)
    with Runtime.open(bundle, backend="gguf") as rt:
        for text in ("good night", "the dog", "I love you"):
            ours = rt.generate("french", text)
            theirs = plain(FEW_SHOT + f"English: {text}\nFrench:", max_tokens=6, temperature=0.0)
            assert ours.text == theirs["choices"][0]["text"], text


def test_gemma3_prefix_past_the_window(gemma):
    _, bundle, manifest = gemma
    assert manifest.tasks["french_long"].prefix_tokens > 2 * 512  # past llama.cpp's ring (window + a batch)
    with Runtime.open(bundle, backend="gguf", read_ahead=False) as rt:
        for text in ("good night", "the dog", "I love you", "the red house"):
            # bit for bit: the restored window's cells sit where a prefill leaves them (before,
            # past llama.cpp's ring, ~1e-3 apart, and "the dog" answered " le chat" baked)
            prefilled = rt.generate("french_long", text, use_prefix_cache=False, logprobs=2)
            baked = rt.generate("french_long", text, logprobs=2)
            assert baked.tokens == prefilled.tokens and baked.logprobs == prefilled.logprobs, text


def test_gemma3_requests_together_answer_as_alone(gemma):
    """Requests decoded together give each one's lone tokens (the engine forwards sequences
    together only where it measured at open that a token beside another's is computed as alone)."""
    import threading

    _, bundle, _ = gemma
    texts = ["good night", "the dog", "I love you", "the red house"]
    with Runtime.open(bundle, backend="gguf", slots=4, read_ahead=False) as rt:
        alone = [rt.generate("french", t, max_tokens=12).tokens for t in texts]
        got: dict = {}
        threads = [threading.Thread(target=lambda k=k: got.__setitem__(k, rt.generate("french", texts[k], max_tokens=12).tokens))
                   for k in range(len(texts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert [got.get(k) for k in range(len(texts))] == alone


@pytest.fixture(scope="module", params=["gguf", "onnx"])
def qwen(request, tmp_path_factory):
    """The 1.5B model's bundle: GGUF-only (read and baked by llama.cpp), or ONNX through
    transformers' de-quantization of the same file (the own graph, int4)."""
    gguf = fetch(QWEN25_CODER_1_5B)
    tmp = tmp_path_factory.mktemp(f"qwen-1.5b-{request.param}")
    _export(tmp, gguf, f"[task.sql]\nsystem = {json.dumps(SQL)}\nmax_tokens = 24\n", request.param)
    return tmp / "bundle", request.param


def test_qwen_1_5b_baked_prefilled_chat_schema_tools_embeddings(qwen):
    jsonschema = pytest.importorskip("jsonschema")
    bundle, backend = qwen
    with Runtime.open(bundle, backend=backend) as rt:
        for q in ("How many orders?", "Customers in Lyon"):
            assert rt.generate("sql", q).tokens == rt.generate("sql", q, use_prefix_cache=False).tokens, q
        chat = rt.chat("sql")
        chat.send("Customers in Paris", max_tokens=16)
        second = chat.send("Now only their names", max_tokens=16)
        cold = rt.generate("sql", messages=chat.messages[:-1], max_tokens=16, use_prompt_cache=False)
        assert second.tokens == cold.tokens
        schema = {"type": "object", "properties": {"query": {"type": "string", "maxLength": 80}},
                  "required": ["query"], "additionalProperties": False}
        r = rt.generate("sql", "How many customers?", json_schema=schema, max_tokens=40)
        jsonschema.validate(json.loads(r.text), schema)
        tool = {"type": "function", "function": {"name": "run_query", "parameters": {
            "type": "object", "properties": {"sql": {"type": "string", "maxLength": 60}},
            "required": ["sql"], "additionalProperties": False}}}
        r = rt.generate(None, messages=[{"role": "user", "content": "Count the orders."}], tools=[tool],
                        tool_choice="required", max_tokens=48)
        assert r.tool_calls and r.tool_calls[0]["function"]["name"] == "run_query", r
        jsonschema.validate(json.loads(r.tool_calls[0]["function"]["arguments"]), tool["function"]["parameters"])
        v = rt.embed(["The order arrived broken.", "My package came damaged.", "The sky is blue today."])
        assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-4)
        assert v[0] @ v[1] > v[0] @ v[2]
