"""One request's constraint never harms the process or another request (issue 40, items 0-1).

- Bounds (constraint_limits.py): a spec too deep (a `$ref` chain, chained Lark rules, nested
  groups) or too large is refused in Python before llguidance sees it; real specs pass.
- In-process, in a subprocess (a regression that crashes must not take pytest down): the
  ~1,000-`$ref` schema and the ~3,000-rule grammar that segfaulted are one-line errors; a spec
  at the bounds compiles and decodes; 4x past them the compiler's own thread still holds it.
- Containment: a constraint that fails at a masked step (a recursive schema the model is
  steered into) ends that request alone with an OptionError naming its field; three plain
  requests decoding beside it give exactly the tokens of their lone runs (both engines).
- Export refuses a task whose default constraint or logit_bias would fail every run.
- Server: a hostile response_format is a 400 naming `response_format` (`text.format` on
  /v1/responses), at admission and mid-decode, while three plain streams complete normally.
"""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from prefix_edge import PrefixEdgeError, Runtime
from prefix_edge.constraint_limits import MAX_CHARS, MAX_DEPTH, MAX_RULES, json_depth, problem
from prefix_edge.options import OptionError
from prefix_edge.tasks import load_tasks

from .conftest import INPUTS

pytest.importorskip("llguidance")


def chain_schema(links: int) -> dict:
    """Definitions each holding a reference to the next (the shape that overflowed the stack)."""
    defs = {f"d{i}": {"type": "object", "properties": {"c": {"$ref": f"#/$defs/d{i + 1}"}}, "required": ["c"]}
            for i in range(links)}
    defs[f"d{links}"] = {"type": "integer"}
    return {"$defs": defs, "$ref": "#/$defs/d0"}


def chain_grammar(rules: int) -> str:
    return "start: r0\n" + "".join(f"r{i}: r{i + 1}\n" for i in range(rules)) + f'r{rules}: "x"\n'


RECURSIVE = {"$defs": {"n": {"type": "object", "properties": {"c": {"$ref": "#/$defs/n"}}, "required": ["c"]}},
             "$ref": "#/$defs/n"}
SELF_REF = {"type": "object", "properties": {"c": {"$ref": "#"}}, "required": ["c"]}
# a number, or the endless object: admitted (its first steps allow digits), and it fails at a
# masked step once the model is steered to `{` (the request's own logit_bias bans the digits)
LATE = {"anyOf": [{"type": "integer"}, {"$ref": "#/$defs/n"}], "$defs": RECURSIVE["$defs"]}

