"""A GGUF model's own MTP head (multi-token prediction: Qwen3.5's `mtp.*` block, llama.cpp's
`blk.N.nextn.*`) as a drafter for `speculative="mtp"`.

The head is one more decoder layer after the model: at position p it reads the token at p and
the model's hidden state at p - 1 and predicts the token at p + 1. llama.cpp runs it in a
context of its own (LLAMA_CONTEXT_TYPE_MTP) with a KV cache of its own (one layer), fed rows
that carry both a token id and that hidden state. The model's context writes each forwarded
token's hidden state ("nextn embeddings": the final-normed hidden, what the head was trained
on) beside its logits; the engine hands them here (`observe`). A draft then feeds the head what
it has not seen yet, the next token with the hidden state before it, and chains: each drafted
token goes back in with the head's own output row, k times; the drafted rows leave its cache
again. The model verifies the draft in one forward (scheduler/drafting.py), so the answer is
the model's whatever the head says: the head only decides how many tokens a forward keeps.

llama.cpp exposes the hidden-state switches in llama-ext.h (C++ linkage, no C symbol yet): they
are called by their Itanium-mangled names, the same on x86-64 and arm64 (pointer, bool and int
arguments: the C calling convention). `llama_batch_ext_set_embd_state` is a stub in this release
(it returns false); a row's hidden state goes in through `set_embd_token`, whose width on an MTP
context is the model's hidden size.

What the head attends over: a restored prefix's tokens (a baked prefix's positions were never
forwarded here, so their hidden states are unknown: each goes in with a zero row, as llama.cpp's
drafter starts a sequence), then the tokens the engine forwarded, at most WINDOW of them before
its first draft. That shapes drafts only, never the answer.
"""

from __future__ import annotations

import ctypes

import numpy as np

from ....errors import PrefixEdgeError

WINDOW = 512  # hidden rows kept per sequence before the head has seen them
_SET_NEXTN = "_Z26llama_set_embeddings_nextnP13llama_contextbb"
_GET_NEXTN_ITH = "_Z30llama_get_embeddings_nextn_ithP13llama_contexti"


def nextn_functions(L):
    """llama-ext.h's (set_embeddings_nextn, get_embeddings_nextn_ith), or None where this build
    has none."""
    lib = getattr(L, "_lib", None)
    try:
        set_fn, get_fn = getattr(lib, _SET_NEXTN), getattr(lib, _GET_NEXTN_ITH)
    except AttributeError:
        return None
    set_fn.argtypes, set_fn.restype = [ctypes.c_void_p, ctypes.c_bool, ctypes.c_bool], None
    get_fn.argtypes, get_fn.restype = [ctypes.c_void_p, ctypes.c_int32], ctypes.POINTER(ctypes.c_float)
    return set_fn, get_fn


class _Lane:
    """One sequence's rows not yet fed to the head: token and hidden state by position."""

    __slots__ = ("tok", "hid", "next")

    def __init__(self):
        self.tok: dict[int, int] = {}
        self.hid: dict[int, np.ndarray] = {}
        self.next: int | None = None  # the position the head's cache expects next (None: empty)


