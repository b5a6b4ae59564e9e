"""Documents given with a call (`documents=[{"title": ..., "text": ...}]`): checked, and rendered
into the prompt.

Rendering (this version): a fallback block, the same for every model, in the conversation's
system message (a messages call: appended to the first system message, or a new system message
in front) or before the user's text (a task's text call, inside the task's input wrapping):

    Documents:

    [1] <title>
    <text>

    [2] <text of a document without a title>

The rendered prompt is then an ordinary prompt: prefilled, or served from the exact prompt
cache (cache/prompts.py) when the same documents come again — exact, a hit equals a miss.
A conversation on a model whose chat template has a documents section of its own (it reads
`documents`, as HF's apply_chat_template(documents=...) passes them) gets them there instead
(decided once at the call: plan.py, asking prepare.py `_native_documents`).

`compose_documents=True` (opt-in, not exact; documents/compose.py): the same block, each document's own
text (`module`: its title line and text) tokenized on its own, its KV computed once and
composed in any order.
"""

from __future__ import annotations

from ...options import MAX_INPUT_BYTES, OptionError, check_text

MAX_DOCUMENTS = 64             # documents in one call
FIELDS = ("title", "text")     # a document's fields


def check_documents(value) -> list[dict[str, str]] | None:
    """The call's documents as [{"title", "text"}] (title "" when not given), or None for none;
    an OptionError naming `documents` (and the document's index) for a bad one."""
    if value is None:
        return None
    if not isinstance(value, (list, tuple)):
        raise OptionError("documents", f"documents must be a list of {{\"title\", \"text\"}} objects, "
                                       f"got {type(value).__name__}")
    if len(value) > MAX_DOCUMENTS:
        raise OptionError("documents", f"documents: {len(value)} given; at most {MAX_DOCUMENTS} a call")
    docs, total = [], 0
    for i, d in enumerate(value):
        where = f"documents[{i}]"
        if not isinstance(d, dict):
            raise OptionError("documents", f"{where} must be an object with \"text\" (and \"title\"), "
                                           f"got {type(d).__name__}")
        extra = sorted(set(d) - set(FIELDS))
        if extra:
            raise OptionError("documents", f"{where} has an unknown field {extra[0]!r} "
                                           f"(a document has {', '.join(FIELDS)})")
        text, title = d.get("text"), d.get("title")
        if not isinstance(text, str):
            raise OptionError("documents", f"{where}.text is missing or not a string")
        if not text.strip():
            raise OptionError("documents", f"{where}.text is empty")
        if title is not None and not isinstance(title, str):
            raise OptionError("documents", f"{where}.title must be a string, got {type(title).__name__}")
        title = title or ""
        for part, s in (("text", text), ("title", title)):
            try:
                check_text(s, f"{where}.{part}")
            except OptionError as e:
                raise OptionError("documents", str(e)) from None
        total += len(text) + len(title)
        if total > MAX_INPUT_BYTES:
            raise OptionError("documents", f"documents are over {MAX_INPUT_BYTES} characters together "
                                           f"(at {where}; MAX_INPUT_BYTES)")
        docs.append({"title": title, "text": text})
    return docs or None


def module(d: dict[str, str]) -> str:
    """A document's own text in the block (its title line and text, without its "[i]" label):
    what a composed request computes once and reuses (compose.py). It starts where a
    tokenizer starts a token anyway (a space before the first word), so alone it tokenizes
    as in the block; every label is "[i]"."""
    return " " + (d["title"] + "\n" if d["title"] else "") + d["text"]


def block(docs: list[dict[str, str]]) -> str:
    """The fallback documents block (the module's format)."""
    parts = [f"[{i}]" + module(d) for i, d in enumerate(docs, 1)]
    return "Documents:\n\n" + "\n\n".join(parts)


def with_documents(docs: list[dict[str, str]] | None, text: str | None,
                   messages: list | None, task_input: bool = False) -> tuple[str | None, list | None]:
    """(text, messages) with the documents rendered in (unchanged when there are none).
    task_input: messages that are a task's input (one user message, no tools): the block goes
    before the user's text, as for a text call."""
    if not docs:
        return text, messages
    b = block(docs)
    if messages is None:
        return b + "\n\n" + (text if isinstance(text, str) else ""), None
    if not isinstance(messages, list):
        return text, messages  # check_messages refuses it, naming messages
    first = messages[0] if messages else None
    if task_input and len(messages) == 1 and isinstance(first, dict) and first.get("role") == "user" \
            and isinstance(first.get("content"), str):
        return text, [{**first, "content": b + "\n\n" + first["content"]}]
    if isinstance(first, dict) and first.get("role") == "system" and isinstance(first.get("content"), str):
        return text, [{**first, "content": first["content"] + "\n\n" + b}] + messages[1:]
    return text, [{"role": "system", "content": b}] + messages
