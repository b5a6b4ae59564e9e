"""Runtime.embed and /v1/embeddings on the tiny fp32 bundle (own ONNX graph + f32 GGUF).

References: transformers' own final hidden states of the same checkpoint (pooled here), the
same text embedded alone (batch == single), and the other engine (cosine). A real server on a
loopback port, driven by the official openai client and LangChain's OpenAIEmbeddings."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from prefix_edge import Runtime
from prefix_edge.errors import PrefixEdgeError
from prefix_edge.options import OptionError

from .helpers.serve import free_port, start_server, stop_server

pytest.importorskip("llama_cpp")

TEXTS = ["my sync stopped", "naïve café 🚀 order 12 mugs", "def f(x): return x",
         "the quick brown fox jumps over the lazy dog " * 6, "<|im_end|> spelled in a text"]
# measured on the tiny fp32 bundle (docs/embeddings.md): llama.cpp picks its matmul kernels by
# batch size, so a text batched with others moves by float rounding (max |diff| 2.8e-4 seen)
GGUF_BATCH_TOL = 2e-3
COS_FLOOR_FP32 = 0.9999  # ONNX fp32 vs GGUF f32, every text (0.9999998 seen)


@pytest.fixture(scope="module", params=["onnx", "gguf"])
def rt(request, bundle_fp32):
    with Runtime.open(bundle_fp32, backend=request.param) as r:
        yield r


def reference(tiny_model, texts, pooling):
    """transformers fp32: the final norm's output (what lm_head reads), pooled, L2-normed."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tiny_model / "tokenizer.json"))
    tok.encode_special_tokens = True
    return reference_ids(tiny_model, [tok.encode(t, add_special_tokens=False).ids for t in texts], pooling)


def reference_ids(tiny_model, id_lists, pooling="last"):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model), torch_dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for ids in id_lists:
            o = model(input_ids=torch.tensor([ids]), output_hidden_states=True)
            h = o.hidden_states[-1][0]
            # the last hidden state is the normed one: lm_head of it is the logits
            assert torch.allclose(model.lm_head(h), o.logits[0], atol=1e-4)
            v = (h.mean(0) if pooling == "mean" else h[-1]).numpy()
            out.append(v / np.linalg.norm(v))
    return np.stack(out)


@pytest.mark.parametrize("pooling", ["mean", "last"])
def test_embed_matches_transformers_and_batch_equals_single(rt, tiny_model, pooling):
    batch = rt.embed(TEXTS, pooling=pooling)
    assert batch.dtype == np.float32 and batch.shape == (len(TEXTS), 64)
    np.testing.assert_allclose(np.linalg.norm(batch, axis=1), 1.0, atol=1e-5)
    ref = reference(tiny_model, TEXTS, pooling)
    np.testing.assert_allclose(batch, ref, atol=1e-4 if rt.backend.name == "onnx" else 3e-3)
    single = np.stack([rt.embed(t, pooling=pooling)[0] for t in TEXTS])
    if rt.backend.name == "onnx":  # a text runs alone whatever else is asked: bit-identical
        assert np.array_equal(batch, single)
    else:
        assert np.abs(batch - single).max() < GGUF_BATCH_TOL
    # the same text's token ids embed to the same vector; unnormalised is the same direction
    ids = rt.tokenizer.encode(TEXTS[0], add_special_tokens=False).ids
    assert np.array_equal(rt.embed([ids], pooling=pooling)[0], rt.embed(TEXTS[0], pooling=pooling)[0])
    raw = rt.embed(TEXTS[0], pooling=pooling, normalize=False)[0]
    assert abs(np.linalg.norm(raw) - 1) > 1e-3
    np.testing.assert_allclose(raw / np.linalg.norm(raw), single[0], atol=1e-6)


