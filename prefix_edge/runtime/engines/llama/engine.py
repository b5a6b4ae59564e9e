"""llama.cpp backend over llama-cpp-python's low-level API (one model, one context, sequence 0).

A baked prefix is one sequence's KV as llama.cpp serialises it (`llama_state_seq_get_data`),
restored with `llama_state_seq_set_data` after seqstate.py has walked and checked the blob:
llama.cpp itself checks little and nothing about which model wrote it. The KV cache type is F16
(the default) or Q8_0 (`kv_type="q8_0"`, half the bytes per cell; llama.cpp quantizes V only
with flash attention, so that context runs with it), and the V layout follows flash attention
(v_trans = not flash_attn), fixed when the context is made; the bundle records both
(manifest `state`) and its prefixes are baked with them, so baked still equals prefilled. There is no context shift: the
library never shifts by itself, and a full context is an error here, never a shift (a shift
re-rotates cached keys).

A hybrid model (LFM2, Granite 4.0-H, Falcon-H1) keeps, beside its attention layers' KV, one
recurrent state per sequence (the state after its last token): a prefix, snapshot or prompt-cache
entry holds both and a restore puts both back; such a state cannot be cut back to an earlier
position (keeps_partial is False). The state type, its format and prefix files: state.py.

Soft prompts (PEFT prompt / P-tuning) are decoded from embeddings: `prefill_embeddings` sends
float rows through a `llama_batch` made with `llama_batch_init(n, n_embd, 1)` (no token ids).
"""

from __future__ import annotations

import ctypes
import weakref
from pathlib import Path

import numpy as np

from ....bundle import prefixfile
from ....errors import PrefixEdgeError
from ..cpu_share import cpu_share, lower_this_thread
from ..protocol import Embeddings, EngineConfig, OneSequence, Opened, StateLayout, fit_prefix
from .context import ContextSpec, batches_alike, grow, make_context
from .mtp import MtpHead, nextn_functions
from ....llamacpp.lib import (KV_TYPES, _format_part, available_devices, kv_rotation, load_llama_cpp,
                        state_version)
from .state import BACKEND, Layout, SeqBlob, StateFormat, read_layout
from ..kv import KvLayers
from ..overlap import native_load
from ..prefix import Prefix
from ....llamacpp.seqstate_write import in_stream, out_of_stream, unfold_window


WINDOW_CACHES = ("full", "window")  # EngineConfig.window_cache
RS_SNAPSHOTS = 4  # a recurrent state's positions kept for cutting back (speculative="mtp"): drafts of up to 3


