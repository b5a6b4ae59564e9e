"""Tool (function) calls: OpenAI's `tools` / `tool_choice`, tool results in the history, and
the answer read back as a call.

Where the model's chat template has a tool section (it uses `tools`: Qwen3, Llama 3.x, ...) the
tools, assistant `tool_calls` and `tool` messages are rendered by it, as transformers renders
them, and a call is read from the answer (`<tool_call>{...}</tool_call>` or a bare JSON object).
Where it has none (SmolLM2's, ChatML's), a fixed system message lists the tools and asks for a
call as one JSON object, `{"name": ..., "arguments": {...}}`; earlier calls are rendered as that
JSON and tool results as user turns (`Tool result (name): ...`, the name of the function the
result answers: the matching call's, never the call's id).

A completion-prompt task (chat = false: a trained tool task) renders no tools: its own answer, a
call constrained by its json_schema, is narrowed to the functions offered and returned as a call
(task_call).

tool_choice: "none" (the tools are not offered, nothing is read as a call), "auto" (the model
chooses; an answer that is a well-formed call of an offered tool is one), "required" or a named
function (the answer is constrained to a call: its JSON validates against the function's
parameters). In "auto" with the fallback prompt and a tool marked `strict: true`, the answer is
constrained too: text that does not start with `{`, or a call whose arguments validate. A
constrained ("guided") call is streamed as it is written (CallWriter); a call cut by max_tokens
is returned as a call with the arguments written so far (finish reason "length"). One call per
answer: `parallel_tool_calls` is accepted, a model answers with one.
"""

from __future__ import annotations

import copy
import json
import re
import uuid
from dataclasses import dataclass

from ...errors import PrefixEdgeError

FALLBACK = ("You can call these functions:\n{tools}\n\nTo call one, answer with only a JSON object "
            "and nothing else: {{\"name\": \"<function name>\", \"arguments\": {{<its arguments>}}}}. "
            "{tail}")
TAIL = {"auto": "Otherwise answer normally.", "required": "You must call one of them."}
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")


@dataclass
class ToolSpec:
    tools: list[dict]      # OpenAI's [{"type": "function", "function": {...}}], checked
    choice: str            # "none" | "auto" | "required" | "function"
    name: str | None = None  # the forced function
    guided: bool = False     # the answer is constrained (a forced call, or strict tools in auto)

    @property
    def names(self) -> list[str]:
        return [t["function"]["name"] for t in self.tools]


def check_tools(tools, tool_choice) -> ToolSpec | None:
    if tools is None or tools == []:
        if tool_choice not in (None, "none", "auto"):
            raise PrefixEdgeError("tool_choice needs tools", param="tool_choice")
        return None
    if not isinstance(tools, list):
        raise PrefixEdgeError("tools must be a list of {type: function, function: {name, parameters}}", param="tools")
    out = []
    for i, t in enumerate(tools):
        f = t.get("function") if isinstance(t, dict) and t.get("type", "function") == "function" else None
        if not isinstance(f, dict) or not isinstance(f.get("name"), str) or not _NAME.fullmatch(f["name"]):
            raise PrefixEdgeError(f"tools[{i}] must be {{type: function, function: {{name, parameters}}}} "
                                  "with a name of letters, digits, _ . -", param="tools")
        params = f.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict):
            raise PrefixEdgeError(f"tools[{i}].function.parameters must be a JSON schema object", param="tools")
        out.append(t)  # rendered as the client sent it (as transformers renders it)
    names = [t["function"]["name"] for t in out]
    if len(set(names)) != len(names):
        raise PrefixEdgeError("tools: two functions have the same name", param="tools")
    choice = "auto" if tool_choice is None else tool_choice
    if isinstance(choice, dict):
        f = choice.get("function") if choice.get("type", "function") == "function" else None
        name = f.get("name") if isinstance(f, dict) else None
        if name not in names:
            raise PrefixEdgeError(f"tool_choice names {name!r}, which is not in tools", param="tool_choice")
        return ToolSpec(out, "function", name)
    if choice not in ("none", "auto", "required"):
        raise PrefixEdgeError(f"tool_choice must be none, auto, required or a function, got {choice!r}",
                              param="tool_choice")
    return ToolSpec(out, choice)


