"""The ONNX engine's prefix files (a mixin of OnnxBackend, engine.py): read through the bundle's
codec and checked for this graph (KV shapes and dtype, a hybrid's recurrent states, finite
values), written from a sequence or a snapshot.

Prefix file (safetensors): `past_key_values.{i}.key|value` [1, n_kv_heads, P, head_dim] in the
graph's KV dtype (or kv_store f16 / q8_0), a hybrid's recurrent states float32
(`past_conv.{i}`, `past_ssm.{i}`), `prefix_ids` [P] int64, and metadata {fingerprint, task,
backend}. A Prefix's `kv` lists the KV arrays in past_names order, then the states in
state_names order.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ....bundle import prefixfile
from ....errors import PrefixEdgeError
from ..prefix import Prefix


class PrefixFiles:
    def load_prefix(self, path: Path) -> Prefix:
        """Read a prefix file through the codec (prefixfile.py) and check it for this model."""
        tensors, meta = prefixfile.read(path)
        return self.prefix_from(tensors, meta, str(path))

    def prefix_from(self, tensors: dict, meta: dict, where: str, values_checked: bool = False) -> Prefix:
        """A Prefix from a prefix file's tensors and metadata, checked against this model
        (values_checked: this file's values passed the finiteness walk before, unchanged since)."""
        if meta.get("backend", self.name) != self.name:
            raise PrefixEdgeError(f"{where}: prefix baked for the {meta['backend']!r} backend, not onnx")
        prefixfile.require(tensors, [prefixfile.IDS], where)
        ids = prefixfile.ids_of(tensors[prefixfile.IDS], where)
        decoded = prefixfile.decode_kv(tensors, meta, self.past_names, self.kv_dtype, where)
        kv = [decoded[n] for n in self.past_names]
        prefixfile.require(tensors, self.state_names, where)
        states = [tensors[n] for n in self.state_names]
        n_virtual = prefixfile.n_virtual(meta, where)  # trained positions before the ids
        want = (1, self.n_kv_heads, n_virtual + len(ids), self.head_dim)
        for n, t in zip(self.past_names, kv):
            if t.shape != want or t.dtype != self.kv_dtype:
                raise PrefixEdgeError(
                    f"{where}: tensor {n} is {t.dtype}{list(t.shape)}, the model needs "
                    f"{np.dtype(self.kv_dtype)}{list(want)}")
            if not values_checked and not np.isfinite(t).all():
                raise PrefixEdgeError(f"{where}: the prefix KV holds NaN or infinite values")
        for n, t, shape in zip(self.state_names, states, self.state_shapes):
            if t.shape != shape or t.dtype != np.float32:
                raise PrefixEdgeError(f"{where}: recurrent state {n} is {t.dtype}{list(t.shape)}, the model "
                                      f"needs float32{list(shape)}")
            if not values_checked and not np.isfinite(t).all():
                raise PrefixEdgeError(f"{where}: the recurrent state {n} holds NaN or infinite values")
        kv += states
        return Prefix(ids, kv, meta, sum(t.nbytes for t in kv), n_virtual=n_virtual)

    def read_prefix_ids(self, path: Path) -> np.ndarray:
        return prefixfile.read_ids(path)

    def state_info(self) -> dict:
        """What restoring a prefix depends on beyond the model files (recorded in the manifest)."""
        return {}

    @property
    def kv_dtype_name(self) -> str:
        return np.dtype(self.kv_dtype).name

    def save_prefix(self, path: Path, ids: np.ndarray, metadata: dict[str, str]) -> None:
        """Write the current sequence (a prefilled prefix) as a prefix file, its KV stored as
        the engine's prefix_store (prefixfile.KV_STORES)."""
        past, pos = self.seqs[self.single_seq]
        if self.fused:
            kv = [a[:, :, :pos].copy() for a in past.arrays]
        else:
            kv = [v if isinstance(v, np.ndarray) else v.numpy() for v in past]
        write_prefix(path, ids, dict(zip(self.past_names, kv)), metadata, self.prefix_store,
                     dict(zip(self.state_names, self.rec.get(self.single_seq, []))))

    def write_snapshot(self, path: Path, prefix: Prefix, metadata: dict[str, str],
                       mac_key: bytes | None = None) -> None:
        n = len(self.past_names)
        write_prefix(path, prefix.ids, dict(zip(self.past_names, prefix.kv[:n])),
                     {**metadata, "n_virtual": str(prefix.n_virtual)}, self.prefix_store,
                     dict(zip(self.state_names, prefix.kv[n:])), mac_key)

    def snapshot_bytes(self, n_tokens: int) -> int:
        """At most the bytes of a snapshot's file of n_tokens positions (every KV tensor at 4
        bytes a value and its q8_0 scales, the recurrent states, the ids, the header), with
        room to spare: a larger file is refused unread."""
        return 2 * (4 * self.position_values * n_tokens + self.state_bytes()) + 8 * n_tokens + (1 << 20)


def write_prefix(path: Path, ids: np.ndarray, kv: dict[str, np.ndarray], metadata: dict[str, str],
                 store: str = "f32", states: dict[str, np.ndarray] | None = None,
                 mac_key: bytes | None = None) -> None:
    """`states`: a hybrid's recurrent states, stored float32 whatever `store` the KV takes."""
    tensors, extra = prefixfile.encode_kv(kv, store)
    tensors.update({n: np.ascontiguousarray(a, np.float32) for n, a in (states or {}).items()})
    prefixfile.write(path, ids, tensors, {**metadata, **extra, "backend": "onnx"}, mac_key)
