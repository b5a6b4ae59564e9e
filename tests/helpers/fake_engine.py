"""A fake engine for the scheduler's unit tier: the engine protocol (runtime/engines/protocol.py) over
numpy, no model. A sequence's state is the list of token ids at its positions; the logits of a
forward are a deterministic function of the whole list (a seeded normal draw keyed by a hash of
it), so, as with a real model, a token depends on everything before it, a restored or copied
state gives what its prefill gave, and one sequence's answer never depends on another's.

`gate`: when set, every forward first takes one permit from it, so a test can hold the engine
between steps (and release one step at a time; `held` is set while a forward waits there).
`log`: each forward's items, in order.

It implements the whole engine protocol (runtime/engines/protocol.py `Engine`;
tests/test_engine_protocol.py checks): prefix files go through the real prefix-file codec, the
state stored as the token ids it holds.
"""

from __future__ import annotations

import hashlib
import threading

import numpy as np
from tokenizers import Tokenizer, models, pre_tokenizers, decoders

from prefix_edge.bundle import prefixfile
from prefix_edge.errors import PrefixEdgeError
from prefix_edge.runtime.engines.protocol import Embeddings, OneSequence, Opened, StateLayout, fit_prefix
from prefix_edge.runtime.engines.kv import KvLayers
from prefix_edge.runtime.engines.prefix import Prefix

N_VOCAB = 64
EOS = 0
STATE = "fake_state"  # a prefix file's tensor: the ids at its positions (virtual ones too)
SLOT = "onnx"  # the bundle backend whose files a fake opened from a bundle stands in for (fake_bundle.py)


def tokenizer(n_vocab: int = N_VOCAB, unknown: str | None = None) -> Tokenizer:
    """Token i decodes to 'w{i} ' (token 0, the end of sequence, to nothing). A word not in the
    vocabulary reads as the end of sequence, or with `unknown` as the last token, which then
    spells `unknown` (a bundle's tokenizer: prose around the words stays ordinary text)."""
    vocab = {"<eos>": 0, **{f"w{i}": i for i in range(1, n_vocab)}}
    if unknown is not None:
        vocab = {k: v for k, v in vocab.items() if v != n_vocab - 1} | {unknown: n_vocab - 1}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=unknown or "<eos>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    tok.add_special_tokens(["<eos>"])
    return tok


class Tokens(list):
    """The fake's state (Prefix.state): the token ids at its positions (virtual ones too)."""

    @property
    def nbytes(self) -> int:
        return 8 * len(self)