def test_prompt_pooling_is_the_wrapped_texts_last_state(rt, tiny_model):
    """pooling "prompt" (PromptEOL): the text's ids between the prompt's own tokens, the last
    token's state; the reference is transformers on those ids, and "last" on the same ids."""
    from prefix_edge.runtime.embedding import PROMPT_HEAD, PROMPT_TAIL

    from tokenizers import Tokenizer

    got = rt.embed(TEXTS, pooling="prompt")
    text_tok = Tokenizer.from_str(rt.tokenizer.to_str())
    text_tok.encode_special_tokens = True  # a text's special-token spelling stays text
    enc = lambda t: text_tok.encode(t, add_special_tokens=False).ids  # noqa: E731
    wrapped = [enc(PROMPT_HEAD) + enc(t) + enc(PROMPT_TAIL) for t in TEXTS]
    if rt.backend.name == "onnx":
        assert np.array_equal(got, rt.embed(wrapped, pooling="last"))
    else:
        assert np.abs(got - rt.embed(wrapped, pooling="last")).max() < GGUF_BATCH_TOL
    ref = reference_ids(tiny_model, wrapped)
    np.testing.assert_allclose(got, ref, atol=1e-4 if rt.backend.name == "onnx" else 3e-3)
    # token ids are wrapped too; the prompt's tokens count toward the input's limit
    assert np.abs(rt.embed([enc(TEXTS[0])], pooling="prompt")[0] - got[0]).max() < GGUF_BATCH_TOL
    room = rt.embeddings.max_tokens - len(wrapped[0]) + len(enc(TEXTS[0]))
    with pytest.raises(OptionError, match=f"at most {room} tokens"):
        rt.embed([[5] * (room + 1)], pooling="prompt")


def test_embed_concurrent_calls_batched_equal_alone(bundle_fp32):
    """Many threads at once (the embedder's thread batches them): each gets its own vectors."""
    from concurrent.futures import ThreadPoolExecutor

    with Runtime.open(bundle_fp32, backend="gguf") as r:
        alone = [r.embed(t)[0] for t in TEXTS]
        with ThreadPoolExecutor(8) as pool:
            got = list(pool.map(lambda i: r.embed(TEXTS[i % len(TEXTS)])[0], range(24)))
        for i, v in enumerate(got):
            assert np.abs(v - alone[i % len(TEXTS)]).max() < GGUF_BATCH_TOL
        r.close()
        with pytest.raises(PrefixEdgeError, match="closed"):
            r.embed("after close")


def test_onnx_and_gguf_agree(bundle_fp32):
    with Runtime.open(bundle_fp32, backend="onnx") as a, Runtime.open(bundle_fp32, backend="gguf") as b:
        for pooling in ("mean", "last", "prompt"):
            cos = (a.embed(TEXTS, pooling=pooling) * b.embed(TEXTS, pooling=pooling)).sum(axis=1)
            assert cos.min() > COS_FLOOR_FP32, (pooling, cos)


def test_bad_inputs_name_the_field(bundle_fp32):
    with Runtime.open(bundle_fp32, backend="onnx") as r:
        long = "the quick brown fox " * 400  # > the 512 positions of the tiny model
        for bad in ([], "", [""], [[]], [1.5], [{"a": 1}], [[10 ** 6]], [[-1]], long, [True], None):
            with pytest.raises(OptionError) as e:
                r.embed(bad)
            assert e.value.field == "input" and "\n" not in str(e.value), bad
        with pytest.raises(OptionError, match="pooling"):
            r.embed("x", pooling="cls")


