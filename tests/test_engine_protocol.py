"""The engine protocol (runtime/engines/protocol.py `Engine`) is the whole contract: every member it
declares is defined by both engines and by the scheduler tier's fake engine, and the
one-sequence API's sequence is none of the requests' wherever the engine has one to spare."""

from __future__ import annotations

import ast
import inspect
import textwrap

import numpy as np
import pytest

from prefix_edge.runtime.engines.protocol import Engine, EngineConfig
from prefix_edge.runtime.engines.llama.engine import LlamaBackend
from prefix_edge.runtime.engines.onnx.engine import OnnxBackend
from tests.helpers.fake_engine import FakeEngine

ENGINES = [FakeEngine, OnnxBackend, LlamaBackend]


def declared() -> tuple[set[str], set[str]]:
    """(attributes, calls) the protocol declares."""
    calls = {n for n, v in vars(Engine).items()
             if not n.startswith("_") and (inspect.isfunction(v) or isinstance(v, classmethod))}
    return set(Engine.__annotations__), calls


def assigned(cls) -> set[str]:
    """Names a class (or a class it derives from) defines: class attributes, properties and
    methods, and every `self.NAME = ...` in its methods."""
    names = set()
    for klass in cls.__mro__:
        if klass is object:
            continue
        names |= set(vars(klass))
        tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else []
            for t in targets:
                for el in (t.elts if isinstance(t, ast.Tuple) else [t]):
                    if isinstance(el, ast.Attribute) and isinstance(el.value, ast.Name) and el.value.id == "self":
                        names.add(el.attr)
    return names


def test_the_protocol_declares_what_its_users_ask():
    attrs, calls = declared()
    assert {"n_batch", "n_vocab", "kv_cells_total", "single_seq", "n_ctx", "keeps_partial",
            "state_layout", "verifies", "batches_sequences"} <= attrs
    assert {"from_bundle", "seq_restore", "seq_copy", "seq_snapshot", "forward", "seq_free", "seq_pos",
            "seq_truncate", "prefix_from", "load_prefix", "read_prefix_ids", "save_prefix", "write_snapshot",
            "state_info", "close"} <= calls


@pytest.mark.parametrize("cls", ENGINES, ids=lambda c: c.__name__)
def test_every_engine_defines_every_member(cls):
    attrs, calls = declared()
    have = assigned(cls)
    assert sorted(attrs - have) == [], f"{cls.__name__} lacks attributes of the protocol"
    assert sorted(c for c in calls if not callable(getattr(cls, c, None))) == [], \
        f"{cls.__name__} lacks calls of the protocol"


def test_fake_engine_prefix_files_round_trip(tmp_path):
    """The fake's prefix files go through the real codec: what it saves, it loads as it was."""
    be = FakeEngine()
    be.begin(None)
    be.prefill(np.arange(3, 9, dtype=np.int64))
    be.save_prefix(tmp_path / "p.safetensors", np.arange(3, 9, dtype=np.int64), {"task": "t"})
    prefix = be.load_prefix(tmp_path / "p.safetensors")
    assert prefix.state == list(range(3, 9)) and prefix.ids.tolist() == list(range(3, 9))
    assert be.read_prefix_ids(tmp_path / "p.safetensors").tolist() == list(range(3, 9))
    seq = 0
    assert be.seq_restore(seq, prefix) == 6
    assert np.array_equal(be.forward([(seq, 6, np.array([1]))])[0], be.step(1))


@pytest.mark.parametrize("backend, shared_kv", [("onnx", False), ("gguf", False), ("gguf", True)],
                         ids=["onnx", "gguf", "gguf-shared_kv"])
