"""Documents given with a call (runtime/documents/block.py): checked (a bad one is refused naming
`documents`), rendered as the documented fallback block, and — with compose_documents off, the
default — prefilled or served from the exact prompt cache: a repeat of the same documents with a
new question equals the same request with the cache off. Composed documents
(compose_documents=true): tests/test_composed.py.

References: the fallback block is spelled out here (not built with the module's own code), and
every cache hit is compared with `use_prompt_cache=False`.
"""

from __future__ import annotations

import pytest

from prefix_edge import Runtime
from prefix_edge.options import OptionError
from prefix_edge.options import resolve
from prefix_edge.runtime.documents.block import MAX_DOCUMENTS, check_documents
from prefix_edge.serve.fields import COMPLETION_FIELDS, RESPONSE_FIELDS, check_fields
from prefix_edge.serve.schema import ApiError

from .helpers.served import client, local, server  # noqa: F401 (fixtures: a served tiny bundle)

BACKENDS = ["onnx", "gguf"]
DOCS = [
    {"title": "Orion lamp", "text": "The Orion desk lamp ships from Porto in three days; its "
                                    "warranty is two years and the shade is aluminium."},
    {"title": "Vega kettle", "text": "The Vega kettle holds 1.7 litres, boils in four minutes and "
                                     "is sold in red, black and white."},
    {"title": "Lyra chair", "text": "The Lyra chair folds flat, carries 120 kg and weighs five "
                                    "kilos; its frame is oak."},
]
QUESTIONS = ["How long is the lamp's warranty?", "What colours is the kettle sold in?",
             "How much does the chair weigh?"]
BLOCK = ("Documents:\n\n[1] Orion lamp\n" + DOCS[0]["text"] + "\n\n[2] Vega kettle\n" + DOCS[1]["text"]
         + "\n\n[3] Lyra chair\n" + DOCS[2]["text"])


# -- checking (unit) ------------------------------------------------------------------------

@pytest.mark.parametrize("bad, says", [
    ("a document", "must be a list"),
    ([{"title": "x"}], "documents[0].text is missing"),
    ([{"text": "ok"}, "plain"], "documents[1] must be an object"),
    ([{"text": "   "}], "documents[0].text is empty"),
    ([{"text": "ok", "url": "u"}], "unknown field 'url'"),
    ([{"text": "ok", "title": 3}], "documents[0].title must be a string"),
    ([{"text": "\ud800"}], "lone surrogate"),
    ([{"text": "x" * (3 << 20)}, {"text": "y" * (2 << 20)}], "over"),
    ([{"text": "x"}] * (MAX_DOCUMENTS + 1), f"at most {MAX_DOCUMENTS}"),
])
def test_bad_documents_are_refused_naming_the_field(bad, says):
    with pytest.raises(OptionError) as e:
        check_documents(bad)
    assert e.value.field == "documents" and says in str(e.value) and "\n" not in str(e.value)


def test_compose_options_are_checked_naming_the_field():
    assert resolve({})["compose_documents"] is False and resolve({})["compose_recompute"] == 32
    for kw in ({"compose_documents": "yes"}, {"compose_documents": 1}, {"compose_recompute": -1},
               {"compose_recompute": True}, {"compose_recompute": 1.5}):
        with pytest.raises(OptionError) as e:
            resolve(kw)
        assert e.value.field == next(iter(kw)) and "\n" not in str(e.value)


@pytest.mark.parametrize("table", [COMPLETION_FIELDS, RESPONSE_FIELDS])
def test_the_api_fields_have_a_shape(table):
    check_fields({"documents": DOCS, "compose_documents": False}, table)
    for body in ({"documents": "x"}, {"documents": [{"text": 1}]}, {"compose_documents": "no"}):
        with pytest.raises(ApiError) as e:
            check_fields(body, table)
        assert e.value.param == next(iter(body))