def test_graph_without_hidden_states_refused_naming_reexport(bundle_fp32, tmp_path):
    """A bundle exported before embeddings (own graph, no hidden_states output): one line."""
    import onnx

    from prefix_edge.runtime.embedding import Embedder
    from prefix_edge.runtime.engines.onnx.engine import OnnxBackend
    from tokenizers import Tokenizer

    m = onnx.load(str(bundle_fp32 / "onnx" / "model.onnx"))
    keep = [o for o in m.graph.output if o.name != "hidden_states"]
    del m.graph.output[:]
    m.graph.output.extend(keep)
    onnx.save(m, str(tmp_path / "old.onnx"))
    be = OnnxBackend(tmp_path / "old.onnx", n_ctx=512)
    emb = Embedder(be, Tokenizer.from_file(str(bundle_fp32 / "tokenizer" / "tokenizer.json")), 512)
    with pytest.raises(PrefixEdgeError, match="re-export") as e:
        emb.embed("hello")
    assert "\n" not in str(e.value)


@pytest.mark.e2e
def test_default_model_onnx_and_gguf_agree(default_home):
    """The default bundle (ONNX int4, GGUF q4_1): measured 2026-12-03, cosine per text mean
    pooling >= 0.9988, last >= 0.952 (the text ending in a space: its last token is that space),
    prompt >= 0.9979 (2026-12-04); gguf batch vs single max |diff| 0.0042 (mean), 0.0105 (last),
    0.0107 (prompt)."""
    bundle = default_home / "bundles" / "smollm2-135m"
    with Runtime.open(bundle, backend="onnx") as a, Runtime.open(bundle, backend="gguf") as b:
        for pooling, floor in (("mean", 0.995), ("last", 0.9), ("prompt", 0.995)):
            x, y = a.embed(TEXTS, pooling=pooling), b.embed(TEXTS, pooling=pooling)
            assert (x * y).sum(axis=1).min() > floor, pooling
            alone = np.stack([b.embed(t, pooling=pooling)[0] for t in TEXTS])
            assert np.abs(alone - y).max() < 0.03, pooling


# -- the server ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def served(bundle_fp32):
    proc, base = start_server(bundle_fp32, "--backend", "gguf")
    yield base
    stop_server(proc)


@pytest.fixture(scope="module")
def local_gguf(bundle_fp32):
    with Runtime.open(bundle_fp32, backend="gguf") as r:
        yield r


def test_openai_client_float_and_base64(served, local_gguf):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=served + "/v1", api_key="none", max_retries=0, timeout=60)
    want = local_gguf.embed(TEXTS)
    n_tokens = sum(len(local_gguf.tokenizer.encode(t, add_special_tokens=False).ids) for t in TEXTS[:3])
    for fmt in ("float", "base64", None):  # None: the SDK's default (it asks for base64)
        kw = {} if fmt is None else {"encoding_format": fmt}
        r = client.embeddings.create(model="base", input=TEXTS, **kw)
        got = np.array([np.frombuffer(base64.b64decode(d.embedding), "<f4") if fmt == "base64"
                        else d.embedding for d in r.data], np.float32)  # asked for: left encoded
        assert [d.index for d in r.data] == list(range(len(TEXTS)))
        assert np.abs(got - want).max() < GGUF_BATCH_TOL
    one = client.embeddings.create(model="base", input=TEXTS[0], encoding_format="float")
    assert len(one.data) == 1 and len(one.data[0].embedding) == 64
    r = client.embeddings.create(model="base", input=TEXTS[:3], dimensions=64)
    assert r.usage.prompt_tokens == r.usage.total_tokens == n_tokens
    ids = local_gguf.tokenizer.encode(TEXTS[1], add_special_tokens=False).ids
    for inp in (ids, [ids, ids]):
        r = client.embeddings.create(model="base", input=inp, encoding_format="float")
        assert np.abs(np.array(r.data[0].embedding) - want[1]).max() < GGUF_BATCH_TOL
    raw = client.embeddings.with_raw_response.create(model="base", input="x", encoding_format="base64")
    vec = np.frombuffer(base64.b64decode(raw.http_response.json()["data"][0]["embedding"]), "<f4")
    assert vec.shape == (64,) and abs(np.linalg.norm(vec) - 1) < 1e-5


