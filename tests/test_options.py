"""Generation options have one definition (prefix_edge/options.py): the same value is refused the
same way, naming the same field, from the Python API's check, a task file and the server's
OpenAI fields; layers resolve defaults <- task <- request."""

import json

import pytest

from prefix_edge.errors import PrefixEdgeError
from prefix_edge.options import DEFAULTS, FIELDS, OptionError, check, resolve
from prefix_edge.serve.schema import ApiError, sampling_options
from prefix_edge.tasks import load_tasks

BAD = {"max_tokens": 0, "temperature": 2.5, "top_p": 1.5, "top_k": -1, "seed": -1, "min_p": 1.5,
       "repetition_penalty": 0, "presence_penalty": 3, "frequency_penalty": -3, "stop": [""],
       "logit_bias": {"5": 101}, "json_schema": "x", "regex": "", "grammar": "", "speculative": "on",
       "compose_documents": "yes", "compose_recompute": 4097}
GOOD = {"max_tokens": 1 << 20, "temperature": 2, "top_p": 0.5, "top_k": 40, "seed": 2 ** 63 - 1,
        "min_p": 1, "repetition_penalty": 10, "presence_penalty": -2, "frequency_penalty": 2,
        "stop": ["\n"], "logit_bias": {"5": -100}, "json_schema": {"type": "object"}, "regex": "a+",
        "grammar": "start: \"a\"", "speculative": "lookup", "compose_documents": True, "compose_recompute": 0}


def test_every_option_has_a_bad_and_a_good_case():
    assert set(BAD) == set(FIELDS) == set(GOOD) == set(DEFAULTS)


@pytest.mark.parametrize("name", sorted(FIELDS))
def test_a_bad_value_names_its_field(name):
    with pytest.raises(OptionError) as e:
        check({name: BAD[name]})
    assert e.value.field == name and str(e.value).startswith(name) and "\n" not in str(e.value)
    assert check({name: GOOD[name]})[name] is not None


@pytest.mark.parametrize("name", sorted(set(FIELDS) - {"stop"}))  # a task file's stop: tests/test_tasks.py
def test_a_task_file_refuses_what_the_api_refuses(tmp_path, name):
    p = tmp_path / "tasks.toml"
    value = BAD[name]
    toml_value = json.dumps(value) if not isinstance(value, dict) else \
        "{" + ", ".join(f'"{k}" = {v}' for k, v in value.items()) + "}"
    p.write_text(f'[task.a]\nsystem = "s"\n{name} = {toml_value}\n')
    with pytest.raises(PrefixEdgeError) as e:
        load_tasks(p)
    assert f"key '{name}'" in str(e.value), str(e.value)


@pytest.mark.parametrize("name", ["max_tokens", "temperature", "top_p", "top_k", "seed", "min_p",
                                  "repetition_penalty", "presence_penalty", "frequency_penalty",
                                  "stop", "logit_bias"])
def test_the_server_refuses_what_the_api_refuses(name):
    with pytest.raises(ApiError) as e:
        sampling_options({name: BAD[name]})
    assert e.value.status == 400 and e.value.param == name and e.value.message.startswith(f"`{name}`")
    assert sampling_options({name: GOOD[name]})[name] == check({name: GOOD[name]})[name]
    with pytest.raises(ApiError) as e:
        sampling_options({"max_completion_tokens": 0})
    assert e.value.param == "max_completion_tokens"


def test_layers_resolve_in_order_and_none_is_not_given():
    got = resolve({"temperature": 0.7, "top_k": 5}, {"temperature": 0.2, "top_k": None})
    assert got == {**DEFAULTS, "temperature": 0.2, "top_k": 5}
    assert resolve(None, {"top_p": 0})["top_p"] == 1e-9  # OpenAI's 0: the most likely token only
    assert check({"stop": "x", "logit_bias": {"7": 1}}) == {"stop": ["x"], "logit_bias": {7: 1.0}}
    with pytest.raises(OptionError, match="one constraint"):
        resolve({"json_schema": True}, {"regex": "a"})
    assert resolve({"json_schema": True}, {"json_schema": False, "regex": "a"})["regex"] == "a"