class MtpHead:
    """The MTP context beside engine `be`'s, one lane per sequence, made from `model`: the
    engine's own (its GGUF holds the head) or a head GGUF of its own (llama.cpp's --mtp export).
    Touched by the engine's thread only."""

    def __init__(self, be, n_ctx_seq: int, funcs, model):
        L = self._L = be._L
        self.be = be
        self.set_nextn, self.get_nextn = funcs
        cp = L.llama_context_default_params()
        cp.ctx_type = L.LLAMA_CONTEXT_TYPE_MTP
        cp.n_seq_max = be.n_seq_max
        cp.n_ctx = n_ctx_seq * be.n_seq_max
        cp.kv_unified = False  # a stream per sequence, as the model's
        cp.n_batch = cp.n_ubatch = WINDOW + 1
        cp.no_perf = True
        cp.n_threads = cp.n_threads_batch = be.threads
        self.ctx = L.llama_init_from_model(model, cp)  # the model's own head, or a head file's (engine.py)
        if not self.ctx:
            raise PrefixEdgeError("cannot create llama.cpp's MTP context for this model's head")
        self.set_nextn(self.ctx, True, True)  # the head's own output row, for the next draft
        self.mem = L.llama_get_memory(self.ctx)
        self.n_embd = be.n_embd
        self.lanes: dict[int, _Lane] = {}

    def observe(self, seq: int, pos: int, ids: np.ndarray, first_row: int) -> None:
        """The model forwarded `ids` at pos.. in batch rows first_row..: their hidden states."""
        lane = self.lanes.setdefault(seq, _Lane())
        n = len(ids)
        skip = max(0, n - WINDOW)
        ctx = self.be.ctx
        for j in range(skip, n):
            ptr = self.get_nextn(ctx, first_row + j)
            if not ptr:
                return
            lane.tok[pos + j] = int(ids[j])
            lane.hid[pos + j] = np.ctypeslib.as_array(ptr, shape=(self.n_embd,)).copy()
        if len(lane.hid) > WINDOW:  # the oldest rows the head never saw leave
            for p in sorted(lane.hid)[:len(lane.hid) - WINDOW]:
                lane.hid.pop(p, None)
                lane.tok.pop(p, None)

    def restored(self, seq: int, ids: np.ndarray, n: int, first: int = 0) -> None:
        """The model's sequence now holds a restored state of n positions whose tokens are
        `ids` (positions first..: a trained prefix's virtual ones have none): the head reads
        them (its last WINDOW) at its first draft, each with a zero hidden state, as llama.cpp's
        drafter starts a sequence; their hidden states were never computed here."""
        self.reset(seq)
        lane = self.lanes[seq] = _Lane()
        zero = np.zeros(self.n_embd, np.float32)
        for p in range(max(first, n - WINDOW), n):
            lane.tok[p] = int(ids[p - first])
            lane.hid[p - 1] = zero
        if n > 0:
            lane.hid[n - 1] = zero

    def copied(self, src: int, dst: int) -> None:
        """The model's sequence dst is now a copy of src: so is the head's."""
        self.reset(dst)
        lane = self.lanes.get(src)
        if lane is None:
            return
        twin = self.lanes[dst] = _Lane()
        twin.tok, twin.hid, twin.next = dict(lane.tok), dict(lane.hid), lane.next
        if lane.next is not None:
            self._L.llama_memory_seq_cp(self.mem, src, dst, -1, -1)

    def truncate(self, seq: int, pos: int) -> None:
        """The model's sequence was cut back to positions ..pos-1."""
        lane = self.lanes.get(seq)
        if lane is None:
            return
        for d in (lane.tok, lane.hid):
            for p in [p for p in d if p >= pos]:
                del d[p]
        if lane.next is not None and lane.next > pos:
            self._L.llama_memory_seq_rm(self.mem, seq, pos, -1)
            lane.next = pos

    def reset(self, seq: int) -> None:
        """The model's sequence was emptied or replaced: the head starts over."""
        self.lanes.pop(seq, None)
        self._L.llama_memory_seq_rm(self.mem, seq, -1, -1)

    def draft(self, seq: int, token: int, pos: int, k: int) -> list[int]:
        """Up to k greedy tokens to follow `token`, which the model forwards next at `pos`;
        none where the hidden state before it is unknown."""
        lane = self.lanes.get(seq)
        if lane is None or k < 1 or (pos - 1) not in lane.hid:
            return []
        L = self._L
        # the entries the head has not seen: (token at p, hidden at p - 1), contiguous up to pos
        start = pos
        while start - 1 in lane.tok and start - 2 in lane.hid and (lane.next is None or start > lane.next):
            start -= 1
        if lane.next is not None and start != lane.next:  # a gap: the head starts over here
            L.llama_memory_seq_rm(self.mem, seq, -1, -1)
        rows = [(lane.tok[p], lane.hid[p - 1], p) for p in range(start, pos)] + [(token, lane.hid[pos - 1], pos)]
        out: list[int] = []
        b = L.llama_batch_ext_init(self.ctx)
        if not b:
            return []
        try:
            if not self._process(b, seq, rows):
                L.llama_memory_seq_rm(self.mem, seq, -1, -1)
                lane.next = None
                return []
            lane.next = pos + 1
            for p in [p for p in lane.hid if p < pos - 1]:  # seen by the head now
                del lane.hid[p]
            for p in [p for p in lane.tok if p < pos]:
                del lane.tok[p]
            while True:
                lg = L.llama_get_logits_ith(self.ctx, -1)
                h = self.get_nextn(self.ctx, -1)
                if not lg or not h:
                    break
                out.append(int(np.ctypeslib.as_array(lg, shape=(self.be.n_vocab,)).argmax()))
                if len(out) >= k:
                    break
                row = np.ctypeslib.as_array(h, shape=(self.n_embd,)).copy()
                if not self._process(b, seq, [(out[-1], row, pos + len(out))]):
                    break
        finally:
            L.llama_batch_ext_free(b)
            L.llama_memory_seq_rm(self.mem, seq, pos + 1, -1)  # the drafts leave; pos's entry stays
        return out

    def _process(self, b, seq: int, rows: list[tuple[int, np.ndarray, int]]) -> bool:
        """Feed rows (token, hidden state before it, position) to the head in chunks; the last
        row's logits and output row are kept."""
        L = self._L
        for start in range(0, len(rows), WINDOW + 1):
            chunk = rows[start:start + WINDOW + 1]
            L.llama_batch_ext_clear(b)
            keep = []  # the rows' memory, until the batch is processed
            for i, (tok, hid, p) in enumerate(chunk):
                idx = L.llama_batch_ext_add_token(b, seq, int(tok))
                if idx < 0:
                    return False
                hid = np.ascontiguousarray(hid, np.float32)
                keep.append(hid)
                emb = L.llama_embd(hid.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), 1, self.n_embd)
                pos = (L.llama_pos * 4)(p, p, p, 0)
                if not (L.llama_batch_ext_set_embd_token(b, idx, emb) and L.llama_batch_ext_set_pos(b, idx, pos)
                        and L.llama_batch_ext_set_output_logits(b, idx, start + i == len(rows) - 1)):
                    return False
            if self.be.process(self.ctx, b) != 0:
                return False
        return True

    def close(self) -> None:
        if self.ctx:
            self._L.llama_free(self.ctx)
        self.ctx = None
