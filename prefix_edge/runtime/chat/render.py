"""A conversation's messages → the token ids that follow a task's baked prefix.

The model's own chat template (chat_template.py, rendered as transformers renders it) spells
the whole conversation: the task's own messages (its system prompt and examples: what its
prefix was rendered from at export), then the request's messages, then the generation prompt.
The part after the task's prefix text is the request's input. What the messages mean:

- `system` / `developer` (the same): a further system turn, where it stands in the list, after
  the task's own. Never dropped; a template that refuses it says so (a 400).
- `user`: the task's template (`Review: {input}`...) wraps every user message, as it wrapped
  the task's examples.
- `assistant`: an earlier reply, as the template spells it.

The base model (task None) has no prefix: its conversation is rendered alone, as
apply_chat_template(messages, add_generation_prompt=True) renders it.

Besides the ids, a prompt has *cuts*: where each earlier turn's prompt ended (just after its
generation prompt) and where each message ends. Prefill chunks never cross one and the prompt
cache (cache/prompts.py) keys by those chunks, so a prompt resumed from the cache computes what
a run without it computes.
Control tokens come only from the template's own markup: message text, tool results, tool-call
arguments, names and tool definitions that spell a special token (`<|im_end|>`...) are marked
before rendering and tokenized as plain text, special tokens split (user_text.py).
"""

from __future__ import annotations

import functools

from dataclasses import dataclass

import numpy as np

from ...errors import PrefixEdgeError
from ...options import MAX_INPUT_BYTES, OptionError, check_text
from ...tasks import fill_template
from ..decode.text import longer_than
from .tools import for_template, native
from .user_text import Marks, parsed_args, strings

ROLES = ("system", "developer", "user", "assistant", "tool")
TEXT_PARTS = ("text", "input_text", "output_text")  # chat completions' and responses' text parts
BASE = None  # the task of a plain chat with the base model


def content_text(content, where: str) -> str:
    """A message's content: a string, or a list of text parts (joined)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") not in TEXT_PARTS or \
                    not isinstance(part.get("text"), str):
                raise PrefixEdgeError(f"{where}.content[{j}]: only text parts are supported "
                                      "(type 'text' with a string 'text')", param="messages")
            out.append(part["text"])
        return "".join(out)
    raise PrefixEdgeError(f"{where}.content must be a string or a list of text parts", param="messages")


def check_messages(messages) -> list[dict[str, str]]:
    """The messages as [{role, content}] strings (developer → system), checked; errors name
    messages[i]."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise PrefixEdgeError("messages must be a non-empty list of {role, content}", param="messages")
    out, size = [], 0
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise PrefixEdgeError(f"{where} must be an object with 'role' and 'content'", param="messages")
        role = m.get("role")
        if role == "function" or m.get("function_call"):
            raise PrefixEdgeError(f"{where}: the legacy function role/function_call is not supported "
                                  "(use tools and tool messages)", param="messages")
        if role not in ROLES:
            raise PrefixEdgeError(f"{where}.role must be one of {', '.join(ROLES)}, got {role!r}", param="messages")
        calls = m.get("tool_calls") if role == "assistant" else None
        content = m.get("content")
        text = "" if content is None and calls else content_text(content, where)
        size += check_text(text, f"{where}.content")
        msg = {"role": "system" if role == "developer" else role, "content": text}
        if calls:
            msg["tool_calls"] = _check_calls(calls, where)
            size += sum(check_text(c["function"]["arguments"], f"{where}.tool_calls[{j}].function.arguments")
                        for j, c in enumerate(msg["tool_calls"]) if isinstance(c["function"]["arguments"], str))
        if size > MAX_INPUT_BYTES:  # before anything renders or tokenizes them
            raise OptionError("messages", f"the messages are more than {MAX_INPUT_BYTES} bytes of UTF-8 "
                                          "together (MAX_INPUT_BYTES)")
        if role == "tool":
            for k in ("tool_call_id", "name"):
                if isinstance(m.get(k), str):
                    msg[k] = m[k]
        out.append(msg)
    if out[-1]["role"] not in ("user", "tool"):
        raise PrefixEdgeError(f"messages[{len(out) - 1}]: the last message must be the user's or a "
                              f"tool result (got {out[-1]['role']!r}): the reply follows it", param="messages")
    if not any(m["content"].strip() for m in out if m["role"] in ("user", "tool")):
        raise PrefixEdgeError("the input is empty: nothing to generate from", param="messages")
    return out