def call_schema(spec: ToolSpec) -> dict:
    """The JSON schema of a forced call. Each tool's parameters sit at properties.arguments of
    its branch, so their definitions (`$defs`, `definitions`: what pydantic writes for a nested
    model, an Enum, a list of models) move to the root, renamed where two tools use one name,
    and their references follow (a reference to the parameters' own root points at their new
    place)."""
    tools = [t for t in spec.tools if spec.choice != "function" or t["function"]["name"] == spec.name]
    defs: dict = {}

    def one(t, where: str) -> dict:
        f = t["function"]
        params = _hoist(f.get("parameters", {"type": "object", "properties": {}}),
                        where + "/properties/arguments", defs)
        return {"type": "object", "properties": {"name": {"const": f["name"]}, "arguments": params},
                "required": ["name", "arguments"], "additionalProperties": False}
    out = one(tools[0], "") if len(tools) == 1 else \
        {"anyOf": [one(t, f"/anyOf/{i}") for i, t in enumerate(tools)]}
    if defs:
        out["$defs"] = defs
    return out


def task_call(schema, spec: ToolSpec, task: str) -> dict:
    """A completion-prompt task's answer schema (a trained tool task's json_schema: a call
    `{"name": ..., "arguments": ...}`, or anyOf such calls) narrowed to the functions offered
    (tool_choice: the one it names), so that its answer is a call of one of them. A task whose
    answer calls none of them (or is no call) is refused, naming `tools`."""
    want = {spec.name} if spec.choice == "function" else set(spec.names)
    found: list[str] = []

    def narrow(branch):
        name = (branch.get("properties") or {}).get("name") if isinstance(branch, dict) else None
        names = [name["const"]] if isinstance(name, dict) and "const" in name else \
            list(name["enum"]) if isinstance(name, dict) and isinstance(name.get("enum"), list) else []
        found.extend(n for n in names if isinstance(n, str))
        keep = [n for n in names if n in want]
        if not keep:
            return None
        if len(keep) == len(names):
            return branch
        props = {**branch["properties"], "name": {**name, "enum": keep}}
        return {**branch, "properties": props}
    out = None
    if isinstance(schema, dict) and isinstance(schema.get("anyOf"), list):
        kept = [b for b in map(narrow, schema["anyOf"]) if b is not None]
        out = {**schema, "anyOf": kept} if kept else None
    elif isinstance(schema, dict):
        out = narrow(schema)
    if out is not None:
        return out
    if not found:
        raise PrefixEdgeError(f"task '{task}' takes one message and answers it, not with a function "
                              "call: it takes no tools (send it without them, or use a chat task or base)",
                              param="tools")
    raise PrefixEdgeError(f"task '{task}' calls {', '.join(dict.fromkeys(found))}; the tools offered "
                          f"({', '.join(sorted(want))}) name none of them", param="tools")


def _hoist(params, where: str, defs: dict):
    """A copy of one tool's parameters without its definitions, which go into `defs` (renamed
    where taken); its local references rewritten for the parameters' new place `where`."""
    if not isinstance(params, dict):
        return params
    params = copy.deepcopy(params)
    names: dict[tuple[str, str], str] = {}
    for key in ("$defs", "definitions"):
        found = params.pop(key, None)
        if not isinstance(found, dict):
            continue
        for name, schema in found.items():
            new, i = name, 1
            while new in defs:
                i += 1
                new = f"{name}_{i}"
            names[key, name] = new
            defs[new] = schema
    todo = [params] + [defs[n] for n in names.values()]
    while todo:
        node = todo.pop()
        if isinstance(node, list):
            todo.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        ref = node.get("$ref")
        if isinstance(ref, str) and (ref == "#" or ref.startswith("#/")):
            head, _, rest = ref[2:].partition("/")
            name, _, tail = rest.partition("/")
            if head in ("$defs", "definitions") and (head, name) in names:
                node["$ref"] = f"#/$defs/{names[head, name]}" + (f"/{tail}" if tail else "")
            elif head not in ("$defs", "definitions"):
                node["$ref"] = "#" + where + ref[1:]
        todo.extend(v for k, v in node.items() if k != "$ref")
    return params


