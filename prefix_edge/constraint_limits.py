"""How large and how deep a constraint may be, checked in Python before llguidance (native
code) sees it.

llguidance compiles a grammar by recursion over its rules: a JSON schema chaining ~1,000
`$ref` definitions, or a Lark grammar of ~2,700 chained rules, overflows an 8 MiB thread stack
and takes the process down. Its own limits (items per step, lexer fuel) come later, at a
masked step. So a constraint is refused here, with one line naming what is over which bound:

- MAX_CHARS: characters of the spec (a schema as JSON text, a regex, a grammar);
- MAX_DEPTH: nesting levels. A JSON schema's levels are its objects and lists, a `$ref`
  counting as the levels of what it points to (a recursive reference counts once: recursion
  is compiled as a rule, not unrolled); a Lark grammar's are a rule's groups plus the levels
  of the rules it names (and of a `%json` schema); a regex's are its groups;
- MAX_RULES: rules and terminals of a Lark grammar.

The bounds are far above real specs (a pydantic model nested ten deep is ~40 levels; OpenAI
allows 10 levels of object nesting) and far below what crashes: at MAX_DEPTH the compiler
needs under 1 MiB of stack (measured), and constraint.py runs it on a thread of its own with
64 MiB.
Pure Python, no native code: task files are checked with it at load, requests at admission.
"""

from __future__ import annotations

import json
import re
from typing import Any

MAX_CHARS = 1 << 20
MAX_DEPTH = 256
MAX_RULES = 10_000


def problem(kind: str, value: Any) -> str | None:
    """What makes a constraint too large or too deep for the compiler (None: within bounds).
    kind: json_schema (a dict, or True), regex or grammar (a string)."""
    if kind == "json_schema":
        if value is True or value is None or value is False:
            return None
        depth = json_depth(value)
        if depth > MAX_DEPTH:
            return f"the schema nests more than {MAX_DEPTH} levels deep (following $ref); at most {MAX_DEPTH}"
        try:
            n = len(json.dumps(value, ensure_ascii=False))
        except (TypeError, ValueError, RecursionError) as e:
            return f"not a JSON document: {str(e).splitlines()[0][:200] if str(e) else type(e).__name__}"
        return _size(n)
    if not isinstance(value, str):
        return None  # options.check names the type
    if len(value) > MAX_CHARS:
        return _size(len(value))
    if kind == "regex":
        depth = group_depth(value)
        if depth > MAX_DEPTH:
            return f"the regex nests {depth:,} groups deep; at most {MAX_DEPTH}"
        return None
    return lark_problem(value)


def _size(n: int) -> str | None:
    return f"is {n:,} characters; at most {MAX_CHARS:,}" if n > MAX_CHARS else None


# JSON schemas --------------------------------------------------------------------------------
def _pointer(root: Any, ref: str) -> Any:
    """The node a local `$ref` ("#", "#/$defs/a", "#/properties/x/items") points to, or None."""
    if not ref.startswith("#"):
        return None
    if ref == "#":
        return root
    if not ref.startswith("#/"):
        return None
    from urllib.parse import unquote

    node = root
    for part in ref[2:].split("/"):
        part = unquote(part).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node if isinstance(node, (dict, list)) else None


def _children(root: Any, node: Any) -> list:
    if isinstance(node, dict):
        out = [v for v in node.values() if isinstance(v, (dict, list))]
        ref = node.get("$ref")
        if isinstance(ref, str):
            target = _pointer(root, ref)
            if target is not None:
                out.append(target)
        return out
    return [v for v in node if isinstance(v, (dict, list))]


def json_depth(root: Any, stop: int = MAX_DEPTH) -> int:
    """Levels of objects and lists, a `$ref` counting as its target's levels (a reference back
    to a node being expanded counts nothing). Iterative (a hostile document is not a Python
    recursion); stops counting once past `stop`."""
    if not isinstance(root, (dict, list)):
        return 0
    memo: dict[int, int] = {}
    best: dict[int, int] = {id(root): 0}
    stack = [(root, iter(_children(root, root)))]
    while stack:
        node, it = stack[-1]
        child = next(it, None)
        if child is not None:
            key = id(child)
            if key in memo:
                best[id(node)] = max(best[id(node)], memo[key])
            elif key not in best:  # not on the stack: expand it
                best[key] = 0
                stack.append((child, iter(_children(root, child))))
                if len(stack) > stop:
                    return len(stack)
            continue
        stack.pop()
        memo[id(node)] = d = best.pop(id(node)) + 1
        if d > stop:
            return d
        if stack:
            parent = id(stack[-1][0])
            best[parent] = max(best[parent], d)
    return memo[id(root)]


