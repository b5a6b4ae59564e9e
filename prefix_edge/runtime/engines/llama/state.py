"""The GGUF engine's state type and its format: a sequence's state as llama.cpp serialises it
(`SeqBlob`), and `StateFormat`, what such a blob must be for one model and context, built once at
open from explicit facts (the model's, and a probe of a state of the engine's own:
`read_layout`). It reads prefix files through the prefix-file codec (bundle/prefixfile.py),
checks a blob against the model before anything reaches llama.cpp, writes them back, and turns
a state into per-layer KV and back (runtime/engines/kv.py).

Prefix file (safetensors, like the ONNX engine's): `state` uint8 [blob bytes], `prefix_ids`
int64 [P - n_virtual], metadata {fingerprint, task, n_virtual (trained prefixes: the leading
cells that have no token id; absent = 0), ... as given, plus backend, state_format,
state_version, n_layer, v_trans, kv_type, n_tokens (= cells = P), and for a hybrid model
recurrent_layers}. The blob is read whole and walked before use (llamacpp/seqstate.py):
llama.cpp itself checks little and nothing about which model wrote it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ....bundle import prefixfile
from ....errors import PrefixEdgeError
from ....llamacpp.lib import KV_TYPES, STATE_FORMAT, _format_part, state_version
from ....llamacpp.seqstate import (CELL_EXT, GGML_TYPE_Q8_0, Q8_0_BLOCK, Q8_0_BYTES, all_finite, check_seq_state,
                                   parse_seq_state)
from ....llamacpp.seqstate_write import out_of_stream, row_bytes
from ..kv import KvLayers
from ..prefix import Prefix
from ..protocol import StateLayout

BACKEND = "gguf"


@dataclass(frozen=True, eq=False)
class SeqBlob:
    """One sequence's state as llama.cpp serialises it, one stream's (Prefix.state): every
    cell's K and V rows per layer (and the window's cells of a sliding-window cache, and a
    hybrid's recurrent state). Read-only: llama.cpp only reads it."""

    blob: np.ndarray  # uint8 [bytes]

    @property
    def nbytes(self) -> int:
        return int(self.blob.nbytes)


@dataclass(frozen=True)
class Layout:
    """What a probe of the engine's own state showed (read_layout)."""

    parts: int = 1                 # KV caches' parts in a blob (2: llama.cpp's iSWA cache)
    swa_n_layer: int = 0           # layers in the sliding-window cache
    kv_layers: int | None = None   # layers in the (full-attention) KV cache's part (None: all)
    recurrent: dict | None = None  # a hybrid: RecurrentInfo.facts() of its recurrent layers' state
    n_kv_heads: int | None = None  # of the attention layers (llama.cpp reports layer 0's)
    base_bytes: int = 0            # a state's bytes that do not grow with its cells
    window: bool = True            # the model's n_swa is a sliding-window cache (EXAONE 4.0: not)
    cell_ext: int = 0              # bytes a cell carries beyond pos/n_seq_id/seq ids (M-RoPE: CELL_EXT)


