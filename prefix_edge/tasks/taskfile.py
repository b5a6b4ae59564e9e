"""Task files (TOML) → TaskSpec, and rendering a task into prefix text + input wrapper.

A task file holds one table per task:

    [task.support]
    kind = "text"
    system = "You are ..."
    examples = [{user = "...", assistant = "..."}]
    template = "Ticket: {input}"
    max_tokens = 128

    [task.extract]
    kind = "peft"
    adapter = "adapters/extract"      # a PEFT prompt-learning adapter dir, relative to this file
    chat = false

A `peft` task's prefix is the adapter's virtual tokens (prefix tuning / cartridge KV, or prompt /
P-tuning soft-prompt embeddings), optionally followed by a text `system`/`examples`/`prefix`
rendered as for a text task. Rendering happens once, at export. The runtime receives the prefix token ids and the two
strings that wrap a user's input (``input_before`` + template(input) + ``input_after``), so it
needs no template engine.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..chat_template import render_chat
from ..errors import PrefixEdgeError
from ..constraint_limits import problem as constraint_problem
from ..options import CONSTRAINTS, FIELDS, OptionError, check as check_options, check_text

# a task's defaults: the generation options (options.py), with the TOML type each is written as
GEN_KEYS = {name: {"int": int, "float": float, "stop": list, "bias": dict, "schema": object,
                   "pattern": str, "choice": str, "bool": bool}[f.kind] for name, f in FIELDS.items()}
TEXT_KEYS = {"kind", "system", "examples", "prefix", "template", "chat", "compress_prefix", *GEN_KEYS}
ALL_KEYS = TEXT_KEYS | {"adapter"}
KINDS = {"text", "peft"}
_SENTINEL = "\u2063PREFIX_EDGE_INPUT\u2063"


@dataclass(frozen=True)
class Example:
    user: str
    assistant: str


@dataclass(frozen=True)
class TaskSpec:
    name: str
    kind: str = "text"
    system: str | None = None
    examples: tuple[Example, ...] = ()
    prefix: str | None = None
    template: str = "{input}"
    chat: bool | None = None  # None: decided by whether the tokenizer has a chat template
    defaults: dict[str, Any] = field(default_factory=dict)
    adapter: Path | None = None  # kind "peft": the adapter dir, resolved against the task file
    file: Path | None = None     # the task file it came from (for error messages)
    compress_prefix: float | str | None = None  # a ratio, "auto", "none" (kept whole); None: export's flag

    def where(self, key: str | None = None) -> str:
        """'FILE: task 'NAME'[: key 'KEY']', the start of an error message about this task."""
        return task_where(self.file, self.name, key)


@dataclass(frozen=True)
class RenderedTask:
    """What a task becomes once rendered for one tokenizer."""

    prefix_text: str
    input_before: str
    input_after: str
    template: str
    chat: bool
    messages: tuple = ()  # chat tasks: the system/example messages the prefix renders


def task_where(path: Path | None, task: str | None, key: str | None = None) -> str:
    """'FILE: task 'NAME': key 'KEY'' (no file: a task given as fields, as the API does)."""
    parts = [str(path)] if path is not None else []
    if task is not None:
        parts.append(f"task '{task}'")
    if key is not None:
        parts.append(f"key '{key}'")
    return ": ".join(parts) or "task"


def _err(path: Path, task: str | None, key: str | None, msg: str) -> PrefixEdgeError:
    """One line naming the file, the task and the key; `param` the key's field (a task made
    through the API: the request's field)."""
    return PrefixEdgeError(f"{task_where(path, task, key)}: {msg}", param=key_field(key))


def key_field(key: str | None) -> str | None:
    """A task file key's top field: 'examples[0].user' -> 'examples'."""
    return key.split("[", 1)[0].split(".", 1)[0] if key else None


def _check_type(path: Path, task: str, key: str, value: Any, typ: type) -> Any:
    if typ is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if typ is int and isinstance(value, bool) or not isinstance(value, typ):
        raise _err(path, task, key, f"expected {typ.__name__}, got {type(value).__name__} ({value!r})")
    return value


def read_task_file(path: str | Path) -> dict:
    """A task file's TOML as a dict; a missing or unreadable one is one line."""
    import tomllib  # here: the runtime imports this module, but never reads a task file

    path = Path(path)
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PrefixEdgeError(f"{path}: task file not found") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise PrefixEdgeError(f"{path}: not a valid TOML file: {e}") from None


