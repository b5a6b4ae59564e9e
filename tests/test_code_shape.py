"""The package's import graph follows the layers of docs/code-layout.md: a room (a top-level
module or subpackage of prefix_edge) imports only the rooms listed above it there, and no
modules import each other in a cycle. Every import counts: module-level, lazy in a function,
and type-only under TYPE_CHECKING. So any module can be read, imported and tested from its
dependencies up, and the page is the map of who may import whom."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "prefix_edge"
LAYOUT = ROOT / "docs" / "code-layout.md"

# Imports against the layer order, each to be resolved at its seam (and then removed here: an
# exception that no longer occurs fails the test, so this list only shrinks).
KNOWN_UPWARD: set[tuple[str, str]] = set()


def _modules() -> dict[str, Path]:
    mods = {}
    for p in PKG.rglob("*.py"):
        parts = list(p.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = p
    return mods


def import_graph() -> dict[str, set[str]]:
    mods, graph = _modules(), {}
    for name, path in mods.items():
        here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                base = ".".join(here[:len(here) - node.level + 1] + ([node.module] if node.module else [])) \
                    if node.level else node.module
                for a in node.names:
                    if f"{base}.{a.name}" in mods:
                        deps.add(f"{base}.{a.name}")
                    elif base in mods:
                        deps.add(base)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name in mods)
        deps.discard(name)
        graph[name] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_the_detector_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    graph = import_graph()
    assert "prefix_edge.runtime.runtime" in graph and graph["prefix_edge.runtime.runtime"]
    assert cycles(graph) == []


def layers(text: str) -> list[str]:
    """The rooms of prefix_edge/ in the page's order: the entries of its first code block
    indented by two spaces (`errors.py`, `runtime/`, ...), without their suffix."""
    block = text.split("```", 2)[1]
    return [m.group(1) for m in re.finditer(r"^  ([A-Za-z_][\w]*)(?:\.py|/)\s", block, re.M)]


def room(module: str) -> str:
    """prefix_edge.runtime.scheduler -> runtime; prefix_edge.errors -> errors; prefix_edge -> __init__."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def upward(graph: dict[str, set[str]], order: list[str]) -> set[tuple[str, str]]:
    """Imports of a room listed below the importer's (or of one not listed at all)."""
    rank = {name: i for i, name in enumerate(order)}
    out = set()
    for a, deps in graph.items():
        for b in deps:
            ra, rb = room(a), room(b)
            if ra != rb and rank.get(rb, len(rank)) > rank.get(ra, -1):
                out.add((a, b))
    return out


def test_the_layer_check_finds_an_upward_import():
    order = layers("x\n```\nprefix_edge/\n  errors.py   e\n  runtime/    r\n    x.py  no\n  cli/  c\n```\n")
    assert order == ["errors", "runtime", "cli"]
    graph = {"prefix_edge.runtime.a": {"prefix_edge.errors", "prefix_edge.cli.app"},
             "prefix_edge.cli.app": {"prefix_edge.runtime.a", "prefix_edge.runtime.b"},
             "prefix_edge.errors": set()}
    assert upward(graph, order) == {("prefix_edge.runtime.a", "prefix_edge.cli.app")}


def test_imports_follow_the_documented_layers():
    order = layers(LAYOUT.read_text(encoding="utf-8"))
    graph = import_graph()
    assert order.index("errors") < order.index("bundle") < order.index("runtime") < order.index("cli")
    unlisted = sorted({room(m) for m in graph} - set(order))
    assert unlisted == [], f"modules in no room of docs/code-layout.md's list: {unlisted}"
    found = upward(graph, order)
    assert found - KNOWN_UPWARD == set(), \
        "imports against the layer order of docs/code-layout.md (a room imports only rooms above it):\n" + \
        "\n".join(f"  {a} -> {b}" for a, b in sorted(found - KNOWN_UPWARD))
    assert KNOWN_UPWARD - found == set(), f"resolved, remove from KNOWN_UPWARD: {sorted(KNOWN_UPWARD - found)}"


def test_test_modules_share_helpers_not_each_other():
    """Helpers shared by test modules live in tests/helpers/ (or conftest.py): reading one test
    module never means opening another."""
    tests = ROOT / "tests"
    found = []
    for path in sorted(tests.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            for name in names:
                last = name.split(".")[-1] if name else ""
                if last.startswith("test_") and (name.startswith("tests.") or getattr(node, "level", 0)):
                    found.append(f"{path.relative_to(ROOT)}: {name}")
    assert found == [], "test modules importing test modules:\n" + "\n".join(found)


# runtime/'s own rooms, lowest first: each imports only rooms before it (the engines below the
# caches, the caches below decoding, decoding below the scheduler, the scheduler below the
# call's preparation and the Runtime); a module or package new in runtime/ must be placed here
RUNTIME_ROOMS = ["engines", "cache", "decode", "scheduler", "stream", "documents", "chat",
                 "embedding", "prepare", "tasks", "runtime", "__init__"]


def test_runtime_rooms_follow_their_order():
    graph = import_graph()

    def sub(module: str) -> str | None:
        parts = module.split(".")
        return (parts[2] if len(parts) > 2 else "__init__") if parts[:2] == ["prefix_edge", "runtime"] else None

    rank = {name: i for i, name in enumerate(RUNTIME_ROOMS)}
    unplaced = sorted({sub(m) for m in graph if sub(m) is not None} - set(rank))
    assert unplaced == [], f"runtime/ rooms not in RUNTIME_ROOMS: {unplaced}"
    upward = sorted((a, b) for a, deps in graph.items() for b in deps
                    if sub(a) is not None and sub(b) is not None and sub(a) != sub(b)
                    and rank[sub(b)] > rank[sub(a)])
    assert upward == [], "imports against runtime/'s room order:\n" + "\n".join(f"  {a} -> {b}" for a, b in upward)
