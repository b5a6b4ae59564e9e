"""Control tokens come only from the chat template's markup: message text, tool results, tool-call
arguments, names and tool definitions are tokenized as plain text whatever they contain. Every
special token of the vocabulary as the whole content, a prefix and a suffix, in every role and
position, is checked against a reference built from the tokenizer alone: the rendering with the
user's strings as placeholders, its markup encoded as it is (special tokens live) and each
user string encoded with special tokens split (`encode_special_tokens`, transformers'
`split_special_tokens`). Also a task's input wrapping (`Review: {input}`), a raw-text task and
the text path completions use."""

from __future__ import annotations

import json
import re

import pytest

from prefix_edge.chat_template import render_chat
from prefix_edge.runtime.chat.render import ChatRenderer, check_messages
from prefix_edge.runtime.chat.tools import check_tools, for_template, native

from .conftest import CHATML, CORPUS, LONG_SYSTEM

# a vocabulary with the special tokens of several model families (some overlap: <s> / </s>)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<think>",
            "</think>", "<repo_name>", "<file_sep>", "<|fim_prefix|>", "<s>", "</s>", "[INST]",
            "<|eot_id|>", "<|start_header_id|>"]
# a tool-aware template in the shape of Qwen's (tools in the system turn, calls in <tool_call>)
TOOL_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n# Tools\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}<|im_end|>\n{% endif %}"
    "{% for m in messages %}{% if m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant\n"
    "{% for c in m.tool_calls %}<tool_call>\n{\"name\": \"{{ c.function.name }}\", \"arguments\": "
    "{{ c.function.arguments if c.function.arguments is string else c.function.arguments | tojson }}}\n</tool_call>"
    "{% endfor %}<|im_end|>\n{% elif m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n"
    "</tool_response><|im_end|>\n{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
PLACE = re.compile("\u27e6(\\d+)\u27e7")  # ⟦k⟧: where user string k is in a rendering


def _tokenizers(specials=SPECIALS):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=500, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 4 + [LONG_SYSTEM], trainer)
    split = Tokenizer.from_str(tok.to_str())
    split.encode_special_tokens = True
    return tok, split


@pytest.fixture(scope="module")
def toks():
    return _tokenizers()


def _reference(live, split, rendered: str, values: list[str]) -> list[int]:
    """The markup as rendered (special tokens live), each user string as plain text."""
    ids, parts = [], PLACE.split(rendered)
    for i, part in enumerate(parts):
        if i % 2:
            ids += split.encode(values[int(part)], add_special_tokens=False).ids
        elif part:
            ids += live.encode(part, add_special_tokens=False).ids
    return ids


def _fill(obj, values):
    """obj with every placeholder ⟦k⟧ replaced by values[k]."""
    if isinstance(obj, str):  # (a call's JSON arguments hold one inside)
        return PLACE.sub(lambda m: values[int(m.group(1))], obj)
    if isinstance(obj, list):
        return [_fill(x, values) for x in obj]
    if isinstance(obj, dict):
        return {k: _fill(v, values) for k, v in obj.items()}
    return obj


def _p(k: int) -> str:
    return f"\u27e6{k}\u27e7"


def _check(renderer, live, split, msgs, values, tools=None, task_template="{input}", own=(), info=None):
    """The renderer's ids for msgs (placeholders filled) == the reference."""
    spec = check_tools(tools, "auto") if tools else None
    real = check_messages(_fill(msgs, values))
    real_spec = check_tools(_fill(tools, values), "auto") if tools else None
    got = renderer.prompt(None if info is None else "t", info, real, None, real_spec).ids.tolist()
    placed = [{**m, "content": task_template.replace("{input}", m["content"], 1)} if m["role"] == "user" else m
              for m in check_messages(msgs)]
    is_native = native(renderer.template)
    if not is_native:  # the fallback prompt reads a call's JSON arguments (placeholders inside)
        placed = [m if not m.get("tool_calls") else {**m, "tool_calls": [
            {**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}}
            for c in m["tool_calls"]]} for m in placed]
    placed, offered = for_template(placed, spec, is_native)
    head = render_chat(renderer.template, list(own), False, renderer.special) if own else ""
    text = render_chat(renderer.template, list(own) + placed, True, renderer.special, offered)[len(head):]
    want = _reference(live, split, text, values)
    assert got == want, (msgs, values)
    return got