def load_tasks(path: str | Path) -> list[TaskSpec]:
    """Parse and validate a task file. Every problem names the file, the task and the key."""
    path = Path(path)
    data = read_task_file(path)
    extra = set(data) - {"task"}
    if extra:
        raise _err(path, None, sorted(extra)[0], "unknown top-level key (tasks go in [task.NAME] tables)")
    tables = data.get("task")
    if not isinstance(tables, dict) or not tables:
        raise _err(path, None, None, "no tasks: add at least one [task.NAME] table")
    clash = case_collision(tables)
    if clash:
        raise _err(path, clash[1], None, f"differs from task {clash[0]!r} only in case (their prefix "
                   "files would be one file on macOS and Windows)")
    return [_parse_task(path, name, table) for name, table in tables.items()]


def parse_task(name: Any, fields: Any) -> TaskSpec:
    """A task given as fields (a task file's table, as JSON: Runtime.add_task, POST /v1/tasks),
    checked as load_tasks checks a file's; errors name the task and the key (`param` the field)."""
    if not isinstance(name, str):
        raise PrefixEdgeError(f"a task's name must be a string, got {type(name).__name__}", param="name")
    problem = task_name_problem(name)
    if problem:
        raise PrefixEdgeError(f"task {name!r}: {problem}", param="name")
    return _parse_task(None, name, fields)


_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
_RESERVED = {"con", "prn", "aux", "nul", *(f"com{i}" for i in range(10)), *(f"lpt{i}" for i in range(10))}


def task_name_problem(name: Any) -> str | None:
    """Why `name` cannot be a task name (it becomes a file name on every OS), or None."""
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        return ("task names are 1-64 ASCII letters, digits, '-' and '_', starting with a letter "
                "or digit")
    if name.lower() in _RESERVED:
        return f"{name!r} is a reserved file name on Windows"
    return None


def case_collision(names) -> tuple[str, str] | None:
    seen: dict[str, str] = {}
    for n in names:
        if n.lower() in seen:
            return seen[n.lower()], n
        seen[n.lower()] = n
    return None


def _parse_task(path: Path, name: str, t: Any) -> TaskSpec:
    if not isinstance(t, dict):
        raise _err(path, name, None, "must be a table")
    problem = task_name_problem(name)
    if problem:
        raise _err(path, name, None, problem)
    for key in t:
        if key not in ALL_KEYS:
            raise _err(path, name, key, f"unknown key (allowed: {', '.join(sorted(ALL_KEYS))})")
    kind = _check_type(path, name, "kind", t.get("kind", "text"), str)
    if kind not in KINDS:
        raise _err(path, name, "kind", f"must be one of {sorted(KINDS)}, got {kind!r}")
    if kind == "peft" and "compress_prefix" in t:
        raise _err(path, name, "compress_prefix", "a trained (peft) prefix is kept whole: its "
                   "virtual tokens are the adapter itself")
    adapter = _adapter_dir(path, name, kind, t.get("adapter"))
    system = t.get("system")
    if system is not None:
        _check_type(path, name, "system", system, str)
    prefix = t.get("prefix")
    if prefix is not None:
        _check_type(path, name, "prefix", prefix, str)
    examples = []
    for i, ex in enumerate(_check_type(path, name, "examples", t.get("examples", []), list)):
        if not isinstance(ex, dict) or set(ex) != {"user", "assistant"}:
            raise _err(path, name, f"examples[{i}]", "must be a table with exactly 'user' and 'assistant'")
        for k in ("user", "assistant"):
            _check_type(path, name, f"examples[{i}].{k}", ex[k], str)
        examples.append(Example(ex["user"], ex["assistant"]))
    if prefix is not None and (system is not None or examples):
        raise _err(path, name, "prefix", "give either 'prefix' (raw text) or 'system'/'examples', not both")
    if kind == "text" and prefix is None and system is None and not examples:
        raise _err(path, name, "prefix", "missing: a text task needs 'system', 'examples' or 'prefix'")
    template = _check_type(path, name, "template", t.get("template", "{input}"), str)
    if template.count("{input}") != 1:
        raise _err(path, name, "template", "must contain '{input}' exactly once")
    chat = t.get("chat")
    if chat is not None:
        _check_type(path, name, "chat", chat, bool)
    if prefix is not None and chat:
        raise _err(path, name, "chat", "a raw 'prefix' cannot be used with chat = true")
    if prefix is not None:
        chat = False
    defaults: dict[str, Any] = {}
    for key, typ in GEN_KEYS.items():
        if key in t:
            defaults[key] = _check_type(path, name, key, t[key], typ)
    for i, s in enumerate(defaults.get("stop", [])):
        if not isinstance(s, str) or not s:
            raise _err(path, name, f"stop[{i}]", "stop entries must be non-empty strings")
    try:
        defaults = check_options(defaults)
    except OptionError as e:
        raise _err(path, name, e.field, str(e)) from None
    for key in CONSTRAINTS:  # what native code would choke on (export compiles the rest)
        bad = constraint_problem(key, defaults.get(key))
        if bad is not None:
            raise _err(path, name, key, f"{key}: {bad}")
    compress = None
    if "compress_prefix" in t:
        try:
            compress = compress_ratio(t["compress_prefix"], "compress_prefix") or "none"
        except PrefixEdgeError as e:
            raise _err(path, name, "compress_prefix", str(e)) from None
    return TaskSpec(name, kind, system, tuple(examples), prefix, template, chat, defaults,
                    adapter, path, compress)


