"""Chat-template rendering is bounded (template_budget.py): a template that loops, recurses or
builds text beyond the budget stops with one TemplateBudgetError line, never an
OverflowError/MemoryError/RecursionError traceback and never a run until killed; an ordinary
template renders exactly as plain jinja2 renders it (the reference: jinja2's own sandbox with
transformers' settings). Export refuses a template over the budget before the bundle exists."""

from __future__ import annotations

import json
import shutil

import pytest

from prefix_edge.chat_template import TemplateBudgetError, check_template, render_chat
from prefix_edge.errors import PrefixEdgeError

from .conftest import CHATML

MSGS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi there"},
        {"role": "assistant", "content": "Hello!\nHow can I help?"}, {"role": "user", "content": "naïve café 🚀"}]

# each goes over one budget (time is tested on its own, with a small budget)
OVER = {
    "range(10**12)": "{% for i in range(10**12) %}x{% endfor %}",
    "range literal": "{% for i in range(1000000000000) %}x{% endfor %}",
    "'x'*10**9": "{{ 'x' * 10**9 }}",
    "[x]*10**9": "{{ ['x'] * 1000000000 }}",
    "10**10**10": "{{ 10 ** 10000000000 }}",
    "2**10**8": "{{ 2 ** 100000000 }}",
    "big product": "{% set n = 10 ** 1000 %}{{ n * n * n * n * n }}",
    "float power": "{{ 10.0 ** 1000 }}",
    "macro recursion": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "~ doubling": "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
    "+ doubling": "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
    "set-block doubling": "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set t %}{{ ns.s }}{{ ns.s }}"
                          "{% endset %}{% set ns.s = t %}{% endfor %}",
    "output": "{% for i in range(100000) %}{{ 'y' * 1000 }}{% endfor %}",
    "center": "{{ 'x' | center(1000000000) }}",
    "ljust": "{{ 'x'.ljust(1000000000) }}",
    "format width": "{{ '{:>1000000000}'.format(1) }}",
    "% width": "{{ '%1000000000d' % 1 }}",
    "% star width": "{{ '%*d' % (1000000000, 1) }}",
    "format filter": "{{ '%1000000000s' | format('x') }}",
    "replace growth": "{% set ns = namespace(s='a' * 1000) %}{% for i in range(64) %}"
                      "{% set ns.s = ns.s | replace('a', 'aa') %}{% endfor %}",
    "str.replace": "{{ ('a' * 10000).replace('a', 'b' * 10000) }}",
    "join": "{{ range(100000) | join('x' * 1000000) }}",
    "str.join": "{{ ('x' * 1000000).join(['a'] * 100000) }}",
    "indent": "{{ ('x\n' * 100000) | indent('y' * 100000) }}",
    "lipsum": "{{ lipsum(1000000) }}",
    "shared list": "{% set a = ['x' * 100000] * 300 %}{{ [a, a, a, a, a, a, a, a, a, a] * 30 }}",
    "tojson shared": "{% set a = ['x' * 1000000] * 30 %}{{ [a, a, a, a, a, a, a, a, a, a, a, a] | tojson }}",
    "tojson indent": "{% set a = range(30000) | list %}{{ [a, a, a, a, a, a, a, a, a, a] | tojson(indent=1000) }}",
    "deep data": "{% set ns = namespace(a=[]) %}{% for i in range(5000) %}{% set ns.a = [ns.a] %}{% endfor %}"
                 "{{ ns.a | tojson }}",
}


@pytest.mark.parametrize("name", sorted(OVER))
def test_over_budget_is_one_line(name):
    with pytest.raises(TemplateBudgetError) as e:
        render_chat(OVER[name], MSGS, True, {})
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("the model's chat template went over its budget")


def test_time_budget():
    loops = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    wide = ("{% macro f(n) %}{% if n < 40 %}{{ f(n + 1) }}{{ f(n + 1) }}{% endif %}{% endmacro %}"
            "{{ f(0) }}")
    for t in (loops, wide):
        with pytest.raises(TemplateBudgetError, match="s of CPU time"):
            render_chat(t, MSGS, True, {}, seconds=0.2)