# regexes -------------------------------------------------------------------------------------
def group_depth(regex: str) -> int:
    """The deepest nesting of a regex's groups (escapes and character classes skipped)."""
    depth = top = 0
    i, n, in_class = 0, len(regex), False
    while i < n:
        c = regex[i]
        if c == "\\":
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
            if regex.startswith("]", i + 1) or regex.startswith("^]", i + 1):
                i += 1 + (regex[i + 1] == "^")  # a leading ] is a literal
        elif c == "(":
            depth += 1
            top = max(top, depth)
        elif c == ")":
            depth = max(0, depth - 1)
        i += 1
    return top


# Lark grammars -------------------------------------------------------------------------------
_LARK = re.compile(r"""
    (?P<comment>//[^\n]*)
  | (?P<string>"(?:\\.|[^"\\\n])*"i?)
  | (?P<regex>/(?:\\.|[^/\\\n])+/[imslux]*)
  | (?P<directive>%[A-Za-z_]+)
  | (?P<define>^[ \t]*[?!]?[A-Za-z_][A-Za-z0-9_]*(?:\.-?[0-9]+)?[ \t]*:)
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<open>[(\[])
  | (?P<close>[)\]])
""", re.X | re.M)
_DEF_NAME = re.compile(r"[?!]?([A-Za-z_][A-Za-z0-9_]*)")
_BRACE = re.compile(r"[ \t]*\{")


def lark_problem(text: str) -> str | None:
    """Rules and nesting of a Lark grammar (llguidance's dialect: `%json {schema}` inline)."""
    refs: dict[str, set[str]] = {}
    own: dict[str, int] = {}  # a rule's own levels: its groups, and an inline JSON schema's
    rule, depth, pos = None, 0, 0
    decoder = json.JSONDecoder()
    while True:
        m = _LARK.search(text, pos)
        if m is None:
            break
        kind, pos = m.lastgroup, m.end()
        if kind == "define":
            rule = _DEF_NAME.match(m.group().strip()).group(1)
            refs.setdefault(rule, set())
            own.setdefault(rule, 1)
            depth = 0
            if len(refs) > MAX_RULES:
                return f"the grammar has more than {MAX_RULES:,} rules; at most {MAX_RULES:,}"
        elif rule is None:
            continue
        elif kind == "name":
            refs[rule].add(m.group())
        elif kind == "open":
            depth += 1
            own[rule] = max(own[rule], depth + 1)
        elif kind == "close":
            depth = max(0, depth - 1)
        elif kind == "directive":
            brace = _BRACE.match(text, pos)
            if brace is None:
                continue
            try:
                value, pos = decoder.raw_decode(text, brace.end() - 1)
            except (ValueError, RecursionError):
                return f"the {m.group()} object after rule '{rule}' is not JSON within {MAX_DEPTH} levels"
            levels = json_depth(value)
            if levels > MAX_DEPTH:
                return (f"the {m.group()} schema of rule '{rule}' nests more than {MAX_DEPTH} levels "
                        f"deep (following $ref); at most {MAX_DEPTH}")
            own[rule] = max(own[rule], depth + 1 + levels)
    deepest, where = _rule_depth(refs, own)
    if deepest > MAX_DEPTH:
        return (f"rule '{where}' nests more than {MAX_DEPTH} levels deep (rules naming rules, "
                f"and groups); at most {MAX_DEPTH}")
    return None


def _rule_depth(refs: dict[str, set[str]], own: dict[str, int]) -> tuple[int, str]:
    """(the deepest rule's levels, its name): its own levels plus those of the deepest rule it
    names, a reference back to a rule being expanded counting nothing (recursion is a rule)."""
    memo: dict[str, int] = {}
    for root in refs:
        if root in memo:
            continue
        best = {root: 0}
        stack = [(root, iter(sorted(refs[root])))]
        while stack:
            rule, it = stack[-1]
            child = next(it, None)
            if child is not None:
                if child in memo:
                    best[rule] = max(best[rule], memo[child])
                elif child in refs and child not in best:
                    best[child] = 0
                    stack.append((child, iter(sorted(refs[child]))))
                continue
            stack.pop()
            memo[rule] = d = best.pop(rule) + own[rule]
            if d > MAX_DEPTH:
                return d, rule
            if stack:
                best[stack[-1][0]] = max(best[stack[-1][0]], d)
    top = max(memo, key=memo.get, default="")
    return memo.get(top, 0), top
