"""A `.gguf` source exported for llama.cpp alone (`--format gguf`), read and baked without
transformers: the model is never de-quantized, so a bundle of a downloaded GGUF takes seconds
where the path through transformers took minutes (a real Qwen2.5-0.5B: 373 s).

What export needs of the model comes from the file and from llama.cpp itself:
- the tokenizer: an SPM vocabulary built from the GGUF (export/gguf_tokenizer.py); another
  vocabulary type from transformers' tokenizer conversion alone (no weights read), its BPE
  pre-tokenizer written from `tokenizer.ggml.pre`; either way held to llama.cpp's own tokenizer
  afterwards (export/tokenizer_check.py);
- the chat template and the special tokens the template sees: the GGUF's
  (`tokenizer.chat_template`, `tokenizer.ggml.*_token_id`), as llama.cpp uses them;
- the model's shape: the GGUF's metadata, the layer and KV-head counts as the engine that bakes
  reports them; end-of-generation ids: llama.cpp's own set (`llama_vocab_is_eog`).

Not on this path (export then goes through transformers as before): PEFT tasks (their adapters
are checked against the HF config), compressed prefixes (scored on the fp32 model), an ONNX
format. Its manifest's `model_type` is `gguf:ARCH`, its rotary the GGUF's metadata (gguf_rope),
held at export to llama.cpp's own cached keys (check_rope): features that re-rotate cached keys
(composed documents) use it only where it passed, and refuse such a bundle in one line otherwise.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..bundle import ModelInfo
from ..errors import PrefixEdgeError


def takes_direct_path(model: Path, formats, specs, compress) -> bool:
    """Whether export reads `model` here rather than through transformers."""
    return (model.suffix == ".gguf" and model.is_file() and tuple(formats) == ("gguf",)
            and not any(s.kind == "peft" for s in specs)
            and compress is None and not any(getattr(s, "compress_prefix", None) not in (None, "none")
                                             for s in specs))


@dataclass
class GgufSource:
    info: ModelInfo
    chat_template: str | None
    special: dict          # bos_token, eos_token ... as the chat template sees them


def read_gguf_source(model: Path, tokenizer_dir: Path) -> GgufSource:
    """Write `tokenizer_dir`/tokenizer.json for the GGUF at `model` and read what export needs."""
    from ..llamacpp.child import tokenize
    from .gguf import gguf_field, gguf_reader
    from .gguf_tokenizer import gguf_vocab_model, special_tokens, spm_tokenizer_json, write_faithful

    reader = gguf_reader(model)

    def field(name, default=None):  # a per-layer array (head counts): its largest value
        v = gguf_field(reader, name, default)
        return max(v) if isinstance(v, list) and v and all(isinstance(x, (int, float)) for x in v) else v

    arch = field("general.architecture")
    if not arch:
        raise PrefixEdgeError(f"{model.name}: no general.architecture in its metadata: not a model GGUF")
    tokens = field("tokenizer.ggml.tokens") or []
    if not tokens:
        raise PrefixEdgeError(f"{model.name}: no vocabulary (tokenizer.ggml.tokens) in the GGUF")
    tokenizer_dir.mkdir(parents=True, exist_ok=True)
    kind = gguf_vocab_model(model)
    specials = special_tokens(model)
    _, attrs, eog = tokenize(model, [], model.name)  # llama.cpp's view of the vocabulary, once
    if kind == "llama":
        (tokenizer_dir / "tokenizer.json").write_text(json.dumps(spm_tokenizer_json(model, attrs), ensure_ascii=False),
                                                      encoding="utf-8")
    else:  # transformers' conversion of the vocabulary alone (no weights), then its pre-tokenizer
        import contextlib
        import io

        from transformers import AutoTokenizer
        from transformers.utils import logging as hf_logging

        from .source import _match_gguf_bos

        hf_logging.set_verbosity_error()
        try:
            with contextlib.redirect_stderr(io.StringIO()):
                tok = AutoTokenizer.from_pretrained(str(model.parent), gguf_file=model.name)
        except Exception as e:
            raise PrefixEdgeError(f"{model.name}: transformers cannot read its {kind or '?'} vocabulary: "
                                  f"{str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}") from None
        _match_gguf_bos(tok, model)
        tok.save_pretrained(str(tokenizer_dir), legacy_format=False)
        write_faithful(tokenizer_dir, model)
    for extra in tokenizer_dir.iterdir():  # the bundle's tokenizer is tokenizer.json alone
        if extra.name != "tokenizer.json":
            extra.unlink()
    n_heads = int(field(f"{arch}.attention.head_count", 0) or 0)
    hidden = int(field(f"{arch}.embedding_length", 0) or 0)
    head_dim = int(field(f"{arch}.attention.key_length", 0) or 0) or (hidden // n_heads if n_heads else 0)
    window = int(field(f"{arch}.attention.sliding_window", 0) or 0)
    info = ModelInfo(
        architecture=f"{arch} (GGUF)", model_type=f"gguf:{arch}",
        n_layers=int(field(f"{arch}.block_count", 0) or 0), n_heads=n_heads,
        n_kv_heads=int(field(f"{arch}.attention.head_count_kv", n_heads) or 0), head_dim=head_dim,
        hidden_size=hidden, vocab_size=len(attrs),
        n_ctx=int(field(f"{arch}.context_length", 2048) or 2048),
        rope=gguf_rope(field, arch, head_dim, {t.name for t in reader.tensors}),
        eos_token_ids=sorted(set(eog)), source=model.name, sliding_layers=[], sliding_window=window)
    template = field("tokenizer.chat_template")
    return GgufSource(info, template if isinstance(template, str) else None, specials)


def gguf_rope(field, arch: str, head_dim: int, tensors: set[str]) -> dict:
    """The rotary as the GGUF's metadata says it (llama.cpp's keys: `{arch}.rope.*`), in the
    manifest's terms (runtime/engines/kv.py Rope): theta, the rotated share of a head, the scaling. A
    per-dimension frequency table (`rope_freqs.weight`: Llama 3.1's scaling as llama.cpp's
    converter writes it) is named as a scaling the runtime does not re-rotate by. check_rope
    holds it to llama.cpp's own keys before anything moves a key by it."""
    rope = {"theta": float(field(f"{arch}.rope.freq_base", 10000.0) or 10000.0), "scaling": None}
    dims = int(field(f"{arch}.rope.dimension_count", 0) or 0)
    if dims and head_dim and dims < head_dim:
        rope["partial_rotary_factor"] = dims / head_dim
    kind = field(f"{arch}.rope.scaling.type")
    if isinstance(kind, str) and kind not in ("", "none"):
        rope["scaling"] = {"rope_type": kind, "factor": float(field(f"{arch}.rope.scaling.factor", 1.0) or 1.0)}
    if "rope_freqs.weight" in tensors:
        rope["scaling"] = {"rope_type": "rope_freqs"}
    return rope