def test_engines_from_a_bundle_keep_the_contract(bundle_int4, backend, shared_kv):
    """Each engine as Runtime.open builds it: every declared member on the instance, logits of
    n_vocab, and the one-sequence API's sequence: none of the requests' where the engine has
    one to spare (ONNX, llama.cpp's shared cache), the first slot's where it has not."""
    from prefix_edge.bundle import Bundle
    from prefix_edge.runtime.engines import engine_class

    bundle = Bundle.open(bundle_int4)
    _, hashes = bundle.check_model(backend)
    longest = max(t.prefix_tokens for t in bundle.tasks.values())
    opened = engine_class(backend).from_bundle(bundle, hashes, EngineConfig(
        threads=1, slots=2, shared_kv=shared_kv, longest_prefix=longest))
    be = opened.engine
    try:
        attrs, _ = declared()
        assert sorted(a for a in attrs if not hasattr(be, a)) == []
        assert be.n_batch is None if backend == "onnx" else be.n_batch >= 1
        lay = be.state_layout  # a plain Llama-shaped model: every layer's KV keeps every position
        assert (lay.kv_layers, lay.window_layers, lay.recurrent_layers) == (be.n_layers, 0, 0), lay
        assert lay.keeps_partial and be.keeps_partial
        assert be.batches_sequences  # a plain Llama: a token beside another sequence's is computed as alone
        assert be.kv_cells_total is None if backend == "onnx" else be.kv_cells_total >= opened.n_ctx
        spare = backend == "onnx" or shared_kv
        taken = set(opened.request_seqs) | set(opened.resident_seqs)
        assert (be.single_seq not in taken) if spare else (be.single_seq == opened.request_seqs[0])
        request = opened.request_seqs[-1]
        assert be.seq_restore(request, None) == 0
        logits = be.forward([(request, 0, np.array([1, 2, 3], np.int64))])[0]
        assert logits.shape == (be.n_vocab,)
        be.begin(None)
        be.prefill(np.array([5, 6, 7, 8], np.int64))
        assert be.seq_pos(be.single_seq) == 4
        assert be.seq_pos(request) == 3  # the request's sequence is as it was
        assert be.forward([(request, 3, np.array([4], np.int64))])[0].shape == (be.n_vocab,)
    finally:
        be.close()


# What code outside runtime/engines/ still reads of an engine beyond the protocol, and why (issue
# 48's remainder). The scan below must find exactly these: a new undeclared read fails, and so
# does an entry here that the code no longer needs (the list only shrinks).
UNDECLARED = {
    ("bench/concurrency.py", "ctx"): "counts llama.cpp's used KV cells through its raw context",
    ("bench/concurrency.py", "bytes_per_cell"): "llama.cpp's cell size, for the same table",
    ("bench/concurrency.py", "kv_bytes"): "the ONNX engine's request buffers, for the same table",
}
# bench/ and cli/ name backends on purpose: each engine against its own peer (llama-cpp-python,
# optimum), doctor's lines per library
PEER_ROOMS = ("bench/", "cli/")
RECEIVERS = {"be", "backend", "engine"}  # the names an engine goes by outside runtime/engines/
NOT_ENGINE = set(dir(str)) | set(dir(dict))  # `backend` is also a backend's name, `engine` a dict of its info


def engine_reads() -> tuple[set[tuple[str, str]], list[str]]:
    """(file, member) of every read of an engine member the protocol does not declare, and
    every comparison of an engine's name with a backend's, in prefix_edge/ outside
    runtime/engines/ (the engines' own folder, where each knows itself; branches also outside
    PEER_ROOMS)."""
    from pathlib import Path

    from prefix_edge.bundle import BACKENDS
    from prefix_edge.runtime.engines.protocol import OneSequence

    attrs, calls = declared()
    known = attrs | calls | {n for n in vars(OneSequence) if not n.startswith("_")}
    root = Path(__file__).resolve().parent.parent / "prefix_edge"
    reads, branches = set(), []

    def receiver(node) -> str | None:
        return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None

    for f in sorted(root.rglob("*.py")):
        rel = f.relative_to(root).as_posix()
        if rel.startswith("runtime/engines/"):
            continue
        for node in ast.walk(ast.parse(f.read_text())):
            if (isinstance(node, ast.Attribute) and receiver(node.value) in RECEIVERS
                    and node.attr not in known and node.attr not in NOT_ENGINE):
                reads.add((rel, node.attr))
            if isinstance(node, ast.Compare) and not rel.startswith(PEER_ROOMS):
                sides = [node.left, *node.comparators]
                named = any((isinstance(s, ast.Attribute) and s.attr == "name" and receiver(s.value) in RECEIVERS)
                            or (isinstance(s, ast.Name) and s.id in RECEIVERS | {"name"}) for s in sides)
                if named and any(isinstance(s, ast.Constant) and s.value in BACKENDS for s in sides):
                    branches.append(f"{rel}:{node.lineno}")
    return reads, branches


def test_nothing_outside_the_engines_reads_an_undeclared_member():
    """The protocol is the whole contract in fact: outside runtime/engines/ no code branches
    on an engine's name, and every engine member it reads is declared (but UNDECLARED's)."""
    reads, branches = engine_reads()
    assert branches == [], f"branches on an engine's name: {branches}"
    assert sorted(reads - set(UNDECLARED)) == [], "reads of members the protocol does not declare"
    assert sorted(set(UNDECLARED) - reads) == [], "UNDECLARED lists reads the code no longer makes"
