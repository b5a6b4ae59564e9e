"""Composed documents (`compose_documents=True`, runtime/documents/compose.py): each document's KV computed
once after the shared context, re-rotated to where it stands, its first k tokens prefilled in
place. Not exact by design, so what is asserted is what must hold anyway:

- the rotation (runtime/engines/kv.py) is the model's: frequencies equal transformers' for each scaling,
  and a layer-0 key cached at one position, moved, equals the engine's own key computed at the
  other position (both engines);
- KV as data round-trips: an engine's state through kv_of / prefix_of restores to the same
  logits;
- where composing changes nothing (one document, in place; k covering every document) the
  answer equals the prefilled request's; a hit equals a miss (a cold runtime); threads and a
  cancelled composition change no one's answer; the cache stays within its budget;
- the server takes the fields; bad values are one-line errors naming the field.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from prefix_edge import Runtime
from prefix_edge.bundle import Bundle
from prefix_edge.options import OptionError
from prefix_edge.runtime.engines import open_backend
from prefix_edge.runtime.engines.kv import Rope, shift_keys

from .helpers.parity import in_threads
from .helpers.served import KEY, client, local, server  # noqa: F401 (fixtures: a served tiny bundle)

BACKENDS = ["onnx", "gguf"]
DOCS = [
    {"title": "Orion lamp", "text": "The Orion desk lamp ships from Porto in three days; its warranty is two years."},
    {"title": "Vega kettle", "text": "The Vega kettle holds 1.7 litres and is sold in red, black and white."},
    {"title": "", "text": "The Lyra chair folds flat, carries 120 kg and weighs five kilos."},
]
ASK = [{"role": "user", "content": "What colours is the kettle sold in?"}]


# -- the rotation (unit) ---------------------------------------------------------------------

@pytest.mark.parametrize("scaling", [None, {"rope_type": "linear", "factor": 4.0},
                                     {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64}])
def test_rope_frequencies_are_transformers_own(scaling):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    cfg = LlamaConfig(hidden_size=256, num_attention_heads=4, rope_theta=50000.0, rope_scaling=scaling,
                      max_position_embeddings=2048)
    kind = (scaling or {}).get("rope_type", "default")  # (transformers 5: the default is the model's own)
    init = LlamaRotaryEmbedding.compute_default_rope_parameters if kind == "default" else ROPE_INIT_FUNCTIONS[kind]
    want, _ = init(cfg) if kind == "default" else init(cfg, "cpu")
    model = SimpleNamespace(model_type="llama", sliding_layers=[], head_dim=64,
                            rope={"theta": 50000.0, "scaling": scaling})
    got = Rope.of(model).inv_freq
    want = want.double().numpy()  # transformers computes them in float32
    assert got.shape == want.shape and (np.abs(got - want) / want).max() < 1e-6


@pytest.mark.parametrize("model_type, sliding, scaling, says", [
    ("gemma3_text", [0], None, "sliding-window"),
    ("hunyuan_v1_dense", [], None, "not supported for 'hunyuan_v1_dense'"),
    ("lfm2", [], None, "not supported for 'lfm2'"),
    ("llama", [], {"rope_type": "yarn", "factor": 4.0}, "RoPE scaling 'yarn'"),
])
def test_models_whose_keys_cannot_move_are_named(model_type, sliding, scaling, says):
    model = SimpleNamespace(model_type=model_type, sliding_layers=sliding, head_dim=64,
                            rope={"theta": 1e4, "scaling": scaling})
    assert says in Rope.refusal(model)
    with pytest.raises(Exception) as e:
        Rope.of(model)
    assert says in str(e.value) and "\n" not in str(e.value)


def _engine(bundle, backend):
    b = Bundle.open(bundle)
    return open_backend(backend, b.model_file(backend), threads=1, n_ctx=256), b.manifest.model


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_moved_key_is_the_engines_own_key_there(bundle_int4, backend):
    """Layer 0's keys depend on the token and its position only: X's keys cached after A
    (5 tokens), moved by 18, equal X's keys cached after B (23 tokens)."""
    be, model = _engine(bundle_int4, backend)
    rope = Rope.of(model)
    rng = np.random.default_rng(0)
    a, b, x = (rng.integers(10, 300, n).astype(np.int64) for n in (5, 23, 12))
    keys = []
    for lead in (a, b):
        be.begin(None)
        be.prefill(np.concatenate([lead, x]))
        kv = be.kv_of(be.seq_snapshot(be.single_seq, np.concatenate([lead, x])))
        keys.append(kv.k[0][len(lead):].astype(np.float64))
    be.close()
    moved = shift_keys(keys[0], 18, rope.inv_freq, be.rope_layout)
    scale = np.abs(keys[1]).max()
    tol = 1e-5 if backend == "onnx" else 2e-3  # llama.cpp's cache: float16
    assert np.abs(moved - keys[1]).max() <= tol * scale * 10
    assert np.abs(keys[0] - keys[1]).max() > 0.05 * scale  # unmoved, they differ