def guide(spec: ToolSpec | None, is_native: bool) -> ToolSpec | None:
    """The spec with `guided` set: a forced call, or auto with a strict tool and the fallback
    prompt (whose call syntax is this module's; a native template's is the model's own)."""
    if spec is None:
        return None
    strict = any(t["function"].get("strict") is True for t in spec.tools)
    spec.guided = spec.choice in ("required", "function") or (spec.choice == "auto" and strict and not is_native)
    return spec


def constraint_options(opts: dict, spec: ToolSpec | None) -> dict:
    """A guided answer's constraint, over any constraint of the task's: a forced call's JSON
    schema, or (auto) a grammar of text not starting with `{` or such a call."""
    if spec is None or not spec.guided:
        return opts
    if spec.choice != "auto":
        return {**opts, "json_schema": call_schema(spec), "regex": None, "grammar": None}
    from ..decode.constraint import JSON_STYLE

    call = {**call_schema(spec), "x-guidance": JSON_STYLE}
    grammar = ("start: call | text\ncall: %json " + json.dumps(call, ensure_ascii=False) +
               "\ntext: /(\\s*[^{\\s][^\\x00]*)?/\n")
    return {**opts, "json_schema": None, "regex": None, "grammar": grammar}


def native(template: str | None) -> bool:
    """Whether a chat template renders tools itself."""
    return bool(template) and re.search(r"\btools\b", template) is not None


def for_template(messages: list[dict], spec: ToolSpec | None, is_native: bool) -> tuple[list[dict], list | None]:
    """(messages, tools) to render: a native template gets HF's shapes; any other gets the
    fallback system message, earlier calls as JSON text and tool results as user turns."""
    offered = spec is not None and spec.choice != "none"
    out = []
    called: dict = {}  # an earlier call's id -> its function's name (the fallback's tool results)
    if offered and not is_native:
        listing = json.dumps([t["function"] for t in spec.tools], ensure_ascii=False)
        out.append({"role": "system", "content": FALLBACK.format(tools=listing, tail=TAIL.get(spec.choice, TAIL["required"]))})
    for m in messages:
        calls = m.get("tool_calls")
        if is_native:
            if calls:
                m = {**m, "tool_calls": [{"type": "function", "id": c.get("id"), "function": {
                    "name": c["function"]["name"], "arguments": c["function"]["arguments"]}} for c in calls]}
            out.append(m)
            continue
        if m["role"] == "assistant" and calls:
            called.update((c.get("id"), c["function"]["name"]) for c in calls if c.get("id") is not None)
            text = "\n".join(json.dumps({"name": c["function"]["name"], "arguments": _args(c["function"]["arguments"])},
                                        ensure_ascii=False) for c in calls)
            out.append({"role": "assistant", "content": ((m.get("content") or "") + "\n" + text).strip()})
        elif m["role"] == "tool":
            # the call's function, never its id: clients make ids at random (call_<24 hex>), and
            # an id in the prompt made identical greedy requests answer differently
            who = m.get("name") or called.get(m.get("tool_call_id")) or "tool"
            out.append({"role": "user", "content": f"Tool result ({who}): {m['content']}"})
        else:
            out.append({"role": m["role"], "content": m["content"]})
    return out, (spec.tools if offered and is_native else None)


def _args(a):
    """A call's arguments as an object (OpenAI sends them as a JSON string)."""
    if isinstance(a, str):
        try:
            return json.loads(a)
        except ValueError:
            return a
        except RecursionError:
            raise PrefixEdgeError("a tool call's arguments nest lists and objects too deep", param="messages") from None
    return a


HEAD = re.compile(r'\s*\{"name": "([A-Za-z0-9_.-]{1,64})", "arguments": ')


def new_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def read_call(text: str, spec: ToolSpec | None, finished: bool = True) -> list[dict] | None:
    """The answer as OpenAI tool_calls, if it is a call of an offered tool. An answer cut short
    (finished False) that began a call of one is that call with the arguments written so far."""
    if spec is None or spec.choice == "none":
        return None
    calls = _whole_call(text, spec)
    m = HEAD.match(text)
    if calls is not None or finished or m is None or m.group(1) not in spec.names:
        return calls
    return [{"id": new_id(), "type": "function", "function": {"name": m.group(1), "arguments": text[m.end():]}}]