class LlamaBackend(OneSequence):
    name = BACKEND

    def __init__(self, model_path: Path, device: str = "cpu", threads: int | None = None,
                 n_ctx: int = 4096, flash_attn: bool | None = None, n_seq_max: int = 1,
                 n_batch: int | None = None, kv_type: str = "f16", kv_unified: bool = False,
                 max_ctx_seq: int | None = None, adaptive: bool = False, background: bool = False,
                 window_cache: str = "full", mtp_head: bool = False, mtp_file: Path | None = None):
        L = self._L = load_llama_cpp()
        # adaptive: `threads` is the most a forward runs; each one runs what the CPUs have free
        # then (cpu_share.py), so the engine never collapses beside another busy process
        self.adaptive = bool(adaptive) and device == "cpu"
        self.background = bool(background)  # forwards on a lowered thread (cpu_share.lower_this_thread)
        self.model = self.ctx = self.batch = None
        if kv_type not in KV_TYPES:
            raise PrefixEdgeError(f"unknown KV cache type {kv_type!r}; choose one of: {', '.join(KV_TYPES)}")
        if flash_attn is None:
            flash_attn = kv_type != "f16"
        if kv_type != "f16" and not flash_attn:
            raise PrefixEdgeError(f"a {kv_type} KV cache needs flash attention (llama.cpp)")
        self.kv_type = kv_type
        devices = available_devices()
        if device == "auto":
            device = devices[-1]
        if device in ("cuda", "metal") and device not in devices:
            raise PrefixEdgeError(
                f"device {device!r} asked for, but this llama-cpp-python build has no "
                f"{'GPU offload' if len(devices) == 1 else device + ' support'} "
                "(reinstall llama-cpp-python built with CMAKE_ARGS=-DGGML_CUDA=on or "
                "-DGGML_METAL=on), or use device 'cpu'")
        if device not in ("cpu", "cuda", "metal"):
            raise PrefixEdgeError(f"the gguf backend runs on 'cpu', 'cuda' or 'metal', not {device!r}")
        if not Path(model_path).is_file():
            raise PrefixEdgeError(f"GGUF model not found: {model_path}")
        self.device, self.model_path = device, Path(model_path)
        self.head_model = None  # an MTP head loaded from a file of its own (mtp_file)

        mp = L.llama_model_default_params()
        mp.n_gpu_layers = 0 if device == "cpu" else -1
        # a model with an MTP head (Qwen3.5's), asked for: its layers loaded for speculative="mtp" (mtp.py)
        mp.load_mtp = bool(mtp_head)
        self.model = native_load(lambda: L.llama_model_load_from_file(str(model_path).encode(), mp))
        if not self.model:
            from ....llamacpp.child import load_failure

            raise PrefixEdgeError(f"cannot load GGUF model {model_path}: {load_failure(Path(model_path))}")
        # sliding-window layers (Gemma 3): llama.cpp keeps them in a second cache (iSWA), and a
        # sequence's state is then two caches' parts, the second pruned to the window
        self.n_swa = int(L.llama_model_n_swa(self.model))
        # a hybrid model (LFM2, Granite 4.0-H, Falcon-H1): a recurrent state beside the KV
        hybrid = bool(L.llama_model_is_hybrid(self.model))
        if L.llama_model_is_recurrent(self.model) and not hybrid:
            self.close()
            raise PrefixEdgeError(f"{Path(model_path).name}: a recurrent model without attention layers "
                                  "(Mamba, RWKV) is not supported by the gguf engine; hybrids are")
        self.vocab = L.llama_model_get_vocab(self.model)
        self.n_vocab = int(L.llama_vocab_n_tokens(self.vocab))
        self.n_layers = int(L.llama_model_n_layer(self.model))
        self.model_layers = self.n_layers  # llama.cpp counts a hybrid's recurrent layers in n_layer
        self.n_kv_heads = int(L.llama_model_n_head_kv(self.model))
        arch = self.meta("general.architecture") or "llama"
        key_len = self.meta(f"{arch}.attention.key_length")
        self.head_dim = int(key_len) if key_len else (
            int(L.llama_model_n_embd(self.model)) // int(L.llama_model_n_head(self.model)))
        val_len = self.meta(f"{arch}.attention.value_length")
        self.head_dim_v = int(val_len) if val_len else self.head_dim
        # Gemma 4: the sliding layers' heads are of another size than the global layers'
        swa_len, swa_v_len = self.meta(f"{arch}.attention.key_length_swa"), self.meta(f"{arch}.attention.value_length_swa")
        self.head_dim_swa = int(swa_len) if swa_len else self.head_dim
        self.head_dim_v_swa = int(swa_v_len) if swa_v_len else self.head_dim_swa
        self.n_embd = int(L.llama_model_n_embd(self.model))
        rope = int(L.llama_model_rope_type(self.model))
        # M-RoPE (Qwen3.5, the VL models): an embedding row takes 4 positions (text: p, p, p, 0)
        self.pos_per_embd = 4 if rope in (getattr(L, "LLAMA_ROPE_TYPE_MROPE", 8),
                                          getattr(L, "LLAMA_ROPE_TYPE_IMROPE", 40)) else 1
        # Which dims RoPE rotates together in a cached key: "adjacent" (2i, 2i+1; llama.cpp's
        # NORM, e.g. arch llama, whose GGUF K rows are permuted from HF's) or "halves" (i, i+d/2;
        # NEOX, HF's own layout). A key from the HF world needs permuting only for "adjacent".
        self.rope_layout = {L.LLAMA_ROPE_TYPE_NORM: "adjacent",
                            L.LLAMA_ROPE_TYPE_NEOX: "halves"}.get(rope, f"rope type {rope}")
        self.v_trans = not flash_attn
        if kv_type == "q8_0" and (self.head_dim % 32 or self.head_dim_v % 32 or self.head_dim_swa != self.head_dim):
            self.close()
            raise PrefixEdgeError(f"a q8_0 KV cache needs a head size that is a multiple of 32 "
                                  f"(Q8_0 blocks per head); this model's is {self.head_dim}: use f16")
        try:
            self.kv_rotation = kv_rotation(kv_type, self.head_dim, self.head_dim_v)
        except PrefixEdgeError:
            self.close()
            raise
        self.state_version = state_version()

        if window_cache not in WINDOW_CACHES:
            raise PrefixEdgeError(f"window_cache must be one of {', '.join(map(repr, WINDOW_CACHES))}, got {window_cache!r}")
        self.window_cache = window_cache
        # the MTP head drafts where llama.cpp's hidden-state switches exist; a hybrid's recurrent
        # state then keeps snapshots of its last RS_SNAPSHOTS positions, so a rejected draft can
        # be cut back (verifies)
        funcs = None
        if mp.load_mtp:
            own = L.llama_model_n_layer_nextn(self.model) > 0
            if not own and mtp_file is not None:  # the head as a file of its own (llama.cpp's --mtp export)
                self.head_model = self._load_head(Path(mtp_file), mp)
            funcs = nextn_functions(L) if own or self.head_model else None
        self._spec = ContextSpec(n_seq_max, n_batch or n_ctx, kv_unified, KV_TYPES[kv_type], flash_attn, threads,
                                 swa_full=window_cache == "full",
                                 n_rs_seq=RS_SNAPSHOTS if funcs and hybrid and not self.n_swa else 0)
        self.mtp = None
        try:
            self.ctx = make_context(L, self.model, self._spec, n_ctx, device)
        except PrefixEdgeError:
            self.close()
            raise
        self.threads = int(L.llama_n_threads(self.ctx))
        self.adopt_context()
        self.n_stream = 1 if kv_unified else self.n_seq_max  # KV streams (1: one shared cache)
        # a stream per sequence grows (the context made again) up to max_ctx_seq cells
        self.max_ctx_seq = self.n_ctx_seq if kv_unified else max(self.n_ctx_seq, max_ctx_seq or 0)
        self._copied: dict[int, int] = {}  # dst -> src of seq_copy not yet carried out by a decode
        self._spans: dict[int, tuple[int, int]] = {}  # seq -> the positions its last forward wrote
        self.batch = L.llama_batch_init(self.n_batch, 0, 1)
        self.pos = 0
        self._checked: weakref.WeakSet[SeqBlob] = weakref.WeakSet()  # states walked for this model
        layout = Layout()
        if self.n_swa or hybrid or self.n_kv_heads == 0:  # the layout is read off a state of its own
            layout = read_layout(self, hybrid)
            self.n_kv_heads = layout.n_kv_heads  # of the attention layers (llama.cpp: layer 0's)
            if not layout.window:
                self.n_swa = 0
        self.format = StateFormat(self.n_layers, self.n_kv_heads, self.head_dim, self.head_dim_v, kv_type,
                                  self.v_trans, self.kv_rotation, self.max_ctx_seq, self.n_vocab,
                                  self.state_version, self.n_swa, layout, self.head_dim_swa, self.head_dim_v_swa)
        self.batches_sequences = batches_alike(self)
        self.bytes_per_cell = self.format.bytes_per_cell
        if funcs is not None:
            try:
                self.mtp = MtpHead(self, self.max_ctx_seq, funcs, self.head_model or self.model)
            except PrefixEdgeError:
                self.mtp = None  # no room for the head's context: speculative="mtp" decodes as "off"
            self.adopt_context()

    def _load_head(self, path: Path, mp):
        """An MTP head GGUF (its nextn block, embeddings and output; no trunk layers) for this
        model, or a one-line refusal: it must be the same architecture, width and vocabulary."""
        L = self._L
        head = native_load(lambda: L.llama_model_load_from_file(str(path).encode(), mp))
        if not head:
            self.close()
            raise PrefixEdgeError(f"cannot load the MTP head {path.name}")
        got = (self.meta("general.architecture", head), int(L.llama_model_n_embd(head)), int(L.llama_vocab_n_tokens(L.llama_model_get_vocab(head))),
               int(L.llama_model_n_layer_nextn(head)) > 0)
        want = (self.meta("general.architecture"), int(L.llama_model_n_embd(self.model)), self.n_vocab, True)
        if got != want:
            L.llama_model_free(head)
            self.close()
            raise PrefixEdgeError(f"the MTP head {path.name} is not this model's: architecture, width, vocabulary, "
                                  f"head {got[0]}, {got[1]}, {got[2]}, {got[3]} vs the model's {want[0]}, {want[1]}, "
                                  f"{want[2]}, {want[3]}")
        return head

    def adopt_context(self) -> None:
        L = self._L
        self.n_ctx = int(L.llama_n_ctx(self.ctx))
        self.n_batch = int(L.llama_n_batch(self.ctx))
        self.mem = L.llama_get_memory(self.ctx)
        self.n_seq_max = int(L.llama_n_seq_max(self.ctx))
        self.n_ctx_seq = int(L.llama_n_ctx_seq(self.ctx))  # cells one sequence may hold now
        if getattr(self, "mtp", None) is not None:  # every forwarded token's hidden state, for the head
            self.mtp.set_nextn(self.ctx, True, False)

    # -- model facts ----------------------------------------------------------------------
    CTX_DEFAULT = 4096      # positions per request unless n_ctx says otherwise
    CTX_SHARED = 1 << 15    # shared_kv: positions per request unless n_ctx says otherwise
    REQUEST_CELLS = 512     # shared_kv: cells per slot by default (input + default max_tokens)
    RESIDENT_SEQS = 16      # shared_kv: sequences kept for resident task prefixes
    STREAM_START = 1024     # a slot's stream at open (at least the longest prefix + REQUEST_CELLS)

    @classmethod
    def from_bundle(cls, bundle, model_hashes: dict[str, str], cfg: EngineConfig) -> Opened:
        """The bundle's GGUF model with a KV stream of its own per slot, made at what the
        prefixes need and grown up to n_ctx cells as requests use them (context.py; with
        cfg.kv_cells: all of it up front), or with cfg.shared_kv one cache of kv_cells cells
        shared by every request and resident prefix (sequence 0 is then the one-sequence API's)."""
        from ..cpus import default_threads
        from ....llamacpp.lib import gguf_state_options
        from ....llamacpp.probe import require_llama

        model = bundle.model_file("gguf")
        require_llama(model if model.is_file() else None)  # a crashing build is an error, not a crash
        limit = bundle.manifest.model.n_ctx
        ctx = min(limit, cfg.n_ctx) if cfg.n_ctx else min(limit, cls.CTX_SHARED if cfg.shared_kv else cls.CTX_DEFAULT)
        if not cfg.shared_kv and cfg.kv_cells is not None:
            ctx = min(ctx, cfg.kv_cells // cfg.slots)
        fit_prefix(cfg.longest_prefix, ctx)
        slots, kv_cells = cfg.slots, cfg.kv_cells
        if cfg.shared_kv:
            if kv_cells is None:  # residents of the longest prefix + room for every slot
                kv_cells = min(2 * cfg.longest_prefix + slots * cls.REQUEST_CELLS, slots * ctx)
                kv_cells = max(1024, -(-kv_cells // 256) * 256)
            n_seq = 1 + slots + cls.RESIDENT_SEQS
            grow_to = None
        elif cfg.kv_cells is not None:  # a stream per slot, all of it up front, as asked
            kv_cells, n_seq, grow_to = slots * ctx, slots, None
        else:  # a stream per slot, from what the prefixes need, grown up to ctx cells as used
            start = min(ctx, max(cls.STREAM_START, -(-(cfg.longest_prefix + cls.REQUEST_CELLS) // 256) * 256))
            kv_cells, n_seq, grow_to = slots * start, slots, ctx
        background = cfg.priority == "background"
        be = cls(model, device=cfg.device, threads=cfg.threads or (1 if background else default_threads()),
                 adaptive=cfg.threads is None and not background, background=background, n_ctx=kv_cells,
                 n_seq_max=n_seq, n_batch=max(512, cfg.prefill_chunk), kv_unified=cfg.shared_kv,
                 max_ctx_seq=grow_to, window_cache=cfg.window_cache, mtp_head=cfg.mtp_head,
                 mtp_file=bundle.mtp_head_file() if cfg.mtp_head else None,
                 **gguf_state_options(bundle.backend("gguf").state))
        if cfg.shared_kv:
            return Opened(be, ctx, kv_cells, True, request_seqs=tuple(range(1, slots + 1)),
                          resident_seqs=tuple(range(slots + 1, be.n_seq_max)))
        # a request's stream is its own: nothing shared for the scheduler to count
        return Opened(be, min(ctx, be.max_ctx_seq), None, False, request_seqs=tuple(range(slots)))

    @property
    def kv_cells_total(self) -> int:
        return self.n_ctx

    def meta(self, key: str, model=None) -> str | None:
        """A metadata value of the model (or of `model`: the MTP head's), or None."""
        buf = ctypes.create_string_buffer(256)
        n = self._L.llama_model_meta_val_str(model or self.model, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", "replace") if n >= 0 else None

    def tokenize(self, text: str, add_special: bool = False, parse_special: bool = True) -> np.ndarray:
        raw = text.encode("utf-8")
        cap = len(raw) + 8
        out = (self._L.llama_token * cap)()
        n = self._L.llama_tokenize(self.vocab, raw, len(raw), out, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            out = (self._L.llama_token * cap)()
            n = self._L.llama_tokenize(self.vocab, raw, len(raw), out, cap, add_special, parse_special)
        return np.array(out[:n], dtype=np.int64)

    # -- sequences (the engine protocol: restore, copy, forward, free) --------------------
    @property
    def state_layout(self) -> StateLayout:
        """The sequence state as read off the model (and, for sliding-window and hybrid models,
        off a state of its own): the full-attention layers, llama.cpp's sliding-window cache
        (only the window's last cells of a state) and the recurrent layers."""
        return self.format.state_layout

    @property
    def keeps_partial(self) -> bool:
        """Whether seq_restore can keep only a state's first positions: not with sliding-window
        layers, whose cache holds only the last cells of the state, nor with recurrent layers,
        whose state is the one after the last token (llama.cpp cannot cut it back)."""
        return self.state_layout.keeps_partial

    def seq_restore(self, seq: int, prefix: Prefix | None, keep: int | None = None) -> int:
        """Empty sequence `seq` and install a baked prefix (or nothing) at positions 0..P-1;
        returns P. keep: install only the prefix's first `keep` positions."""
        L = self._L
        self._live()
        L.llama_memory_seq_rm(self.mem, seq, -1, -1)
        self._spans.pop(seq, None)
        if self.mtp is not None:
            self.mtp.reset(seq)
        if prefix is None:
            return 0
        if prefix.state not in self._checked:  # nothing unchecked reaches llama.cpp
            self.format.check(prefix)
            self._checked.add(prefix.state)
        self._copied.pop(seq, None)
        grow(self, prefix.n_tokens + 1)
        fmt, blob, layout = self.format, prefix.state.blob, None
        if fmt.parts == 2 and self._spec.swa_full:  # the window's cells where a prefill leaves them (context.py)
            blob = unfold_window(blob, fmt.parse(blob))
        if (fmt.parts == 2 or fmt.recurrent) and self.n_stream > 1:
            layout = fmt.parse(blob)
        blob = in_stream(blob, seq, self.n_stream, layout)
        ptr = blob.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))
        n = L.llama_state_seq_set_data(self.ctx, ptr, blob.nbytes, seq)
        if n != blob.nbytes:
            L.llama_memory_seq_rm(self.mem, seq, -1, -1)
            raise PrefixEdgeError(f"llama.cpp refused the prefix KV state (read {n} of "
                                  f"{blob.nbytes} bytes): the KV cache is full, or the prefix "
                                  "was baked for another model")
        n = prefix.n_tokens
        if keep is not None and keep < n:
            if not self.keeps_partial or keep < 0 or \
                    not L.llama_memory_seq_rm(self.mem, seq, keep, -1):
                L.llama_memory_seq_rm(self.mem, seq, -1, -1)
                raise PrefixEdgeError(f"cannot keep {keep} of a state's {n} positions here")
            n = keep
        last = L.llama_memory_seq_pos_max(self.mem, seq)
        if last != n - 1:
            L.llama_memory_seq_rm(self.mem, seq, -1, -1)
            raise PrefixEdgeError(f"prefix restore left positions up to {last}, expected {n - 1}")
        if self.mtp is not None:
            self.mtp.restored(seq, prefix.ids, n, prefix.n_virtual)
        return n

    def seq_copy(self, src: int, dst: int) -> None:
        """dst := src: a unified cache shares src's cells (no bytes copied); with a stream per
        sequence llama.cpp copies src's whole stream at the next decode."""
        self._live()
        self._L.llama_memory_seq_rm(self.mem, dst, -1, -1)
        self._L.llama_memory_seq_cp(self.mem, src, dst, -1, -1)
        self._spans.pop(dst, None)
        if self.mtp is not None:
            self.mtp.copied(src, dst)
        if self.n_stream > 1:
            self._copied[dst] = self._copied.get(src, src)

    def seq_snapshot(self, seq: int, ids: np.ndarray, n_virtual: int = 0) -> Prefix:
        """Sequence `seq`'s KV now (all its positions), as a Prefix that seq_restore puts back
        into any sequence: a one-stream seq-state blob, like a baked prefix's."""
        blob = out_of_stream(self.raw_state(seq), seq if self.n_stream > 1 else 0, self.n_stream,
                             self.format.parts, self.format.recurrent_layers, self.format.layout.cell_ext)
        return self._mine(Prefix(np.asarray(ids, np.int64), SeqBlob(blob), {}, n_virtual=n_virtual))

    def _mine(self, prefix: Prefix) -> Prefix:
        """A prefix whose state this engine made or checked: restored without a second walk."""
        self._checked.add(prefix.state)
        return prefix


    # -- prefixes in and out: the state's format (state.py) -------------------------------
    def load_prefix(self, path: Path) -> Prefix:
        """Read a prefix file through the codec (prefixfile.py) and check it for this model."""
        tensors, meta = prefixfile.read(path, [prefixfile.STATE, prefixfile.IDS])
        return self.prefix_from(tensors, meta, str(path), lasting=True)

    def prefix_from(self, tensors: dict, meta: dict, where: str, values_checked: bool = False,
                    lasting: bool = False) -> Prefix:
        """A Prefix from a prefix file's arrays, parsed and checked against this model before
        anything reaches llama.cpp (its values walked unless `values_checked`)."""
        return self._mine(self.format.read(tensors, meta, where, values_checked))

    def read_prefix_ids(self, path: Path) -> np.ndarray:
        return prefixfile.read_ids(path)

    def prefix_bytes(self, n_tokens: int, file_bytes: int) -> int:
        """The most host memory a loaded prefix holds: its state blob, read whole from its
        file (which holds the blob, the ids and a header)."""
        return file_bytes

    def state_blob(self) -> bytes:
        """The one-sequence API's state as a seq-state blob (after prefill of a prefix), checked."""
        from ....llamacpp.seqstate import check_seq_state

        blob = self.seq_snapshot(self.single_seq, np.zeros(self.pos, np.int64)).state.blob.tobytes()
        check_seq_state(self.format.parse(blob), self.format.expected(self.pos))
        return blob

    def save_prefix(self, path: Path, ids: np.ndarray, metadata: dict[str, str]) -> None:
        """Write the current sequence (a prefilled prefix) as a prefix file."""
        self.format.write(path, ids, self.state_blob(), metadata)

    def write_snapshot(self, path: Path, prefix: Prefix, metadata: dict[str, str],
                       mac_key: bytes | None = None) -> None:
        """Write a Prefix (a seq_snapshot) as a prefix file, the codec's format."""
        self.format.write(path, prefix.ids, prefix.state.blob, {**metadata, "n_virtual": str(prefix.n_virtual)},
                          mac_key)

    def snapshot_bytes(self, n_tokens: int) -> int:
        return self.format.snapshot_bytes(n_tokens)

    # -- KV as data (runtime/engines/kv.py) ----------------------------------------------------
    def kv_of(self, prefix: Prefix) -> KvLayers:
        return self.format.kv_of(prefix.state)

    def prefix_of(self, kv: KvLayers, ids: np.ndarray, n_virtual: int = 0,
                  sliding: tuple[int, ...] = (), window: int = 0) -> Prefix:
        return self._mine(self.format.prefix_of(kv, ids, n_virtual, sliding, window))

    def seq_reserve(self, seq: int, positions: int) -> None:
        """Room for `positions` in every stream now (context.py grow), not at a decode."""
        grow(self, positions)

    def seq_extend(self, seq: int, kv: KvLayers) -> int:
        """Append `kv`'s positions to sequence `seq` (keys already rotated for where they land);
        its next position. llama.cpp sets a sequence's state whole: the state is read out,
        extended and written back."""
        n = self.seq_pos(seq)
        have = self.kv_of(self.seq_snapshot(seq, np.zeros(n, np.int64))) if n else None
        whole = kv if have is None else have.then(kv)
        return self.seq_restore(seq, self.prefix_of(whole, np.zeros(whole.n, np.int64)))

    def raw_state(self, seq: int) -> np.ndarray:
        """Sequence `seq`'s state as llama.cpp writes it for this context (all its streams)."""
        L = self._L
        self._live()
        size = L.llama_state_seq_get_size(self.ctx, seq)
        blob = np.empty(size, np.uint8)
        n = L.llama_state_seq_get_data(self.ctx, blob.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)),
                                       size, seq)
        if n != size:
            raise PrefixEdgeError(f"llama_state_seq_get_data wrote {n} of {size} bytes")
        return blob

    def decode(self, ctx, batch, most: int | None = None) -> int:
        """llama_decode on `ctx` (this engine's, or its embedder's with `most` threads),
        adaptive: with the threads the CPUs have free now, held against this process's other
        forwards (thread counts change no result: ggml splits a node's rows between threads,
        never a sum)."""
        return self._leased(ctx, lambda: self._L.llama_decode(ctx, batch), most)

    def process(self, ctx, batch_ext) -> int:
        """llama_process (decode) of an extended batch on `ctx` (the MTP head's), as decode
        runs: the same threads and priority."""
        L = self._L
        return self._leased(ctx, lambda: L.llama_process(ctx, L.LLAMA_PROCESS_TYPE_DECODE, batch_ext))

    def _leased(self, ctx, run, most: int | None = None) -> int:
        L = self._L
        if self.background:
            lower_this_thread()
        if not self.adaptive:
            return run()
        with cpu_share().lease(most or self.threads) as n:
            L.llama_set_n_threads(ctx, n, n)  # a setter of the context's params: free
            return run()

    def seq_free(self, seq: int) -> None:
        if self.ctx is not None:
            self._copied.pop(seq, None)
            self._spans.pop(seq, None)
            self._L.llama_memory_seq_rm(self.mem, seq, -1, -1)
            if self.mtp is not None:
                self.mtp.reset(seq)

    def forward(self, items: list[tuple]) -> list[np.ndarray]:
        """One llama_decode over several sequences: items are (seq, first position, token ids)
        or (seq, first position, token ids, rows); returns each item's last-token logits, or
        its last `rows` positions' logits [rows, n_vocab] (a draft's verification). Total
        tokens <= n_batch."""
        L = self._L
        self._live()
        grow(self, max(it[1] + np.size(it[2]) for it in items))
        b = self.batch
        k = 0
        last, firsts = [], []
        for seq, pos, ids, *rows in items:
            ids = np.asarray(ids, dtype=np.int64).reshape(-1)
            if ids.size == 0:
                raise PrefixEdgeError("forward needs at least one token per sequence")
            if pos + ids.size > self.n_ctx_seq:
                raise PrefixEdgeError(f"context full: {pos} + {ids.size} tokens exceed the "
                                      f"{self.max_ctx_seq} cells of a sequence (no context shift)")
            if ids.min() < 0 or ids.max() >= self.n_vocab:
                raise PrefixEdgeError(f"token id outside the vocabulary (0..{self.n_vocab - 1})")
            if k + ids.size > self.n_batch:
                raise PrefixEdgeError(f"forward of {k + ids.size} tokens exceeds n_batch={self.n_batch}")
            n_rows = min(int(rows[0]), ids.size) if rows else 0
            for j, tok in enumerate(ids.tolist()):
                b.token[k] = tok
                b.pos[k] = pos + j
                b.n_seq_id[k] = 1
                b.seq_id[k][0] = seq
                b.logits[k] = 1 if j >= ids.size - n_rows else 0
                k += 1
            b.logits[k - 1] = 1
            last.append((k - 1, n_rows))
            firsts.append(k - ids.size)
        b.n_tokens = k
        rc = self.decode(self.ctx, b)
        self._copied.clear()  # a decode carries out every pending copy
        if rc != 0:
            for seq, pos, *_ in items:  # drop whatever part of this batch was stored
                L.llama_memory_seq_rm(self.mem, seq, pos, -1)
            why = "the KV cache is full" if rc == 1 else f"code {rc}"
            raise PrefixEdgeError(f"llama_decode failed ({why})")
        for seq, pos, ids, *_ in items:
            self._spans[seq] = (pos, pos + np.size(ids))
        if self.mtp is not None:
            for (seq, pos, ids, *_), first in zip(items, firsts):
                self.mtp.observe(seq, pos, np.asarray(ids).reshape(-1), first)
        out = []
        for i, n_rows in last:
            rows = [self._logits_at(j) for j in range(i - max(n_rows, 1) + 1, i + 1)]
            out.append(np.stack(rows) if n_rows else rows[0])
        return out

    def _logits_at(self, i: int) -> np.ndarray:
        ptr = self._L.llama_get_logits_ith(self.ctx, i)
        if not ptr:
            raise PrefixEdgeError("llama.cpp returned no logits")
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).astype(np.float32, copy=True)

    def seq_truncate(self, seq: int, pos: int) -> None:
        """Drop `seq`'s cells at positions pos.. (a rejected draft's)."""
        self._live()
        span = self._spans.get(seq)
        # a recurrent state is put back from llama.cpp's snapshots of the last forward's
        # positions only: cut further (to before that forward's first token) llama.cpp says
        # yes and leaves the wrong state, so that is refused here
        rollback = self.keeps_partial or (span is not None and span[0] < pos <= span[1]
                                          and span[1] - pos < self._spec.n_rs_seq)
        if not self.verifies or not rollback or not self._L.llama_memory_seq_rm(self.mem, seq, pos, -1):
            raise PrefixEdgeError(f"cannot cut sequence {seq} back to {pos} here")
        if self.mtp is not None:
            self.mtp.truncate(seq, pos)

    @property
    def verifies(self) -> bool:
        """Drafts can be verified: every layer's cells can be cut back (no sliding window, no
        recurrent state, or a recurrent state with snapshots of its last positions: a model
        with an MTP head)."""
        return self.keeps_partial or self._spec.n_rs_seq > 0

    @property
    def drafts_mtp(self) -> bool:
        """The model's own MTP head drafts here (speculative="mtp")."""
        return self.mtp is not None and self.verifies

    def mtp_draft(self, seq: int, token: int, pos: int, k: int) -> list[int]:
        """Up to min(k, RS_SNAPSHOTS - 1) tokens the MTP head drafts after `token`, which
        `seq` forwards next at `pos` (mtp.py); none where it cannot."""
        if not self.drafts_mtp:
            return []
        if self._spec.n_rs_seq:
            k = min(k, self._spec.n_rs_seq - 1)
        return self.mtp.draft(seq, token, pos, k)

    def seq_pos(self, seq: int) -> int:
        """The next position of `seq` (after its last stored cell)."""
        return int(self._L.llama_memory_seq_pos_max(self.mem, seq)) + 1

    takes_embeddings = True

    def prefill_embeddings(self, emb: np.ndarray) -> np.ndarray:
        """Append input embeddings (float rows [n, n_embd], e.g. a PEFT soft prompt) at the
        current position, as tokens would be; return the last row's logits."""
        L = self._L
        self._live()
        emb = np.ascontiguousarray(emb, dtype=np.float32)
        if emb.ndim != 2 or emb.shape[0] == 0 or emb.shape[1] != self.n_embd:
            raise PrefixEdgeError(f"prefill_embeddings needs float rows [n >= 1, {self.n_embd}], "
                                  f"got {list(emb.shape)}")
        if not np.all(np.isfinite(emb)):
            raise PrefixEdgeError("prefill_embeddings: the embeddings hold NaN or infinite values")
        n_all = emb.shape[0]
        grow(self, self.pos + n_all)
        if self.pos + n_all > self.n_ctx_seq:
            raise PrefixEdgeError(f"context full: {self.pos} + {n_all} embeddings exceed "
                                  f"n_ctx={self.max_ctx_seq} (no context shift)")
        for start in range(0, n_all, self.n_batch):
            chunk = emb[start:start + self.n_batch]
            n = chunk.shape[0]
            # embd != 0: b.embd set, b.token NULL; room for every position of an M-RoPE row
            b = L.llama_batch_init(n * self.pos_per_embd, self.n_embd, 1)
            try:
                ctypes.memmove(b.embd, chunk.ctypes.data, chunk.nbytes)
                for i in range(n):
                    b.pos[i] = self.pos + i
                    for k in range(1, self.pos_per_embd):  # (a text row's: its position thrice, then 0)
                        b.pos[k * n + i] = self.pos + i if k < 3 else 0
                    b.n_seq_id[i] = 1
                    b.seq_id[i][0] = self.single_seq
                    b.logits[i] = 0
                b.logits[n - 1] = 1 if start + n == n_all else 0
                b.n_tokens = n
                rc = self.decode(self.ctx, b)
            finally:
                L.llama_batch_free(b)
            if rc != 0:
                self.pos = self.seq_pos(self.single_seq)
                raise PrefixEdgeError(f"llama_decode of embeddings failed (code {rc}) at "
                                      f"position {self.pos}")
            self.pos += n
        ptr = L.llama_get_logits_ith(self.ctx, -1)
        if not ptr:
            raise PrefixEdgeError("llama.cpp returned no logits")
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).astype(np.float32, copy=True)

    def memory_info(self) -> dict[str, dict]:
        """Nothing beyond what the runtime counts: the KV cells are the context's (resident
        prefixes and requests), allocated once."""
        return {}

    def embeddings(self, max_batch: int) -> Embeddings:
        """llama.cpp's embeddings mode on this model (embedding.py): up to `max_batch` texts in
        one llama_decode."""
        from .embedding import LlamaPooled

        return Embeddings(int(self.n_embd), None, max_batch,
                          lambda max_tokens: LlamaPooled(self, max_tokens, max_batch))

    def state_info(self) -> dict:
        """What restoring a prefix depends on beyond the model file (recorded in the manifest)."""
        info = {"format": _format_part(self.state_version), "v_trans": self.v_trans,
                "kv_type": self.kv_type}
        if self.kv_type != "f16":  # a quantized cache holds K/V rotated (or not): see kv_rotation
            info["kv_rotation"] = self.kv_rotation
        return info

    @property
    def kv_dtype_name(self) -> str:
        return {"f16": "float16"}.get(self.kv_type, self.kv_type)

    def _live(self) -> None:
        if self.ctx is None:
            raise PrefixEdgeError("the gguf backend is closed")

    def close(self) -> None:
        L = getattr(self, "_L", None)
        if L is None:
            return
        if getattr(self, "batch", None) is not None:
            L.llama_batch_free(self.batch)
            self.batch = None
        if getattr(self, "mtp", None) is not None:
            self.mtp.close()
            self.mtp = None
        if getattr(self, "ctx", None):
            L.llama_free(self.ctx)
        self.ctx = None
        if getattr(self, "model", None):
            L.llama_model_free(self.model)
        self.model = None
        if getattr(self, "head_model", None):
            L.llama_model_free(self.head_model)
        self.head_model = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