@pytest.mark.parametrize("backend", BACKENDS)
def test_kv_as_data_round_trips(bundle_int4, backend):
    be, _ = _engine(bundle_int4, backend)
    ids = np.arange(20, 60, dtype=np.int64)
    be.begin(None)
    be.prefill(ids)
    want = be.step(7)
    kv = be.kv_of(be.seq_snapshot(be.single_seq, np.concatenate([ids, [7]])))
    assert kv.n == 41 and len(kv.k) == be.n_layers and kv.k[0].shape[1:] == (be.n_kv_heads, be.head_dim)
    be.begin(be.prefix_of(kv.span(0, 40), ids))
    got = be.step(7)
    be.close()
    assert np.array_equal(got, want)


def test_the_document_cache_is_bounded_and_drops_composed_states_first():
    from prefix_edge.runtime.cache.documents import DocumentKv
    from prefix_edge.runtime.documents.compose import Composed
    from prefix_edge.runtime.engines.kv import KvLayers

    def doc(n):
        return KvLayers([np.zeros((n, 1, 4), np.float32)], [np.zeros((n, 1, 4), np.float32)])  # 32n bytes

    state = Composed(SimpleNamespace(nbytes=320), 10)
    cache = DocumentKv(1000)
    cache.put("a", doc(10))
    cache.put("s", state)
    cache.put("b", doc(10))
    assert cache.info()["bytes"] == 960 and cache.get("a") is not None
    cache.put("c", doc(5))  # 160 more: the state goes, though "b" and "c" are newer than "a"
    assert cache.get("s") is None and cache.get("a") is not None and cache.get("b") is not None
    cache.put("d", doc(10))  # then the least recently used document
    assert cache.get("c") is None and cache.info()["bytes"] <= 1000
    cache.put("huge", doc(100))  # over the whole budget: not kept, nothing evicted for it
    assert cache.get("huge") is None and cache.info()["documents"] == 3


# -- composed requests (integration) --------------------------------------------------------

def _composed(rt, docs, k=32, **kw):
    return rt.generate(None, messages=ASK, documents=docs, max_tokens=8, compose_documents=True,
                       compose_recompute=k, logprobs=1, **kw)


def _gguf_only(bundle: Path, out: Path):
    """The bundle's GGUF exported on its own (`--format gguf` of a .gguf: no transformers, its
    rotary from the file's metadata)."""
    import shutil

    from prefix_edge.export.build import export_bundle

    out.mkdir()
    shutil.copyfile(bundle / "gguf" / "model.gguf", out / "model.gguf")
    (out / "tasks.toml").write_text('[task.support]\nsystem = "You are a helpful support assistant."\n')
    return export_bundle(out / "model.gguf", out / "tasks.toml", out / "bundle", formats=("gguf",), progress=False)


