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
always; which tokens are which is asked of llama.cpp (its attributes: it corrects a GGUF that
types `<|im_end|>` NORMAL to CONTROL); BOS/EOS and the special tokens' names as the GGUF says.
A BPE (`gpt2`) vocabulary keeps transformers' conversion but for its pre-tokenizer, written from
the GGUF's `tokenizer.ggml.pre` where that name is one export/gguf.py maps.
Export then holds the result to llama.cpp on a corpus (export/tokenizer_check.py).
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import PrefixEdgeError
from .gguf import gguf_field, gguf_reader, pre_tokenizer_spec

SPACE = "\u2581"


def gguf_vocab_model(path: Path) -> str:
    """The GGUF's tokenizer.ggml.model (llama, gpt2, bert, t5, ...), "" where it has none."""
    reader = gguf_reader(path)
    field = reader.get_field("tokenizer.ggml.model")
    return str(field.contents()) if field is not None else ""


def special_tokens(path: Path) -> dict[str, str]:
    """The GGUF's bos/eos/unk/pad tokens ({"bos_token": "<s>", ...}), as llama.cpp reads them."""
    reader = gguf_reader(path)
    field = reader.get_field("tokenizer.ggml.tokens")
    tokens = field.contents() if field is not None else []
    out = {}
    for key in ("bos", "eos", "unknown", "padding"):
        f = reader.get_field(f"tokenizer.ggml.{key}_token_id")
        i = int(f.contents()) if f is not None else -1
        if 0 <= i < len(tokens):
            out[{"unknown": "unk", "padding": "pad"}.get(key, key) + "_token"] = tokens[i]
    return out