class FakeEngine(OneSequence):
    name = "fake"
    device = "cpu"
    threads = 1
    n_layers, n_kv_heads, head_dim, kv_dtype_name = 1, 1, 1, "int64"
    model_layers = 1
    single_seq = -1
    kv_cells_total = None  # no cache of cells (as ONNX)
    rope_layout = "halves"  # the fake's "keys" are the ids: kv_of / prefix_of carry them as data

    @classmethod
    def from_bundle(cls, bundle, model_hashes: dict[str, str], cfg) -> Opened:
        """A fake engine sized as `cfg` asks (no model file is read): a sequence per slot, and
        with `shared_kv` as many more for resident task prefixes (no cells counted, as ONNX)."""
        n_ctx = min(bundle.manifest.model.n_ctx, cfg.n_ctx or bundle.manifest.model.n_ctx)
        fit_prefix(cfg.longest_prefix, n_ctx)
        engine = cls(n_ctx=n_ctx, n_batch=max(256, cfg.prefill_chunk), name=SLOT)
        residents = tuple(range(cfg.slots, 2 * cfg.slots)) if cfg.shared_kv else ()
        return Opened(engine, n_ctx, None, cfg.shared_kv, request_seqs=tuple(range(cfg.slots)),
                      resident_seqs=residents)

    def __init__(self, n_vocab: int = N_VOCAB, n_ctx: int = 512, n_batch: int = 256,
                 keeps_partial: bool = True, eos_bias: float = 0.0, batches_sequences: bool = True,
                 name: str = "fake"):
        self.n_vocab, self.n_ctx, self.n_batch = n_vocab, n_ctx, n_batch
        self.name = name  # the backend it answers as: "fake", or in a bundle its SLOT
        # False: a token forwarded beside another sequence's gets other logits (as llama.cpp's
        # Gemma 3n): the fake then moves every logit of such a forward by its item count
        self.batches_sequences = batches_sequences
        self.keeps_partial = keeps_partial
        # one layer; a state that cannot be cut back is the fake's "recurrent" layer
        self.state_layout = StateLayout(kv_layers=1, recurrent_layers=0 if keeps_partial else 1)
        self.eos_bias = eos_bias  # added to the end-of-sequence logit (replies end sooner)
        self.seqs: dict[int, list[int]] = {}
        self.log: list[list[tuple[int, int, int]]] = []  # (seq, pos, n tokens) per forward
        self.gate: threading.Semaphore | None = None
        self.held = threading.Event()  # set while a forward waits at the gate
        self.fail_next: Exception | None = None  # the next forward raises this (an engine fault)
        self.closed = False

    # -- the protocol ----------------------------------------------------------------------
    def seq_restore(self, seq: int, prefix: Prefix | None, keep: int | None = None) -> int:
        state = [] if prefix is None else list(prefix.state)
        if keep is not None:
            if not self.keeps_partial and keep != len(state):
                raise PrefixEdgeError("cannot keep part of a state")
            state = state[:keep]
        self.seqs[seq] = state
        return len(state)

    def seq_copy(self, src: int, dst: int) -> None:
        self.seqs[dst] = list(self.seqs.get(src, []))

    def seq_snapshot(self, seq: int, ids: np.ndarray, n_virtual: int = 0) -> Prefix:
        return Prefix(np.asarray(ids, np.int64), Tokens(self.seqs[seq]), n_virtual=n_virtual)

    def forward(self, items: list[tuple]) -> list[np.ndarray]:
        if self.gate is not None:
            self.held.set()
            self.gate.acquire()
            self.held.clear()
        if self.fail_next is not None:
            e, self.fail_next = self.fail_next, None
            raise e
        if sum(np.size(it[2]) for it in items) > self.n_batch:
            raise PrefixEdgeError(f"forward exceeds n_batch={self.n_batch}")
        self.log.append([(seq, pos, int(np.size(ids))) for seq, pos, ids, *_ in items])
        out = []
        for seq, pos, ids, *rows in items:
            state = self.seqs.setdefault(seq, [])
            if pos != len(state):
                raise PrefixEdgeError(f"sequence {seq} is at position {len(state)}, not {pos}")
            state.extend(int(t) for t in np.asarray(ids).reshape(-1))
            if len(state) > self.n_ctx:
                raise PrefixEdgeError("context full")
            if rows:  # the last `rows` positions' logits, each of the state up to it
                n = min(int(rows[0]), int(np.size(ids)))
                out.append(np.stack([self.logits(state[:len(state) - n + 1 + j]) for j in range(n)]))
            else:
                out.append(self.logits(state))
        if not self.batches_sequences and len(items) > 1:
            out = [x + np.float32(0.5) * np.arange(x.shape[-1], dtype=np.float32) % len(items) for x in out]
        return out

    def kv_of(self, prefix: Prefix) -> KvLayers:
        a = np.asarray(prefix.state, np.int64).reshape(-1, 1, 1)
        return KvLayers([a.copy()], [a.copy()])

    def seq_reserve(self, seq: int, positions: int) -> None:
        pass

    def seq_extend(self, seq: int, kv: KvLayers) -> int:
        self.seqs.setdefault(seq, []).extend(int(t) for t in kv.k[0].reshape(-1))
        return len(self.seqs[seq])

    def prefix_of(self, kv: KvLayers, ids: np.ndarray, n_virtual: int = 0,
                  sliding: tuple[int, ...] = (), window: int = 0) -> Prefix:
        return Prefix(np.asarray(ids, np.int64), Tokens(int(t) for t in kv.k[0].reshape(-1)), n_virtual=n_virtual)

    def seq_truncate(self, seq: int, pos: int) -> None:
        if not self.verifies:
            raise PrefixEdgeError("cannot cut this state back")
        del self.seqs[seq][pos:]

    @property
    def verifies(self) -> bool:
        return self.keeps_partial

    drafts_mtp = False  # no MTP head

    def mtp_draft(self, seq: int, token: int, pos: int, k: int) -> list[int]:
        return []

    def logits(self, state: list[int]) -> np.ndarray:
        seed = int.from_bytes(hashlib.blake2b(np.asarray(state, np.int64).tobytes(), digest_size=8).digest(),
                              "little")
        x = np.random.default_rng(seed).standard_normal(self.n_vocab).astype(np.float32) * 3
        x[EOS] += self.eos_bias
        return x

    def seq_free(self, seq: int) -> None:
        self.seqs.pop(seq, None)

    def seq_pos(self, seq: int) -> int:
        return len(self.seqs.get(seq, []))

    def close(self) -> None:
        self.closed = True

    # -- prefixes in and out ---------------------------------------------------------------
    def prefix_from(self, tensors: dict, meta: dict, where: str, values_checked: bool = False,
                    lasting: bool = False) -> Prefix:
        if meta.get("backend", self.name) != self.name:
            raise PrefixEdgeError(f"{where}: prefix baked for the {meta['backend']!r} backend, not {self.name}")
        prefixfile.require(tensors, [prefixfile.IDS, STATE], where)
        ids = prefixfile.ids_of(tensors[prefixfile.IDS], where)
        state = Tokens(int(t) for t in np.asarray(tensors[STATE]).reshape(-1))
        n_virtual = prefixfile.n_virtual(meta, where)
        if len(state) != n_virtual + len(ids) or any(not 0 <= t < self.n_vocab for t in state):
            raise PrefixEdgeError(f"{where}: the prefix state does not fit this engine")
        return Prefix(ids, state, dict(meta), n_virtual=n_virtual)

    def load_prefix(self, path) -> Prefix:
        tensors, meta = prefixfile.read(path)
        return self.prefix_from(tensors, meta, str(path))

    def read_prefix_ids(self, path) -> np.ndarray:
        return prefixfile.read_ids(path)

    def save_prefix(self, path, ids: np.ndarray, metadata: dict[str, str]) -> None:
        """The one-sequence API's state (a prefilled prefix) as a prefix file."""
        self.write_snapshot(path, self.seq_snapshot(self.single_seq, ids), metadata)

    def write_snapshot(self, path, prefix: Prefix, metadata: dict[str, str], mac_key: bytes | None = None) -> None:
        prefixfile.write(path, prefix.ids, {STATE: np.asarray(prefix.state, np.int64)},
                         {**metadata, "n_virtual": str(prefix.n_virtual), "backend": self.name}, mac_key)

    def snapshot_bytes(self, n_tokens: int) -> int:
        return 16 * n_tokens + (1 << 20)  # its state: an int64 a position, and the ids

    def state_info(self) -> dict:
        return {"kind": "fake"}

    def prefix_bytes(self, n_tokens: int, file_bytes: int) -> int:
        return file_bytes

    def memory_info(self) -> dict[str, dict]:
        return {}

    takes_embeddings = False

    def prefill_embeddings(self, emb: np.ndarray) -> np.ndarray:
        raise PrefixEdgeError("the fake engine takes token ids only")

    def embeddings(self, max_batch: int) -> Embeddings:
        def refuse(max_tokens: int):
            raise PrefixEdgeError("the fake engine has no hidden states")
        return Embeddings(0, "the fake engine has no hidden states", 1, refuse)
