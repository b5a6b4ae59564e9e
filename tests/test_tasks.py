"""Task-file parsing and rendering (no model needed)."""

from __future__ import annotations

import pytest

from prefix_edge.errors import PrefixEdgeError
from prefix_edge.tasks import load_tasks, render_task

from .conftest import CHATML


def write(tmp_path, text):
    p = tmp_path / "tasks.toml"
    p.write_text(text, encoding="utf-8")
    return p


def test_parses_all_keys(tmp_path):
    p = write(tmp_path, '''
[task.a]
kind = "text"
system = "sys"
examples = [{user = "u", assistant = "a"}]
template = "Q: {input}"
chat = true
max_tokens = 5
temperature = 1
top_p = 0.9
top_k = 40
seed = 3
stop = ["\\n"]
''')
    (t,) = load_tasks(p)
    assert t.name == "a" and t.system == "sys" and t.examples[0].assistant == "a"
    assert t.defaults == {"max_tokens": 5, "temperature": 1.0, "top_p": 0.9, "top_k": 40, "seed": 3, "stop": ["\n"]}


@pytest.mark.parametrize("body, key, words", [
    ('[task.a]\nsystem = "s"\ncolour = "red"\n', "colour", "unknown key"),
    ('[task.a]\ntemplate = "{input}"\n', "prefix", "missing"),
    ('[task.a]\nsystem = "s"\nmax_tokens = "ten"\n', "max_tokens", "expected int"),
    ('[task.a]\nsystem = "s"\nchat = 1\n', "chat", "expected bool"),
    ('[task.a]\nsystem = "s"\ntemplate = "no placeholder"\n', "template", "{input}"),
    ('[task.a]\nsystem = "s"\nexamples = [{user = "u"}]\n', "examples[0]", "assistant"),
    ('[task.a]\nsystem = "s"\nkind = "lora"\n', "kind", "must be one of"),
    ('[task.a]\nsystem = "s"\nstop = [""]\n', "stop[0]", "non-empty"),
])
def test_errors_name_file_task_and_key(tmp_path, body, key, words):
    p = write(tmp_path, body)
    with pytest.raises(PrefixEdgeError) as e:
        load_tasks(p)
    msg = str(e.value)
    assert str(p) in msg and "task 'a'" in msg and f"key '{key}'" in msg and words in msg
    assert "\n" not in msg


def test_not_toml_and_empty(tmp_path):
    with pytest.raises(PrefixEdgeError, match="not a valid TOML"):
        load_tasks(write(tmp_path, "[task.a\n"))
    with pytest.raises(PrefixEdgeError, match="no tasks"):
        load_tasks(write(tmp_path, "# nothing\n"))
    with pytest.raises(PrefixEdgeError, match="not found"):
        load_tasks(tmp_path / "missing.toml")


def _apply_chat_template(messages, add_generation_prompt):
    """transformers' own rendering of `messages` with the CHATML template (the reference)."""
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models

    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>")))
    return tok.apply_chat_template(messages, chat_template=CHATML, tokenize=False,
                                   add_generation_prompt=add_generation_prompt)


def _split_turn(prefix_msgs, text):
    """(prefix, before, after): apply_chat_template of the prefix messages, and the text around
    `text` in apply_chat_template of the prefix messages + a user turn `text` (generation prompt)."""
    prefix = _apply_chat_template(prefix_msgs, False)
    full = _apply_chat_template(prefix_msgs + [{"role": "user", "content": text}], True)
    assert full.startswith(prefix) and full.count(text) == 1
    before, after = full[len(prefix):].split(text)
    return prefix, before, after


@pytest.mark.integration  # imports transformers (~5 s): not unit-tier
def test_chat_render_splits_prefix_and_input(tmp_path):
    (t,) = load_tasks(write(tmp_path, '[task.a]\nsystem = "S"\nexamples = [{user = "u1", assistant = "a1"}]\ntemplate = "Q: {input}"\n'))
    r = render_task(t, CHATML, {})
    assert r.chat
    prefix, before, after = _split_turn([{"role": "system", "content": "S"}, {"role": "user", "content": "Q: u1"},
                                         {"role": "assistant", "content": "a1"}], "Q: zz-input-zz")
    assert r.prefix_text == prefix
    assert (r.input_before, r.input_after) == (before, after)


def test_raw_render(tmp_path):
    (t,) = load_tasks(write(tmp_path, '[task.a]\nprefix = "P: "\ntemplate = "{input} =>"\n'))
    r = render_task(t, CHATML, {})
    assert not r.chat and r.prefix_text == "P: " and r.input_before == r.input_after == ""


def _adapter_dir(tmp_path, name="ad"):
    d = tmp_path / name
    d.mkdir()
    (d / "adapter_config.json").write_text('{"peft_type": "PREFIX_TUNING"}')
    return d


@pytest.mark.integration  # imports transformers (~5 s): not unit-tier
def test_peft_task(tmp_path):
    _adapter_dir(tmp_path)
    (t, u) = load_tasks(write(tmp_path, '''
[task.a]
kind = "peft"
adapter = "ad"
chat = false
max_tokens = 3

[task.b]
kind = "peft"
adapter = "ad"
system = "after the trained part"
template = "Q: {input}"
'''))
    assert t.kind == "peft" and t.adapter == tmp_path / "ad" and t.defaults == {"max_tokens": 3}
    assert u.system == "after the trained part"
    r = render_task(t, CHATML, {})  # no text: the prefix is the trained part only
    assert r.prefix_text == "" and not r.chat
    r = render_task(u, CHATML, {})
    prefix, before, after = _split_turn([{"role": "system", "content": "after the trained part"}], "Q: zz-input-zz")
    assert r.prefix_text == prefix
    assert (r.input_before, r.input_after) == (before, after)


@pytest.mark.parametrize("body, words", [
    ('[task.a]\nkind = "peft"\n', "missing"),
    ('[task.a]\nkind = "peft"\nadapter = "nowhere"\n', "not found"),
    ('[task.a]\nkind = "peft"\nadapter = "empty"\n', "no adapter_config.json"),
    ('[task.a]\nkind = "peft"\nadapter = 3\n', "expected str"),
    ('[task.a]\nsystem = "s"\nadapter = "ad"\n', "only a kind"),
])
def test_peft_task_errors_name_the_adapter_key(tmp_path, body, words):
    _adapter_dir(tmp_path)
    (tmp_path / "empty").mkdir()
    p = write(tmp_path, body)
    with pytest.raises(PrefixEdgeError) as e:
        load_tasks(p)
    msg = str(e.value)
    assert str(p) in msg and "task 'a'" in msg and "key 'adapter'" in msg and words in msg