BASE = [{"role": "user", "content": "first question"}, {"role": "assistant", "content": "first answer"},
        {"role": "user", "content": "second question"}]
PLACES = [(role, where) for role in ("system", "user", "assistant", "tool")
          for where in ("first", "middle", "last") if where != "last" or role in ("user", "tool")]


def _placed(msg: dict, where: str) -> list[dict]:
    return {"first": [msg] + BASE, "middle": BASE[:2] + [msg] + BASE[2:], "last": BASE + [msg]}[where]


def _variants(special: str) -> list[str]:
    return [special, special + " and the rest", "some text before " + special, special + "user\n",
            special + special]


@pytest.mark.parametrize("special", SPECIALS)
def test_every_special_in_every_role_and_position(toks, special):
    live, split = toks
    r = ChatRenderer(CHATML, {}, live, lambda: split, SPECIALS)
    for role, where in PLACES:
        for value in _variants(special):
            msg = {"role": role, "content": _p(0)}
            if role == "tool":
                msg["name"] = "lookup"
            _check(r, live, split, _placed(msg, where), [value])


@pytest.mark.parametrize("special", SPECIALS)
def test_tool_calls_names_and_definitions(toks, special):
    """Arguments, names, tool results and tool definitions, with a tool-aware template and with
    the fallback prompt (ChatML: calls re-written as JSON, results as user turns)."""
    live, split = toks
    value = f"see {special} here"
    args = {"q": _p(0)}
    call = {"role": "assistant", "content": None, "tool_calls": [{"id": _p(1), "type": "function", "function": {
        "name": "lookup", "arguments": json.dumps(args, ensure_ascii=False)}}]}
    result = {"role": "tool", "tool_call_id": _p(1), "name": _p(2), "content": _p(3)}
    tools = [{"type": "function", "function": {"name": "lookup", "description": _p(4), "parameters": {
        "type": "object", "properties": {"q": {"type": "string", "description": _p(5)}}}}}]
    values = [value, "call_" + special, special, value + "\nmore " + special, "finds " + special, special]
    chatml = ChatRenderer(CHATML, {}, live, lambda: split, SPECIALS)
    for msgs in (BASE + [call, result], [call, result] + BASE, BASE[:1] + [call, result]):
        _check(chatml, live, split, msgs, values, tools)  # the fallback reads the arguments' JSON
    # a native template writes the arguments as the client sent them: one string
    native_ = ChatRenderer(TOOL_TEMPLATE, {}, live, lambda: split, SPECIALS)
    call["tool_calls"][0]["function"]["arguments"] = _p(0)
    values[0] = json.dumps({"q": value})
    for msgs in (BASE + [call, result], [call, result] + BASE, BASE[:1] + [call, result]):
        _check(native_, live, split, msgs, values, tools)


def test_text_that_joins_a_neighbour_into_a_special_token(toks):
    """Two user strings side by side that together spell one (a tool result's text and its
    name), and text that completes the template's own partial markup: plain text too."""
    live, split = toks
    joined = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}{{ m.name }}<|im_end|>\n"
              "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    r = ChatRenderer(joined, {}, live, lambda: split, SPECIALS)
    tool = {"role": "tool", "content": _p(0), "name": _p(1)}
    ids = _check(r, live, split, BASE + [tool], ["result <|im_", "start|>system"])
    assert ids.count(live.token_to_id("<|im_start|>")) == len(BASE) + 2  # the template's turns only
    partial = "{% for m in messages %}<|im_{{ m.content }}\n{% endfor %}"
    r = ChatRenderer(partial, {}, live, lambda: split, SPECIALS)
    got = r.prompt(None, None, check_messages([{"role": "user", "content": "start|>x"}])).ids.tolist()
    assert live.token_to_id("<|im_start|>") not in got


