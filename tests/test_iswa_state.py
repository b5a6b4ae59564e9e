"""A model with sliding-window layers on the GGUF backend (Gemma 3's 5 local : 1 global layers,
a window of 8 positions): llama.cpp keeps those layers in a second cache (iSWA) and writes a
sequence's state as two caches' parts, the second holding only the cells inside the window.
Real llama.cpp contexts on a tiny seeded Gemma 3 checkpoint converted by llama.cpp's converter:
- the blob written from K and V (a baked adapter's route) is byte for byte llama.cpp's own;
- a prefix longer than the window, restored into any stream of a context with several, gives
  the logits of prefilling it;
- blobs that do not fit the two caches are refused in one line before llama.cpp sees them."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from prefix_edge.errors import PrefixEdgeError
from prefix_edge.runtime.engines.llama.engine import LlamaBackend
from prefix_edge.runtime.engines.prefix import Prefix
from prefix_edge.runtime.engines.llama.state import SeqBlob
from prefix_edge.llamacpp.seqstate import check_seq_state, extract_kv, parse_seq_state
from prefix_edge.llamacpp.seqstate_write import build_seq_state

from .helpers.archs import build_arch

P, WINDOW = 20, 8
IDS = np.arange(10, 40, dtype=np.int64)  # a P-token prefix, then the input


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    built = build_arch("gemma3", tmp_path_factory.mktemp("gemma3") / "model")
    be = LlamaBackend(built.gguf, threads=2, n_ctx=3 * 256, n_seq_max=3)
    be.begin(None)
    be.prefill(IDS[:P])
    reference = be.prefill(IDS[P:])  # prefix + input in one sequence, no restore
    be.begin(None)
    be.prefill(IDS[:P])
    snap = be.seq_snapshot(be.single_seq, IDS[:P])
    yield built, be, snap, reference
    be.close()


def test_two_caches_and_the_window(gemma):
    built, be, snap, _ = gemma
    assert (be.n_swa, be.format.layout.swa_n_layer, be.n_stream) == (WINDOW, 5, 3)
    info = parse_seq_state(snap.state.blob, parts=2)
    check_seq_state(info, be.format.expected(P))
    assert [p.n_layer for p in info.parts] == [1, 5]
    assert info.positions.tolist() == list(range(P))
    assert info.swa.positions.tolist() == list(range(P - WINDOW, P))


def test_blob_from_kv_is_llama_cpps_own(gemma):
    built, be, snap, _ = gemma
    ks, vs = extract_kv(snap.state.blob, parse_seq_state(snap.state.blob, parts=2))
    sliding = [i for i, t in enumerate(built.model.config.layer_types) if t == "sliding_attention"]
    full = [i for i in range(len(ks)) if i not in sliding]
    k, v = [None] * len(ks), [None] * len(vs)
    for j, i in enumerate(full + sliding):  # extract_kv: the full cache's layers, then the window's
        pad = np.zeros((P - ks[j].shape[0], ks[j].shape[1]), np.float16)  # cells outside the window
        k[i], v[i] = np.concatenate([pad, ks[j]]), np.concatenate([pad, vs[j]])
    blob = build_seq_state(k, v, be.v_trans, swa_layers=sliding, window=WINDOW)
    assert blob == snap.state.blob.tobytes()


@pytest.mark.parametrize("seq", [0, 1, 2])
def test_restored_prefix_is_the_prefill(gemma, seq):
    _, be, snap, reference = gemma
    assert be.seq_restore(seq, snap) == P
    got = be.forward([(seq, P, IDS[P:])])[0]
    assert np.array_equal(got, reference)


def _bad(blob: bytes) -> dict[str, tuple[bytes, str]]:
    info = parse_seq_state(blob, parts=2)
    start = info.swa.span[0]
    z = [np.zeros((P, 32), np.float16)] * 5
    shifted = bytearray(blob)  # the window's first cell one position later
    struct.pack_into("<i", shifted, start + 8, P - WINDOW + 1)
    return {
        "one part": (blob[:start], "truncated: sliding-window cache: n_stream"),
        "truncated second part": (blob[:-64], "truncated"),
        "window positions": (bytes(shifted), f"sliding-window cache position of cell 0 is "
                                             f"{P - WINDOW + 1}, expected {P - WINDOW}"),
        "every cell in the window's cache": (blob[:start] + build_seq_state(z, z, v_trans=True)[8:],
                                             f"sliding-window cache cell count is {P}, expected {WINDOW}"),
    }


@pytest.mark.parametrize("case", ["one part", "truncated second part", "window positions",
                                  "every cell in the window's cache"])
def test_bad_blob_refused_in_one_line(gemma, case):
    _, be, snap, reference = gemma
    bad, pattern = _bad(snap.state.blob.tobytes())[case]
    with pytest.raises(PrefixEdgeError, match=pattern) as e:
        be.seq_restore(1, Prefix(IDS[:P], SeqBlob(np.frombuffer(bad, np.uint8))))
    assert "\n" not in str(e.value)
    be.seq_restore(1, snap)  # and the context stays usable
    assert np.array_equal(be.forward([(1, P, IDS[P:])])[0], reference)