def test_langchain_openai_embeddings(served, local_gguf):
    lc = pytest.importorskip("langchain_openai")
    # check_embedding_ctx_length=False: LangChain's setting for a server that is not OpenAI (on
    # its default it sends tiktoken's token ids, which are another tokenizer's)
    emb = lc.OpenAIEmbeddings(model="base", base_url=served + "/v1", api_key="none",
                              check_embedding_ctx_length=False, max_retries=0)
    docs = emb.embed_documents(TEXTS)
    q = emb.embed_query(TEXTS[2])
    want = local_gguf.embed(TEXTS)
    assert np.abs(np.array(docs, np.float32) - want).max() < GGUF_BATCH_TOL
    assert np.abs(np.array(q, np.float32) - want[2]).max() < GGUF_BATCH_TOL


@pytest.mark.parametrize("body,status,param", [
    ({"model": "base", "input": []}, 400, "input"),
    ({"model": "base", "input": ""}, 400, "input"),
    ({"model": "base", "input": [[]]}, 400, "input"),
    ({"model": "base", "input": [1.5]}, 400, "input"),
    ({"model": "base", "input": [["a"]]}, 400, "input"),
    ({"model": "base", "input": [[1, [2]]]}, 400, "input"),
    ({"model": "base", "input": [[100000]]}, 400, "input"),
    ({"model": "base", "input": {"text": "x"}}, 400, "input"),
    ({"model": "base", "input": "word " * 2000}, 400, "input"),
    ({"model": "base", "input": ["x"] * 2049}, 400, "input"),
    ({"model": "base"}, 400, "input"),
    ({"model": "base", "input": "x", "dimensions": 32}, 400, "dimensions"),
    ({"model": "base", "input": "x", "encoding_format": "int8"}, 400, "encoding_format"),
    ({"model": "base", "input": "x", "pooling": "cls"}, 400, "pooling"),
    ({"model": "base", "input": "x", "bogus": 1}, 400, "bogus"),
    ({"model": "extract", "input": "x"}, 400, "model"),
    ({"model": "nope", "input": "x"}, 404, "model"),
    ({"input": "x"}, 400, "model"),
])
def test_bad_requests_are_4xx_naming_the_field(served, body, status, param):
    import httpx

    r = httpx.post(served + "/v1/embeddings", json=body, timeout=60)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["message"] and "\n" not in err["message"], err


# -- embeddings under the same limits as chats (issue 50) ---------------------------------------
BIG = [[(7 * i + j) % 390 + 3 for j in range(400)] for i in range(150)]  # 150 texts of 400 ids: 60,000 tokens


@pytest.mark.parametrize("backend", ["onnx", "gguf"])
def test_a_small_call_is_not_stuck_behind_a_big_one_and_a_cancel_drops_it(bundle_fp32, backend):
    """A call of 150 long texts, then a one-text call: the small one is answered while the big
    one still runs (texts are taken from the calls in turn), with the vector it gets alone; the
    big one cancelled then leaves nothing waiting, and the embedder answers the next call."""
    with Runtime.open(bundle_fp32, backend=backend) as rt:
        alone = rt.embed(TEXTS[:1])
        big = rt.embeddings.submit(BIG, "mean")
        small = rt.embed(TEXTS[:1])
        assert not big.future.done(), "the small call waited for the whole big one"
        assert np.abs(small - alone).max() < GGUF_BATCH_TOL
        rt.embeddings.cancel(big)
        info = rt.embeddings.info()
        assert info["waiting_texts"] == 0 and info["waiting_tokens"] == 0 and info["cancelled"] == 1
        assert big.future.cancelled()
        assert np.abs(rt.embed(TEXTS[:1]) - alone).max() < GGUF_BATCH_TOL


