"""A model's own chat template rendered as transformers' `apply_chat_template` renders it,
within a budget.

The same sandboxed Jinja environment (trim_blocks, lstrip_blocks, loop controls, a
`{% generation %}` block that renders its body), the same `tojson`, `raise_exception` and
`strftime_now`, and the same variables: `messages`, `tools`, `documents`,
`add_generation_prompt` and the tokenizer's special tokens (`bos_token`, `eos_token`, ...).
Export renders task prefixes with it and the runtime renders conversations with it, so neither
needs transformers. A compiled template is kept per template text.

A template is code from whoever exported the bundle: one rendering has a budget of CPU time,
characters, call depth and number sizes (template_budget.py), checked as it runs (its syntax
tree is instrumented at compile time), and one over it stops with one TemplateBudgetError line.
Export renders sample conversations with the template it writes (check_template), so such a
template is refused before the bundle exists.
"""

from __future__ import annotations

import functools
import json
import types
from datetime import datetime
from typing import Any

from . import template_budget as budget
from .errors import PrefixEdgeError
from .template_budget import TemplateBudgetError

__all__ = ["TemplateBudgetError", "check_template", "render_chat", "template_specials"]
_LOOP, _CONCAT, _OUT = "__prefix_edge_loop", "__prefix_edge_concat", "__prefix_edge_out"


@functools.lru_cache(maxsize=8)
def _compiled(template: str):
    import jinja2
    from jinja2 import nodes
    from jinja2.ext import Extension
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    from jinja2.utils import generate_lorem_ipsum
    from jinja2.visitor import NodeTransformer

    class Generation(Extension):  # transformers' AssistantTracker, without the tracking
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    def through(name, value, lineno):  # a filter: called directly, not through the sandbox's call()
        return nodes.Filter(value, name, [], [], None, None, lineno=lineno)

    def parts(items, lineno):
        return nodes.Tuple(list(items), "load", lineno=lineno)

    class Instrument(NodeTransformer):
        """Every loop, `~` and output through the budget's checks."""

        def visit_For(self, node):
            node = self.generic_visit(node)
            node.iter = through(_LOOP, node.iter, node.lineno)
            return node

        def visit_Concat(self, node):
            return through(_CONCAT, parts(self.generic_visit(node).nodes, node.lineno), node.lineno)

        def visit_Output(self, node):
            node = self.generic_visit(node)
            node.nodes = [through(_OUT, parts(node.nodes, node.lineno), node.lineno)] if node.nodes else []
            return node

    class Bounded(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**", "+", "%"})

        def _parse(self, source, name, filename):
            tree = Instrument().visit(super()._parse(source, name, filename))
            tree.set_environment(self)
            return tree

        def call_binop(self, context, operator, left, right):
            if operator == "+" and type(left) is str and type(right) is str:  # the common case
                budget.over(len(left) + len(right), "a concatenation")
                return left + right
            budget.tick()
            budget.binop_check(operator, left, right)
            return budget.sized(super().call_binop(context, operator, left, right))

        def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja2's signature)
            if isinstance(__obj, types.BuiltinMethodType):
                args = budget.method_check(__obj, args, kwargs)
            with budget.nested():
                return budget.sized(super().call(__context, __obj, *args, **kwargs))

        def wrap_str_format(self, value):
            wrapped = super().wrap_str_format(value)
            if wrapped is None:
                return None
            fmt = value.__self__

            def bounded(*args, **kwargs):
                budget.check_format(fmt, (*args, *kwargs.values()))
                return budget.sized(wrapped(*args, **kwargs))
            return bounded

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        if indent is None:
            return json.dumps(x, ensure_ascii=ensure_ascii, separators=separators, sort_keys=sort_keys)
        out, n = [], 0  # indented: written piece by piece, within the budget
        for piece in json.JSONEncoder(ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                                      sort_keys=sort_keys).iterencode(x):
            n += len(piece)
            budget.over(n, "tojson")
            out.append(piece)
        return "".join(out)

    def strftime_now(fmt):
        budget.over(len(str(fmt)) * 64, "strftime_now()")
        return datetime.now().strftime(fmt)

    def lipsum(n=5, html=True, min=20, max=100):  # noqa: A002 (jinja2's names)
        budget.over(int(n) * int(max) * 16, "lipsum()")
        return generate_lorem_ipsum(n, html, min, max)

    env = Bounded(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, "jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.filters = {name: budget.bounded_filter(name, f) for name, f in env.filters.items()}
    env.filters.update({_LOOP: budget.loop, _CONCAT: budget.concat, _OUT: budget.out})
    env.globals.update({"raise_exception": raise_exception, "strftime_now": strftime_now,
                        "lipsum": lipsum, "range": budget.safe_range})
    try:
        return env.from_string(template)
    except jinja2.TemplateError as e:
        raise PrefixEdgeError(f"the chat template is not valid Jinja: {_line(e)}") from None
    except (RecursionError, MemoryError) as e:
        raise PrefixEdgeError(f"the chat template is not valid Jinja: it nests too deeply "
                              f"({type(e).__name__})") from None


def _line(e: BaseException) -> str:
    s = str(e).strip()
    return s.splitlines()[0] if s else type(e).__name__


def render_chat(chat_template: str, messages: list[dict], add_generation_prompt: bool,
                special: dict[str, Any], tools: list | None = None,
                seconds: float | None = None, documents: list | None = None) -> str:
    """The conversation as the model's template spells it (one PrefixEdgeError line if the
    template refuses it, e.g. roles that do not alternate; a TemplateBudgetError if it goes over
    its budget: `seconds` of CPU, default template_budget.RENDER_SECONDS). `documents`: as
    transformers' apply_chat_template(documents=...) passes them."""
    import jinja2

    tpl = _compiled(chat_template)
    try:
        with budget.rendering(seconds):
            ctx = tpl.new_context(dict(messages=messages, tools=tools, documents=documents,
                                       add_generation_prompt=add_generation_prompt, **special))
            return "".join(tpl.root_render_func(ctx))
    except TemplateBudgetError as e:
        raise TemplateBudgetError(f"the model's chat template went over its budget: {e}") from None
    except (RecursionError, MemoryError, OverflowError) as e:
        raise TemplateBudgetError(f"the model's chat template went over its budget: "
                                  f"{type(e).__name__}: {_line(e)}") from None
    except jinja2.TemplateError as e:
        raise PrefixEdgeError(f"the model's chat template refused this conversation: {_line(e)}") from None
    except Exception as e:  # bad shapes in a template: TypeError, KeyError, ...
        raise PrefixEdgeError(f"the model's chat template failed on this conversation: "
                              f"{type(e).__name__}: {_line(e)}") from None


SAMPLES = ([{"role": "user", "content": "Hello!"}],
           [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello!"},
            {"role": "assistant", "content": "Hi."}, {"role": "user", "content": "How are you?"}])


def check_template(chat_template: str | None, special: dict[str, Any]) -> None:
    """Export's check of the template it writes: sample conversations render within the budget
    (a template may refuse a sample's shape, e.g. a system turn: that is its own rule)."""
    if chat_template is None:
        return
    for msgs in SAMPLES:
        for gen in (False, True):
            try:
                render_chat(chat_template, msgs, gen, special)
            except TemplateBudgetError as e:
                raise PrefixEdgeError(f"{e} (rendering a sample conversation at export)") from None
            except PrefixEdgeError:
                pass


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
