"""Export's check that a bundle's tokenizer splits text as llama.cpp's own tokenizer of the GGUF
does (the deployed GGUF, or a GGUF source whose weights feed the ONNX model).

A model reads the ids its vocabulary was trained with; a tokenizer.json that splits text some
other way gives fluent-looking garbage, baked and prefilled alike, and nothing else notices. So
the bundle's tokenizer.json (the one the runtime uses for both engines) is compared with
llama.cpp's tokenizer of the same vocabulary, loaded alone in a child process, on a built-in
corpus (prose in several scripts, code, whitespace runs, digits, emoji), every task's prefix
text, and every special token spelled as plain text, three ways: text as the runtime tokenizes a
prompt (control-token spellings read as tokens), text with those spellings kept as text (a
user's message), and text with the BOS/EOS the model asks for. A difference is a one-line
refusal naming the first text that differs; nothing is written.
"""

from __future__ import annotations

from pathlib import Path

from ..bundle import layout
from ..errors import PrefixEdgeError

CORPUS = (
    "The quick brown fox jumps over the lazy dog.",
    "Translate English to French.\nEnglish: good night\nFrench: bonne nuit\n\nEnglish:",
    "Hi, this is Maria Lopez, please send 3 desk lamps to Porto. Order #A-1029, total $1,234.50.",
    "Ünïcödé café naïve façade Straße Ærøskøbing",
    "Привет, мир! Как дела?  Ελληνικά κείμενα.",
    "مرحبا بالعالم. שלום עולם. नमस्ते दुनिया।",
    "日本語のテキストです。中文文本。한국어 텍스트입니다。",
    "ภาษาไทย ພາສາລາວ ქართული Հայերեն",
    "def add(a, b):\n    return a + b  # sum\n\nclass Foo(Bar):\n\tpass\n",
    'SELECT name, COUNT(*) FROM users WHERE id >= 10 GROUP BY name;\n{"key": [1, 2.5, -3e10, null, true]}',
    "x" * 80 + " " + "ab" * 40,
    "   leading spaces, trailing spaces   ",
    "tabs\t\tand\n\n\nnewlines\r\n  mixed \u00a0\u2003\u3000 spaces",
    "0 1 12 123 1234 12345 123456789 3.14159 1e-5 0x1F 1,000,000 2026-12-05 12:30",
    "emoji 😀🎉👍🏽 👨‍👩‍👧 ❤️ flags 🇫🇷🇯🇵 and symbols ©®™ ½ ∑∫ → ←",
    "mixedCASE snake_case kebab-case CamelCase ALLCAPS I'm you're it's don't",
    "URL https://example.com/a/b?c=d&e=f#g email name@example.org path C:\\Users\\x",
    "",
)
MAX_SPECIAL = 512  # special tokens spelled as text, at most (a vocabulary may hold thousands)


def check_against_llama(tokenizer, gguf_path: Path, prefixes: dict[str, str], name: str) -> dict:
    """Hold `tokenizer` (a tokenizers.Tokenizer) to llama.cpp's tokenizer of `gguf_path`; raise
    PrefixEdgeError at the first text that differs, else a summary for the manifest."""
    from tokenizers import Tokenizer

    from ..llamacpp.child import tokenize

    specials = [t.content for _, t in sorted(tokenizer.get_added_tokens_decoder().items())
                if t.special and t.content][:MAX_SPECIAL]
    spelled = [" ".join(specials[i:i + 32]) for i in range(0, len(specials), 32)]
    texts = [("corpus", t) for t in CORPUS] + [(f"task '{k}' prefix", v) for k, v in prefixes.items() if v]
    as_text = Tokenizer.from_str(tokenizer.to_str())
    as_text.encode_special_tokens = True
    def ids(tok, label: str, text: str, add: bool) -> list[int]:
        try:
            return tok.encode(text, add_special_tokens=add).ids
        except Exception as e:  # e.g. a Unigram over SPM scores: "unknown token but unk_id is missing"
            raise PrefixEdgeError(f"tokenizer: the bundle's tokenizer cannot tokenize {label} "
                                  f"{text[:40]!r} ({str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}); "
                                  "no bundle is written") from None

    # (label, text, add_special, parse_special, our ids)
    cases = [(label, t, False, True, ids(tokenizer, label, t, False)) for label, t in texts]
    cases += [(f"{label} (special tokens as text)", t, False, False, ids(as_text, label, t, False))
              for label, t in [*texts[:4], *(("special tokens", s) for s in spelled)]]
    cases += [(f"{label} (with BOS/EOS)", t, True, True, ids(tokenizer, label, t, True))
              for label, t in texts[:2]]
    theirs, *_ = tokenize(gguf_path, [(t, add, parse) for _, t, add, parse, _ in cases], name)
    for (label, text, _, _, ours), ref in zip(cases, theirs):
        if ours != ref:
            k = next((i for i, (a, b) in enumerate(zip(ours, ref)) if a != b), min(len(ours), len(ref)))
            raise PrefixEdgeError(
                f"tokenizer: the bundle's tokenizer and llama.cpp's own tokenizer of {name} split "
                f"{label} {_excerpt(text, ours, k, tokenizer)} differently: {_ids(ours, k)} vs "
                f"{_ids(ref, k)} (from token {k}); the model would read other ids than it was "
                "trained on, so no bundle is written")
    return {"checked_against": "llama.cpp", "texts": len(cases),
            "special_tokens_as_text": len(specials)}


def _excerpt(text: str, ours: list[int], k: int, tokenizer) -> str:
    """The text around where the split first differs, quoted."""
    enc = tokenizer.encode(text, add_special_tokens=False)
    start = enc.offsets[min(k, len(enc.offsets) - 1)][0] if enc.offsets else 0
    lo = max(0, start - 10)
    snippet = text[lo:lo + 40]
    return ("at " if lo else "") + repr(snippet) + ("…" if lo + 40 < len(text) else "")


def _ids(ids: list[int], k: int) -> str:
    lo = max(0, k - 1)
    return "[" + ("…, " if lo else "") + ", ".join(map(str, ids[lo:lo + 6])) + \
        (", …]" if lo + 6 < len(ids) else "]")


def check_bundle_tokenizer(model: Path, root: Path, backends: dict, rt_tok, rendered: dict, st) -> dict | None:
    """A GGUF source's vocabulary is the model's own: the bundle's tokenizer must split text as
    llama.cpp's tokenizer of it does (export/tokenizer_check.py), or no bundle is written. An HF
    source's tokenizer.json is the model's own; the GGUF llama.cpp's converter made of it is
    held to it too, and a difference is a warning (the runtime tokenizes with tokenizer.json on
    both engines, but the GGUF file would split text otherwise in llama.cpp's own tools)."""
    prefixes = {n: r.prefix_text for n, r in rendered.items()}
    if model.suffix == ".gguf":
        ref = root / layout.MODEL_FILE["gguf"] if "gguf" in backends else model
        with st.stage("tokenizer vs llama.cpp's"):
            return check_against_llama(rt_tok, ref, prefixes, model.name)
    if "gguf" not in backends:
        return None
    with st.stage("tokenizer vs llama.cpp's"):
        try:
            return check_against_llama(rt_tok, root / layout.MODEL_FILE["gguf"], prefixes,
                                       "the converted GGUF")
        except PrefixEdgeError as e:
            st.warn(str(e).replace("so no bundle is written", "the bundle uses tokenizer.json"))
            return {"checked_against": "llama.cpp", "differs": str(e)}