def test_the_queue_and_a_call_are_bounded(bundle_fp32):
    """A call over REQUEST_TOKENS is refused naming `input`; a flood of calls fills the queue
    to QUEUE_TOKENS, then each further call is RuntimeBusy (the server's 429), counted; what
    waits never exceeds the bound; cancelling them empties the queue."""
    from prefix_edge.errors import RuntimeBusy
    from prefix_edge.runtime.embedding import QUEUE_TOKENS, REQUEST_TOKENS

    with Runtime.open(bundle_fp32, backend="gguf") as rt:
        with pytest.raises(OptionError, match=f"at most {REQUEST_TOKENS}") as e:
            rt.embeddings.submit(BIG * 2, "mean")
        assert e.value.field == "input"
        jobs, busy = [], 0
        for _ in range(20):  # 20 x 60,000 tokens: 4.6x the queue's bound
            try:
                jobs.append(rt.embeddings.submit(BIG, "mean"))
            except RuntimeBusy as err:
                busy += 1
                assert "embeddings queue is full" in str(err)
            assert rt.embeddings.info()["waiting_tokens"] <= QUEUE_TOKENS
        assert busy >= 10 and rt.embeddings.info()["refused"] == busy
        for j in jobs:
            rt.embeddings.cancel(j)
        assert rt.embeddings.info()["waiting_tokens"] == 0


def test_a_client_that_hangs_up_stops_its_embeddings(served):
    """The trial: a call of 100 texts of 1,000 ids whose client closed after 3 s kept a core busy
    for minutes. Now its texts not yet run are dropped: /health shows nothing waiting soon after,
    /metrics counts the cancel and a disconnect (499), and the next call is answered."""
    import time

    import httpx

    def get(path):
        return httpx.get(served + path, timeout=30)
    before = get("/metrics").text

    def hang_up(_):  # four such clients at once: 240,000 tokens, far more than 0.5 s of work
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(served + "/v1/embeddings", json={"model": "base", "input": BIG, "pooling": "mean"},
                       timeout=0.5)
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(hang_up, range(4)))
    for _ in range(300):  # the batch running when it hung up ends; nothing after it runs
        emb = get("/health").json()["embeddings"]
        if emb["waiting_texts"] == 0 and emb["running_texts"] == 0:
            break
        time.sleep(0.1)
    assert emb == {"running_texts": 0, "waiting_texts": 0, "waiting_tokens": 0}, emb
    text = get("/metrics").text

    def value(t, name):
        return float(next((ln.rsplit(" ", 1)[1] for ln in t.splitlines() if ln.startswith(name + " ")), 0))
    assert value(text, "prefix_edge_embeddings_cancelled_total") == value(before, "prefix_edge_embeddings_cancelled_total") + 4
    assert value(text, "prefix_edge_client_disconnects_total") == value(before, "prefix_edge_client_disconnects_total") + 4
    assert value(text, 'prefix_edge_requests_total{model="base",status="499"}') >= 4
    r = httpx.post(served + "/v1/embeddings", json={"model": "base", "input": "hello"}, timeout=60)
    assert r.status_code == 200


