"""Smaller ONNX prefix stores (export --prefix-store f16|q8_0): the codec's round trip, a bundle
built with them opens and answers through the real runtime, and a file whose tensors do not
match its kv_store is a one-line refusal."""

from __future__ import annotations

import numpy as np
import pytest

from prefix_edge.bundle import prefixfile
from prefix_edge.errors import PrefixEdgeError

from .conftest import INPUTS, cli


def test_codec_round_trip():
    rng = np.random.default_rng(0)
    kv = {"past_key_values.0.key": rng.normal(0, 3, (1, 2, 7, 64)).astype(np.float32),
          "past_key_values.0.value": rng.normal(0, 3, (1, 2, 7, 48)).astype(np.float32)}
    kv["past_key_values.0.key"][0, 0, 0, :32] = 0.0  # an all-zero block decodes to zeros
    names = list(kv)
    t16, m16 = prefixfile.encode_kv(kv, "f16")
    d16 = prefixfile.decode_kv(t16, m16, names, np.float32, "x")
    for n in names:
        assert t16[n].dtype == np.float16 and np.array_equal(d16[n], kv[n].astype(np.float16).astype(np.float32))
    t8, m8 = prefixfile.encode_kv(kv, "q8_0")
    assert m8 == {"kv_store": "q8_0"}
    d8 = prefixfile.decode_kv(t8, m8, names, np.float32, "x")
    for n in names:
        a = kv[n]
        block = 32 if a.shape[-1] % 32 == 0 else a.shape[-1]  # 48: one block per row
        assert t8[n + ".scale"].shape == (1, 2, 7, a.shape[-1] // block)
        amax = np.abs(a.reshape(1, 2, 7, -1, block)).max(-1, keepdims=True)
        err = np.abs((d8[n] - a).reshape(1, 2, 7, -1, block))
        assert (err <= amax / 254 * 1.01 + 1e-6).all()  # half a step, f16 scale rounding aside
    assert not d8["past_key_values.0.key"][0, 0, 0, :32].any()
    assert prefixfile.encode_kv(kv, "f32") == (kv, {})


def test_codec_refuses_mismatched_tensors():
    kv = {"k": np.ones((1, 1, 2, 32), np.float32)}
    t8, m8 = prefixfile.encode_kv(kv, "q8_0")
    bad = [({**t8, "k": t8["k"].astype(np.int16)}, m8), ({"k": t8["k"]}, m8),
           ({**t8, "k.scale": t8["k.scale"][..., :0]}, m8), (kv, {"kv_store": "f16"}),
           (kv, {"kv_store": "q4"})]
    for tensors, meta in bad:
        with pytest.raises(PrefixEdgeError) as e:
            prefixfile.decode_kv(tensors, meta, ["k"], np.float32, "p.safetensors")
        assert "\n" not in str(e.value) and str(e.value).startswith("p.safetensors: ")
    with pytest.raises(PrefixEdgeError, match="unknown prefix store"):
        prefixfile.encode_kv(kv, "int3")


@pytest.fixture(scope="module")
def bundles(tiny_model, tasks_file, tmp_path_factory):
    from prefix_edge.export.build import export_bundle

    root = tmp_path_factory.mktemp("store")
    out = {}
    for store in ("f32", "f16", "q8_0"):
        out[store] = root / store
        export_bundle(tiny_model, tasks_file, out[store], formats=["onnx"], quantize="none",
                      progress=False, prefix_store=store)
    return out


def test_reduced_stores_open_and_answer(bundles):
    from prefix_edge import Runtime
    from prefix_edge.bundle import Manifest

    sizes = {s: Manifest.read(b).tasks["support"].prefixes["onnx"].bytes for s, b in bundles.items()}
    assert sizes["f16"] < 0.55 * sizes["f32"] and sizes["q8_0"] < 0.6 * sizes["f16"], sizes
    answers = {}
    for store, b in bundles.items():
        assert prefixfile.metadata(b / Manifest.read(b).tasks["support"].prefixes["onnx"].file).get(
            "kv_store", "f32") == store
        with Runtime.open(b, backend="onnx") as rt:
            r = rt.generate("support", INPUTS[0])
            assert r.stats.generated_tokens > 0
            answers[store] = r.tokens
    # fp32 weights, tiny model: rounding the prefix KV to f16 leaves the greedy answer as is
    assert answers["f16"] == answers["f32"]


def test_export_refuses_unknown_store(tiny_model, tasks_file, tmp_path):
    p = cli("export", tiny_model, "--tasks", tasks_file, "--out", tmp_path / "b", "--prefix-store", "int3")
    assert p.returncode != 0 and p.stderr.decode().strip().splitlines()[-1].startswith("error: unknown prefix store")
    assert not (tmp_path / "b").exists()