# -- on a model (integration) ---------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_documents_render_as_the_documented_block_and_repeat_from_the_cache(bundle_int4, backend):
    with Runtime.open(bundle_int4, backend=backend, prefill_chunk=16) as rt:
        # a conversation: the block is a system message in front
        ask = [{"role": "user", "content": QUESTIONS[0]}]
        got = rt.generate(None, messages=ask, documents=DOCS, max_tokens=6, logprobs=1,
                          use_prompt_cache=False)
        ref = rt.generate(None, messages=[{"role": "system", "content": BLOCK}] + ask, max_tokens=6,
                          logprobs=1, use_prompt_cache=False)
        assert got.tokens == ref.tokens and got.logprobs == ref.logprobs
        # an existing system message: the block follows its text
        sys = [{"role": "system", "content": "Answer briefly."}] + ask
        got = rt.generate(None, messages=sys, documents=DOCS, max_tokens=6, use_prompt_cache=False)
        ref = rt.generate(None, messages=[{"role": "system", "content": "Answer briefly.\n\n" + BLOCK}]
                          + ask, max_tokens=6, use_prompt_cache=False)
        assert got.tokens == ref.tokens
        # a task's text: the block before the text, inside the task's wrapping
        got = rt.generate("support", QUESTIONS[0], documents=DOCS, max_tokens=6, use_prompt_cache=False)
        ref = rt.generate("support", BLOCK + "\n\n" + QUESTIONS[0], max_tokens=6, use_prompt_cache=False)
        assert got.tokens == ref.tokens
        # the same documents, new questions: the documents' tokens from the cache, answers equal
        rt.generate(None, messages=ask, documents=DOCS, max_tokens=4)
        for q in QUESTIONS[1:]:
            m = [{"role": "user", "content": q}]
            hit = rt.generate(None, messages=m, documents=DOCS, max_tokens=6, logprobs=1)
            miss = rt.generate(None, messages=m, documents=DOCS, max_tokens=6, logprobs=1,
                               use_prompt_cache=False)
            assert hit.tokens == miss.tokens and hit.logprobs == miss.logprobs
            _, cuts, _ = rt.chat_input(None, [{"role": "system", "content": BLOCK}] + m)
            assert hit.stats.cached_tokens == cuts[0] > 0 == miss.stats.cached_tokens


def test_a_call_refuses_bad_documents_and_compose_naming_the_field(bundle_int4):
    with Runtime.open(bundle_int4, backend="onnx") as rt:
        for kw, field in (({"documents": {"text": "x"}}, "documents"),
                          ({"documents": DOCS, "compose_documents": "yes"}, "compose_documents"),
                          ({"documents": DOCS, "compose_documents": True, "compose_recompute": -2},
                           "compose_recompute")):
            with pytest.raises(OptionError) as e:
                rt.generate("support", QUESTIONS[0], max_tokens=2, **kw)
            assert e.value.field == field and "\n" not in str(e.value)
            with pytest.raises(OptionError):
                list(rt.stream(None, messages=[{"role": "user", "content": "hi"}], **kw))


def test_the_server_takes_documents_as_extension_fields(client, local):
    """chat-completions and Responses bodies with `documents` answer as the library does; a bad
    document or a bad compose_recompute is a 400 naming the field."""
    import openai

    ask = [{"role": "user", "content": QUESTIONS[1]}]
    ref = local.generate(None, messages=ask, documents=DOCS, max_tokens=8)
    r = client.chat.completions.create(model="base", messages=ask, max_tokens=8,
                                       extra_body={"documents": DOCS})
    assert r.choices[0].message.content == ref.text
    r = client.responses.create(model="base", input=QUESTIONS[1], max_output_tokens=8,
                                extra_body={"documents": DOCS})
    assert r.output_text == ref.text
    for extra, param in (({"documents": [{"title": "x"}]}, "documents"),
                         ({"documents": [{"text": "x"}], "compose_documents": True, "compose_recompute": -1},
                          "compose_recompute")):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="base", messages=ask, max_tokens=4, extra_body=extra)
        assert e.value.param == param
        with pytest.raises(openai.BadRequestError) as e:
            client.responses.create(model="base", input=QUESTIONS[1], max_output_tokens=4, extra_body=extra)
        assert e.value.param == param
