"""Pooled embeddings from the GGUF engine's model: llama.cpp's embeddings mode.

A second llama.cpp context on the engine's model (weights shared, nothing copied), made with
`embeddings=True` and a pooling type (MEAN or LAST: llama.cpp pools the final norm's output,
what the lm_head reads, over each sequence of a batch), one per pooling asked for, made on first
use. Several texts go in one llama_decode, one sequence each, in one cache of `cells` cells
cleared before each batch. llama.cpp pools a sequence correctly only when it lies whole in one
micro-batch (split over two, its vector is silently wrong), so n_ubatch = n_batch = cells and a
batch holds at most `cells` tokens: the caller (runtime/embedding.py) packs them so.

Threads: these contexts are touched by the embedder's own thread only (runtime/embedding.py),
never by the scheduler's engine thread, which has a context of its own; llama.cpp allows
several contexts of one model, each used from one thread.
"""

from __future__ import annotations

import numpy as np

from ....errors import PrefixEdgeError

EMBED_THREADS = 1  # the embedder's llama.cpp threads (see _context)


class LlamaPooled:
    """`pooled(batch, pooling)`: one vector [n_embd] per token-id array of the batch."""

    def __init__(self, be, cells: int, n_seq: int):
        self.be, self.cells, self.n_seq = be, cells, n_seq
        self._ctx: dict[str, object] = {}  # pooling -> context
        self._batch = None

    def _context(self, pooling: str):
        pooling = "last" if pooling == "prompt" else pooling  # a wrapped text's last token
        ctx = self._ctx.get(pooling)
        if ctx is not None:
            return ctx
        be = self.be
        L = be._L
        if be.model is None:
            raise PrefixEdgeError("the gguf backend is closed")
        cp = L.llama_context_default_params()
        cp.n_ctx = cp.n_batch = cp.n_ubatch = self.cells
        cp.n_seq_max = self.n_seq
        cp.kv_unified = True  # the batch's sequences share one cache of `cells`
        cp.embeddings = True
        cp.pooling_type = {"mean": L.LLAMA_POOLING_TYPE_MEAN, "last": L.LLAMA_POOLING_TYPE_LAST}[pooling]
        # flash attention: no [n_ubatch x n_kv] score matrix per head at n_ubatch = cells
        cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_ENABLED
        cp.no_perf = True
        # one thread: an OpenMP build gives every host thread that runs a parallel region a team
        # of its own, and once two teams exist (the engine thread's and this one's: more threads
        # than CPUs) libgomp throttles every barrier's spinning for good: the generator decoded
        # 77 tok/s before the first embedding and 29 after it, idle embedder or not
        cp.n_threads = cp.n_threads_batch = EMBED_THREADS
        ctx = L.llama_init_from_model(be.model, cp)
        if not ctx:
            raise PrefixEdgeError(f"cannot create a llama.cpp embeddings context ({self.cells} cells): "
                                  "out of memory?")
        self._ctx[pooling] = ctx
        if self._batch is None:
            self._batch = L.llama_batch_init(self.cells, 0, self.n_seq)
        return ctx

    def pooled(self, batch: list[np.ndarray], pooling: str) -> list[np.ndarray]:
        be = self.be
        L = be._L
        if len(batch) > self.n_seq or sum(len(ids) for ids in batch) > self.cells:
            raise PrefixEdgeError(f"an embeddings batch holds at most {self.n_seq} texts and "
                                  f"{self.cells} tokens")
        ctx = self._context(pooling)
        b, k = self._batch, 0
        for seq, ids in enumerate(batch):
            for j, tok in enumerate(np.asarray(ids, np.int64).tolist()):
                b.token[k] = tok
                b.pos[k] = j
                b.n_seq_id[k] = 1
                b.seq_id[k][0] = seq
                b.logits[k] = 1
                k += 1
        b.n_tokens = k
        L.llama_memory_clear(L.llama_get_memory(ctx), True)
        rc = be.decode(ctx, b, most=EMBED_THREADS)
        if rc != 0:
            raise PrefixEdgeError(f"llama_decode of an embeddings batch failed (code {rc})")
        out = []
        for seq in range(len(batch)):
            ptr = L.llama_get_embeddings_seq(ctx, seq)
            if not ptr:
                raise PrefixEdgeError("llama.cpp returned no pooled embedding")
            out.append(np.ctypeslib.as_array(ptr, shape=(be.n_embd,)).astype(np.float32, copy=True))
        return out

    def close(self) -> None:
        """Free the contexts (before the engine frees the model they use)."""
        L = self.be._L
        if self._batch is not None:
            L.llama_batch_free(self._batch)
            self._batch = None
        for ctx in self._ctx.values():
            L.llama_free(ctx)
        self._ctx = {}
