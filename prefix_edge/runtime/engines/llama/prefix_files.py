"""The GGUF engine's prefix files: a task's prefix as llama.cpp serialises one sequence's KV,
read through the prefix-file codec (bundle/prefixfile.py), checked against the model before
anything reaches llama.cpp, and written back (export's baking, conversation snapshots).

Prefix file (safetensors, like the ONNX backend's): `state` uint8 [blob bytes], `prefix_ids`
int64 [P - n_virtual], metadata {fingerprint, task, n_virtual (trained prefixes: the leading
cells that have no token id; absent = 0), ... as given, plus backend, state_format,
state_version, n_layer, v_trans, kv_type, n_tokens (= cells = P), and for a hybrid model
recurrent_layers}. The blob is read whole and walked before use (seqstate.py): llama.cpp itself
checks little and nothing about which model wrote it.

Which parts a model's blobs hold (one KV cache's or two, a recurrent part) is read off a state
of the engine's own (read_state_layout), not guessed from the model's metadata.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ....bundle import prefixfile
from ....errors import PrefixEdgeError
from ....llamacpp.lib import KV_TYPES, STATE_FORMAT, _format_part, state_version
from ..kv import KvLayers
from ..prefix import Prefix
from ....llamacpp.seqstate import GGML_TYPE_Q8_0, Q8_0_BLOCK, Q8_0_BYTES, all_finite, check_seq_state, parse_seq_state
from ....llamacpp.seqstate_write import out_of_stream, row_bytes

BACKEND = "gguf"


class PrefixFiles:
    """LlamaBackend's prefix-file side (a mixin: it reads the engine's model facts, kv_type,
    state_parts, state_version and the live context)."""

    state_parts = 1         # KV caches' parts in a blob (2: sliding-window layers, llama.cpp's iSWA)
    swa_n_layer = 0         # layers in the sliding-window cache
    kv_layers = None        # layers in the (full-attention) KV cache's part (None: all the model's)
    recurrent = None        # a hybrid model: RecurrentInfo.facts() of its recurrent layers' state

    @property
    def recurrent_layers(self) -> int:
        return self.recurrent["layers"] if self.recurrent else 0

    def parse_state(self, blob):
        """A blob parsed as this model's layout (seqstate.parse_seq_state)."""
        return parse_seq_state(blob, self.state_parts, self.recurrent_layers)

    def read_state_layout(self, hybrid: bool) -> None:
        """Which parts this model's sequence states hold, read off the state of a two-token
        sequence: one KV cache's part or two (sliding-window layers: llama.cpp's iSWA cache;
        n_swa alone does not say, EXAONE 4.0 has one and no sliding layer; when every layer
        slides the first part has none), and for a `hybrid` model its recurrent layers' state.
        Sets state_parts, swa_n_layer (n_swa 0 without a sliding-window cache), kv_layers,
        n_kv_heads (of the attention layers: llama.cpp reports layer 0's, 0 if it is recurrent)
        and recurrent."""
        L = self._L
        try:
            self.forward([(0, 0, np.zeros(2, np.int64))])
            raw = self.raw_state(0)
            self.state_base_bytes = int(raw.nbytes)  # two cells and whatever does not grow with them
            err = None
            for parts in (1, 2):
                try:
                    info = parse_seq_state(out_of_stream(raw.copy(), 0, self.n_stream, parts, None if hybrid else 0),
                                           parts, None if hybrid else 0)
                    break
                except PrefixEdgeError as e:
                    err = err or e
            else:
                raise err
        except PrefixEdgeError as e:
            self.close()
            raise PrefixEdgeError(f"cannot read this model's sequence-state layout: {e}") from None
        finally:
            if self.ctx is not None:
                L.llama_memory_seq_rm(self.mem, 0, -1, -1)
        self.state_parts = len(info.parts)
        self.swa_n_layer = info.swa.n_layer if info.swa else 0
        if info.swa is None:
            self.n_swa = 0
        self.kv_layers = info.n_layer
        self.recurrent = info.recurrent.facts() if info.recurrent else None
        lay = next((lay for part in info.parts for lay in part.layers), None)
        if lay is None:
            raise PrefixEdgeError("cannot read this model's sequence-state layout: it has no KV layer")
        per_row = (lay.k_row_bytes // Q8_0_BYTES * Q8_0_BLOCK if lay.k_type == GGML_TYPE_Q8_0
                   else lay.k_row_bytes // (4 if lay.k_type == 0 else 2))
        self.n_kv_heads = per_row // self.head_dim

    def expected_state(self, n_tokens: int | None = None) -> dict:
        """What a seq-state blob for this model and context must look like."""
        t = KV_TYPES[self.kv_type]
        exp = {"n_layer": self.n_layers if self.kv_layers is None else self.kv_layers, "k_type": t, "v_type": t,
               "k_row_bytes": row_bytes(t, self.n_kv_heads * self.head_dim),
               "v_row_bytes": row_bytes(t, self.n_kv_heads * self.head_dim_v),
               "n_embd_v_gqa": self.n_kv_heads * self.head_dim_v, "v_trans": self.v_trans,
               "max_cells": self.max_ctx_seq}
        if self.n_swa:
            exp["swa"] = {"n_layer": self.swa_n_layer, "window": self.n_swa}
        if self.recurrent:
            exp["recurrent"] = self.recurrent
        if n_tokens is not None:
            exp["cell_count"] = n_tokens
        return exp

    def load_prefix(self, path: Path) -> Prefix:
        """Read a prefix file through the codec (prefixfile.py) and check it for this model."""
        tensors, meta = prefixfile.read(path, [prefixfile.STATE, prefixfile.IDS])
        return self.prefix_from(tensors, meta, str(path))

    def prefix_from(self, tensors: dict, meta: dict, where: str, values_checked: bool = False) -> Prefix:
        """A Prefix from a prefix file's tensors and metadata; the blob is parsed and checked
        against this model before anything reaches llama.cpp (its values walked for NaN/inf
        unless `values_checked`: this file passed that walk before, unchanged since)."""
        if meta.get("backend", self.name) != self.name:
            raise PrefixEdgeError(f"{where}: prefix baked for the {meta['backend']!r} backend, not gguf")
        baked_with = meta.get("state_version")
        if baked_with and _format_part(baked_with) != _format_part(self.state_version):
            raise PrefixEdgeError(f"{where}: KV state written by {baked_with}, this runtime reads "
                                  f"{self.state_version}: rebake the prefix")
        prefixfile.require(tensors, [prefixfile.STATE, prefixfile.IDS], where)
        ids = prefixfile.ids_of(tensors[prefixfile.IDS], where)
        state = tensors[prefixfile.STATE]
        if state.dtype != np.uint8 or state.ndim != 1:
            raise PrefixEdgeError(f"{where}: tensor 'state' is {state.dtype}{list(state.shape)}, "
                                  "expected uint8 [bytes]")
        prefix = Prefix(ids, np.ascontiguousarray(state), meta, int(state.nbytes),
                        n_virtual=prefixfile.n_virtual(meta, where))
        self._check(prefix, where, walk=not values_checked)
        prefix.checked_by = self  # seq_restore need not walk this blob again
        return prefix

    def read_prefix_ids(self, path: Path) -> np.ndarray:
        return prefixfile.read_ids(path)

    def prefix_bytes(self, n_tokens: int, file_bytes: int) -> int:
        """The most host memory a loaded prefix holds: its state blob, read whole from its
        file (which holds the blob, the ids and a header)."""
        return file_bytes

    def _check(self, prefix: Prefix, where: str = "prefix", walk: bool = True) -> None:
        if not isinstance(prefix.kv, np.ndarray) or prefix.kv.dtype != np.uint8:
            raise PrefixEdgeError(f"{where}: not a gguf prefix (KV is not a seq-state blob)")
        try:
            info = self.parse_state(prefix.kv)
            check_seq_state(info, self.expected_state(prefix.n_tokens))
        except PrefixEdgeError as e:
            raise PrefixEdgeError(f"{where}: {e}") from None
        if walk and not all_finite(prefix.kv, info):  # restored, NaN/inf would poison the shared cache
            raise PrefixEdgeError(f"{where}: the prefix KV holds NaN or infinite values")
        if np.any(prefix.ids < 0) or np.any(prefix.ids >= self.n_vocab):
            raise PrefixEdgeError(f"{where}: prefix ids outside this model's vocabulary "
                                  f"(0..{self.n_vocab - 1})")

    def state_blob(self) -> bytes:
        """The one-sequence API's KV as a seq-state blob (after prefill of a prefix), checked."""
        blob = self.seq_snapshot(self.single_seq, np.zeros(self.pos, np.int64)).kv.tobytes()
        check_seq_state(self.parse_state(blob), self.expected_state(self.pos))
        return blob

    def save_prefix(self, path: Path, ids: np.ndarray, metadata: dict[str, str]) -> None:
        """Write the current sequence (a prefilled prefix) as a prefix file."""
        write_prefix(path, ids, self.state_blob(), metadata, self.kv_type, self.expected_state())

    def write_snapshot(self, path: Path, prefix: Prefix, metadata: dict[str, str],
                       mac_key: bytes | None = None) -> None:
        """Write a Prefix (a seq_snapshot) as a prefix file, the codec's format."""
        write_prefix(path, prefix.ids, prefix.kv, {**metadata, "n_virtual": str(prefix.n_virtual)},
                     self.kv_type, self.expected_state(), mac_key)

    def snapshot_bytes(self, n_tokens: int) -> int:
        """At most the bytes of a snapshot's file of n_tokens positions (its state blob: every
        cell's rows, a cell's own record, the recurrent state the layout read showed; and the
        file's ids and header), with room to spare: a larger file is refused unread."""
        return 2 * (self.state_base_bytes + (self.bytes_per_cell + 64) * n_tokens) + 8 * n_tokens + (1 << 20)

    # -- KV as data (runtime/engines/kv.py) ----------------------------------------------------------
    def kv_of(self, prefix: Prefix) -> KvLayers:
        """A state's K and V per layer, [positions, kv_heads, head_dim], in position order
        (float16 from an f16 cache; a q8_0 cache's values dequantized to float32). Only a
        model whose every layer holds every position (no sliding-window or recurrent part)."""
        from ....llamacpp.seqstate import extract_kv

        if not self.keeps_partial or self.state_parts != 1:
            raise PrefixEdgeError("this model's state is not per-position KV of every layer")
        info = self.parse_state(prefix.kv)
        ks, vs = extract_kv(prefix.kv, info, self.kv_rotation if self.kv_type != "f16" else 0)
        n, nk = info.cell_count, self.n_kv_heads
        order = None if np.array_equal(info.positions, np.arange(n)) else np.argsort(info.positions, kind="stable")
        if order is not None and not np.array_equal(info.positions[order], np.arange(n)):
            raise PrefixEdgeError("a state whose cells are not positions 0..n-1")
        pick = (lambda a: a) if order is None else (lambda a: a[order])  # in order: views of the blob
        return KvLayers([pick(k).reshape(n, nk, -1) for k in ks], [pick(v).reshape(n, nk, -1) for v in vs])

    def seq_reserve(self, seq: int, positions: int) -> None:
        """Room for `positions` in every stream now (context.py grow), not at a decode."""
        from .context import grow

        grow(self, positions)

    def seq_extend(self, seq: int, kv: KvLayers) -> int:
        """Append `kv`'s positions to sequence `seq` (keys already rotated for where they land);
        its next position. llama.cpp sets a sequence's state whole: the state is read out,
        extended and written back."""
        n = self.seq_pos(seq)
        have = self.kv_of(self.seq_snapshot(seq, np.zeros(n, np.int64))) if n else None
        whole = kv if have is None else have.then(kv)
        return self.seq_restore(seq, self.prefix_of(whole, np.zeros(whole.n, np.int64)))

    def prefix_of(self, kv: KvLayers, ids: np.ndarray, n_virtual: int = 0,
                  sliding: tuple[int, ...] = (), window: int = 0) -> Prefix:
        """A Prefix of positions 0..n-1 holding `kv` (the inverse of kv_of), restorable here.
        `sliding`/`window`: which of kv's layers are sliding-window layers, and their window (the
        model's config): llama.cpp keeps those in a cache of their own (iSWA), the last
        min(n, window) cells."""
        from ....llamacpp.seqstate_write import build_seq_state

        if self.n_swa and (len(sliding) != self.swa_n_layer or window != self.n_swa):
            raise PrefixEdgeError(
                f"the GGUF model keeps {self.swa_n_layer} sliding-window layers of {self.n_swa} positions, "
                f"the KV given {len(sliding)} of {window}: cannot place it in the model's caches")
        n = kv.n
        k = [np.ascontiguousarray(a, np.float16).reshape(n, -1) for a in kv.k]
        v = [np.ascontiguousarray(a, np.float16).reshape(n, -1) for a in kv.v]
        blob = np.frombuffer(build_seq_state(k, v, self.v_trans, kv_type=KV_TYPES[self.kv_type],
                                             rotation=self.kv_rotation if self.kv_type != "f16" else 0,
                                             swa_layers=sliding if self.n_swa else (), window=self.n_swa),
                             np.uint8)  # read-only: llama.cpp only reads it
        return Prefix(np.asarray(ids, np.int64), blob, {}, blob.nbytes, n_virtual=n_virtual, checked_by=self)


def write_prefix(path: Path, ids: np.ndarray, blob: bytes, metadata: dict[str, str],
                 kv_type: str = "f16", expected: dict | None = None, mac_key: bytes | None = None) -> None:
    """Write a gguf prefix file; the blob is walked first (against `expected`, the model's
    expected_state, where given), its facts go into the metadata.
    `metadata["n_virtual"]` (default 0) counts the leading cells that have no id in `ids`."""
    ids = np.asarray(ids, np.int64).reshape(-1)
    meta = {k: str(v) for k, v in metadata.items()}
    n_cells = prefixfile.n_virtual(meta, "write_prefix") + len(ids)
    expected = {**(expected or {}), "cell_count": n_cells, "k_type": KV_TYPES[kv_type], "v_type": KV_TYPES[kv_type]}
    info = parse_seq_state(blob, 2 if "swa" in expected else 1, (expected.get("recurrent") or {}).get("layers", 0))
    check_seq_state(info, expected)
    meta.update({"backend": BACKEND, "state_format": STATE_FORMAT,
                 "state_version": state_version(), "n_layer": str(sum(p.n_layer for p in info.parts)),
                 "v_trans": str(int(info.v_trans)), "kv_type": kv_type, "n_tokens": str(n_cells)})
    if info.recurrent:
        meta["recurrent_layers"] = str(len(info.recurrent.layers))
    prefixfile.write(path, ids, {prefixfile.STATE: np.frombuffer(bytes(blob), np.uint8)}, meta, mac_key)