def adopt_engine_shape(info: ModelInfo, be) -> None:
    """The layer and KV-head counts as the engine that bakes reads them (a hybrid's recurrent
    layers, per-layer KV-head arrays: llama.cpp's own view, which the prefix states follow)."""
    info.n_layers = int(be.model_layers)
    info.n_kv_heads, info.head_dim = int(be.n_kv_heads), int(be.head_dim)
    info.sliding_window = int(be.state_layout.window)


ROPE_CHECK_AT = (1, 7, 63, 255, 511)  # positions a layer-0 key is moved to and compared at


def check_rope(info: ModelInfo, be) -> None:
    """Hold the GGUF's rotary (info.rope, gguf_rope) to llama.cpp's own cached keys, and record
    the verdict as info.rope["checked"]: composed documents move keys (runtime/engines/kv.py) only by a
    rotary that passed. A layer-0 key depends on its token and position alone, so one token
    repeated gives at each position p the key at 0 rotated by p: the key at 0 moved by
    shift_keys must equal it (to the f16 cache's rounding)."""
    import dataclasses

    import numpy as np

    from ..runtime.engines.kv import Rope, shift_keys

    trial = dataclasses.replace(info, rope={**(info.rope or {}), "checked": True})
    if Rope.refusal(trial) is not None or not be.keeps_partial:
        return  # keys of this model do not move anyway: nothing to check
    n = min(max(ROPE_CHECK_AT) + 1, be.n_ctx - 1)
    token = min(1000, be.n_vocab - 1)
    ids = np.full(n, token, np.int64)
    be.begin(None)
    be.prefill(ids)
    k = be.kv_of(be.seq_snapshot(be.single_seq, ids)).k[0].astype(np.float32)  # [n, kv_heads, head_dim]
    inv = Rope.of(trial).inv_freq
    worst = 0.0
    for p in (p for p in ROPE_CHECK_AT if p < n):
        moved = shift_keys(k[0], p, inv, be.rope_layout)
        worst = max(worst, float(np.max(np.abs(moved - k[p])) / max(float(np.max(np.abs(k[p]))), 1e-6)))
    be.begin(None)
    info.rope = {**(info.rope or {}), "checked": worst <= 0.01, "check_error": round(worst, 5)}


def mtp_head_for(model: Path, given: Path | None, warn) -> Path | None:
    """The MTP head GGUF to keep beside a GGUF source (llama.cpp's converter with --mtp writes
    one, mtp-*.gguf, for a model converted without it): `given` (--mtp-head), or the one such
    file beside the model that fits it; None where the model's GGUF holds its own head or none
    fits. A given file that does not fit is a one-line error; a file beside it that does not is
    passed over with a warning line."""
    from .gguf import gguf_field, gguf_reader

    def facts(path: Path):
        r = gguf_reader(path)
        arch = gguf_field(r, "general.architecture")
        return (arch, gguf_field(r, f"{arch}.embedding_length"), len(gguf_field(r, "tokenizer.ggml.tokens") or ()),
                int(gguf_field(r, f"{arch}.nextn_predict_layers", 0) or 0))

    if model.suffix != ".gguf":
        if given is not None:
            raise PrefixEdgeError("--mtp-head takes the MTP head GGUF of a .gguf model; an HF checkpoint's "
                                  "head (mtp.*) goes into the bundle's GGUF by itself")
        return None
    arch, width, vocab, own = facts(model)
    if own:
        if given is not None:
            warn(f"{model.name} holds its own MTP head: {given.name} is not used")
        return None
    beside = [] if given is not None else sorted(p for p in model.parent.glob("mtp-*.gguf") if p != model)
    fits = []
    for path in [given] if given is not None else beside:
        if not path.is_file():
            raise PrefixEdgeError(f"--mtp-head {path}: no such file")
        try:
            got = facts(path)
        except Exception as e:  # not a GGUF gguf-py can read
            got = (f"unreadable ({type(e).__name__})", None, 0, 0)
        if got[:3] == (arch, width, vocab) and got[3] > 0:
            fits.append(path)
            continue
        why = (f"{path.name} is not an MTP head of {model.name}: architecture {got[0]}, width {got[1]}, "
               f"{got[2]} tokens, {got[3]} MTP layers; the model: {arch}, {width}, {vocab}")
        if given is not None:
            raise PrefixEdgeError(why)
        warn(why)
    if len(fits) > 1:
        warn(f"{len(fits)} MTP heads beside {model.name} ({', '.join(p.name for p in fits)}): none kept; "
             "pass --mtp-head FILE")
        return None
    return fits[0] if fits else None