# real schemas: a pydantic-style model with nested definitions, an OpenAI tool's parameters
PYDANTIC = {
    "$defs": {
        "Address": {"type": "object", "properties": {"street": {"type": "string"}, "city": {"type": "string"},
                                                     "geo": {"$ref": "#/$defs/Geo"}},
                    "required": ["street", "city"]},
        "Geo": {"type": "object", "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}}},
        "Person": {"type": "object", "properties": {"name": {"type": "string"},
                                                    "address": {"$ref": "#/$defs/Address"},
                                                    "friends": {"type": "array", "items": {"$ref": "#/$defs/Person"}}},
                   "required": ["name"]},
    },
    "type": "object", "properties": {"people": {"type": "array", "items": {"$ref": "#/$defs/Person"}}},
}
TOOL = {"type": "object", "properties": {
    "location": {"type": "string", "description": "City and country"},
    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    "days": {"type": "array", "items": {"type": "object", "properties": {
        "date": {"type": "string", "format": "date"}, "hours": {"type": "array", "items": {"type": "integer"}}}}},
}, "required": ["location"], "additionalProperties": False}
EXPR = 'start: expr\nexpr: expr "+" term | term\nterm: term "*" atom | atom\natom: NUMBER | "(" expr ")"\nNUMBER: /[0-9]+/\n'


# -- bounds (unit) -----------------------------------------------------------------------------
def test_real_specs_are_within_bounds():
    for schema in (PYDANTIC, TOOL, RECURSIVE, SELF_REF, LATE, {"type": "object"}):
        assert problem("json_schema", schema) is None, schema
    assert problem("json_schema", True) is None
    assert problem("grammar", EXPR) is None
    assert problem("grammar", "start: " + " | ".join(f'"w{i}"' for i in range(30000)) + "\n") is None  # wide, not deep
    assert problem("regex", r"(yes|no), [0-9]+ \((a|b(c|d))\)") is None
    assert problem("regex", r"[(]{300}\(x\)") is None  # parentheses in a class are no groups


def test_json_depth_follows_refs_once():
    assert json_depth({"type": "integer"}) == 1
    # root -> properties -> a -> (the $ref's target) Geo -> properties -> lat
    s = {"properties": {"a": {"$ref": "#/$defs/Geo"}}, "$defs": {"Geo": {"properties": {"lat": {"type": "number"}}}}}
    assert json_depth(s) == 6
    assert json_depth(RECURSIVE) == json_depth(RECURSIVE["$defs"]) + 1  # the recursion counts once
    assert json_depth(chain_schema(10)) == 1 + 1 + 3 * 10 + 1  # the root, $defs, three a link, the last
    assert json_depth(chain_schema(10_000)) == MAX_DEPTH + 1  # stops counting past the bound


@pytest.mark.parametrize("kind, value, needle", [
    ("json_schema", chain_schema(1000), f"more than {MAX_DEPTH} levels deep (following $ref)"),
    ("json_schema", chain_schema(MAX_DEPTH // 3 + 1), f"more than {MAX_DEPTH} levels"),
    ("grammar", chain_grammar(3000), f"nests more than {MAX_DEPTH} levels deep"),
    ("grammar", "start: " + "(" * 300 + '"x"' + ")" * 300 + "\n", "levels deep"),
    ("grammar", "".join(f'r{i}: "x"\n' for i in range(MAX_RULES + 1)), f"more than {MAX_RULES:,} rules"),
    ("grammar", "start: call\ncall: %json " + json.dumps(chain_schema(1000)) + "\n", "%json schema of rule 'call'"),
    ("regex", "(" * 300 + "a" + ")" * 300, "nests 300 groups deep"),
    ("regex", "a" * (MAX_CHARS + 1), f"at most {MAX_CHARS:,}"),
    ("json_schema", {"enum": ["x" * 1000] * 1100}, f"at most {MAX_CHARS:,}"),
    ("json_schema", {"enum": [{1, 2}]}, "not a JSON document"),
])
def test_over_the_bounds_is_one_line(kind, value, needle):
    msg = problem(kind, value)
    assert msg is not None and needle in msg and "\n" not in msg, msg


def test_a_deep_python_dict_is_refused_without_recursion():
    deep: dict = {"type": "integer"}
    for _ in range(100_000):  # far past Python's recursion limit: counted iteratively
        deep = {"anyOf": [deep]}
    assert f"more than {MAX_DEPTH} levels" in problem("json_schema", deep)


def test_task_file_refuses_a_spec_over_the_bounds(tmp_path):
    p = tmp_path / "tasks.toml"
    grammar = chain_grammar(3000).replace('"', '\\"').replace("\n", "\\n")
    p.write_text(f'[task.deep]\nsystem = "x"\ngrammar = "{grammar}"\n', encoding="utf-8")
    with pytest.raises(PrefixEdgeError) as e:
        load_tasks(p)
    msg = str(e.value)
    assert "task 'deep'" in msg and "key 'grammar'" in msg and "levels deep" in msg and "\n" not in msg


def test_a_temperature_too_small_to_scale_by_is_greedy():
    """A request's own option may not fail at a step: temperature 1e-320 (in [0, 2]) overflowed
    the scaled logits to NaN probabilities; it is greedy, as its limit."""
    import numpy as np

    from prefix_edge.runtime.decode.sampling import Sampler

    logits = np.random.default_rng(0).normal(size=400).astype(np.float32) * 8
    for t in (1e-320, 1e-300):
        assert Sampler(temperature=t, seed=1)(logits) == int(np.argmax(logits))
    masked = np.where(np.arange(400) % 7 == 0, logits, -np.inf).astype(np.float32)
    assert Sampler(temperature=1e-320, seed=1)(masked) == int(np.argmax(masked))


# -- in a subprocess: what crashed the process ---------------------------------------------------
CRASHERS = """
import json, sys
from prefix_edge import Runtime, PrefixEdgeError
from prefix_edge.constraint_limits import MAX_DEPTH
from prefix_edge.runtime.decode.constraint import on_big_stack
""" + inspect.getsource(chain_schema) + inspect.getsource(chain_grammar) + """
out = {}
with Runtime.open(sys.argv[1], backend="gguf") as rt:
    for name, kw in [("schema", {"json_schema": chain_schema(1000)}), ("grammar", {"grammar": chain_grammar(3000)})]:
        try:
            rt.generate("support", "hello", max_tokens=8, **kw)
            out[name] = "answered"
        except PrefixEdgeError as e:
            out[name] = [getattr(e, "field", None), str(e)]
    # at the bounds: compiled, and decoded (the engine thread masks every step)
    r = rt.generate("support", "hello", max_tokens=120, json_schema=chain_schema(MAX_DEPTH // 3 - 1))
    out["at_bound_schema"] = [r.stats.finish_reason, r.text]
    r = rt.generate("support", "hello", max_tokens=8, grammar=chain_grammar(MAX_DEPTH - 2))
    out["at_bound_grammar"] = [r.stats.finish_reason, r.text]
    # 4x past the bound (past what an 8 MiB stack holds): the compiler's own thread holds it
    out["big_stack"] = on_big_stack(rt.grammars._compile, "json_schema", json.dumps(chain_schema(1000)))[0]
print(json.dumps(out))
"""


def test_deep_specs_are_refused_in_process(bundle_int4):
    p = subprocess.run([sys.executable, "-c", CRASHERS, str(bundle_int4)], capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, f"exit {p.returncode}\n{p.stdout}\n{p.stderr[-2000:]}"
    out = json.loads(p.stdout.splitlines()[-1])
    field, msg = out["schema"]
    assert field == "json_schema" and msg.startswith("json_schema: the schema nests more than 256") and "\n" not in msg
    field, msg = out["grammar"]
    assert field == "grammar" and msg.startswith("grammar: rule ") and "levels deep" in msg and "\n" not in msg
    finish, text = out["at_bound_schema"]
    assert finish == "length" and text.startswith('{"c": {"c": {"c": '), out
    assert out["at_bound_grammar"] == ["eos", "x"], out
    assert out["big_stack"] is True


# -- containment on a real runtime -------------------------------------------------------------
BAN_EOS = {2: -100}  # the tiny model's EOS: plain requests run their whole max_tokens


def _hostile_bias(tokenizer) -> dict:
    """The request's own logit_bias that steers it off LATE's numbers, into its endless object."""
    ids = [i for i in range(tokenizer.get_vocab_size()) if tokenizer.decode([i])[:1] in set("-0123456789")]
    assert 0 < len(ids) <= 300
    return {i: -100 for i in ids}


@pytest.mark.parametrize("backend", ["onnx", "gguf"])
def test_a_failing_constraint_ends_its_request_only(bundle_int4, backend):
    with Runtime.open(bundle_int4, backend=backend, slots=4) as rt:
        alone = [rt.generate("support", t, max_tokens=24, logit_bias=BAN_EOS).tokens for t in INPUTS]
        # refused at the call, before anything runs: compile + the first steps walked
        for opts in ({"json_schema": RECURSIVE}, {"json_schema": SELF_REF}):
            with pytest.raises(OptionError) as e:
                rt.stream("support", INPUTS[0], **opts)
            assert e.value.field == "json_schema" and "\n" not in str(e.value)
        # admitted, fails at a masked step: hold the engine so all four start in one step
        inside, gate = threading.Event(), threading.Event()
        holder = threading.Thread(target=rt._sched.run_in_engine,
                                  args=(lambda s: (inside.set(), gate.wait(60)),))
        holder.start()
        assert inside.wait(60)
        plain = [rt.stream("support", INPUTS[0], max_tokens=24, logit_bias=BAN_EOS)]
        hostile = rt.stream("support", INPUTS[1], json_schema=LATE, logit_bias=_hostile_bias(rt.tokenizer), max_tokens=24)
        plain += [rt.stream("support", t, max_tokens=24, logit_bias=BAN_EOS) for t in INPUTS[1:]]
        gate.set()
        holder.join()
        with pytest.raises(OptionError) as e:
            "".join(hostile)
        assert e.value.field == "json_schema" and str(e.value).startswith("json_schema: ")
        assert "\n" not in str(e.value) and "Too many items" in str(e.value)
        for s, want in zip(plain, alone):
            text = "".join(s)
            assert s.result.stats.finish_reason == "length" and s.result.tokens == want
            assert text == s.result.text
        # and the runtime goes on as before
        assert rt.generate("support", INPUTS[2], max_tokens=24, logit_bias=BAN_EOS).tokens == alone[2]


def test_compiled_specs_are_kept_within_a_bound(bundle_int4):
    from prefix_edge.runtime.decode.constraint import CACHE_ENTRIES

    with Runtime.open(bundle_int4, backend="gguf") as rt:
        for i in range(CACHE_ENTRIES + 16):
            assert rt.generate("support", INPUTS[0], regex=f"[a-z]{{{i + 1}}}", max_tokens=4).text.isalpha()
        assert len(rt.grammars._cache) == CACHE_ENTRIES
        for _ in range(2):  # a refused spec's verdict is kept too: the same one line again
            with pytest.raises(OptionError) as e:
                rt.stream("support", INPUTS[0], json_schema=RECURSIVE)
            assert "Too many items" in str(e.value)
        assert len(rt.grammars._cache) == CACHE_ENTRIES


# -- export ------------------------------------------------------------------------------------
@pytest.mark.parametrize("line, key, needle", [
    ('regex = "(unclosed"', "regex", "regex: "),
    ('logit_bias = { "99999" = 5.0 }', "logit_bias", "token id 99999 is outside"),
    ('regex = "' + "(" * 300 + "a" + ")" * 300 + '"', "regex", "nests 300 groups deep"),
    ('json_schema = { "$defs" = { n = { type = "object", properties = { c = { "$ref" = "#/$defs/n" } }, '
     'required = ["c"] } }, "$ref" = "#/$defs/n" }', "json_schema", "Too many items"),
])
def test_export_refuses_a_default_that_fails_every_run(tiny_model, tmp_path, line, key, needle):
    from prefix_edge.export.build import export_bundle

    tasks = tmp_path / "tasks.toml"
    tasks.write_text(f'[task.bad]\nsystem = "x"\n{line}\n', encoding="utf-8")
    out = tmp_path / "bundle"
    with pytest.raises(PrefixEdgeError) as e:
        export_bundle(tiny_model, tasks, out, quantize="none", gguf_quant="f32", progress=False)
    msg = str(e.value)
    assert "task 'bad'" in msg and f"key '{key}'" in msg and needle in msg and "\n" not in msg, msg
    assert not out.exists()


# -- the server --------------------------------------------------------------------------------
def test_server_hostile_format_is_a_400_and_others_stream_on(bundle_int4):
    openai = pytest.importorskip("openai")
    pytest.importorskip("fastapi")
    pytest.importorskip("llama_cpp")
    from tokenizers import Tokenizer

    from prefix_edge.bundle import layout

    from .helpers.serve import start_server, stop_server

    proc, base = start_server(bundle_int4, "--backend", "gguf", "--slots", "4")
    try:
        client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=300)
        bias = {"2": -100}
        digits = {str(k): v for k, v in _hostile_bias(Tokenizer.from_file(str(bundle_int4 / layout.TOKENIZER))).items()}

        def plain(text: str) -> tuple[str, str | None]:
            parts, finish = [], None
            for ch in client.chat.completions.create(
                    model="support", messages=[{"role": "user", "content": text}], max_tokens=48,
                    logit_bias=bias, stream=True):
                if ch.choices:
                    parts.append(ch.choices[0].delta.content or "")
                    finish = ch.choices[0].finish_reason or finish
            return "".join(parts), finish

        alone = [plain(t) for t in INPUTS]
        # refused at admission: the deep schema, and the recursive one (its first steps fail)
        for schema in (chain_schema(1000), RECURSIVE):
            with pytest.raises(openai.BadRequestError) as e:
                client.chat.completions.create(
                    model="support", messages=[{"role": "user", "content": "hi"}], max_tokens=8,
                    response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
            assert e.value.status_code == 400 and e.value.param == "response_format"
        with pytest.raises(openai.BadRequestError) as e:
            client.responses.create(model="support", input="hi", max_output_tokens=8,
                                    text={"format": {"type": "json_schema", "name": "x",
                                                     "schema": chain_schema(1000)}})
        assert e.value.param == "text.format"
        late = {"type": "json_schema", "json_schema": {"name": "x", "schema": LATE}}
        with pytest.raises(openai.APIError) as e:  # streamed: the error frame names the field
            for _ in client.chat.completions.create(
                    model="support", messages=[{"role": "user", "content": INPUTS[1]}], max_tokens=24,
                    logit_bias=digits, response_format=late, stream=True):
                pass
        assert e.value.param == "response_format" and e.value.type == "invalid_request_error"
        assert "Too many items" in e.value.message

        # fails mid-decode beside three plain streams (most likely while they decode; the
        # in-process test above holds the engine to make sure): a 400 for it, the others as alone
        def hostile():
            try:
                client.chat.completions.create(
                    model="support", messages=[{"role": "user", "content": INPUTS[1]}], max_tokens=24,
                    logit_bias=digits, response_format=late)
            except openai.BadRequestError as e:
                return e.status_code, e.param, e.message
            return None

        with ThreadPoolExecutor(4) as pool:
            futs = [pool.submit(plain, t) for t in INPUTS]
            bad = pool.submit(hostile)
            got = [f.result() for f in futs]
            status = bad.result()
        assert got == alone and all(f == "length" for _, f in got)
        assert status is not None and status[0] == 400 and status[1] == "response_format", status
        assert "Too many items" in status[2]
    finally:
        rc, err = stop_server(proc)
    assert rc == 0 and "Traceback" not in err, err