def compress_ratio(spec: Any, what: str = "--compress-prefix") -> float | str | None:
    """A prefix compression setting: None (keep the prefix whole), a ratio in (1, 64] (prefix
    tokens per kept token) or "auto"; a bad one is one PrefixEdgeError line."""
    if spec is None:
        return None
    s = "?" if isinstance(spec, bool) else str(spec).strip().lower()
    if s in ("", "none", "off", "1", "1.0"):
        return None
    if s == "auto":
        return "auto"
    try:
        r = float(s)
    except ValueError:
        r = float("nan")
    if not (1.0 < r <= 64.0):
        raise PrefixEdgeError(f"{what} must be a ratio in (1, 64] (prefix tokens per kept token), "
                              f"'auto' or 'none', got {spec!r}")
    return r


def _adapter_dir(path: Path, name: str, kind: str, value: Any) -> Path | None:
    """The `adapter` key: required for kind "peft" (and only there); relative to the task file."""
    if kind != "peft":
        if value is not None:
            raise _err(path, name, "adapter", "only a kind = \"peft\" task takes an adapter")
        return None
    if value is None:
        raise _err(path, name, "adapter", "missing: a peft task needs the path of a PEFT adapter dir")
    value = _check_type(path, name, "adapter", value, str)
    adapter = Path(value).expanduser()
    if not adapter.is_absolute():
        adapter = path.parent / adapter
    if not adapter.is_dir():
        raise _err(path, name, "adapter", f"adapter dir not found: {adapter}")
    if not (adapter / "adapter_config.json").is_file():
        raise _err(path, name, "adapter", f"{adapter} is not a PEFT adapter dir (no adapter_config.json)")
    return adapter


def fill_template(template: str, text: str) -> str:
    return template.replace("{input}", text, 1)


# --- rendering ---------------------------------------------------------------------------

def render_task(spec: TaskSpec, chat_template: str | None, special: dict[str, str]) -> RenderedTask:
    chat = spec.chat if spec.chat is not None else chat_template is not None
    if chat and chat_template is None:
        raise PrefixEdgeError(f"task '{spec.name}': chat = true but the tokenizer has no chat template")
    if not chat:
        if spec.prefix is not None:
            prefix = spec.prefix
        else:
            parts = [spec.system] if spec.system else []
            parts += [fill_template(spec.template, ex.user) + ex.assistant for ex in spec.examples]
            prefix = "\n\n".join(parts) + "\n\n" if parts else ""  # "": a peft task's trained part only
        return RenderedTask(prefix, "", "", spec.template, False)
    msgs = [{"role": "system", "content": spec.system}] if spec.system is not None else []
    for ex in spec.examples:
        msgs += [{"role": "user", "content": fill_template(spec.template, ex.user)},
                 {"role": "assistant", "content": ex.assistant}]
    prefix = render_chat(chat_template, msgs, False, special)
    full = render_chat(chat_template, msgs + [{"role": "user", "content": _SENTINEL}], True, special)
    if not full.startswith(prefix) or full.count(_SENTINEL) != 1:
        raise PrefixEdgeError(
            f"task '{spec.name}': the chat template does not render the conversation as a stable "
            "prefix plus a user turn; use chat = false with a raw 'prefix'")
    before, after = full[len(prefix):].split(_SENTINEL)
    return RenderedTask(prefix, before, after, spec.template, True, tuple(msgs))


def text_hash(text: str | None) -> str | None:
    return None if text is None else hashlib.sha256(text.encode()).hexdigest()