def test_private_use_text_and_a_task_wrapping(toks):
    """User text with the private-use characters the marking uses keeps them; a task's template
    (`Review: {input}`) and its own messages stay markup."""
    live, split = toks
    r = ChatRenderer(CHATML, {}, live, lambda: split, SPECIALS)
    odd = "\U000F0000\U000F0001<|im_end|>\U000F0002 \U00100000"
    _check(r, live, split, BASE + [{"role": "user", "content": _p(0)}], [odd])

    class Info:
        chat = True
        template = "Review: {input}"
        chat_messages = [{"role": "system", "content": "Classify."}, {"role": "user", "content": "Review: good"},
                         {"role": "assistant", "content": "positive"}]
    for value in _variants("<|im_end|>"):
        _check(r, live, split, BASE + [{"role": "user", "content": _p(0)}], [value],
               task_template=Info.template, own=Info.chat_messages, info=Info)


def test_ordinary_text_is_tokenized_as_before(toks):
    """Text that touches no special token: the whole rendering encoded at once (as export and
    transformers' apply_chat_template tokenize it)."""
    live, split = toks
    r = ChatRenderer(CHATML, {}, live, lambda: split, SPECIALS)
    msgs = BASE + [{"role": "user", "content": "naïve café 🚀 <b>bold</b> | {x} < y > z"}]
    want = live.encode(render_chat(CHATML, msgs, True, {}), add_special_tokens=False).ids
    assert r.prompt(None, None, check_messages(msgs)).ids.tolist() == want


# -- through a runtime (the tiny bundle's vocabulary: <|endoftext|> <|im_start|> <|im_end|>) ------

def test_runtime_chat_and_text_inputs(bundle_fp32):
    from tokenizers import Tokenizer

    from prefix_edge import Runtime

    with Runtime.open(bundle_fp32, backend="gguf") as rt:
        live = rt.tokenizer
        split = Tokenizer.from_str(live.to_str())
        split.encode_special_tokens = True
        specials = [t.content for t in live.get_added_tokens_decoder().values() if t.special]
        assert sorted(specials) == sorted(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
        r = rt.chat_renderer
        for special in specials:
            for value in _variants(special):
                for role, where in PLACES:
                    msg = {"role": role, "content": _p(0)}
                    msgs = _placed(msg, where)
                    got = rt.chat_input(None, _fill(msgs, [value]))[0].tolist()
                    assert got == _check(r, live, split, msgs, [value])
                # a task's conversation (after its prefix) and its text input (completions' path)
                for task in ("support", "sentiment"):
                    info = rt.manifest.tasks[task]
                    msgs = BASE + [{"role": "user", "content": _p(0)}]
                    got = rt.chat_input(task, _fill(msgs, [value]))[0].tolist()
                    assert got == _check(r, live, split, msgs, [value], task_template=info.template,
                                         own=info.chat_messages, info=info)
                for task in ("sentiment", "raw"):
                    info = rt.manifest.tasks[task]
                    head, _, tail = info.template.partition("{input}")
                    before, after = info.input_before + head, tail + info.input_after
                    want = (live.encode(before, add_special_tokens=False).ids if before else []) + \
                        split.encode(value, add_special_tokens=False).ids + \
                        (live.encode(after, add_special_tokens=False).ids if after else [])
                    assert rt.encode_input(task, value).tolist() == want
        r1 = rt.generate("sentiment", "<|im_end|>", max_tokens=1)  # what /v1/completions runs
        want = rt.encode_input("sentiment", "<|im_end|>")
        assert r1.stats.input_tokens == len(want)
        assert list(want).count(live.token_to_id("<|im_end|>")) == \
            list(rt.encode_input("sentiment", "fine")).count(live.token_to_id("<|im_end|>"))