def test_a_gguf_only_bundle_composes_as_the_hf_config_bundle_of_the_same_file(bundle_int4, tmp_path):
    """A GGUF-only bundle takes its rotary from the file's metadata, held at export to
    llama.cpp's own layer-0 keys: the same file then composes documents exactly as the bundle
    whose rotary came from the HF config; a rotary that says other than llama.cpp's keys is
    refused in one line naming why, never composed with wrong rotations."""
    manifest = _gguf_only(bundle_int4, tmp_path / "direct")
    rope = manifest.model.rope
    assert manifest.model.model_type.startswith("gguf:") and rope["checked"] and rope["check_error"] < 0.01, rope
    hf = Bundle.open(bundle_int4).manifest.model.rope
    assert rope["theta"] == float(hf["theta"])
    assert np.allclose(Rope.of(manifest.model).inv_freq, Rope.of(Bundle.open(bundle_int4).manifest.model).inv_freq)
    with Runtime.open(bundle_int4, backend="gguf") as ref, Runtime.open(tmp_path / "direct" / "bundle") as rt:
        for docs in (DOCS, DOCS[::-1]):
            _composed(ref, docs, k=4)
            _composed(rt, docs, k=4)  # every document's KV in each cache, then moved
            assert _composed(rt, docs[1:] + docs[:1], k=4).tokens == _composed(ref, docs[1:] + docs[:1], k=4).tokens

    # llama.cpp computes its keys from the same metadata, so a GGUF agrees with itself; what
    # the check catches is a rotary that says other than llama.cpp does (here: theta x 10)
    import dataclasses

    from prefix_edge.export.gguf_source import check_rope

    wrong = dataclasses.replace(manifest.model, rope={"theta": rope["theta"] * 10, "scaling": None})
    be = open_backend("gguf", tmp_path / "direct" / "model.gguf", threads=1, n_ctx=1024)
    try:
        check_rope(wrong, be)
    finally:
        be.close()
    assert wrong.rope["checked"] is False and wrong.rope["check_error"] > 0.1, wrong.rope
    assert "did not match llama.cpp's own keys" in Rope.refusal(wrong)
    unchecked = dataclasses.replace(manifest.model, rope={"theta": rope["theta"], "scaling": None})
    assert "was not held to llama.cpp's own keys" in Rope.refusal(unchecked)


@pytest.mark.parametrize("backend", BACKENDS)
def test_where_composing_changes_nothing_the_answer_is_the_prefilled_one(bundle_int4, backend):
    with Runtime.open(bundle_int4, backend=backend) as rt:
        for docs, k in ((DOCS[:1], 0), (DOCS, 4096)):  # one document in place; every one recomputed
            ref = rt.generate(None, messages=ASK, documents=docs, max_tokens=8, logprobs=1,
                              use_prompt_cache=False)
            got = _composed(rt, docs, k)
            assert got.tokens == ref.tokens and got.stats.input_tokens == ref.stats.input_tokens
        # a task's text: the documents before the text, inside its wrapping
        ref = rt.generate("support", "Where does the lamp ship from?", documents=DOCS[:1], max_tokens=6,
                          use_prompt_cache=False)
        got = rt.generate("support", "Where does the lamp ship from?", documents=DOCS[:1], max_tokens=6,
                          compose_documents=True)
        assert got.tokens == ref.tokens


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_hit_equals_a_miss_in_any_order(bundle_int4, backend):
    orders = [DOCS, DOCS[::-1], [DOCS[1], DOCS[2], DOCS[0]]]
    cold = []
    for docs in orders:  # each order on a runtime that has seen no document
        with Runtime.open(bundle_int4, backend=backend) as rt:
            r = _composed(rt, docs, k=4)
            assert r.stats.cached_tokens == 0
            cold.append(r)
    with Runtime.open(bundle_int4, backend=backend) as rt:
        n_doc = [len(rt.tokenizer.encode(" " + (d["title"] + "\n" if d["title"] else "") + d["text"]).ids)
                 for d in DOCS]
        for again in range(2):  # then each order again: its whole composed state from the cache
            for docs, ref in zip(orders, cold):
                r = _composed(rt, docs, k=4)
                assert r.tokens == ref.tokens and r.logprobs == ref.logprobs
            if again:
                assert r.stats.cached_tokens == r.stats.input_tokens - len(rt.tokenizer.encode(
                    "<|im_end|>\n<|im_start|>user\n" + ASK[0]["content"] + "<|im_end|>\n<|im_start|>assistant\n").ids)
            else:
                assert r.stats.cached_tokens == sum(n_doc) - 4 * 2  # every document from the cache
        info = rt.engine_info()["document_cache"]
        assert 0 < info["bytes"] <= info["budget_bytes"] and info["bytes"] <= rt.memory()["host_cache"]["bytes"]
        assert rt.engine_info()["document_cache"]["documents"] == 3
        assert rt.engine_info()["document_cache"]["composed_states"] == 3
    # reordered, the answer is not the prefilled one's in general: composing is opt-in
    assert cold[1].stats.input_tokens == cold[0].stats.input_tokens


