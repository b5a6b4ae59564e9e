"""A GGUF's SentencePiece (`llama`/SPM) vocabulary as a tokenizer.json that splits text exactly as
llama.cpp's own tokenizer does.

transformers' GGUF conversion reads such a vocabulary as a Unigram model over the GGUF's scores.
Those scores are SentencePiece-BPE merge priorities (Gemma 3: minus the piece's rank), not unigram
log-probabilities, so its Viterbi split is not the model's: a real Gemma 3 GGUF's "Translate",
one piece to llama.cpp, became 13 pieces, and every answer was garbage. llama.cpp's SPM tokenizer
(llm_tokenizer_spm) starts from the text's characters (spaces as "▁", a "▁" first when the GGUF
asks for a space prefix: after the start and after every special token) and merges, again and
again, the adjacent pair whose concatenation is a piece of the vocabulary with the highest score,
leftmost first on a tie; what is left that is no piece becomes its UTF-8 bytes' `<0xXX>` pieces.
A BPE model whose merges are every split of every piece into two pieces, ranked by the whole
piece's score, does the same (transformers builds a SentencePiece-BPE checkpoint's tokenizer.json
this way too). Control tokens are special added tokens and user-defined ones (Gemma's newline
runs) plain added tokens: llama.cpp splits the first out only when it parses specials, the second
always. A BPE (`gpt2`) vocabulary keeps transformers' conversion but for its pre-tokenizer,
written from the GGUF's `tokenizer.ggml.pre` where that name is one export/gguf.py maps.
Export then holds the result to llama.cpp on a corpus (export/tokenizer_check.py).
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import PrefixEdgeError

SPACE = "\u2581"
# llama.cpp's token types (tokenizer.ggml.token_type)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


def gguf_vocab_model(path: Path) -> str:
    """The GGUF's tokenizer.ggml.model (llama, gpt2, bert, t5, ...), "" where it has none."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    field = reader.get_field("tokenizer.ggml.model")
    return str(field.contents()) if field is not None else ""


def spm_tokenizer_json(path: Path, base: dict) -> dict:
    """tokenizer.json for the SPM vocabulary of the GGUF at `path`; `base` (transformers'
    conversion, a dict) gives the post-processor (BOS/EOS as the GGUF says) and nothing else."""
    import gguf

    reader = gguf.GGUFReader(str(path))

    def field(name, default=None):
        f = reader.get_field(name)
        return default if f is None else f.contents()

    tokens = field("tokenizer.ggml.tokens")
    scores = field("tokenizer.ggml.scores")
    types = field("tokenizer.ggml.token_type")
    if not tokens or scores is None or types is None or not len(tokens) == len(scores) == len(types):
        raise PrefixEdgeError(f"{path.name}: its SentencePiece vocabulary lacks tokens, scores or "
                              "token types, which llama.cpp's tokenizer needs")
    space_prefix = bool(field("tokenizer.ggml.add_space_prefix", True))
    unk = field("tokenizer.ggml.unknown_token_id")
    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)  # a duplicate piece: llama.cpp's token_to_id keeps the first
    merges = _merges(tokens, scores, vocab)
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": types[i] == CONTROL}
             for i, t in enumerate(tokens) if types[i] in (CONTROL, USER_DEFINED) and t]
    normalizer = [{"type": "Replace", "pattern": {"String": " "}, "content": SPACE}]
    if space_prefix:
        normalizer.insert(0, {"type": "Prepend", "prepend": SPACE})
    decoders = [{"type": "Replace", "pattern": {"String": SPACE}, "content": " "},
                {"type": "ByteFallback"}, {"type": "Fuse"}]
    if space_prefix:
        decoders.append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
    out = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
           "normalizer": {"type": "Sequence", "normalizers": normalizer},
           "pre_tokenizer": None,
           "post_processor": base.get("post_processor"),
           "decoder": {"type": "Sequence", "decoders": decoders},
           "model": {"type": "BPE", "dropout": None,
                     "unk_token": tokens[unk] if unk is not None and 0 <= unk < len(tokens) else None,
                     "continuing_subword_prefix": None, "end_of_word_suffix": None,
                     "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                     "vocab": vocab, "merges": merges}}
    return out


def _merges(tokens, scores, vocab: dict[str, int]) -> list[list[str]]:
    """Every split of every piece into two pieces, the highest-scoring whole piece first (a tie:
    the lower id first, then the shorter left part)."""
    ranked = []
    for i, piece in enumerate(tokens):
        if len(piece) < 2 or vocab.get(piece) != i:
            continue
        for k in range(1, len(piece)):
            left, right = piece[:k], piece[k:]
            if left in vocab and right in vocab:
                ranked.append((-float(scores[i]), i, k, left, right))
    ranked.sort(key=lambda r: (r[0], r[1], r[2]))
    return [[left, right] for _, _, _, left, right in ranked]


def bpe_pre_tokenizer(pre: str) -> dict | None:
    """The tokenizer.json pre_tokenizer that splits text as llama.cpp's BPE pre-tokenizer `pre`
    (tokenizer.ggml.pre) does, for the names export/gguf.py maps (None for others: transformers'
    own is kept, and checked). transformers' conversion gives every GPT-2-type vocabulary the
    plain GPT-2 split: SmolLM2's ("smollm": every number character alone first) then read " ½"
    as one piece where llama.cpp reads " " and "½"."""
    from .gguf import pre_tokenizer_spec

    return pre_tokenizer_spec(pre)


def write_faithful(tokenizer_json: Path, gguf_path: Path) -> bool:
    """Rewrite `tokenizer_json` (transformers' conversion of `gguf_path`) from the GGUF's own
    vocabulary where transformers' conversion is known to differ from llama.cpp's (an SPM
    vocabulary; a BPE one's pre-tokenizer, for the names export/gguf.py knows); True when
    rewritten. Anything else is left as it is (and checked at export)."""
    import gguf

    kind = gguf_vocab_model(gguf_path)
    base = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    if kind == "llama":
        out = spm_tokenizer_json(gguf_path, base)
    elif kind == "gpt2":
        field = gguf.GGUFReader(str(gguf_path)).get_field("tokenizer.ggml.pre")
        spec = bpe_pre_tokenizer(str(field.contents())) if field is not None else None
        if spec is None or base.get("pre_tokenizer") == spec:
            return False
        out = {**base, "pre_tokenizer": spec}
    else:
        return False
    tokenizer_json.write_text(json.dumps(out, ensure_ascii=False), encoding="utf-8")
    return True