def test_a_call_over_the_budget_is_a_400_naming_input(served):
    """The trial's 100 texts of 1,000 ids (here 250 of 400: the tiny model's context is 512):
    refused at once (no core kept busy for minutes)."""
    import httpx

    r = httpx.post(served + "/v1/embeddings", json={"model": "base", "input": BIG + BIG[:100]}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "input", r.text


def test_a_flood_of_embeddings_is_429_not_an_unbounded_queue(served):
    """The trial: 70 calls of 100,000 tokens were all accepted (no 429, invisible in /health).
    Eight clients at once each send 60,000 tokens: the queue takes what fits its 262,144-token
    bound and answers the rest 429 with Retry-After (OpenAI's rate_limit_error); the clients
    then hang up, and nothing is left waiting."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    def send(_):
        try:
            r = httpx.post(served + "/v1/embeddings", json={"model": "base", "input": BIG, "pooling": "last"},
                           timeout=3)
            return r.status_code, r.headers.get("retry-after"), r.json()["error"]["type"] if r.status_code != 200 else None
        except httpx.ReadTimeout:
            return "hung up", None, None

    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(send, range(8)))
    busy = [g for g in got if g[0] == 429]
    assert busy and all(g[1] == "1" and g[2] == "rate_limit_error" for g in busy), got
    assert all(g[0] in (429, 200, "hung up") for g in got), got
    for _ in range(300):
        emb = httpx.get(served + "/health", timeout=30).json()["embeddings"]
        if emb["waiting_texts"] == 0 and emb["running_texts"] == 0:
            break
        time.sleep(0.1)
    assert emb["waiting_tokens"] == 0, emb


def test_an_alias_serves_clients_with_fixed_model_names(bundle_fp32, local_gguf, tmp_path):
    """`serve --alias text-embedding-3-small=base --alias helper=support`: a client that can only
    send a fixed name (the `llm` CLI's `llm embed -m 3-small` sends text-embedding-3-small)
    gets the base model's vectors, under the name it sent; a chat to `helper` is `support`'s;
    /v1/models lists each alias with what it names; any other unknown name is still a 404. A
    bad alias is one line and exit 1."""
    import json
    import os
    import shutil
    import subprocess
    import sys

    import httpx

    proc, base = start_server(bundle_fp32, "--backend", "gguf", "--alias", "text-embedding-3-small=base",
                              "--alias", "helper=support")
    try:
        want = local_gguf.embed(TEXTS[:2])
        r = httpx.post(base + "/v1/embeddings", json={"model": "text-embedding-3-small", "input": TEXTS[:2]},
                       timeout=60).json()
        assert r["model"] == "text-embedding-3-small"
        assert np.abs(np.array([d["embedding"] for d in r["data"]], np.float32) - want).max() < GGUF_BATCH_TOL
        llm = shutil.which("llm") or (shutil.which("llm", path=os.path.dirname(sys.executable)))
        if llm:  # the real client, its own model name, pointed at this server
            env = {**os.environ, "OPENAI_BASE_URL": base + "/v1", "OPENAI_API_KEY": "none",
                   "LLM_USER_PATH": str(tmp_path / "llm")}
            out = subprocess.run([llm, "embed", "-m", "3-small", "-c", TEXTS[0]], capture_output=True,
                                 text=True, env=env, timeout=120)
            assert out.returncode == 0, out.stderr
            assert np.abs(np.array(json.loads(out.stdout), np.float32) - want[0]).max() < GGUF_BATCH_TOL
        chat = {"max_tokens": 6, "messages": [{"role": "user", "content": "my sync stopped"}]}
        a = httpx.post(base + "/v1/chat/completions", json={"model": "helper", **chat}, timeout=60).json()
        b = httpx.post(base + "/v1/chat/completions", json={"model": "support", **chat}, timeout=60).json()
        assert a["model"] == "helper" and a["choices"][0]["message"] == b["choices"][0]["message"]
        cards = {c["id"]: c for c in httpx.get(base + "/v1/models", timeout=30).json()["data"]}
        assert cards["helper"]["alias_of"] == "support" and cards["text-embedding-3-small"]["alias_of"] == "base"
        assert httpx.post(base + "/v1/embeddings", json={"model": "text-embedding-3-large", "input": "x"},
                          timeout=30).status_code == 404
    finally:
        stop_server(proc)
    for bad, needle in ((["--alias", "support=base"], "already a model"), (["--alias", "x=nope"], "not a task"),
                        (["--alias", "novalue"], "expected NAME=TARGET")):
        r = subprocess.run([sys.executable, "-m", "prefix_edge", "serve", "--bundle", str(bundle_fp32),
                            "--backend", "gguf", "--port", str(free_port()), *bad], capture_output=True, text=True,
                           timeout=300)
        assert r.returncode != 0 and needle in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