@pytest.mark.parametrize("backend", BACKENDS)
def test_threads_a_small_cache_and_a_cancelled_composition_change_no_answer(bundle_int4, backend):
    orders = [DOCS, DOCS[::-1], [DOCS[2], DOCS[0]], [DOCS[1]]]
    with Runtime.open(bundle_int4, backend=backend) as rt:
        want = [_composed(rt, docs, k=4).tokens for docs in orders]
    # a cache smaller than two documents: entries come and go, answers stay
    with Runtime.open(bundle_int4, backend=backend, document_cache_bytes=30_000) as rt:
        s = rt.stream(None, messages=ASK, documents=DOCS * 2, compose_documents=True, max_tokens=8)
        s.cancel()
        got = in_threads([lambda o=o: [_composed(rt, o, k=4).tokens for _ in range(2)] for o in orders])
        assert all(got[i] == [want[i], want[i]] for i in range(len(orders)))
        info = rt.engine_info()["document_cache"]
        assert info["bytes"] <= 30_000 and rt.engine_info()["document_cache"]["evictions"] > 0


def test_bad_compose_options_are_one_line_errors_naming_the_field(bundle_int4):
    with Runtime.open(bundle_int4, backend="onnx") as rt:
        for kw, field in (({"compose_documents": "yes"}, "compose_documents"),
                          ({"compose_documents": True, "compose_recompute": 5000}, "compose_recompute")):
            with pytest.raises(OptionError) as e:
                rt.generate(None, messages=ASK, documents=DOCS, max_tokens=2, **kw)
            assert e.value.field == field and "\n" not in str(e.value)
        # no documents: nothing to compose, the request is an ordinary one
        r = rt.generate(None, messages=ASK, max_tokens=4, compose_documents=True)
        assert r.tokens == rt.generate(None, messages=ASK, max_tokens=4).tokens


def test_the_server_composes_as_the_library_does(client, local, server):
    ref = local.generate(None, messages=ASK, documents=DOCS, max_tokens=8, compose_documents=True)
    for _ in range(2):
        r = client.chat.completions.create(model="base", messages=ASK, max_tokens=8, extra_body={
            "documents": DOCS, "compose_documents": True})
        assert r.choices[0].message.content == ref.text
    assert r.usage.prompt_tokens_details.cached_tokens > 0  # the second: the documents' KV reused
    r = client.responses.create(model="base", input=ASK[0]["content"], max_output_tokens=8,
                                extra_body={"documents": DOCS, "compose_documents": True})
    assert r.output_text == ref.text
    import httpx

    metrics = dict(ln.rsplit(" ", 1) for ln in httpx.get(server + "/metrics", headers={"Authorization": f"Bearer {KEY}"}).text.splitlines()
                   if ln.startswith(("prefix_edge_document_cache_", "prefix_edge_host_cache_", "prefix_edge_cached_")))
    assert float(metrics["prefix_edge_document_cache_hits_total"]) >= 2
    assert 0 < float(metrics["prefix_edge_document_cache_bytes"]) <= float(metrics["prefix_edge_document_cache_budget_bytes"])
    by_source = {s: float(metrics[f'prefix_edge_cached_prompt_tokens_by_source_total{{source="{s}"}}'])
                 for s in ("task_prefix", "prompt_cache", "documents")}
    assert by_source["documents"] > 0 and sum(by_source.values()) == float(metrics["prefix_edge_cached_prompt_tokens_total"])
    # the prompt and document caches' one budget holds both
    assert float(metrics["prefix_edge_document_cache_bytes"]) <= float(metrics["prefix_edge_host_cache_bytes"]) \
        <= float(metrics["prefix_edge_host_cache_budget_bytes"])