def read_layout(be, hybrid: bool) -> Layout:
    """Which parts a state of engine `be` holds, read off a two-token sequence's: one KV cache's
    part or two (sliding-window layers: llama.cpp's iSWA cache; n_swa alone does not say,
    EXAONE 4.0 has one and no sliding layer; when every layer slides the first part has none),
    and for a `hybrid` model its recurrent layers' state. The engine is closed on failure."""
    L = be._L
    try:
        be.forward([(0, 0, np.zeros(2, np.int64))])
        raw = be.raw_state(0)
        err, info = None, None
        for ext in (0, CELL_EXT):  # an M-RoPE model's cells carry more (Qwen3.5)
            for parts in (1, 2):
                try:
                    info = parse_seq_state(out_of_stream(raw.copy(), 0, be.n_stream, parts, None if hybrid else 0, ext),
                                           parts, None if hybrid else 0, ext)
                    if list(info.positions) != [0, 1]:
                        raise PrefixEdgeError(f"the probe's cells hold positions {list(info.positions)}, not [0, 1]")
                    break
                except PrefixEdgeError as e:
                    err, info = err or e, None
            if info is not None:
                break
        else:
            raise err
    except PrefixEdgeError as e:
        be.close()
        raise PrefixEdgeError(f"cannot read this model's sequence-state layout: {e}") from None
    finally:
        if be.ctx is not None:
            L.llama_memory_seq_rm(be.mem, 0, -1, -1)
    lay = next((lay for part in info.parts for lay in part.layers), None)
    if lay is None:
        be.close()
        raise PrefixEdgeError("cannot read this model's sequence-state layout: it has no KV layer")
    per_row = (lay.k_row_bytes // Q8_0_BYTES * Q8_0_BLOCK if lay.k_type == GGML_TYPE_Q8_0
               else lay.k_row_bytes // (4 if lay.k_type == 0 else 2))
    head_dim = be.head_dim if info.n_layer else be.head_dim_swa  # (the first layer's part: its own heads)
    return Layout(parts=len(info.parts), swa_n_layer=info.swa.n_layer if info.swa else 0, kv_layers=info.n_layer,
                  recurrent=info.recurrent.facts() if info.recurrent else None,
                  n_kv_heads=per_row // head_dim, base_bytes=int(raw.nbytes), window=info.swa is not None,
                  cell_ext=ext)


@dataclass(frozen=True)
class StateFormat:
    """What a sequence state of one model in one context is, from the facts given at open."""

    n_layers: int            # the model's layers (llama.cpp's n_layer)
    n_kv_heads: int
    head_dim: int
    head_dim_v: int
    kv_type: str             # "f16" or "q8_0"
    v_trans: bool            # V stored transposed (no flash attention)
    rotation: int            # a q8_0 cache's Hadamard rotation of K and V (llamacpp/lib.kv_rotation)
    max_cells: int           # the most cells one sequence may hold
    n_vocab: int
    state_version: str       # llama.cpp's, as a prefix file records it
    n_swa: int = 0           # the sliding window (0: no sliding-window cache)
    layout: Layout = Layout()
    head_dim_swa: int | None = None    # the sliding-window layers' (Gemma 4: not the global ones'; None: the same)
    head_dim_v_swa: int | None = None

    @property
    def swa_dims(self) -> tuple[int, int]:
        return (self.head_dim_swa or self.head_dim, self.head_dim_v_swa or self.head_dim_swa or self.head_dim_v)

    # -- what a blob holds ------------------------------------------------------------------
    @property
    def parts(self) -> int:
        return self.layout.parts

    @property
    def recurrent(self) -> dict | None:
        return self.layout.recurrent

    @property
    def recurrent_layers(self) -> int:
        return self.layout.recurrent["layers"] if self.layout.recurrent else 0

    @property
    def kv_layers(self) -> int:
        """Layers in the full-attention KV cache's part."""
        return self.n_layers if self.layout.kv_layers is None else self.layout.kv_layers

    @property
    def state_layout(self) -> StateLayout:
        return StateLayout(kv_layers=self.kv_layers, window_layers=self.layout.swa_n_layer,
                           window=self.n_swa if self.layout.swa_n_layer else 0,
                           recurrent_layers=self.recurrent_layers)

    @property
    def bytes_per_cell(self) -> int:
        """Every KV layer's K and V row of one cell."""
        t = KV_TYPES[self.kv_type]
        kh = self.n_kv_heads
        if self.layout.kv_layers is None:
            return self.n_layers * (row_bytes(t, kh * self.head_dim) + row_bytes(t, kh * self.head_dim_v))
        dk, dv = self.swa_dims
        return (self.layout.kv_layers * (row_bytes(t, kh * self.head_dim) + row_bytes(t, kh * self.head_dim_v))
                + self.layout.swa_n_layer * (row_bytes(t, kh * dk) + row_bytes(t, kh * dv)))

    def parse(self, blob):
        """A blob parsed as this model's layout (seqstate.parse_seq_state)."""
        return parse_seq_state(blob, self.parts, self.recurrent_layers, self.layout.cell_ext)

    def expected(self, n_tokens: int | None = None) -> dict:
        """What a seq-state blob for this model and context must look like."""
        t = KV_TYPES[self.kv_type]
        exp = {"n_layer": self.kv_layers, "k_type": t, "v_type": t,
               "k_row_bytes": row_bytes(t, self.n_kv_heads * self.head_dim),
               "v_row_bytes": row_bytes(t, self.n_kv_heads * self.head_dim_v),
               "n_embd_v_gqa": self.n_kv_heads * self.head_dim_v, "v_trans": self.v_trans,
               "max_cells": self.max_cells}
        if self.n_swa:
            exp["swa"] = {"n_layer": self.layout.swa_n_layer, "window": self.n_swa}
            dk, dv = self.swa_dims
            if (dk, dv) != (self.head_dim, self.head_dim_v):  # its layers' rows are their own size
                exp["swa"].update({"k_row_bytes": row_bytes(t, self.n_kv_heads * dk),
                                   "v_row_bytes": row_bytes(t, self.n_kv_heads * dv),
                                   "n_embd_v_gqa": self.n_kv_heads * dv})
        if self.recurrent:
            exp["recurrent"] = self.recurrent
        if self.layout.cell_ext:
            exp["cell_ext"] = self.layout.cell_ext
        if n_tokens is not None:
            exp["cell_count"] = n_tokens
        return exp

    def snapshot_bytes(self, n_tokens: int) -> int:
        """At most the bytes of a snapshot's file of n_tokens positions (its state blob: every
        cell's rows, a cell's own record, the recurrent state the layout read showed; and the
        file's ids and header), with room to spare: a larger file is refused unread."""
        return 2 * (self.layout.base_bytes + (self.bytes_per_cell + 64) * n_tokens) + 8 * n_tokens + (1 << 20)

    # -- checked in, written out --------------------------------------------------------------
    def check(self, prefix: Prefix, where: str = "prefix", walk: bool = True) -> None:
        """Refuse a prefix that is not a state of this model and context (its values walked for
        NaN/inf unless not `walk`: restored, they would poison the cache)."""
        state = prefix.state
        if not isinstance(state, SeqBlob) or state.blob.dtype != np.uint8:
            raise PrefixEdgeError(f"{where}: not a gguf prefix (its state is not a seq-state blob)")
        try:
            info = self.parse(state.blob)
            check_seq_state(info, self.expected(prefix.n_tokens))
        except PrefixEdgeError as e:
            raise PrefixEdgeError(f"{where}: {e}") from None
        if walk and not all_finite(state.blob, info):
            raise PrefixEdgeError(f"{where}: the prefix KV holds NaN or infinite values")
        if np.any(prefix.ids < 0) or np.any(prefix.ids >= self.n_vocab):
            raise PrefixEdgeError(f"{where}: prefix ids outside this model's vocabulary "
                                  f"(0..{self.n_vocab - 1})")

    def read(self, tensors: dict, meta: dict, where: str, values_checked: bool = False) -> Prefix:
        """A Prefix from a prefix file's tensors and metadata, checked against this model
        (values_checked: this file passed the values' walk before, unchanged since)."""
        if meta.get("backend", BACKEND) != BACKEND:
            raise PrefixEdgeError(f"{where}: prefix baked for the {meta['backend']!r} backend, not gguf")
        baked_with = meta.get("state_version")
        if baked_with and _format_part(baked_with) != _format_part(self.state_version):
            raise PrefixEdgeError(f"{where}: KV state written by {baked_with}, this runtime reads "
                                  f"{self.state_version}: rebake the prefix")
        prefixfile.require(tensors, [prefixfile.STATE, prefixfile.IDS], where)
        ids = prefixfile.ids_of(tensors[prefixfile.IDS], where)
        blob = tensors[prefixfile.STATE]
        if blob.dtype != np.uint8 or blob.ndim != 1:
            raise PrefixEdgeError(f"{where}: tensor 'state' is {blob.dtype}{list(blob.shape)}, "
                                  "expected uint8 [bytes]")
        prefix = Prefix(ids, SeqBlob(np.ascontiguousarray(blob)), meta, n_virtual=prefixfile.n_virtual(meta, where))
        self.check(prefix, where, walk=not values_checked)
        return prefix

    def write(self, path: Path, ids: np.ndarray, blob: bytes, metadata: dict[str, str],
              mac_key: bytes | None = None) -> None:
        """A prefix file of `blob` (checked against this model first)."""
        write_prefix(path, ids, blob, metadata, self.kv_type, self.expected(), mac_key)

    # -- KV as data (runtime/engines/kv.py) -------------------------------------------------------
    def kv_of(self, state: SeqBlob) -> KvLayers:
        """A state's K and V per layer, [positions, kv_heads, head_dim], in position order
        (float16 from an f16 cache; a q8_0 cache's values dequantized to float32). Only a
        model whose every layer holds every position (no sliding-window or recurrent part)."""
        from ....llamacpp.seqstate import extract_kv

        if not self.state_layout.keeps_partial or self.parts != 1:
            raise PrefixEdgeError("this model's state is not per-position KV of every layer")
        info = self.parse(state.blob)
        ks, vs = extract_kv(state.blob, info, self.rotation if self.kv_type != "f16" else 0)
        n, nk = info.cell_count, self.n_kv_heads
        order = None if np.array_equal(info.positions, np.arange(n)) else np.argsort(info.positions, kind="stable")
        if order is not None and not np.array_equal(info.positions[order], np.arange(n)):
            raise PrefixEdgeError("a state whose cells are not positions 0..n-1")
        pick = (lambda a: a) if order is None else (lambda a: a[order])  # in order: views of the blob
        return KvLayers([pick(k).reshape(n, nk, -1) for k in ks], [pick(v).reshape(n, nk, -1) for v in vs])

    def prefix_of(self, kv: KvLayers, ids: np.ndarray, n_virtual: int = 0,
                  sliding: tuple[int, ...] = (), window: int = 0) -> Prefix:
        """A Prefix of positions 0..n-1 holding `kv` (the inverse of kv_of). `sliding`/`window`:
        which of kv's layers are sliding-window layers, and their window (the model's config):
        llama.cpp keeps those in a cache of their own (iSWA), the last min(n, window) cells. Each
        layer's rows are as wide as its K and V (Gemma 4's sliding and global heads differ); the
        blob is walked against the model's own row sizes when it is restored."""
        from ....llamacpp.seqstate_write import build_seq_state

        if self.layout.cell_ext:
            raise PrefixEdgeError("this GGUF model's KV cells carry M-RoPE coordinates that KV given as "
                                  "data does not: cannot place it in the model's caches")
        if self.n_swa and (len(sliding) != self.layout.swa_n_layer or window != self.n_swa):
            raise PrefixEdgeError(
                f"the GGUF model keeps {self.layout.swa_n_layer} sliding-window layers of {self.n_swa} "
                f"positions, the KV given {len(sliding)} of {window}: cannot place it in the model's caches")
        n = kv.n
        k = [np.ascontiguousarray(a, np.float16).reshape(n, -1) for a in kv.k]
        v = [np.ascontiguousarray(a, np.float16).reshape(n, -1) for a in kv.v]
        blob = np.frombuffer(build_seq_state(k, v, self.v_trans, kv_type=KV_TYPES[self.kv_type],
                                             rotation=self.rotation if self.kv_type != "f16" else 0,
                                             swa_layers=sliding if self.n_swa else (), window=self.n_swa),
                             np.uint8)
        return Prefix(np.asarray(ids, np.int64), SeqBlob(blob), {}, n_virtual=n_virtual)


def write_prefix(path: Path, ids: np.ndarray, blob: bytes, metadata: dict[str, str],
                 kv_type: str = "f16", expected: dict | None = None, mac_key: bytes | None = None) -> None:
    """Write a gguf prefix file; the blob is walked first (against `expected`, the model's
    StateFormat.expected, where given), its facts go into the metadata.
    `metadata["n_virtual"]` (default 0) counts the leading cells that have no id in `ids`."""
    ids = np.asarray(ids, np.int64).reshape(-1)
    meta = {k: str(v) for k, v in metadata.items()}
    n_cells = prefixfile.n_virtual(meta, "write_prefix") + len(ids)
    expected = {**(expected or {}), "cell_count": n_cells, "k_type": KV_TYPES[kv_type], "v_type": KV_TYPES[kv_type]}
    info = parse_seq_state(blob, 2 if "swa" in expected else 1, (expected.get("recurrent") or {}).get("layers", 0),
                           expected.get("cell_ext", 0))
    check_seq_state(info, expected)
    meta.update({"backend": BACKEND, "state_format": STATE_FORMAT,
                 "state_version": state_version(), "n_layer": str(sum(p.n_layer for p in info.parts)),
                 "v_trans": str(int(info.v_trans)), "kv_type": kv_type, "n_tokens": str(n_cells)})
    if info.recurrent:
        meta["recurrent_layers"] = str(len(info.recurrent.layers))
    prefixfile.write(path, ids, {prefixfile.STATE: np.frombuffer(bytes(blob), np.uint8)}, meta, mac_key)
