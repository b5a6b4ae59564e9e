"""A request body read as JSON and each field's JSON shape checked, the field named, before any
field is used.

Reading: NaN and Infinity (which Python's json takes and JSON does not), a number beyond a
double (1e999), an integer too long for Python's int(), nesting deeper than MAX_NESTING and text that is not text (a lone
surrogate) are 400s naming the top-level field they are in.

Shapes: each endpoint's fields are a table of Shape: the JSON kinds a value may be ("str",
"int", "num" (int or float), "bool", "list", "obj", "null", "any"), and for an object the
shapes of the fields it may have, for a list the shape of its items. A top-level field given
as null is "not given"; a nested null must be allowed by its shape. A value of another kind is
a 400 whose `param` is the top-level field and whose message names the whole path
(`messages[1].tool_calls[0].function.name`). What a value means (ranges, names, roles) is
checked afterwards, by schema.py and the runtime.
"""

from __future__ import annotations

import json
import math
import re
from typing import Callable

from .schema import ApiError

MAX_NESTING = 300  # levels of lists and objects in a body (a constraint's schema: 256 of its own)
DIGITS = 4000      # an integer longer than this is no field's value (Python's int() stops at 4300)
METADATA_PAIRS, METADATA_KEY, METADATA_VALUE = 16, 64, 512  # OpenAI's limits


class NotJson:
    """A value Python's json reads and JSON does not have (NaN, Infinity, a huge integer)."""

    def __init__(self, what: str):
        self.what = what


def _constant(name: str) -> NotJson:
    return NotJson(name)


def _integer(text: str):
    return int(text) if len(text) <= DIGITS else NotJson(f"an integer of {len(text):,} digits")