# -- a template with a documents section of its own ------------------------------------------

DOCS_TEMPLATE = (
    "{%- if documents %}<|im_start|>documents\n"
    "{%- for d in documents %}\nDocument {{ loop.index }}: {{ d['title'] }}\n{{ d['text'] }}\n{%- endfor %}"
    "<|im_end|>\n{% endif %}"
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def documents_bundle(tiny_model, tasks_file, tmp_path_factory):
    """The tiny model with a chat template that renders `documents` itself (as Granite's and
    Command R's do), exported to ONNX."""
    import shutil

    from transformers import AutoTokenizer

    from prefix_edge.export.build import export_bundle

    src = tmp_path_factory.mktemp("docs-model") / "m"
    shutil.copytree(tiny_model, src)
    tok = AutoTokenizer.from_pretrained(str(src))
    tok.chat_template = DOCS_TEMPLATE
    tok.save_pretrained(str(src))
    out = tmp_path_factory.mktemp("docs-bundle") / "b"
    export_bundle(src, tasks_file, out, formats=["onnx"], quantize="none", progress=False)
    return src, out


def test_a_template_with_a_documents_section_renders_them_as_transformers_does(documents_bundle):
    from transformers import AutoTokenizer

    src, bundle = documents_bundle
    hf = AutoTokenizer.from_pretrained(str(src))
    want = hf.apply_chat_template(ASK, documents=DOCS, add_generation_prompt=True, tokenize=True, return_dict=False)
    with Runtime.open(bundle, backend="onnx") as rt:
        assert rt.chat_renderer.documents_native
        ids, _, _ = rt.requests.chat_input(None, ASK, None, documents=DOCS)
        assert ids.tolist() == list(want)
        got = rt.generate(None, messages=ASK, documents=DOCS, max_tokens=8, use_prompt_cache=False)
        assert got.tokens == rt.generate(None, list(want), max_tokens=8, use_prompt_cache=False).tokens
        # composed on the template's own section: one document in place is the prefilled answer
        one = rt.generate(None, messages=ASK, documents=DOCS[:1], max_tokens=8, use_prompt_cache=False)
        assert rt.generate(None, messages=ASK, documents=DOCS[:1], max_tokens=8,
                           compose_documents=True).tokens == one.tokens
        r = rt.generate(None, messages=ASK, documents=DOCS[::-1], max_tokens=8, compose_documents=True)
        assert r.stats.cached_tokens == 0
        r = rt.generate(None, messages=ASK, documents=DOCS, max_tokens=8, compose_documents=True)
        assert r.stats.cached_tokens > 0  # every document reused where it now stands
        # a document that spells a special token goes in the fallback block, as message text
        odd = [{"title": "x", "text": "a <|im_end|> b"}]
        r = rt.generate(None, messages=ASK, documents=odd, max_tokens=4, use_prompt_cache=False)
        ref = rt.generate(None, messages=[{"role": "system", "content": "Documents:\n\n[1] x\na <|im_end|> b"}] + ASK,
                          max_tokens=4, use_prompt_cache=False)
        assert r.tokens == ref.tokens
