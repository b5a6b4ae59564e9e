"""This machine's cache of ONNX Runtime's optimized, prepacked model (runtime/engines/onnx/ort_cache.py):
the first open saves it, later opens load it, and either way every logit is the same as a
session built from the model itself; an edited entry is rebuilt, never used."""

import json
import os
import shutil

import numpy as np
import pytest

from prefix_edge.runtime.engines.onnx import ort_cache
from prefix_edge.runtime.engines.onnx.engine import OnnxBackend

IDS = np.array([5, 17, 42, 99, 7, 3, 250, 12], np.int64)


def _model(bundle):
    return next((bundle / "onnx").glob("*.onnx"))


def _run(be, steps: int = 12) -> tuple[list[np.ndarray], list[int]]:
    """Prefill IDS, then greedy steps: every step's logits and the tokens."""
    be.begin(None)
    logits = [be.prefill(IDS)]
    toks = []
    for _ in range(steps):
        toks.append(int(np.argmax(logits[-1])))
        logits.append(be.step(toks[-1]))
    return logits, toks


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("PREFIX_EDGE_HOME", str(tmp_path))
    monkeypatch.delenv("PREFIX_EDGE_ORT_CACHE", raising=False)
    return tmp_path


@pytest.mark.parametrize("bundle", ["bundle_int4", "bundle_optimum"])
def test_cached_session_is_bit_identical(request, home, monkeypatch, bundle):
    path = _model(request.getfixturevalue(bundle))
    shutil.rmtree(home / "ort-cache", ignore_errors=True)  # the bundle's export may have made one
    monkeypatch.setenv("PREFIX_EDGE_ORT_CACHE", "0")
    plain = OnnxBackend(path, threads=2)
    assert plain.session_source == "model"
    want, want_toks = _run(plain)
    assert not (home / "ort-cache").exists()

    monkeypatch.delenv("PREFIX_EDGE_ORT_CACHE")
    first = OnnxBackend(path, threads=2)
    assert first.session_source == "saved"
    (entry,) = [d for d in (home / "ort-cache").iterdir()]
    assert sorted(p.name for p in entry.iterdir()) == ["entry.json", "model.onnx", "model.onnx.data", ort_cache.PUBLISHER]
    second = OnnxBackend(path, threads=2)
    assert second.session_source == "cache"
    assert OnnxBackend(path, threads=2, verify="full").session_source == "cache"  # re-hashed, same
    info = ort_cache.summary()  # what doctor reports
    assert info["entries"] == 1 and info["enabled"]
    assert info["bytes"] == sum(p.stat().st_size for p in entry.iterdir())
    for be in (first, second):
        got, toks = _run(be)
        assert toks == want_toks
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)


def test_edited_entry_is_rebuilt_not_used(bundle_int4, home):
    path = _model(bundle_int4)
    want, _ = _run(OnnxBackend(path, threads=2))  # saves the entry
    (entry,) = list((home / "ort-cache").iterdir())
    data = entry / "model.onnx.data"
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # same size; the stat identity (mtime/ctime) changes
    data.write_bytes(bytes(raw))
    be = OnnxBackend(path, threads=2)
    assert be.session_source == "saved"  # the edited entry was dropped and made again
    got, _ = _run(be)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    assert OnnxBackend(path, threads=2).session_source == "cache"

    # an entry whose record does not parse, or that lacks a file, is dropped as well
    (entry / "entry.json").write_text("{not json")
    assert OnnxBackend(path, threads=2).session_source == "saved"
    os.remove(entry / "model.onnx")
    assert OnnxBackend(path, threads=2).session_source == "saved"
    assert json.loads((entry / "entry.json").read_text())["format"] == ort_cache.CACHE_FORMAT


def test_entry_key_follows_model_runtime_and_cpu(monkeypatch):
    a = ort_cache.entry_key("0" * 64)
    assert a == ort_cache.entry_key("0" * 64)
    assert a != ort_cache.entry_key("1" * 64)
    from prefix_edge.runtime.engines import cpus

    monkeypatch.setattr(cpus, "cpu_flags", lambda: frozenset({"avx2", "fma"}))  # another CPU
    b = ort_cache.entry_key("0" * 64)
    monkeypatch.setattr(cpus, "cpu_flags", lambda: frozenset({"avx2", "fma", "avx512f"}))
    assert len({a, b, ort_cache.entry_key("0" * 64)}) == 3


def test_cache_keeps_the_most_recent_entries(bundle_int4, bundle_fp32, tiny_model, tasks_file, tmp_path, home,
                                             monkeypatch):
    from prefix_edge.export.build import export_bundle

    export_bundle(tiny_model, tasks_file, tmp_path / "int8", quantize="int8", formats=["onnx"], progress=False)
    third = tmp_path / "int8"  # a third model file
    monkeypatch.setattr(ort_cache, "KEEP", 2)
    for b in (bundle_int4, bundle_fp32, third):
        OnnxBackend(_model(b), threads=2)
    assert len(list((home / "ort-cache").iterdir())) == 2
    assert OnnxBackend(_model(third), threads=2).session_source == "cache"
    assert OnnxBackend(_model(bundle_int4), threads=2).session_source == "saved"  # evicted first


def test_half_published_entry_of_a_dead_process_is_rebuilt_at_once(bundle_int4, home):
    """A kill -9 between publishing an entry's files and its entry.json leaves a dir without
    entry.json: when its publisher is dead the next open rebuilds it at once (a live publisher's
    dir is left alone: it is still writing)."""
    import platform
    import subprocess
    import sys

    path = _model(bundle_int4)
    assert OnnxBackend(path, threads=2).session_source == "saved"
    (entry,) = list((home / "ort-cache").iterdir())
    os.remove(entry / "entry.json")
    assert (entry / ort_cache.PUBLISHER).read_text() == f"{platform.node()} {os.getpid()}"
    # published by this (live) process: not removed, not used
    assert OnnxBackend(path, threads=2).session_source == "saved"
    assert entry.is_dir() and not (entry / "entry.json").exists()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (entry / ort_cache.PUBLISHER).write_text(f"{platform.node()} {dead.pid}")
    assert OnnxBackend(path, threads=2).session_source == "saved"  # rebuilt now, not in 10 minutes
    assert (entry / "entry.json").is_file()
    assert OnnxBackend(path, threads=2).session_source == "cache"