def _whole_call(text: str, spec: ToolSpec) -> list[dict] | None:
    s = text.strip()
    m = re.fullmatch(r"<tool_call>\s*(.*?)\s*</tool_call>", s, re.S)
    if m:
        s = m.group(1)
    if not s.startswith("{"):
        return None
    try:
        obj = json.loads(s)
    except ValueError:
        return None
    if not isinstance(obj, dict) or obj.get("name") not in spec.names:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    raw = json.dumps(args, ensure_ascii=False)
    m = HEAD.match(s)
    if m is not None and s.endswith("}"):  # the text as written (what a streamed call sent)
        written = s[m.end():-1].rstrip()
        try:
            raw = written if json.loads(written) == args else raw
        except ValueError:
            pass
    return [{"id": new_id(), "type": "function", "function": {"name": obj["name"], "arguments": raw}}]


ENDED = ("eos", "stop")  # finish reasons of an answer that ended by itself: a call in it is whole


class AnswerRouter:
    """As an answer with tools offered streams: is it text or a call? Text is held while it could
    still be a call; a guided answer (constrained, `ToolSpec.guided`) is a call once it starts
    with `{`, streamed through a CallWriter; any other becomes a call only at its end, if
    read_call reads one. feed()/end() return (text to send now, call deltas to send now)."""

    def __init__(self, guided: bool):
        self.guided, self.held, self.kind, self.writer = guided, "", None, None

    @property
    def streamed_call(self) -> bool:
        return self.kind == "call"

    def feed(self, text: str) -> tuple[str, list[dict]]:
        if self.kind == "text":
            return text, []
        if self.kind == "call":
            return "", self.writer.feed(text)
        self.held += text
        head = self.held.lstrip()
        if not head or (not self.guided and head.startswith(("{", "<"))):
            return "", []
        held, self.held = self.held, ""
        if self.guided and head.startswith("{"):
            self.kind, self.writer = "call", CallWriter()
            return "", self.writer.feed(held)
        self.kind = "text"
        return held, []

    def end(self) -> tuple[str, list[dict]]:
        """What is left at the answer's end: the rest of a streamed call, or the text held (a
        call cut before its name was written is text)."""
        if self.kind == "call":
            if self.writer.name is not None:
                return "", self.writer.end()
            self.kind = "text"
            return self.writer.text, []
        held, self.held = self.held, ""
        return held, []


class CallWriter:
    """A guided call as it is written: OpenAI tool_call deltas, first the id and name, then the
    arguments in fragments. The last `}` (the call object's close) and any whitespace after a
    `}` are held until more text shows whether they are the arguments'."""

    def __init__(self):
        self.id, self.text, self.name, self.sent = new_id(), "", None, 0

    def feed(self, text: str) -> list[dict]:
        self.text += text
        out = []
        if self.name is None:
            m = HEAD.match(self.text)
            if m is None:
                return out
            self.name, self._at = m.group(1), m.end()
            out.append({"index": 0, "id": self.id, "type": "function",
                        "function": {"name": self.name, "arguments": ""}})
        args = self.text[self._at:]
        keep = len(args) - len(re.search(r"\}?\s*\Z", args).group(0))
        sent = self._send(args[:keep])
        if out and sent:  # one entry per index in a chunk (OpenAI's shape; SDK stream helpers rely on it)
            out[0]["function"]["arguments"] = sent[0]["function"]["arguments"]
            return out
        return out + sent

    def end(self) -> list[dict]:
        """The rest of the arguments: without the call's close when the call is whole (else
        it was cut short, and everything written is the arguments)."""
        if self.name is None:
            return []
        args = self.text[self._at:]
        try:
            whole = isinstance(json.loads(self.text), dict)
        except ValueError:
            whole = False
        return self._send(args.rstrip()[:-1].rstrip() if whole else args)

    def _send(self, upto: str) -> list[dict]:
        piece, self.sent = upto[self.sent:], max(self.sent, len(upto))
        return [{"index": 0, "function": {"arguments": piece}}] if piece else []
