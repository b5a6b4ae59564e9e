"""A model's own chat template rendered as transformers' `apply_chat_template` renders it.

The same sandboxed Jinja environment (trim_blocks, lstrip_blocks, loop controls, a
`{% generation %}` block that renders its body), the same `tojson`, `raise_exception` and
`strftime_now`, and the same variables: `messages`, `tools`, `documents`,
`add_generation_prompt` and the tokenizer's special tokens (`bos_token`, `eos_token`, ...).
Export renders task prefixes with it and the runtime renders conversations with it, so neither
needs transformers. A compiled template is kept per template text.
"""

from __future__ import annotations

import functools
import json
from datetime import datetime
from typing import Any

from .errors import PrefixEdgeError


@functools.lru_cache(maxsize=8)
def _compiled(template: str):
    import jinja2
    from jinja2.ext import Extension
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):  # transformers' AssistantTracker, without the tracking
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, "jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(template)
    except jinja2.TemplateError as e:
        raise PrefixEdgeError(f"the chat template is not valid Jinja: {e}") from None


def render_chat(chat_template: str, messages: list[dict], add_generation_prompt: bool,
                special: dict[str, Any], tools: list | None = None) -> str:
    """The conversation as the model's template spells it (one PrefixEdgeError line if the
    template refuses it, e.g. roles that do not alternate)."""
    import jinja2

    try:
        return _compiled(chat_template).render(
            messages=messages, tools=tools, documents=None,
            add_generation_prompt=add_generation_prompt, **special)
    except jinja2.TemplateError as e:
        raise PrefixEdgeError(f"the model's chat template refused this conversation: {e}") from None
    except (TypeError, ValueError, KeyError, AttributeError, IndexError) as e:  # bad shapes in a template
        raise PrefixEdgeError(f"the model's chat template failed on this conversation: "
                              f"{type(e).__name__}: {e}") from None


def template_specials(tok) -> dict[str, Any]:
    """A transformers tokenizer's special tokens as `apply_chat_template` passes them to the
    template (its special_tokens_map: bos_token, eos_token, ..., additional_special_tokens)."""
    out = {}
    for k, v in dict(tok.special_tokens_map).items():
        if isinstance(v, str):
            out[k] = v
        elif isinstance(v, (list, tuple)) and all(isinstance(x, str) for x in v):
            out[k] = list(v)
    return out