def _check_calls(calls, where: str) -> list[dict]:
    if not isinstance(calls, list) or not calls:
        raise PrefixEdgeError(f"{where}.tool_calls must be a non-empty list", param="messages")
    out = []
    for j, c in enumerate(calls):
        f = c.get("function") if isinstance(c, dict) else None
        if not isinstance(f, dict) or not isinstance(f.get("name"), str):
            raise PrefixEdgeError(f"{where}.tool_calls[{j}] must be {{id, type: function, function: "
                                  "{name, arguments}}", param="messages")
        args = f.get("arguments", "{}")
        if not isinstance(args, (str, dict)):
            raise PrefixEdgeError(f"{where}.tool_calls[{j}].function.arguments must be a JSON string", param="messages")
        out.append({"id": c.get("id") if isinstance(c.get("id"), str) else f"call_{j}", "type": "function",
                    "function": {"name": f["name"], "arguments": args}})
    return out


@dataclass
class ChatPrompt:
    ids: np.ndarray          # the input after the task's prefix
    cuts: tuple[int, ...]    # ends of earlier turns' prompts and of messages, in ids
    messages: list[dict]     # the request's messages (checked)
    spans: tuple = ()        # `pieces` asked for: (start, end) of each in ids, tokenized alone


class ChatRenderer:
    """Renders and tokenizes conversations for one bundle (the runtime's)."""

    def __init__(self, template: str | None, special: dict, tokenizer, text_tokenizer,
                 special_texts: list[str]):
        self.template, self.special = template, special
        self.tok, self._text_tok = tokenizer, text_tokenizer  # text_tokenizer(): built on first need
        self.special_texts = special_texts
        self.marks = Marks(special_texts)
        self.special_ids = {i for i in map(tokenizer.token_to_id, special_texts) if i is not None}

    def render(self, messages: list[dict], gen: bool, tools: list | None = None,
               documents: list | None = None) -> str:
        from ...chat_template import render_chat

        return render_chat(self.template, messages, gen, self.special, tools, documents=documents)

    @functools.cached_property
    def documents_native(self) -> bool:
        """The template has a documents section of its own (it reads `documents`, as HF's
        apply_chat_template(documents=...) passes them: Granite, Command R, ...)."""
        if not self.template:
            return False
        import jinja2
        from jinja2 import meta

        try:
            return "documents" in meta.find_undeclared_variables(jinja2.Environment().parse(self.template))
        except jinja2.TemplateError:
            return False

    def prompt(self, task: str | None, info, messages: list[dict], room: int | None = None,
               tools=None, pieces: tuple[str, ...] = (), documents: list | None = None) -> ChatPrompt:
        """room: the tokens the input may take; a conversation beyond it fails before its turn
        boundaries are rendered (one render per earlier turn). pieces: texts the rendered prompt
        holds in this order (composed documents), each tokenized on its own; their token spans
        are returned (a piece not found: no spans)."""
        if self.template is None:
            raise PrefixEdgeError("this bundle's model has no chat template: send a single user "
                                  "message to a task, or a prompt (completions)", param="messages")
        if info is not None and not info.chat:
            raise PrefixEdgeError(f"task '{task}' is not a chat task (chat = false: a completion "
                                  "prompt): it takes one user message, without system messages "
                                  "or history", param="messages")
        if info is not None and info.chat_messages is None:
            raise PrefixEdgeError(f"task '{task}': this bundle was exported before conversations "
                                  "(no task messages in its manifest): re-export it for history "
                                  "and system messages", param="messages")
        own = [dict(m) for m in info.chat_messages] if info is not None else []
        template = info.template if info is not None else "{input}"
        is_native = native(self.template)
        user = messages if is_native else [parsed_args(m) for m in messages]
        marks = None
        if self.marks.needed(user, tools):  # user text that spells a special token: marked
            marks = self.marks.choose(strings([user, tools.tools if tools else None, own, template,
                                               self.template, self.special]))
            user, tools = [marks.mark_message(m) for m in user], marks.mark_tools(tools)
        msgs = [{**m, "content": fill_template(template, m["content"])} if m["role"] == "user" else m
                for m in user]
        msgs, offered = for_template(msgs, tools, is_native)
        head = self.render(own, False, documents=documents) if own else ""
        full = self.render(own + msgs, True, offered, documents)
        if not full.startswith(head):
            raise PrefixEdgeError(f"task '{task}': the chat template does not render this "
                                  "conversation after the task's own messages", param="messages")
        text = rendered = full[len(head):]
        protected: list[tuple[int, int]] = []
        moved = None
        if marks is not None:  # the user's text back, and where it was marked
            text, protected, moved = marks.unmark(rendered)
        whole = None  # the text tokenized at once: counted against room, its token starts for _cuts
        if room is not None:
            # a text far past room is counted a chunk at a time first (never tokenized whole);
            # one within 64 characters a token of it is tokenized once, here
            if (len(text) > 64 * (room + 8) and longer_than(self.tok, text, room + 8)) or \
                    len((whole := self.tok.encode(text, add_special_tokens=False)).ids) > room + 8:
                from ...errors import ContextLengthExceeded

                raise ContextLengthExceeded(f"the conversation is over the {room} tokens a request "
                                            "may use after the task's prefix (n_ctx)")
        char_cuts = self._cuts(own, msgs, offered, head, rendered, text, moved, whole, documents)
        found, at = [], 0
        for piece in pieces:
            i = text.find(piece, at)
            if i < 0 or any(a < i + len(piece) and b > i for a, b in protected):
                found = []
                break
            found.append((i, i + len(piece)))
            at = i + len(piece)
        bounds = sorted(set(char_cuts) | {c for span in found for c in span} - {0, len(text)})
        ids, cuts, at, where = [], [], 0, {0: 0}
        for c in bounds + [len(text)]:
            ids += self._encode(text, at, c, protected)
            cuts.append(len(ids))
            where[c] = len(ids)
            at = c
        return ChatPrompt(np.array(ids, np.int64), tuple(cuts[i] for i, c in enumerate(bounds) if c in char_cuts),
                          messages, tuple((where[a], where[b]) for a, b in found))

    def _cuts(self, own: list, msgs: list, offered, head: str, rendered: str, text: str,
              moved=None, whole=None, documents=None) -> list[int]:
        """Where chunks break in `text`: each earlier turn's prompt end (after its generation
        prompt: where the next turn resumes) and the end of each other message followed by one
        that is not a reply, where a token starts there (a system message of documents, resent
        with a new question, is reused up to its end). Found in the `rendered` text (the marked
        one), `moved` to the text."""
        found = set()
        for i in range(1, len(msgs)):
            # before a reply only the turn's prompt end: a first turn's prompt has no cut
            turn = msgs[i]["role"] == "assistant" and msgs[i - 1]["role"] != "assistant"
            for gen in (True,) if turn else (False,):
                s = self.render(own + msgs[:i], gen, offered, documents)
                n = len(s) - len(head)
                if s.startswith(head) and rendered.startswith(s[len(head):]) and 0 < n < len(rendered):
                    found.add((moved(n) if moved else n, gen))
        if not found:
            return []
        whole = whole if whole is not None else self.tok.encode(text, add_special_tokens=False)
        starts = {a for a, _ in whole.offsets}
        return sorted({n for n, gen in found if gen or n in starts})

    def _encode(self, text: str, lo: int, hi: int, protected: list[tuple[int, int]]) -> list[int]:
        """text[lo:hi] as ids: the marked spans as plain text (special tokens split), the rest
        as the template wrote it, where every special token must be the template's own."""
        out, at = [], lo
        for a, b in protected:
            a, b = max(a, lo), min(b, hi)
            if a >= b:
                continue
            if a > at:
                out += self._live(text[at:a])
            out += self._text_tok().encode(text[a:b], add_special_tokens=False).ids
            at = b
        if hi > at:
            out += self._live(text[at:hi])
        return out

    def _live(self, piece: str) -> list[int]:
        ids = self.tok.encode(piece, add_special_tokens=False).ids
        pattern = self.marks.pattern
        want = len(pattern.findall(piece)) if pattern is not None else 0
        if sum(i in self.special_ids for i in ids) != want:
            raise PrefixEdgeError("the chat template joins message text into a special token: "
                                  "this conversation cannot be tokenized safely", param="messages")
        return ids