def spm_tokenizer_json(path: Path, attrs: list[int] | None = None) -> dict:
    """tokenizer.json for the SPM vocabulary of the GGUF at `path` (BOS/EOS added as it says);
    `attrs`: llama.cpp's token attributes, where the caller has read them already."""
    from ..llamacpp.child import tokenize
    from ..llamacpp.vocab import ATTR_CONTROL, ATTR_LSTRIP, ATTR_RSTRIP, ATTR_UNKNOWN, ATTR_USER_DEFINED

    reader = gguf_reader(path)

    def field(name, default=None):
        return gguf_field(reader, name, default)

    tokens = field("tokenizer.ggml.tokens")
    scores = field("tokenizer.ggml.scores")
    if not tokens or scores is None or len(tokens) != len(scores):
        raise PrefixEdgeError(f"{path.name}: its SentencePiece vocabulary lacks tokens or scores, "
                              "which llama.cpp's tokenizer needs")
    # the tokens llama.cpp splits out of a text before its SPM merges, by the attributes it
    # gives them (the GGUF's types after its corrections: a NORMAL `<|im_end|>` is CONTROL)
    if attrs is None:
        _, attrs, _ = tokenize(path, [], path.name)
    if len(attrs) != len(tokens):
        raise PrefixEdgeError(f"{path.name}: llama.cpp reads {len(attrs)} tokens, its vocabulary lists {len(tokens)}")
    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)  # a duplicate piece: llama.cpp's token_to_id keeps the first
    split_out = ATTR_CONTROL | ATTR_UNKNOWN | ATTR_USER_DEFINED
    added = [{"id": i, "content": t, "single_word": False, "lstrip": bool(attrs[i] & ATTR_LSTRIP),
              "rstrip": bool(attrs[i] & ATTR_RSTRIP), "normalized": False,
              "special": not attrs[i] & ATTR_USER_DEFINED}
             for i, t in enumerate(tokens) if attrs[i] & split_out and t]
    space_prefix = bool(field("tokenizer.ggml.add_space_prefix", True))
    normalizer = [{"type": "Replace", "pattern": {"String": " "}, "content": SPACE}]
    decoders = [{"type": "Replace", "pattern": {"String": SPACE}, "content": " "},
                {"type": "ByteFallback"}, {"type": "Fuse"}]
    if space_prefix:
        normalizer.insert(0, {"type": "Prepend", "prepend": SPACE})
        decoders.append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
    unk = field("tokenizer.ggml.unknown_token_id")
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
            "normalizer": {"type": "Sequence", "normalizers": normalizer},
            "pre_tokenizer": None,
            "post_processor": _post_processor(field, tokens),
            "decoder": {"type": "Sequence", "decoders": decoders},
            "model": {"type": "BPE", "dropout": None,
                      "unk_token": tokens[unk] if unk is not None and 0 <= unk < len(tokens) else None,
                      "continuing_subword_prefix": None, "end_of_word_suffix": None,
                      "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                      "vocab": vocab, "merges": _merges(tokens, scores, vocab)}}


def _post_processor(field, tokens) -> dict | None:
    """BOS (and EOS) around a text where the GGUF says llama.cpp adds them (llama.cpp's default
    for SPM: a BOS and no EOS)."""
    ends = []
    for key, default in (("bos", True), ("eos", False)):
        i = field(f"tokenizer.ggml.{key}_token_id")
        if bool(field(f"tokenizer.ggml.add_{key}_token", default)) and i is not None and 0 <= i < len(tokens):
            ends.append((key, tokens[i], int(i)))
    if not ends:
        return None
    first = [{"SpecialToken": {"id": t, "type_id": 0}} for key, t, _ in ends if key == "bos"]
    last = [{"SpecialToken": {"id": t, "type_id": 0}} for key, t, _ in ends if key == "eos"]
    single = first + [{"Sequence": {"id": "A", "type_id": 0}}] + last
    pair = single + [{"SpecialToken": {"id": t, "type_id": 1}} for key, t, _ in ends if key == "bos"] + \
        [{"Sequence": {"id": "B", "type_id": 1}}] + [{"SpecialToken": {"id": t, "type_id": 1}} for key, t, _ in ends if key == "eos"]
    return {"type": "TemplateProcessing", "single": single, "pair": pair,
            "special_tokens": {t: {"id": t, "ids": [i], "tokens": [t]} for _, t, i in ends}}


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
    return pre_tokenizer_spec(pre)


def write_faithful(out: Path, gguf_path: Path) -> bool:
    """Rewrite the tokenizer saved in `out` (transformers' conversion of `gguf_path`) from the
    GGUF's own vocabulary where transformers' conversion is known to differ from llama.cpp's (an
    SPM vocabulary, and its special tokens; a BPE one's pre-tokenizer, for the names
    export/gguf.py knows); True when rewritten. Anything else is left as it is (and checked at
    export)."""
    kind = gguf_vocab_model(gguf_path)
    path = out / "tokenizer.json"
    base = json.loads(path.read_text(encoding="utf-8"))
    if kind == "llama":
        spec = spm_tokenizer_json(gguf_path)
        _configure(out, special_tokens(gguf_path))
    elif kind == "gpt2":
        field = gguf_reader(gguf_path).get_field("tokenizer.ggml.pre")
        pre = bpe_pre_tokenizer(str(field.contents())) if field is not None else None
        if pre is None or base.get("pre_tokenizer") == pre:
            return False
        spec = {**base, "pre_tokenizer": pre}
    else:
        return False
    path.write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
    return True


def _configure(out: Path, specials: dict[str, str]) -> None:
    """tokenizer_config.json and special_tokens_map.json name the GGUF's special tokens (not the
    ones transformers' converter assumes for the architecture: Gemma's `<bos>` where a GGUF has
    `<s>`), and list no added tokens of their own (tokenizer.json's are the GGUF's)."""
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        p = out / name
        cfg = json.loads(p.read_text(encoding="utf-8")) if p.is_file() else {}
        cfg.pop("added_tokens_decoder", None)
        cfg.pop("additional_special_tokens", None)
        for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
            if key in specials:
                cfg[key] = specials[key]
            else:
                cfg.pop(key, None)
        p.write_text(json.dumps(cfg, ensure_ascii=False, indent=2), encoding="utf-8")
