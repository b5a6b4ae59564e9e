"""The ONNX engine's state type and its format: a sequence's state as arrays (`KvArrays`), and
`KvFormat`, what such a state must be for one graph, built once at open from the graph's facts.
It reads prefix files through the prefix-file codec (bundle/prefixfile.py), checks them for the
graph (KV shapes and dtype, a hybrid's recurrent states, finite values), writes them back, and
turns a state into per-layer KV and back (runtime/engines/kv.py).

Prefix file (safetensors): `past_key_values.{i}.key|value` [1, kv_heads_i, P, head_dim_i] (each
layer's shape as the graph declares it: Gemma 4's differ) in the graph's KV dtype (or stored f16 /
q8_0: prefixfile.KV_STORES), a hybrid's recurrent states float32 (`past_conv.{i}`, `past_ssm.{i}`), `prefix_ids` [P - n_virtual] int64, and metadata
{fingerprint, task, backend, n_virtual}.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ....bundle import prefixfile
from ....errors import PrefixEdgeError
from ..kv import KvLayers
from ..prefix import Prefix

BACKEND = "onnx"


class KvArrays:
    """The ONNX engine's state (Prefix.state): every attention layer's K and V, [1, n_kv_heads,
    P, head_dim] in the graph's order, then a hybrid's recurrent states (float32).

    `lasting`: a task's prefix, restored again and again: on the fused graph it may live in a
    KV buffer of its own, its home (engine.py _start), its K and V then views of the buffer's
    first positions; `home` is the engine's record of it. A cache's entry is not lasting."""

    def __init__(self, kv: list[np.ndarray], states: list[np.ndarray] = (), lasting: bool = False):
        self.kv, self.states, self.lasting = list(kv), list(states), lasting
        self.home: tuple | None = None  # (engine ref, KvBuffer): set by the engine that homes it

    @property
    def nbytes(self) -> int:
        """The host memory it holds: its arrays, or its home buffer and its states."""
        held = self.home[1].nbytes if self.home is not None else sum(a.nbytes for a in self.kv)
        return held + sum(a.nbytes for a in self.states)


@dataclass(frozen=True)
class KvFormat:
    """What a state of one graph is, from the graph's facts."""

    past_names: tuple[str, ...]    # the KV inputs, K and V per layer in order
    state_names: tuple[str, ...]   # a hybrid's recurrent state inputs
    state_shapes: tuple[tuple[int, ...], ...]
    kv_shapes: tuple[tuple[int, int], ...]  # each KV input's (heads, head_dim)
    kv_dtype: type
    position_values: int           # the values one position adds to every KV input
    store: str = "f32"             # how written prefix files store KV (prefixfile.KV_STORES)

    def state_bytes(self) -> int:
        """Bytes of a sequence's recurrent states (a hybrid's; fixed, whatever its length)."""
        return sum(4 * int(np.prod(s)) for s in self.state_shapes)

    def snapshot_bytes(self, n_tokens: int) -> int:
        """At most the bytes of a snapshot's file of n_tokens positions (every KV tensor at 4
        bytes a value and its q8_0 scales, the recurrent states, the ids, the header), with
        room to spare: a larger file is refused unread."""
        return 2 * (4 * self.position_values * n_tokens + self.state_bytes()) + 8 * n_tokens + (1 << 20)

    def read(self, tensors: dict, meta: dict, where: str, values_checked: bool = False,
             lasting: bool = False) -> Prefix:
        """A Prefix from a prefix file's tensors and metadata, checked against this graph
        (values_checked: this file's values passed the finiteness walk before, unchanged since)."""
        if meta.get("backend", BACKEND) != BACKEND:
            raise PrefixEdgeError(f"{where}: prefix baked for the {meta['backend']!r} backend, not onnx")
        prefixfile.require(tensors, [prefixfile.IDS], where)
        ids = prefixfile.ids_of(tensors[prefixfile.IDS], where)
        decoded = prefixfile.decode_kv(tensors, meta, list(self.past_names), self.kv_dtype, where)
        kv = [decoded[n] for n in self.past_names]
        prefixfile.require(tensors, list(self.state_names), where)
        states = [tensors[n] for n in self.state_names]
        n_virtual = prefixfile.n_virtual(meta, where)  # trained positions before the ids
        for n, t, (heads, dim) in zip(self.past_names, kv, self.kv_shapes):
            want = (1, heads, n_virtual + len(ids), dim)
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
        return Prefix(ids, KvArrays(kv, states, lasting), meta, n_virtual=n_virtual)

    def write(self, path: Path, ids: np.ndarray, kv: list[np.ndarray], states: list[np.ndarray],
              metadata: dict[str, str], mac_key: bytes | None = None) -> None:
        """A prefix file of `kv` (the graph's order) and `states`, its KV stored as `store`."""
        write_prefix(path, ids, dict(zip(self.past_names, kv)), metadata, self.store,
                     dict(zip(self.state_names, states)), mac_key)

    def kv_of(self, state: KvArrays) -> KvLayers:
        """A state's K and V per layer, [positions, kv_heads, head_dim] (the KV dtype)."""
        kv = state.kv
        return KvLayers([np.ascontiguousarray(kv[i][0].transpose(1, 0, 2)) for i in range(0, len(kv), 2)],
                        [np.ascontiguousarray(kv[i][0].transpose(1, 0, 2)) for i in range(1, len(kv), 2)])

    def prefix_of(self, kv: KvLayers, ids: np.ndarray, n_virtual: int = 0, lasting: bool = False) -> Prefix:
        """A Prefix of positions 0..n-1 holding `kv` (the inverse of kv_of). The own graph caches
        every position of every layer, sliding ones too."""
        arrays = []
        for k, v in zip(kv.k, kv.v):
            arrays += [np.ascontiguousarray(a.astype(self.kv_dtype, copy=False).transpose(1, 0, 2)[None])
                       for a in (k, v)]
        return Prefix(np.asarray(ids, np.int64), KvArrays(arrays, lasting=lasting), {}, n_virtual=n_virtual)


def write_prefix(path: Path, ids: np.ndarray, kv: dict[str, np.ndarray], metadata: dict[str, str],
                 store: str = "f32", states: dict[str, np.ndarray] | None = None,
                 mac_key: bytes | None = None) -> None:
    """`states`: a hybrid's recurrent states, stored float32 whatever `store` the KV takes."""
    tensors, extra = prefixfile.encode_kv(kv, store)
    tensors.update({n: np.ascontiguousarray(a, np.float32) for n, a in (states or {}).items()})
    prefixfile.write(path, ids, tensors, {**metadata, **extra, "backend": BACKEND}, mac_key)