def test_invalid_and_deep_templates_are_one_line():
    for t, needle in (("{% for %}", "not valid Jinja"),
                      ("{{ " + "(" * 5000 + "1" + ")" * 5000 + " }}", "nests too deeply"),
                      ("{{ messages[0].content - 1 }}", "failed on this conversation"),
                      ("{{ raise_exception('no system role') }}", "refused this conversation")):
        with pytest.raises(PrefixEdgeError, match=needle) as e:
            render_chat(t, MSGS, True, {})
        assert "\n" not in str(e.value)


# ordinary templates, in the shapes real models use, with the constructs the instrumentation
# touches: loops (loop.last/length/index, recursive, else), macros, set blocks, `~`, + * %,
# filters (join, indent, tojson, replace, format, center, trim), str methods, namespace
ORDINARY = {
    "chatml": CHATML,
    "loops": ("{% for m in messages %}{{ loop.index }}/{{ loop.length }} {{ m.role | upper }}: "
              "{{ m.content | trim }}{% if not loop.last %}\n{% endif %}{% else %}none{% endfor %}"
              "{% if add_generation_prompt %}\nassistant:{% endif %}"),
    "macros": ("{% macro turn(m, sep='\n') %}[{{ m.role }}]{{ sep }}{{ m.content }}{% endmacro %}"
               "{% for m in messages %}{{ turn(m) }}{{ '\n' * 2 }}{% endfor %}"),
    "set block": ("{% set ns = namespace(sys='') %}{% for m in messages if m.role == 'system' %}"
                  "{% set ns.sys = ns.sys ~ m.content %}{% endfor %}{% set head %}<<SYS>>{{ ns.sys }}"
                  "<</SYS>>{% endset %}{{ head | indent(2, first=True) }}\n"
                  "{{ messages | map(attribute='content') | join(' | ') }}"),
    "filters": ("{{ messages | tojson }}\n{{ messages[-1] | tojson(indent=2) }}\n"
                "{{ 'x' | center(9) }}|{{ '%05d|%s' | format(42, 'a') }}|{{ '%-4s|' % 'ab' }}"
                "{{ '{}-{}'.format(1, 2) }}|{{ 'a,b'.split(',') | join('+') }}|{{ 'ab'.ljust(5, '.') }}"
                "{{ messages[-1].content | replace('\n', ' / ') }}|{{ (2 ** 10) * 3 + 1 }}"
                "|{{ [1, 2] + [3] }}|{{ ('ab' * 3)[1:4] }}"),
    "recursive": ("{% set tree = [{'n': 'a', 'c': [{'n': 'b', 'c': []}, {'n': 'c', 'c': [{'n': 'd', 'c': []}]}]}] %}"
                  "{% for x in tree recursive %}{{ x.n }}({{ loop(x.c) }}){% endfor %}"),
}


def _plain(template: str, msgs, gen: bool) -> str:
    """The reference: jinja2's own sandbox, as transformers configures it, uninstrumented."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
    return env.from_string(template).render(messages=msgs, tools=None, documents=None,
                                            add_generation_prompt=gen)


@pytest.mark.parametrize("name", sorted(ORDINARY))
def test_ordinary_templates_render_as_plain_jinja(name):
    for msgs in (MSGS, MSGS[1:2], MSGS * 50):
        for gen in (True, False):
            assert render_chat(ORDINARY[name], msgs, gen, {}) == _plain(ORDINARY[name], msgs, gen)


def test_export_check():
    check_template(CHATML, {})
    check_template(None, {})
    # a template that refuses a sample's shape (no system role) is its own rule, not a budget
    check_template("{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('no system') }}"
                   "{% endif %}{{ m.content }}{% endfor %}", {})
    with pytest.raises(PrefixEdgeError, match="budget.*sample conversation") as e:
        check_template(OVER["'x'*10**9"], {})
    assert "\n" not in str(e.value)


def test_export_refuses_a_template_over_budget(tiny_model, tasks_file, tmp_path):
    """The bundle is never written: refused while reading the model's tokenizer."""
    from prefix_edge.export.build import export_bundle

    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    cfg_path = model / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = OVER["range(10**12)"]
    cfg_path.write_text(json.dumps(cfg))
    (model / "chat_template.jinja").unlink(missing_ok=True)
    out = tmp_path / "bundle"
    with pytest.raises(PrefixEdgeError, match="range") as e:
        export_bundle(model, tasks_file, out, quantize="none", gguf_quant="f32", progress=False)
    assert "\n" not in str(e.value)
    assert not out.exists() and not list(tmp_path.glob(".bundle.*"))
