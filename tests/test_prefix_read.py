"""Reading a prefix file: one read of a safetensors file into a buffer the tensors view (the
same tensors and metadata as safetensors' own reader, every malformed header a one-line
refusal), and an engine's O(bytes) walk of its values skipped only for the very file (same
stat identity and hash) that passed it before."""

import json
import os
import struct

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import save_file

from prefix_edge.bundle import Bundle, prefixfile
from prefix_edge.errors import PrefixEdgeError


def _write(path, tensors, meta=None):
    save_file(tensors, str(path), metadata=meta or {"prefix_format_version": "1", "task": "t"})
    return path


def test_same_as_safetensors(tmp_path):
    rng = np.random.default_rng(0)
    tensors = {"a": rng.standard_normal((1, 3, 7, 5)).astype(np.float32), "b": np.arange(9, dtype=np.int64),
               "c": rng.integers(0, 255, 13).astype(np.uint8), "d": rng.standard_normal((2, 3)).astype(np.float16),
               "e": np.zeros((0, 4), np.float32)}
    p = _write(tmp_path / "x.safetensors", tensors)
    got, meta = prefixfile.read(p)
    with safe_open(str(p), framework="np") as f:
        want = {n: f.get_tensor(n) for n in f.keys()}
        assert meta == f.metadata() == prefixfile.metadata(p)
    assert set(got) == set(want)
    for n in want:
        assert got[n].dtype == want[n].dtype and got[n].shape == want[n].shape and np.array_equal(got[n], want[n])
    assert set(prefixfile.read(p, ["b"])[0]) == {"b"}
    some, _ = prefixfile.read(p, ["d", "b"])  # only the span of those tensors is read
    assert all(np.array_equal(some[n], want[n]) and some[n].dtype == want[n].dtype for n in ("b", "d"))


def _raw(header: dict, data: bytes) -> bytes:
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + data


@pytest.mark.parametrize("blob, words", [
    (b"\x01\x02", "shorter than its header"),
    (struct.pack("<Q", 1 << 40) + b"{}", "header length"),
    (struct.pack("<Q", 3) + b"{{{", "not valid JSON"),
    (_raw({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 4), "does not fit"),
    (_raw({"a": {"dtype": "Q9", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4), "malformed"),
    (_raw({"a": {"dtype": "F32", "shape": [1 << 32, 1 << 32], "data_offsets": [0, 0]}}, b""), "does not fit"),
    (_raw({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
           "b": {"dtype": "F32", "shape": [1], "data_offsets": [2, 6]}}, b"\0" * 8), "overlap or leave a gap"),
    (_raw({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 12), "bytes after its tensors"),
    (_raw({"__metadata__": {"k": 1}, "a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}, b"\0"), "string map"),
])
def test_malformed_files_are_one_line_errors(tmp_path, blob, words):
    p = tmp_path / "bad.safetensors"
    p.write_bytes(blob)
    with pytest.raises(PrefixEdgeError) as e:
        prefixfile.read(p)
    assert words in str(e.value) and str(p) in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("backend", ["onnx", "gguf"])
def test_a_passed_prefix_skips_the_walk_until_the_file_changes(bundle_int4, backend):
    if backend == "gguf":
        pytest.importorskip("llama_cpp")
    from prefix_edge.bundle.verify import cache_name
    from prefix_edge.paths import read_cache
    from prefix_edge.runtime.engines.protocol import EngineConfig
    from prefix_edge.runtime.engines import engine_class
    from prefix_edge.runtime.cache.prefixes import PrefixCache

    b = Bundle.open(bundle_int4)
    fp, hashes = b.check_model(backend)
    be = engine_class(backend).from_bundle(b, hashes, EngineConfig(slots=1)).engine
    try:
        path = b.root / b.tasks["support"].prefixes[backend].file
        os.utime(path)  # a new stat identity: hashed and walked again
        assert not b.read_prefix("support", backend, fp)[3]
        walked = PrefixCache(b, be, fp).get("support")[0]
        assert b.read_prefix("support", backend, fp)[3]  # this process, and the next one:
        assert f"{backend}:{fp}" in read_cache(cache_name(b.root))[str(path.resolve())]["checks"]
        again = PrefixCache(b, be, fp).get("support")[0]
        kv = (lambda p: [p.state.blob] if backend == "gguf" else p.state.kv + p.state.states)
        assert all(np.array_equal(x, y) for x, y in zip(kv(walked), kv(again)))
        assert np.array_equal(walked.ids, again.ids)
        assert not b.read_prefix("support", backend, fp, verify="full")[3]  # full: always walked
        os.utime(path)
        assert not b.read_prefix("support", backend, fp)[3]
    finally:
        be.close()