def read_body(raw: bytes) -> dict:
    """The body as a dict, checked as the module says."""
    try:
        try:
            body = json.loads(raw, parse_constant=_constant)
        except ValueError as e:
            if "digits" not in str(e):
                raise
            body = json.loads(raw, parse_constant=_constant, parse_int=_integer)
    except RecursionError:
        key = deep_key(raw)
        where = f"`{_printable(key)}`" if key is not None else "the request body"
        raise ApiError(400, f"{where} nests lists and objects more than {MAX_NESTING} levels deep",
                       None if key is None else _printable(key)) from None
    except ValueError:
        raise ApiError(400, "the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    check_values(body)
    return body


def _printable(s: str) -> str:
    return s.encode("utf-8", "backslashreplace").decode("utf-8")


def _path(node) -> str:
    keys = []
    while node is not None:
        node, key = node
        keys.append(key)
    out = ""
    for key in reversed(keys):
        out += f"[{key}]" if isinstance(key, int) else (f".{_printable(key)}" if out else _printable(key))
    return out


def check_values(body: dict) -> None:
    """Every value of the body (iteratively: no Python recursion): text is text (keys too), no
    NotJson, lists and objects at most MAX_NESTING levels deep (a top-level field's value is
    level 1)."""
    stack = []
    for k, v in body.items():
        _text(k, (None, k))
        stack.append((v, 1, (None, k)))
    while stack:
        v, depth, node = stack.pop()
        if isinstance(v, str):
            _text(v, node)
        elif isinstance(v, (dict, list)):
            if depth > MAX_NESTING:
                raise ApiError(400, f"`{_top(node)}` nests lists and objects more than {MAX_NESTING} "
                               "levels deep", _top(node))
            if isinstance(v, dict):
                for k, x in v.items():
                    _text(k, (node, k))
                    stack.append((x, depth + 1, (node, k)))
            else:
                stack.extend((x, depth + 1, (node, i)) for i, x in enumerate(v))
        elif isinstance(v, NotJson):
            raise ApiError(400, f"`{_path(node)}` is {v.what}: not a JSON value", _top(node))
        elif isinstance(v, float) and not math.isfinite(v):  # 1e999: beyond a double
            raise ApiError(400, f"`{_path(node)}` is beyond the range of a number", _top(node))


def _top(node) -> str:
    while node[0] is not None:
        node = node[0]
    return _printable(node[1])


def _text(s, node) -> None:
    """A string (a value, or the key that ends `node`) that UTF-8 can encode."""
    if not isinstance(s, str):
        return
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ApiError(400, f"`{_path(node)}` is not valid text: a lone surrogate at character "
                       f"{e.start}", _top(node)) from None


_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def deep_key(raw: bytes, limit: int = MAX_NESTING) -> str | None:
    """The top-level key of a JSON object text under which lists and objects nest more than
    `limit` levels deep (None: none, or not an object). A scan of its brackets and strings."""
    depth, last = 0, None
    for m in _TOKEN.finditer(raw):
        t = m.group()
        if t[:1] == b'"':
            if depth == 1:
                last = t
        elif t in (b"[", b"{"):
            depth += 1
            if depth > limit + 1:
                try:
                    return json.loads(last) if last is not None else None
                except ValueError:
                    return None
        else:
            depth -= 1
    return None


def nesting_over(text: str, limit: int = MAX_NESTING) -> bool:
    """Whether a JSON text (a tool call's arguments) nests more than `limit` levels deep."""
    depth = 0
    for m in _TOKEN.finditer(text.encode("utf-8")):
        t = m.group()
        if t in (b"[", b"{"):
            depth += 1
            if depth > limit:
                return True
        elif t in (b"]", b"}"):
            depth -= 1
    return False


# shapes ---------------------------------------------------------------------------------------
KINDS = {"str": "a string", "int": "an integer", "num": "a number", "bool": "true or false",
         "list": "a list", "obj": "an object", "null": "null"}


class Shape:
    def __init__(self, kinds: str, fields: dict | None = None, items: "Shape | None" = None,
                 check: Callable[[object, str, str], None] | None = None):
        self.kinds, self.fields, self.items, self.check = set(kinds.split("|")), fields, items, check


def kind_of(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "bool"
    return {int: "int", float: "num", str: "str", list: "list", dict: "obj"}.get(type(v), "any")


def _got(v) -> str:
    k = kind_of(v)
    if k in ("list", "obj"):
        return KINDS[k]
    text = json.dumps(v, ensure_ascii=False)
    return text if len(text) <= 40 else text[:37] + "..."


def check_shape(value, shape: Shape, path: str, param: str) -> None:
    k = kind_of(value)
    if not ("any" in shape.kinds or k in shape.kinds or (k == "int" and "num" in shape.kinds)):
        want = " or ".join(KINDS[x] for x in ("str", "int", "num", "bool", "list", "obj", "null")
                           if x in shape.kinds)
        raise ApiError(400, f"`{path}` must be {want}, got {_got(value)}", param)
    if shape.fields and isinstance(value, dict):
        for key, sub in shape.fields.items():
            if key in value:
                check_shape(value[key], sub, f"{path}.{key}", param)
    if shape.items is not None and isinstance(value, list):
        for i, x in enumerate(value):
            check_shape(x, shape.items, f"{path}[{i}]", param)
    if shape.check is not None:
        shape.check(value, path, param)


def refuse_unknown(body: dict, table: dict[str, Shape]) -> None:
    """A field the endpoint's table does not have is a 400 naming it."""
    unknown = sorted(set(body) - set(table))
    if unknown:
        raise ApiError(400, f"unsupported field `{unknown[0]}`", unknown[0])


def check_fields(body: dict, table: dict[str, Shape]) -> None:
    """The body's known fields checked against their shapes (null: not given)."""
    for key, value in body.items():
        shape = table.get(key)
        if shape is not None and value is not None:
            check_shape(value, shape, key, key)


def _metadata(value, path: str, param: str) -> None:
    if not isinstance(value, dict):
        return
    if len(value) > METADATA_PAIRS:
        raise ApiError(400, f"`{path}` has {len(value)} pairs; at most {METADATA_PAIRS}", param)
    for key, v in value.items():
        if len(key) > METADATA_KEY:
            raise ApiError(400, f"`{path}`: the key {_got(key)} is {len(key)} characters; at most "
                           f"{METADATA_KEY}", param)
        if not isinstance(v, str) or len(v) > METADATA_VALUE:
            raise ApiError(400, f"`{path}.{key}` must be a string of at most {METADATA_VALUE} "
                           f"characters, got {_got(v) if not isinstance(v, str) else f'{len(v)} characters'}",
                           param)


def _arguments(value, path: str, param: str) -> None:
    if isinstance(value, str) and nesting_over(value):
        raise ApiError(400, f"`{path}` nests lists and objects more than {MAX_NESTING} levels deep", param)


def S(kinds: str, fields: dict | None = None, items: Shape | None = None, check=None) -> Shape:
    return Shape(kinds, fields, items, check)


STR, INT, NUM, BOOL, OBJ = S("str"), S("int"), S("num"), S("bool"), S("obj")
OPT_STR = S("str|null")
METADATA = S("obj", check=_metadata)
PART = S("obj", {"type": STR, "text": STR})
CALL = S("obj", {"id": STR, "type": STR, "function": S("obj", {
    "name": STR, "arguments": S("str|obj", check=_arguments)})})
MESSAGE = S("obj", {"role": STR, "content": S("str|list|null", items=PART), "name": OPT_STR,
                    "tool_call_id": STR, "tool_calls": S("list|null", items=CALL),
                    "refusal": OPT_STR})
TOOL = S("obj", {"type": STR, "function": S("obj", {"name": STR, "description": OPT_STR,
                                                    "parameters": S("obj|null"), "strict": S("bool|null")})})
TOOL_CHOICE = S("str|obj", {"type": STR, "function": S("obj", {"name": STR})})
RESPONSE_FORMAT = S("obj", {"type": STR, "json_schema": S("obj", {
    "name": STR, "description": OPT_STR, "schema": S("obj|null"), "strict": S("bool|null")})})

DOCUMENTS = S("list", items=S("obj", {"title": OPT_STR, "text": STR}))

# A generation option's JSON shape, by its kind (options.Field.kind): a request field that is an
# option of the same name is shaped from its one definition there. (The constraints, kinds
# "schema" and "pattern", come as response_format / text.format, not as fields of their own.)
OPTION_SHAPES = {"int": INT, "float": NUM, "bool": BOOL, "choice": STR, "stop": S("str|list", items=STR),
                 "bias": OBJ}


def option_fields(names=None) -> dict[str, Shape]:
    """The request fields that are generation options of the same name (all that can be one:
    names None), each shaped by its kind."""
    from ..options import FIELDS

    names = [n for n, f in FIELDS.items() if f.kind in OPTION_SHAPES] if names is None else names
    return {n: OPTION_SHAPES[FIELDS[n].kind] for n in names}


# POST /v1/chat/completions and /v1/completions: every generation option by its own name, then
# OpenAI's fields (one table for both: a field of the other is refused by what it means,
# schema.py). Its keys are the fields these endpoints accept (schema.completion_params).
COMPLETION_FIELDS = {
    **option_fields(),
    "model": STR, "messages": S("list", items=MESSAGE), "prompt": S("str|list", items=S("str|int|list", items=INT)),
    "stream": BOOL, "stream_options": S("obj", {"include_usage": S("bool|null"),
                                                "include_obfuscation": S("bool|null")}),
    "user": STR, "n": INT, "metadata": METADATA, "store": BOOL, "parallel_tool_calls": BOOL,
    "service_tier": STR, "echo": BOOL, "logprobs": S("bool|int"), "top_logprobs": INT, "suffix": STR,
    "best_of": INT, "max_completion_tokens": INT,
    "response_format": RESPONSE_FORMAT, "tools": S("list", items=TOOL), "tool_choice": TOOL_CHOICE,
    "functions": S("list"), "function_call": S("str|obj"), "prompt_cache_key": STR,
    "safety_identifier": STR, "modalities": S("list", items=STR), "reasoning_effort": STR,
    "verbosity": STR, "web_search_options": OBJ, "prediction": OBJ, "audio": OBJ,
    "documents": DOCUMENTS}

# POST /v1/responses
ITEM = S("obj", {"type": STR, "role": STR, "content": S("str|list", items=PART), "call_id": STR,
                 "name": STR, "arguments": S("str", check=_arguments), "output": S("any"),
                 "id": OPT_STR, "status": OPT_STR})
FORMAT = {"type": STR, "name": STR, "description": OPT_STR, "schema": S("obj|null"), "strict": S("bool|null")}
RESPONSE_FIELDS = {
    # the generation options Responses takes by their own names (max_tokens is max_output_tokens)
    **option_fields(("temperature", "top_p", "seed", "speculative", "compose_documents", "compose_recompute")),
    "model": STR, "input": S("str|list", items=ITEM), "instructions": STR, "stream": BOOL,
    "max_output_tokens": INT,
    "tools": S("list", items=S("obj", {"type": STR, "name": STR, "description": OPT_STR,
                                        "parameters": S("obj|null"), "strict": S("bool|null")})),
    "tool_choice": S("str|obj", {"type": STR, "name": STR}), "parallel_tool_calls": BOOL,
    "text": S("obj", {"format": S("obj|null", FORMAT), "verbosity": OPT_STR}), "store": BOOL,
    "previous_response_id": STR, "metadata": METADATA, "user": STR, "truncation": STR,
    "reasoning": S("obj", {"effort": OPT_STR, "summary": OPT_STR}), "include": S("list", items=STR),
    "top_logprobs": INT, "service_tier": STR, "prompt_cache_key": STR, "safety_identifier": STR,
    "stream_options": S("obj", {"include_obfuscation": S("bool|null")}), "background": BOOL,
    "max_tool_calls": INT, "prompt_cache_retention": STR,
    "documents": DOCUMENTS}  # an extension (documents.py)
